import math

import pytest
import torch
from einops import rearrange
from torch import nn

from helpers import count, feature_pyramid, load_fixture
from vit_pytorch.mobile_vit import (MobileViT, MobileViTBlock, RegisteredMobileViT, mobilevit_s, mobilevit_xs,
                                   mobilevit_xxs)
from vit_pytorch.train import model_config
from vit_pytorch.pretrained import CheckpointError, load_timm, load_vit_pytorch

TINY = dict(image_size=(40, 56), dims=(8, 16, 24), channels=(8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 32), num_classes=5,
            expansion=2, depths=(1, 2, 1))


def tiny_mobile_vit(**overrides):
    return MobileViT(**{**TINY, **overrides})


# the face and forward_features' declared layout: tests/test_conformance.py


# the paper's models: counts of the reference, timm 1.0.31's mobilevit_*


@pytest.mark.parametrize('build, expected', [(mobilevit_xxs, 1_272_024), (mobilevit_xs, 2_317_848),
                                             (mobilevit_s, 5_578_632)])
def test_named_configuration_parameter_counts(build, expected):
    with torch.device('meta'):
        model = build()
    assert count(model) == expected


def test_vit_pytorchs_readme_arguments_build_the_official_mobilevit_xs():
    with torch.device('meta'):
        model = MobileViT(image_size=(256, 256), dims=[96, 120, 144],
                          channels=[16, 32, 48, 48, 64, 64, 80, 80, 96, 96, 384], num_classes=1000)
    assert count(model) == 2_317_848


# what MobileViT adds: a convolution-like block whose every output pixel sees the whole map


def test_transformer_sequences_are_the_pixels_at_one_position_of_every_patch():
    block = MobileViTBlock(4, 4, 4, 1, heads=2, patch_size=(2, 3)).eval()
    block.conv_local, block.to_tokens = nn.Identity(), nn.Identity()
    seen = []
    block.transformer.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    rows, cols = torch.meshgrid(torch.arange(4.), torch.arange(9.), indexing='ij')
    img = torch.stack((rows, cols, torch.zeros(4, 9), torch.zeros(4, 9)))[None]     # each pixel holds its (row, col)
    with torch.no_grad():
        block(img)
    sequences = rearrange(seen[0], '(b ph pw) n d -> b ph pw n d', ph=2, pw=3)[0]
    for i in range(2):
        for j in range(3):
            positions = [tuple(p) for p in sequences[i, j, :, :2].long().tolist()]
            assert positions == [(i + 2 * a, j + 3 * b) for a in range(2) for b in range(3)]


def test_one_block_sees_the_whole_map():
    block = MobileViTBlock(4, 4, 8, 1, heads=2).eval()
    x = torch.randn(1, 4, 10, 10, requires_grad=True)
    block(x)[0, :, 0, 0].sum().backward()
    assert (x.grad[0].abs().sum(0) > 0).all()                      # local 3x3 conv, then every patch at that position


def test_a_map_the_patch_does_not_divide_is_resized_around_the_transformer():
    block = MobileViTBlock(4, 4, 8, 1, heads=2).eval()
    seen = []
    block.transformer.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape))
    with torch.no_grad():
        assert block(torch.randn(2, 4, 5, 7)).shape == (2, 4, 5, 7)
    assert seen == [(2 * 4, 3 * 4, 8)]                             # resized to 6x8: 3x4 patches of 2x2


# the reference: timm's ByobNet with MobileViT blocks (tests/fixtures/make_mobile_vit_fixtures.py)


def timm_case():
    metadata, state_dict, tensors = load_fixture('timm_mobile_vit')
    model = tiny_mobile_vit(dims=(8, 16, 24), channels=(8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 32), num_classes=7)
    return model, metadata, state_dict, tensors


def test_logits_and_feature_maps_equal_timms_mobilevit():
    model, _, state_dict, tensors = timm_case()
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-4, rtol=1e-4)
        maps = model.forward_intermediates(tensors['input'])
    assert len(maps) == 5
    for i, found in enumerate(maps):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


