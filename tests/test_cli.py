"""The commands' lines for a newcomer (issue 24 items 2, 3, 8): the model that fits the data when --model is
absent, one error line before anything is built for a model that does not fit the data or --random-size, a "did
you mean" for a mistyped option, a short summary from `experiments`, captions and ticks that say what was done,
and an example that writes under runs/."""

import json
import re
from pathlib import Path

import pytest
import torch

from helpers import install_fake_aeon, load_example
from vit_pytorch import evaluate, experiments, models, pretrain, train
from vit_pytorch.checkpoint import load_config

pytest.importorskip('sklearn')
pytest.importorskip('safetensors')

ROOT = Path(__file__).resolve().parents[1]
# one layer of width 32 and one epoch over the training set in a few steps
TINY = ['--threads', '1', '--dim', '32', '--depth', '1', '--heads', '2', '--dim-head', '16', '--mlp-dim', '64',
        '--batch-size', '512', '--warmup-epochs', '1', '--epochs', '1', '--no-plots']


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def refused(capsys, out):
    """The one stderr line of a command refused before it built or wrote anything (nothing on stdout)."""
    printed = capsys.readouterr()
    assert printed.out == '' and not out.exists()
    lines = printed.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), printed.err
    return lines[0]


# the model for the data's kind


def test_clips_without_model_train_the_clip_vit_and_say_so(tmp_path, capsys):
    out = tmp_path / 'run'
    assert train.main(['--data', 'clips:direction', '--image-size', '16', *TINY, '--out', str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == 'no --model given: using vit_3d, the ViT for clips'
    assert load_config(out / 'checkpoint')['model'] == 'vit_3d'


def test_signals_without_model_train_the_signal_vit_and_say_so(tmp_path, capsys, monkeypatch):
    install_fake_aeon(monkeypatch)
    out = tmp_path / 'run'
    assert train.main(['--data', 'ucr:GunPoint', *TINY, '--out', str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == 'no --model given: using vit_1d, the ViT for signals'
    assert load_config(out / 'checkpoint')['model'] == 'vit_1d'


def test_images_without_model_train_the_vit_without_a_note(tmp_path, capsys):
    out = tmp_path / 'run'
    assert train.main([*TINY, '--image-size', '8', '--out', str(out), '--quiet']) == 0
    assert 'no --model given' not in capsys.readouterr().out
    assert load_config(out / 'checkpoint')['model'] == 'vit'


@pytest.mark.parametrize('data, model, kind, fitting', [
    ('clips:direction', 'vit', 'clips', 'vit_3d'),
    ('ucr:GunPoint', 'vit', 'signals', 'vit_1d'),
    ('ucr:GunPoint', 'vivit', 'signals', 'simple_vit_1d'),
    ('digits', 'vit_1d', 'images', 'simple_vit'),
    ('digits', 'vit_3d', 'images', 'na_vit'),
])
def test_a_model_that_does_not_fit_the_data_is_one_error_line_naming_models_that_do(data, model, kind, fitting,
                                                                                    tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(models, 'build_model', lambda *a, **k: pytest.fail('built a model'))
    out = tmp_path / 'run'
    assert train.main(['--data', data, '--model', model, *TINY, '--out', str(out)]) == 2
    line = refused(capsys, out)
    assert f'--model {model} takes {train.inputs_of(model)}' in line and f'gives {kind}' in line
    assert re.search(rf'\b{fitting}\b', line)


def test_every_data_prefix_has_a_kind_and_a_default_model_of_that_kind():
    from vit_pytorch.evaluate import SOURCES

    assert set(train.DATA_INPUTS) == set(SOURCES)
    for kind, (name, _) in train.DEFAULT_MODELS.items():
        assert train.inputs_of(name) == kind


def test_data_help_lists_the_ucr_and_clips_sources(capsys):
    with pytest.raises(SystemExit):
        train.main(['--help'])
    text = ' '.join(capsys.readouterr().out.split())
    assert 'ucr:NAME' in text and 'clips:TASK' in text


# --random-size


def test_random_size_with_a_model_of_one_size_is_one_error_line_naming_the_mixed_size_models(tmp_path, capsys,
                                                                                           monkeypatch):
    monkeypatch.setattr(models, 'build_model', lambda *a, **k: pytest.fail('built a model'))
    out = tmp_path / 'run'
    assert train.main(['--model', 'vit', '--random-size', '8', '16', *TINY, '--out', str(out)]) == 2
    line = refused(capsys, out)
    assert '--random-size' in line and '--model vit does not take' in line
    assert 'na_vit' in line and 'na_vit_nested_tensor' in line


@pytest.mark.parametrize('name', train.MIXED_SIZES)
def test_the_mixed_size_models_take_a_list_of_images_of_different_sizes(name):
    kwargs = train.model_config(name, dict(depth=1), image_size=16, channels=1, num_classes=3)
    model = models.build_model(name, **kwargs).eval()
    images = [torch.rand(1, 8, 16), torch.rand(1, 16, 12), torch.rand(1, 12, 12)]
    logits = model(images)
    assert logits.shape == (3, 3) and torch.isfinite(logits).all()


# did you mean


@pytest.mark.parametrize('command, argv', [
    (train.main, []),
    (pretrain.main, ['--method', 'mae']),
    (experiments.main, ['pooling']),
])
def test_a_mistyped_option_is_one_error_line_with_the_closest_spelling(command, argv, tmp_path, capsys):
    out = tmp_path / 'run'
    assert command([*argv, '--dimm', '32', '--epochs', '1', '--out', str(out)]) == 2
    line = refused(capsys, out)
    assert 'unrecognised option --dimm' in line and re.search(r'did you mean --dim\b', line)


def test_a_mistyped_command_option_is_matched_to_the_commands_own(tmp_path, capsys):
    out = tmp_path / 'run'
    assert train.main(['--label-smothing', '0.1', '--out', str(out)]) == 2
    assert re.search(r'did you mean --label-smoothing\b', refused(capsys, out))


def test_a_mistyped_evaluate_option_is_one_error_line_before_the_checkpoint_is_read(tmp_path, capsys):
    checkpoint = tmp_path / 'run'                   # never created: the option is refused before it is looked for
    assert evaluate.main([str(checkpoint), '--splitt', 'test']) == 2
    line = refused(capsys, checkpoint)
    assert 'unrecognised option --splitt' in line and re.search(r'did you mean --split\b', line)


def test_an_evaluate_option_unlike_any_lists_the_commands_options(tmp_path, capsys):
    checkpoint = tmp_path / 'run'
    assert evaluate.main([str(checkpoint), '--zzzzzz=1']) == 2
    line = refused(capsys, checkpoint)
    assert 'unrecognised option --zzzzzz' in line and '--split' in line and '--batch-size' in line


# output


def test_one_epoch_is_said_in_the_singular(tmp_path, capsys):
    assert train.main([*TINY, '--image-size', '8', '--out', str(tmp_path / 'run'), '--quiet']) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert ' after 1 epoch (' in last


def test_experiments_print_a_line_per_setting_and_the_path_of_results_json(tmp_path, capsys):
    out = tmp_path / 'pooling'
    assert experiments.main(['pooling', '--lrs', '1e-3', '1e-2', '--seeds', '1', '--image-size', '8', '--epochs', '1',
                             '--batch-size', '256', '--dim', '16', '--depth', '1', '--heads', '2', '--dim-head', '8',
                             '--mlp-dim', '32', '--quiet', '--threads', '1', '--out', str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    saved = json.loads((out / 'results.json').read_text())['summary']
    # 2 pools x 2 learning rates, each pool's best learning rate, the path
    assert len(lines) == 7 and str(out / 'results.json') in lines[-1]
    for pool in ('cls', 'mean'):
        for point in saved[pool]:
            assert f"{pool} lr {point['lr']:g}: {100 * point['mean']:.2f}% +- 0.00 (n=1)" in lines
    assert not any(line.lstrip().startswith(('{', '"', '[')) for line in lines)


def test_the_curves_of_signals_say_the_shifts_are_in_time_on_the_signals(tmp_path, capsys, monkeypatch):
    install_fake_aeon(monkeypatch)
    notes = []
    monkeypatch.setattr(train.plots, 'save_training_curves',
                        lambda history, path, note=None, **k: notes.append(note) or Path(path))
    argv = [arg for arg in TINY if arg != '--no-plots']
    assert train.main(['--data', 'ucr:GunPoint', '--model', 'vit_1d', *argv, '--out', str(tmp_path / 'run')]) == 0
    assert len(notes) == 1
    assert 'shifts in time on the signals' in notes[0] and 'images' not in notes[0]


def test_pretraining_curves_tick_whole_epochs(tmp_path, monkeypatch):
    pytest.importorskip('matplotlib')
    figures = []
    make = pretrain._figure
    monkeypatch.setattr(pretrain, '_figure', lambda *a: figures.append(make(*a)) or figures[-1])
    assert pretrain.main(['--method', 'mae', '--image-size', '8', '--patch-size', '4', *TINY[:-5], '--epochs', '3',
                          '--batch-size', '512', '--quiet', '--out', str(tmp_path / 'run')]) == 0
    curve = next(figure for figure in figures if 'pre-training loss' in figure.axes[0].get_title())
    ticks = [tick for tick in curve.axes[0].get_xticks() if 1 <= tick <= 3]
    assert ticks and all(float(tick).is_integer() for tick in ticks)


def test_the_moving_digits_example_writes_under_runs_unless_told(tmp_path, monkeypatch):
    pytest.importorskip('matplotlib')
    example = load_example('moving_digits')
    documented = ROOT / 'docs' / 'images' / 'moving_digits.png'
    before = documented.stat().st_mtime_ns if documented.exists() else None
    monkeypatch.chdir(tmp_path)
    example.main(['--count', '1'])
    assert (tmp_path / 'runs' / 'moving_digits' / 'moving_digits.png').read_bytes()[:4] == b'\x89PNG'
    assert (documented.stat().st_mtime_ns if documented.exists() else None) == before
    example.main(['--count', '1', '--out', str(tmp_path / 'clips.png')])
    assert (tmp_path / 'clips.png').exists()
