"""SimpleViT that also reads the image's Fourier transform.

vit-pytorch's own variant (no paper cited): besides the patch tokens, the transformer sees tokens of the
image's 2D discrete Fourier transform. Each channel's `torch.fft.fft2` (over height and width, the full
spectrum, unshifted) is split into real and imaginary parts, cut into `freq_patch_size` patches of the
(h, w) frequency grid, and embedded as SimpleViT embeds pixels (LayerNorm, Linear, LayerNorm, a sin-cos
table of the frequency-patch grid). A Fourier token is global: one pixel changes every one of them. The
Fourier tokens come first; the mean of the patch tokens classifies.

    import torch
    from vit_pytorch.simple_vit_with_fft import SimpleViT

    model = SimpleViT(image_size=256, patch_size=8, freq_patch_size=8, num_classes=1000, dim=1024, depth=1,
                      heads=8, mlp_dim=2048)
    logits = model(torch.randn(2, 3, 256, 256))     # (2, 1000)

As in vit-pytorch, the images must be of `image_size` (the Fourier tokens' position table is for that
grid); other sizes are refused by name.
"""

import math

import torch
from einops import rearrange

from vit_pytorch import simple_vit, vit
from vit_pytorch.vit import pair


def fourier_image(img):
    """The 2D DFT of each channel as real and imaginary planes: (b, c, h, w) -> (b, 2 * c, h, w), the real
    parts of every channel first, then the imaginary parts."""
    if img.shape[0] == 0:                      # the CPU's FFT (MKL) refuses an empty batch
        return img.new_zeros(0, 2 * img.shape[1], *img.shape[-2:])
    return rearrange(torch.view_as_real(torch.fft.fft2(img)), 'b c h w ri -> b (ri c) h w')


class SimpleViT(simple_vit.SimpleViT):
    """SimpleViT with (image_size / freq_patch_size) Fourier tokens before the patch tokens.

    `forward_features` returns all tokens after the final norm, (b, freq tokens + h * w, dim), the Fourier
    tokens first (`num_prefix_tokens` of them). `num_classes=0` makes `forward` return the pooled embedding
    (b, dim), the mean of the patch tokens.
    """

    def __init__(self, *, image_size, patch_size, freq_patch_size, num_classes, dim, depth, heads, mlp_dim,
                 channels=3, dim_head=64):
        check_arguments(**vit.arguments(locals()))
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head)
        self.freq_patch_size = pair(freq_patch_size)
        freq_grid = vit.patch_grid(self.image_size, self.freq_patch_size)
        self.num_prefix_tokens = math.prod(freq_grid)
        # real and imaginary planes as 2 * channels channels: a patch flattens as (p1 p2 ri c), vit-pytorch's order
        self.to_freq_embedding = vit.PatchEmbedding(channels=2 * channels, patch_size=self.freq_patch_size, dim=dim)
        self.register_buffer('freq_pos_embedding', simple_vit.posemb_sincos_2d(*freq_grid, dim), persistent=False)

    def fourier_tokens(self, img):
        """The Fourier tokens of checked images of `image_size`, with their positions: (b, freq tokens, dim)."""
        tokens = self.to_freq_embedding(fourier_image(img))
        return tokens + self.freq_pos_embedding.to(tokens.dtype)

    def embed(self, img):
        """Fourier tokens, then patch tokens, each with their positions: (b, freq tokens + h * w, dim)."""
        patches = super().embed(img)                 # checks the images
        if tuple(img.shape[-2:]) != self.image_size:
            raise ValueError(f"img must be {self.image_size[0]}x{self.image_size[1]} (h x w), the model's image_size "
                             f"(its Fourier tokens' position table is for that size), got "
                             f"{img.shape[-2]}x{img.shape[-1]}")
        return torch.cat((self.fourier_tokens(img), patches), dim=1)


# argument checks


def check_arguments(*, image_size, patch_size, freq_patch_size, num_classes, dim, depth, heads, mlp_dim, channels,
                    dim_head):
    image_size = vit.positive_pair('image_size', image_size)
    freq_patch_size = vit.positive_pair('freq_patch_size', freq_patch_size)
    if image_size[0] % freq_patch_size[0] or image_size[1] % freq_patch_size[1]:
        raise ValueError(f"image_size {image_size} must be divisible by freq_patch_size {freq_patch_size} in both "
                         f"height and width")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's module has our parameter names and computes the same function."""
    return None
