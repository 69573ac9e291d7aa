import math
import textwrap

import pytest
import torch
from einops import rearrange

from helpers import as_tuples, count, feature_pyramid, load_fixture, move_off_initialisation
from vit_pytorch import pvt_v2
from vit_pytorch.pretrained import CheckpointError, load_timm, load_vit_pytorch
from vit_pytorch.pvt_v2 import ConvFeedForward, PyramidVisionTransformerV2
from vit_pytorch.multiscale import SpatialReductionAttention


def tiny(**overrides):
    """Two stages on 32x24 images: maps 8x6 (keys reduced 2x2 to 4x3) and 4x3."""
    kwargs = dict(num_classes=5, depths=(1, 2), embed_dims=(8, 16), num_heads=(1, 2), sr_ratios=(2, 1),
                  mlp_ratios=(2, 2))
    kwargs.update(overrides)
    return PyramidVisionTransformerV2(**kwargs)


# any image size (the rest of the face: tests/test_conformance.py)


def test_output_shapes_at_any_image_size():
    model = tiny()
    for height, width in ((32, 24), (40, 56), (17, 30)):
        img = torch.randn(2, 3, height, width)
        assert model(img).shape == (2, 5)
        grid = pvt_v2.stage_sizes((height, width), 2)[-1]
        assert model.forward_features(img).shape == (2, 16, *grid)


# the paper's models (counts of the reference implementation, timm 1.0.31's pvt_v2_*)


@pytest.mark.parametrize('variant, expected', [
    ('b0', 3_666_760), ('b1', 14_009_000), ('b2', 25_362_856), ('b3', 45_238_696), ('b4', 62_556_072),
    ('b5', 81_956_008), ('b2_li', 22_553_512)])
def test_named_configuration_parameter_counts(variant, expected):
    with torch.device('meta'):
        model = getattr(pvt_v2, f'pvt_v2_{variant}')()
    assert count(model) == expected


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match='variant'):
        pvt_v2.pvt_v2('b9')


# what PVT v2 adds: spatial-reduction attention, a convolutional feedforward, overlapping patches


def test_a_reduction_to_a_single_key_gives_every_token_the_same_output():
    # a 4x4 map reduced by a 4x4 convolution of stride 4 leaves one key: softmax over it is 1 for every query
    attention = move_off_initialisation(SpatialReductionAttention(8, 2, sr_ratio=4)).eval()
    out = attention(torch.randn(2, 16, 8), (4, 4))
    torch.testing.assert_close(out, out[:, :1].expand_as(out))
    reduced = attention.keys_from(torch.randn(2, 16, 8), (4, 4))
    assert reduced.shape == (2, 1, 8)


def test_the_linear_variant_attends_to_7x7_pooled_keys_at_any_size():
    attention = SpatialReductionAttention(8, 2, linear=True)
    for size in ((8, 6), (14, 14), (21, 3)):
        assert attention.keys_from(torch.randn(1, size[0] * size[1], 8), size).shape == (1, 49, 8)


def test_the_feedforward_mixes_each_token_with_its_3x3_neighbours_only():
    feedforward = move_off_initialisation(ConvFeedForward(4, 8)).eval()
    x = torch.randn(1, 6 * 5, 4)
    moved = x.clone()
    moved[0, 2 * 5 + 3] += torch.randn(4)           # the token at row 2, column 3
    with torch.no_grad():
        changed = (feedforward(moved, (6, 5)) - feedforward(x, (6, 5))).abs().amax(-1) > 0
    rows, cols = torch.meshgrid(torch.arange(6), torch.arange(5), indexing='ij')
    neighbours = ((rows - 2).abs() <= 1) & ((cols - 3).abs() <= 1)
    assert torch.equal(rearrange(changed[0], '(h w) -> h w', h=6), neighbours)


def test_overlapping_patches_see_past_their_stride():
    # the 7x7 stem of stride 4 (padding 3): the token at (1, 1) covers pixels 1..7, so pixel 7 moves it
    # and pixel 8 does not
    model = tiny().eval()
    embed = model.stages[0].downsample
    img = torch.randn(1, 3, 32, 24)
    with torch.no_grad():
        base = embed(img)
        for pixel, moves in ((7, True), (8, False)):
            moved = img.clone()
            moved[0, :, pixel, pixel] += 1.0
            assert bool((embed(moved)[0, 1, 1] - base[0, 1, 1]).abs().max() > 0) == moves


# the reference: timm's PyramidVisionTransformerV2, tiny, noisy weights (tests/fixtures/make_pvt_v2_fixtures.py)


def timm_case(name):
    metadata, state_dict, tensors = load_fixture(name)
    config = as_tuples(metadata['config'], 'depths', 'embed_dims', 'num_heads', 'sr_ratios', 'mlp_ratios')
    return PyramidVisionTransformerV2(**config), metadata, state_dict, tensors


