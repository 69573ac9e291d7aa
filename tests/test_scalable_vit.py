"""ScalableViT against the official code (Yangr116/ScalableViT @ 8011147, run as the reference through
tests/fixtures/make_scalable_vit_fixtures.py), its parameter counts, and the paper's two attentions."""

import math
import textwrap

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from helpers import count, feature_pyramid, load_fixture, move_off_initialisation
from vit_pytorch import scalable_vit
from vit_pytorch.pretrained import CheckpointError, load_official, load_vit_pytorch
from vit_pytorch.scalable_vit import InteractiveWindowAttention, ScalableSelfAttention, ScalableViT
from vit_pytorch.multiscale import PositionEncodingGenerator


def tiny(**overrides):
    """The fixture's architecture: 64x64 images, maps 16, 8, 4, 2; widths 4, 8, 16, 32."""
    return ScalableViT(**{**dict(num_classes=3, dim=4, depth=(2, 3, 2, 2), heads=(1, 2, 2, 4),
                                 reduction_factor=(4, 2, 2, 1), window_size=(4, 4, 2, 2), ssa_dim_key=(5, 8, 4, 8),
                                 ff_expansion_factor=2, head_hidden_dim=16), **overrides})


# the layout its docstring states and the pre-logits (the rest of the face: tests/test_conformance.py)


def test_forward_features_are_the_last_stages_tokens_and_the_pre_logits_the_heads_hidden_layer():
    img = torch.randn(2, 3, 64, 64)
    assert tiny().forward_features(img).shape == (2, 4, 32)
    assert tiny(num_classes=0)(img).shape == (2, 16)                    # the pre-logits: the head's hidden layer
    assert tiny(num_classes=0, head_hidden_dim=None)(img).shape == (2, 32)


# the paper's models: counts of the official code, sum(p.numel() for p in model.parameters()) of
# image_classification/models/scalablevit.py's scalable_vit_small/base/large() (refvenv, 8011147). Its README says
# 32.4M / 81.9M / 104.9M: B agrees to its precision, S (32.0M) and L (109.3M) do not


@pytest.mark.parametrize('variant, expected', [
    ('small', 32_000_472), ('base', 81_881_624), ('large', 109_288_840)])
def test_named_configuration_parameter_counts_equal_the_official_code(variant, expected):
    with torch.device('meta'):
        model = getattr(scalable_vit, f'scalable_vit_{variant}')()
    assert count(model) == expected


def test_base_count_is_the_official_readmes_81_9m():
    with torch.device('meta'):
        assert round(count(scalable_vit.scalable_vit_base()) / 1e6, 1) == 81.9


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match='variant'):
        scalable_vit.scalable_vit('huge')


def test_vit_pytorchs_readme_arguments_build_scalable_vit_s():
    # vit-pytorch's README example: its depth counts pairs of blocks there (75.9M parameters, the count vit-pytorch
    # gave, tests/fixtures/make_scalable_vit_fixtures.py), blocks here: ScalableViT-S
    metadata, _, _ = load_fixture('vit_pytorch_1.26.14_scalable_vit')
    config = {key: tuple(value) if isinstance(value, list) else value
              for key, value in metadata['readme_config'].items()}
    assert round(metadata['readme_parameters'] / 1e6, 1) == 75.9
    with torch.device('meta'):
        model = ScalableViT(**config)
    assert count(model) == 32_000_472


# what the paper adds: IWSA (windows + the local interactive module) and SSA (keys/values scaled in space and width)


def test_blocks_alternate_iwsa_and_ssa_with_the_peg_after_the_first():
    kinds = [[type(layer[0]).__name__ if isinstance(layer[0], PositionEncodingGenerator) else type(layer[0].fn).__name__
              for layer in stage.blocks.layers] for stage in tiny().stages]
    assert kinds[1] == ['InteractiveWindowAttention', 'PositionEncodingGenerator', 'ScalableSelfAttention',
                        'InteractiveWindowAttention']


