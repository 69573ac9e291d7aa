"""The N-dimensional ViT with rotary positions: a query and a key interact through their N-D offset alone; the
frequencies are the golden-gate ones; a causal dimension hides later slices; it trains on a CPU; vit-pytorch's
weights give its outputs."""

import math

import pytest
import torch

from helpers import (check_a_causal_first_dimension_hides_later_slices, check_it_trains_every_parameter,
                     check_only_position_differences_count, check_vit_pytorch_nd_checkpoint, move_off_initialisation)
from vit_pytorch import vit
from vit_pytorch.vit_nd import golden_gate_frequencies, golden_ratio
from vit_pytorch.vit_nd_rotary import ViTND

TINY = dict(num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, channels=2)


def nd_model(ndim, input_shape, patch_size, **changes):
    torch.manual_seed(0)
    return move_off_initialisation(ViTND(ndim=ndim, input_shape=input_shape, patch_size=patch_size,
                                         **{**TINY, **changes})).eval()


def test_shifting_every_position_leaves_the_logits_unchanged():
    """RoPE's promise: q . k depends on the positions' N-D offset alone, so moving the whole grid by (3, -2, 5)
    gives the same outputs; moving one token's position alone changes them."""
    check_only_position_differences_count(nd_model(3, (4, 8, 12), (2, 4, 4), rope_max_freq=10.))


def test_each_pair_turns_by_the_dot_product_of_its_frequency_vector_with_the_position():
    """Written out: head h, pair f of the token at position p turns by sum_a freqs[h, f, a] p_a, so
    q_i . k_j = sum_f |pair| products rotated by the difference freqs . (p_i - p_j)."""
    rotary = vit.AxialRotaryEmbedding(golden_gate_frequencies(2, 3, 3, 1., 20.), mixed=True)
    positions = torch.tensor([[0, 1, 2], [3, 0, 1], [1, 1, 1]])
    angles = rotary(positions)                                            # (heads, n, pairs)
    expected = torch.stack([torch.stack([rotary.frequencies[h] @ p.float() for p in positions])
                            for h in range(2)])
    torch.testing.assert_close(angles, expected)
    q, k = torch.randn(2, 2, 3, 6, dtype=torch.float64), torch.randn(2, 2, 3, 6, dtype=torch.float64)
    logits = vit.rotate(q, angles.double()) @ vit.rotate(k, angles.double()).transpose(-1, -2)
    qc, kc = torch.view_as_complex(q.reshape(2, 2, 3, 3, 2)), torch.view_as_complex(k.reshape(2, 2, 3, 3, 2))
    difference = angles.double()[:, :, None, :] - angles.double()[:, None, :, :]        # (h, i, j, f)
    formula = (qc[:, :, :, None] * kc[:, :, None, :].conj() * torch.exp(1j * difference)).real.sum(-1)
    torch.testing.assert_close(logits, formula)


def test_the_frequencies_are_golden_directions_with_geometric_lengths():
    """phi_d solves x^(d+1) = x + 1; each head's pair frequencies have unit directions and lengths rising
    geometrically from min to max freq; a quarter of zero frequencies leaves the first pairs unturned."""
    for dims in (1, 2, 3, 5):
        phi = golden_ratio(dims)
        assert math.isclose(phi ** (dims + 1), phi + 1, rel_tol=1e-12)
    freqs = golden_gate_frequencies(3, 8, 4, 2., 2048., 0.25)
    lengths = freqs.norm(dim=-1)
    torch.testing.assert_close(lengths[:, :2], torch.zeros(3, 2))
    torch.testing.assert_close(lengths[:, 2:], (2. * 4. ** torch.arange(6.)).expand(3, 6), rtol=1e-5, atol=0)


def test_a_causal_dimension_hides_every_later_slice_exactly():
    """Time (dimension 0, 4 slices) causal: moving frames of slices 2-3 leaves slices 0-1 bit for bit."""
    model = nd_model(3, (8, 8, 12), (2, 4, 4), causal_dims=0)
    check_a_causal_first_dimension_hides_later_slices(lambda x: model(x, return_embed=True))


@pytest.mark.parametrize('ndim, input_shape, patch_size', [
    (1, (12,), (4,)), (2, (8, 12), (4, 4)), (3, (4, 8, 12), (2, 4, 4)), (4, (4, 4, 8, 6), (2, 2, 4, 3))])
def test_it_trains_on_a_cpu_with_a_causal_dimension_every_parameter_getting_a_gradient(ndim, input_shape, patch_size):
    check_it_trains_every_parameter(nd_model(ndim, input_shape, patch_size, causal_dims=0).train(), input_shape)


def test_forward_intermediates_maps_lay_the_tokens_on_the_nd_grid():
    model = nd_model(4, (4, 4, 8, 6), (2, 2, 4, 3))
    maps = model.forward_intermediates(torch.randn(2, 2, 4, 4, 8, 6), output='maps')
    assert [tuple(m.shape) for m in maps] == [(2, 16, 2, 2, 2, 2)] * 2


# vit-pytorch 1.26.14's module (tests/fixtures/make_vit_nd_rotary_fixtures.py)


@pytest.mark.parametrize('name', ['vit_pytorch_1.26.14_vit_nd_rotary', 'vit_pytorch_1.26.14_vit_nd_rotary_causal'])
def test_vit_pytorchs_checkpoint_loads_and_gives_its_outputs_and_a_new_model_its_frequencies(name):
    check_vit_pytorch_nd_checkpoint(ViTND, name, 'rotary_emb.freqs')


@pytest.mark.parametrize('changes, error, match', [
    (dict(rope_min_freq=0.), ValueError, 'rope_min_freq must be a positive finite number, got 0.0'),
    (dict(causal_dims=3), ValueError, 'causal_dims'),
])
def test_a_bad_argument_is_refused_by_name(changes, error, match):
    with pytest.raises(error, match=match):
        ViTND(**{**dict(ndim=3, input_shape=(4, 8, 12), patch_size=(2, 4, 4)), **TINY, **changes})


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                 # vit-pytorch's own sizes: seconds on 2 cores
def test_vit_pytorchs_main_block_runs():
    """vit-pytorch's __main__ at its own size (less torch.compile, which it takes only on CUDA): a 5-D input of
    (4, 8, 16, 32, 64) in patches of (2, 2, 4, 4, 8), 2,048 tokens, width 512, depth 6, batch 2."""
    model = ViTND(ndim=5, input_shape=(4, 8, 16, 32, 64), patch_size=(2, 2, 4, 4, 8), num_classes=1000, dim=512,
                  depth=6, heads=8, mlp_dim=2048, channels=3, dropout=0.1, emb_dropout=0.1, causal_dims=(0,))
    data = torch.randn(2, 3, 4, 8, 16, 32, 64)
    assert model(data).shape == (2, 1000)
    assert model(data, return_embed=True).shape == (2, 2, 4, 4, 8, 8, 512)
