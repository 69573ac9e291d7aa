"""ViT for small datasets: shifted patch tokenization and locality self-attention.

"Vision Transformer for Small-Size Datasets", Lee, Lee and Song, arXiv 2112.13492: give the
ViT the locality bias that small datasets cannot teach it.
  - Shifted Patch Tokenization (SPT): the image is concatenated along channels with
    four copies of itself shifted by half a patch in the four diagonal directions, then cut into
    patches, layer-normed and projected, so each token also sees its neighbours' pixels.
  - Locality Self-Attention (LSA): a token may not attend to itself (the diagonal of
    the similarity matrix is masked), and the softmax temperature is learned, which sharpens the
    attention towards the other tokens.

`vit-pytorch` shifts by one pixel left, right, up and down; here the shifts are the paper's
(half a patch, diagonally). The parameter names and shapes are vit-pytorch's, but its checkpoints
compute another function here, so `vit_pytorch.pretrained.load_vit_pytorch` refuses them.

    import torch
    from vit_pytorch.vit_for_small_dataset import ViT

    model = ViT(image_size=32, patch_size=4, num_classes=10,
                dim=192, depth=9, heads=12, dim_head=16, mlp_dim=384)
    logits = model(torch.randn(8, 3, 32, 32))   # (8, 10)

The paper's SL-ViT (official code, `create_model('vit')` with SPT and LSA): width 192, depth 9,
12 heads of 16, MLP ratio 2, patch 4 on 32-pixel images (CIFAR-10/100, SVHN) and 8 on 64-pixel
ones (Tiny-ImageNet):

    sl_vit_cifar(num_classes=100)          32 px, patch 4   2.75M parameters
    sl_vit_tiny_imagenet(num_classes=200)  64 px, patch 8   2.91M parameters

The official LSA learns one temperature per head; here, as in `vit-pytorch`, one per layer
(11 parameters fewer per layer).
"""

import torch
import torch.nn.functional as F
from einops import rearrange
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit


class SPT(nn.Module):
    """Shifted patch tokenization: (b, c, h, w) -> (b, patches, dim).

    Takes the arguments of `vit_pytorch.vit.PatchEmbedding`, with vit-pytorch's default `channels=3`;
    `patch_norm=False` leaves out its LayerNorm over the patches (there is none after the projection).
    """

    def __init__(self, *, dim, patch_size, channels=3, patch_norm=True, norm_eps=1e-5):
        super().__init__()
        patch_height, patch_width = vit.positive_pair('patch_size', patch_size)
        if patch_height < 2 or patch_width < 2:
            raise ValueError(f"patch_size must be at least 2 in both sides for a half-patch shift, got {patch_size}")
        self.shift = (patch_height // 2, patch_width // 2)
        patch_dim = 5 * channels * patch_height * patch_width
        self.to_patch_tokens = nn.Sequential(
            Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=patch_height, p2=patch_width),
            nn.LayerNorm(patch_dim, eps=norm_eps) if patch_norm else nn.Identity(),
            nn.Linear(patch_dim, dim),
        )

    def shifted_copies(self, img):
        """The image and its four diagonal shifts, zero-filled: (b, 5 c, h, w)."""
        dy, dx = self.shift
        # F.pad with a negative width crops: (left, right, top, bottom) = (sx, -sx, sy, -sy)
        # moves the content by sx columns to the right and sy rows down
        shifts = [(sy, sx) for sy in (-dy, dy) for sx in (-dx, dx)]
        return torch.cat([img] + [F.pad(img, (sx, -sx, sy, -sy)) for sy, sx in shifts], dim=1)

    def forward(self, img):
        return self.to_patch_tokens(self.shifted_copies(img))


class LSA(vit.Attention):
    """Locality self-attention: the core attention without the diagonal and with a learned temperature.

    `temperature` holds the log of the learned scale (initially dim_head ** -0.5, the usual
    scale), as in `vit-pytorch`. The diagonal's logits get the most negative finite value, so
    its weights are exactly zero and a lone token (n = 1) still has a defined softmax.
    """

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., *, qkv_bias=False, norm_eps=1e-5):
        super().__init__(dim, heads, dim_head, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps)
        self.temperature = nn.Parameter(torch.tensor(dim_head ** -0.5).log())

    def forward(self, x):
        q, k, v = self.qkv(x)
        num_tokens = q.shape[-2]
        self_mask = torch.eye(num_tokens, dtype=torch.bool, device=q.device)
        bias = torch.zeros(num_tokens, num_tokens, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill(self_mask, -torch.finfo(q.dtype).max)
        out = self.attend(q * self.temperature.exp(), k, v, scale=1., mask=bias)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class ViT(vit.ViT):
    """The core ViT (same arguments, methods and `num_classes=0` behaviour) with SPT and LSA.

    `forward_features` returns all tokens after the final norm, (b, prefix + h * w, dim), as `vit.ViT`.
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim,
                 pool='cls', channels=3, dim_head=64, dropout=0., emb_dropout=0.):
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim,
                         depth=depth, heads=heads, mlp_dim=mlp_dim, pool=pool, channels=channels,
                         dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout,
                         attention=LSA, patch_embedding=SPT)


def sl_vit(*, image_size=32, num_classes=100, **overrides):
    """The paper's SL-ViT for `image_size` images: patch 4 at 32 pixels, else 8 (as the official code)."""
    patch_size = 4 if image_size == 32 else 8
    kwargs = dict(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=192, depth=9,
                  heads=12, dim_head=16, mlp_dim=384)
    return ViT(**{**kwargs, **overrides})


def sl_vit_cifar(**kwargs):
    return sl_vit(**{'image_size': 32, 'num_classes': 100, **kwargs})


def sl_vit_tiny_imagenet(**kwargs):
    return sl_vit(**{'image_size': 64, 'num_classes': 200, **kwargs})


# loading checkpoints


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's shifted patch tokenization moves the image by one pixel left, right, up and down; the "
        "paper's (and ours) by half a patch in the four diagonal directions. The parameters have the same "
        "shapes, so its weights would load silently into a model that sees other pixels")
