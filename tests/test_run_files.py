"""A run's files (config.json, state.json, model.safetensors, optimizer.safetensors): a diverging run never
saves over them, every damaged one is a CheckpointError naming it, and none stays mapped into memory once
read. Runs are tiny one-epoch digits runs, copied for each test."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vit_pytorch import checkpoint as ckpt
from vit_pytorch import pretrain, train
from vit_pytorch.evaluate import main as evaluate_main
from vit_pytorch.models import build_model

TINY = ['--threads', '1', '--dim', '32', '--depth', '2', '--heads', '2', '--dim-head', '16', '--mlp-dim', '64']
FAST = ['--quiet', '--no-plots', '--batch-size', '128', '--warmup-epochs', '1'] + TINY
ROOT = Path(__file__).resolve().parents[1]


def run(*argv):
    return train.main([str(arg) for arg in argv])


def contents(folder):
    """Every file under `folder`, by its path relative to it, as bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(Path(folder).rglob('*'))
            if path.is_file()}


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
    """The output folder of a finished one-epoch training run."""
    out = tmp_path_factory.mktemp('finished') / 'run'
    assert run('--epochs', 1, '--out', out, *FAST) == 0
    return out


@pytest.fixture
def copy(finished, tmp_path):
    """A copy of the finished run, for a test to damage."""
    return Path(shutil.copytree(finished, tmp_path / 'run'))


def run_optimizer(folder):
    """The model of the checkpoint in `folder` and an AdamW over it as the training command builds it."""
    model, _ = ckpt.load_model(folder)
    return model, torch.optim.AdamW(train.parameter_groups(model, 0.05), lr=1e-3)


def rewrite_optimizer_file(folder, change):
    """Apply `change` to the optimizer file's tensors and write them back without a checksum, as an older file."""
    from safetensors.torch import load_file, save_file

    file = folder / 'optimizer.safetensors'
    tensors = load_file(file)
    change(tensors)
    save_file(tensors, file)
    return file


def one_error_line(capsys):
    error = capsys.readouterr().err
    lines = [line for line in error.splitlines() if line.startswith('error:')]
    assert len(lines) == 1, error
    return lines[0]


# a diverging run


def test_a_resumed_run_that_diverges_stops_naming_the_step_and_the_lr_and_keeps_the_last_checkpoint(copy, capsys):
    before = contents(copy)
    assert run('--out', copy, '--resume', '--epochs', 3, '--lr', 1e6, '--quiet', '--no-plots') != 0
    line = one_error_line(capsys)
    assert 'epoch 2' in line and 'step' in line and '--lr 1e+06' in line
    assert contents(copy) == before                             # weights, optimizer, state and log byte for byte


def test_a_pre_training_run_that_diverges_stops_and_keeps_both_of_its_checkpoints(tmp_path, capsys):
    out = tmp_path / 'mae'
    args = ['--method', 'mae', '--decoder-depth', 1, '--image-size', 8, *FAST]
    assert pretrain.main([str(arg) for arg in (*args, '--epochs', 1, '--out', out)]) == 0
    before = contents(out)
    assert pretrain.main([str(arg) for arg in ('--out', out, '--resume', '--epochs', 3, '--lr', 1e6, '--quiet')]) != 0
    line = one_error_line(capsys)
    assert 'epoch 2' in line and '--lr 1e+06' in line and str(out / 'pretrainer') in line
    assert contents(out) == before


# the optimizer file


def negate_second_moment(tensors):
    tensors['state.0.exp_avg_sq'] = -tensors['state.0.exp_avg_sq'] - 1


def widen_first_moment(tensors):
    tensors['state.0.exp_avg'] = torch.zeros(tensors['state.0.exp_avg'].numel() + 1)


def spoil_a_key(tensors):
    tensors['state0exp_avg'] = tensors.pop('state.0.exp_avg')


def name_a_parameter_that_is_not_there(tensors):
    tensors['state.999.exp_avg'] = tensors.pop('state.0.exp_avg')


def put_nan_in_a_moment(tensors):
    tensors['state.1.exp_avg'][0] = float('nan')


def drop_a_moment(tensors):
    del tensors['state.1.exp_avg_sq']


