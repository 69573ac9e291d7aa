import math

import pytest
import torch
import torch.nn.functional as F

from helpers import as_tuples, count, feature_pyramid, load_fixture, move_off_initialisation
from vit_pytorch import multiscale, swin
from vit_pytorch.pretrained import CheckpointError, load_timm, load_vit_pytorch
from vit_pytorch.recorder import Recorder
from vit_pytorch.swin import (CosineWindowAttention, PatchMerging, SwinTransformer, SwinTransformerV2,
                              WindowAttention)


def tiny(cls=SwinTransformer, **overrides):
    """A 3-stage model on 40x48 images: a 10x12 grid the 4x4 windows do not divide, the last stage 3x3."""
    kwargs = dict(img_size=(40, 48), patch_size=4, num_classes=5, embed_dim=8, depths=(2, 2, 2), num_heads=(2, 2, 4),
                  window_size=4, drop_path_rate=0.)
    kwargs.update(overrides)
    return cls(**kwargs)


both = pytest.mark.parametrize('cls', [SwinTransformer, SwinTransformerV2], ids=['v1', 'v2'])


# the face and forward_features' declared layout: tests/test_conformance.py


# the papers' models, counted against timm 1.0.31 (the issue's numbers, and timm's for the others)


@pytest.mark.parametrize('build, expected', [
    (swin.swin_tiny_patch4_window7_224, 28_288_354),
    (swin.swin_small_patch4_window7_224, 49_606_258),
    (swin.swin_base_patch4_window7_224, 87_768_224),
    (swin.swin_base_patch4_window12_384, 87_903_584),
    (swin.swinv2_tiny_window8_256, 28_347_154),
    (swin.swinv2_small_window16_256, 49_728_418),
])
def test_named_configuration_parameter_counts(build, expected):
    with torch.device('meta'):
        model = build()
    assert count(model) == expected


# what Swin adds: windows, shifted windows, relative position bias, patch merging


def receptive_field(attention, size, position):
    """Which input tokens the output token at `position` depends on, as an (h, w) boolean map.

    The mask adds -100, not -inf: masked keys keep weights of e^-100, gradients of about 1e-44.
    """
    x = torch.randn(1, *size, attention.to_out[0].out_features, requires_grad=True)
    attention(x)[0, position[0], position[1]].sum().backward()
    return x.grad[0].abs().sum(-1) > 1e-30


def expected_field(size, rows, cols):
    field = torch.zeros(size, dtype=torch.bool)
    field[rows, cols] = True
    return field


def test_a_window_attends_only_within_itself():
    attention = WindowAttention(8, 2, 4, window_size=(4, 4), shift_size=(0, 0), feature_size=(8, 8))
    assert torch.equal(receptive_field(attention, (8, 8), (5, 2)), expected_field((8, 8), slice(4, 8), slice(0, 4)))


def test_shifted_windows_reach_across_the_unshifted_boundaries_and_the_mask_keeps_wrapped_tokens_apart():
    attention = WindowAttention(8, 2, 4, window_size=(4, 4), shift_size=(2, 2), feature_size=(8, 8))
    # a window shifted by half a window: rows and columns 2..5 together
    assert torch.equal(receptive_field(attention, (8, 8), (3, 4)), expected_field((8, 8), slice(2, 6), slice(2, 6)))
    # the corner window holds the first and last rows and columns, brought together by the cyclic shift; the mask
    # keeps the four regions apart
    assert torch.equal(receptive_field(attention, (8, 8), (0, 7)), expected_field((8, 8), slice(0, 2), slice(6, 8)))


def test_shifted_window_mask_separates_the_regions_the_shift_brought_together():
    window, shift, size = (2, 3), (1, 1), (4, 6)
    mask = multiscale.shifted_window_mask(size, window, shift)
    # regions of the rolled map, written out: rows [0, 2), [2, 3), [3, 4); columns [0, 3), [3, 5), [5, 6)
    row_region, col_region = [0, 0, 1, 2], [0, 0, 0, 1, 1, 2]
    windows = [(r, c) for r in range(0, 4, 2) for c in range(0, 6, 3)]
    assert mask.shape == (4, 6, 6)
    for w, (top, left) in enumerate(windows):
        tokens = [(top + i, left + j) for i in range(2) for j in range(3)]
        for a, (ra, ca) in enumerate(tokens):
            for b, (rb, cb) in enumerate(tokens):
                together = row_region[ra] == row_region[rb] and col_region[ca] == col_region[cb]
                assert mask[w, a, b] == (0. if together else -100.)


