"""ViT around any efficient attention backbone (vit-pytorch's `vit_pytorch.efficient.ViT`).

`transformer` is any module mapping tokens (b, n, dim) to (b, n, dim): a Linformer, Performer,
Nyströmformer, or `vit_pytorch.vit.encoder(...)`. The patches are embedded as in `ViT` (a Linear
between two LayerNorms), the cls token joins them with a learned position table, and the head is a
LayerNorm and a Linear on the cls token or the mean token. The parameters carry vit-pytorch's names
and shapes, so its checkpoints load strictly (with the same `transformer`).

    import torch
    from vit_pytorch.efficient import ViT
    from vit_pytorch.vit import encoder

    model = ViT(image_size=32, patch_size=8, num_classes=10, dim=64,
                transformer=encoder(64, depth=2, heads=4, dim_head=16, mlp_dim=128))
    logits = model(torch.randn(2, 3, 32, 32))      # (2, 10)
"""

import torch
from einops import repeat
from torch import nn

from vit_pytorch import vit


class ViT(nn.Module):
    def __init__(self, *, image_size, patch_size, num_classes, dim, transformer, pool='cls', channels=3):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.channels, self.pool, self.num_classes = channels, pool, num_classes
        grid = vit.patch_grid(self.image_size, self.patch_size)
        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim)
        # vit-pytorch's shapes: (1, 1 + patches, dim) and (1, 1, dim), a unit normal as there
        self.pos_embedding = nn.Parameter(torch.randn(1, 1 + grid[0] * grid[1], dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.dropout = nn.Identity()     # vit-pytorch's efficient ViT has no embedding dropout
        self.transformer = transformer
        self.mlp_head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))

    def embed(self, img):
        """[cls, patches] with their positions: (b, 1 + h * w, dim)."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.cls_token.dtype)
        x = self.to_patch_embedding(img)
        x = torch.cat((repeat(self.cls_token, '1 n d -> b n d', b=x.shape[0]), x), dim=1)
        return x + self.pos_embedding

    def forward_head(self, tokens, pre_logits=False):
        x = tokens.mean(dim=1) if self.pool == 'mean' else tokens[:, 0]
        return x if pre_logits else self.mlp_head(x)

    def forward(self, img):
        return self.forward_head(self.transformer(self.embed(img)))


def check_arguments(*, image_size, patch_size, num_classes, dim, transformer, pool, channels):
    vit.positive_int('num_classes', num_classes)
    vit.positive_int('dim', dim)
    vit.positive_int('channels', channels)
    if not isinstance(transformer, nn.Module):
        raise TypeError(f"transformer must be an nn.Module mapping (b, n, dim) to (b, n, dim), "
                        f"got {type(transformer).__name__}")
    if pool not in ('cls', 'mean'):
        raise ValueError(f"pool must be 'cls' or 'mean', got {pool!r}")
    vit.patch_grid(vit.positive_pair('image_size', image_size), vit.positive_pair('patch_size', patch_size))


def vit_pytorch_plan(model, keys):
    """vit-pytorch's efficient `ViT` has our parameter names and shapes."""
    return None
