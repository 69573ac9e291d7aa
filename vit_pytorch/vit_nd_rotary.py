"""A ViT over inputs of any number of dimensions with N-D rotary positions (vit-pytorch's `vit_nd_rotary`).

`vit_nd.ViTND` with its learned position table and cls token replaced by rotary position embeddings (RoPE,
Su et al., "RoFormer", arXiv 2104.09864) over the N-D patch grid, with mixed frequencies: each channel pair of a
head turns along its own direction of the grid, by the dot product of the patch's position (its integer index
along each dimension) with a frequency vector, so a query and a key interact through their N-D offset alone.
The directions are the "golden gate" ones (Jerry Xiong, https://jerryxio.ng/posts/nd-rope/, which vit-pytorch
cites): a low-discrepancy sequence of the generalised golden ratio, mapped through the inverse normal CDF and
normalised, so the directions of all heads' pairs cover the sphere evenly; their lengths grow geometrically
from `rope_min_freq` to `rope_max_freq`, the first `rope_p_zero_freqs` of them 0 (pairs left unturned).
The tokens are mean-pooled; dimensions in `causal_dims` are causal (no patch reads a later slice).

    import torch
    from vit_pytorch.vit_nd_rotary import ViTND

    model = ViTND(ndim=4, input_shape=(8, 16, 32, 64), patch_size=(2, 4, 4, 8), num_classes=1000,
                  dim=128, depth=2, heads=4, mlp_dim=256, causal_dims=(0,))   # time is causal
    video = torch.randn(2, 3, 8, 16, 32, 64)
    logits = model(video)                                                      # (2, 1000)
    embed = model(video, return_embed=True)                                    # (2, 4, 4, 8, 8, 128)

As vit-pytorch's: its arguments, outputs and frequencies; its checkpoints load through
`vit_pytorch.pretrained.load_vit_pytorch` with equal outputs, causal ones too (it has no cls token, so its
causal dimensions are causal). As vit-pytorch's, it takes any input whose sides are multiples of `patch_size`
(`input_shape` only sets the grid of the buffers), reading the grid from the input: `model(longer_video)` runs a
model built for shorter clips on longer ones, the positions continuing (0 .. slices - 1), the frequencies the same.
Where it differs from vit-pytorch:
  - on a grid other than the built one, the causal mask is the input grid's: vit-pytorch keeps the built grid's,
    so on a longer clip time wraps round the built length (slice t taken as t mod the built slices) and an earlier
    slice reads later ones (tests/test_vit_nd_any_grid.py); without causal dimensions the outputs are equal.
  - the causal mask goes to `vit.attend` (a dense boolean mask), so the model trains on any device; vit-pytorch's
    flex attention has no CPU backward.
  - the rotation is the house's `vit.rotate`, which pairs channels (2i, 2i + 1) where vit-pytorch pairs i with
    i + dim_head / 2; the loader reorders the query and key rows of each head alike, which leaves every q . k,
    and so the function, as it was.
  - queries, keys and values come from one Linear `to_qkv` (vit-pytorch: `to_qk` and `to_v`, joined on loading).
  - `ndim` is any positive number (vit-pytorch stops at 7).
The recorder sees (b, heads, prod(grid), prod(grid)) maps, the patches row-major.
"""

import math

import torch
from einops import rearrange

from vit_pytorch import vit
from vit_pytorch import vit_nd
from vit_pytorch.vit_nd import (  # noqa: F401  (vit-pytorch's vit_nd_rotary imports them)
    create_nd_block_mask, get_nd_causal_mask_fn, nd_attention)


class ViTND(vit_nd.RotaryViTND):
    """ViT over `ndim`-dimensional inputs (b, channels, *input_shape) with N-D rotary positions.

    `forward(x)` gives the logits of the mean of the tokens; `forward(x, return_embed=True)` the tokens after the
    final norm on their grid, (b, *grid, dim). `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    `forward_features` returns the tokens flat, (b, prod(grid), dim) (see `vit_nd.RotaryViTND`).
    """

    def __init__(self, *, ndim, input_shape, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3,
                 dim_head=64, dropout=0., emb_dropout=0., rope_min_freq=1.0, rope_max_freq=10000.0,
                 rope_p_zero_freqs=0.0, causal_dims=None):
        check_arguments(**vit.arguments(locals()))
        frequencies = vit_nd.golden_gate_frequencies(heads, dim_head // 2, ndim, rope_min_freq, rope_max_freq,
                                                     rope_p_zero_freqs)
        super().__init__(ndim=ndim, input_shape=input_shape, patch_size=patch_size, num_classes=num_classes, dim=dim,
                         depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                         dropout=dropout, emb_dropout=emb_dropout, causal_dims=causal_dims,
                         rotary_emb=vit.AxialRotaryEmbedding(frequencies, mixed=True), attention=vit.RotaryAttention)


# argument checks


def check_arguments(*, rope_min_freq, rope_max_freq, rope_p_zero_freqs, **arguments):
    """The N-D ViT's arguments (`vit_nd.check_arguments`), then the frequencies', dim_head // 2 of them a head."""
    vit_nd.check_rotary_arguments('rope', rope_min_freq, rope_max_freq, rope_p_zero_freqs,
                                  channels_per_frequency=2, **arguments)


# loading checkpoints


def pair_rows(weight, heads):
    """vit-pytorch's query or key rows, each head's channel i paired with i + d / 2, laid as ours: (2i, 2i + 1)."""
    return rearrange(weight, '(h two p) c -> (h p two) c', h=heads, two=2)


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `ViTND` (vit_nd_rotary): `to_qk` and `to_v` joined into `to_qkv`, the query and key rows of
    each head reordered to our channel pairs; its frequencies `rotary_emb.freqs` (kept once more in every
    attention) become `rotary_emb.frequencies`."""
    state = model.state_dict()
    plan = {}
    for key, tensor in state.items():
        if key.endswith('.to_qkv.weight'):
            attention = key.removesuffix('to_qkv.weight')
            heads = model.transformer.layers[0][0].heads
            inner = tensor.shape[0] // 3
            plan[key] = ({f'{attention}to_qk.weight': (2 * inner, tensor.shape[1]),
                          f'{attention}to_v.weight': (inner, tensor.shape[1])},
                         lambda qk, v, heads=heads: torch.cat(
                             [pair_rows(part, heads) for part in qk.chunk(2)] + [v]))
        elif key == 'rotary_emb.frequencies':
            copies = [f'transformer.layers.{i}.0.rotary_emb.freqs' for i in range(len(model.transformer.layers))]
            plan[key] = ({name: tuple(tensor.shape) for name in ['rotary_emb.freqs', *copies]},
                         lambda first, *_: first)
        else:
            plan[key] = ({key: tuple(tensor.shape)}, lambda t: t)
    return plan, ('mlp_head.',)
