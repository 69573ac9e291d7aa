"""The N-dimensional ViT: on 2-D input it is the 2-D ViT; a causal dimension never lets a patch see a later
slice; it trains on a CPU for N = 1 to 4; vit-pytorch's weights."""

import pytest
import torch
from einops.layers.torch import Rearrange
from torch import nn

from helpers import (check_a_causal_first_dimension_hides_later_slices, check_it_trains_every_parameter, load_fixture,
                     move_off_initialisation, reference_case)
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.vit import ViT
from vit_pytorch.vit_nd import ViTND

TINY = dict(num_classes=5, dim=16, depth=3, heads=2, dim_head=8, mlp_dim=32, channels=2)


def nd_model(ndim, input_shape, patch_size, **changes):
    torch.manual_seed(0)
    return move_off_initialisation(ViTND(ndim=ndim, input_shape=input_shape, patch_size=patch_size,
                                         **{**TINY, **changes})).eval()


def linear_then_norm(*, channels, patch_size, dim, patch_norm, norm_eps):
    """The 2-D ViT's patch embedding with vit_nd's layout: the patches' Linear, then a LayerNorm (no norm before)."""
    p1, p2 = patch_size
    return nn.Sequential(Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=p1, p2=p2), nn.Identity(),
                         nn.Linear(channels * p1 * p2, dim), nn.LayerNorm(dim, eps=norm_eps))


