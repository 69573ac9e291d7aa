"""The pre-training command: every method runs through main(argv), writes a checkpoint the trainer and
load_model take, resumes exactly, follows DINO's schedules, draws its pictures and says clearly what is
wrong. Tiny models (width 32, 2 layers) and one or two epochs keep it fast."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vit_pytorch import pretrain, train
from vit_pytorch.checkpoint import load_model
from vit_pytorch.evaluate import load_digits
from vit_pytorch.dino import Dino
from vit_pytorch.models import build_model
from vit_pytorch.training import pretraining, registry

TINY = ['--threads', '1', '--dim', '32', '--depth', '2', '--heads', '2', '--dim-head', '16', '--mlp-dim', '64']
FAST = ['--quiet', '--no-plots', '--batch-size', '256', '--warmup-epochs', '1'] + TINY
# DINO at its smallest: a narrow head, one local crop
SMALL_DINO = ['--num-classes-k', '64', '--projection-hidden-size', '32', '--bottleneck-dim', '16',
              '--num-local-crops', '1']


def run(*argv):
    return pretrain.main([str(arg) for arg in argv])


def log_of(out):
    return [json.loads(line) for line in (Path(out) / 'log.jsonl').read_text().splitlines()]


def weights_of(folder):
    from safetensors.torch import load_file
    return load_file(Path(folder) / 'model.safetensors')


def method_args(method):
    return ['--method', method] + (SMALL_DINO if method in ('dino', 'esvit') else ['--decoder-depth', '1']
                                   if method == 'mae' else [])


IMAGE_METHODS = [name for name in pretrain.METHODS if pretraining.METHODS[name].inputs == 'images']
CLIP_METHODS = [name for name in pretrain.METHODS if pretraining.METHODS[name].inputs == 'clips']
# the clip methods at their smallest: 16-pixel clips (a 4 x 2 x 2 grid of simple_vit_3d's tubelets), 2 local views
TINY_CLIPS = [*FAST, '--batch-size', 512, '--model', 'simple_vit_3d', '--image-size', 16, '--local-views', 2]
# LeVJEPA's own encoder on TINY_CLIPS: 8 frames of 2 x 2 patches of 8 pixels (32 patch tokens), half dropped
DROPPING = ['--model', 'levjepa', '--drop-ratio', 0.5]


@pytest.mark.parametrize('method', IMAGE_METHODS)
def test_each_method_writes_a_network_that_loads_as_the_model_it_pre_trained(method, tmp_path):
    out = tmp_path / method
    assert run(*method_args(method), '--epochs', 1, '--out', out, *FAST, '--image-size', 8) == 0
    [record] = log_of(out)
    assert record['epoch'] == 1 and math.isfinite(record['loss'])
    model, config = load_model(out / 'checkpoint')
    assert config['model'] == 'vit' and config['pretraining'] == dict(method=method)
    assert config['model_kwargs']['dim'] == 32 and config['data']['source'] == 'digits'
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    # the network is the wrapper's own: MAE's encoder, MPP's model, DINO's teacher, MP3's ViT
    wrapper = weights_of(out / 'pretrainer')
    prefix = dict(mae='encoder.', simmim='encoder.', mpp='transformer.', dino='teacher.net.', mp3='vit.',
                  lejepa='net.', esvit='teacher.net.')[method]
    network = weights_of(out / 'checkpoint')
    assert network.keys() == {key[len(prefix):] for key in wrapper if key.startswith(prefix)}
    for key, value in network.items():
        assert torch.equal(value, wrapper[prefix + key]), key


@pytest.mark.parametrize('method', ['mae', 'dino', 'mp3', 'lejepa', 'levjepa',
                                    pytest.param('levjepa[drop_ratio]', marks=pytest.mark.slow)])   # 11 s
def test_interrupted_run_resumed_matches_an_uninterrupted_run(method, tmp_path, monkeypatch):
    whole, broken = tmp_path / 'whole', tmp_path / 'broken'
    # 8-pixel digits (a 2x2 grid), or 16-pixel clips, in 3 batches an epoch keep it fast; LeVJEPA's own encoder
    # drops half of its 32 patch tokens in training, drawn from the epoch's seed as the crops are
    dropping = method == 'levjepa[drop_ratio]'
    method = method.split('[')[0]
    data = TINY_CLIPS if method in CLIP_METHODS else [*FAST, '--batch-size', 512, '--image-size', 8]
    args = [*method_args(method), '--epochs', 2, *data, *(DROPPING if dropping else [])]
    assert run(*args, '--out', whole) == 0

    saves = []
    real_save = pretrain.save_checkpoint

    def save_then_die(directory, **kwargs):
        real_save(directory, **kwargs)
        saves.append(Path(directory).name)
        if saves == ['checkpoint', 'pretrainer']:
            raise KeyboardInterrupt                     # killed right after epoch 1 was saved

    monkeypatch.setattr(pretrain, 'save_checkpoint', save_then_die)
    assert run(*args, '--out', broken) == 130
    monkeypatch.setattr(pretrain, 'save_checkpoint', real_save)
    assert len(log_of(broken)) == 1
    assert run('--out', broken, '--resume') == 0

    for folder in ('checkpoint', 'pretrainer'):         # DINO: student, teacher and centre alike
        expected, resumed = weights_of(whole / folder), weights_of(broken / folder)
        assert expected.keys() == resumed.keys()
        for key in expected:
            assert torch.equal(expected[key], resumed[key]), (folder, key)
    timing = ('epoch_seconds', 'images_per_second', 'elapsed_seconds')
    strip = lambda log: [{k: v for k, v in record.items() if k not in timing} for record in log]
    assert strip(log_of(broken)) == strip(log_of(whole))


def test_resume_refuses_another_method_or_model_naming_both_values(tmp_path, capsys):
    out = tmp_path / 'run'
    assert run('--method', 'simmim', '--epochs', 1, '--out', out, *FAST) == 0
    capsys.readouterr()
    assert run('--out', out, '--resume', '--epochs', 2, '--method', 'mae', '--dim', 48) == 2
    error = capsys.readouterr().err
    assert '--method mae (the run has simmim)' in error and '--dim 48 (the run has 32)' in error
    assert len(log_of(out)) == 1
    assert run('--out', out, '--resume') == 2           # done: more epochs are needed
    assert 'give more epochs' in capsys.readouterr().err


def test_masked_pre_training_lowers_the_loss_on_the_digits(tmp_path):
    out = tmp_path / 'run'
    assert run('--method', 'simmim', '--epochs', 4, '--out', out, *FAST, '--batch-size', 128, '--lr', 3e-3) == 0
    losses = [record['loss'] for record in log_of(out)]
    assert losses[-1] < 0.8 * losses[0], losses


def test_mp3_pre_trains_the_vit_without_its_positions_and_the_trainer_fine_tunes_it(tmp_path):
    out = tmp_path / 'mp3'
    assert run('--method', 'mp3', '--epochs', 1, '--out', out, *FAST, '--image-size', 8) == 0
    [record] = log_of(out)
    assert 0 < record['loss'] < math.inf
    pretrained = weights_of(out / 'checkpoint')
    _, config = load_model(out / 'checkpoint')
    torch.manual_seed(0)                                # --seed 0 built the ViT the run started from
    untrained = build_model(config['model'], **config['model_kwargs']).state_dict()
    # the positions are what MP3 predicts, never what it is given: the embedding is as initialised
    assert torch.equal(pretrained['pos_embedding'], untrained['pos_embedding'])
    [projection] = [key for key, value in untrained.items()
                    if key.startswith('to_patch_embedding.') and value.ndim == 2]
    assert not torch.equal(pretrained[projection], untrained[projection])      # the rest of the ViT learned

    tuned = tmp_path / 'finetune'
    assert train_run('--init', out / 'checkpoint', '--image-size', 8, '--label-fraction', 0.05, '--epochs', 1,
                     '--out', tuned, '--quiet', '--no-plots', '--threads', 1) == 0
    model, tuned_config = load_model(tuned / 'checkpoint')
    assert tuned_config['model_kwargs'] == config['model_kwargs']
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    [record] = log_of(tuned)
    assert 0 <= record['test_accuracy'] <= 1


@pytest.mark.parametrize('method', ['mae', 'simmim', 'mp3'])
def test_a_masking_ratio_of_zero_is_refused_by_name_not_replaced_by_the_default(method, tmp_path, capsys):
    assert run('--method', method, '--masking-ratio', 0, '--epochs', 1, '--out', tmp_path / 'zero', *FAST,
               '--image-size', 8) == 2
    error = capsys.readouterr().err
    assert 'masking_ratio must be in (0, 1)' in error and 'got 0' in error
    assert len(error.strip().splitlines()) == 1                 # one line, not a traceback
    assert not (tmp_path / 'zero' / 'checkpoint').exists()


def test_dino_schedules_follow_the_papers_formulas():
    args, _ = pretrain.parse_args(['--method', 'dino', '--epochs', '10'])       # warm-up: 30 % of 10 epochs
    steps, total = 5, 50
    expected_temperature = lambda step: 0.04 + (0.07 - 0.04) * min(1, step / 15)
    expected_decay = lambda step: 1 - (1 - 0.996) * (math.cos(math.pi * step / total) + 1) / 2
    for step in (0, 7, 15, 30, 49):
        temperature, decay = pretrain.dino_schedule(args, step, steps, total)
        assert temperature == pytest.approx(expected_temperature(step))
        assert decay == pytest.approx(expected_decay(step))
    assert pretrain.dino_schedule(args, 0, steps, total) == pytest.approx((0.04, 0.996))


def test_dino_logs_its_teacher_temperature_and_decay(tmp_path):
    out = tmp_path / 'run'
    assert run(*method_args('dino'), '--epochs', 2, '--warmup-teacher-temp-epochs', 1, '--out', out, *FAST,
               '--batch-size', 512, '--image-size', 8) == 0
    first, last = log_of(out)
    # 3 steps an epoch: the last step of epoch 1 is 2/3 into the warm-up, of epoch 2 past it
    assert first['teacher_temp'] == pytest.approx(0.04 + 0.03 * 2 / 3)
    assert last['teacher_temp'] == pytest.approx(0.07)
    assert last['teacher_decay'] == pytest.approx(1 - 0.004 * (math.cos(math.pi * 5 / 6) + 1) / 2)
    # the signs of collapse: the teacher's entropies, between one output (0) and uniform outputs (ln K)
    for record in (first, last):
        assert record['uniform_entropy'] == pytest.approx(math.log(64))
        assert 0 < record['teacher_entropy'] <= record['teacher_mean_entropy'] <= math.log(64) + 1e-9


@pytest.mark.parametrize('freeze, cancelled', [(1, 3), (0, 0), (2, 6)])
def test_dino_freezes_the_heads_last_layer_for_the_first_epochs_only(freeze, cancelled, tmp_path, monkeypatch):
    # 3 steps an epoch; the cancelling itself is tested in test_dino
    calls = []
    monkeypatch.setattr(Dino, 'cancel_last_layer_gradients', lambda self: calls.append(1))
    assert run(*method_args('dino'), '--epochs', 2, '--freeze-last-layer', freeze, '--out', tmp_path, *FAST,
               '--batch-size', 512, '--image-size', 8) == 0
    assert len(calls) == cancelled


def test_pictures_reconstructions_and_attention_per_head(tmp_path):
    mae, dino = tmp_path / 'mae', tmp_path / 'dino'
    assert run('--method', 'mae', '--decoder-depth', 1, '--epochs', 1, '--out', mae, *FAST[2:], '--quiet') == 0
    assert run(*method_args('dino'), '--epochs', 1, '--out', dino, *FAST[2:], '--quiet') == 0
    for path in (mae / 'reconstructions.png', mae / 'curves.png', dino / 'attention.png', dino / 'curves.png'):
        assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and path.stat().st_size > 3000, path


@pytest.mark.parametrize('method', ['mae', 'simmim'])
def test_a_reconstruction_shows_the_input_where_visible_and_hides_the_drawn_share(method):
    from vit_pytorch import ViT
    from vit_pytorch.mae import MAE
    from vit_pytorch.simmim import SimMIM

    encoder = ViT(image_size=16, patch_size=4, num_classes=10, channels=1, dim=32, depth=1, heads=2, dim_head=16,
                  mlp_dim=64)
    learner = MAE(encoder=encoder, decoder_dim=32) if method == 'mae' else SimMIM(encoder=encoder)
    images = torch.rand(3, 1, 16, 16)
    masked, reconstruction, hidden = pretrain.reconstructions(learner, method, images)
    share = dict(mae=0.75, simmim=0.5)[method]
    assert hidden.float().mean(dim=(1, 2, 3)).tolist() == pytest.approx([share] * 3)
    assert torch.equal(reconstruction[~hidden], images[~hidden])
    assert torch.equal(masked[~hidden], images[~hidden]) and (masked[hidden] == 0).all()


def test_esvit_pre_trains_a_multi_stage_model_and_saves_its_teacher(tmp_path):
    out = tmp_path / 'esvit'
    assert run(*method_args('esvit'), '--model', 'swin', '--epochs', 1, '--out', out, '--quiet', '--no-plots',
               '--batch-size', 512, '--threads', 1, '--image-size', 16) == 0
    model, config = load_model(out / 'checkpoint')
    assert config['model'] == 'swin' and model(torch.zeros(2, 1, 16, 16)).shape == (2, 10)
    wrapper, network = weights_of(out / 'pretrainer'), weights_of(out / 'checkpoint')
    assert {f'teacher.net.{key}' for key in network} == {key for key in wrapper if key.startswith('teacher.net.')}
    assert any(key.startswith('teacher.region_head.') for key in wrapper)
    # the log gives both teachers' signs of collapse, each between one output (0) and uniform outputs (ln K)
    [record] = log_of(out)
    for level in ('', 'region_'):
        assert 0 < record[f'{level}teacher_entropy'] <= record[f'{level}teacher_mean_entropy'] <= math.log(64) + 1e-9


def test_the_method_is_required_and_a_model_without_the_face_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        pretrain.main(['--epochs', '1'])
    assert '--method is required' in capsys.readouterr().err
    assert run('--method', 'mae', '--model', 'swin', '--epochs', 1, '--out', tmp_path / 'swin', '--quiet',
               '--no-plots') == 2
    error = capsys.readouterr().err
    assert '--method mae cannot pre-train --model swin' in error and 'patch_tokens' in error


def test_signals_are_refused(tmp_path, capsys, monkeypatch):
    from vit_pytorch import evaluate

    def waves(argument):
        def load(split, *, image_size, channels, classes=None):
            return evaluate.ImageSet(torch.rand(8, 1, 32), torch.arange(8) % 2, ['a', 'b'])
        return evaluate.DataSource('waves', load)

    monkeypatch.setitem(evaluate.SOURCES, 'waves', 'test_pretrain_waves:waves')
    module = type(sys)('test_pretrain_waves')
    module.waves = waves
    monkeypatch.setitem(sys.modules, 'test_pretrain_waves', module)
    assert run('--method', 'mae', '--data', 'waves:x', '--epochs', 1, '--out', tmp_path / 'w', '--quiet') == 2
    assert 'pre-training takes images' in capsys.readouterr().err


# the pre-trained network in the training command: fine-tuning and the linear probe


WORKER = """
import sys
from vit_pytorch import pretrain, train
sys.exit(pretrain.main(sys.argv[1:]))
"""


def test_two_processes_pre_train_and_write_one_checkpoint(tmp_path):
    """torchrun with gloo: the 2 processes split each batch; every image is counted once and the first
    process writes the network."""
    out = tmp_path / 'double'
    worker = tmp_path / 'worker.py'
    worker.write_text(WORKER)
    args = ['--method', 'mae', '--decoder-depth', '1', '--epochs', '1', '--device', 'cpu', *FAST, '--out', str(out)]
    process = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                                str(worker), *args], env=dict(os.environ, OMP_NUM_THREADS='1'),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
    assert process.returncode == 0, stderr[-3000:]
    [record] = log_of(out)
    assert math.isfinite(record['loss'])
    model, _ = load_model(out / 'checkpoint')
    assert model(torch.zeros(1, 1, 16, 16)).shape == (1, 10)


# the pre-trained network in the training command: --init, --linear-probe, --label-fraction


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
    out = tmp_path_factory.mktemp('pretrained') / 'mae'
    assert run('--method', 'mae', '--decoder-depth', 1, '--epochs', 1, '--out', out, *FAST) == 0
    return out / 'checkpoint'


def train_run(*argv):
    return train.main([str(arg) for arg in argv])


def test_label_fraction_takes_the_same_share_of_every_class_drawn_by_the_seed():
    labels = torch.arange(10).repeat_interleave(torch.tensor([130, 140, 135, 120, 150, 128, 133, 137, 139, 135]))
    chosen = train.label_subset(labels, 0.05, seed=0)
    counts = torch.bincount(labels[chosen], minlength=10).tolist()
    assert counts == [round(0.05 * n) for n in (130, 140, 135, 120, 150, 128, 133, 137, 139, 135)]
    assert torch.equal(chosen, train.label_subset(labels, 0.05, seed=0))
    assert not torch.equal(chosen, train.label_subset(labels, 0.05, seed=1))
    assert torch.equal(train.label_subset(labels, 1.0, seed=3), torch.arange(len(labels)))
    assert torch.bincount(labels[train.label_subset(labels, 0.001, seed=0)]).tolist() == [1] * 10
    with pytest.raises(ValueError, match='--label-fraction'):
        train.label_subset(labels, 0.0, seed=0)


def test_linear_probe_trains_only_a_new_head_on_the_pre_trained_network(pretrained, tmp_path):
    out = tmp_path / 'probe'
    assert train_run('--init', pretrained, '--linear-probe', '--label-fraction', 0.1, '--epochs', 1, '--out', out,
                     '--quiet', '--no-plots', '--threads', 1) == 0
    start, probed = weights_of(pretrained), weights_of(out / 'checkpoint')
    assert start.keys() == probed.keys()
    head = {key for key in start if key.startswith('mlp_head.')}
    assert head == {'mlp_head.weight', 'mlp_head.bias'}
    for key in start.keys() - head:
        assert torch.equal(start[key], probed[key]), key          # the network, frozen as it was pre-trained
    assert probed['mlp_head.weight'].abs().sum() > 0              # the new head, zero at first, has learned
    [record] = log_of(out)
    per_class = torch.bincount(load_digits('train').labels).tolist()
    assert record['train_images'] == sum(round(0.1 * n) for n in per_class) == 136   # 10 % of each class


def test_fine_tuning_starts_from_the_pre_trained_network_and_trains_all_of_it(pretrained, tmp_path, monkeypatch):
    seen = {}
    real_step = torch.optim.AdamW.step

    def first_step(self, *args, **kwargs):                         # the weights before the first update
        if not seen:
            seen.update({id(p): p.detach().clone() for group in self.param_groups for p in group['params']})
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, 'step', first_step)
    out = tmp_path / 'finetune'
    assert train_run('--init', pretrained, '--label-fraction', 0.05, '--epochs', 1, '--out', out, '--quiet',
                     '--no-plots', '--threads', 1) == 0
    model, config = load_model(out / 'checkpoint')
    start = weights_of(pretrained)
    assert config['model_kwargs'] == load_model(pretrained)[1]['model_kwargs']
    assert len(seen) == len(start)                                 # every tensor trains
    before = sorted(seen.values(), key=lambda tensor: tuple(tensor.shape))
    for key, value in start.items():
        if not key.startswith('mlp_head.'):                        # each pre-trained tensor was the start
            assert any(tensor.shape == value.shape and torch.equal(tensor, value) for tensor in before), key
    tuned = weights_of(out / 'checkpoint')
    assert not torch.equal(tuned['transformer.layers.0.0.to_qkv.weight'], start['transformer.layers.0.0.to_qkv.weight'])


def test_a_resumed_linear_probe_continues_exactly(pretrained, tmp_path, monkeypatch):
    whole, broken = tmp_path / 'whole', tmp_path / 'broken'
    args = ['--init', pretrained, '--linear-probe', '--label-fraction', 0.05, '--epochs', 2, '--quiet', '--no-plots',
            '--threads', 1]
    assert train_run(*args, '--out', whole) == 0
    real_save = train.save_checkpoint

    def save_then_die(*positional, **kwargs):
        real_save(*positional, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(train, 'save_checkpoint', save_then_die)
    assert train_run(*args, '--out', broken) == 130
    monkeypatch.setattr(train, 'save_checkpoint', real_save)
    assert train_run('--out', broken, '--resume') == 0
    for key, value in weights_of(whole / 'checkpoint').items():
        assert torch.equal(value, weights_of(broken / 'checkpoint')[key]), key


def test_init_from_a_network_for_other_images_is_refused_naming_the_size(pretrained, tmp_path, capsys):
    assert train_run('--init', pretrained, '--image-size', 8, '--epochs', 1, '--out', tmp_path / 'x', '--quiet',
                     '--no-plots') == 2
    assert '--image-size 16, this data gives 8' in capsys.readouterr().err
    assert train_run('--init', tmp_path / 'nothing', '--epochs', 1, '--out', tmp_path / 'y', '--quiet') == 2
    assert 'no checkpoint at' in capsys.readouterr().err


def test_lejepa_logs_its_two_terms_which_make_its_loss(tmp_path):
    out = tmp_path / 'run'
    assert run('--method', 'lejepa', '--lejepa-lambda', 0.25, '--epochs', 1, '--out', out, *FAST,
               '--image-size', 8) == 0
    [record] = log_of(out)
    assert record['prediction_loss'] >= 0 and record['sigreg'] > 0
    assert record['loss'] == pytest.approx(0.75 * record['prediction_loss'] + 0.25 * record['sigreg'], rel=1e-5)


@pytest.mark.parametrize('flag', [(), ('--lejepa-projector', 'batchnorm')], ids=['default', 'batchnorm'])
def test_lejepa_projector_batchnorm_trains_the_official_projector(tmp_path, flag):
    # MINIMAL.md's projector: 3 linear layers, BatchNorm and ReLU between them; the command's default (vit-pytorch's
    # projector collapses on the digits: docs/pretraining.md)
    out = tmp_path / 'run'
    assert run('--method', 'lejepa', *flag, '--projection-hidden-size', 32, '--epochs',
               1, '--out', out, *FAST, '--image-size', 8) == 0
    keys = weights_of(out / 'pretrainer')
    assert sorted(key for key in keys if key.startswith('projector.') and key.endswith('.weight')) == [
        'projector.net.0.weight', 'projector.net.1.weight', 'projector.net.3.weight', 'projector.net.4.weight',
        'projector.net.6.weight']
    assert keys['projector.net.1.running_var'].shape == (32,) and keys['projector.net.6.weight'].shape == (16, 32)


def test_lejepa_projector_vit_pytorch_trains_vit_pytorchs_projector(tmp_path):
    # vit-pytorch's projector (as LeJEPA's default): no BatchNorm, an L2 norm before its last linear layer
    from vit_pytorch import lejepa

    out = tmp_path / 'run'
    assert run('--method', 'lejepa', '--lejepa-projector', 'vit-pytorch', '--projection-hidden-size', 32,
               '--epochs', 1, '--out', out, *FAST, '--image-size', 8) == 0
    keys = weights_of(out / 'pretrainer')
    assert not any(key.endswith('running_var') for key in keys)
    width = keys['projector.net.0.weight'].shape[1]                             # the network's embedding
    expected = lejepa.PROJECTORS['vit-pytorch'](width, 16, 4, 32).state_dict()
    assert {key: value.shape for key, value in keys.items() if key.startswith('projector.')} == {
        f'projector.{key}': value.shape for key, value in expected.items()}


def test_lejepa_refuses_a_lambda_outside_zero_one(tmp_path, capsys):
    assert run('--method', 'lejepa', '--lejepa-lambda', 1.5, '--epochs', 1, '--out', tmp_path / 'run', *FAST) == 2
    assert '--lejepa-lambda must be in [0, 1]' in capsys.readouterr().err


# the clip methods: LeVJEPA and LeVJEPAND on a registered clip model


def test_the_clip_methods_are_levjepa_and_levjepa_nd():
    assert CLIP_METHODS == ['levjepa', 'levjepa_nd']


@pytest.mark.parametrize('method', CLIP_METHODS)
def test_each_clip_method_pre_trains_the_model_on_clips_and_its_network_reloads(method, tmp_path):
    out = tmp_path / method
    assert run('--method', method, '--epochs', 1, '--out', out, *TINY_CLIPS) == 0
    [record] = log_of(out)
    assert record['invariance_loss'] > 0 and record['sigreg'] > 0          # the two weighted terms make the loss
    assert record['loss'] == pytest.approx(record['invariance_loss'] + record['sigreg'], rel=1e-5)
    model, config = load_model(out / 'checkpoint')
    assert config['model'] == 'simple_vit_3d' and config['pretraining'] == dict(method=method)
    assert config['data']['source'] == 'clips:digit' and config['model_kwargs']['dim'] == 32
    assert model(torch.zeros(2, 1, 8, 16, 16)).shape == (2, 10)
    # the network is the model inside the learner, as trained: not its initialisation (seed 0)
    wrapper, network = weights_of(out / 'pretrainer'), weights_of(out / 'checkpoint')
    prefix = 'learner.encoder.model.'
    assert network.keys() == {key[len(prefix):] for key in wrapper if key.startswith(prefix)}
    for key, value in network.items():
        assert torch.equal(value, wrapper[prefix + key]), key
    torch.manual_seed(0)
    initial = build_model('simple_vit_3d', **config['model_kwargs']).state_dict()
    assert not all(torch.equal(initial[key], value) for key, value in network.items())


def test_a_clip_method_takes_the_moving_digits_and_vit_nd_when_no_data_or_model_is_given():
    args, _ = pretrain.parse_args(['--method', 'levjepa'])
    assert (args.data, args.model) == ('clips:digit', 'vit_nd')
    assert args.notes == ['--method levjepa on its default --data clips:digit',
                          '--method levjepa on its default --model vit_nd']
    args, _ = pretrain.parse_args(['--method', 'levjepa_nd', '--data', 'clips:direction', '--model', 'vit_3d'])
    assert (args.data, args.model, args.notes) == ('clips:direction', 'vit_3d', [])
    args, _ = pretrain.parse_args(['--method', 'mae'])
    assert (args.data, args.model, args.notes) == ('digits', 'vit', [])


def test_levjepa_nd_is_levjepa_with_local_views_of_the_clips_size():
    """The two recipes on the same draws: LeVJEPAND's source and target views are LeVJEPA's global and local
    views at the clips' side, so the losses agree (up to float rounding: one batch of views, or two)."""
    args, _ = pretrain.parse_args(['--method', 'levjepa', '--local-views', '3'])
    videos = torch.rand(6, 1, 8, 16, 16)
    losses = []
    for method in ('levjepa', 'levjepa_nd'):
        torch.manual_seed(0)
        encoder = build_model('simple_vit_3d', image_size=16, frames=8, image_patch_size=8, frame_patch_size=2,
                              num_classes=10, dim=32, depth=1, heads=2, dim_head=16, mlp_dim=64, channels=1)
        learner = pretraining.METHODS[method].build(args, encoder, image_size=(8, 16, 16), mean=[0.2], std=[0.3])
        torch.manual_seed(1)
        losses.append(learner(videos))
    assert losses[0].item() == pytest.approx(losses[1].item(), rel=1e-5)
    assert learner.last_losses[1] > 0