def test_relative_position_bias_is_the_table_at_each_pairs_offset():
    attention = WindowAttention(8, 2, 4, window_size=(2, 3), shift_size=(0, 0), feature_size=(2, 3))
    bias = attention.position_bias()
    table = attention.relative_position_bias_table
    positions = [(i, j) for i in range(2) for j in range(3)]
    for a, (ya, xa) in enumerate(positions):
        for b, (yb, xb) in enumerate(positions):
            row = (ya - yb + 1) * 5 + (xa - xb + 2)                    # (2 wh - 1) x (2 ww - 1) = 3 x 5 offsets
            assert torch.equal(bias[:, a, b], table[row])


def test_patch_merging_concatenates_each_2x2_neighbourhood_as_the_paper_does():
    merging = PatchMerging(3, 5)
    x = torch.randn(2, 4, 6, 3)
    # the official code: x0 = x[0::2, 0::2], x1 = x[1::2, 0::2], x2 = x[0::2, 1::2], x3 = x[1::2, 1::2]
    concatenated = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
    torch.testing.assert_close(merging(x), merging.reduction(merging.norm(concatenated)))
    assert merging(torch.randn(2, 5, 7, 3)).shape == (2, 3, 4, 5)      # odd sides: zero-padded


def test_a_stage_no_larger_than_the_window_attends_globally_without_shifting():
    model = tiny()
    last = [layer[0].fn.windows for layer in model.stages[2].blocks.layers]
    assert [(w.window_size, w.shift_size) for w in last] == [((3, 3), (0, 0))] * 2
    first = [layer[0].fn.windows for layer in model.stages[0].blocks.layers]
    assert [(w.window_size, w.shift_size) for w in first] == [((4, 4), (0, 0)), ((4, 4), (2, 2))]


# what V2 adds: scaled cosine attention, log-spaced continuous position bias, residual post-norm


def cosine_attention(**kwargs):
    attention = CosineWindowAttention(8, 2, window_size=(4, 4), shift_size=(0, 0), feature_size=(4, 4), **kwargs)
    return move_off_initialisation(attention).eval()


def test_cosine_attention_ignores_the_length_of_queries_and_keys():
    attention = cosine_attention(qkv_bias=False)
    x = torch.randn(2, 4, 4, 8)
    with torch.no_grad():
        before = attention(x)
        attention.to_qkv.weight[:16] *= 7.0                          # longer queries and keys, same directions
        torch.testing.assert_close(attention(x), before)


def test_cosine_attention_scale_is_capped_at_100():
    attention = cosine_attention()
    x = torch.randn(2, 4, 4, 8)
    with torch.no_grad():
        attention.logit_scale.fill_(math.log(100.))
        capped = attention(x)
        attention.logit_scale.fill_(10.)                             # exp(10) > 100
        torch.testing.assert_close(attention(x), capped)


def test_log_spaced_coordinates_follow_the_papers_formula():
    coords = swin.log_spaced_coordinates((3, 2), (0, 0))
    # offsets -2..2 and -1..1 scaled to [-8, 8], then sign(x) log2(1 + |x|) / log2(8)
    def log_spaced(offset, window):
        return math.copysign(math.log2(1 + abs(8 * offset / (window - 1))), offset) / 3

    expected = [[log_spaced(dy, 3), log_spaced(dx, 2)] for dy in range(-2, 3) for dx in range(-1, 2)]
    torch.testing.assert_close(coords, torch.tensor(expected))
    # a window trained at 3 read at 5: offsets scaled by the pretraining window, reaching past 8
    wider = swin.log_spaced_coordinates((5, 5), (3, 3))
    assert wider[:, 0].max() == pytest.approx(math.log2(1 + 16) / 3)


