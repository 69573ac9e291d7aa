"""The training command on the three kinds of input beyond fixed-size images.

Signals (`--data ucr:NAME`, read through a stand-in for aeon so that it runs without the
'timeseries' extra), moving-digits clips (`--data clips:TASK`), and NaViT on images resized to
random sizes (`--random-size MIN MAX`); every registered model that takes signals or clips
builds from the trainer's defaults and takes a step on its own kind of input.
"""

import json
import re
import sys

import pytest
import torch

from helpers import install_fake_aeon
from vit_pytorch import evaluate, train
from vit_pytorch.models import INPUTS, MODELS, build_model


@pytest.fixture
def fake_aeon(monkeypatch):
    """aeon.datasets.load_classification replaced by two tiny 'GunPoint' splits (helpers.install_fake_aeon)."""
    return install_fake_aeon(monkeypatch)


# signals


def test_a_ucr_set_loads_resampled_to_its_default_length_a_multiple_of_8(fake_aeon):
    source = evaluate.data_source('ucr:GunPoint')
    assert (source.name, source.test_split, source.image_size, source.channels) == ('ucr:GunPoint', 'test', 152, 1)
    data = source.load('train', image_size=source.image_size, channels=1)
    assert data.images.shape == (16, 1, 152) and data.classes == ['1', '2']
    raw = torch.tensor(fake_aeon['train'][0], dtype=torch.float32)
    # linear resampling keeps both ends and follows the series in between (the middle of 150 samples)
    torch.testing.assert_close(data.images[..., [0, -1]], raw[..., [0, -1]])
    torch.testing.assert_close(data.images[..., 151 // 2:151 // 2 + 2].mean(-1), raw[..., 74:76].mean(-1),
                               atol=0.05, rtol=0)
    assert source.load('test', image_size=150, channels=1).images.shape == (10, 1, 150)


def test_default_lengths_are_multiples_of_8_at_least_48():
    from vit_pytorch.ucr import DATASETS, default_length

    for name, (_, _, _, length, _) in DATASETS.items():
        chosen = default_length(name)
        assert chosen % 8 == 0 and chosen >= max(length, 48) and chosen - max(length, 48) < 8, name


@pytest.mark.parametrize('data, kwargs, match', [
    ('ucr:Coffee', {}, r"ucr:NAME takes one of the sets aeon ships \(GunPoint"),
    ('ucr:GunPoint', dict(channels=3), r"GunPoint has 1 channel\(s\): --channels must be 1, got 3"),
    ('ucr:GunPoint', dict(image_size=1), r"--image-size is the number of samples .* got 1"),
    ('clips:colour', {}, r"clips:TASK takes a task of \('digit', 'direction'\)"),
    ('clips:digit', dict(image_size=8), r"--image-size is the side of a clip's frames: an int >= 16"),
    ('clips:digit', dict(channels=3), r"grayscale: --channels must be 1, got 3"),
])
def test_bad_source_arguments_are_refused_naming_the_option(fake_aeon, data, kwargs, match):
    with pytest.raises(ValueError, match=match):
        source = evaluate.data_source(data)
        source.load('test', **dict(dict(image_size=source.image_size, channels=source.channels), **kwargs))


def test_signals_are_shifted_in_time_each_by_its_own_offset_filling_with_zeros():
    args = train.parse_args(['--translate', '3'])[0]
    signals = torch.arange(1., 11.).repeat(4, 2, 1)                  # (4, 2, 10): 1 .. 10 in both channels
    moved, _ = train.augment(signals, torch.zeros(4, dtype=torch.long), args, torch.Generator().manual_seed(0),
                             None, 2)
    assert moved.shape == signals.shape and torch.equal(moved[:, 0], moved[:, 1])   # channels move alike
    for row in moved[:, 0]:
        shift = int(row[row > 0][0]) - 1 - int(torch.nonzero(row)[0])    # first value shown, where it lands
        expected = torch.zeros(10)
        if shift >= 0:                                                   # moved left by `shift`
            expected[:10 - shift] = torch.arange(1. + shift, 11.)
        else:
            expected[-shift:] = torch.arange(1., 11. + shift)
        assert abs(shift) <= 3 and torch.equal(row, expected)
    assert any(not torch.equal(row, signals[0, 0]) for row in moved[:, 0])


def test_a_ucr_set_trains_with_vit_1d_evaluate_reproduces_it_and_names_the_extra_without_aeon(fake_aeon, tmp_path,
                                                                                            capsys, monkeypatch):
    out = tmp_path / 'run'
    assert train.main(['--data', 'ucr:GunPoint', '--model', 'vit_1d', '--epochs', '8', '--batch-size', '8',
                       '--lr', '3e-3', '--warmup-epochs', '1', '--depth', '1', '--out', str(out), '--quiet',
                       '--no-plots']) == 0
    log = [json.loads(line) for line in (out / 'log.jsonl').read_text().splitlines()]
    assert log[-1]['test_accuracy'] == 1.0                           # rising against falling
    config = json.loads((out / 'checkpoint' / 'config.json').read_text())
    assert config['model_kwargs']['seq_len'] == 152 and config['data']['source'] == 'ucr:GunPoint'
    capsys.readouterr()
    assert evaluate.main([str(out / 'checkpoint'), '--json']) == 0
    assert json.loads(capsys.readouterr().out)['accuracy'] == pytest.approx(log[-1]['test_accuracy'])
    monkeypatch.setitem(sys.modules, 'aeon', None)                   # import aeon raises ImportError
    assert evaluate.main([str(out / 'checkpoint')]) == 2
    assert "aeon, not installed here; install the 'timeseries' extra" in capsys.readouterr().err


def test_without_aeon_the_trainer_names_the_timeseries_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, 'aeon', None)                   # import aeon raises ImportError
    assert train.main(['--data', 'ucr:GunPoint', '--model', 'vit_1d', '--out', str(tmp_path / 'run')]) == 2
    error = capsys.readouterr().err
    assert 'aeon' in error and "'timeseries' extra" in error


