"""RvT: rotary positions are the only positions (the patches' order matters through them alone); the angles of
vit-pytorch's layout; any image size; vit-pytorch's weights."""

import math

import pytest
import torch

from helpers import move_off_initialisation, reference_case
from vit_pytorch.pretrained import load_vit_pytorch
from vit_pytorch.rvt import RvT

TINY = dict(image_size=16, patch_size=4, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32)


def shuffled_patches(img, patch=4):
    """img with its 4x4 grid of patches in another order (a fixed permutation)."""
    tiles = img.unfold(2, patch, patch).unfold(3, patch, patch)              # (b, c, 4, 4, p, p)
    order = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    tiles = tiles.flatten(2, 3)[:, :, order].unflatten(2, (4, 4))
    return tiles.permute(0, 1, 2, 4, 3, 5).reshape(img.shape)


@pytest.mark.parametrize('use_rotary', [False, True])
def test_with_linear_queries_the_patches_order_reaches_the_output_only_through_the_rotary_positions(use_rotary):
    """No position table: without rotations (and without the convolutional queries) the cls token's output ignores
    where each patch lies; with them it does not."""
    torch.manual_seed(0)
    model = move_off_initialisation(RvT(**TINY, use_ds_conv=False, use_rotary=use_rotary)).double().eval()
    img = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        same = torch.allclose(model(shuffled_patches(img)), model(img), rtol=1e-9, atol=1e-9)
    assert same is not use_rotary


def test_the_angles_spread_each_side_over_minus_pi_to_pi_at_frequencies_from_1_to_half_the_image_size():
    """dim_head 10: 10 // 4 = 2 frequencies per axis, linspace(1, 16 / 2, 2) = (1, 8); the patch in row r, column c
    of a 2 x 3 grid at y_r = -pi + r 2 pi (pairs 0, 1) and x_c = -pi + c pi (pairs 2, 3); the cls token at 0."""
    model = RvT(**{**TINY, 'dim_head': 10}).double()
    frequencies = torch.tensor([1., 8.], dtype=torch.float64)
    rows, columns = (-math.pi + 2 * math.pi * r for r in range(2)), [-math.pi + math.pi * c for c in range(3)]
    expected = torch.stack([torch.zeros(4, dtype=torch.float64)]
                           + [torch.cat((y * frequencies, x * frequencies)) for y in rows for x in columns])
    torch.testing.assert_close(model.rotary_angles((2, 3)), expected, rtol=1e-6, atol=1e-6)


def test_any_image_size_divisible_by_the_patch_size_runs_including_non_square_ones():
    model = RvT(**TINY).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 8, 28)).shape == (1, 5)


# vit-pytorch 1.26.14's module (tests/fixtures/make_rope_fixtures.py)


# RvT's arguments, order and defaults against vit-pytorch's: tests/test_vit_pytorch_signatures.py (its fixture)


@pytest.mark.parametrize('fixture', ['rvt', 'rvt_plain'])
def test_vit_pytorchs_checkpoint_loads_and_gives_its_output(fixture):
    """'rvt': its defaults, dim_head 10 (8 channels turned, 2 passing); 'rvt_plain': linear queries, GELU MLP."""
    config, state_dict, img, expected = reference_case(f'vit_pytorch_1.26.14_{fixture}')
    model = load_vit_pytorch(RvT(**config), state_dict).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-4, atol=1e-5)


# clear errors


@pytest.mark.parametrize('name, value, error', [('image_size', (16, 16), TypeError), ('use_rotary', 1, TypeError),
                                                ('dim_head', 0, ValueError), ('emb_dropout', 1.5, ValueError)])
def test_a_bad_argument_is_refused_by_name(name, value, error):
    with pytest.raises(error, match=name):
        RvT(**{**TINY, name: value})
