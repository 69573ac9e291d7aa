"""RegionViT: regional self-attention and regional-to-local attention, as the official code computes them.

References: the official code (IBM/RegionViT @ 77000c2) through fixtures written by it
(tests/fixtures/make_regionvit_fixtures.py) and the parameter counts it gives; the attention
formula written out here.
"""

import math
import textwrap

import pytest
import torch
from einops import rearrange

from helpers import count, feature_pyramid, load_fixture, move_off_initialisation, parameters_without_gradient
from vit_pytorch import regionvit
from vit_pytorch.pretrained import CheckpointError, load_official, load_vit_pytorch
from vit_pytorch.recorder import Recorder
from vit_pytorch.regionvit import RegionToLocalBlock, RegionViT


def tiny(**overrides):
    """Two stages (widths 16, 32; depths 1, 2; 2 and 4 heads), windows of 2x2 local tokens: on 32x32 images the
    local maps are 8x8 and 4x4, the regional ones 4x4 and 2x2."""
    kwargs = dict(dim=(16, 32), depth=(1, 2), window_size=2, num_classes=5, dim_head=8, mlp_mult=2,
                  tokenize_local_3_conv=True)
    kwargs.update(overrides)
    return RegionViT(**kwargs)


# any image size and the local bias (the rest of the face: tests/test_conformance.py)


def test_output_shapes_at_any_image_size_divisible_by_the_local_patch():
    model = tiny()
    for height, width in ((32, 32), (36, 28), (16, 48), (4, 4)):
        img = torch.randn(2, 3, height, width)
        assert model(img).shape == (2, 5)
        regions = (math.ceil(height / 8 / 2), math.ceil(width / 8 / 2))
        assert model.forward_features(img).shape == (2, 32, *regions)


@pytest.mark.parametrize('three_convs', [True, False])
def test_the_last_blocks_local_position_bias_reaches_the_local_maps(three_convs):
    # the logits read the last stage's regional tokens only, so the last block's bias between local tokens gets no
    # gradient through them (test_conformance names it); it reaches the local maps (forward_intermediates, the
    # official detection outputs)
    model = move_off_initialisation(tiny(tokenize_local_3_conv=three_convs).train())
    local = model.forward_intermediates(torch.randn(2, 3, 36, 28), indices=1)[0]
    assert 'stages.1.transformer.layers.1.attention.relative_position_bias' not in \
        parameters_without_gradient(model, local)


# the paper's models: counts of the official code, sum(p.numel() for p in model.parameters()) of its
# regionvit_{tiny,small,medium,base}_224() (IBM/RegionViT @ 77000c2, torch 2.14.1, timm 1.0.31), printed by
#   cd /tmp && /work/ref/refvenv/bin/python -c "import sys; sys.path.insert(0, '/work/ref/official/RegionViT');
#     from regionvit.regionvit import *; print(sum(p.numel() for p in regionvit_tiny_224().parameters()))"
# (the paper: 13.8M / 30.6M / 41.2M / 72.7M)


@pytest.mark.parametrize('variant, expected, paper', [
    ('tiny', 13_842_676, 13.8), ('small', 30_586_618, 30.6), ('medium', 41_215_906, 41.2),
    ('base', 72_747_232, 72.7)])
def test_named_configuration_counts_equal_the_official_code(variant, expected, paper):
    with torch.device('meta'):
        model = getattr(regionvit, f'regionvit_{variant}')()
    assert count(model) == expected
    assert round(count(model) / 1e6, 1) == paper


def test_the_defaults_build_regionvit_ti_with_vit_pytorchs_single_convolution_stem():
    with torch.device('meta'):
        assert count(RegionViT()) == count(regionvit.regionvit_tiny(tokenize_local_3_conv=False))
        assert count(regionvit.regionvit_tiny()) == 13_842_676


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match='variant'):
        regionvit.regionvit('huge')


# what RegionViT adds: regional self-attention, then regional-to-local attention within each window


def block_and_windows(seed=0):
    block = RegionToLocalBlock(8, 2, 16, window_size=2, attn_dropout=0., ff_dropout=0., drop_path=0.)
    block = move_off_initialisation(block).eval()
    x = torch.randn(2 * 4, 1 + 4, 8, generator=torch.Generator().manual_seed(seed))   # 2 images, 4 regions each
    return block, x


def changed_windows(block, x, moved):
    with torch.no_grad():
        changed = (block(moved, regions=4) - block(x, regions=4)).abs().amax(-1) > 1e-6   # (windows, 1 + 4)
    return changed


