"""A Vision Transformer over inputs of any number of dimensions, with causal dimensions (vit-pytorch's `vit_nd`).

The ViT of "An Image is Worth 16x16 Words", Dosovitskiy et al., arXiv 2010.11929, cut into N-dimensional
patches: an input (b, c, d_0, ..., d_{N-1}) becomes a grid of patches of `patch_size`, each flattened and
projected, with a learned position table over the grid and a cls token. Dimensions named in `causal_dims`
are causal: a patch attends only to patches at its own index or earlier along each of them (time in an
occupancy video; vit-pytorch's `vit_nd_masking` functions, defined here), so what a patch computes never
depends on a later slice.

    import torch
    from vit_pytorch.vit_nd import ViTND

    model = ViTND(ndim=4, input_shape=(8, 16, 32, 64), patch_size=(2, 4, 4, 8), num_classes=1000,
                  dim=128, depth=2, heads=4, mlp_dim=256, causal_dims=(0,))   # time is causal
    occupancy_time = torch.randn(2, 3, 8, 16, 32, 64)
    logits = model(occupancy_time)                                             # (2, 1000)
    cls_token, patches = model(occupancy_time, return_nd_patches=True)        # (2, 128), (2, 128, 4, 4, 8, 8)

As vit-pytorch's: its arguments and outputs, the patch projection (a Linear, then a LayerNorm), a cls
token that is always there (`pool='mean'` averages the patch tokens beside it), and its checkpoints
load through `vit_pytorch.pretrained.load_vit_pytorch` with equal outputs when `causal_dims` is None.
Where it differs from vit-pytorch:
  - the causal mask goes to `vit.attend` (scaled_dot_product_attention with a dense boolean mask), so the
    model trains on any device; vit-pytorch's flex attention has no CPU backward.
  - with causal dimensions no patch attends to the cls token: vit-pytorch lets every patch attend to it,
    and after the first layer the cls token has read every slice, so from depth 2 on a patch there sees
    later slices through it (its causal dimensions are causal only for depth 1). A causal model therefore
    refuses vit-pytorch's checkpoints by name.
  - `ndim` is any positive number (vit-pytorch names the axes with single letters and stops at 7).
Its learned position table has a row per patch of `input_shape`, so it takes that shape only (vit-pytorch's raises a
RuntimeError on another: the table and the tokens differ in length; `vit_nd_rotary` and `vit_nd_pope` take any
multiple of `patch_size`).
The recorder sees (b, heads, 1 + prod(grid), same) maps, the cls token first, the patches row-major.
"""

import math

import torch
from einops import rearrange
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit


def axis_names(ndim):
    return [f'd{i}' for i in range(ndim)]


def patch_pattern(ndim):
    """(b, c, d_0 * p_0, ...) -> (b, prod(d), p_0 ... p_{N-1} c) as an einops pattern."""
    axes = axis_names(ndim)
    sides = ' '.join(f'({axis} p{i})' for i, axis in enumerate(axes))
    patch = ' '.join(f'p{i}' for i in range(ndim))
    return f"b c {sides} -> b ({' '.join(axes)}) ({patch} c)"


def on_grid(tokens, grid):
    """(b, prod(grid), dim) row-major patch tokens -> (b, dim, *grid)."""
    axes = ' '.join(axis_names(len(grid)))
    return rearrange(tokens, f'b ({axes}) d -> b d {axes}', **dict(zip(axis_names(len(grid)), grid)))


