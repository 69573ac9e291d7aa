"""SimpleViT with PatchDropout.

"PatchDropout: Economizing Vision Transformers Using Patch Dropout", Liu et al.,
arXiv 2208.07220: during training, keep only a random subset of the patch tokens (after the
position embeddings are added, so each kept token still knows where it came from); the
transformer's cost falls with the sequence length, and accuracy holds or improves. At
evaluation every patch is kept.

    import torch
    from vit_pytorch.simple_vit_with_patch_dropout import SimpleViT

    model = SimpleViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6,
                      heads=16, mlp_dim=2048, patch_dropout=0.5)   # trains on 32 of 64 patches
    logits = model(torch.randn(2, 3, 256, 256))   # (2, 1000)
"""

import torch
from einops import repeat
from torch import nn

from vit_pytorch import simple_vit, vit


class PatchDropout(nn.Module):
    """In training, keep max(1, int(n (1 - prob))) random tokens of each sample; (b, n, d) -> (b, keep, d)."""

    def __init__(self, prob):
        super().__init__()
        self.prob = vit.probability('patch_dropout', prob)

    def forward(self, x):
        if not self.training or self.prob == 0.:
            return x
        batch, num_tokens, dim = x.shape
        keep = max(1, int(num_tokens * (1 - self.prob)))
        indices = torch.rand(batch, num_tokens, device=x.device).topk(keep, dim=-1).indices   # (b, keep)
        return x.gather(1, repeat(indices, 'b k -> b k d', d=dim))


class SimpleViT(simple_vit.SimpleViT):
    """`vit_pytorch.simple_vit.SimpleViT` (same arguments and methods) with patch dropout in training.

    `forward_features` returns all tokens after the final norm: (b, h * w, dim) in eval mode, the kept patches' in
    training.
    `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3,
                 dim_head=64, patch_dropout=0.5):
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim,
                         depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head)
        self.patch_dropout = PatchDropout(patch_dropout)

    def embed_tokens(self, patches, grid, indices=None):
        """Patch tokens with their positions: (b, k, dim), or (b, kept, dim) in training."""
        return self.patch_dropout(super().embed_tokens(patches, grid, indices))
