"""CrossFormer against the paper's official code (cheerss/CrossFormer @ 7952010): the parameter counts it gives
for its configurations, and the outputs of a tiny official model (tests/fixtures/make_crossformer_fixtures.py);
vit-pytorch's arguments at vit-pytorch's class, meaning what they mean there."""

import math
import textwrap

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from helpers import count, feature_pyramid, load_fixture, move_off_initialisation
from vit_pytorch import crossformer
from vit_pytorch.crossformer import (CrossFormer, CrossScaleAttention, CrossScaleEmbedding, DynamicPositionBias,
                                     OfficialCrossFormer)
from vit_pytorch.pretrained import CheckpointError, load_official, load_vit_pytorch
from vit_pytorch.recorder import Recorder


def tiny(**overrides):
    """Three stages on 32x48 images: maps 16x24, 8x12, 4x6; groups of 3 and intervals 2, 2, 1 that do not divide
    the first maps (padding), and a last map no larger than its group (one group, SDA in every block). Widths of
    32 and more: at 16 the position-bias MLP is 1 wide, and its first LayerNorm makes its first layers constant
    (as in the official code)."""
    kwargs = dict(num_classes=5, dim=(32, 48, 64), depth=(2, 2, 2), heads=(1, 2, 2), local_window_size=(3, 3, 4),
                  interval=(2, 2, 1), cross_embed_kernel_sizes=((2, 4, 8), (2, 4), (2, 4)),
                  cross_embed_strides=(2, 2, 2), mlp_mult=2)
    return OfficialCrossFormer(**{**kwargs, **overrides})


# the face and forward_features' declared layout: tests/test_conformance.py


def test_single_values_are_repeated_over_four_stages():
    model = OfficialCrossFormer(num_classes=3, dim=32, depth=1, local_window_size=2, interval=1,
                        cross_embed_kernel_sizes=(2, 4), cross_embed_strides=2)
    assert len(model.stages) == 4
    assert [info['reduction'] for info in model.feature_info] == [2, 4, 8, 16]
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)


# the official configurations: sum(p.numel() for p in model.parameters()) of the official models/crossformer.py,
# built as configs/crossformer/{tiny,small,base,large}_patch4_group7_224.yaml (USE_ACL False) at 224, 1000 classes:
#   cd /tmp && /work/ref/refvenv/bin/python /work/main/tests/fixtures/make_crossformer_fixtures.py \
#       --official /work/ref/official/CrossFormer --counts
# and the published figures (the official README's table, the issue's): 27.8M, 30.7M, 52.0M, 92.0M


@pytest.mark.parametrize('variant, official, paper', [
    ('tiny', 27_776_794, 27.8), ('small', 30_657_394, 30.7), ('base', 51_971_554, 52.0),
    ('large', 91_971_184, 92.0)])
def test_named_configuration_parameter_counts_equal_the_official_code(variant, official, paper):
    with torch.device('meta'):
        model = getattr(crossformer, f'crossformer_{variant}')()
    assert count(model) == official
    assert round(count(model) / 1e6, 1) == paper


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match='variant'):
        crossformer.crossformer('huge')


# what CrossFormer adds: the cross-scale embedding, SDA and LDA groups, the dynamic position bias


