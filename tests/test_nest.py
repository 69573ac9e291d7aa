import math
import textwrap

import pytest
import torch
from torch import nn

from helpers import count, feature_pyramid, load_fixture, move_off_initialisation
from vit_pytorch import nest
from vit_pytorch.nest import Aggregate, NesT
from vit_pytorch.pretrained import CheckpointError, load_timm, load_vit_pytorch


def tiny(**overrides):
    """Three levels on 32x32 images, patches of 4: maps 8x8 (16 blocks of 2x2), 4x4 (4 blocks), 2x2 (one)."""
    kwargs = dict(image_size=32, patch_size=4, num_classes=5, dim=8, heads=1, num_hierarchies=3,
                  block_repeats=(2, 1, 2), mlp_mult=2)
    kwargs.update(overrides)
    return NesT(**kwargs)


# the face and forward_features' declared layout: tests/test_conformance.py


def test_vit_pytorchs_readme_arguments_build_a_model():
    model = NesT(image_size=224, patch_size=4, dim=96, heads=3, num_hierarchies=3, block_repeats=(2, 2, 8),
                 num_classes=1000)
    assert model.dims == (96, 192, 384)
    assert [level.pos_embedding.shape for level in model.levels] == [(16, 196, 96), (4, 196, 192), (1, 196, 384)]


# the paper's models (counts of the reference implementation, timm 1.0.31's nest_*)


@pytest.mark.parametrize('variant, expected', [('tiny', 17_057_608), ('small', 38_351_176), ('base', 67_723_368)])
def test_named_configuration_parameter_counts(variant, expected):
    with torch.device('meta'):
        model = getattr(nest, f'nest_{variant}')()
    assert count(model) == expected


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match='variant'):
        nest.nest('huge')


# what NesT adds: Transformers within blocks that do not talk, and aggregation between levels


def test_blocks_of_a_level_do_not_talk_to_each_other():
    model = move_off_initialisation(tiny()).eval()
    level = model.levels[0]
    x = torch.randn(1, 8, 8, 8)
    moved = x.clone()
    moved[0, :, 1, 5] += torch.randn(8)           # a token of block (0, 2): rows 0-1, columns 4-5
    with torch.no_grad():
        changed = (level(moved) - level(x)).abs().amax(1)[0] > 0
    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(8), indexing='ij')
    assert torch.equal(changed, (rows < 2) & (cols >= 4) & (cols < 6))


def test_aggregation_halves_the_map_by_a_max_pool_of_the_normed_convolution():
    aggregate = move_off_initialisation(Aggregate(4, 6)).eval()
    x = torch.randn(2, 4, 6, 8)
    with torch.no_grad():
        conv = nn.functional.conv2d(x, aggregate.conv.weight, aggregate.conv.bias, padding=1)
        normed = nn.functional.layer_norm(conv.permute(0, 2, 3, 1), (6,), aggregate.norm.weight, aggregate.norm.bias,
                                          eps=1e-6).permute(0, 3, 1, 2)
        padded = nn.functional.pad(normed, (1, 1, 1, 1), value=-math.inf)
        expected = padded.unfold(2, 3, 2).unfold(3, 3, 2).amax(dim=(-2, -1))
        torch.testing.assert_close(aggregate(x), expected)
    assert expected.shape == (2, 6, 3, 4)


# the reference: timm's Nest, tiny, noisy weights (tests/fixtures/make_nest_fixtures.py)


def timm_case():
    metadata, state_dict, tensors = load_fixture('timm_nest')
    config = metadata['config']
    model = NesT(image_size=config['img_size'], patch_size=config['patch_size'], num_classes=config['num_classes'],
                 dim=config['embed_dims'][0], heads=config['num_heads'][0], num_hierarchies=config['num_levels'],
                 block_repeats=tuple(config['depths']), mlp_mult=int(config['mlp_ratio']))
    return model, metadata, state_dict, tensors


def test_logits_and_feature_maps_equal_timms():
    model, _, state_dict, tensors = timm_case()
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-4, rtol=1e-4)
        maps = model.forward_intermediates(tensors['input'])
    for i, found in enumerate(maps):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


def test_feature_pyramid_from_forward_intermediates_has_timms_strides_and_channels():
    model, metadata, _, tensors = timm_case()
    assert model.feature_info == metadata['feature_info']
    img = tensors['input']
    maps = model.forward_intermediates(img)
    width = 8
    pyramid = feature_pyramid(maps, model.feature_info, width)
    for level, info in zip(pyramid, model.feature_info):
        assert level.shape == (2, width, 32 // info['reduction'], 32 // info['reduction'])


def test_forward_intermediates_returns_the_listed_levels():
    # indices None and an int n: tests/test_conformance.py; a list with a negative number: here
    model, _, state_dict, tensors = timm_case()
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        maps = model.forward_intermediates(tensors['input'], indices=[0, -1])
    for found, i in zip(maps, [0, 2], strict=True):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


# vit-pytorch 1.26.14's NesT computes another function (tests/fixtures/make_nest_fixtures.py)


def test_vit_pytorch_checkpoint_is_refused_with_what_differs():
    metadata, state_dict, _ = load_fixture('vit_pytorch_1.26.14_nest')
    config = dict(metadata['config'], block_repeats=tuple(metadata['config']['block_repeats']))
    model = NesT(**config)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"vit-pytorch's NesT computes another function: its position embedding"):
        load_vit_pytorch(model, state_dict)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(image_size=(32, 64)), ValueError, r'image_size must be square'),
    (dict(image_size=24), ValueError, r'image_size 24 must be divisible by patch_size 4 times 2 \*\* \(num_hierarchies'),
    (dict(heads=3), ValueError, 'heads 3 must divide dim 8'),
    (dict(block_repeats=(1, 1)), ValueError, 'block_repeats'),
    (dict(block_repeats=(1, 0, 1)), ValueError, 'block_repeats'),
    (dict(dim_head=64), ValueError, 'dim_head 64 must be'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny(**overrides)


def test_another_image_size_is_refused():
    with pytest.raises(ValueError, match='img must be 32x32'):
        tiny()(torch.randn(1, 3, 64, 64))


def test_dim_head_equal_to_the_width_per_head_is_accepted():
    assert tiny(dim_head=8)(torch.randn(1, 3, 32, 32)).shape == (1, 5)


# the module's example


def test_module_docstring_example_runs_and_says_what_it_gives():
    example = nest.__doc__.split('    import torch', 1)[1].split('\nThe keyword', 1)[0]
    namespace = {}
    exec(textwrap.dedent('    import torch' + example), namespace)
    assert namespace['logits'].shape == (2, 10)
    assert [tuple(m.shape) for m in namespace['maps']] == [(2, 32, 16, 16), (2, 64, 8, 8), (2, 128, 4, 4)]
    assert count(namespace['paper_model']) == 17_057_608
