"""Attention masks for tokens laid on an N-dimensional grid: causal dimensions (vit-pytorch's `vit_nd_masking`).

The tokens of an N-D grid of patches lie row-major, dimension 0 outermost. Along a causal dimension a token
may attend to the tokens at its own index or before it, never after: the time axis of an occupancy video, the
depth of a volume scanned in order. With several causal dimensions a key must be no later along any of them.

    import torch
    from vit_pytorch.vit_nd_masking import get_nd_causal_mask_fn, create_nd_block_mask, nd_attention

    mask_fn = get_nd_causal_mask_fn((4, 3, 2), causal_dims=0, ndim=3, has_cls=True)
    mask = create_nd_block_mask(mask_fn, heads=8, seq_len=1 + 4 * 3 * 2, device='cpu')   # (25, 25) bool
    q = k = v = torch.randn(2, 8, 25, 16)
    out = nd_attention(q, k, v, block_mask=mask, scale=16 ** -0.5)                         # (2, 8, 25, 16)

vit-pytorch computes the attention with flex attention where its compiled kernel runs and a dense matrix
elsewhere; flex attention has no backward on a CPU, so its models train only where they fall back. Here the
mask is dense and boolean and the attention is `vit.attend` (scaled_dot_product_attention), which trains
anywhere: `create_nd_block_mask` returns that dense (seq_len, seq_len) mask, the same on every device, in
place of a flex `BlockMask` (`heads` is taken for vit-pytorch's signature; one mask serves every head).
vit-pytorch's `flex_attention_supported` has no counterpart: nothing here depends on the platform.

With `has_cls=True` position 0 is a cls token that attends to every token and that every token attends to,
as in vit-pytorch. That cls token has seen every later slice after one layer, so from the second layer on a
patch that reads it sees later slices too: `patches_attend_cls=False` keeps it a pure readout (it attends to
all, no patch attends to it), which is what `vit_nd.ViTND` uses to keep its causal dimensions causal.
"""

import math

import torch

from vit_pytorch import vit


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
    return vit.attend(q, k, v, scale=q.shape[-1] ** -0.5 if scale is None else scale, mask=block_mask)


# argument checks


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
