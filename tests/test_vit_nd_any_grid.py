"""The N-D ViTs with rotary and polar positions take any input whose sides are multiples of the patch sizes, as
vit-pytorch 1.26.14's do (they read the grid from the input): the positions and the causal mask are the input
grid's, the weights, frequencies and PoPE's offset the trained ones. Without causal dimensions the logits on a longer
or shorter grid are vit-pytorch's; with them a later slice never reaches an earlier one on the longer grid (where
vit-pytorch's mask, kept at the built grid, wraps time round its length); on any grid the model computes the model
rebuilt for that grid with the same weights, bit for bit."""

import pytest
import torch

from helpers import check_a_causal_first_dimension_hides_later_slices, load_fixture, move_off_initialisation
from helpers import reference_case
from vit_pytorch import vit_nd_pope, vit_nd_rotary
from vit_pytorch.pretrained import load_vit_pytorch

MODULES = {'vit_nd_rotary': vit_nd_rotary, 'vit_nd_pope': vit_nd_pope}
TINY = dict(ndim=3, patch_size=(2, 4, 4), num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, channels=2)


def vit_pytorch_model(name, input_shape=None):
    """Our model holding the weights of vit-pytorch's fixture `name` (built there for 4 x 8 x 12: 2 slices of
    time), built for `input_shape` (None: the fixture's)."""
    config, state_dict, _, _ = reference_case(f'vit_pytorch_1.26.14_{name}', 'input_shape', 'patch_size',
                                              'causal_dims')
    config = {**config, 'input_shape': input_shape or config['input_shape']}
    return load_vit_pytorch(MODULES[name.removesuffix('_causal')].ViTND(**config), state_dict).eval()


def tiny_model(name, input_shape, **changes):
    torch.manual_seed(0)
    return move_off_initialisation(MODULES[name].ViTND(**TINY, input_shape=input_shape, **changes)).eval()


@pytest.mark.parametrize('name', ['vit_nd_rotary', 'vit_nd_pope'])
def test_on_twice_the_frames_it_gives_vit_pytorchs_logits(name):
    """Built for 4 x 8 x 12 (vit-pytorch's fixture), called on 8 x 8 x 12: vit-pytorch's logits on that input
    (tests/fixtures/make_vit_nd_longer_fixtures.py)."""
    _, _, tensors = load_fixture('vit_pytorch_1.26.14_vit_nd_longer')
    model = vit_pytorch_model(name)
    assert tensors['input'].shape[2:] == (8, 8, 12) and model.input_shape == (4, 8, 12)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('name', ['vit_nd_rotary', 'vit_nd_pope'])
def test_on_half_the_frames_it_gives_vit_pytorchs_logits(name):
    """Built for 8 x 8 x 12 with the fixture's weights, called on the fixture's 4 x 8 x 12 input: the logits
    vit-pytorch's model gives on it (the grid is the input's, so the built shape does not enter)."""
    config, _, x, expected = reference_case(f'vit_pytorch_1.26.14_{name}', 'input_shape', 'patch_size')
    model = vit_pytorch_model(name, input_shape=(8, 8, 12))
    assert x.shape[2:] == tuple(config['input_shape']) == (4, 8, 12)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('name', ['vit_nd_rotary_causal', 'vit_nd_pope_causal'])
def test_a_causal_model_on_twice_the_frames_never_lets_a_later_slice_reach_an_earlier_one(name):
    """Built for 2 slices of time (causal), called on 4: moving slices 2-3 leaves slices 0-1 bit for bit, the
    property vit-pytorch's wrapped mask breaks there (its slice 1 reads slices 2 and 3)."""
    model = vit_pytorch_model(name)
    assert model.grid_size[0] == 2 and model.causal_dims == (0,)
    check_a_causal_first_dimension_hides_later_slices(lambda x: model(x, return_embed=True))