@pytest.mark.parametrize('name', ['timm_pvt_v2', 'timm_pvt_v2_li'])
def test_logits_and_feature_maps_equal_timms(name):
    model, _, state_dict, tensors = timm_case(name)
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-4, rtol=1e-4)
        maps = model.forward_intermediates(tensors['input'])
    assert len(maps) == len(model.stages)
    for i, found in enumerate(maps):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


def test_feature_pyramid_from_forward_intermediates_has_timms_strides_and_channels():
    model, metadata, _, tensors = timm_case('timm_pvt_v2')
    assert model.feature_info == metadata['feature_info']
    img = tensors['input']
    maps = model.forward_intermediates(img)
    width = 8
    pyramid = feature_pyramid(maps, model.feature_info, width)
    for level, info, reference in zip(pyramid, model.feature_info, (tensors[f'feature.{i}'] for i in range(4))):
        assert level.shape == (2, width, *reference.shape[-2:])
        assert all(side == math.ceil(image_side / info['reduction'])
                   for side, image_side in zip(level.shape[-2:], img.shape[-2:]))


def test_forward_intermediates_returns_the_listed_stages():
    # indices None and an int n: tests/test_conformance.py; a list with a negative number: here
    model, _, state_dict, tensors = timm_case('timm_pvt_v2')
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        maps = model.forward_intermediates(tensors['input'], indices=[0, -1])
    for found, i in zip(maps, [0, 3], strict=True):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


def test_a_checkpoint_of_the_other_variant_says_which_to_build():
    model, _, state_dict, _ = timm_case('timm_pvt_v2')
    linear, _, linear_state, _ = timm_case('timm_pvt_v2_li')
    with pytest.raises(CheckpointError, match='linear=True'):
        load_timm(PyramidVisionTransformerV2(**{**dict(depths=(1, 1, 2), embed_dims=(8, 16, 24),
                                                       num_heads=(1, 2, 3), sr_ratios=(4, 2, 1),
                                                       mlp_ratios=(2, 2, 4), num_classes=7)}), linear_state)
    with pytest.raises(CheckpointError, match='qkv_bias=True'):
        load_timm(PyramidVisionTransformerV2(**{**dict(depths=(1, 2, 1, 1), embed_dims=(8, 16, 24, 32),
                                                       num_heads=(1, 2, 3, 4), sr_ratios=(4, 2, 1, 1),
                                                       mlp_ratios=(2, 2, 4, 4), num_classes=7), 'qkv_bias': False}),
                  state_dict)


def test_the_original_layout_is_refused_with_the_way_to_convert_it():
    model, _, state_dict, _ = timm_case('timm_pvt_v2')
    original = {key.replace('patch_embed.', 'patch_embed1.'): value for key, value in state_dict.items()}
    with pytest.raises(CheckpointError, match="original PVT v2 layout"):
        load_timm(model, original)


def test_vit_pytorch_checkpoints_are_refused_vit_pytorch_has_no_pvt_v2():
    with pytest.raises(TypeError, match='no vit-pytorch checkpoints exist for PyramidVisionTransformerV2'):
        load_vit_pytorch(tiny(), {})


# stochastic depth


def test_stochastic_depth_grows_linearly_over_the_blocks():
    model = tiny(drop_path_rate=0.2)
    rates = [branch.p for stage in model.stages for layer in stage.blocks.layers for branch in layer]
    assert rates == pytest.approx([0.0, 0.0, 0.1, 0.1, 0.2, 0.2])


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(depths=2), TypeError, 'depths'),
    (dict(depths=(1, 0)), ValueError, 'depths'),
    (dict(embed_dims=(8,)), ValueError, 'embed_dims'),
    (dict(num_heads=(3, 2)), ValueError, 'num_heads 3 must divide'),
    (dict(num_heads=(1, 2, 4)), ValueError, 'num_heads'),
    (dict(mlp_ratios=(2, 0.01)), ValueError, 'mlp_ratios'),
    (dict(linear=1), TypeError, 'linear'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny(**overrides)


def test_an_image_too_small_for_a_reduction_is_refused_with_the_size_that_works():
    model = tiny(sr_ratios=(4, 1))
    with pytest.raises(ValueError, match=r'stage 0 a 3x3 map, smaller than its sr_ratio 4; use images of at least 13'):
        model(torch.randn(1, 3, 12, 12))
    assert model(torch.randn(1, 3, 13, 13)).shape == (1, 5)


def test_wrong_channels_are_refused():
    with pytest.raises(ValueError, match='3 channels'):
        tiny()(torch.randn(1, 1, 32, 24))


# the module's example


def test_module_docstring_example_runs_and_says_what_it_gives():
    example = pvt_v2.__doc__.split('    import torch', 1)[1].split('\nThe arguments', 1)[0]
    namespace = {}
    exec(textwrap.dedent('    import torch' + example), namespace)
    assert namespace['logits'].shape == (2, 10)
    assert [tuple(m.shape) for m in namespace['maps']] == [(2, 16, 16, 12), (2, 32, 8, 6)]
    assert count(namespace['paper_model']) == 3_666_760
