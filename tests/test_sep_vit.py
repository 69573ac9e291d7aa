"""SepViT against its paper and its official code.

References: the authors' code (github liwei109/SepViT @ 2b420d3, classification/sepvit.py) through
fixtures it wrote (tests/fixtures/make_sep_vit_fixtures.py), the parameter counts it gives, the
paper's counts (arXiv 2203.15380, Table 1) and the formulas of its section 3.
"""

import math
import textwrap

import pytest
import torch
from einops import rearrange, repeat
from torch import nn

from helpers import count, feature_pyramid, load_fixture, move_off_initialisation
from vit_pytorch import sep_vit
from vit_pytorch.pretrained import CheckpointError, load_official, load_vit_pytorch
from vit_pytorch.sep_vit import SeparableAttention, SepViT
from vit_pytorch.multiscale import PositionEncodingGenerator


def tiny(**overrides):
    """Four stages on 64x64 images: maps 16x16, 8x8, 4x4, 2x2; stage 2 has 16 windows of 2x2, then 4 grouped
    windows of 4x4; stage 3 4 windows, then one; stage 4 one window."""
    return SepViT(**{'num_classes': 5, 'image_size': 64, 'dim': 8, 'depth': (1, 2, 2, 1), 'heads': (1, 2, 2, 4),
                     'window_size': 2, 'grouped_window_size': 4, 'ff_mult': 2, **overrides})


def blocks(model):
    """The SeparableAttention of every block, in stage and block order."""
    return [layer[0].fn for stage in model.stages for layer in stage.blocks.layers if hasattr(layer[0], 'fn')]


# the face and forward_features' declared layout: tests/test_conformance.py


def test_a_non_square_image_with_windows_per_stage():
    model = tiny(image_size=(64, 32), window_size=(2, 2, 2, 1), grouped_window_size=(4, 4, 2, 1))
    maps = model.forward_intermediates(torch.randn(1, 3, 64, 32))
    assert [tuple(m.shape[-2:]) for m in maps] == [(16, 8), (8, 4), (4, 2), (2, 1)]
    assert [block.window_tokens.shape[0] for block in blocks(model)] == [32, 8, 2, 2, 2, 2]


def test_vit_pytorchs_readme_arguments_build_a_model():
    # vit-pytorch's README: SepViT(num_classes=1000, dim=32, dim_head=32, heads=(1, 2, 4, 8), depth=(1, 2, 6, 2),
    # window_size=7, dropout=0.1): heads of 32 channels, the width doubling per stage
    with torch.device('meta'):
        model = SepViT(num_classes=1000, dim=32, dim_head=32, heads=(1, 2, 4, 8), depth=(1, 2, 6, 2), window_size=7,
                       dropout=0.1)
    assert [info['num_chs'] for info in model.feature_info] == [32, 64, 128, 256]
    assert [blocks(model)[i].dsa.heads for i in (0, 1, 3, 9)] == [1, 2, 4, 8]
    metadata, _, _ = load_fixture('vit_pytorch_1.26.14_sep_vit')
    config = {key: tuple(value) if isinstance(value, list) else value for key, value in metadata['config'].items()}
    assert SepViT(**config)(torch.randn(1, 3, 224, 224)).shape == (1, 5)


# the paper's models: counts of the official code (sum of numel of the parameters of its SepViT_Tiny/Small/Base,
# make_sep_vit_fixtures.py full-size) and the paper's Table 1


@pytest.mark.parametrize('variant, official, paper', [
    ('tiny', 31_182_856, 31.2), ('small', 46_570_504, 46.6), ('base', 82_377_064, 82.3)])
def test_named_configuration_parameter_counts(variant, official, paper):
    with torch.device('meta'):
        model = getattr(sep_vit, f'sep_vit_{variant}')()
    assert count(model) == official
    # the paper rounds T and S; its 82.3M for B is 0.077M under the official code's count (82.4M rounded)
    assert round(count(model) / 1e6, 1) == (82.4 if variant == 'base' else paper)


def test_the_named_models_window_sizes_are_the_official_codes():
    # ws of the official SepViT_Tiny and SepViT_Small: [[7], [7, 14], [7, 14] * k, [7, 7]]
    assert sep_vit.sep_vit_tiny.__module__ == 'vit_pytorch.sep_vit'
    with torch.device('meta'):
        tiny_model, small_model = sep_vit.sep_vit_tiny(), sep_vit.sep_vit_small()
    assert tiny_model.windows == [[7], [7, 14], [7, 14] * 3, [7, 7]]
    assert small_model.windows == [[7], [7, 14], [7, 14] * 7, [7, 7]]
    # one window token per window where a block has several windows: 64, 16, 4, 4, 1, ... at 224
    assert [0 if b.window_tokens is None else b.window_tokens.shape[0] for b in blocks(tiny_model)] == \
        [64, 16, 4, 4, 0, 4, 0, 4, 0, 0, 0]


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match='variant'):
        sep_vit.sep_vit('huge')


