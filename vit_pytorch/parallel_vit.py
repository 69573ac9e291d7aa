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


class Transformer(vit.Transformer):
    """The core pre-norm stack whose attention and MLP are each `num_parallel_branches` parallel branches."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, num_parallel_branches=2, dropout=0.):
        super().__init__(dim, 0, heads, dim_head, mlp_dim, dropout)
        branches = range(num_parallel_branches)
        self.layers.extend(
            nn.ModuleList([
                Parallel(*[vit.Attention(dim, heads, dim_head, dropout) for _ in branches]),
                Parallel(*[vit.FeedForward(dim, mlp_dim, dropout) for _ in branches]),
            ])
            for _ in range(depth)
        )


class ViT(vit.ViT):
    """The core ViT (same arguments, methods and `num_classes=0` behaviour) with parallel blocks."""

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, pool='cls',
                 num_parallel_branches=2, channels=3, dim_head=64, dropout=0., emb_dropout=0.):
        vit.positive_int('num_parallel_branches', num_parallel_branches)
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim,
                         depth=depth, heads=heads, mlp_dim=mlp_dim, pool=pool, channels=channels,
                         dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout)
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, num_parallel_branches, dropout)
