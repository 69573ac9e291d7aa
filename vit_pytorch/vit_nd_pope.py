"""A ViT over inputs of any number of dimensions with polar positions, PoPE (vit-pytorch's `vit_nd_pope`).

"Decoupling the 'What' and 'Where' With Polar Coordinate Positional Embeddings", Gopalakrishnan et al., arXiv
2509.10534. RoPE turns a query's channel pairs, so its content sets both the length and the angle of each pair and
what a token is and where it is mix in every logit. PoPE keeps them apart: each of a head's `dim_head` channels is
a complex number whose magnitude is a softplus of the content and whose phase is the position alone; a key's phase
is moved by a learned per-head offset (clamped to [-2 pi, 0]). The logit of query i and key j is

    scale * sum_f softplus(q_if) softplus(k_jf) cos(theta_f(p_i) - theta_f(p_j) - bias_f),

which depends on position only through the phase difference. The phases are `vit_nd_rotary`'s golden-gate N-D
frequencies (here `dim_head` of them per head), on `vit_nd.RotaryViTND`: mean-pooled tokens, causal dimensions.

    import torch
    from vit_pytorch.vit_nd_pope import ViTND

    model = ViTND(ndim=4, input_shape=(8, 16, 32, 64), patch_size=(2, 4, 4, 8), num_classes=1000,
                  dim=128, depth=2, heads=4, mlp_dim=256, causal_dims=(0,))   # time is causal
    video = torch.randn(2, 3, 8, 16, 32, 64)
    logits = model(video)                                                      # (2, 1000)
    embed = model(video, return_embed=True)                                    # (2, 4, 4, 8, 8, 128)

As vit-pytorch's: its arguments, outputs, frequencies and learned offset; its checkpoints load through
`vit_pytorch.pretrained.load_vit_pytorch` with equal outputs, causal ones too; it takes any input whose sides are
multiples of `patch_size`, reading the grid from the input (a longer clip: positions 0 .. slices - 1, the same
frequencies and offset). Where it differs from vit-pytorch:
  - on a grid other than the built one, the causal mask is the input grid's: vit-pytorch keeps the built grid's,
    so on a longer clip time wraps round the built length and an earlier slice reads later ones.
  - the causal mask goes to `vit.attend` (a dense boolean mask), so the model trains on any device.
  - queries, keys and values come from one Linear `to_qkv` (vit-pytorch: `to_qk` and `to_v`, joined on loading);
    `ndim` is any positive number.
The recorder sees (b, heads, prod(grid), prod(grid)) maps, the patches row-major.
"""

import math

import torch
from einops import rearrange
from torch import nn

from vit_pytorch import vit
from vit_pytorch import vit_nd
from vit_pytorch.vit_nd import (  # noqa: F401  (vit-pytorch's vit_nd_pope imports them)
    create_nd_block_mask, get_nd_causal_mask_fn, nd_attention)


def polar(x, phases):
    """(..., n, d) content -> (..., n, 2d): each channel the complex number softplus(x) e^(i phase), the d real
    parts, then the d imaginary ones (as vit-pytorch lays them), in float32 at least (as vit-pytorch). Written out
    rather than through `torch.polar` (complex tensors), which ran 2.5 to 4 times slower on this CPU."""
    magnitudes = nn.functional.softplus(x.to(torch.promote_types(x.dtype, torch.float32)))
    phases = phases.to(magnitudes.dtype)
    return torch.cat((magnitudes * phases.cos(), magnitudes * phases.sin()), dim=-1).to(x.dtype)


