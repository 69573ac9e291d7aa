import math

import pytest
import torch
from einops import rearrange
from torch import nn

from helpers import count, feature_pyramid, load_fixture
from vit_pytorch.max_vit import (MaxViT, MaxViTBlock, WindowAttention, maxvit_base_tf_224, maxvit_large_tf_224,
                                 maxvit_small_tf_224, maxvit_tiny_tf_224)
from vit_pytorch.pretrained import CheckpointError, load_timm, load_vit_pytorch


def tiny_max_vit(**overrides):
    kwargs = dict(num_classes=5, dim=8, depth=(1, 2), dim_head=4, dim_conv_stem=8, window_size=(2, 3))
    kwargs.update(overrides)
    return MaxViT(**kwargs)


# the face and forward_features' declared layout: tests/test_conformance.py


# the paper's models: counts of the reference, timm 1.0.31's maxvit_*_tf_224 (base and large measured there)


@pytest.mark.parametrize('build, expected', [
    (maxvit_tiny_tf_224, 30_916_528), (maxvit_small_tf_224, 68_927_956),
    (maxvit_base_tf_224, 119_467_708), (maxvit_large_tf_224, 211_785_560),
])
def test_named_configuration_parameter_counts(build, expected):
    with torch.device('meta'):
        model = build()
    assert count(model) == expected


def test_vit_pytorchs_readme_arguments_build_the_official_maxvit_small():
    with torch.device('meta'):
        model = MaxViT(num_classes=1000, dim_conv_stem=64, dim=96, dim_head=32, depth=(2, 2, 5, 2), window_size=7,
                       mbconv_expansion_rate=4, mbconv_shrinkage_rate=0.25, dropout=0.1)
    assert count(model) == 68_927_956


# what MaxViT adds: block attention is local, grid attention is sparse and global


def receptive_field(block, query, size):
    """Which input positions the output at `query` depends on, for a block without its MBConv."""
    x = torch.randn(1, block.block_ff.net[1].in_features, *size, requires_grad=True)
    block(x)[0, :, query[0], query[1]].sum().backward()
    return x.grad[0].abs().sum(0) > 0


def silenced(block, *branches):
    """`block` with its MBConv and the given residual branches adding zero (the attention's output projection or
    the MLP's last Linear zeroed), so that only the others act."""
    with torch.no_grad():
        for module in (block.conv.net[8], *(getattr(block, name) for name in branches)):
            last = module if isinstance(module, nn.Conv2d) else \
                (module.to_out[0] if isinstance(module, WindowAttention) else module.net[4])
            last.weight.zero_()
            last.bias.zero_()
    return block.eval()


def new_block():
    return MaxViTBlock(4, 4, downsample=False, dim_head=2, window_size=(2, 3), expansion_rate=4,
                       shrinkage_rate=0.25, dropout=0., layer_dropout=0., num_register_tokens=0)


def test_block_attention_mixes_only_the_tokens_of_one_window():
    block = silenced(new_block(), 'grid_attn', 'grid_ff')
    reached = receptive_field(block, (3, 4), (6, 9))
    expected = torch.zeros(6, 9, dtype=torch.bool)
    expected[2:4, 3:6] = True                                       # the 2x3 tile of row 3, column 4
    assert torch.equal(reached, expected)


def test_grid_attention_mixes_the_tokens_spaced_a_grid_cell_apart_across_the_whole_map():
    block = silenced(new_block(), 'block_attn', 'block_ff')
    reached = receptive_field(block, (4, 7), (6, 9))
    expected = torch.zeros(6, 9, dtype=torch.bool)
    expected[1::3, 1::3] = True                                     # 2x3 grid: rows 3 apart, columns 3 apart
    assert torch.equal(reached, expected)


def test_relative_position_bias_is_the_table_at_key_minus_query():
    attn = WindowAttention(8, 4, window_size=(2, 3), num_register_tokens=1)
    with torch.no_grad():
        attn.register_bias.copy_(torch.tensor([5., 7.]))
        bias = attn.bias()
    table = attn.relative_position_bias
    assert bias.shape == (2, 1 + 6, 1 + 6)
    for i in range(6):
        for j in range(6):
            (qy, qx), (ky, kx) = divmod(i, 3), divmod(j, 3)
            assert torch.equal(bias[:, 1 + i, 1 + j], table[:, ky - qy + 1, kx - qx + 2])
    assert torch.equal(bias[:, 0, :], torch.tensor([[5.] * 7, [7.] * 7]))
    assert torch.equal(bias[:, :, 0], torch.tensor([[5.] * 7, [7.] * 7]))