@pytest.mark.parametrize('argv, error', [
    (['--method', 'levjepa', '--data', 'digits'],
     '--method levjepa pre-trains on clips, but --data digits gives images: give --data clips:digit'),
    (['--method', 'levjepa_nd', '--data', 'ucr:GunPoint'],
     '--method levjepa_nd pre-trains on clips, but --data ucr:GunPoint gives signals'),
    (['--method', 'mae', '--data', 'clips:digit'],
     '--method mae pre-trains on images, but --data clips:digit gives clips: clips take --method levjepa, levjepa_nd'),
    (['--method', 'levjepa', '--model', 'vit'], '--model vit takes images, but --data clips:digit gives clips'),
    (['--method', 'levjepa', '--local-size', '16'],
     '--model vit_nd does not take clips of 8 frames of 16x16 (--local-size)'),
    (['--method', 'levjepa_nd', '--local-size', '16'],
     "--local-size must be the clips' side, 32, with --method levjepa_nd"),
    (['--method', 'levjepa', '--drop-ratio', '0.5'],
     '--drop-ratio 0.5 needs a model that drops tokens (--model levjepa, levjepa_nd); --model vit_nd keeps '
     'every token'),
    (['--method', 'levjepa_nd', '--model', 'simple_vit_3d', '--drop-ratio', '0'],
     '--drop-ratio 0.0 needs a model that drops tokens (--model levjepa, levjepa_nd); --model simple_vit_3d keeps '
     'every token'),
    (['--method', 'levjepa', '--model', 'levjepa', '--drop-ratio', '1'],
     '--drop-ratio must be a share of the patch tokens in [0, 1), got 1.0'),
    (['--method', 'levjepa_nd', '--model', 'levjepa', '--drop-ratio', '-0.5'],
     '--drop-ratio must be a share of the patch tokens in [0, 1), got -0.5'),
])
def test_a_clip_method_refuses_what_it_cannot_pre_train_naming_the_flags(argv, error, tmp_path, capsys):
    assert run(*argv, '--epochs', 1, '--out', tmp_path / 'run', '--quiet', '--no-plots', '--threads', 1) == 2
    assert error in capsys.readouterr().err
    assert not (tmp_path / 'run' / 'log.jsonl').exists()


