"""PoPE on the N-dimensional ViT: the logit is PoPE's formula (magnitudes a softplus of the content, phases from
position only, the keys' moved by the learned offset), so position enters through the phase difference alone; a
causal dimension hides later slices; it trains on a CPU; vit-pytorch's weights give its outputs."""

import math

import pytest
import torch

from helpers import (check_a_causal_first_dimension_hides_later_slices, check_it_trains_every_parameter,
                     check_only_position_differences_count, check_vit_pytorch_nd_checkpoint, move_off_initialisation)
from vit_pytorch.vit_nd_pope import ViTND, polar

TINY = dict(num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, channels=2)


def nd_model(ndim, input_shape, patch_size, **changes):
    torch.manual_seed(0)
    return move_off_initialisation(ViTND(ndim=ndim, input_shape=input_shape, patch_size=patch_size,
                                         **{**TINY, **changes})).eval()


def test_the_attention_is_popes_formula_written_out():
    """softmax over j of scale * sum_f softplus(q_if) softplus(k_jf) cos(theta_if - theta_jf - bias_f), with theta
    the golden-gate phases of the positions and bias the clamped learned offset, times the values."""
    model = nd_model(2, (8, 12), (4, 4), pope_max_freq=50., pope_init_learned_bias_uniform=True)
    attention = model.transformer.layers[0][0]
    tokens = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    model.double()
    with torch.no_grad():
        q, k, v = attention.qkv(tokens)                                        # (b, h, n, d)
        theta = torch.einsum('hfa,na->hnf', model.rotary_emb.frequencies, model.positions.double())
        bias = model.phase_bias.clamp(-2 * math.pi, 0.)[:, None, None, :]      # (h, 1, 1, d)
        phase = theta[:, :, None, :] - theta[:, None, :, :] - bias              # (h, i, j, d)
        magnitude = torch.nn.functional.softplus(q)[:, :, :, None] * torch.nn.functional.softplus(k)[:, :, None]
        logits = (magnitude * phase.cos()).sum(-1) * 8 ** -0.5
        out = torch.einsum('bhij,bhjd->bhid', logits.softmax(-1), v)
        expected = attention.to_out(out.permute(0, 2, 1, 3).reshape(3, 6, 16))
        torch.testing.assert_close(attention(tokens, **model.rotary_angles(model.positions)), expected)


def test_shifting_every_position_leaves_the_outputs_unchanged():
    """Position enters through the phase difference only: the whole grid moved by (3, -2, 5) gives the same
    outputs; one token moved alone changes them."""
    check_only_position_differences_count(nd_model(3, (4, 8, 12), (2, 4, 4), pope_max_freq=10.,
                                                   pope_init_learned_bias_uniform=True))


def test_each_channel_is_a_complex_number_of_content_magnitude_and_position_phase():
    """What and where decoupled: channel f of a query becomes softplus(q_f) e^(i theta_f), its magnitude from the
    content alone and its angle the phase alone, whatever the content."""
    q = torch.randn(2, 3, 5, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    phases = torch.rand(3, 5, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 6 - 3
    real, imaginary = polar(q, phases).chunk(2, dim=-1)
    numbers = torch.complex(real, imaginary)
    torch.testing.assert_close(numbers.abs(), torch.nn.functional.softplus(q))
    torch.testing.assert_close(numbers.angle(), phases.expand(2, 3, 5, 4))


def test_a_causal_dimension_hides_every_later_slice_exactly():
    model = nd_model(3, (8, 8, 12), (2, 4, 4), causal_dims=0)
    check_a_causal_first_dimension_hides_later_slices(lambda x: model(x, return_embed=True))


@pytest.mark.parametrize('ndim, input_shape, patch_size', [
    (1, (12,), (4,)), (2, (8, 12), (4, 4)), (3, (4, 8, 12), (2, 4, 4)), (4, (4, 4, 8, 6), (2, 2, 4, 3))])
def test_it_trains_on_a_cpu_with_a_causal_dimension_every_parameter_getting_a_gradient(ndim, input_shape, patch_size):
    model = nd_model(ndim, input_shape, patch_size, causal_dims=0, pope_init_learned_bias_uniform=True)
    check_it_trains_every_parameter(model.train(), input_shape)


# vit-pytorch 1.26.14's module (tests/fixtures/make_vit_nd_rotary_fixtures.py)


@pytest.mark.parametrize('name', ['vit_pytorch_1.26.14_vit_nd_pope', 'vit_pytorch_1.26.14_vit_nd_pope_causal'])
def test_vit_pytorchs_checkpoint_loads_and_gives_its_outputs_and_a_new_model_its_frequencies(name):
    check_vit_pytorch_nd_checkpoint(ViTND, name, 'polar_emb.freqs')


@pytest.mark.parametrize('changes, error, match', [
    (dict(pope_min_freq=-1.), ValueError, 'pope_min_freq must be a positive finite number, got -1.0'),
    (dict(pope_p_zero_freqs=2.), ValueError, 'pope_p_zero_freqs'),
    (dict(pope_init_learned_bias_uniform='yes'), TypeError, 'pope_init_learned_bias_uniform must be a bool'),
])
def test_a_bad_argument_is_refused_by_name(changes, error, match):
    with pytest.raises(error, match=match):
        ViTND(**{**dict(ndim=3, input_shape=(4, 8, 12), patch_size=(2, 4, 4)), **TINY, **changes})


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                 # vit-pytorch's own sizes: seconds on 2 cores
def test_vit_pytorchs_main_block_runs():
    """vit-pytorch's __main__ at its own size (less torch.compile, which it takes only on CUDA): a 5-D input of
    (4, 8, 16, 32, 64) in patches of (2, 2, 4, 4, 8), 2,048 tokens, width 512, depth 6, batch 3."""
    model = ViTND(ndim=5, input_shape=(4, 8, 16, 32, 64), patch_size=(2, 2, 4, 4, 8), num_classes=1000, dim=512,
                  depth=6, heads=8, mlp_dim=2048, channels=3, dropout=0.1, emb_dropout=0.1, causal_dims=(0,))
    data = torch.randn(3, 3, 4, 8, 16, 32, 64)
    assert model(data).shape == (3, 1000)
    assert model(data, return_embed=True).shape == (3, 2, 4, 4, 8, 8, 512)
