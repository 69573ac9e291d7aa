"""What a newcomer meets first: install hints that work as printed, a quick start that says nothing about NumPy,
no pictures that show nothing, advice in the command's own options, and progress on long work (issue 24)."""

import ast
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from vit_pytorch import ViT, evaluate, plots, train

ROOT = Path(__file__).resolve().parents[1]
TINY = ['--threads', '1', '--dim', '32', '--depth', '2', '--heads', '2', '--dim-head', '16', '--mlp-dim', '64',
        '--batch-size', '128', '--warmup-epochs', '1', '--epochs', '1']


def setup_arguments():
    """The keyword arguments of setup.py's setup(...) call, read from its source (nothing is run)."""
    tree = ast.parse((ROOT / 'setup.py').read_text())
    call = next(node for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, 'id', '') == 'setup')
    return {keyword.arg: keyword.value for keyword in call.keywords}


def extras():
    return ast.literal_eval(setup_arguments()['extras_require'])


def run_train(*argv):
    return train.main([str(arg) for arg in argv])


def error_of(capsys):
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith('error: ')]
    assert len(lines) == 1, lines
    return lines[0]


def pip_command(message):
    """The pip command a message ends with, as shell words."""
    return shlex.split(message[message.index('pip install'):])


def child(code, *, block_numpy):
    """Run `code` in a fresh interpreter using this checkout (numpy unimportable when `block_numpy`): (rc, stderr)."""
    prelude = "import sys\nsys.modules['numpy'] = None\n" if block_numpy else ''
    environment = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS='always')
    done = subprocess.run([sys.executable, '-c', prelude + code], capture_output=True, text=True, cwd=ROOT,
                          env=environment, timeout=300)
    return done.returncode, done.stderr


def quick_start_snippet():
    """The first Python block under the README's 'Quick start' heading."""
    text = (ROOT / 'README.md').read_text()
    section = re.search(r'^#+ Quick start\s*$(.*?)(?=^#+ )', text, re.MULTILINE | re.DOTALL)
    assert section is not None, "README.md has no 'Quick start' section"
    block = re.search(r'```python\n(.*?)```', section[1], re.DOTALL)
    assert block is not None, "the README's Quick start has no python block"
    return block[1]


# item 1: install hints


def test_a_missing_extra_is_named_with_a_pip_command_that_installs_this_checkout_from_any_folder(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, 'sklearn', None)                # import fails as if not installed
    assert run_train('--out', tmp_path / 'run', '--quiet', '--no-plots', *TINY) == 2
    words = pip_command(error_of(capsys))
    assert words[:3] == ['pip', 'install', '-e'] and len(words) == 4, words
    target = re.fullmatch(r'(.+)\[(\w+)\]', words[3])
    assert target is not None, words[3]
    folder, extra = Path(target[1]), target[2]
    assert folder.is_absolute() and folder.resolve() == ROOT        # the same from any working directory
    assert 'scikit-learn' in extras()[extra]


def test_without_a_checkout_the_hint_installs_the_missing_packages_themselves(monkeypatch):
    from vit_pytorch.training import extras as optional

    monkeypatch.setattr(optional, 'checkout', lambda: None)        # a wheel install: no setup.py beside it
    monkeypatch.setitem(sys.modules, 'safetensors', None)
    with pytest.raises(optional.MissingExtra) as caught:
        optional.require('safetensors', 'torch', purpose='reading a checkpoint')
    assert pip_command(str(caught.value)) == ['pip', 'install', 'safetensors']
    assert 'vit-pytorch-clean' not in str(caught.value)             # not on the package index


def test_no_hint_in_the_package_names_a_distribution_the_index_does_not_have():
    sources = [*(ROOT / 'vit_pytorch').glob('*.py'), *(ROOT / 'examples').glob('*.py')]
    assert [path.name for path in sources if 'vit-pytorch-clean[' in path.read_text()] == []


def test_the_runtime_requirements_bring_numpy_because_torch_warns_on_import_without_it():
    rc, error = child('import torch', block_numpy=True)
    assert rc == 0, error
    if 'Failed to initialize NumPy' not in error:
        pytest.skip(f'torch {torch.__version__} imports without numpy quietly')
    requirements = ast.literal_eval(setup_arguments()['install_requires'])
    assert 'numpy' in {re.split(r'[<>=;\[ ]', requirement)[0] for requirement in requirements}


def test_the_quick_start_adds_no_numpy_message_of_its_own_to_torchs():
    code = ("import torch, warnings\nprint('--- torch imported', file=sys.stderr, flush=True)\n"
            "warnings.simplefilter('error')\n" + quick_start_snippet() + "\nprint('ran', file=sys.stderr)\n")
    rc, error = child(code, block_numpy=True)
    assert rc == 0, error
    after_torch = error.split('--- torch imported', 1)[1]
    assert after_torch.strip() == 'ran' and 'numpy' not in after_torch.lower()