class PatchGrid(vit.TokenFace, nn.Module):
    """What the N-D ViTs share (`ViTND`, `RotaryViTND`): the input cut into N-D patches (`to_patch_embedding`: a
    Linear on each flattened patch, then a LayerNorm) on the grid of `grid_size` as built (`token_grid` gives an
    input's), the one causal mask over the tokens of a grid (`causal_mask_over`), and the face's grid, intermediate
    maps (`on_grid`), head reset and gradient checkpointing."""

    def __init__(self, *, ndim, input_shape, patch_size, num_classes, dim, channels, causal_dims):
        super().__init__()
        self.ndim, self.channels, self.num_classes = ndim, channels, num_classes
        self.input_shape, self.patch_size = as_tuple(input_shape, ndim), as_tuple(patch_size, ndim)
        self.grid_size = tuple(side // patch for side, patch in zip(self.input_shape, self.patch_size))
        self.num_features = self.embed_dim = dim
        self.causal_dims = None if causal_dims is None else check_causal_dims(causal_dims, ndim)

        self.to_patch_embedding = nn.Sequential(
            Rearrange(patch_pattern(ndim), **{f'p{i}': p for i, p in enumerate(self.patch_size)}),
            nn.Linear(channels * math.prod(self.patch_size), dim),
            nn.LayerNorm(dim),
        )

    def causal_mask_over(self, grid, *, has_cls, device=None):
        """The dense (n, n) boolean mask of the causal dimensions over the patches of `grid` (row-major), after a
        cls token with `has_cls` (it attends to every patch and no patch attends to it); None without causal
        dimensions."""
        mask_fn = get_nd_causal_mask_fn(grid, self.causal_dims, ndim=self.ndim, has_cls=has_cls,
                                        patches_attend_cls=False)
        return None if mask_fn is None else create_nd_block_mask(mask_fn, 1, has_cls + math.prod(grid), device)

    def token_grid(self, input_shape):
        """The grid of patch tokens of an input of `input_shape` (its last `ndim` sides)."""
        return tuple(side // patch for side, patch in zip(tuple(input_shape)[-self.ndim:], self.patch_size))

    def forward_intermediates(self, x, indices=None, *, output='tokens'):
        """Each chosen block's output (see `TokenFace`); output 'maps' lays its patches on the grid,
        (b, dim, *grid), for any `ndim`."""
        if output != 'maps':
            return super().forward_intermediates(x, indices, output=output)
        grid = self.token_grid(x.shape)
        return [on_grid(tokens[:, self.num_prefix_tokens:], grid)
                for tokens in super().forward_intermediates(x, indices)]

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.to_patch_embedding[1].weight,
                       removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


class ViTND(PatchGrid):
    """ViT over `ndim`-dimensional inputs (b, channels, *input_shape), with optional causal dimensions.

    `forward(x)` gives the logits; `forward(x, return_nd_patches=True)` the normed cls token (b, dim) and
    the patch tokens on their grid (b, dim, *grid). `num_classes=0` makes `forward` return the pooled
    embedding (b, dim). `forward_features` returns all tokens after the final norm, (b, 1 + prod(grid), dim),
    the cls token first; `forward_intermediates(output='maps')` lays each block's patches on the N-D grid.
    """

    num_prefix_tokens = 1

    def __init__(self, *, ndim, input_shape, patch_size, num_classes, dim, depth, heads, mlp_dim, pool='cls',
                 channels=3, dim_head=64, dropout=0., emb_dropout=0., causal_dims=None):
        check_arguments(**vit.arguments(locals()))
        super().__init__(ndim=ndim, input_shape=input_shape, patch_size=patch_size, num_classes=num_classes, dim=dim,
                         channels=channels, causal_dims=causal_dims)
        self.pool = pool
        self.cls_token = nn.Parameter(torch.zeros(1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1 + math.prod(self.grid_size), dim))
        vit.init_tokens(self.pos_embedding, self.cls_token, patch_norm=True)
        self.dropout = nn.Dropout(emb_dropout)
        self.register_buffer('causal_mask', self.causal_mask_over(self.grid_size, has_cls=True), persistent=False)
        self.to_nd_patches = Rearrange(f"b ({' '.join(axis_names(ndim))}) d -> b d {' '.join(axis_names(ndim))}",
                                       **dict(zip(axis_names(ndim), self.grid_size)))

        self.transformer = vit.Transformer(dim, depth, heads, dim_head, mlp_dim, dropout)
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, x):
        """All tokens after the final norm: (b, 1 + prod(grid), dim), the cls token first."""
        check_input(x, channels=self.channels, patch_size=self.patch_size, dtype=self.pos_embedding.dtype,
                    input_shape=self.input_shape)
        patches = self.to_patch_embedding(x)
        cls_tokens = self.cls_token.expand(patches.shape[0], 1, -1)
        x = self.dropout(torch.cat((cls_tokens, patches), dim=1) + self.pos_embedding)
        return self.transformer(x, mask=self.causal_mask)

    def forward_head(self, tokens, pre_logits=False):
        """The cls token (or the mean of the patch tokens): the pre-logits embedding, or the logits."""
        pooled = tokens[:, 1:].mean(dim=1) if self.pool == 'mean' else tokens[:, 0]
        return pooled if pre_logits else self.mlp_head(pooled)

    def forward(self, x, return_nd_patches=False):
        tokens = self.forward_features(x)
        if return_nd_patches:
            return tokens[:, 0], self.to_nd_patches(tokens[:, 1:])
        return self.forward_head(tokens)


class RotaryViTND(PatchGrid):
    """The N-D ViT of the rotary variants (`vit_nd_rotary`, `vit_nd_pope`): no position table and no cls token, the
    tokens mean-pooled; each attention (`attention`, built like `vit.Attention`) takes `rotary_angles(positions)`,
    the angles `rotary_emb` gives the patches' grid positions, as `angles=`.

    Any input whose sides are multiples of `patch_size` runs, as in vit-pytorch: the positions (each patch's index
    along each dimension) and the causal mask are those of the input's grid (`grid_layout`), the weights, frequencies
    and learned offsets the same. On the grid of `input_shape` they are the buffers `positions` and `causal_mask`.

    `forward(x)` gives the logits of the mean of the tokens; `forward(x, return_embed=True)` the tokens after the
    final norm on their grid, (b, *grid, dim). `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    `forward_features` returns the tokens flat, (b, prod(grid), dim); `forward_intermediates(output='maps')` lays
    each block's output on the grid, (b, dim, *grid).
    """

    num_prefix_tokens = 0

    def __init__(self, *, ndim, input_shape, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dim_head,
                 dropout, emb_dropout, causal_dims, rotary_emb, attention):
        super().__init__(ndim=ndim, input_shape=input_shape, patch_size=patch_size, num_classes=num_classes, dim=dim,
                         channels=channels, causal_dims=causal_dims)
        self.dropout = nn.Dropout(emb_dropout)
        self.rotary_emb = rotary_emb
        self.register_buffer('positions', grid_positions(self.grid_size), persistent=False)
        self.register_buffer('causal_mask', self.causal_mask_over(self.grid_size, has_cls=False), persistent=False)

        self.transformer = vit.Transformer(dim, depth, heads, dim_head, mlp_dim, dropout, attention=attention)
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, x):
        """The tokens after the final norm: (b, prod(grid), dim), row-major."""
        dtype = self.to_patch_embedding[1].weight.dtype
        check_input(x, channels=self.channels, patch_size=self.patch_size, dtype=dtype)
        positions, mask = self.grid_layout(self.token_grid(x.shape))
        x = self.dropout(self.to_patch_embedding(x))
        return self.transformer(x, **self.rotary_angles(positions), mask=mask)

    def grid_layout(self, grid):
        """(positions (prod(grid), ndim), causal mask (n, n) or None) of the patches of `grid`: the buffers on the
        built grid, the same computed for another (a longer clip: time's positions continue, its mask stays causal)."""
        if grid == self.grid_size:
            return self.positions, self.causal_mask
        device = self.positions.device
        return grid_positions(grid, device), self.causal_mask_over(grid, has_cls=False, device=device)

    def rotary_angles(self, positions):
        """The keyword arguments that hand each attention its rotary angles at `positions` (n, ndim):
        {'angles': (heads, n, pairs)}."""
        return dict(angles=self.rotary_emb(positions))

    def forward_head(self, tokens, pre_logits=False):
        """The mean of the tokens: the pre-logits embedding, or the logits."""
        pooled = tokens.mean(dim=1)
        return pooled if pre_logits else self.mlp_head(pooled)

    def forward(self, x, return_embed=False):
        tokens = self.forward_features(x)
        if return_embed:
            return rearrange(on_grid(tokens, self.token_grid(x.shape)), 'b d ... -> b ... d')
        return self.forward_head(tokens)


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


