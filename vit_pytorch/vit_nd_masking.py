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
vit-pytorch's `flex_attention_supported(device)` is here with its answer, but nothing here reads it: nothing here
depends on the platform.

With `has_cls=True` position 0 is a cls token that attends to every token and that every token attends to,
as in vit-pytorch. That cls token has seen every later slice after one layer, so from the second layer on a
patch that reads it sees later slices too: `patches_attend_cls=False` keeps it a pure readout (it attends to
all, no patch attends to it), which is what `vit_nd.ViTND` uses to keep its causal dimensions causal.

The mask functions live in `vit_nd.py`, the N-D models' family base, so that a model built on it copies one file
beside vit.py (`nd_attention` too); this module is their vit-pytorch import path.
"""

import os
import sys

import torch

from vit_pytorch.vit_nd import (check_causal_dims, create_nd_block_mask, get_nd_causal_mask_fn, nd_attention,
                                nd_causal_mask_fn)

__all__ = ['check_causal_dims', 'create_nd_block_mask', 'flex_attention_supported', 'get_nd_causal_mask_fn',
           'nd_attention', 'nd_causal_mask_fn']


def flex_attention_supported(device):
    """vit-pytorch's answer to whether torch's compiled flex attention kernel runs on `device`: on CUDA, and on an
    x86 CPU with AVX2 (not macOS, no XPU, ATEN_CPU_CAPABILITY not 'default'); nowhere else. vit-pytorch then falls
    back to plain attention; ours always uses the dense mask (`nd_attention`), so nothing here reads it."""
    device = torch.device(device)
    if device.type == 'cuda':
        return True
    if device.type != 'cpu':
        return False
    avx2 = getattr(torch.cpu, '_is_avx2_supported', lambda: False)()
    return bool(avx2) and not torch.xpu.is_available() and sys.platform != 'darwin' and \
        os.getenv('ATEN_CPU_CAPABILITY') != 'default'