@pytest.mark.parametrize('damage, key, said', [
    (negate_second_moment, 'state.0.exp_avg_sq', 'negative'),
    (widen_first_moment, 'state.0.exp_avg', 'shape'),
    (spoil_a_key, 'state0exp_avg', 'malformed'),
    (name_a_parameter_that_is_not_there, 'state.999.exp_avg', 'names no parameter'),
    (put_nan_in_a_moment, 'state.1.exp_avg', 'non-finite'),
    (drop_a_moment, 'exp_avg_sq', 'incomplete'),
])
def test_a_damaged_optimizer_file_is_a_checkpoint_error_naming_the_file_and_the_key(copy, damage, key, said):
    folder = copy / 'checkpoint'
    file = rewrite_optimizer_file(folder, damage)
    _, optimizer = run_optimizer(folder)
    with pytest.raises(ckpt.CheckpointError) as caught:
        ckpt.load_training_state(folder, optimizer)
    message = str(caught.value)
    assert str(file) in message and key in message and said in message, message


def test_a_flipped_byte_in_the_optimizer_file_fails_its_checksum(copy):
    folder = copy / 'checkpoint'
    file = folder / 'optimizer.safetensors'
    data = bytearray(file.read_bytes())
    data[-3] ^= 0x01                                            # inside the last tensor's bytes, not the header
    file.write_bytes(bytes(data))
    _, optimizer = run_optimizer(folder)
    with pytest.raises(ckpt.CheckpointError, match='checksum') as caught:
        ckpt.load_training_state(folder, optimizer)
    assert str(file) in str(caught.value)


def test_a_resume_refuses_a_damaged_optimizer_file_with_one_error_line(copy, capsys):
    file = rewrite_optimizer_file(copy / 'checkpoint', negate_second_moment)
    assert run('--out', copy, '--resume', '--epochs', 2, '--quiet') == 2
    line = one_error_line(capsys)
    assert str(file) in line and 'state.0.exp_avg_sq' in line


def test_a_resumed_optimizer_holds_its_state_in_memory_not_mapped_onto_the_file(finished, tmp_path):
    """Rewriting the file in place (here: truncating it) after the resume must not touch the optimizer's
    tensors: mapped, reading them would kill the process with SIGBUS. Run apart, so a crash fails only this."""
    folder = Path(shutil.copytree(finished, tmp_path / 'run')) / 'checkpoint'
    script = f"""
import torch
from vit_pytorch import checkpoint as ckpt, train
model, _ = ckpt.load_model({str(folder)!r})
optimizer = torch.optim.AdamW(train.parameter_groups(model, 0.05), lr=1e-3)
ckpt.load_training_state({str(folder)!r}, optimizer)
with open({str(folder / 'optimizer.safetensors')!r}, 'r+b') as file:
    file.truncate(0)
total = sum(value.double().sum() for state in optimizer.state.values() for value in state.values())
model(torch.zeros(2, 1, 16, 16)).sum().backward()
optimizer.step()
print('finite' if torch.isfinite(total) else 'not finite')
"""
    done = subprocess.run([sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS='1'))
    assert done.returncode == 0 and done.stdout.strip() == 'finite', (done.returncode, done.stderr[-2000:])


# config.json and state.json


def invalid_utf8(file):
    file.write_bytes(b'{"model": "vit\xff\xfe"}')


def a_folder_in_its_place(file):
    file.unlink()
    file.mkdir()


def an_argument_as_a_string(file):
    state = json.loads(file.read_text())
    state['args']['batch_size'] = '128'
    file.write_text(json.dumps(state))


def edit_json(**changes):
    def edit(file):
        value = json.loads(file.read_text())
        for key, new in changes.items():
            if new is None:
                del value[key]
            else:
                value[key] = new
        file.write_text(json.dumps(value))
    return edit


def edit_data(**changes):
    def edit(file):
        config = json.loads(file.read_text())
        config['data'].update(changes)
        file.write_text(json.dumps(config))
    return edit


@pytest.mark.parametrize('damage', [invalid_utf8, a_folder_in_its_place, edit_json(model_kwargs=[1, 2]),
                                    edit_json(model=3), edit_json(version='1'), edit_data(mean='0.5'),
                                    edit_data(channels=[1])],
                         ids=['utf8', 'folder', 'kwargs-list', 'model-number', 'version-string', 'mean-string',
                              'channels-list'])