def changed_tokens(attention, x, index, size):
    moved = x.clone()
    moved[0, index] += torch.randn(x.shape[-1])
    with torch.no_grad():
        changed = (attention(moved, size) - attention(x, size)).abs().amax(-1) > 0
    return rearrange(changed[0], '(h w) -> h w', h=size[0])


def test_iwsa_attends_within_its_window_and_the_lim_reaches_the_neighbours_across_windows():
    attention = move_off_initialisation(InteractiveWindowAttention(4, 2, window_size=3)).eval()
    x = torch.randn(1, 6 * 6, 4)
    rows, cols = torch.meshgrid(torch.arange(6), torch.arange(6), indexing='ij')
    # the token at row 2, column 3: the bottom-left of window (0, 1), on the border with windows (0, 0) and (1, 0)
    window = (rows < 3) & (cols >= 3)
    neighbours = ((rows - 2).abs() <= 1) & ((cols - 3).abs() <= 1)
    assert torch.equal(changed_tokens(attention, x, 2 * 6 + 3, (6, 6)), window | neighbours)
    with torch.no_grad():
        attention.local_interaction.weight.zero_()
    assert torch.equal(changed_tokens(attention, x, 2 * 6 + 3, (6, 6)), window)


def test_iwsa_is_window_attention_plus_a_depthwise_convolution_of_the_values():
    attention = move_off_initialisation(InteractiveWindowAttention(4, 2, window_size=2)).eval()
    x = torch.randn(2, 4 * 4, 4)
    q, k, v = F.linear(F.layer_norm(x, (4,), attention.norm.weight, attention.norm.bias, 1e-6),
                       attention.to_qkv.weight, attention.to_qkv.bias).chunk(3, dim=-1)
    expected = torch.zeros_like(x)
    for top in (0, 2):
        for left in (0, 2):
            tokens = [(top + i) * 4 + left + j for i in range(2) for j in range(2)]
            for head in range(2):
                channels = slice(2 * head, 2 * head + 2)
                qh, kh, vh = (t[:, tokens, channels] for t in (q, k, v))
                weights = (qh @ kh.transpose(-1, -2) / math.sqrt(2)).softmax(-1)
                expected[:, tokens, channels] = weights @ vh
    value_map = v.transpose(1, 2).reshape(2, 4, 4, 4)
    local = F.conv2d(value_map, attention.local_interaction.weight, attention.local_interaction.bias, padding=1,
                     groups=4).flatten(2).transpose(1, 2)
    expected = attention.to_out[0](expected + local)
    with torch.no_grad():
        torch.testing.assert_close(attention(x, (4, 4)), expected, atol=1e-6, rtol=1e-5)


def test_the_lims_convolution_saves_its_own_copy_of_the_values_not_a_view_of_qkv():
    # the convolution keeps its input for the backward: a view of the values' slice would keep all of qkv
    # (3x the values) alive until the backward (scalable_vit_small at batch 8: 48 MiB)
    attention = InteractiveWindowAttention(4, 2, window_size=2).train()
    inputs = []
    attention.local_interaction.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    attention(torch.randn(2, 4 * 4, 4, requires_grad=True), (4, 4))
    values = inputs[0]
    assert values.untyped_storage().nbytes() == values.numel() * values.element_size()


