"""Parallel ViT.

"Three things everyone should know about Vision Transformers", Touvron et al., arXiv 2203.09795:
replace pairs of sequential blocks by parallel ones. Each layer sums several
attention branches, then several MLP branches, all reading the same input:

    x = x + attn_1(x) + ... + attn_k(x)
    x = x + mlp_1(x) + ... + mlp_k(x)

With k = 2 branches and half the depth, the model has the same parameters and compute as the
sequential one but is shallower and wider; the paper finds it about as accurate, with lower
latency. The branches are the core's pre-norm `Attention` and `FeedForward`, unchanged, and
the rest is the core ViT (so its patch embedding carries the core's LayerNorms, where
`vit-pytorch`'s parallel ViT has a bare Linear).

    import torch
    from vit_pytorch.parallel_vit import ViT

    model = ViT(image_size=256, patch_size=16, num_classes=1000, dim=1024, depth=6, heads=8,
                mlp_dim=2048, num_parallel_branches=2, dropout=0.1, emb_dropout=0.1)
    logits = model(torch.randn(4, 3, 256, 256))   # (4, 1000)

The paper's models (its Table 1 and released checkpoints) are the DeiT widths, written
depth x branches, at patch 16 and MLP ratio 4, with qkv bias, LayerNorm eps 1e-6 and a plain
patch projection; each has exactly the parameters of the sequential ViT with depth x branches
blocks:

    vit_small_6x2()     ViT-S 12x1 -> 6x2    width 384, 6 heads     22.1M
    vit_small_18x2()    ViT-S 36x1 -> 18x2   width 384, 6 heads     64.6M
    vit_base_6x2()      ViT-B 12x1 -> 6x2    width 768, 12 heads    86.6M
    vit_base_18x2()     ViT-B 36x1 -> 18x2   width 768, 12 heads   256.7M
    vit_large_12x2()    ViT-L 24x1 -> 12x2   width 1024, 16 heads  304.3M

The paper trains them with DeiT III's recipe, whose LayerScale (2 x dim per branch) this module
leaves out, as `vit-pytorch` does.
"""

from torch import nn

from vit_pytorch import vit


class Parallel(nn.Module):
    """The sum of the branches' outputs on the same input."""

    def __init__(self, *fns):
        super().__init__()
        self.fns = nn.ModuleList(fns)

    def forward(self, x):
        return sum(fn(x) for fn in self.fns)


def parallel(block, branches):
    """A builder of `Parallel` blocks: `branches` copies of what `block(*args, **kwargs)` builds."""
    def build(*args, **kwargs):
        return Parallel(*[block(*args, **kwargs) for _ in range(branches)])
    return build


class ViT(vit.ViT):
    """The core ViT (same arguments, methods and `num_classes=0` behaviour) with parallel blocks.

    `patch_norm`, `qkv_bias` and `norm_eps` are the core's (defaults: vit-pytorch's model;
    `patch_norm=False, qkv_bias=True, norm_eps=1e-6`: the paper's).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, pool='cls',
                 num_parallel_branches=2, channels=3, dim_head=64, dropout=0., emb_dropout=0.,
                 patch_norm=True, qkv_bias=False, norm_eps=1e-5):
        vit.positive_int('num_parallel_branches', num_parallel_branches)
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim,
                         depth=depth, heads=heads, mlp_dim=mlp_dim, pool=pool, channels=channels,
                         dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout,
                         patch_norm=patch_norm, qkv_bias=qkv_bias, norm_eps=norm_eps,
                         attention=parallel(vit.Attention, num_parallel_branches),
                         feedforward=parallel(vit.FeedForward, num_parallel_branches))


# the paper's models: width -> (dim, heads); all with patch 16, heads of 64, MLP ratio 4
WIDTHS = {'small': (384, 6), 'base': (768, 12), 'large': (1024, 16)}


def parallel_vit(width, depth, branches=2, *, image_size=224, num_classes=1000, **overrides):
    """The paper's ViT-`width` (a key of WIDTHS) as `depth` parallel blocks of `branches` branches."""
    if width not in WIDTHS:
        raise ValueError(f"width must be one of {sorted(WIDTHS)}, got {width!r}")
    dim, heads = WIDTHS[width]
    kwargs = dict(image_size=image_size, patch_size=16, num_classes=num_classes, dim=dim, depth=depth,
                  heads=heads, dim_head=64, mlp_dim=4 * dim, num_parallel_branches=branches,
                  patch_norm=False, qkv_bias=True, norm_eps=1e-6)
    return ViT(**{**kwargs, **overrides})


def vit_small_6x2(**kwargs):
    return parallel_vit('small', 6, 2, **kwargs)


def vit_small_18x2(**kwargs):
    return parallel_vit('small', 18, 2, **kwargs)


def vit_base_6x2(**kwargs):
    return parallel_vit('base', 6, 2, **kwargs)


def vit_base_18x2(**kwargs):
    return parallel_vit('base', 18, 2, **kwargs)


def vit_large_12x2(**kwargs):
    return parallel_vit('large', 12, 2, **kwargs)