def test_continuous_position_bias_transfers_to_another_window_and_v1_tables_do_not():
    _, state_dict, _ = load_fixture('timm_swinv2')
    config = as_tuples(load_fixture('timm_swinv2')[0]['config'], 'img_size', 'depths', 'num_heads')
    load_timm(SwinTransformerV2(**dict(config, window_size=6)), state_dict)     # the MLP fits any window
    _, v1_state, _ = load_fixture('timm_swin')
    v1_config = as_tuples(load_fixture('timm_swin')[0]['config'], 'img_size', 'depths', 'num_heads')
    with pytest.raises(CheckpointError, match='relative_position_bias_table'):
        load_timm(SwinTransformer(**dict(v1_config, window_size=6)), v1_state)


def test_v2_blocks_start_as_the_identity():
    model = tiny(SwinTransformerV2)
    x = torch.randn(2, 10, 12, 8)
    torch.testing.assert_close(model.stages[0].blocks(x), x)


# the reference implementation: timm's, written by tests/fixtures/make_swin_fixtures.py


def reference(name, cls):
    metadata, state_dict, tensors = load_fixture(name)
    config = as_tuples(metadata['config'], 'img_size', 'depths', 'num_heads', 'pretrained_window_sizes')
    return load_timm(cls(**config).eval(), state_dict), tensors, metadata


@pytest.mark.parametrize('name, cls', [('timm_swin', SwinTransformer), ('timm_swinv2', SwinTransformerV2)])
def test_logits_and_stage_maps_equal_timms_at_its_size_and_another(name, cls):
    model, tensors, _ = reference(name, cls)
    assert tensors['input'].shape[-2:] == (48, 40) and tensors['input_other'].shape[-2:] == (36, 56)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-4, rtol=0)
        torch.testing.assert_close(model(tensors['input_other']), tensors['logits_other'], atol=1e-4, rtol=0)
        for i, feature in enumerate(model.forward_intermediates(tensors['input'])):
            torch.testing.assert_close(feature, tensors[f'features.{i}'], atol=1e-4, rtol=0)


@pytest.mark.parametrize('name, cls', [('timm_swin', SwinTransformer), ('timm_swinv2', SwinTransformerV2)])
def test_a_feature_pyramid_on_the_stage_maps_has_timms_strides_and_channels(name, cls):
    model, tensors, metadata = reference(name, cls)
    img = tensors['input']
    maps = model.forward_intermediates(img)
    timm_info = metadata['feature_info']
    assert [(info['num_chs'], info['reduction']) for info in model.feature_info] == \
        [(info['num_chs'], info['reduction']) for info in timm_info]
    for feature, info in zip(maps, timm_info):
        assert feature.shape[1] == info['num_chs']
        assert feature.shape[-2:] == tuple(math.ceil(side / info['reduction']) for side in img.shape[-2:])
    assert feature_pyramid(maps, model.feature_info, 6)[0].shape == (2, 6, 12, 10)


def test_intermediates_take_the_chosen_stages():
    model = tiny().eval()
    img = torch.randn(1, 3, 40, 48)
    with torch.no_grad():
        every = model.forward_intermediates(img)
        assert [m.shape[1] for m in model.forward_intermediates(img, indices=2)] == [16, 32]
        chosen = model.forward_intermediates(img, indices=[-1, 0])
    torch.testing.assert_close(chosen[0], every[2])
    torch.testing.assert_close(chosen[1], every[0])


def test_v1_checkpoint_is_refused_by_v2_and_the_other_way_round():
    _, v1_state, _ = load_fixture('timm_swin')
    _, v2_state, _ = load_fixture('timm_swinv2')
    with pytest.raises(CheckpointError, match='load it into SwinTransformer'):
        load_timm(tiny(SwinTransformerV2), v1_state)
    with pytest.raises(CheckpointError, match='load it into SwinTransformerV2'):
        load_timm(tiny(), v2_state)


def test_qkv_bias_mismatch_and_the_original_layout_are_refused_by_name():
    metadata, state_dict, _ = load_fixture('timm_swin')
    config = as_tuples(metadata['config'], 'img_size', 'depths', 'num_heads')
    with pytest.raises(CheckpointError, match='qkv_bias=True'):
        load_timm(SwinTransformer(**dict(config, qkv_bias=False)), state_dict)
    original = dict(state_dict, **{'layers.0.blocks.0.attn.relative_position_index': torch.zeros(16, 16)})
    with pytest.raises(CheckpointError, match='original Microsoft layout'):
        load_timm(SwinTransformer(**config), original)