def test_on_2d_input_it_computes_the_2d_vit_with_the_same_weights():
    """ViTND(ndim=2) is ViT with vit_nd's patch embedding (Linear then LayerNorm): the ViT's weights, keys
    renamed, give the same logits."""
    nd = nd_model(2, (8, 12), 4)
    torch.manual_seed(1)
    vit = ViT(image_size=(8, 12), patch_size=4, patch_embedding=linear_then_norm, **TINY).eval()
    weights = nd.state_dict()
    renamed = {key.replace('to_patch_embedding.2', 'to_patch_embedding.3').replace('to_patch_embedding.1',
                                                                                      'to_patch_embedding.2'): value
               for key, value in weights.items()}
    vit.load_state_dict(renamed, strict=True)
    x = torch.randn(3, 2, 8, 12, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(nd(x), vit(x), rtol=1e-5, atol=1e-6)


def patch_outputs(model, x):
    with torch.no_grad():
        return model(x, return_nd_patches=True)[1]          # (b, dim, *grid)


def test_a_causal_dimension_hides_every_later_slice_exactly():
    """Time (dimension 0, 4 slices of patches) causal: moving frames of slices 2-3 leaves slices 0-1 of every
    patch output bit for bit; the later slices do change."""
    model = nd_model(3, (8, 8, 12), (2, 4, 4), causal_dims=0)
    check_a_causal_first_dimension_hides_later_slices(lambda x: patch_outputs(model, x).movedim(1, -1))


def test_an_earlier_slice_reaches_the_later_ones():
    model = nd_model(3, (8, 8, 12), (2, 4, 4), causal_dims=0)
    x = torch.randn(2, 2, 8, 8, 12, generator=torch.Generator().manual_seed(2))
    earlier = x.clone()
    earlier[:, :, :2] += 1
    assert not torch.allclose(patch_outputs(model, x)[:, :, 3], patch_outputs(model, earlier)[:, :, 3])


def test_a_non_causal_dimension_sees_both_ways():
    """Dimension 1 is not causal when only dimension 0 is: its later rows reach its earlier ones."""
    model = nd_model(3, (8, 8, 12), (2, 4, 4), causal_dims=0)
    x = torch.randn(2, 2, 8, 8, 12, generator=torch.Generator().manual_seed(2))
    later_rows = x.clone()
    later_rows[:, :, :, 4:] += 1
    assert not torch.allclose(patch_outputs(model, x)[:, :, :, 0], patch_outputs(model, later_rows)[:, :, :, 0])


def test_two_causal_dimensions_hide_what_is_later_along_either():
    """Dimensions 0 and 2 causal: patch (t, h, w) depends only on patches (t' <= t, any h, w' <= w). Moving
    the input where t >= 2 or w >= 1 (in patches) leaves the patches with t < 2 and w < 1 exactly."""
    model = nd_model(3, (8, 8, 12), (2, 4, 4), causal_dims=(0, 2))
    x = torch.randn(2, 2, 8, 8, 12, generator=torch.Generator().manual_seed(2))
    moved = x + 1
    moved[:, :, :4, :, :4] = x[:, :, :4, :, :4]
    before, after = patch_outputs(model, x), patch_outputs(model, moved)
    assert torch.equal(before[:, :, :2, :, :1], after[:, :, :2, :, :1])
    assert not torch.allclose(before[:, :, :2, :, 1:], after[:, :, :2, :, 1:])


def test_the_cls_token_of_a_causal_model_reads_every_slice():
    model = nd_model(3, (8, 8, 12), (2, 4, 4), causal_dims=0)
    x = torch.randn(2, 2, 8, 8, 12, generator=torch.Generator().manual_seed(2))
    later = x.clone()
    later[:, :, 6:] += 1
    with torch.no_grad():
        assert not torch.allclose(model(x), model(later))


@pytest.mark.parametrize('ndim, input_shape, patch_size', [
    (1, (12,), (4,)), (2, (8, 12), (4, 4)), (3, (4, 8, 12), (2, 4, 4)), (4, (4, 4, 8, 6), (2, 2, 4, 3))])
def test_it_trains_on_a_cpu_with_a_causal_dimension_every_parameter_getting_a_gradient(ndim, input_shape, patch_size):
    check_it_trains_every_parameter(nd_model(ndim, input_shape, patch_size, causal_dims=0).train(), input_shape)


@pytest.mark.parametrize('ndim, input_shape, patch_size, grid', [
    (1, (12,), (4,), (3,)), (2, (8, 12), (4, 4), (2, 3)), (3, (4, 8, 12), (2, 4, 4), (2, 2, 3)),
    (4, (4, 4, 8, 6), (2, 2, 4, 3), (2, 2, 2, 2))])
def test_return_nd_patches_gives_the_cls_token_and_the_patches_on_their_grid(ndim, input_shape, patch_size, grid):
    model = nd_model(ndim, input_shape, patch_size)
    x = torch.randn(2, 2, *input_shape)
    with torch.no_grad():
        cls, patches = model(x, return_nd_patches=True)
        tokens = model.forward_features(x)
    assert cls.shape == (2, 16) and patches.shape == (2, 16, *grid)
    # patch (i_0, ..., i_{N-1}) is token 1 + its row-major index
    last = tuple(g - 1 for g in grid)
    torch.testing.assert_close(patches[(slice(None), slice(None), *last)], tokens[:, -1], rtol=0, atol=0)
    torch.testing.assert_close(cls, tokens[:, 0], rtol=0, atol=0)


def test_mean_pooling_averages_the_patch_tokens_beside_the_cls_token():
    model = nd_model(3, (4, 8, 12), (2, 4, 4), pool='mean', num_classes=0)
    x = torch.randn(2, 2, 4, 8, 12)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.forward_features(x)[:, 1:].mean(dim=1), rtol=0, atol=0)


def test_forward_intermediates_maps_lay_the_patches_on_the_nd_grid():
    model = nd_model(4, (4, 4, 8, 6), (2, 2, 4, 3))
    maps = model.forward_intermediates(torch.randn(2, 2, 4, 4, 8, 6), output='maps')
    assert [tuple(m.shape) for m in maps] == [(2, 16, 2, 2, 2, 2)] * 3


# vit-pytorch 1.26.14's module (tests/fixtures/make_vit_nd_fixtures.py)