@pytest.mark.slow
def test_levjepa_on_its_defaults_pre_trains_vit_nd_and_the_trainer_probes_it(tmp_path):
    out = tmp_path / 'levjepa'
    assert run('--method', 'levjepa', '--epochs', 1, '--out', out, *FAST) == 0
    model, config = load_model(out / 'checkpoint')
    assert config['model'] == 'vit_nd' and config['data']['source'] == 'clips:digit'
    assert model(torch.zeros(2, 1, 8, 32, 32)).shape == (2, 10)
    assert train.main(['--init', str(out / 'checkpoint'), '--data', 'clips:direction', '--linear-probe',
                       '--epochs', '1', '--out', str(tmp_path / 'probe'), '--quiet', '--no-plots',
                       '--threads', '1']) == 0


def token_counts(monkeypatch):
    """[(training, tokens)] the transformer of every model the command builds sees at each call, filled as it runs."""
    seen, build = [], registry.build_model

    def build_and_watch(name, **kwargs):
        model = build(name, **kwargs)
        model.get_submodule(model.intermediates_from).register_forward_pre_hook(
            lambda module, args: seen.append((module.training, args[0].shape[1])))
        return model

    monkeypatch.setattr(registry, 'build_model', build_and_watch)
    return seen


# (method, model, its options, patch tokens of TINY_CLIPS' 16-pixel clips, kept at --drop-ratio 0.75)
DROPPING_RUNS = {
    # 8 frames of 2 x 2 patches of 8 pixels: 32 patch tokens, a quarter of them kept
    'levjepa': ('levjepa', 'levjepa', [], 32, 8),
    'levjepa_nd': ('levjepa_nd', 'levjepa', [], 32, 8),
    # tubelets of 2 x 8 x 8 on clips of 8 x 16 x 16: 4 x 2 x 2 = 16 patch tokens, 4 kept
    'levjepa[model=levjepa_nd]': ('levjepa', 'levjepa_nd', ['--input-shape', '(8, 16, 16)'], 16, 4),
}