def test_feature_pyramid_from_forward_intermediates_has_timms_strides_and_channels():
    model, metadata, _, tensors = timm_case()
    assert model.feature_info == [{k: v for k, v in info.items() if k != 'stage'} for info in metadata['feature_info']]
    img = tensors['input']
    maps = model.forward_intermediates(img)
    width = 8
    pyramid = feature_pyramid(maps, model.feature_info, width)
    for level, info in zip(pyramid, metadata['feature_info']):
        assert level.shape == (2, width, *(math.ceil(side / info['reduction']) for side in img.shape[-2:]))


# indices None and an int n: tests/test_conformance.py; lists, with a negative number: here
@pytest.mark.parametrize('indices, expected', [([0, -1], [0, 4]), ([2], [2])])
def test_forward_intermediates_returns_the_listed_maps(indices, expected):
    model, _, state_dict, tensors = timm_case()
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        maps = model.forward_intermediates(tensors['input'], indices=indices)
    for found, i in zip(maps, expected, strict=True):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


def test_timm_checkpoint_of_other_widths_is_refused_by_name():
    model, _, state_dict, _ = timm_case()
    with pytest.raises(CheckpointError, match=r'stages\.2\.1\.transformer\.0\.attn\.qkv\.weight: shape \(24, 8\), '
                                              r'expected \(48, 16\)'):
        load_timm(tiny_mobile_vit(dims=(16, 16, 24), num_classes=7), state_dict)


# vit-pytorch 1.26.14's MobileViT computes another function (tests/fixtures/make_mobile_vit_fixtures.py)


def test_vit_pytorch_checkpoint_is_refused_with_what_differs():
    metadata, state_dict, _ = load_fixture('vit_pytorch_1.26.14_mobile_vit')
    config = {key: tuple(value) if isinstance(value, list) else value for key, value in metadata['config'].items()}
    model = MobileViT(**config)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"vit-pytorch's MobileViT computes another function than the official "
                                              r"MobileViT.*4 heads of 8 channels whatever the width"):
        load_vit_pytorch(model, state_dict)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


# the registry's face: `channels` are the images' (the training command's --channels), `widths` vit-pytorch's channels


def test_registered_class_is_mobilevit_with_the_images_channels_as_channels():
    widths = (8,) * 10 + (16,)
    registered = RegisteredMobileViT(image_size=16, dims=(8, 8, 8), widths=widths, num_classes=3, channels=1,
                                     depths=(1, 1, 1)).eval()
    plain = MobileViT(image_size=16, dims=(8, 8, 8), channels=widths, num_classes=3, in_chans=1, depths=(1, 1, 1))
    plain.load_state_dict(registered.state_dict())
    img = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(registered(img), plain.eval()(img), atol=0, rtol=0)
    kwargs = model_config('mobile_vit', {}, image_size=16, channels=1, num_classes=10)
    assert kwargs['channels'] == 1 and len(kwargs['widths']) == 11 and kwargs['num_classes'] == 10


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(channels=(8, 8, 8)), ValueError, 'channels must be a list of 11'),
    (dict(dims=(8, 16)), ValueError, 'dims must be a list of 3'),
    (dict(depths=(1, 0, 1)), ValueError, 'depths'),
    (dict(dims=(8, 16, 10)), ValueError, 'heads=4'),
    (dict(kernel_size=4), ValueError, 'kernel_size must be odd'),
    (dict(channels=(8, 8, 8, 16, 8, 8, 16, 16, 16, 16, 32)), ValueError, r'channels\[2\] and channels\[3\]'),
    (dict(expansion=0), ValueError, 'expansion'),
    (dict(in_chans=1.5), TypeError, 'in_chans'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny_mobile_vit(**overrides)


def test_an_image_with_other_channels_is_refused():
    with pytest.raises(ValueError, match='3 channels'):
        tiny_mobile_vit()(torch.randn(1, 1, 40, 56))