# clips


def test_clips_source_gives_one_clip_per_digit_of_each_split():
    source = evaluate.data_source('clips:direction')
    assert (source.name, source.image_size, source.channels) == ('clips:direction', 32, 1)
    test = source.load('test', image_size=16, channels=1)
    assert test.images.shape == (450, 1, 8, 16, 16) and test.images.dtype == torch.uint8
    assert len(test.classes) == 8 and set(test.labels.tolist()) == set(range(8))
    # each frame shows the whole 8-pixel digit (the scan's own resolution at 16 pixels)
    assert torch.equal((test.images[:, 0] > 0).flatten(2).sum(-1) > 0, torch.ones(450, 8, dtype=torch.bool))


# every model that takes signals or clips, from the trainer's defaults


def example_input(name, kwargs):
    if INPUTS[name].startswith('signals'):
        return torch.randn(4, kwargs['channels'], kwargs['seq_len'])
    channels = kwargs.get('channels', kwargs.get('n_input_channels'))
    if 'input_shape' in kwargs:             # an N-D model (vit_nd): its own input shape, no image size
        return torch.rand(4, channels, *kwargs['input_shape'])
    frames = next(kwargs[key] for key in ('frames', 'num_frames', 'max_frames') if key in kwargs)
    side = kwargs.get('image_size', kwargs.get('img_size'))
    return torch.rand(4, channels, frames, side, side)


@pytest.mark.parametrize('name', sorted(INPUTS))
def test_every_signal_and_clip_model_builds_from_the_trainer_defaults_and_takes_a_step(name):
    assert name in MODELS
    size = 152 if INPUTS[name].startswith('signals') else 16
    kwargs = train.model_config(name, {}, image_size=size, channels=2, num_classes=5)
    model = build_model(name, **kwargs)
    inputs = example_input(name, kwargs)
    optimizer = torch.optim.AdamW(train.parameter_groups(model, 0.05), lr=1e-3)
    logits = model(inputs)
    assert logits.shape == (4, 5)
    torch.nn.functional.cross_entropy(logits, torch.arange(4)).backward()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