def test_registers_enter_every_window_and_grid_attention_gets_their_mean_over_the_windows():
    block = MaxViTBlock(4, 4, downsample=False, dim_head=2, window_size=(2, 2), expansion_rate=4,
                        shrinkage_rate=0.25, dropout=0., layer_dropout=0., num_register_tokens=3).eval()
    seen = {}
    hooks = [getattr(block, name).register_forward_pre_hook(lambda m, args, name=name: seen.update({name: args[0]}))
             for name in ('block_attn', 'grid_attn', 'grid_ff')]
    with torch.no_grad():
        out = block(torch.randn(2, 4, 4, 6))
        for hook in hooks:
            hook.remove()
        windows = 2 * 3                                              # per image: (4 / 2) x (6 / 2)
        assert seen['block_attn'].shape == (2 * windows, 3 + 4, 4)
        assert torch.equal(seen['block_attn'][:, :3], block.register_tokens.expand(2 * windows, 3, 4))
        x = seen['block_attn'] + block.block_attn(seen['block_attn'])
        registers = (x + block.block_ff(x))[:, :3]                  # after block attention and its MLP
        mean = rearrange(registers, '(b n) r c -> b n r c', b=2).mean(1)
        assert torch.allclose(seen['grid_attn'][:, :3], mean.repeat_interleave(windows, dim=0), atol=1e-6)
        assert seen['grid_ff'].shape == (2 * windows, 4, 4)         # the registers are dropped after grid attention
    assert out.shape == (2, 4, 4, 6)


# the reference: timm's MaxxVit in the official (TensorFlow) configuration (tests/fixtures/make_max_vit_fixtures.py)


def timm_case():
    metadata, state_dict, tensors = load_fixture('timm_max_vit')
    model = tiny_max_vit(num_classes=7, dropout=0.)
    return model, metadata, state_dict, tensors


def test_logits_and_feature_maps_equal_timms_maxvit():
    model, _, state_dict, tensors = timm_case()
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-4, rtol=1e-4)
        maps = model.forward_intermediates(tensors['input'])
    assert len(maps) == 3
    for i, found in enumerate(maps):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


def test_logits_equal_timms_at_another_image_size_with_odd_sides():
    model, _, state_dict, tensors = timm_case()
    model = load_timm(model.eval(), state_dict)
    assert tensors['input_other'].shape[-2:] == (29, 72)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input_other']), tensors['logits_other'], atol=1e-4, rtol=1e-4)


def test_feature_pyramid_from_forward_intermediates_has_timms_strides_and_channels():
    model, metadata, _, tensors = timm_case()
    assert [(info['num_chs'], info['reduction']) for info in model.feature_info] == \
        [(info['num_chs'], info['reduction']) for info in metadata['feature_info']]
    img = tensors['input']
    maps = model.forward_intermediates(img)
    width = 8
    pyramid = feature_pyramid(maps, model.feature_info, width)
    for level, info in zip(pyramid, metadata['feature_info']):
        assert level.shape == (2, width, *(math.ceil(side / info['reduction']) for side in img.shape[-2:]))


# indices None and an int n: tests/test_conformance.py; lists, with a negative number: here
@pytest.mark.parametrize('indices, expected', [([0, -1], [0, 2]), ([1], [1])])
def test_forward_intermediates_returns_the_listed_maps(indices, expected):
    model, _, state_dict, tensors = timm_case()
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        maps = model.forward_intermediates(tensors['input'], indices=indices)
    for found, i in zip(maps, expected, strict=True):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


def test_timm_checkpoint_into_a_model_with_registers_is_refused():
    _, _, state_dict, _ = timm_case()
    with pytest.raises(CheckpointError, match='num_register_tokens=0'):
        load_timm(tiny_max_vit(num_classes=7, num_register_tokens=2), state_dict)


def test_timm_checkpoint_into_a_model_without_pre_logits_is_told_to_build_with_it():
    _, _, state_dict, _ = timm_case()
    with pytest.raises(CheckpointError, match='pre_logits=True'):
        load_timm(tiny_max_vit(num_classes=7, pre_logits=False), state_dict)


# vit-pytorch 1.26.14's MaxViT computes another function (tests/fixtures/make_max_vit_fixtures.py)


@pytest.mark.parametrize('case, name', [('max_vit', "vit-pytorch's MaxViT"),
                                        ('max_vit_with_registers', "vit-pytorch's max_vit_with_registers MaxViT")])
def test_vit_pytorch_checkpoint_is_refused_with_what_differs(case, name):
    metadata, state_dict, _ = load_fixture(f'vit_pytorch_1.26.14_{case}')
    config = dict(metadata['config'], depth=tuple(metadata['config']['depth']))
    model = MaxViT(**config)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=rf"{name} computes another function than the official MaxViT.*"
                                              r"its stem has no BatchNorm.*79,981,380 parameters"):
        load_vit_pytorch(model, state_dict)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(depth=2), TypeError, 'depth'),
    (dict(depth=(1, 0)), ValueError, 'depth'),
    (dict(dim=10), ValueError, 'dim_head'),
    (dict(window_size=(2, 0)), ValueError, 'window_size'),
    (dict(mbconv_shrinkage_rate=0.01), ValueError, 'mbconv_shrinkage_rate'),
    (dict(layer_dropout=-0.1), ValueError, 'layer_dropout'),
    (dict(pre_logits=1), TypeError, 'pre_logits'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny_max_vit(**overrides)


def test_an_image_whose_stage_maps_the_window_does_not_divide_is_refused():
    with pytest.raises(ValueError, match=r'img of 32x40 gives stage maps 8x10, 4x5; .* divisible by the window 2x3: '
                                         r'use sides that are multiples of 16x24 \(e.g. 32x48\)'):
        tiny_max_vit()(torch.randn(1, 3, 32, 40))
