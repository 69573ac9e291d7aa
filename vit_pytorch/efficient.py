"""ViT around any transformer: vit-pytorch's `vit_pytorch.efficient.ViT`.

The patch embedding, cls token, position table and head of a ViT, with the encoder handed in:
`transformer` is any module that maps tokens (b, n, dim) to (b, n, dim), such as an efficient-
attention encoder (Nystromformer's `nystrom_attention.Nystromformer`, `x_transformers.Encoder`,
or `torch.nn.TransformerEncoder(..., batch_first=True)`). The arguments, parameter names and the
function are vit-pytorch's (1.26.14), whose checkpoints load with `load_state_dict` (strict), given
the same transformer:

  the patch projection sits between two LayerNorms (Dual PatchNorm), the cls token and the
  position table are (1, 1, dim) and (1, 1 + patches, dim) tensors, there is always a cls token,
  `pool='mean'` averages all tokens, the cls token included, and the head is a LayerNorm and a
  Linear applied to the pooled token (the transformer's output is not normed here).

    import torch
    from torch import nn
    from vit_pytorch.efficient import ViT

    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True,
                                       norm_first=True)
    model = ViT(image_size=32, patch_size=8, num_classes=10, dim=64,
                transformer=nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False))
    logits = model(torch.randn(2, 3, 32, 32))   # (2, 10)

vit-pytorch's README uses `Nystromformer(dim=512, depth=12, heads=8, num_landmarks=256)` as the
transformer; `pip install nystrom-attention` (or `x-transformers`) and pass it the same way. Beyond
vit-pytorch: `patch_size` may be an (h, w) pair, bad arguments and images are clear errors, and a
transformer that changes the tokens' shape is reported by name.
"""

import math

import torch
from einops import repeat
from torch import nn

from vit_pytorch import vit


class ViT(vit.NormedHead, nn.Module):
    """A ViT whose encoder is `transformer`; `num_classes=0` makes `forward` return the pooled, normed embedding."""

    num_prefix_tokens = 1

    def __init__(self, *, image_size, patch_size, num_classes, dim, transformer, pool='cls', channels=3):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.pool, self.channels, self.num_classes, self.embed_dim = pool, channels, num_classes, dim

        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim)
        self.pos_embedding = nn.Parameter(torch.randn(1, 1 + math.prod(self.grid_size), dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.transformer = transformer
        self.to_latent = nn.Identity()
        self.mlp_head = vit.normed_head(dim, num_classes)

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def embed(self, img):
        """The cls token and the patch tokens, with positions: (b, 1 + h * w, dim)."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.pos_embedding.dtype)
        x = self.to_patch_embedding(img)
        x = torch.cat((repeat(self.cls_token, '1 1 d -> b 1 d', b=x.shape[0]), x), dim=1)
        return x + self.pos_embedding

    def forward_features(self, img):
        """The transformer's output tokens: (b, 1 + h * w, dim)."""
        x = self.embed(img)
        out = self.transformer(x)
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"transformer must map tokens (b, n, dim) = {tuple(x.shape)} to the same shape, "
                             f"got {got} from {type(self.transformer).__name__}")
        return out


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, transformer, pool, channels):
    vit.check_patches(image_size, patch_size)
    vit.positive_int('dim', dim)
    vit.positive_int('channels', channels)
    vit.non_negative_int('num_classes', num_classes)
    if not isinstance(transformer, nn.Module):
        raise TypeError(f"transformer must be a torch.nn.Module mapping tokens (b, n, dim) to (b, n, dim), got "
                        f"{type(transformer).__name__}")
    if pool not in ('cls', 'mean'):
        raise ValueError(f"pool must be 'cls' (cls token) or 'mean' (mean of all tokens), got {pool!r}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's efficient `ViT` has our parameter names and shapes: its state_dict loads as it is."""
    return None
