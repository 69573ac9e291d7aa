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
causal dimensions are causal). Where it differs from vit-pytorch:
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
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit
from vit_pytorch import vit_nd


def golden_ratio(dims):
    """The generalised golden ratio for `dims` dimensions: the positive root of x^(dims + 1) = x + 1."""
    root = 1.5
    for _ in range(64):                  # a contraction with factor below 1 / (dims + 1): converged in float64
        root = (1. + root) ** (1. / (dims + 1.))
    return root


def golden_directions(count, dims):
    """`count` unit vectors in `dims` dimensions spread evenly over the sphere: the additive recurrence of the
    golden ratio's powers (a low-discrepancy sequence in the unit cube), through the normal inverse CDF."""
    steps = golden_ratio(dims) ** -torch.arange(1, dims + 1, dtype=torch.float64)
    cube = torch.fmod(torch.arange(1, count + 1, dtype=torch.float64)[:, None] * steps, 1.)
    return nn.functional.normalize(torch.erfinv(2. * cube - 1.), dim=-1).float()


def golden_gate_frequencies(heads, pairs, dims, min_freq=1., max_freq=10000., zero_fraction=0.):
    """(heads, pairs, dims) rotary frequency vectors: golden directions scaled by frequencies rising geometrically
    from `min_freq` to `max_freq` over each head's pairs, the first round(zero_fraction * pairs) of them 0."""
    zeros = round(zero_fraction * pairs)
    lengths = torch.cat((torch.zeros(zeros), min_freq * (max_freq / min_freq) ** torch.linspace(0, 1, pairs - zeros)))
    directions = rearrange(golden_directions(heads * pairs, dims), '(h f) a -> h f a', h=heads)
    return directions * lengths[:, None]


def grid_positions(grid, device=None):
    """(prod(grid), len(grid)) integer index of each cell of an N-D grid along each dimension, row-major."""
    axes = torch.meshgrid(*(torch.arange(side, device=device) for side in grid), indexing='ij')
    return rearrange(torch.stack(axes, dim=-1), '... a -> (...) a')


class ViTND(vit.TokenFace, nn.Module):
    """ViT over `ndim`-dimensional inputs (b, channels, *input_shape) with N-D rotary positions.

    `forward(x)` gives the logits of the mean of the tokens; `forward(x, return_embed=True)` the tokens after the
    final norm on their grid, (b, *grid, dim). `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    `forward_features` returns the tokens flat, (b, prod(grid), dim);
    `forward_intermediates(output='maps')` lays each block's output on the grid, (b, dim, *grid).
    """

    num_prefix_tokens = 0

    def __init__(self, *, ndim, input_shape, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3,
                 dim_head=64, dropout=0., emb_dropout=0., rope_min_freq=1.0, rope_max_freq=10000.0,
                 rope_p_zero_freqs=0.0, causal_dims=None):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.ndim, self.channels, self.num_classes = ndim, channels, num_classes
        self.input_shape, self.patch_size = vit_nd.as_tuple(input_shape, ndim), vit_nd.as_tuple(patch_size, ndim)
        self.grid_size = tuple(side // patch for side, patch in zip(self.input_shape, self.patch_size))
        self.num_features = self.embed_dim = dim
        self.causal_dims = None if causal_dims is None else vit_nd.check_causal_dims(causal_dims, ndim)

        self.to_patch_embedding = nn.Sequential(
            Rearrange(vit_nd.patch_pattern(ndim), **{f'p{i}': p for i, p in enumerate(self.patch_size)}),
            nn.Linear(channels * math.prod(self.patch_size), dim),
            nn.LayerNorm(dim),
        )
        self.to_nd_patches = Rearrange(f"b ({' '.join(vit_nd.axis_names(ndim))}) d -> b d "
                                       f"{' '.join(vit_nd.axis_names(ndim))}",
                                       **dict(zip(vit_nd.axis_names(ndim), self.grid_size)))
        self.dropout = nn.Dropout(emb_dropout)
        self.rotary_emb = vit.AxialRotaryEmbedding(golden_gate_frequencies(
            heads, dim_head // 2, ndim, rope_min_freq, rope_max_freq, rope_p_zero_freqs), mixed=True)
        self.register_buffer('positions', grid_positions(self.grid_size), persistent=False)

        mask_fn = vit_nd.get_nd_causal_mask_fn(self.grid_size, self.causal_dims, ndim=ndim)
        self.register_buffer('causal_mask', None if mask_fn is None else vit_nd.create_nd_block_mask(
            mask_fn, heads, math.prod(self.grid_size), device=None), persistent=False)

        self.transformer = vit.Transformer(dim, depth, heads, dim_head, mlp_dim, dropout,
                                           attention=vit.RotaryAttention)
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def token_grid(self, input_shape):
        """The grid of patch tokens of an input of `input_shape` (its last `ndim` sides)."""
        return tuple(side // patch for side, patch in zip(tuple(input_shape)[-self.ndim:], self.patch_size))

    def forward_features(self, x):
        """The tokens after the final norm: (b, prod(grid), dim), row-major."""
        vit_nd.check_input(x, channels=self.channels, input_shape=self.input_shape,
                           dtype=self.to_patch_embedding[1].weight.dtype)
        x = self.dropout(self.to_patch_embedding(x))
        return self.transformer(x, angles=self.rotary_emb(self.positions), mask=self.causal_mask)

    def forward_head(self, tokens, pre_logits=False):
        """The mean of the tokens: the pre-logits embedding, or the logits."""
        pooled = tokens.mean(dim=1)
        return pooled if pre_logits else self.mlp_head(pooled)

    def forward(self, x, return_embed=False):
        tokens = self.forward_features(x)
        if return_embed:
            return rearrange(self.to_nd_patches(tokens), 'b d ... -> b ... d')
        return self.forward_head(tokens)

    def forward_intermediates(self, x, indices=None, *, output='tokens'):
        """Each chosen block's output (see `TokenFace`); output 'maps' lays it on the grid, (b, dim, *grid)."""
        if output != 'maps':
            return super().forward_intermediates(x, indices, output=output)
        return [self.to_nd_patches(tokens) for tokens in super().forward_intermediates(x, indices)]

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.to_patch_embedding[1].weight,
                       removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, ndim, input_shape, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dim_head,
                    dropout, emb_dropout, rope_min_freq, rope_max_freq, rope_p_zero_freqs, causal_dims):
    vit_nd.check_arguments(ndim=ndim, input_shape=input_shape, patch_size=patch_size, num_classes=num_classes,
                           dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim, pool='mean', channels=channels,
                           dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout, causal_dims=causal_dims)
    check_frequencies('rope', dim_head, rope_min_freq, rope_max_freq, rope_p_zero_freqs, pairs=dim_head // 2)


def check_frequencies(prefix, dim_head, min_freq, max_freq, zero_fraction, *, pairs):
    if pairs < 1:
        raise ValueError(f"dim_head must give at least one frequency ({prefix}: {pairs} from dim_head={dim_head})")
    for name, value in ((f'{prefix}_min_freq', min_freq), (f'{prefix}_max_freq', max_freq)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    vit.probability(f'{prefix}_p_zero_freqs', zero_fraction)
    if round(zero_fraction * pairs) >= pairs and pairs > 1:
        raise ValueError(f"{prefix}_p_zero_freqs={zero_fraction} leaves none of the {pairs} frequencies non-zero; "
                         f"expected a fraction below {(pairs - 0.5) / pairs:.3g}")


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
