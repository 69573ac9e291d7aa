"""ViViT's factorised encoder and factorised self-attention (arXiv 2103.15691, Models 2 and 3).

Reference: vit-pytorch 1.26.14's `vivit.ViViT` (tests/fixtures/make_video_signal_fixtures.py), with
and without a frame mask, through `load_vit_pytorch`. What each variant attends to is checked on
the recorded maps and by perturbing one frame.
"""

import math

import pytest
import torch
from helpers import as_tuples, fit_fixed_batch, load_fixture

from vit_pytorch.clips import moving_digits
from vit_pytorch.pretrained import load_vit_pytorch
from vit_pytorch.recorder import Recorder
from vit_pytorch.vivit import ViViT

VIDEO = dict(image_size=(16, 24), image_patch_size=(4, 8), frames=4, frame_patch_size=2)
TINY = dict(VIDEO, num_classes=5, dim=16, spatial_depth=2, temporal_depth=2, heads=2, dim_head=8, mlp_dim=32)
VARIANTS = ['factorized_encoder', 'factorized_self_attention']
TOL = dict(atol=1e-5, rtol=1e-5)


def tiny(**overrides):
    return ViViT(**{**TINY, **overrides})


def video(batch=2):
    return torch.randn(batch, 3, 4, 16, 24)


# shapes (the logits': test_conformance's four vivit rows, each variant with each pooling)


@pytest.mark.parametrize('variant', VARIANTS)
@pytest.mark.parametrize('pool', ['cls', 'mean'])
def test_a_headless_model_returns_the_videos_embedding(variant, pool):
    assert tiny(variant=variant, pool=pool, num_classes=0)(video(3)).shape == (3, 16)


def test_the_vit_pytorch_readme_example_runs():
    # vit-pytorch's README imports `ViT` from vit_pytorch.vivit, which it does not have; the class is ViViT
    model = ViViT(image_size=128, frames=16, image_patch_size=16, frame_patch_size=2, num_classes=1000, dim=64,
                  spatial_depth=1, temporal_depth=1, heads=2, mlp_dim=128)
    assert model(torch.randn(1, 3, 16, 128, 128)).shape == (1, 1000)


# what each variant attends to


def test_factorized_encoder_attends_within_a_slice_then_across_slices():
    model = tiny(variant='factorized_encoder').eval()
    with Recorder(model) as recorder:
        model(video(2))
    shapes = [tuple(attn.shape) for attn in recorder.maps]
    # spatial: 2 videos x 2 temporal slices, cls + 4 x 3 patches; temporal: cls + 2 slice tokens
    assert shapes == [(4, 2, 13, 13)] * 2 + [(2, 2, 3, 3)] * 2


def test_factorized_self_attention_alternates_space_and_time_in_every_layer():
    model = tiny(variant='factorized_self_attention').eval()
    with Recorder(model) as recorder:
        model(video(2))
    shapes = [tuple(attn.shape) for attn in recorder.maps]
    # spatial over the 13 tokens of one slice; temporal over the 2 slices at each of the 13 positions
    assert shapes == [(4, 2, 13, 13), (2 * 13, 2, 2, 2)] * 2


@pytest.mark.parametrize('variant', VARIANTS)
def test_a_change_in_the_last_frames_reaches_the_output_only_through_time(variant):
    model = tiny(variant=variant, num_classes=0).eval()
    x = video(1)
    changed = x.clone()
    changed[:, :, 2:] = torch.randn_like(changed[:, :, 2:])     # the second temporal slice only
    with torch.no_grad():
        spatial_only = model.embed(x)
        assert torch.equal(model.embed(changed)[:, 0], spatial_only[:, 0])   # the first slice's tokens: untouched
        assert not torch.allclose(model(changed), model(x))                   # but the video's embedding moves


def test_temporal_order_matters_to_the_encoder():
    model = tiny(variant='factorized_encoder', num_classes=0).eval()
    x = video(1)
    reversed_slices = torch.cat((x[:, :, 2:], x[:, :, :2]), dim=2)
    with torch.no_grad():
        assert not torch.allclose(model(x), model(reversed_slices), atol=1e-4)


@pytest.mark.parametrize('variant', VARIANTS)
def test_fused_and_explicit_attention_agree_with_a_mask(variant):
    model = tiny(variant=variant).eval()
    x, mask = video(2), torch.tensor([[True, True, False, False], [True] * 4])
    with torch.no_grad():
        fused = model(x, mask=mask)
        explicit = tiny(variant=variant, use_flash_attn=False).eval()
        explicit.load_state_dict(model.state_dict())
        torch.testing.assert_close(explicit(x, mask=mask), fused, **TOL)