@pytest.mark.parametrize('name', ['vit_nd_rotary_causal', 'vit_nd_pope_causal'])
def test_vit_pytorchs_causal_mask_on_twice_the_frames_wraps_time_round_the_built_length(name):
    """What ours does not copy (vit-pytorch contradicts the paper's causality there): vit-pytorch's causal mask keeps
    the grid it was built for, so on 4 slices of time instead of 2 slice t is taken as t mod 2 (slice 2 reads slices
    0 and 2 only and is hidden from slice 1). Ours differs from its logits, and given that wrapped mask (on a model
    built for the longer grid, whose mask is a buffer) gives them."""
    _, _, tensors = load_fixture('vit_pytorch_1.26.14_vit_nd_longer')
    model, longer = vit_pytorch_model(name), vit_pytorch_model(name, input_shape=(8, 8, 12))
    time = torch.arange(4 * 2 * 3) // (2 * 3)                     # each token's slice: grid 4 x 2 x 3, row-major
    longer.causal_mask = (time[:, None] % 2) >= (time[None, :] % 2)
    with torch.no_grad():
        assert not torch.allclose(model(tensors['input']), tensors[name], atol=1e-3)
        torch.testing.assert_close(longer(tensors['input']), tensors[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('name', ['vit_nd_rotary', 'vit_nd_pope'])
@pytest.mark.parametrize('causal_dims', [None, (0,), (0, 2)])
@pytest.mark.parametrize('input_shape', [(8, 8, 12), (2, 4, 8)])
def test_on_another_grid_it_computes_the_model_rebuilt_for_that_grid_bit_for_bit(name, causal_dims, input_shape):
    """Built for 4 x 8 x 12, called on a longer or smaller input: the logits, the tokens on their grid and each
    block's maps of the model built for that input with the same weights, exactly; the positions continue the
    built grid's (row-major, time outermost: the first slices are the built grid in its order)."""
    model = tiny_model(name, (4, 8, 12), causal_dims=causal_dims)
    rebuilt = MODULES[name].ViTND(**TINY, input_shape=input_shape, causal_dims=causal_dims).eval()
    rebuilt.load_state_dict(model.state_dict())
    x = torch.randn(2, 2, *input_shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(x), rebuilt(x))
        assert torch.equal(model(x, return_embed=True), rebuilt(x, return_embed=True))
        for ours, theirs in zip(model.forward_intermediates(x, output='maps'),
                                rebuilt.forward_intermediates(x, output='maps')):
            assert torch.equal(ours, theirs)
    positions, _ = model.grid_layout((4, 2, 3))
    assert torch.equal(positions[:model.positions.shape[0]], model.positions)
    assert positions[:, 0].tolist() == [t for t in range(4) for _ in range(6)]


@pytest.mark.parametrize('name', ['vit_nd_rotary', 'vit_nd_pope'])
@pytest.mark.parametrize('shape, match', [
    ((2, 2, 4, 8, 13), r'dimension 2 \(x\.shape\[4\]\) is 13, not a positive multiple of its patch size 4'),
    ((2, 2, 5, 8, 12), r'dimension 0 \(x\.shape\[2\]\) is 5, not a positive multiple of its patch size 2'),
    ((2, 2, 0, 8, 12), r'dimension 0 \(x\.shape\[2\]\) is 0, not a positive multiple of its patch size 2'),
    ((2, 3, 4, 8, 12), r'channels=2'),
    ((2, 2, 4, 8), r'ndim=3'),
])
def test_an_input_whose_sides_are_not_multiples_of_the_patch_sizes_is_refused_naming_the_dimension(name, shape,
                                                                                                   match):
    model = tiny_model(name, (4, 8, 12))
    with pytest.raises(ValueError, match=r'x must have shape \(b, 2, d_0, d_1, d_2\), each d_i a positive multiple '
                                         r'of patch_size \(2, 4, 4\), got .*' + match):
        model(torch.zeros(shape))