# what SepViT adds: depthwise self-attention (DSA) within windows with a window token, pointwise self-attention
# (PSA) among the windows, grouped self-attention (larger windows in every second block)


def dsa_outputs(attention, x, size):
    """The DSA step's output (b, windows, 1 + n, dim), read by a hook."""
    seen = []
    hook = attention.dsa.register_forward_hook(lambda module, args, output: seen.append(output))
    with torch.no_grad():
        attention(x, size)
    hook.remove()
    return seen[0]


def changed_tokens_of_the_dsa(window_size, moved_token):
    """Which tokens of a 8x8 map the DSA output changes at, as an (8, 8) map, when one token moves."""
    windows = (8 // window_size) ** 2
    attention = move_off_initialisation(SeparableAttention(4, 2, window_size=window_size, windows=windows)).eval()
    x = torch.randn(1, 64, 4)
    moved = x.clone()
    moved[0, moved_token] += torch.randn(4)
    changed = (dsa_outputs(attention, moved, (8, 8)) - dsa_outputs(attention, x, (8, 8))).abs().amax(-1) > 0
    window_token_changed = changed[0, :, 0]
    side = 8 // window_size
    tokens = rearrange(changed[0, :, 1:], '(nh nw) (wh ww) -> (nh wh) (nw ww)', nh=side, wh=window_size)
    return tokens, window_token_changed


def test_depthwise_self_attention_stays_within_its_window_and_its_window_token():
    # the token at row 1, column 5 lies in window (0, 2) of 2x2 windows: window number 2
    tokens, window_tokens = changed_tokens_of_the_dsa(2, 1 * 8 + 5)
    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(8), indexing='ij')
    assert torch.equal(tokens, (rows < 2) & (cols >= 4) & (cols < 6))
    assert window_tokens.tolist() == [i == 2 for i in range(16)]


def test_grouped_self_attention_windows_are_the_larger_groups():
    # the same token, in 4x4 grouped windows: its whole group of four 2x2 windows, window (0, 1)
    tokens, window_tokens = changed_tokens_of_the_dsa(4, 1 * 8 + 5)
    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(8), indexing='ij')
    assert torch.equal(tokens, (rows < 4) & (cols >= 4))
    assert window_tokens.tolist() == [False, True, False, False]
    model = tiny()
    assert model.windows == [[2], [2, 4], [2, 4], [2]]
    assert [None if b.psa is None else b.window_tokens.shape[0] for b in blocks(model)] == [64, 16, 4, 4, None, None]


def test_pointwise_self_attention_mixes_whole_windows_by_their_tokens_attention():
    # PSA's output at place n of window i is sum_j a_ij (the DSA output at place n of window j) plus its input,
    # per head, a from softmax(q k^T / sqrt(d)) of the window tokens after LayerNorm and GELU (paper eq. 3-4)
    attention = move_off_initialisation(SeparableAttention(8, 2, window_size=2, windows=4)).double().eval()
    x = torch.randn(2, 16, 8, dtype=torch.float64)
    out = dsa_outputs(attention, x, (4, 4)) + attention.norm(torch.cat((
        repeat(attention.window_tokens, 'w d -> b w 1 d', b=2),
        rearrange(x, 'b (nh wh nw ww) d -> b (nh nw) (wh ww) d', nh=2, wh=2, ww=2)), dim=2))
    tokens, maps = out[:, :, 0], out[:, :, 1:]
    psa = attention.psa
    q, k = rearrange(psa.to_qk(nn.functional.gelu(psa.norm(tokens))), 'b w (qk h d) -> qk b h w d', qk=2, h=2)
    weights = (q @ k.transpose(-1, -2) / math.sqrt(4)).softmax(dim=-1)                 # (b, heads, 4, 4)
    mixed = torch.einsum('bhij,bjnhd->binhd', weights, rearrange(maps, 'b w n (h d) -> b w n h d', h=2))
    expected = attention.to_out(rearrange(rearrange(mixed, 'b i n h d -> b i n (h d)') + maps,
                                          'b (nh nw) (wh ww) d -> b (nh wh nw ww) d', nh=2, wh=2))
    with torch.no_grad():
        torch.testing.assert_close(attention(x, (4, 4)), expected, atol=1e-12, rtol=0)


def test_one_token_reaches_every_window_through_the_window_tokens():
    attention = move_off_initialisation(SeparableAttention(4, 2, window_size=2, windows=16)).eval()
    x = torch.randn(1, 64, 4)
    moved = x.clone()
    moved[0, 0] += torch.randn(4)
    with torch.no_grad():
        changed = (attention(moved, (8, 8)) - attention(x, (8, 8))).abs().amax(-1) > 0
    assert changed.all()


def test_the_peg_gives_positions_from_the_zero_padding():
    peg = move_off_initialisation(PositionEncodingGenerator(4)).eval()
    with torch.no_grad():
        out = rearrange(peg(torch.ones(1, 5 * 5, 4), (5, 5)), '1 (h w) d -> h w d', h=5)
    assert torch.allclose(out[1:4, 1:4], out[2, 2].expand(3, 3, 4))
    assert not torch.allclose(out[0, 2], out[2, 2])


