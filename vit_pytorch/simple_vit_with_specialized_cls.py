"""SimpleViT whose cls token has parameters of its own.

"Revisiting [CLS] and Patch Token Interaction in Vision Transformers", Marouani, Simeoni, Jegou,
Bojanowski and Vo, arXiv 2602.08626: the cls token (global) and the patch tokens (local) play different
roles, yet a ViT runs both through the same LayerNorms and projections; the paper finds the pre-attention
LayerNorm already pulls them apart, and gives the two kinds of token separate parameters ("layer
specialization") where it helps most: every normalization layer, and the query/key/value projection of the
first layers. The tokens still meet in attention; only the per-token maps are split.

As in vit-pytorch's module of the same name: a cls token first, then the patch tokens with SimpleViT's
sin-cos positions; each layer's two pre-norms and the final norm are specialized, and so is the qkv
projection of the first `specialize_qkv_depth` layers (default `depth // 3`, vit-pytorch's, whose comment
says the authors found the first third enough; not checked against the paper's text, which was not reachable);
the feed-forward weights and attention's output projection stay shared; the cls token classifies.

    import torch
    from vit_pytorch.simple_vit_with_specialized_cls import SimpleViT

    model = SimpleViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16,
                      mlp_dim=2048)
    logits = model(torch.randn(1, 3, 256, 256))     # (1, 1000)
    len(model.transformer.layers[0][0].to_qkv.fns)  # 2: the cls token's and the patches' projections
"""

import functools

import torch
from einops import repeat
from torch import nn

from vit_pytorch import simple_vit, vit


class Specialized(nn.Module):
    """`fns[0]` on the cls token (the first), `fns[1]` on the patch tokens: (b, 1 + n, d) -> (b, 1 + n, d')."""

    def __init__(self, modules):
        super().__init__()
        self.fns = nn.ModuleList(modules)

    def forward(self, x):
        cls_fn, patch_fn = self.fns
        return torch.cat((cls_fn(x[:, :1]), patch_fn(x[:, 1:])), dim=1)


def specialized_norm(dim):
    return Specialized([nn.LayerNorm(dim), nn.LayerNorm(dim)])


class FeedForward(nn.Module):
    """SimpleViT's MLP behind a specialized LayerNorm; its weights are shared by all tokens."""

    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.norm = specialized_norm(dim)
        self.net = nn.Sequential(nn.Linear(dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, dim))

    def forward(self, x):
        return self.net(self.norm(x))


class Attention(vit.Attention):
    """SimpleViT's attention behind a specialized LayerNorm; `specialize_qkv`: a qkv projection per kind of token."""

    def __init__(self, dim, heads=8, dim_head=64, specialize_qkv=False):
        inner_dim = heads * dim_head
        to_qkv = Specialized([nn.Linear(dim, inner_dim * 3, bias=False) for _ in range(2)]) if specialize_qkv else None
        super().__init__(dim, heads, dim_head, norm=specialized_norm(dim), to_qkv=to_qkv,
                         to_out=nn.Linear(inner_dim, dim, bias=False))


class Transformer(vit.Stack):
    """vit-pytorch's `Transformer` of this module: `depth` layers, the first `specialize_qkv_depth` with
    specialized qkv projections, then a specialized LayerNorm. `attention` builds each layer's attention from
    (dim, heads, dim_head, specialize_qkv=...)."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, specialize_qkv_depth, *, attention=Attention):
        super().__init__([(attention(dim, heads, dim_head, specialize_qkv=index < specialize_qkv_depth),
                           FeedForward(dim, mlp_dim)) for index in range(depth)], norm=specialized_norm(dim))


class SimpleViT(simple_vit.SimpleViT):
    """A SimpleViT with a cls token, which classifies, and layers specialized for it.

    `forward_features` returns all tokens after the final (specialized) norm, (b, 1 + h * w, dim), the cls
    token first. `num_classes=0` makes `forward` return the cls token's embedding (b, dim).
    """

    num_prefix_tokens = 1

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 specialize_qkv_depth=None):
        check_arguments(**vit.arguments(locals()))
        specialize_qkv_depth = depth // 3 if specialize_qkv_depth is None else specialize_qkv_depth
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head, attention=Attention,
                         transformer=functools.partial(Transformer, specialize_qkv_depth=specialize_qkv_depth))
        self.specialize_qkv_depth = specialize_qkv_depth
        self.cls_token = nn.Parameter(torch.randn(dim) * 1e-2)     # vit-pytorch's initialisation

    def embed_tokens(self, patches, grid, indices=None):
        """The cls token (no position), then `patches` with their positions: (b, 1 + k, dim)."""
        x = super().embed_tokens(patches, grid, indices)
        return torch.cat((repeat(self.cls_token, 'd -> b 1 d', b=x.shape[0]), x), dim=1)

    def forward_head(self, tokens, pre_logits=False):
        """The cls token, then the head."""
        x = self.to_latent(tokens[:, 0])
        return x if pre_logits else self.linear_head(x)


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dim_head,
                    specialize_qkv_depth):
    vit.positive_int('depth', depth)
    if specialize_qkv_depth is not None and vit.non_negative_int('specialize_qkv_depth', specialize_qkv_depth) > depth:
        raise ValueError(f"specialize_qkv_depth must be at most depth ({depth}): the number of first layers whose "
                         f"qkv projection is specialized, got {specialize_qkv_depth}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's module has our parameter names and computes the same function."""
    return None