def test_a_damaged_config_file_is_a_checkpoint_error_naming_it(copy, damage):
    file = copy / 'checkpoint' / 'config.json'
    damage(file)
    with pytest.raises(ckpt.CheckpointError) as caught:
        ckpt.load_model(copy / 'checkpoint')
    assert str(file) in str(caught.value)


@pytest.mark.parametrize('damage', [
    invalid_utf8, a_folder_in_its_place, edit_json(args=['--epochs', '1']), edit_json(history=None),
    edit_json(history='epoch 1'), edit_json(history=[dict(epoch='1')]), edit_json(epoch='1'), edit_json(epoch=5),
    edit_json(elapsed=[]), edit_json(optimizer=None),
], ids=['utf8', 'folder', 'args-list', 'no-history', 'history-string', 'history-unnumbered', 'epoch-string',
        'epoch-not-history', 'elapsed-list', 'no-optimizer'])
def test_a_damaged_state_file_is_a_checkpoint_error_naming_it(copy, damage):
    folder = copy / 'checkpoint'
    damage(folder / 'state.json')
    _, optimizer = run_optimizer(folder)
    with pytest.raises(ckpt.CheckpointError) as caught:
        ckpt.load_training_state(folder, optimizer)
    assert str(folder / 'state.json') in str(caught.value)


@pytest.mark.parametrize('damage', [invalid_utf8, a_folder_in_its_place, edit_json(args=['--epochs', '1']),
                                    edit_json(epoch='1'), an_argument_as_a_string],
                         ids=['utf8', 'folder', 'args-list', 'epoch-string', 'an-argument-string'])
def test_a_resume_from_a_damaged_state_file_is_one_error_line_naming_it(copy, damage, capsys):
    damage(copy / 'checkpoint' / 'state.json')
    assert run('--out', copy, '--resume', '--epochs', 2, '--quiet') == 2
    assert str(copy / 'checkpoint' / 'state.json') in one_error_line(capsys)


def test_weights_of_another_model_in_a_run_without_config_json_are_refused_as_not_fitting(copy, tmp_path, capsys):
    kwargs = train.model_config('swin', {}, image_size=16, channels=1, num_classes=10)
    other = ckpt.save_checkpoint(tmp_path / 'swin', model=build_model('swin', **kwargs),
                                 config=dict(model='swin', model_kwargs=kwargs))
    folder = copy / 'checkpoint'
    shutil.copy(other / 'model.safetensors', folder / 'model.safetensors')
    (folder / 'config.json').unlink()
    assert run('--out', copy, '--resume', '--epochs', 2, '--quiet') == 2
    line = one_error_line(capsys)
    assert str(folder) in line and "'swin'" in line and "'vit'" in line and 'do not fit' in line, line


def test_evaluating_a_checkpoint_whose_config_lacks_the_datas_normalisation_is_one_error_line(copy, capsys):
    config = copy / 'checkpoint' / 'config.json'
    edit_data(mean=None)(config)
    assert evaluate_main([str(copy / 'checkpoint')]) == 2
    line = one_error_line(capsys)
    assert str(copy / 'checkpoint') in line and 'mean' in line and 'config.json' in line


@pytest.mark.parametrize('name', ['config.json', 'state.json', 'model.safetensors', 'optimizer.safetensors'])
def test_a_fifo_in_place_of_a_run_file_is_a_checkpoint_error_naming_it_not_a_hang(copy, name):
    import threading

    folder = copy / 'checkpoint'
    (folder / name).unlink()
    os.mkfifo(folder / name)
    outcome = []

    def load():
        try:
            if name == 'state.json':
                ckpt.load_state(folder)
            elif name == 'optimizer.safetensors':
                ckpt.load_training_state(folder, run_optimizer(folder)[1])
            else:
                ckpt.load_model(folder)
        except ckpt.CheckpointError as error:
            outcome.append(str(error))

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(timeout=10)
    hung = reader.is_alive()
    if hung:                                       # release the hung reader so the test fails instead of freezing
        with open(folder / name, 'wb'):
            pass
        reader.join(timeout=10)
    assert not hung, f'reading a FIFO in place of {name} waited for a writer'
    assert outcome and name in outcome[0], outcome