# the reference: the official code, tiny, noisy weights, at 224 (tests/fixtures/make_sep_vit_fixtures.py)


def official_case():
    metadata, state_dict, tensors = load_fixture('official_sep_vit')
    config = metadata['config']
    assert config['ws'] == [[7], [7, 14], [7, 14], [7, 7]]
    model = SepViT(num_classes=config['num_classes'], dim=config['embed_dims'][0], depth=tuple(config['depths']),
                   heads=tuple(config['num_heads']), ff_mult=tuple(config['mlp_ratios']), image_size=config['img_size'])
    img = tensors['input_28'].repeat_interleave(8, dim=-2).repeat_interleave(8, dim=-1)
    return model, state_dict, img, tensors


def test_logits_and_stage_maps_equal_the_official_codes():
    model, state_dict, img, tensors = official_case()
    model = load_official(model.eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(img), tensors['logits'], atol=1e-5, rtol=1e-5)
        maps = model.forward_intermediates(img[:1])
    for i, found in enumerate(maps):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-5, rtol=1e-5)


def test_forward_intermediates_returns_the_listed_stages():
    # indices None and an int n: tests/test_conformance.py; a list with a negative number: here
    model, state_dict, img, tensors = official_case()
    model = load_official(model.eval(), state_dict)
    with torch.no_grad():
        maps = model.forward_intermediates(img[:1], indices=[0, -2])
    for found, i in zip(maps, [0, 2], strict=True):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-5, rtol=1e-5)


def test_feature_info_gives_the_official_stage_maps_strides_and_channels():
    model, _, img, tensors = official_case()
    official = [tensors[f'feature.{i}'] for i in range(4)]
    assert [(info['num_chs'], info['reduction']) for info in model.feature_info] == \
        [(m.shape[1], img.shape[-1] // m.shape[-1]) for m in official]
    maps = model.forward_intermediates(img[:1])
    width = 8
    pyramid = feature_pyramid(maps, model.feature_info, width)
    assert [tuple(level.shape) for level in pyramid] == [(1, width, *m.shape[-2:]) for m in official]


def test_an_official_checkpoint_in_a_model_of_other_windows_says_what_to_build():
    model, state_dict, _, _ = official_case()
    model = SepViT(num_classes=5, dim=4, depth=(1, 2, 2, 2), heads=(1, 2, 2, 4), ff_mult=(2, 2, 4, 2),
                   grouped_window_size=28)
    with pytest.raises(CheckpointError, match=r"block 1.1 has window tokens .* build the model at the checkpoint's"):
        load_official(model, state_dict)


# vit-pytorch 1.26.14's SepViT computes another function (tests/fixtures/make_sep_vit_fixtures.py)


def test_vit_pytorch_checkpoint_is_refused_with_what_differs():
    metadata, _, _ = load_fixture('vit_pytorch_1.26.14_sep_vit')
    config = {key: tuple(value) if isinstance(value, list) else value for key, value in metadata['config'].items()}
    model = SepViT(**config)
    state_dict = {key: torch.zeros(shape) for key, shape in metadata['shapes'].items()}
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"vit-pytorch's SepViT computes another function: it has no grouped"):
        load_vit_pytorch(model, state_dict)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(depth=(1, 2, 2)), TypeError, 'depth must be a tuple of 4'),
    (dict(depth=(1, 0, 2, 1)), ValueError, 'depth'),
    (dict(heads=(1, 3, 2, 4)), ValueError, 'heads 3 of stage 2 must divide its width 16'),
    (dict(heads=(1, 2)), ValueError, 'heads must be an int or 4 values'),
    (dict(dim_head=4), ValueError, 'dim_head must be None or each stage.s width over its heads'),
    (dict(window_size=3), ValueError, "window_size 3 must divide the 16x16 map of stage 1"),
    (dict(grouped_window_size=(4, 3, 4, 4)), ValueError, "grouped_window_size 3 must divide the 8x8 map of stage 2"),
    (dict(ff_mult=None), TypeError, 'ff_mult'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny(**overrides)


def test_an_image_of_another_size_is_refused_with_the_models_size():
    with pytest.raises(ValueError, match=r"img must be 64x64 \(h x w\), the model's image_size .*got 32x32"):
        tiny()(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match='channels'):
        tiny()(torch.randn(1, 1, 64, 64))


# the module's example


def test_module_docstring_example_runs_and_says_what_it_gives():
    example = sep_vit.__doc__.split('    import torch', 1)[1].split('\nSource:', 1)[0]
    namespace = {}
    exec(textwrap.dedent('    import torch' + example), namespace)
    assert namespace['logits'].shape == (2, 10)
    assert [tuple(m.shape[-2:]) for m in namespace['maps']] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    assert count(namespace['paper_model']) == 31_182_856