class Attention(vit.RotaryAttention):
    """PoPE attention: queries and keys as `polar` numbers, the queries' phases `angles`, the keys' `key_angles`
    (the same plus the learned offset); the scale stays dim_head ** -0.5, values as they are."""

    def forward(self, x, *, angles, key_angles, mask=None):
        q, k, v = self.qkv(x)
        out = self.attend(polar(q, angles), polar(k, key_angles), v, mask=mask)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class ViTND(vit_nd.RotaryViTND):
    """ViT over `ndim`-dimensional inputs (b, channels, *input_shape) with N-D polar positions (PoPE).

    `forward(x)` gives the logits of the mean of the tokens; `forward(x, return_embed=True)` the tokens after the
    final norm on their grid, (b, *grid, dim). `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    `forward_features` returns the tokens flat, (b, prod(grid), dim) (see `vit_nd.RotaryViTND`). `phase_bias`
    (heads, dim_head) is the keys' learned phase offset, shared by the layers (vit-pytorch's `learned_bias`).
    """

    def __init__(self, *, ndim, input_shape, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3,
                 dim_head=64, dropout=0., emb_dropout=0., pope_min_freq=1.0, pope_max_freq=10000.0,
                 pope_p_zero_freqs=0.0, pope_init_learned_bias_uniform=False, causal_dims=None):
        check_arguments(**vit.arguments(locals()))
        frequencies = vit_nd.golden_gate_frequencies(heads, dim_head, ndim, pope_min_freq, pope_max_freq,
                                                     pope_p_zero_freqs)
        super().__init__(ndim=ndim, input_shape=input_shape, patch_size=patch_size, num_classes=num_classes, dim=dim,
                         depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                         dropout=dropout, emb_dropout=emb_dropout, causal_dims=causal_dims,
                         rotary_emb=vit.AxialRotaryEmbedding(frequencies, mixed=True), attention=Attention)
        self.phase_bias = nn.Parameter(torch.zeros(heads, dim_head))
        if pope_init_learned_bias_uniform:
            nn.init.uniform_(self.phase_bias, -2 * math.pi, 0.)

    def rotary_angles(self, positions):
        """The queries' phases (heads, n, dim_head) at `positions` (n, ndim) and the keys', moved by the clamped
        learned offset."""
        angles = self.rotary_emb(positions)
        offset = self.phase_bias.clamp(-2 * math.pi, 0.).to(angles.dtype)
        return dict(angles=angles, key_angles=angles + rearrange(offset, 'h d -> h 1 d'))


# argument checks


def check_arguments(*, pope_min_freq, pope_max_freq, pope_p_zero_freqs, pope_init_learned_bias_uniform, **arguments):
    """The N-D ViT's arguments (`vit_nd.check_arguments`), then the frequencies', dim_head of them a head."""
    vit_nd.check_rotary_arguments('pope', pope_min_freq, pope_max_freq, pope_p_zero_freqs,
                                  channels_per_frequency=1, **arguments)
    if not isinstance(pope_init_learned_bias_uniform, bool):
        raise TypeError(f"pope_init_learned_bias_uniform must be a bool, got {pope_init_learned_bias_uniform!r}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `ViTND` (vit_nd_pope): `to_qk` and `to_v` joined into `to_qkv` (PoPE keeps each channel: no
    reordering); its frequencies `polar_emb.freqs` and offset `polar_emb.learned_bias` (kept once more in the
    transformer) become `rotary_emb.frequencies` and `phase_bias`."""
    plan = {}
    for key, tensor in model.state_dict().items():
        shape = tuple(tensor.shape)
        if key.endswith('.to_qkv.weight'):
            attention = key.removesuffix('to_qkv.weight')
            inner = shape[0] // 3
            sources = {f'{attention}to_qk.weight': (2 * inner, shape[1]), f'{attention}to_v.weight': (inner, shape[1])}
            plan[key] = (sources, lambda qk, v: torch.cat((qk, v)))
        elif key in ('rotary_emb.frequencies', 'phase_bias'):
            name = 'freqs' if key == 'rotary_emb.frequencies' else 'learned_bias'
            plan[key] = ({f'polar_emb.{name}': shape, f'transformer.polar_emb.{name}': shape}, lambda first, _: first)
        else:
            plan[key] = ({key: shape}, lambda t: t)
    return plan, ('mlp_head.',)
