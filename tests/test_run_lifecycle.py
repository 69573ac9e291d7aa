"""A run's hold on its --out: one run at a time (run.lock), no new run over another unasked, a killed
run's leftovers cleaned; and BatchNorm models, which cannot train on a batch of one image."""

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from vit_pytorch import experiments, pretrain, run_folder, train
from vit_pytorch.models import build_model

pytest.importorskip('sklearn')
pytest.importorskip('safetensors')

# a few seconds each: 135 digits, one epoch of a one-layer ViT
TINY = ['--threads', '1', '--dim', '16', '--depth', '1', '--heads', '2', '--dim-head', '8', '--mlp-dim', '32']
FAST = ['--quiet', '--no-plots', '--epochs', '1', '--batch-size', '64', '--warmup-epochs', '1',
        '--label-fraction', '0.1'] + TINY
PRETRAIN = ['--method', 'simmim', '--quiet', '--no-plots', '--epochs', '1', '--batch-size', '256',
            '--warmup-epochs', '1', '--image-size', '8'] + TINY
EXPERIMENT = ['positions', '--seeds', '1', '--kinds', 'none', '--image-size', '8', '--epochs', '1',
              '--batch-size', '256', '--quiet'] + TINY


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def run(*argv):
    return train.main([str(arg) for arg in argv])


def weights(out, folder='checkpoint'):
    return (Path(out) / folder / 'model.safetensors').read_bytes()


def dead_pid():
    """The PID of a process that has ended."""
    child = subprocess.Popen([sys.executable, '-c', 'pass'])
    child.wait()
    return child.pid


def write_lock(out, pid):
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / 'run.lock').write_text(json.dumps(dict(pid=pid, host=socket.gethostname(), command='a test')))


# a new run over another


def test_a_new_run_over_a_finished_run_is_refused_naming_resume_and_overwrite(tmp_path, capsys):
    out = tmp_path / 'run'
    assert run(*FAST, '--out', out) == 0
    before = weights(out)
    capsys.readouterr()
    assert run(*FAST, '--seed', '1', '--out', out) == 2
    error = capsys.readouterr().err
    assert error.startswith('error: ') and '--resume' in error and '--overwrite' in error and str(out) in error
    assert weights(out) == before


def test_overwrite_moves_the_old_run_aside_and_starts_afresh(tmp_path, capsys):
    out = tmp_path / 'run'
    assert run(*FAST, '--out', out) == 0
    before = weights(out)
    assert run(*FAST, '--seed', '1', '--out', out, '--overwrite') == 0
    assert 'previous-1' in capsys.readouterr().err
    assert weights(out / 'previous-1') == before
    assert weights(out) != before                                   # the new run, from another seed
    assert [json.loads(line)['epoch'] for line in (out / 'log.jsonl').read_text().splitlines()] == [1]


def test_an_interrupted_saves_checkpoint_old_is_kept_by_a_refused_run_and_moved_by_overwrite(tmp_path):
    out = tmp_path / 'run'
    assert run(*FAST, '--out', out) == 0
    (out / 'checkpoint').rename(out / 'checkpoint.old')             # killed between the two renames of a save
    before = weights(out, 'checkpoint.old')
    assert run(*FAST, '--out', out) == 2
    assert weights(out, 'checkpoint.old') == before
    assert run(*FAST, '--out', out, '--overwrite') == 0
    assert weights(out / 'previous-1', 'checkpoint.old') == before


def test_a_killed_runs_checkpoint_tmp_is_removed_with_a_warning(tmp_path, capsys):
    out = tmp_path / 'run'
    assert run(*FAST, '--out', out) == 0
    (out / 'checkpoint.tmp').mkdir()
    (out / 'checkpoint.tmp' / 'model.safetensors').write_bytes(b'half-written')
    capsys.readouterr()
    assert run(*FAST, '--epochs', '2', '--out', out, '--resume') == 0
    error = capsys.readouterr().err
    assert 'warning: removed' in error and str(out / 'checkpoint.tmp') in error
    assert not (out / 'checkpoint.tmp').exists()


# one run at a time


def test_a_second_run_on_a_locked_out_is_refused_naming_the_first_runs_pid(tmp_path, capsys):
    out = tmp_path / 'run'
    with run_folder.locked(out, command='the first run'):
        assert run(*FAST, '--out', out) == 2
    error = capsys.readouterr().err
    assert error.startswith('error: ') and f'PID {os.getpid()} ' in error
    assert not (out / 'checkpoint').exists()


def test_a_lock_naming_a_live_process_on_this_host_is_refused(tmp_path, capsys):
    out = tmp_path / 'run'
    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
    try:
        write_lock(out, child.pid)
        assert run(*FAST, '--out', out) == 2
    finally:
        child.kill()
        child.wait()
    assert f'PID {child.pid} ' in capsys.readouterr().err


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_warning(tmp_path, capsys):
    out = tmp_path / 'run'
    pid = dead_pid()
    write_lock(out, pid)
    assert run(*FAST, '--out', out) == 0
    error = capsys.readouterr().err
    assert 'warning: took over' in error and f'PID {pid} ' in error
    assert not (out / 'run.lock').exists()                          # released when the run ended


def test_the_lock_is_held_until_a_failing_run_ends_and_released_then(tmp_path, monkeypatch):
    out = tmp_path / 'run'
    held = []

    def failing(*args, **kwargs):                                    # a step after the run took --out
        held.append((out / 'run.lock').exists())
        raise ValueError('a failure in the run')

    monkeypatch.setattr(train, 'label_subset', failing)
    assert run(*FAST, '--out', out) == 2
    assert held == [True] and not (out / 'run.lock').exists()


