"""SimpleViT with query-key normalisation.

"Scaling Vision Transformers to 22 Billion Parameters", Dehghani et al., arXiv 2302.05442
("QK normalization"): at scale the attention logits grow without bound and the
softmax collapses to one-hot maps, which makes training diverge; applying a LayerNorm to the
queries and keys, per head and before their dot product, bounds the logits.

The two LayerNorms act on each head's vectors (width dim_head; parameters shared by the heads)
and, as in the paper, have no bias. Unlike `vit-pytorch`'s module of the same name, which
ends in a LayerNorm instead of a classifier, the head here is the usual Linear to `num_classes`.

    import torch
    from vit_pytorch.simple_vit_with_qk_norm import SimpleViT

    model = SimpleViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6,
                      heads=16, mlp_dim=2048)
    logits = model(torch.randn(1, 3, 256, 256))   # (1, 1000)
"""

from torch import nn

from vit_pytorch import simple_vit


class Attention(simple_vit.Attention):
    """SimpleViT's attention with q and k layer-normed per head before q k^T."""

    def __init__(self, dim, heads=8, dim_head=64):
        super().__init__(dim, heads, dim_head)
        self.q_norm = nn.LayerNorm(dim_head, bias=False)
        self.k_norm = nn.LayerNorm(dim_head, bias=False)

    def qkv(self, x):
        q, k, v = super().qkv(x)
        return self.q_norm(q), self.k_norm(k), v


class SimpleViT(simple_vit.SimpleViT):
    """`vit_pytorch.simple_vit.SimpleViT` (same arguments and methods) with QK-normalised attention.

    `forward_features` returns all tokens after the final norm, (b, h * w, dim).
    `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64):
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim,
                         depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                         attention=Attention)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's qk-norm SimpleViT computes another function: it ends in a LayerNorm instead of a "
        "classifier, and it normalises queries and keys by their root mean square with a learned gain per head "
        "and no 1/sqrt(dim_head) scale, where ours (as ViT-22B) uses bias-free LayerNorms shared by the heads, "
        "the usual scale and a Linear head")
