"""ViT with PatchDropout: vit-pytorch's `vit_pytorch.vit_with_patch_dropout.ViT`.

"PatchDropout: Economizing Vision Transformers Using Patch Dropout", Liu et al., arXiv 2208.07220:
in training, keep only a random subset of the patch tokens, after their position embeddings are
added (so each kept token still knows where it came from) and before the cls token joins; the
encoder's cost falls with the sequence length. At evaluation every patch is kept. (SimpleViT's
version is `vit_pytorch.simple_vit_with_patch_dropout`.)

    import torch
    from vit_pytorch.vit_with_patch_dropout import ViT

    model = ViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16,
                mlp_dim=2048, dropout=0.1, emb_dropout=0.1, patch_dropout=0.25)   # trains on 48 of 64 patches
    logits = model(torch.randn(2, 3, 256, 256))   # (2, 1000)

The arguments, parameter names and the function are vit-pytorch's (1.26.14), whose checkpoints load
unchanged (`load_state_dict`, or `vit_pytorch.pretrained.load_vit_pytorch`). That model is not
`vit_pytorch.vit.ViT` with patch dropout: the patch projection is a plain Linear (no Dual PatchNorm),
the position table covers the patches only (the cls token has none), the encoder ends without a
norm and the head is a LayerNorm and a Linear on the pooled token, and `pool='mean'` averages the
cls token with the kept patches. `num_classes=0` makes `forward` return the pooled, normed
embedding (b, dim) (vit-pytorch builds a Linear with no outputs).
"""

import math

import torch
from einops import repeat
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit
from vit_pytorch.vit import PatchDropout  # noqa: F401  (vit-pytorch's vit_with_patch_dropout.PatchDropout)


class ViT(vit.TokenFace, vit.NormedHead, nn.Module):
    """ViT with patch dropout in training; see the module's docstring for its layout.

    `forward_features` returns the encoder's tokens (not normed), (b, prefix + kept, dim), every patch kept in eval
    mode.
    `num_classes=0` makes `forward` return the pooled embedding after the head's norm, (b, dim).
    """

    num_prefix_tokens = 1

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, pool='cls', channels=3,
                 dim_head=64, dropout=0., emb_dropout=0., patch_dropout=0.25):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.pool, self.channels, self.num_classes, self.embed_dim = pool, channels, num_classes, dim
        patch_height, patch_width = self.patch_size

        self.to_patch_embedding = nn.Sequential(
            Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=patch_height, p2=patch_width),
            nn.Linear(channels * patch_height * patch_width, dim),
        )
        self.pos_embedding = nn.Parameter(torch.randn(math.prod(self.grid_size), dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.patch_dropout = vit.PatchDropout(patch_dropout)
        self.dropout = nn.Dropout(emb_dropout)
        self.transformer = vit.Transformer(dim, depth, heads, dim_head, mlp_dim, dropout, final_norm=False)
        self.to_latent = nn.Identity()
        self.num_features = dim
        self.mlp_head = vit.normed_head(dim, num_classes)

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def embed(self, img):
        """The cls token, then the patch tokens with positions, a random share of them dropped in training:
        (b, 1 + kept, dim)."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.pos_embedding.dtype)
        x = self.patch_dropout(self.to_patch_embedding(img) + self.pos_embedding)
        x = torch.cat((repeat(self.cls_token, '1 1 d -> b 1 d', b=x.shape[0]), x), dim=1)
        return self.dropout(x)

    def forward_features(self, img):
        """The encoder's tokens (not normed): (b, 1 + kept, dim)."""
        return self.transformer(self.embed(img))

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, pool, channels, dim_head,
                    dropout, emb_dropout, patch_dropout):
    vit.check_patches(image_size, patch_size)
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                    channels=channels, dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout,
                                    patch_dropout=patch_dropout)
    if pool not in ('cls', 'mean'):
        raise ValueError(f"pool must be 'cls' (cls token) or 'mean' (mean of all tokens), got {pool!r}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `vit_with_patch_dropout.ViT` has our parameter names and computes the same function."""
    return None
