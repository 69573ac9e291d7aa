"""vit.py is one copyable file, and a variant needs only vit.py beside it.

Both are checked the way a researcher would copy them: into an empty folder, run by a fresh
Python that cannot see this checkout.
"""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / 'vit_pytorch'


def run_isolated(folder, code):
    # -I: isolated mode, so neither the current directory of the test run nor PYTHONPATH leak in;
    # the script's own folder is put on the path explicitly
    script = folder / 'check.py'
    script.write_text(f"import sys\nsys.path.insert(0, {str(folder)!r})\n" + textwrap.dedent(code))
    return subprocess.run([sys.executable, '-I', str(script)], capture_output=True, text=True, timeout=120)


def test_vit_py_runs_copied_alone_into_an_empty_folder(tmp_path):
    shutil.copy(PACKAGE / 'vit.py', tmp_path / 'vit.py')
    result = run_isolated(tmp_path, '''
        import torch
        import vit
        assert vit.__file__.startswith(sys.path[0]), vit.__file__
        model = vit.ViT(image_size=32, patch_size=8, num_classes=10, dim=64, depth=2, heads=4, mlp_dim=128)
        print(tuple(model(torch.randn(2, 3, 32, 32)).shape))
    ''')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '(2, 10)'


def test_a_variant_runs_from_a_folder_with_only_the_core_beside_it(tmp_path):
    folder = tmp_path / 'vit_pytorch'
    folder.mkdir()
    (folder / '__init__.py').write_text('')
    for name in ('vit.py', 'cait.py'):
        shutil.copy(PACKAGE / name, folder / name)
    result = run_isolated(tmp_path, '''
        import torch
        from vit_pytorch.cait import CaiT
        import vit_pytorch
        assert sorted(p.name for p in __import__('pathlib').Path(vit_pytorch.__file__).parent.glob('*.py')) == \\
            ['__init__.py', 'cait.py', 'vit.py']
        model = CaiT(image_size=32, patch_size=8, num_classes=10, dim=64, depth=2, cls_depth=1, heads=4,
                     mlp_dim=128)
        print(tuple(model(torch.randn(2, 3, 32, 32)).shape))
    ''')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '(2, 10)'
