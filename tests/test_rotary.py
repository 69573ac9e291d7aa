"""The rotary primitive of vit.py (RoPE, Su et al., arXiv 2104.09864, made axial): what rotary positions are, for
any number of axes. ViT-5 and RvT build on it (tests/test_vit_5.py, tests/test_rvt.py)."""

import math

import torch

from vit_pytorch import vit


def random_frequencies(axes, per_axis, seed=0):
    return torch.rand(axes, per_axis, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.1


def random_heads(n, d, seed=1):
    """q, k of one image and one head: (1, 1, n, d) each, float64."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 1, n, d, generator=generator, dtype=torch.float64) for _ in range(2))


def rotary_logits(q, k, angles):
    return vit.rotate(q, angles) @ vit.rotate(k, angles).transpose(-1, -2)


def test_the_logits_between_two_tokens_depend_only_on_the_offset_of_their_positions():
    """Written out, pair by pair: q_i' . k_j' = sum_p (q1 k1 + q2 k2) cos(d) + (q1 k2 - q2 k1) sin(d), with
    d = f . (x_i - x_j) the angle of the offset alone."""
    embedding = vit.AxialRotaryEmbedding(random_frequencies(2, 3))
    positions = torch.rand(5, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 10
    q, k = random_heads(5, 12)
    offsets = positions[:, None] - positions[None]                        # (n, n, axes)
    delta = torch.einsum('ija,af->ijaf', offsets, embedding.frequencies).flatten(2)   # (n, n, pairs)
    (q1, q2), (k1, k2) = (t[0, 0].unflatten(-1, (-1, 2)).unbind(-1) for t in (q, k))    # (n, pairs) each
    expected = ((q1[:, None] * k1[None] + q2[:, None] * k2[None]) * delta.cos()
                + (q1[:, None] * k2[None] - q2[:, None] * k1[None]) * delta.sin()).sum(-1)
    torch.testing.assert_close(rotary_logits(q, k, embedding(positions))[0, 0], expected, rtol=1e-12, atol=1e-12)


def test_shifting_every_position_by_a_constant_leaves_the_logits_equal():
    embedding = vit.AxialRotaryEmbedding(random_frequencies(3, 2))       # three axes: a video's (t, h, w)
    positions = torch.rand(6, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 10
    q, k = random_heads(6, 12)
    shift = torch.tensor([2.5, -7., 40.], dtype=torch.float64)
    torch.testing.assert_close(rotary_logits(q, k, embedding(positions + shift)),
                               rotary_logits(q, k, embedding(positions)), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(rotary_logits(q, k, embedding(positions * 2)), rotary_logits(q, k, embedding(positions)))


def test_turning_keeps_each_pairs_norm_and_so_each_tokens():
    angles = vit.AxialRotaryEmbedding(random_frequencies(2, 3))(torch.randn(5, 2, dtype=torch.float64) * 10)
    q, _ = random_heads(5, 12)
    turned = vit.rotate(q, angles)
    pair_norms = [t.unflatten(-1, (-1, 2)).norm(dim=-1) for t in (turned, q)]
    torch.testing.assert_close(*pair_norms, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(turned, q)


def test_a_token_at_angle_zero_is_not_turned():
    """The cls token of ViT-5 and RvT: its row of angles is 0."""
    q, _ = random_heads(3, 8)
    angles = torch.cat((torch.zeros(1, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64)))
    turned = vit.rotate(q, angles)
    assert torch.equal(turned[..., 0, :], q[..., 0, :])
    assert not torch.allclose(turned[..., 1:, :], q[..., 1:, :])


def test_the_channels_after_the_angles_pairs_pass_unturned():
    q, _ = random_heads(4, 10)
    turned = vit.rotate(q, torch.rand(4, 4, dtype=torch.float64) + 0.5)     # 4 pairs: channels 0..7
    assert torch.equal(turned[..., 8:], q[..., 8:])
    assert not torch.allclose(turned[..., :8], q[..., :8])


def test_each_axis_turns_only_its_own_block_of_pairs():
    """Three axes of two frequencies each: moving along axis a changes the angles of pairs 2a and 2a + 1 only."""
    embedding = vit.AxialRotaryEmbedding(random_frequencies(3, 2))
    origin = torch.zeros(1, 3, dtype=torch.float64)
    for axis in range(3):
        moved = origin.clone()
        moved[0, axis] = 1.5
        changed = (embedding(moved) != embedding(origin))[0].nonzero().flatten().tolist()
        assert changed == [2 * axis, 2 * axis + 1]
        torch.testing.assert_close(embedding(moved)[0, 2 * axis:2 * axis + 2], 1.5 * embedding.frequencies[axis])


def test_the_frequencies_are_roformers_geometric_sequence():
    """theta_i = 10000^(-2i / d) for d = 8 channels: 1, 10000^(-1/4), 10000^(-1/2), 10000^(-3/4)."""
    expected = torch.tensor([10000 ** (-i / 4) for i in range(4)])
    torch.testing.assert_close(vit.rope_frequencies(4, 10000), expected, rtol=1e-6, atol=0)


def test_rotary_attention_without_angles_is_the_cores_attention():
    torch.manual_seed(0)
    rotary = vit.RotaryAttention(16, heads=2, dim_head=8).double()
    plain = vit.Attention(16, heads=2, dim_head=8).double()
    plain.load_state_dict(rotary.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(rotary(x), plain(x), rtol=1e-12, atol=1e-12)
    angles = torch.full((5, 4), math.pi / 3, dtype=torch.float64)        # every token turned alike: q . k unchanged
    torch.testing.assert_close(rotary(x, angles=angles), plain(x), rtol=1e-10, atol=1e-10)


def test_a_bfloat16_model_computes_its_angles_in_float32():
    """In bfloat16 (8 significant bits) an angle near 350 radians, RvT's largest at 224 pixels, is off by up to 1."""
    embedding = vit.AxialRotaryEmbedding(torch.tensor([[112.]])).to(torch.bfloat16)
    positions = torch.tensor([[math.pi], [math.pi * 0.99]])
    angles = embedding(positions)
    assert angles.dtype == torch.float32
    torch.testing.assert_close(angles, positions * 112., rtol=1e-6, atol=0)