def test_a_run_holds_the_lock_while_it_trains(tmp_path, monkeypatch):
    out = tmp_path / 'run'
    seen = []
    evaluate = train.evaluate

    def looking(*args, **kwargs):
        lock = json.loads((out / 'run.lock').read_text())
        seen.append(lock['pid'])
        thread = threading.Thread(target=lambda: seen.append(run(*FAST, '--out', out)))
        thread.start()
        thread.join()
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(train, 'evaluate', looking)
    assert run(*FAST, '--out', out) == 0
    assert seen == [os.getpid(), 2]                   # the run's PID; the second run refused


# pre-training and experiments


def test_pretrain_refuses_a_new_run_over_another_and_a_locked_out(tmp_path, capsys):
    out = tmp_path / 'pre'
    assert pretrain.main([*PRETRAIN, '--out', str(out)]) == 0
    before = weights(out, 'pretrainer')
    capsys.readouterr()
    assert pretrain.main([*PRETRAIN, '--out', str(out)]) == 2
    error = capsys.readouterr().err
    assert '--resume' in error and '--overwrite' in error
    assert weights(out, 'pretrainer') == before
    with run_folder.locked(out, command='the first run'):
        assert pretrain.main([*PRETRAIN, '--epochs', '2', '--resume', '--out', str(out)]) == 2
    assert 'PID' in capsys.readouterr().err
    assert pretrain.main([*PRETRAIN, '--out', str(out), '--overwrite']) == 0
    assert weights(out / 'previous-1', 'pretrainer') == before


def test_experiments_refuse_other_settings_naming_the_difference_and_overwrite(tmp_path, capsys):
    out = tmp_path / 'positions'
    assert experiments.main([*EXPERIMENT, '--out', str(out)]) == 0
    before = (out / 'results.json').read_text()
    capsys.readouterr()
    assert experiments.main([*EXPERIMENT, '--lr', '1e-3', '--out', str(out)]) == 2
    error = capsys.readouterr().err
    assert 'lr 0.001' in error and '--overwrite' in error
    assert (out / 'results.json').read_text() == before
    assert experiments.main([*EXPERIMENT, '--lr', '1e-3', '--out', str(out), '--overwrite']) == 0
    assert (out / 'previous-1' / 'results.json').read_text() == before


def test_experiments_refuse_a_locked_out(tmp_path, capsys):
    out = tmp_path / 'positions'
    write_lock(out, dead_pid())
    with run_folder.locked(out, command='the first run'):
        assert experiments.main([*EXPERIMENT, '--out', str(out)]) == 2
    assert 'PID' in capsys.readouterr().err and not (out / 'results.json').exists()


# BatchNorm and a batch of one


@pytest.mark.parametrize('count, least, sizes', [(70, 2, [3] * 22 + [4]), (69, 2, [3] * 23), (7, 4, [3, 4]),
                                                 (70, 1, [3] * 23 + [1]), (1, 2, [1])])
def test_a_last_batch_below_the_least_joins_the_one_before(count, least, sizes):
    batches = train.epoch_batches(torch.arange(count), 3, least)
    assert [len(batch) for batch in batches] == sizes
    assert torch.cat(batches).tolist() == list(range(count))


@pytest.mark.parametrize('model', ['levit', 'mobile_vit'])
def test_batchnorm_models_train_when_the_last_batch_is_one_image(model, tmp_path, capsys):
    """70 labelled digits in batches of 3 leave one image at the end of every epoch."""
    out = tmp_path / model
    assert run('--model', model, '--label-fraction', '0.05', '--batch-size', '3', '--epochs', '1', '--no-plots',
               '--threads', '1', '--out', out) == 0
    assert capsys.readouterr().out.count('joins the one before') == 1
    record = json.loads((out / 'log.jsonl').read_text())
    assert record['train_images'] == 70


def test_batchnorm_model_with_batches_of_one_is_refused_before_training(tmp_path, capsys):
    assert run('--model', 'levit', '--label-fraction', '0.05', '--batch-size', '1', '--epochs', '1', '--quiet',
               '--no-plots', '--out', tmp_path / 'run') == 2
    error = capsys.readouterr().err
    assert 'BatchNorm' in error and '--batch-size 2' in error
    assert not (tmp_path / 'run' / 'checkpoint').exists()


@pytest.mark.parametrize('name', ['levit', 'mobile_vit'])
def test_a_bare_model_in_training_mode_explains_a_batch_of_one(name):
    model = build_model(name, **train.model_config(name, {}, image_size=16, channels=1, num_classes=10))
    with pytest.raises(ValueError, match=r'at least 2 images.*BatchNorm.*model\.eval\(\)'):
        model(torch.randn(1, 1, 16, 16))
    assert model(torch.randn(2, 1, 16, 16)).shape == (2, 10)
    assert model.eval()(torch.randn(1, 1, 16, 16)).shape == (1, 10)


def test_a_last_batch_smaller_than_the_processes_joins_the_one_before_with_a_note_saying_why():
    # pre-training takes means over each process's images: a process with none would give a NaN loss
    note = train.check_batches(2, 4, images=9, world_size=2, name='vit')
    assert note is not None and 'each of the 2 processes needs at least one image' in note
    assert [len(batch) for batch in train.epoch_batches(torch.arange(9), 4, 2)] == [4, 5]