def as_tuple(value, ndim):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * ndim


# causal masks (vit-pytorch's `vit_nd_masking` functions; that module imports them from here)


def nd_causal_mask_fn(num_patches_per_dim, causal_dims, has_cls=False, *, patches_attend_cls=True):
    """mask_fn(b, h, q_idx, k_idx) -> bool, True where query q_idx may attend to key k_idx (broadcasting indices).

    A key is allowed when its index along every dimension of `causal_dims` is at most the query's. With
    `has_cls`, index 0 is the cls token: it attends to all, and every token attends to it unless
    `patches_attend_cls=False`.
    """
    num_patches_per_dim = tuple(num_patches_per_dim)
    causal_dims = tuple(causal_dims)
    strides = [math.prod(num_patches_per_dim[dim + 1:]) for dim in causal_dims]

    def mask_fn(b, h, q_idx, k_idx):
        q_idx, k_idx = torch.as_tensor(q_idx), torch.as_tensor(k_idx)
        q_patch, k_patch = (q_idx - 1, k_idx - 1) if has_cls else (q_idx, k_idx)
        allowed = torch.ones(torch.broadcast_shapes(q_idx.shape, k_idx.shape), dtype=torch.bool, device=q_idx.device)
        for dim, stride in zip(causal_dims, strides):
            size = num_patches_per_dim[dim]
            allowed = allowed & ((q_patch // stride) % size >= (k_patch // stride) % size)
        if has_cls:
            q_cls, k_cls = q_idx == 0, k_idx == 0
            allowed = (allowed & ~q_cls & ~k_cls) | q_cls | (k_cls & patches_attend_cls)
        return allowed

    return mask_fn


def get_nd_causal_mask_fn(num_patches_per_dim, causal_dims, ndim=None, has_cls=False, *, patches_attend_cls=True):
    """`nd_causal_mask_fn` for `causal_dims` (an int or a sequence of dimensions), or None when it is None."""
    if causal_dims is None:
        return None
    causal_dims = check_causal_dims(causal_dims, len(num_patches_per_dim) if ndim is None else ndim)
    return nd_causal_mask_fn(num_patches_per_dim, causal_dims, has_cls=has_cls, patches_attend_cls=patches_attend_cls)


def create_nd_block_mask(mask_fn, heads, seq_len, device):
    """The dense (seq_len, seq_len) boolean mask of `mask_fn` over every query and key, on `device`; `heads`
    is vit-pytorch's argument (its flex BlockMask is per head), one mask serves them all here."""
    vit.positive_int('heads', heads)
    vit.positive_int('seq_len', seq_len)
    indices = torch.arange(seq_len, device=device)
    return mask_fn(0, 0, indices[:, None], indices[None, :])


def nd_attention(q, k, v, mask_fn=None, block_mask=None, scale=None):
    """softmax(q k^T * scale) v over (b, heads, n, d) queries, keys and values, restricted to `block_mask`
    (a dense boolean mask, `create_nd_block_mask`) or else to `mask_fn`; scale None is d ** -0.5."""
    if block_mask is None and mask_fn is not None:
        block_mask = create_nd_block_mask(mask_fn, 1, q.shape[-2], q.device)
    if block_mask is not None and not isinstance(block_mask, torch.Tensor):
        raise TypeError(f"block_mask must be a dense boolean torch.Tensor (create_nd_block_mask), got "
                        f"{type(block_mask).__name__}")
    return vit.attend(q, k, v, scale=1 / math.sqrt(q.shape[-1]) if scale is None else scale, mask=block_mask)


# argument checks


def check_arguments(*, ndim, input_shape, patch_size, num_classes, dim, depth, heads, mlp_dim, pool, channels,
                    dim_head, dropout, emb_dropout, causal_dims):
    vit.positive_int('ndim', ndim)
    sizes = {}
    for name, value in dict(input_shape=input_shape, patch_size=patch_size).items():
        sizes[name] = as_tuple(value, ndim)
        if len(sizes[name]) != ndim:
            raise ValueError(f"{name} must be an int or a tuple of ndim={ndim} ints, got {value!r}")
        for side in sizes[name]:
            vit.positive_int(name, side)
    for i, (side, patch) in enumerate(zip(sizes['input_shape'], sizes['patch_size'])):
        if side % patch:
            raise ValueError(f"input_shape {sizes['input_shape']} must be divisible by patch_size "
                             f"{sizes['patch_size']} (dimension {i}: {side} by {patch})")
    for name, value in dict(dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels,
                            dim_head=dim_head).items():
        vit.positive_int(name, value)
    vit.non_negative_int('num_classes', num_classes)
    vit.probability('dropout', dropout)
    vit.probability('emb_dropout', emb_dropout)
    if pool not in ('cls', 'mean'):
        raise ValueError(f"pool must be 'cls' (cls token) or 'mean' (mean pooling), got {pool!r}")
    if causal_dims is not None:
        check_causal_dims(causal_dims, ndim)


def check_rotary_arguments(prefix, min_freq, max_freq, zero_fraction, *, channels_per_frequency, **arguments):
    """A rotary variant's arguments: the N-D ViT's `arguments` (its tokens mean-pooled), then its golden-gate
    frequencies' (`check_frequencies`), dim_head // channels_per_frequency of them a head (RoPE turns channel
    pairs: 2; PoPE gives every channel a phase: 1)."""
    check_arguments(pool='mean', **arguments)
    dim_head = arguments['dim_head']
    check_frequencies(prefix, dim_head, min_freq, max_freq, zero_fraction, pairs=dim_head // channels_per_frequency)


def check_frequencies(prefix, dim_head, min_freq, max_freq, zero_fraction, *, pairs):
    """The golden-gate frequency arguments of a rotary variant (`prefix`: rope, pope) for `pairs` frequencies."""
    if pairs < 1:
        raise ValueError(f"dim_head must give at least one frequency ({prefix}: {pairs} from dim_head={dim_head})")
    for name, value in ((f'{prefix}_min_freq', min_freq), (f'{prefix}_max_freq', max_freq)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    vit.probability(f'{prefix}_p_zero_freqs', zero_fraction)
    if round(zero_fraction * pairs) >= pairs and pairs > 1:
        raise ValueError(f"{prefix}_p_zero_freqs={zero_fraction} leaves none of the {pairs} frequencies non-zero; "
                         f"expected a fraction below {(pairs - 0.5) / pairs:.3g}")


def check_causal_dims(causal_dims, ndim):
    """The causal dimensions as a tuple of distinct ints in [0, ndim), or a clear error."""
    dims = (causal_dims,) if isinstance(causal_dims, int) and not isinstance(causal_dims, bool) else causal_dims
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"causal_dims must be None, an int or a tuple of ints (dimensions of the input grid), "
                        f"got {causal_dims!r}")
    if not all(0 <= d < ndim for d in dims) or len(set(dims)) != len(dims):
        raise ValueError(f"causal_dims must be distinct dimensions between 0 and ndim - 1 = {ndim - 1}, "
                         f"got {causal_dims!r}")
    return tuple(dims)


def check_input(x, *, channels, patch_size, dtype, input_shape=None):
    """x as (b, channels, *sides): each side a positive multiple of its patch size (the rotary models, as
    vit-pytorch's), or with `input_shape` exactly that (the plain ViTND's learned position table fixes its grid)."""
    ndim = len(patch_size)
    expected = (f"(b, {channels}, {', '.join(map(str, input_shape))})" if input_shape is not None else
                f"(b, {channels}, {', '.join(f'd_{i}' for i in range(ndim))}), each d_i a positive multiple of "
                f"patch_size {tuple(patch_size)}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape {expected}, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating point tensor, got dtype {x.dtype}; convert with x.float()")
    if x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"x has dtype {x.dtype} but the model's parameters are {dtype}; convert with x.to({dtype}) "
                        f"or run the model under torch.autocast")
    if x.ndim != 2 + ndim or x.shape[1] != channels:
        raise ValueError(f"x must have shape {expected}, got {tuple(x.shape)}: (batch, channels={channels}, "
                         f"then ndim={ndim} sides)")
    if input_shape is not None and tuple(x.shape[2:]) != tuple(input_shape):
        raise ValueError(f"x must have shape {expected} (batch, channels, the model's input_shape), got "
                         f"{tuple(x.shape)}: its learned position table holds one row per patch of input_shape, so "
                         f"it takes no other grid (vit_nd_rotary's and vit_nd_pope's ViTND take any multiple of "
                         f"patch_size)")
    for i, (side, patch) in enumerate(zip(x.shape[2:], patch_size)):
        if side == 0 or side % patch:
            raise ValueError(f"x must have shape {expected}, got {tuple(x.shape)}: dimension {i} (x.shape[{i + 2}]) "
                             f"is {side}, not a positive multiple of its patch size {patch}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `ViTND`: our names; its cls token and position table carry a leading batch axis. A causal
    model is refused: vit-pytorch's lets patches attend to the cls token, which has read later slices."""
    if model.causal_dims is not None:
        raise ValueError(
            f"vit-pytorch's ViTND with causal_dims lets every patch attend to the cls token, which has read every "
            f"later slice after one layer, so its causal dimensions are not causal from depth 2 on; this "
            f"ViTND(causal_dims={model.causal_dims}) keeps the cls token a readout no patch attends to and "
            f"computes another function: load the checkpoint into a ViTND built with causal_dims=None"
        )
    batched = ('pos_embedding', 'cls_token')
    plan = {key: ({key: (1, *tensor.shape) if key in batched else tuple(tensor.shape)},
                  (lambda t: t[0]) if key in batched else (lambda t: t))
            for key, tensor in model.state_dict().items()}
    return plan, ('mlp_head.',)