def test_a_local_token_reaches_only_its_own_window_within_a_block():
    block, x = block_and_windows()
    moved = x.clone()
    moved[5, 3] += torch.randn(8)                       # image 1, region 1, local token 2
    changed = changed_windows(block, x, moved)
    assert changed[5].all()                   # its regional token and every local token of its window
    assert not changed[torch.arange(8) != 5].any()


def test_a_regional_token_reaches_every_window_of_its_image_through_regional_self_attention():
    block, x = block_and_windows()
    moved = x.clone()
    moved[5, 0] += torch.randn(8)                       # image 1, region 1's regional token
    changed = changed_windows(block, x, moved)
    assert changed[4:].all()                  # all four windows of image 1, regional and local tokens
    assert not changed[:4].any()              # image 0 is untouched


def test_without_regional_self_attention_a_regional_token_reaches_only_its_window():
    block, x = block_and_windows()
    with torch.no_grad():
        block.attention.region_norm.weight.zero_()               # every regional query, key and value alike:
        block.attention.region_norm.bias.zero_()                 # the regional self-attention carries nothing
    moved = x.clone()
    moved[5, 0] += torch.randn(8)
    changed = changed_windows(block, x, moved)
    assert changed[5].all() and not changed[torch.arange(8) != 5].any()   # its window only, through regional-to-local


def test_the_position_bias_is_learned_per_offset_between_local_tokens_and_zero_to_the_regional_token():
    block, _ = block_and_windows()
    attention = block.attention
    table = attention.relative_position_bias                     # (heads, 3, 3) for windows of 2
    bias = attention.position_bias()
    assert bias.shape == (2, 5, 5)
    assert not bias[:, 0].any() and not bias[:, :, 0].any()
    for query in range(4):
        for key in range(4):
            dy, dx = key // 2 - query // 2, key % 2 - query % 2
            torch.testing.assert_close(bias[:, 1 + query, 1 + key], table[:, dy + 1, dx + 1])


# the reference: the official RegionViT, tiny, noisy weights (tests/fixtures/make_regionvit_fixtures.py)


def official_case(case):
    metadata, state_dict, tensors = load_fixture(f'official_regionvit_{case}')
    config = metadata['config']
    model = RegionViT(dim=tuple(config['embed_dim'][1:]), depth=tuple(config['depth']),
                      window_size=config['kernel_sizes'][0], num_classes=config['num_classes'],
                      tokenize_local_3_conv=config['patch_conv_type'] == '3conv',
                      local_patch_size=config['patch_size'], dim_head=config['embed_dim'][1] // config['num_heads'][0],
                      mlp_mult=int(config['mlp_ratio'])).eval()
    return load_official(model, state_dict), metadata, tensors


@pytest.mark.parametrize('case', ['3conv', '1conv', 'padded'])
def test_logits_and_local_maps_equal_the_official_codes(case):
    model, _, tensors = official_case(case)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], atol=1e-5, rtol=1e-5)
        maps = model.forward_intermediates(tensors['input'])
    assert len(maps) == 2
    for i, found in enumerate(maps):
        torch.testing.assert_close(found, tensors[f'features.{i}'], atol=1e-5, rtol=1e-5)


def test_padding_is_never_attended_where_the_official_bottom_right_mask_lets_it_be():
    # the padded fixture's `output` comes from the official code with every padded local token masked; as it is,
    # its mask of the bottom-right window leaves part of the padding visible, and the logits differ
    model, _, tensors = official_case('padded')
    with torch.no_grad():
        out = model(tensors['input'])
    assert (out - tensors['output_official_mask']).abs().max() > 1e-3
    torch.testing.assert_close(out, tensors['output'], atol=1e-5, rtol=1e-5)


def test_feature_pyramid_from_forward_intermediates_has_the_official_strides_and_channels():
    model, _, tensors = official_case('3conv')
    img = tensors['input']
    maps = model.forward_intermediates(img)
    assert [info['num_chs'] for info in model.feature_info] == [m.shape[1] for m in maps] == [16, 32]
    width = 8
    pyramid = feature_pyramid(maps, model.feature_info, width)
    for level, info, reference in zip(pyramid, model.feature_info, (tensors[f'features.{i}'] for i in range(2))):
        assert level.shape == (2, width, *reference.shape[-2:])
        assert all(side == image_side // info['reduction']
                   for side, image_side in zip(level.shape[-2:], img.shape[-2:]))


