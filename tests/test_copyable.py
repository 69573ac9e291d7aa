"""vit.py is one copyable file, and a registered model needs only its computed copy set beside it.

Both are checked the way a researcher would copy them: into an empty folder, run by a fresh
Python that cannot see this checkout.
"""

import ast
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vit_pytorch import models, train

PACKAGE = Path(__file__).resolve().parent.parent / 'vit_pytorch'


def run_isolated(folder, code, timeout=120):
    # -I: isolated mode, so neither the current directory of the test run nor PYTHONPATH leak in;
    # the script's own folder is put on the path explicitly
    script = folder / 'check.py'
    script.write_text(f"import sys\nsys.path.insert(0, {str(folder)!r})\n" + textwrap.dedent(code))
    return subprocess.run([sys.executable, '-I', str(script)], capture_output=True, text=True, timeout=timeout)


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


# The copy budget of a registered model: its own file, vit.py, multiscale.py if it is a multi-scale model, and at most
# one family base (another model module it builds on, e.g. simple_vit_3d on vit_3d), with that base's own imports
# counted in the same budget. The files are computed from the imports (every `vit_pytorch` import in the source,
# inside functions too, followed transitively), never listed by hand.
CORE = {'vit', 'multiscale'}


def package_imports(name):
    """The vit_pytorch modules that vit_pytorch.`name`'s source imports anywhere in it."""
    tree = ast.parse((PACKAGE / f'{name}.py').read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == 'vit_pytorch':
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith('vit_pytorch.'):
            found.add(node.module.split('.')[1])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split('.')[1] for alias in node.names if alias.name.startswith('vit_pytorch.'))
    return found - {name}


def copy_set(name):
    """vit_pytorch.`name` and every package module it needs, transitively."""
    needed, todo = set(), [name]
    while todo:
        module = todo.pop()
        if module not in needed:
            needed.add(module)
            todo.extend(package_imports(module))
    return needed


def registered_modules():
    return sorted({target.split(':')[0].split('.')[1] for target in models.MODELS.values()})


def test_vit_py_imports_nothing_of_the_package():
    assert package_imports('vit') == set()


def test_the_multiscale_blocks_import_only_vit_py():
    assert package_imports('multiscale') == {'vit'}


# registered modules that also hold a wrapper at vit-pytorch's import path, whose imports widen the copy set beyond the
# budget: module -> (its copy set, stated so that it cannot grow unnoticed, and why)
WIDER_COPY_SETS = {
    'levjepa': ({'levjepa', 'lejepa', 'dino', 'sigreg', 'pretrained', 'vit'},
                "its registered classifier (VideoTransformerClassifier) needs only vit.py, but the module is also "
                "vit-pytorch's import path of the LeVJEPA learner, whose views and losses are LeJEPA's (lejepa, which "
                "builds on dino, sigreg and the loaders)"),
    'levjepa_nd': ({'levjepa_nd', 'levjepa', 'lejepa', 'dino', 'sigreg', 'pretrained', 'vit'},
                   "its registered classifier (NDTransformerClassifier) builds on levjepa's encoder blocks; the module "
                   "is also the LeVJEPAND learner's import path, whose projector and losses are levjepa's"),
}


@pytest.mark.parametrize('name', registered_modules())
def test_a_registered_model_needs_at_most_one_family_base_beside_the_core(name):
    if name in WIDER_COPY_SETS:
        assert copy_set(name) == WIDER_COPY_SETS[name][0]
        return
    bases = copy_set(name) - CORE - {name}
    assert len(bases) <= 1, f"{name} needs {sorted(bases)} beside vit.py and multiscale.py"


# distill.py is vit-pytorch's module of students from three families and their wrapper, not a registered model (the
# paper's DeiT is deit.py's): its copy set is wider than a model's budget, and stated here so it cannot grow unnoticed
DISTILL_COPY_SET = {'distill', 'deit', 't2t', 'efficient', 'pretrained', 'vit'}


def test_distill_needs_its_three_student_families_deit_and_the_loaders():
    assert copy_set('distill') == DISTILL_COPY_SET


def test_distill_runs_from_a_folder_holding_only_its_copy_set(tmp_path):
    folder = tmp_path / 'vit_pytorch'
    folder.mkdir()
    (folder / '__init__.py').write_text('')
    for name in DISTILL_COPY_SET:
        shutil.copy(PACKAGE / f'{name}.py', folder / f'{name}.py')
    result = run_isolated(tmp_path, '''
        import torch
        from vit_pytorch.distill import DeiT, DistillableT2TViT, DistillWrapper
        import vit_pytorch
        assert vit_pytorch.__file__.startswith(sys.path[0]), vit_pytorch.__file__
        kwargs = dict(image_size=32, num_classes=10, dim=64, depth=2, heads=4, mlp_dim=128)
        teacher = DeiT(patch_size=8, **kwargs).eval()
        student = DistillableT2TViT(**kwargs)
        print(float(DistillWrapper(teacher=teacher, student=student)(torch.randn(2, 3, 32, 32), torch.tensor([1, 3]))) > 0)
    ''')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'True'


def example_input(name):
    kind = models.INPUTS.get(name, 'images')
    if kind.startswith('signals'):
        return (2, 3, 32)
    if kind.startswith('clips'):
        return (2, 3, 8, 32, 32)
    return (2, 3, 32, 32)


@pytest.mark.slow  # every registered model built in a fresh interpreter: a minute or more on 2 cores
def test_every_registered_model_builds_and_runs_from_a_folder_holding_only_its_copy_set(tmp_path):
    cases = []
    for name, target in models.MODELS.items():
        module, cls = target.split(':')
        folder = tmp_path / name
        (folder / 'vit_pytorch').mkdir(parents=True)
        (folder / 'vit_pytorch' / '__init__.py').write_text('')
        files = copy_set(module.split('.')[1])
        for file in files:
            shutil.copy(PACKAGE / f'{file}.py', folder / 'vit_pytorch' / f'{file}.py')
        config = train.model_config(name, {}, image_size=32, channels=3, num_classes=10)
        cases.append((str(folder), module, cls, config, example_input(name), sorted(files)))
    (tmp_path / 'cases.pt').write_bytes(pickle.dumps(cases))
    # one fresh interpreter for all models (fast): each model's package is imported from its own folder, with the
    # previous model's vit_pytorch modules forgotten
    result = run_isolated(tmp_path, f'''
        import importlib, pathlib, pickle
        import torch
        cases = pickle.loads(pathlib.Path({str(tmp_path / 'cases.pt')!r}).read_bytes())
        for folder, module, cls, config, shape, files in cases:
            for loaded in [m for m in sys.modules if m == 'vit_pytorch' or m.startswith('vit_pytorch.')]:
                del sys.modules[loaded]
            sys.path.insert(0, folder)
            model = getattr(importlib.import_module(module), cls)(**config).eval()
            loaded = sorted(m.split('.')[1] for m in sys.modules if m.startswith('vit_pytorch.'))
            # a subset: an import inside a function (a loader's) counts in the copy set but runs only when called
            assert set(loaded) <= set(files), (module, loaded, files)
            assert all(sys.modules[m].__file__.startswith(folder) for m in sys.modules if m.startswith('vit_pytorch'))
            with torch.no_grad():
                out = model(torch.randn(shape))
            print(module, tuple(out.shape))
            sys.path.remove(folder)
    ''', timeout=900)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(models.MODELS)
    assert all(line.endswith('(2, 10)') for line in result.stdout.splitlines()), result.stdout