def test_ssa_keys_come_from_the_map_shrunk_by_the_reduction_and_rescaled_in_width():
    attention = move_off_initialisation(ScalableSelfAttention(8, 2, reduction=2, key_dim=6)).eval()
    x = torch.randn(2, 4 * 6, 8)
    normed = F.layer_norm(x, (8,), attention.norm.weight, attention.norm.bias, 1e-6)
    cells = F.conv2d(normed.transpose(1, 2).reshape(2, 8, 4, 6), attention.reduce[0].weight, attention.reduce[0].bias,
                     stride=2, groups=8)                              # (2, 8, 2, 3): one token per 2x2 cell
    widened = F.conv2d(cells, attention.reduce[1].weight, attention.reduce[1].bias).flatten(2).transpose(1, 2)
    context = F.gelu(F.layer_norm(widened, (12,), attention.reduce_norm[0].weight, attention.reduce_norm[0].bias))
    q = F.linear(normed, attention.to_q.weight, attention.to_q.bias).reshape(2, 24, 2, 6).transpose(1, 2)
    k = F.linear(context, attention.to_k.weight, attention.to_k.bias).reshape(2, 6, 2, 6).transpose(1, 2)
    v = F.linear(context, attention.to_v.weight, attention.to_v.bias).reshape(2, 6, 2, 4).transpose(1, 2)
    assert (q.shape[-1], k.shape[-2], v.shape[-1]) == (6, 6, 4)       # keys 6 wide (r_c = 1.5), 6 of them, values 4
    weights = (q @ k.transpose(-1, -2) / math.sqrt(6)).softmax(-1)
    expected = attention.to_out[0]((weights @ v).transpose(1, 2).reshape(2, 24, 8))
    with torch.no_grad():
        torch.testing.assert_close(attention(x, (4, 6)), expected, atol=1e-6, rtol=1e-5)


def test_ssa_lets_every_token_see_every_cell():
    attention = move_off_initialisation(ScalableSelfAttention(4, 2, reduction=3, key_dim=3)).eval()
    assert changed_tokens(attention, torch.randn(1, 6 * 6, 4), 0, (6, 6)).all()


def test_ssa_key_width_is_free_of_the_model_width():
    narrow, wide = (ScalableSelfAttention(16, 2, reduction=2, key_dim=key_dim) for key_dim in (2, 20))
    assert (narrow.to_k.weight.shape, wide.to_k.weight.shape) == ((4, 4), (40, 40))
    assert narrow.to_v.weight.shape == wide.to_v.weight.shape[:1] + (4,) == (16, 4)
    x = torch.randn(1, 16, 16)
    assert narrow(x, (4, 4)).shape == wide(x, (4, 4)).shape == (1, 16, 16)


# the reference: the official code, tiny, noisy weights (tests/fixtures/make_scalable_vit_fixtures.py)


def official_case():
    metadata, state_dict, tensors = load_fixture('official_scalable_vit')
    config = metadata['config']
    model = ScalableViT(
        num_classes=config['num_classes'], dim=config['embed_dims'][0], depth=tuple(config['depths']),
        heads=tuple(config['num_heads']), reduction_factor=tuple(config['sr_ratios']), window_size=tuple(config['wss']),
        ssa_dim_key=tuple(int(d * r) // h for d, r, h in zip(config['embed_dims'], config['c_ratios'],
                                                            config['num_heads'])),
        ff_expansion_factor=config['mlp_ratios'][0], head_hidden_dim=4096)
    return model.eval(), {key: value.float() for key, value in state_dict.items()}, tensors


def test_logits_and_stage_maps_equal_the_official_code():
    model, state_dict, tensors = official_case()
    load_official(model, state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-5, rtol=1e-5)
        maps = model.forward_intermediates(tensors['input'])
    assert len(maps) == 4
    for i, found in enumerate(maps):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-5, rtol=1e-5)


def test_forward_intermediates_returns_the_listed_stages():
    # indices None and an int n: tests/test_conformance.py; a list with a negative number: here
    model, state_dict, tensors = official_case()
    load_official(model, state_dict)
    with torch.no_grad():
        maps = model.forward_intermediates(tensors['input'], indices=[0, -2])
    for found, i in zip(maps, [0, 2], strict=True):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-5, rtol=1e-5)


