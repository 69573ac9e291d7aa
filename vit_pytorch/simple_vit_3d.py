"""SimpleViT for videos and volumes.

"Better plain ViT baselines for ImageNet-1k", Beyer, Zhai and Kolesnikov, arXiv 2205.01580, on
tubelets (ViViT's tubelet embedding, arXiv 2103.15691, section 3.2): fixed 3D sin-cos position
embeddings, global average pooling, no dropout, no biases in the attention projections. The
arguments and the function are vit-pytorch's (`vit_pytorch.simple_vit_3d.SimpleViT`), whose
checkpoints load unchanged.

The position table is computed for the tubelet grid of each input, so any video whose frames,
height and width divide by the tubelet works, not only `frames` x `image_size`.

    import torch
    from vit_pytorch.simple_vit_3d import SimpleViT

    model = SimpleViT(image_size=128, image_patch_size=16, frames=16, frame_patch_size=2,
                      num_classes=1000, dim=1024, depth=6, heads=8, mlp_dim=2048)
    logits = model(torch.randn(4, 3, 16, 128, 128))   # (4, 1000)
    logits = model(torch.randn(4, 3, 8, 64, 96))       # other sizes work too
"""

import torch
import torch.nn.functional as F
from torch import nn

from vit_pytorch import vit

# helpers


def posemb_sincos_3d(frames, height, width, dim, temperature=10000, dtype=torch.float32, device=None):
    """Fixed 3D sin-cos position table, (frames * height * width, dim), rows in (f, h, w) order.

    A sixth of the channels each holds sin(x w), cos(x w), sin(y w), cos(y w), sin(z w), cos(z w) for
    column x, row y and frame z, with frequencies w = temperature ** -(i / (dim // 6 - 1)); the
    dim % 6 channels left over are zeros.
    """
    if dim < 12:
        raise ValueError(f"dim must be at least 12 for the 3D sin-cos position table, got {dim}")
    z, y, x = torch.meshgrid(torch.arange(frames, device=device), torch.arange(height, device=device),
                             torch.arange(width, device=device), indexing='ij')
    fourier_dim = dim // 6
    omega = temperature ** -(torch.arange(fourier_dim, device=device) / (fourier_dim - 1))
    z, y, x = (axis.flatten()[:, None] * omega for axis in (z, y, x))      # (f * h * w, dim / 6) each
    table = torch.cat((x.sin(), x.cos(), y.sin(), y.cos(), z.sin(), z.cos()), dim=1)
    return F.pad(table, (0, dim - 6 * fourier_dim)).to(dtype)


# classes


class SimpleViT(vit.TokenFace, nn.Module):
    """SimpleViT on tubelets; `num_classes=0` makes `forward` return the pooled embedding (b, dim).

    `forward_features` returns all tokens after the final norm, (b, f * h * w, dim).
    For variants: `transformer` builds the encoder from (dim, depth, heads, dim_head, mlp_dim).
    """

    num_prefix_tokens = 0

    def __init__(self, *, image_size, image_patch_size, frames, frame_patch_size, num_classes, dim, depth, heads,
                 mlp_dim, channels=3, dim_head=64, transformer=vit.SimpleTransformer):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(image_patch_size)
        self.frames, self.frame_patch_size = frames, frame_patch_size
        self.grid_size = self.token_grid((frames, *self.image_size))
        self.channels, self.num_classes = channels, num_classes

        self.to_patch_embedding = vit.TubeletEmbedding(channels=channels, patch_size=self.patch_size,
                                                       frame_patch_size=frame_patch_size, dim=dim)
        # fixed, so not saved; a buffer so that it follows .to(device)
        self.register_buffer('pos_embedding', posemb_sincos_3d(*self.grid_size, dim), persistent=False)
        self.transformer = transformer(dim, depth, heads, dim_head, mlp_dim)
        self.to_latent = nn.Identity()
        self.num_features = dim
        self.linear_head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def token_grid(self, size):
        """The (frames, h, w) tubelet grid for videos of `size` (frames, h, w); of an (h, w) pair, one frame's."""
        return vit.tubelet_grid(size, patch_size=self.patch_size, frame_patch_size=self.frame_patch_size)

    def pos_embedding_for(self, grid):
        """The sin-cos table of a (frames, h, w) tubelet grid: (f * h * w, dim)."""
        if tuple(grid) == self.grid_size:
            return self.pos_embedding
        return posemb_sincos_3d(*grid, self.pos_embedding.shape[-1], device=self.pos_embedding.device)

    def embed(self, video):
        """Tubelet tokens with their positions: (b, f * h * w, dim); any size divisible by the tubelet."""
        vit.check_video(video, channels=self.channels, patch_size=self.patch_size,
                        frame_patch_size=self.frame_patch_size, dtype=self.pos_embedding.dtype)
        x = self.to_patch_embedding(video)
        return x + self.pos_embedding_for(self.token_grid(video.shape[2:])).to(x.dtype)

    def forward_features(self, video):
        """The encoder's tokens: (b, f * h * w, dim)."""
        return self.transformer(self.embed(video))

    def forward_head(self, tokens, pre_logits=False):
        """Mean of the tokens, then the head."""
        x = self.to_latent(tokens.mean(dim=1))
        return x if pre_logits else self.linear_head(x)

    def forward(self, video):
        return self.forward_head(self.forward_features(video))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.pos_embedding,
                       name='linear_head', removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, image_size, image_patch_size, frames, frame_patch_size, num_classes, dim, depth, heads,
                    mlp_dim, channels, dim_head, transformer=vit.SimpleTransformer):
    vit.check_geometry(image_size=image_size, image_patch_size=image_patch_size, frames=frames,
                       frame_patch_size=frame_patch_size)
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                    channels=channels, dim_head=dim_head)
    if dim < 12:
        raise ValueError(f"dim must be at least 12 for the 3D sin-cos position table (two frequencies per "
                         f"axis), got {dim}")
    if not callable(transformer):
        raise TypeError(f"transformer must be a callable that builds the encoder, got {transformer!r}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's 3D SimpleViT has our parameter names and computes the same function."""
    return None
