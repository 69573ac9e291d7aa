"""The pre-training methods' registry (vit_pytorch.training.pretraining): a method added as one METHODS entry,
with its own wrapper and options, runs through `python -m vit_pytorch.pretrain` like the built-in ones."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from vit_pytorch import pretrain
from vit_pytorch.checkpoint import load_model
from vit_pytorch.training import pretraining

TINY = ['--threads', '1', '--dim', '32', '--depth', '2', '--heads', '2', '--dim-head', '16', '--mlp-dim', '64']
FAST = ['--quiet', '--no-plots', '--batch-size', '256', '--warmup-epochs', '1', '--image-size', '8'] + TINY


class FeatureEnergy(nn.Module):
    """A stand-in wrapper: the weighted mean square of the encoder's outputs."""

    def __init__(self, encoder, weight):
        super().__init__()
        self.encoder, self.weight = encoder, weight

    def forward(self, images):
        self.last_batch = len(images)
        return self.weight * self.encoder(images).pow(2).mean()


class FeatureEnergyMethod(pretraining.Method):
    group = 'feature energy'
    options = (('--energy-weight', dict(type=float, default=1.0, help='the weight of the loss')),)

    def __init__(self):
        self.steps = []

    def build(self, args, encoder, *, image_size, mean, std):
        return FeatureEnergy(encoder, args.energy_weight)

    def after_step(self, learner, args, global_step, steps, total_steps):
        self.steps.append(global_step)

    def sums(self, learner, count):
        return [learner.last_batch]                       # summed over the steps, divided by the images

    def record(self, args, sums, global_step, steps, total_steps):
        return dict(images_per_image=sums[0], last_step=global_step)


@pytest.fixture
def energy(monkeypatch):
    method = FeatureEnergyMethod()
    monkeypatch.setitem(pretraining.METHODS, 'energy', method)
    return method


def test_a_method_added_to_the_registry_offers_its_options_in_the_help(energy, capsys):
    with pytest.raises(SystemExit):
        pretrain.main(['--help'])
    shown = capsys.readouterr().out
    methods = ','.join(pretraining.METHODS)             # the registered ones, then 'energy'
    assert methods.endswith(',energy') and f'--method {{{methods}}}' in shown
    assert 'feature energy:\n  --energy-weight ENERGY_WEIGHT' in shown


def test_a_method_added_to_the_registry_pre_trains_and_saves_its_network(energy, tmp_path):
    out = tmp_path / 'run'
    assert pretrain.main(['--method', 'energy', '--energy-weight', '0.5', '--epochs', '2', '--out', str(out),
                          *FAST]) == 0
    log = [json.loads(line) for line in (out / 'log.jsonl').read_text().splitlines()]
    steps = 6                                             # 1,347 training digits in batches of 256: 5 and the rest
    assert energy.steps == list(range(2 * steps))         # its hook ran after every optimizer step
    assert [record['last_step'] for record in log] == [steps - 1, 2 * steps - 1]
    assert [record['images_per_image'] for record in log] == [1.0, 1.0]
    model, config = load_model(out / 'checkpoint')
    assert config['pretraining'] == dict(method='energy') and config['model'] == 'vit'
    from safetensors.torch import load_file
    wrapper = load_file(Path(out) / 'pretrainer' / 'model.safetensors')
    for key, value in model.state_dict().items():        # checkpoint/ is the wrapper's encoder
        assert torch.equal(value, wrapper['encoder.' + key]), key
