"""Data sources plug into the training and evaluation commands by name (`--data NAME:ARG`).

A registered source may hold inputs other than images; here signals (n, channels, length) of two
kinds, read by a tiny 1D model, go through `python -m vit_pytorch.train` and `evaluate` unchanged.
"""

import json
import math

import pytest
import torch
from torch import nn

from vit_pytorch import evaluate, models, train
from vit_pytorch.evaluate import DataSource, ImageSet


def waves(argument):
    """Sines (class 0) and square waves (class 1) of random phase and frequency, `argument` channels."""
    channels = int(argument)

    def load(split, *, image_size, channels=channels, classes=None):
        generator = torch.Generator().manual_seed(0 if split == 'train' else 1)
        count, length = 64, (image_size[0] if isinstance(image_size, (list, tuple)) else image_size) or 32
        labels = torch.arange(count) % 2
        phase = torch.rand(count, channels, 1, generator=generator) * 2 * math.pi
        frequency = 1 + torch.rand(count, channels, 1, generator=generator) * 3
        sine = torch.sin(frequency * torch.linspace(0, 2 * math.pi, length) + phase)
        signals = torch.where(labels[:, None, None] == 1, torch.sign(sine), sine)
        return ImageSet(signals, labels, ['sine', 'square'])

    return DataSource(f'waves:{channels}', load, test_split='test', image_size=None, channels=channels, tiny=True)


class Conv1d(nn.Module):
    def __init__(self, *, image_size, channels, num_classes, dim=16):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(channels, dim, 3, padding=1), nn.GELU(), nn.Conv1d(dim, dim, 3, padding=1),
                                 nn.GELU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(dim, num_classes))

    def forward(self, signals):
        return self.net(signals)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(evaluate.SOURCES, 'waves', 'test_train_sources:waves')
    monkeypatch.setitem(models.MODELS, 'conv1d', 'test_train_sources:Conv1d')
    monkeypatch.setitem(models.SMALL_CONFIGS, 'conv1d', {})


def test_a_registered_source_of_signals_trains_and_evaluates(registered, tmp_path, capsys):
    out = tmp_path / 'run'
    assert train.main(['--data', 'waves:2', '--model', 'conv1d', '--epochs', '15', '--warmup-epochs', '1', '--lr', '1e-2', '--out', str(out),
                       '--quiet', '--batch-size', '16']) == 0
    log = [json.loads(line) for line in (out / 'log.jsonl').read_text().splitlines()]
    assert log[-1]['test_accuracy'] > 0.9                             # sines and square waves are easy apart
    config = json.loads((out / 'checkpoint' / 'config.json').read_text())
    assert config['data']['source'] == 'waves:2' and config['data']['image_size'] == [32]
    assert len(config['data']['mean']) == 2                           # per channel of the signals
    capsys.readouterr()
    assert evaluate.main([str(out / 'checkpoint'), '--json']) == 0
    result = json.loads(capsys.readouterr().out)
    assert result['accuracy'] == pytest.approx(log[-1]['test_accuracy'])
    assert result['split'] == 'test' and result['data'] == 'waves:2'


def test_a_source_name_without_its_argument_is_refused(registered):
    with pytest.raises(ValueError, match=r"waves:NAME"):
        evaluate.data_source('waves:')


def test_normalise_works_per_channel_for_any_number_of_trailing_dimensions():
    inputs = torch.randn(2, 3, 4, 5, 6)
    out = evaluate.normalise(inputs, [1.0, 2.0, 3.0], [2.0, 4.0, 8.0])
    torch.testing.assert_close(out[:, 1], (inputs[:, 1] - 2.0) / 4.0)


def test_clips_are_shifted_frame_by_frame_alike():
    args = train.parse_args(['--translate', '2'])[0]
    clip = torch.zeros(1, 1, 3, 8, 8)
    clip[..., 4, 4] = 1.0                                             # one bright pixel, in every frame
    moved, _ = train.augment(clip, torch.zeros(1, dtype=torch.long), args, torch.Generator().manual_seed(0), None, 2)
    positions = [tuple(torch.nonzero(frame)[0].tolist()) for frame in moved[0, 0]]   # each frame (h, w)
    assert len(set(positions)) == 1 and positions[0] != (4, 4)      # moved, and the same way in every frame