# item 5: pictures


def test_a_one_patch_model_draws_no_attention_pictures_and_says_why(tmp_path, capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        assert run_train('--patch-size', 16, '--out', tmp_path / 'run', '--quiet', *TINY) == 0   # 16x16 digits
    drawn = sorted(path.name for path in (tmp_path / 'run').glob('*.png'))
    assert drawn == ['curves.png']
    error = capsys.readouterr().err
    assert 'no attention pictures' in error and 'one patch' in error
    assert [str(warning.message) for warning in caught if 'ylim' in str(warning.message)] == []


def test_attention_maps_of_one_patch_are_refused_by_the_pictures(tmp_path):
    with pytest.raises(ValueError, match='single patch'):
        plots.save_attention_overlay(torch.rand(2, 1, 16, 16), torch.ones(2, 1, 1), tmp_path / 'a.png')
    with pytest.raises(ValueError, match='single patch'):
        plots.save_attention_heads(torch.rand(1, 16, 16), torch.ones(3, 1, 1), tmp_path / 'b.png')


@pytest.fixture
def figures(monkeypatch):
    """The figures the pictures save, by file name."""
    kept, real_save = {}, plots.save_figure

    def keep(figure, path, dpi):
        kept[Path(path).name] = figure
        return real_save(figure, path, dpi)

    monkeypatch.setattr(plots, 'save_figure', keep)
    return kept


def test_the_attention_row_has_a_colour_scale(tmp_path, figures):
    plots.save_attention_overlay(torch.rand(3, 1, 16, 16), torch.rand(3, 4, 4), tmp_path / 'attention.png')
    scales = [axis for axis in figures['attention.png'].axes if getattr(axis, '_colorbar', None) is not None]
    assert len(figures['attention.png'].axes) == 3 * 3 + 1 and len(scales) == 1


def test_the_attention_distance_legend_is_readable(tmp_path, figures):
    plots.save_mean_attention_distance(torch.rand(4, 3) * 8, tmp_path / 'distance.png', uniform=8.0)
    legend = figures['distance.png'].axes[0].get_legend()
    assert min(text.get_fontsize() for text in legend.get_texts()) >= 8


# item 6: advice in the command's own options


def options_of(main):
    """The option strings a command's --help lists."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit):
        main(['--help'])
    return set(re.findall(r'(?<![\w-])--[a-z][\w-]*', printed.getvalue()))


def test_evaluate_at_a_size_the_model_does_not_take_advises_the_commands_options(tmp_path, capsys):
    assert run_train('--out', tmp_path / 'fixed', '--quiet', '--no-plots', *TINY) == 0
    assert evaluate.main([str(tmp_path / 'fixed' / 'checkpoint'), '--image-size', '20']) == 2
    error = error_of(capsys)
    assert '=True' not in error and 'build the model' not in error, error
    evaluate_part, _, train_part = error.partition('python -m vit_pytorch.train')
    assert '--image-size' in evaluate_part and set(re.findall(r'--[a-z][\w-]*', evaluate_part)) <= \
        options_of(evaluate.main)
    # the way to a model that takes other sizes, followed as printed, gives one that does
    retrain = shlex.split(train_part.split(' (')[0])
    assert retrain[:2] == ['--model', 'vit'] and retrain[2:] == ['--dynamic-image-size'], retrain
    assert run_train(*retrain, '--out', tmp_path / 'dynamic', '--quiet', '--no-plots', *TINY) == 0
    assert evaluate.main([str(tmp_path / 'dynamic' / 'checkpoint'), '--image-size', '20']) == 0


# item 7: progress on long work


def test_looking_inside_shows_its_training_progress(capsys):
    sys.path.insert(0, str(ROOT / 'examples'))
    try:
        import looking_inside
    finally:
        sys.path.remove(str(ROOT / 'examples'))
    model = ViT(image_size=8, patch_size=4, num_classes=2, channels=1, dim=16, depth=1, heads=1, dim_head=8,
                mlp_dim=16)
    batch = (torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 0, 1]))
    looking_inside.train(model, lambda step: batch, 3, lr=1e-3, description='photograph model')
    error = capsys.readouterr().err
    assert 'photograph model' in error and '3/3' in error


def test_evaluate_names_every_missing_package_of_the_extra_at_once(tmp_path, capsys, monkeypatch):
    assert run_train('--out', tmp_path / 'run', '--quiet', '--no-plots', *TINY) == 0
    monkeypatch.setitem(sys.modules, 'safetensors', None)
    monkeypatch.setitem(sys.modules, 'sklearn', None)
    assert evaluate.main([str(tmp_path / 'run' / 'checkpoint')]) == 2
    needed = re.search(r'needs (.*), not installed here', error_of(capsys))[1].split(', ')
    assert sorted(needed) == ['safetensors', 'scikit-learn']