def test_vit_pytorch_has_no_swin_checkpoints_to_load():
    with pytest.raises(TypeError, match='no vit-pytorch checkpoints exist for SwinTransformer; it loads: timm'):
        load_vit_pytorch(tiny(), {})


# the recorder: one map per block, (b * windows, heads, n, n), the softmax of q and k


def expected_window_attention(attention, x):
    """softmax(q k^T / sqrt(d) + bias + mask) of every window, written out with loops and explicit indexing."""
    window, shift = attention.windows.window_size, attention.windows.shift_size
    x = attention.norm(x)
    b, h, w, c = x.shape
    x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    hp, wp = -(-h // window[0]) * window[0], -(-w // window[1]) * window[1]
    padded = torch.zeros(b, hp, wp, c)
    padded[:, :h, :w] = x

    def region(index, length, size, offset):
        return 0 if index < length - size else 1 if offset == 0 or index < length - offset else 2

    maps = []
    for sample in range(b):
        for top in range(0, hp, window[0]):
            for left in range(0, wp, window[1]):
                cells = [(top + i, left + j) for i in range(window[0]) for j in range(window[1])]
                tokens = torch.stack([padded[sample, r, col] for r, col in cells])
                q, k, _ = attention.to_qkv(tokens).chunk(3, dim=-1)
                q, k = q.view(len(cells), attention.heads, -1), k.view(len(cells), attention.heads, -1)
                logits = torch.einsum('ihd,jhd->hij', q, k) / math.sqrt(q.shape[-1])
                for a, (ra, ca) in enumerate(cells):
                    for bb, (rb, cb) in enumerate(cells):
                        offset = (ra - rb + window[0] - 1) * (2 * window[1] - 1) + (ca - cb + window[1] - 1)
                        logits[:, a, bb] += attention.relative_position_bias_table[offset]
                        apart = any(shift) and (
                            region(ra, hp, window[0], shift[0]) != region(rb, hp, window[0], shift[0])
                            or region(ca, wp, window[1], shift[1]) != region(cb, wp, window[1], shift[1]))
                        logits[:, a, bb] -= 100. if apart else 0.
                maps.append(logits.softmax(dim=-1))
    return torch.stack(maps)


def test_recorded_maps_are_per_block_per_window_and_equal_the_softmax_of_q_and_k():
    model = move_off_initialisation(tiny()).eval()
    img = torch.randn(2, 3, 40, 48)
    inputs = []
    hooks = [layer[0].fn.register_forward_hook(lambda module, args, out: inputs.append((module, args[0])))
             for stage in model.stages for layer in stage.blocks.layers]
    with torch.no_grad():
        logits, attns = Recorder(model)(img)
    for hook in hooks:
        hook.remove()
    # stage 0: a 10x12 map padded to 12x12, 9 windows of 4x4; stage 1: 5x6 padded to 8x8, 4 windows; stage 2: one 3x3
    assert [tuple(m.shape) for m in attns] == [(2 * 9, 2, 16, 16)] * 2 + [(2 * 4, 2, 16, 16)] * 2 + [(2, 4, 9, 9)] * 2
    with torch.no_grad():
        for recorded, (attention, x) in zip(attns, inputs):
            torch.testing.assert_close(recorded, expected_window_attention(attention, x), atol=1e-5, rtol=0)
        torch.testing.assert_close(logits, model(img), atol=1e-5, rtol=0)     # fused and explicit paths agree


def test_window_maps_laid_on_the_stage_grid_put_each_pair_where_its_tokens_are():
    model = move_off_initialisation(tiny()).eval()
    with torch.no_grad():
        recorder = Recorder(model)
        recorder(torch.randn(2, 3, 40, 48))
    full, size = model.attention_on_grid(recorder.maps, (40, 48), stage=0)
    assert size == (10, 12) and full.shape == (2, 2, 2, 120, 120)      # (b, blocks, heads, h * w, h * w)
    shifted = recorder.maps[1].view(2, 9, 2, 16, 16)                    # block 1 shifts by 2: 9 windows of 4x4

    def window_of(token):                                               # its window and place after the shift
        row, col = (token // 12 - 2) % 10, (token % 12 - 2) % 12
        return (row // 4) * 3 + col // 4, (row % 4) * 4 + col % 4

    for query in range(0, 120, 7):
        for key in range(120):
            (window, i), (other, j) = window_of(query), window_of(key)
            expected = shifted[:, window, :, i, j] if window == other else torch.zeros(2, 2)
            assert torch.equal(full[:, 1, :, query, key], expected)
    last, last_size = model.attention_on_grid(recorder.maps, (40, 48), stage=-1)
    torch.testing.assert_close(last[:, 1], recorder.maps[5])           # one 3x3 window: the map itself


# weight decay


def sdpa_kernels(fn):
    """The names of the scaled_dot_product_attention kernels that `fn()` runs (torch.profiler)."""
    with torch.profiler.profile() as prof:
        fn()
    return {e.name for e in prof.events() if e.name.startswith('aten::_scaled_dot_product')}


@both
def test_training_on_the_cpu_takes_the_explicit_product_with_the_fused_kernels_outputs_and_gradients(cls):
    # with the learned bias in its mask, scaled_dot_product_attention would run its (slower) math kernel in training;
    # vit.attend takes the explicit product there
    model = move_off_initialisation(tiny(cls)).train()
    img = torch.randn(2, 3, 40, 48)

    def step():
        model.zero_grad(set_to_none=True)
        out = model(img)
        out.square().sum().backward()
        return out.detach(), {name: p.grad for name, p in model.named_parameters()}

    assert sdpa_kernels(step) == set()
    out, grads = step()
    # the same step through scaled_dot_product_attention (its math kernel, given the bias's gradient)
    original = swin.attend_windows
    try:
        swin.attend_windows = lambda attention, q, k, v, *, scale, mask: F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale)
        assert sdpa_kernels(step) == {'aten::_scaled_dot_product_attention_math'}
        sdpa_out, sdpa_grads = step()
    finally:
        swin.attend_windows = original
    torch.testing.assert_close(out, sdpa_out, atol=1e-5, rtol=0)
    assert grads.keys() == sdpa_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, sdpa_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    with torch.no_grad():                                              # inference keeps the fused kernel
        assert 'aten::_scaled_dot_product_flash_attention_for_cpu' in sdpa_kernels(lambda: model.eval()(img))


def test_no_weight_decay_names_what_timm_exempts():
    assert tiny().no_weight_decay() == {f'stages.{i}.blocks.layers.{j}.0.fn.relative_position_bias_table'
                                        for i in range(3) for j in range(2)}
    names = tiny(SwinTransformerV2).no_weight_decay()
    assert len(names) == 6 * 4 and all('cpb_mlp' in name or name.endswith('logit_scale') for name in names)


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(img_size=42), ValueError, 'img_size .* patch_size'),
    (dict(depths=()), TypeError, 'depths'),
    (dict(depths=(2, 0, 2)), ValueError, 'depths'),
    (dict(num_heads=(2, 2)), ValueError, 'num_heads'),
    (dict(num_heads=(2, 3, 4)), ValueError, 'num_heads 3 must divide'),
    (dict(mlp_ratio=0.), ValueError, 'mlp_ratio'),
    (dict(in_chans=2.0), TypeError, 'in_chans'),
    (dict(dynamic_img_size=1), TypeError, 'dynamic_img_size'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny(**overrides)


def test_bad_pretrained_window_sizes_are_refused():
    with pytest.raises(ValueError, match='pretrained_window_sizes'):
        tiny(SwinTransformerV2, pretrained_window_sizes=(8, 8))
    with pytest.raises(ValueError, match='pretrained_window_sizes'):
        tiny(SwinTransformerV2, pretrained_window_sizes=(8, -1, 8))


def test_other_image_sizes_need_dynamic_img_size_and_whole_patches():
    with pytest.raises(ValueError, match=r'img must be 40x48.*dynamic_img_size=True'):
        tiny()(torch.randn(1, 3, 48, 48))
    model = tiny(dynamic_img_size=True).eval()
    assert model(torch.randn(1, 3, 20, 68)).shape == (1, 5)
    with pytest.raises(ValueError, match='img height and width .* divisible by patch_size'):
        model(torch.randn(1, 3, 42, 48))