def test_feature_pyramid_from_forward_intermediates_has_the_official_strides_and_channels():
    model, _, tensors = official_case()
    img = tensors['input']
    # the official stages' outputs give each level's channels and stride
    assert [(info['num_chs'], info['reduction']) for info in model.feature_info] == \
        [(tensors[f'feature.{i}'].shape[1], img.shape[-1] // tensors[f'feature.{i}'].shape[-1]) for i in range(4)]
    maps = model.forward_intermediates(img)
    width = 8
    pyramid = feature_pyramid(maps, model.feature_info, width)
    for level, info in zip(pyramid, model.feature_info):
        assert level.shape == (2, width, 64 // info['reduction'], 64 // info['reduction'])


def test_a_plain_head_checkpoint_in_an_mlp_head_model_says_what_to_build():
    model, state_dict, _ = official_case()
    for name in ('head.0.weight', 'head.0.bias', 'head.1.weight', 'head.1.bias', 'head.3.bias'):
        del state_dict[name]
    state_dict['head.weight'] = state_dict.pop('head.3.weight')[:, :32]
    with pytest.raises(CheckpointError, match='head_hidden_dim=None'):
        load_official(model, state_dict)


def test_loading_without_the_head_keeps_ours():
    model, state_dict, tensors = official_case()
    model.reset_classifier(7)
    load_official(model, {k: v for k, v in state_dict.items() if not k.startswith('head.')}, load_head=False)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_intermediates(tensors['input'], indices=1)[0], tensors['feature.3'],
                                   atol=1e-5, rtol=1e-5)
        assert torch.equal(model(tensors['input']), torch.zeros(2, 7))


# vit-pytorch 1.26.14's ScalableViT computes another function (tests/fixtures/make_scalable_vit_fixtures.py)


def test_vit_pytorch_checkpoint_is_refused_with_what_differs():
    metadata, _, _ = load_fixture('vit_pytorch_1.26.14_scalable_vit')
    config = {key: tuple(value) if isinstance(value, list) else value for key, value in metadata['config'].items()}
    model = ScalableViT(**config)                                     # its keyword arguments build ours
    state_dict = {key: torch.zeros(shape) for key, shape in metadata['shapes'].items()}
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"vit-pytorch's ScalableViT computes another function: each unit of "
                                              r"its depth is an \(SSA, feedforward, IWSA, feedforward\) pair"):
        load_vit_pytorch(model, state_dict)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(depth=(2, 0, 2, 2)), ValueError, 'depth'),
    (dict(depth=2), TypeError, 'depth must be a non-empty tuple'),
    (dict(heads=(1, 3, 2, 4)), ValueError, "heads 3 must divide stage 1's width 8"),
    (dict(heads=(1, 2)), ValueError, r'heads must be one value or one per stage \(4 stages'),
    (dict(ssa_dim_key=(5, 8, 4, 6)), ValueError, 'ssa_dim_key 6 of stage 3 must be its head width 8 where '
                                                 'reduction_factor is 1'),
    (dict(iwsa_dim_key=32), ValueError, 'iwsa_dim_key 32 of stage 0 must be its head width 4'),
    (dict(ssa_dim_value=(4, 4, 8, 9)), ValueError, 'ssa_dim_value 9 of stage 3'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny(**overrides)


def test_an_image_its_windows_do_not_divide_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r'img of 56x56 leaves stage 0 a 14x14 map, which its window_size 4 does '
                                         r'not divide'):
        tiny()(torch.randn(1, 3, 56, 56))


def test_an_image_too_small_for_a_reduction_is_refused_with_the_size_that_works():
    model = tiny(window_size=None)
    with pytest.raises(ValueError, match=r'leaves stage 0 a 2x2 map, smaller than its reduction_factor 4; use images '
                                         r'of at least 16 pixels'):
        model(torch.randn(1, 3, 8, 8))


# the module's example


def test_module_docstring_example_runs_and_says_what_it_gives():
    example = scalable_vit.__doc__.split('    import torch', 1)[1].split('\nThe function', 1)[0]
    namespace = {}
    with torch.device('meta'):
        paper_model = scalable_vit.scalable_vit_small()
    exec(textwrap.dedent('    import torch' + example.replace('scalable_vit_small()', 'None')), namespace)
    assert namespace['logits'].shape == (2, 10)
    assert [tuple(m.shape[-2:]) for m in namespace['maps']] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    assert count(paper_model) == 32_000_472
    assert 'paper_model = scalable_vit_small()' in example
