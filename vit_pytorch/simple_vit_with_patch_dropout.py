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


from vit_pytorch import simple_vit
# vit-pytorch keeps PatchDropout here; vit_with_patch_dropout shares it, so it lives in the core
from vit_pytorch.vit import PatchDropout


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