@pytest.mark.parametrize('variant', VARIANTS)
@pytest.mark.parametrize('pool', ['cls', 'mean'])
def test_masked_frames_do_not_change_the_output(variant, pool):
    model = tiny(variant=variant, pool=pool).eval()
    x, mask = video(1), torch.tensor([[True, True, False, False]])
    changed = x.clone()
    changed[:, :, 2:] = torch.randn_like(changed[:, :, 2:])
    with torch.no_grad():
        torch.testing.assert_close(model(changed, mask=mask), model(x, mask=mask), **TOL)
        assert not torch.allclose(model(changed), model(x), **TOL)


@pytest.mark.parametrize('variant', VARIANTS)
@pytest.mark.parametrize('pool', ['cls', 'mean'])
@pytest.mark.parametrize('value', [math.nan, -math.inf, 3e38], ids=['nan', '-inf', '3e38'])
def test_masked_frames_holding_non_finite_or_huge_values_do_not_reach_the_output(variant, pool, value):
    model = tiny(variant=variant, pool=pool).eval()
    x, mask = video(2), torch.tensor([[True, True, False, False], [False, False, True, True]])
    broken, zeros = x.clone(), x.clone()
    broken[0, :, 2:], broken[1, :, :2] = value, value
    zeros[0, :, 2:], zeros[1, :, :2] = 0., 0.
    with torch.no_grad():
        logits = model(broken, mask=mask)
        assert torch.isfinite(logits).all()
        torch.testing.assert_close(logits, model(zeros, mask=mask), **TOL)


# vit-pytorch's checkpoints


@pytest.mark.parametrize('case', ['vivit_encoder_cls', 'vivit_encoder_mean', 'vivit_attention_cls',
                                  'vivit_attention_mean'])
def test_vit_pytorch_checkpoint_loads_and_reproduces_its_outputs(case):
    metadata, state_dict, tensors = load_fixture(f'vit_pytorch_1.26.14_{case}')
    model = load_vit_pytorch(ViViT(**as_tuples(metadata['config'], 'image_size', 'image_patch_size')).eval(),
                             state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], **TOL)
        masked = model(tensors['input'], mask=tensors['mask'])
    if metadata['config']['pool'] == 'cls' and metadata['config']['variant'] == 'factorized_self_attention':
        # both read the cls token of the first slice, masked in video 3: vit-pytorch's output there depends on the
        # masked frames, ours sees zeros in them (vit-pytorch on the input with those frames zeroed gives ours)
        torch.testing.assert_close(masked[:2], tensors['output_masked'][:2], **TOL)
        assert not torch.allclose(masked[2], tensors['output_masked'][2], **TOL)
    elif metadata['config']['pool'] == 'cls':
        torch.testing.assert_close(masked, tensors['output_masked'], **TOL)
    else:
        # vit-pytorch averages over the masked slices too; here only kept slices count (videos 2 and 3 have one)
        torch.testing.assert_close(masked[0], tensors['output_masked'][0], **TOL)
        assert not torch.allclose(masked[1:], tensors['output_masked'][1:], **TOL)


# learning: real digits moving


def test_tiny_model_overfits_16_clips_of_real_digits():
    clips = moving_digits('train', count=16, frames=4, size=16, digit_size=8, speed=2)
    model = ViViT(image_size=16, image_patch_size=8, frames=4, frame_patch_size=2, num_classes=10, dim=32,
                  spatial_depth=1, temporal_depth=1, heads=2, dim_head=16, mlp_dim=64, channels=1)
    accuracy, steps = fit_fixed_batch(model, clips.floats(), clips.labels)
    assert accuracy == 1.0, f'training accuracy {accuracy} after {steps} steps'


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(variant='joint'), ValueError, r'variant must be one of'),
    (dict(variant='factorized_self_attention', temporal_depth=1), ValueError, r'spatial_depth.*temporal_depth'),
    (dict(frames=3), ValueError, r'frames \(3\).*frame_patch_size'),
    (dict(use_flash_attn='yes'), TypeError, 'use_flash_attn'),
    (dict(pool='max'), ValueError, 'pool'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny(**overrides)


@pytest.mark.parametrize('mask, error, match', [
    (torch.ones(2, 4), TypeError, r'mask must be a boolean tensor'),
    (torch.ones(2, 3, dtype=torch.bool), ValueError, r'mask must have shape \(b, frames\) = \(2, 4\)'),
    (torch.tensor([[True, False, True, False], [True] * 4]), ValueError, r'no temporal slice'),
])
def test_bad_masks_are_refused_naming_mask(mask, error, match):
    with pytest.raises(error, match=match):
        tiny()(video(2), mask=mask)


def test_bad_video_is_refused_naming_video():
    with pytest.raises(ValueError, match=r'video must be 4 frames of 16x24'):
        tiny()(torch.randn(2, 3, 8, 16, 24))