def test_forward_intermediates_returns_the_listed_stages():
    # indices None and an int n: tests/test_conformance.py; a list with a negative number: here
    model, _, tensors = official_case('1conv')
    with torch.no_grad():
        maps = model.forward_intermediates(tensors['input'], indices=[-2])
    for found, i in zip(maps, [0], strict=True):
        torch.testing.assert_close(found, tensors[f'features.{i}'], atol=1e-5, rtol=1e-5)


def test_a_checkpoint_of_the_other_stem_is_refused_by_its_keys():
    _, state_dict, _ = load_fixture('official_regionvit_1conv')
    with pytest.raises(CheckpointError, match='missing keys .*patch_embed.proj.0.weight'):
        load_official(tiny(), state_dict)


def test_vit_pytorch_checkpoints_are_refused_with_what_differs():
    # a few of the keys vit-pytorch 1.26.14's RegionViT saves
    keys = ['local_encoder.weight', 'region_encoder.1.weight', 'layers.0.2.local_rel_pos_bias.weight',
            'layers.0.2.layers.0.0.to_qkv.weight', 'to_logits.1.weight']
    with pytest.raises(CheckpointError, match="vit-pytorch's RegionViT computes another function: its attention "
                                              "has 4 heads in every stage, no query/key/value bias"):
        load_vit_pytorch(tiny(), {key: torch.zeros(1) for key in keys})


def test_vit_pytorchs_keyword_arguments_build_the_official_function():
    # vit-pytorch's signature: an int dim / depth means four equal stages; use_peg only False (not built)
    model = RegionViT(dim=32, depth=1, window_size=2, num_classes=5, tokenize_local_3_conv=False, local_patch_size=4,
                      use_peg=False, attn_dropout=0.1, ff_dropout=0.1, channels=1, dim_head=8)
    assert [info['num_chs'] for info in model.feature_info] == [32] * 4
    assert model(torch.randn(2, 1, 64, 64)).shape == (2, 5)
    with pytest.raises(ValueError, match='use_peg=True is not built here'):
        tiny(use_peg=True)


# the recorder, stochastic depth


def test_recorded_padding_gets_no_attention():
    model = move_off_initialisation(tiny()).eval()
    with torch.no_grad():
        _, maps = Recorder(model)(torch.randn(1, 3, 28, 28))   # local 7x7 in windows of 2: one padded row, column
    local = rearrange(maps[1][:, :, :, 1:], '(rh rw) h n (wh ww) -> h n (rh wh) (rw ww)', rh=4, wh=2)
    assert not local[..., 7, :].any() and not local[..., :, 7].any()
    assert local[..., :7, :7].amin() > 0


def test_stochastic_depth_grows_linearly_over_the_blocks():
    model = tiny(drop_path_rate=0.2)
    rates = [block.drop_path for stage in model.stages for block in stage.transformer.layers]
    assert rates == pytest.approx([0.0, 0.1, 0.2])


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(dim=(16, 24)), ValueError, 'multiple of the previous'),
    (dict(dim=(16, 32), depth=(1, 1, 1)), ValueError, 'one value per stage'),
    (dict(dim=()), ValueError, 'dim'),
    (dict(depth=(1, 0)), ValueError, 'depth'),
    (dict(dim_head=12), ValueError, 'dim_head 12 must divide'),
    (dict(local_patch_size=8), ValueError, 'tokenize_local_3_conv=True .* needs local_patch_size 4'),
    (dict(dim=(18, 36), dim_head=9), ValueError, 'divisible by 4'),
    (dict(tokenize_local_3_conv=False, local_patch_size=1), ValueError, 'local_patch_size must be at least 2'),
    (dict(tokenize_local_3_conv=1), TypeError, 'tokenize_local_3_conv'),
    (dict(drop_path_rate=-0.1), ValueError, 'drop_path_rate'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny(**overrides)


def test_bad_images_are_refused():
    with pytest.raises(ValueError, match='3 channels'):
        tiny()(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match=r'divisible by patch_size \(4, 4\)'):
        tiny()(torch.randn(1, 3, 30, 32))


# the module's example


def test_module_docstring_example_runs_and_says_what_it_gives():
    example = regionvit.__doc__.split('    import torch', 1)[1].split('\nThe function', 1)[0]
    namespace = {}
    exec(textwrap.dedent('    import torch' + example), namespace)
    assert namespace['logits'].shape == (2, 10)
    assert [tuple(m.shape) for m in namespace['maps']] == [(2, 16, 8, 8), (2, 32, 4, 4)]
    assert count(namespace['paper_model']) == 13_842_676