@pytest.mark.parametrize('name', ['vit_pytorch_1.26.14_vit_nd', 'vit_pytorch_1.26.14_vit_nd_mean'])
def test_vit_pytorchs_checkpoint_loads_and_gives_its_outputs(name):
    config, state_dict, x, expected = reference_case(name, 'input_shape', 'patch_size')
    _, _, tensors = load_fixture(name)
    model = load_vit_pytorch(ViTND(**config), state_dict).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)
        cls, patches = model(x, return_nd_patches=True)
    torch.testing.assert_close(cls, tensors['cls'], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(patches, tensors['patches'], rtol=1e-4, atol=1e-5)


def causal_fixture():
    config, state_dict, x, _ = reference_case('vit_pytorch_1.26.14_vit_nd_causal', 'input_shape', 'patch_size',
                                              'causal_dims')
    return config, state_dict, x, load_fixture('vit_pytorch_1.26.14_vit_nd_causal')[2]


def test_vit_pytorchs_causal_model_lets_the_first_slice_see_the_second():
    """The reason its causal checkpoints are refused: in its own outputs, moving the second time slice moves
    the first slice's patches (through the cls token they attend to)."""
    _, _, _, tensors = causal_fixture()
    assert not torch.allclose(tensors['patches'][:, :, 0], tensors['patches_later'][:, :, 0])


def test_ours_with_vit_pytorchs_causal_weights_keeps_the_first_slice_exactly():
    config, state_dict, _, tensors = causal_fixture()
    model = ViTND(**config).eval()
    model.load_state_dict({key: value[0] if key in ('cls_token', 'pos_embedding') else value
                           for key, value in state_dict.items()})
    assert torch.equal(patch_outputs(model, tensors['input'])[:, :, 0],
                       patch_outputs(model, tensors['input_later'])[:, :, 0])


def test_a_causal_model_refuses_vit_pytorchs_checkpoint_naming_the_cls_token():
    config, state_dict, _, _ = causal_fixture()
    with pytest.raises(CheckpointError, match=r'attend to the cls token.*causal_dims=None'):
        load_vit_pytorch(ViTND(**config), state_dict)


# clear errors


@pytest.mark.parametrize('changes, error, match', [
    (dict(ndim=2.0), TypeError, 'ndim'),
    (dict(input_shape=(8, 12)), ValueError, 'input_shape must be an int or a tuple of ndim=3'),
    (dict(input_shape=(4, 8, 10)), ValueError, r'divisible by patch_size .*dimension 2: 10 by 4'),
    (dict(causal_dims=3), ValueError, 'causal_dims must be distinct dimensions between 0 and ndim - 1 = 2'),
    (dict(causal_dims=(0, 0)), ValueError, 'causal_dims'),
    (dict(causal_dims='time'), TypeError, 'causal_dims'),
    (dict(pool='max'), ValueError, 'pool'),
])
def test_a_bad_argument_is_refused_by_name(changes, error, match):
    with pytest.raises(error, match=match):
        ViTND(**{**TINY, 'ndim': 3, 'input_shape': (4, 8, 12), 'patch_size': (2, 4, 4), **changes})


@pytest.mark.parametrize('shape', [(2, 2, 4, 8), (2, 3, 4, 8, 12), (2, 2, 4, 8, 16)])
def test_an_input_of_another_shape_is_refused_with_the_expected_shape(shape):
    model = nd_model(3, (4, 8, 12), (2, 4, 4))
    with pytest.raises(ValueError, match=r'x must have shape \(b, 2, 4, 8, 12\)'):
        model(torch.randn(shape))


def test_another_grid_of_whole_patches_is_refused_saying_the_position_table_fixes_the_grid():
    """Unlike vit_nd_rotary's and vit_nd_pope's ViTND, this one has a learned position table of one row per patch of
    input_shape: twice the frames (whole patches) are refused, the message saying why."""
    model = nd_model(3, (4, 8, 12), (2, 4, 4))
    with pytest.raises(ValueError, match=r'got \(2, 2, 8, 8, 12\): its learned position table holds one row per patch '
                                         r'of input_shape, so it takes no other grid'):
        model(torch.randn(2, 2, 8, 8, 12))


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block (less torch.compile): 4-D occupancy over time, 1024 patches, width 512, depth 6,
    time causal."""
    model = ViTND(ndim=4, input_shape=(8, 16, 32, 64), patch_size=(2, 4, 4, 8), num_classes=1000, dim=512,
                  depth=6, heads=8, mlp_dim=2048, channels=3, dropout=0.1, emb_dropout=0.1, causal_dims=(0,))
    occupancy_time = torch.randn(2, 3, 8, 16, 32, 64)
    with torch.no_grad():
        assert model(occupancy_time).shape == (2, 1000)
        cls_token, patch_embeddings = model(occupancy_time, return_nd_patches=True)
    assert cls_token.shape == (2, 512)
    assert patch_embeddings.shape == (2, 512, 4, 4, 8, 8)