@pytest.mark.parametrize('run_id', [pytest.param(run_id, marks=[] if run_id == 'levjepa' else pytest.mark.slow)
                                    for run_id in DROPPING_RUNS])                       # 2-3 s each
def test_the_command_drops_tokens_in_its_training_steps_and_not_in_evaluation(run_id, tmp_path, monkeypatch):
    """--drop-ratio 0.75 keeps a quarter of the patch tokens after the cls token in every training step (every view:
    LeVJEPA's local views are the clips' size here), and the pre-trained network and LeVJEPA's embedding see them
    all."""
    method, name, options, patches, kept = DROPPING_RUNS[run_id]
    seen = token_counts(monkeypatch)
    out = tmp_path / method
    assert run('--method', method, '--epochs', 1, '--out', out, *TINY_CLIPS, '--model', name, *options,
               '--drop-ratio', 0.75) == 0
    # in eval mode only the command's check that the model takes the clips, with every token
    assert set(seen) == {(True, 1 + kept), (False, 1 + patches)}
    monkeypatch.undo()
    model, config = load_model(out / 'checkpoint')
    assert config['model'] == name
    videos = torch.rand(2, 1, 8, 16, 16)
    args, _ = pretrain.parse_args(['--method', method, '--model', name, '--drop-ratio', '0.75'])
    learner = pretraining.METHODS[method].build(args, model, image_size=(8, 16, 16), mean=[0.2], std=[0.3])
    model.get_submodule(model.intermediates_from).register_forward_pre_hook(
        lambda module, args: seen.append((module.training, args[0].shape[1])))
    seen.clear()
    with torch.no_grad():
        model.eval().forward_features(videos, drop_ratio=0.75)
        learner.learner(videos, return_embedding=True)
        learner.eval()(videos)                          # the loss in eval mode: the views keep every token
    assert set(seen) == {(False, 1 + patches)} and len(seen) == (3 if method == 'levjepa_nd' else 4)


def test_a_model_that_drops_tokens_drops_half_by_default(monkeypatch, tmp_path):
    """Without --drop-ratio, LeVJEPA's encoder keeps 16 of its 32 patch tokens in training (the command's default,
    0.5, docs/pretraining.md); another model keeps every token."""
    seen = token_counts(monkeypatch)
    assert run('--method', 'levjepa', '--epochs', 1, '--out', tmp_path / 'a', *TINY_CLIPS, '--model', 'levjepa') == 0
    assert set(seen) == {(True, 1 + 16), (False, 1 + 32)}
    learner = pretraining.METHODS['levjepa'].build(
        pretrain.parse_args(['--method', 'levjepa', '--model', 'vit_3d'])[0], build_model(
            'vit_3d', image_size=16, frames=8, image_patch_size=8, frame_patch_size=2, num_classes=10, dim=32, depth=1,
            heads=2, dim_head=16, mlp_dim=64, channels=1), image_size=(8, 16, 16), mean=[0.2], std=[0.3])
    assert learner.learner.drop_ratio is None and learner.learner.encoder.drop_keyword is None