# NaViT at mixed sizes


def test_random_sizes_are_multiples_of_the_patch_within_the_range_and_vary():
    images = torch.rand(64, 1, 16, 16)
    resized = train.random_sizes(images, (8, 24), multiple=(4, 8), generator=torch.Generator().manual_seed(0))
    sizes = {tuple(image.shape[1:]) for image in resized}
    assert len(resized) == 64 and all(image.shape[0] == 1 for image in resized)
    assert {h for h, _ in sizes} == {8, 12, 16, 20, 24} and {w for _, w in sizes} == {8, 16, 24}
    assert any(h != w for h, w in sizes)                                  # mixed aspect ratios


def test_random_sizes_of_the_images_own_size_leave_them_unchanged():
    images = torch.rand(3, 1, 16, 16)
    resized = train.random_sizes(images, (16, 16), multiple=(4, 4), generator=torch.Generator().manual_seed(0))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(resized, images))


def test_navit_trains_on_images_of_random_sizes_and_evaluates_at_other_sizes(tmp_path, capsys, monkeypatch):
    seen = []
    from vit_pytorch.na_vit import NaViT
    forward = NaViT.forward
    monkeypatch.setattr(NaViT, 'forward', lambda self, images, *a, **k: seen.append(
        [tuple(image.shape[-2:]) for image in images] if isinstance(images, list) else tuple(images.shape))
        or forward(self, images, *a, **k))
    out = tmp_path / 'run'
    assert train.main(['--model', 'na_vit', '--image-size', '16', '--random-size', '8', '16', '--epochs', '1',
                       '--batch-size', '512', '--depth', '1', '--out', str(out), '--quiet', '--no-plots']) == 0
    training = [sizes for sizes in seen if isinstance(sizes, list)]
    assert len(training) == 3 and sum(map(len, training)) == 1347
    assert {size for sizes in training for size in sizes} == {(h, w) for h in (8, 12, 16) for w in (8, 12, 16)}
    assert all(shape[-2:] == (16, 16) for shape in seen if not isinstance(shape, list))   # tested at 16
    capsys.readouterr()
    for size in (8, 12):
        assert evaluate.main([str(out / 'checkpoint'), '--image-size', str(size), '--json']) == 0
        result = json.loads(capsys.readouterr().out)
        assert result['count'] == 450 and result['image_size'] == size
    assert seen[-1][-2:] == (12, 12)


@pytest.mark.parametrize('argv, match', [
    (['--random-size', '12', '8'], r"--random-size MIN MAX needs 1 <= MIN <= MAX, got 12 8"),
    (['--random-size', '9', '11'], r"--random-size 9 11 holds no multiple of the model's patch size \(4, 4\)"),
])
def test_random_sizes_that_cannot_be_made_are_refused(argv, match, tmp_path, capsys):
    assert train.main(['--model', 'na_vit', '--epochs', '1', '--out', str(tmp_path / 'run'), '--quiet',
                       '--no-plots', *argv]) == 2
    assert re.search(match, capsys.readouterr().err)


@pytest.mark.parametrize('name', sorted(INPUTS))
def test_every_signal_and_clip_model_is_recorded_without_side_effects(name):
    from vit_pytorch.recorder import Recorder, attention_modules

    size = 152 if INPUTS[name].startswith('signals') else 16
    kwargs = train.model_config(name, {}, image_size=size, channels=1, num_classes=5)
    model = build_model(name, **kwargs).eval()
    inputs = example_input(name, kwargs)[:2]
    fused = [module.fused for _, module in attention_modules(model)]
    with torch.no_grad():
        expected = model(inputs)
        recorder = Recorder(model)
        output, _ = recorder(inputs)
    # one map per attention call: (2 inputs x the slices a factorised model attends over, heads, n, n)
    assert recorder.maps and all(attn.ndim == 4 and attn.shape[0] % 2 == 0 for attn in recorder.maps)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)
    for module_name, module in model.named_modules():
        assert not module._forward_hooks and not module._forward_pre_hooks, module_name
    assert [module.fused for _, module in attention_modules(model)] == fused
