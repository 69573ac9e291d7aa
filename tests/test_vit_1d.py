"""1D ViT and 1D SimpleViT: patches along a signal, the reference's outputs, learning a real signal.

Reference: vit-pytorch 1.26.14's `vit_1d.ViT` and `simple_vit_1d.SimpleViT`
(tests/fixtures/make_video_signal_fixtures.py), through `load_vit_pytorch`.
"""

import math

import pytest
import torch
from helpers import digits_batch, fit_fixed_batch, load_fixture

from vit_pytorch.pretrained import load_vit_pytorch
from vit_pytorch.recorder import Recorder
from vit_pytorch.simple_vit_1d import SimpleViT, posemb_sincos_1d
from vit_pytorch.vit_1d import ViT

TINY = dict(seq_len=24, patch_size=4, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, channels=2)
TOL = dict(atol=1e-5, rtol=1e-5)


def series(batch=3, length=24, channels=2):
    return torch.randn(batch, channels, length)


# the tokens (the logits' and pre-logits' shapes: test_conformance's rows vit_1d and simple_vit_1d)


@pytest.mark.parametrize('cls, tokens', [(ViT, 7), (SimpleViT, 6)])
def test_the_features_are_a_cls_token_and_the_patches_or_the_patches_alone(cls, tokens):
    assert cls(**TINY).forward_features(series()).shape == (3, tokens, 16)


def test_vit_without_classes_returns_its_tokens():
    assert ViT(**dict(TINY, num_classes=0))(series()).shape == (3, 1 + 6, 16)


# what the model is


def test_a_patch_is_consecutive_samples_of_every_channel():
    model = ViT(**TINY).eval()
    x = series(1)
    changed = x.clone()
    changed[0, 1, 8:12] += 1.0                         # samples 8..11 of channel 1: patch 2 alone
    with torch.no_grad():
        before, after = model.to_patch_embedding(x), model.to_patch_embedding(changed)
    moved = (before - after).abs().amax(dim=-1)[0] > 1e-6
    assert moved.tolist() == [False, False, True, False, False, False]


def test_simple_vit_position_table_is_the_1d_sincos_formula():
    length, dim = 5, 8
    table = posemb_sincos_1d(length, dim)
    omega = [10000 ** -(i / 3) for i in range(4)]
    expected = torch.tensor([[math.sin(n * w) for w in omega] + [math.cos(n * w) for w in omega]
                             for n in range(length)])
    torch.testing.assert_close(table, expected, atol=1e-6, rtol=0)


def test_simple_vit_takes_other_lengths_divisible_by_the_patch():
    model = SimpleViT(**TINY).eval()
    with torch.no_grad():
        assert model(series(length=40)).shape == (3, 5)
    with pytest.raises(ValueError, match=r'series length 26 must be a positive multiple of patch_size 4'):
        model(series(length=26))


def test_recorded_attention_covers_the_cls_token_and_every_patch():
    model = ViT(**TINY).eval()
    _, attns = Recorder(model)(series())
    assert attns.shape == (3, 2, 2, 7, 7)        # distributions over the keys: test_recorder, every conformance row


# vit-pytorch's checkpoints


@pytest.mark.parametrize('case, cls', [('vit_1d', ViT), ('simple_vit_1d', SimpleViT)])
def test_vit_pytorch_checkpoint_loads_and_reproduces_its_outputs(case, cls):
    metadata, state_dict, tensors = load_fixture(f'vit_pytorch_1.26.14_{case}')
    model = load_vit_pytorch(cls(**metadata['config']).eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], **TOL)


# learning: a real signal


def test_tiny_model_overfits_32_digits_read_as_signals():
    # the scikit-learn digits read row by row: an 8-row "signal" of 8 samples per row (channels = columns)
    images, labels = digits_batch(32)
    signals = images[:, 0].transpose(1, 2)                       # (32, 8 columns, 8 rows)
    model = ViT(seq_len=8, patch_size=2, num_classes=10, dim=32, depth=1, heads=2, dim_head=16, mlp_dim=64,
                channels=8)
    accuracy, steps = fit_fixed_batch(model, signals, labels)
    assert accuracy == 1.0, f'training accuracy {accuracy} after {steps} steps'


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(seq_len=25), ValueError, r'seq_len \(25\) must be divisible by patch_size \(4\).*28'),
    (dict(channels=2.0), TypeError, 'channels'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        ViT(**{**TINY, **overrides})


def test_simple_vit_dim_too_small_for_its_table_is_refused():
    with pytest.raises(ValueError, match=r'dim must be even and at least 4'):
        SimpleViT(**dict(TINY, dim=6 - 3))


@pytest.mark.parametrize('bad, error, match', [
    (torch.randn(2, 24), ValueError, r'series must have shape \(b, channels, length\).*unsqueeze'),
    (torch.randn(2, 3, 24), ValueError, r'series must have 2 channels'),
    (torch.randn(2, 2, 20), ValueError, r'series must have length 24'),
    (torch.randn(2, 2, 24).double(), TypeError, r'series has dtype torch.float64'),
    (torch.randn(2, 2, 24).numpy(), TypeError, r'series must be a torch.Tensor.*from_numpy'),
])
def test_bad_signals_are_refused_naming_series(bad, error, match):
    with pytest.raises(error, match=match):
        ViT(**TINY)(bad)