def test_cross_scale_embedding_concatenates_convolutions_of_every_kernel():
    embed = CrossScaleEmbedding(3, 16, kernels=(2, 4, 8), stride=2, norm_input=False).eval()
    assert [conv.out_channels for conv in embed.convs] == [8, 4, 4]
    img = torch.randn(1, 3, 16, 16)
    expected = torch.cat([F.conv2d(img, conv.weight, conv.bias, stride=2, padding=(kernel - 2) // 2)
                          for conv, kernel in zip(embed.convs, (2, 4, 8))], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(embed(img), embed.norm(rearrange(expected, 'b d h w -> b h w d')))


def test_each_kernel_of_the_cross_scale_embedding_sees_its_own_scale():
    embed = move_off_initialisation(CrossScaleEmbedding(3, 16, kernels=(2, 4, 8), stride=2, norm_input=True)).eval()
    img = torch.randn(1, 3, 16, 16)
    moved = img.clone()
    moved[0, :, 7, 7] += torch.randn(3)
    with torch.no_grad():
        changed = (embed(moved) - embed(img)).abs() > 0                  # (1, 8, 8, 16)
    # kernel k (padding (k - 2) / 2) at output position p covers input rows 2p - (k - 2) / 2 ... + k - 1
    for kernel, channels in zip((2, 4, 8), (slice(0, 8), slice(8, 12), slice(12, 16))):
        rows = torch.tensor([2 * p - (kernel - 2) // 2 <= 7 < 2 * p - (kernel - 2) // 2 + kernel for p in range(8)])
        assert torch.equal(changed[0, :, :, channels].any(-1), rows[:, None] & rows[None, :])


def changed_tokens(attention, size, token):
    """Which outputs of `attention` on an (h, w) map move when the input token at (row, col) moves."""
    attention = move_off_initialisation(attention).eval()
    x = torch.randn(1, size[0] * size[1], attention.norm.normalized_shape[0])
    moved = x.clone()
    moved[0, token[0] * size[1] + token[1]] += torch.randn(x.shape[-1])
    with torch.no_grad():
        changed = (attention(moved, size) - attention(x, size)).abs().amax(-1) > 0
    return rearrange(changed[0], '(h w) -> h w', h=size[0])


def test_short_distance_attention_stays_within_its_group_of_adjacent_tokens():
    changed = changed_tokens(CrossScaleAttention(16, 2, group_size=2, interval=1), (8, 8), (1, 2))
    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(8), indexing='ij')
    assert torch.equal(changed, (rows < 2) & (cols >= 2) & (cols < 4))


def test_long_distance_attention_groups_tokens_interval_apart():
    # group 2, interval 4: on an 8x8 map the token (1, 2) is grouped with rows 1, 5 and columns 2, 6
    changed = changed_tokens(CrossScaleAttention(16, 2, group_size=2, interval=4), (8, 8), (1, 2))
    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(8), indexing='ij')
    assert torch.equal(changed, ((rows == 1) | (rows == 5)) & ((cols == 2) | (cols == 6)))


def test_long_distance_groups_repeat_per_span_on_a_padded_map():
    # group 2, interval 2: spans of 4; a 6x6 map is padded to 8x8, the token (5, 4) is grouped within the span
    # of rows 4..7 and columns 4..7 with rows 5, 7 (7 is padding) and columns 4, 6
    changed = changed_tokens(CrossScaleAttention(16, 2, group_size=2, interval=2), (6, 6), (5, 4))
    rows, cols = torch.meshgrid(torch.arange(6), torch.arange(6), indexing='ij')
    assert torch.equal(changed, (rows == 5) & ((cols == 4) | (cols == 6)))


def test_a_map_no_larger_than_the_group_is_cut_in_groups_of_its_shorter_side():
    assert changed_tokens(CrossScaleAttention(16, 2, group_size=4, interval=2), (3, 3), (0, 0)).all()
    # as the official code: a 3x4 map with groups of 4 gets groups of 3 (padded to 3x6), SDA
    changed = changed_tokens(CrossScaleAttention(16, 2, group_size=4, interval=2), (3, 4), (0, 0))
    assert torch.equal(changed, torch.tensor([[True, True, True, False]] * 3))


def test_dynamic_position_bias_is_the_mlp_of_each_query_key_offset():
    attention = move_off_initialisation(CrossScaleAttention(32, 2, group_size=3, interval=1))
    bias = attention.relative_bias(3, like=torch.zeros(()))                 # (heads, 9, 9)
    position = [(i // 3, i % 3) for i in range(9)]
    offsets = torch.tensor([[(position[i][0] - position[j][0], position[i][1] - position[j][1]) for j in range(9)]
                            for i in range(9)], dtype=torch.float32)
    torch.testing.assert_close(bias, rearrange(attention.position_bias(offsets), 'i j h -> h i j'))
    assert isinstance(attention.position_bias, DynamicPositionBias)
    assert attention.position_bias[0].out_features == 32 // 16


def test_blocks_alternate_sda_and_lda():
    model = tiny()
    assert [[layer[0].fn.interval for layer in stage.blocks.layers] for stage in model.stages] == [
        [1, 2], [1, 2], [1, 1]]


# the reference: the official code, tiny, noisy weights (tests/fixtures/make_crossformer_fixtures.py)


def official_case():
    metadata, state_dict, tensors = load_fixture('official_crossformer')
    config = metadata['config']
    stages = len(config['depths'])
    model = OfficialCrossFormer(
        num_classes=config['num_classes'], dim=tuple(config['embed_dim'] * 2 ** i for i in range(stages)),
        depth=tuple(config['depths']), heads=tuple(config['num_heads']), local_window_size=tuple(config['group_size']),
        interval=tuple(config['crs_interval']),
        cross_embed_kernel_sizes=(tuple(config['patch_size']), *map(tuple, config['merge_size'])),
        cross_embed_strides=(config['patch_size'][0],) + (2,) * (stages - 1), mlp_mult=int(config['mlp_ratio'][0]))
    return model.eval(), metadata, state_dict, tensors


def test_logits_and_stage_maps_equal_the_official_codes():
    model, _, state_dict, tensors = official_case()
    load_official(model, state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-5, rtol=1e-5)
        maps = model.forward_intermediates(tensors['input'])
    assert len(maps) == 3
    for i, found in enumerate(maps):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-5, rtol=1e-5)


def test_forward_intermediates_returns_the_listed_stages():
    # indices None and an int n: tests/test_conformance.py; a list with a negative number: here
    model, _, state_dict, tensors = official_case()
    load_official(model, state_dict)
    with torch.no_grad():
        maps = model.forward_intermediates(tensors['input'], indices=[0, -2])
    for found, i in zip(maps, [0, 1], strict=True):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-5, rtol=1e-5)


def test_feature_pyramid_from_forward_intermediates_has_the_official_strides_and_channels():
    model, _, _, tensors = official_case()
    img = tensors['input']
    official = [(tensors[f'feature.{i}'].shape[1], img.shape[-1] // tensors[f'feature.{i}'].shape[-1])
                for i in range(3)]
    assert [(info['num_chs'], info['reduction']) for info in model.feature_info] == official
    maps = model.forward_intermediates(img)
    width = 8
    pyramid = feature_pyramid(maps, model.feature_info, width)
    for level, info in zip(pyramid, model.feature_info):
        assert tuple(level.shape) == (2, width, *(side // info['reduction'] for side in img.shape[-2:]))


def test_load_official_without_the_head():
    model, _, state_dict, tensors = official_case()
    model.reset_classifier(7)
    load_official(model, state_dict, load_head=False)
    with torch.no_grad():
        pooled = model.forward_head(model.forward_features(tensors['input']), pre_logits=True)
    head = state_dict['head.weight'], state_dict['head.bias']
    torch.testing.assert_close(F.linear(pooled, *head), tensors['logits'], atol=1e-5, rtol=1e-5)


def test_a_checkpoint_with_the_extra_convolutions_of_acl_is_refused():
    model, _, state_dict, _ = official_case()
    state_dict = dict(state_dict, **{'layers.0.blocks.1.ex_conv.weight': torch.zeros(16, 1, 3, 3)})
    with pytest.raises(CheckpointError, match='USE_ACL'):
        load_official(model, state_dict)


# vit-pytorch 1.26.14's arguments mean what they mean there (its state_dict shapes and README call:
# tests/fixtures/make_crossformer_fixtures.py --vit-pytorch); its function contradicts the paper's position bias


def vit_pytorch_case():
    metadata, _, _ = load_fixture('vit_pytorch_1.26.14_crossformer')
    config = json_config(metadata['config'])
    return CrossFormer(**config), config, metadata['shapes']


def json_config(config):
    return {key: tuple(tuple(v) if isinstance(v, list) else v for v in value) if isinstance(value, list) else value
            for key, value in config.items()}


def test_vit_pytorchs_arguments_build_its_stages_blocks_heads_and_kernels():
    model, config, shapes = vit_pytorch_case()
    for i, stage in enumerate(model.stages):
        # vit-pytorch: layers.{i}.1.layers.{pair}.{0: short, 2: long}.to_qkv, (3 * heads * 32, width, 1, 1)
        pairs = sorted({int(key.split('.')[4]) for key in shapes if key.startswith(f'layers.{i}.1.layers.')})
        assert len(stage.blocks.layers) == 2 * len(pairs) == 2 * config['depth'][i]
        for j, layer in enumerate(stage.blocks.layers):
            theirs = shapes[f'layers.{i}.1.layers.{j // 2}.{2 * (j % 2)}.to_qkv.weight']
            assert tuple(layer[0].fn.to_qkv.weight.shape) == tuple(theirs[:2])
            assert layer[0].fn.heads * 32 * 3 == theirs[0]
        # vit-pytorch's cross-scale embedding: one convolution per kernel, (channels, in, kernel, kernel)
        convs = sorted(key for key in shapes if key.startswith(f'layers.{i}.0.convs.') and key.endswith('.weight'))
        assert [tuple(conv.weight.shape) for conv in stage.embed.convs] == [tuple(shapes[key]) for key in convs]


def test_depth_counts_pairs_of_sda_then_lda_with_global_window_size_as_the_lda_group_side():
    model = CrossFormer(num_classes=3, dim=(32, 32), depth=(1, 2), global_window_size=(4, 2), local_window_size=2,
                        cross_embed_kernel_sizes=((2, 4), (2, 4)), cross_embed_strides=(2, 2))
    assert [[(layer[0].fn.group_size, layer[0].fn.interval) for layer in stage.blocks.layers]
            for stage in model.stages] == [[(2, 1), (4, None)], [(2, 1), (2, None), (2, 1), (2, None)]]


def test_long_distance_groups_of_global_window_size_spread_over_the_map():
    # vit-pytorch's long attention, 'b d (l1 h) (l2 w) -> (b h w) d l1 l2' with l1 = l2 = 2: on an 8x6 map the
    # token (1, 2) is grouped with the tokens 8 / 2 = 4 rows and 6 / 2 = 3 columns apart: rows 1, 5, columns 2, 5
    changed = changed_tokens(CrossScaleAttention(16, 2, group_size=2, interval=None), (8, 6), (1, 2))
    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(6), indexing='ij')
    assert torch.equal(changed, ((rows == 1) | (rows == 5)) & ((cols == 2) | (cols == 5)))


def test_where_the_map_is_group_times_interval_both_argument_sets_compute_one_function():
    # 32x32 images: maps 16 and 8; groups of 4 at intervals 4 and 2 span them, as global windows of 4 do
    common = dict(num_classes=3, dim=(32, 32), local_window_size=4, cross_embed_kernel_sizes=((2, 4), (2, 4)),
                  cross_embed_strides=(2, 2))
    ours = move_off_initialisation(CrossFormer(depth=(1, 1), global_window_size=(4, 4), **common)).eval()
    official = OfficialCrossFormer(depth=(2, 2), interval=(4, 2), **common).eval()
    official.load_state_dict(ours.state_dict())
    img = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(img), official(img))


def test_embedding_kernels_are_sorted_as_vit_pytorchs():
    model = CrossFormer(num_classes=3, dim=32, depth=1, global_window_size=1, local_window_size=2,
                        cross_embed_kernel_sizes=(8, 2, 4), cross_embed_strides=2)
    assert [(conv.kernel_size[0], conv.out_channels) for conv in model.stages[0].embed.convs] == [(2, 16), (4, 8),
                                                                                                  (8, 8)]


def test_vit_pytorchs_readme_call_classifies_a_224_image():
    with torch.device('meta'):
        model = CrossFormer(num_classes=1000, dim=(64, 128, 256, 512), depth=(2, 2, 8, 2),
                            global_window_size=(8, 4, 2, 1), local_window_size=7)
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1000)
    assert [len(stage.blocks.layers) for stage in model.stages] == [4, 4, 16, 4]


def test_a_map_that_global_window_size_does_not_divide_is_refused_with_a_size_that_works():
    model = CrossFormer(num_classes=3, dim=(32, 32), depth=1, global_window_size=(4, 2), local_window_size=2,
                        cross_embed_kernel_sizes=((2, 4), (2, 4)), cross_embed_strides=(2, 2))
    # maps of 24 pixels: 12 and 6 (divisible by 4 and 2); of 20: 10 and 5
    assert model(torch.randn(1, 3, 24, 24)).shape == (1, 3)
    with pytest.raises(ValueError, match=r'img height and width \(20, 24\) must be divisible by 8: the stage maps '
                                         r'\(10x12, 5x6\) must be divisible by global_window_size \(4, 2\).*e\.g\. '
                                         r'16x24'):
        model(torch.randn(1, 3, 20, 24))


def test_vit_pytorch_checkpoint_is_refused_naming_the_position_bias_that_contradicts_the_paper():
    model, _, shapes = vit_pytorch_case()
    state_dict = {key: torch.zeros(shape) for key, shape in shapes.items()}
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"its dynamic position bias does not read the offset between query "
                                              r"and key.*one bias shared by all heads"):
        load_vit_pytorch(model, state_dict)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


def test_widths_that_vit_pytorch_builds_with_empty_layers_are_refused():
    metadata, _, _ = load_fixture('vit_pytorch_1.26.14_crossformer')
    # vit-pytorch builds empty kernels and zero heads (width // 32) for these widths
    assert 'layers.0.0.convs.2.weight' in metadata['narrow_empty']
    assert 'layers.0.1.layers.0.0.to_qkv.weight' in metadata['narrow_empty']
    narrow = metadata['narrow_config']
    with pytest.raises(ValueError, match='dim of stage 1 must be at least 16, got 4'):
        CrossFormer(**json_config(narrow))
    with pytest.raises(ValueError, match=r'dim 16 of stage 1 is too narrow for its 6 embedding kernels: they would '
                                         r'get \[8, 4, 2, 1, 0, 1\] channels'):
        tiny(dim=(16, 48, 64), cross_embed_kernel_sizes=((2, 4, 6, 8, 10, 12), (2, 4), (2, 4)))


# the recorder


def expected_attention(attention, x, size):
    """softmax(q k^T / sqrt(d) + bias + padding mask) recomputed from the module's projections."""
    group, (ih, iw) = attention.grouping(size)
    padded = tuple(-(-side // (group * i)) * group * i for side, i in zip(size, (ih, iw)))
    normed = rearrange(attention.norm(x), 'b (h w) d -> b h w d', h=size[0])
    normed = F.pad(normed, (0, 0, 0, padded[1] - size[1], 0, padded[0] - size[0]))
    groups = rearrange(normed, 'b (nh gh ih) (nw gw iw) d -> (b nh nw ih iw) (gh gw) d', gh=group, gw=group,
                       ih=ih, iw=iw)
    q, k, _ = rearrange(attention.to_qkv(groups), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=attention.heads)
    valid = F.pad(torch.ones(1, *size, 1, dtype=torch.bool), (0, 0, 0, padded[1] - size[1], 0, padded[0] - size[0]))
    valid = rearrange(valid, 'b (nh gh ih) (nw gw iw) 1 -> (b nh nw ih iw) 1 1 (gh gw)', gh=group, gw=group,
                      ih=ih, iw=iw).repeat(x.shape[0], 1, 1, 1)
    dots = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + attention.relative_bias(group, like=q)
    return dots.masked_fill(~valid, -1e6).softmax(dim=-1)


def test_recorded_maps_are_per_block_in_stage_order_and_equal_the_softmax_of_q_and_k():
    model = move_off_initialisation(tiny()).double().eval()
    img = torch.randn(2, 3, 32, 48, dtype=torch.float64)
    inputs = []
    hooks = [layer[0].fn.register_forward_pre_hook(lambda module, args: inputs.append((module, *args)))
             for stage in model.stages for layer in stage.blocks.layers]
    with torch.no_grad():
        logits, maps = Recorder(model)(img)
    for hook in hooks:
        hook.remove()
    # stage 1: 16x24 padded to 18x24, 6x8 groups of 3x3 (SDA), then padded to 18x24, spans of 6, 3x4 spans of 2x2
    # groups (LDA); stage 2: 8x12 padded to 9x12, 3x4 groups, then 12x12, 2x2 spans of 2x2 groups;
    # stage 3: 4x6, no larger than its group of 4: one group of 4x4 a side (padded to 4x8: 2 groups), twice
    assert [tuple(m.shape) for m in maps] == [
        (2 * 48, 1, 9, 9), (2 * 48, 1, 9, 9), (2 * 12, 2, 9, 9), (2 * 16, 2, 9, 9), (2 * 2, 2, 16, 16),
        (2 * 2, 2, 16, 16)]
    with torch.no_grad():
        for recorded, (attention, x, size) in zip(maps, inputs, strict=True):
            torch.testing.assert_close(recorded, expected_attention(attention, x, size), atol=1e-12, rtol=0)
        torch.testing.assert_close(logits, model(img))


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(depth=(2, 0, 1)), ValueError, 'depth of stage 2'),
    (dict(dim=(32, 48.5, 64)), TypeError, 'dim of stage 2'),
    (dict(heads=(1, 5, 2)), ValueError, 'heads 5 of stage 2 must divide its dim 48'),
    (dict(interval=(2, 2)), ValueError, 'one value per stage'),
    (dict(cross_embed_kernel_sizes=((2, 3), (2, 4), (2, 4))), ValueError, 'kernel 3 minus the stride 2 must be even'),
    (dict(cross_embed_kernel_sizes=((1, 4), (2, 4), (2, 4))), ValueError, 'kernel 1 minus the stride 2'),
    (dict(cross_embed_kernel_sizes=4), TypeError, 'cross_embed_kernel_sizes must be a tuple'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny(**overrides)


def test_an_image_the_strides_do_not_divide_is_refused_with_a_size_that_works():
    with pytest.raises(ValueError, match=r'\(30, 48\) must be divisible by 8.*e\.g\. 24x48'):
        tiny()(torch.randn(1, 3, 30, 48))
    with pytest.raises(ValueError, match='channels'):
        tiny()(torch.randn(1, 1, 32, 48))


# the module's example


def test_module_docstring_example_runs_and_says_what_it_gives():
    example = crossformer.__doc__.split('    import torch', 1)[1].split('\nTwo argument sets', 1)[0]
    namespace = {}
    exec(textwrap.dedent('    import torch' + example), namespace)
    assert namespace['logits'].shape == (2, 10)
    assert [tuple(m.shape[-2:]) for m in namespace['maps']] == [(32, 32), (16, 16), (8, 8)]
    assert count(namespace["paper_model"]) == 27_776_794
    assert namespace["official"](torch.randn(1, 3, 64, 64)).shape == (1, 10)
