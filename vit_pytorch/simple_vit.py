"""SimpleViT.

"Better plain ViT baselines for ImageNet-1k", Beyer, Zhai and Kolesnikov, arXiv 2205.01580:
the plain ViT with fixed 2D sin-cos position embeddings, global average pooling instead of
a cls token, no dropout, and no biases in the attention projections. As in the `vit-pytorch`
package (whose checkpoints load here unchanged) the patch projection sits between two
LayerNorms.

The position table is computed for the grid of each input, so any image whose sides divide
by the patch size works, not only `image_size`.

    import torch
    from vit_pytorch import SimpleViT

    model = SimpleViT(image_size=224, patch_size=16, num_classes=1000,
                      dim=384, depth=12, heads=6, mlp_dim=1536)
    logits = model(torch.randn(2, 3, 224, 224))   # (2, 1000)
"""

import torch
from einops import repeat
from einops.layers.torch import Rearrange  # unused here: code built on vit-pytorch's simple_vit imports it from it
from torch import nn

from vit_pytorch import vit
# vit-pytorch's simple_vit.Attention and simple_vit.Transformer (SimpleViT's encoder, which the 1D and 3D
# SimpleViTs share, lives in the core): code built on vit-pytorch's simple_vit imports them from here
from vit_pytorch.vit import SimpleAttention as Attention
from vit_pytorch.vit import SimpleTransformer as Transformer
from vit_pytorch.vit import pair


class FeedForward(vit.FeedForward):
    """vit-pytorch's simple_vit.FeedForward(dim, hidden_dim), which public code imports: the core MLP without
    dropout (keys net.0, net.1, net.3)."""

    def __init__(self, dim, hidden_dim):
        super().__init__(dim, hidden_dim, dropout=None)

# helpers


def posemb_sincos_2d(h, w, dim, temperature=10000, dtype=torch.float32, device=None):
    """Fixed 2D sin-cos position table, (h * w, dim), rows in row-major grid order (vit-pytorch's arguments).

    A quarter of the channels each holds sin(x w), cos(x w), sin(y w), cos(y w) for
    column x and row y, with frequencies w = temperature ** -(i / (dim / 4 - 1)).
    """
    if dim % 4 or dim < 8:
        raise ValueError(f"dim must be a multiple of 4 and at least 8 for the sin-cos position table, got {dim}")
    y, x = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing='ij')
    omega = torch.arange(dim // 4, device=device) / (dim // 4 - 1)
    omega = temperature ** -omega                                   # (dim / 4,)
    x = x.flatten()[:, None] * omega                                # (h * w, dim / 4)
    y = y.flatten()[:, None] * omega
    return torch.cat((x.sin(), x.cos(), y.sin(), y.cos()), dim=1).to(dtype)


# classes


class SimpleViT(vit.TokenFace, nn.Module):
    """`num_classes=0` makes `forward` return the pooled embedding (b, dim) (vit-pytorch 1.26.14's returns an empty
    (b, 0) tensor: a Linear with no outputs).

    For variants: `attention` builds each layer's attention from (dim, heads, dim_head); `transformer` builds the
    encoder from (dim, depth, heads, dim_head, mlp_dim, attention=attention), as this file's `Transformer`.

    `forward_features` returns all tokens after the final norm, (b, prefix + h * w, dim).
    """

    num_prefix_tokens = 0

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim,
                 channels=3, dim_head=64, attention=Attention, transformer=Transformer):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = pair(image_size), pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.channels, self.num_classes, self.embed_dim = channels, num_classes, dim

        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim)
        # fixed, so not saved; a buffer so that it follows .to(device)
        self.register_buffer('pos_embedding', posemb_sincos_2d(*self.grid_size, dim), persistent=False)
        self.transformer = transformer(dim, depth, heads, dim_head, mlp_dim, attention=attention)
        self.to_latent = nn.Identity()
        self.num_features = dim
        self.linear_head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def patch_tokens(self, img):
        """The checked image's patch tokens, before positions: (b, h * w, dim); any size divisible by the patch."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, dtype=self.pos_embedding.dtype)
        return self.to_patch_embedding(img)

    def pos_embedding_for(self, grid):
        """The sin-cos table of an (h, w) patch grid: (h * w, dim)."""
        if grid == self.grid_size:
            return self.pos_embedding
        return posemb_sincos_2d(*grid, self.pos_embedding.shape[-1], device=self.pos_embedding.device)

    def embed_tokens(self, patches, grid, indices=None):
        """`patches` with their positions: (b, k, dim), the tokens of the (h, w) grid's cells `indices`
        (b, k), counted row-major, or of every cell; a masked model (MAE) passes the visible ones."""
        positions = self.pos_embedding_for(grid).to(patches.dtype)    # (h * w, dim)
        return patches + (positions if indices is None else positions[indices])

    def embed(self, img):
        """Patch tokens with their positions: (b, prefix + h * w, dim)."""
        return self.embed_tokens(self.patch_tokens(img), self.token_grid(img.shape[-2:]))

    def forward_features(self, img):
        """All tokens after the final norm: (b, prefix + h * w, dim)."""
        return self.transformer(self.embed(img))

    def forward_head(self, tokens, pre_logits=False):
        """Mean of the patch tokens (prefix tokens left out), then the head."""
        x = self.to_latent(tokens[:, self.num_prefix_tokens:].mean(dim=1))   # (b, dim)
        return x if pre_logits else self.linear_head(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.pos_embedding,
                       name='linear_head', removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


class Registers:
    """Register tokens for a SimpleViT: `num_register_tokens` learned tokens without positions before the patch
    tokens, counted as prefix tokens (so the mean pooling leaves them out). Listed before `SimpleViT` among the bases;
    the constructor calls `add_registers` after SimpleViT's, with the variant's `init` of the (registers, dim) table.
    """

    def add_registers(self, num_register_tokens, dim, init):
        self.num_register_tokens = self.num_prefix_tokens = num_register_tokens
        self.register_tokens = nn.Parameter(torch.zeros(num_register_tokens, dim))
        init(self.register_tokens)

    def embed_tokens(self, patches, grid, indices=None):
        """Registers, then patch tokens with their positions: (b, registers + k, dim)."""
        x = super().embed_tokens(patches, grid, indices)
        return torch.cat((repeat(self.register_tokens, 'r d -> b r d', b=x.shape[0]), x), dim=1)


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dim_head, **blocks):
    vit.check_patches(image_size, patch_size)
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                    channels=channels, dim_head=dim_head)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's SimpleViT (and its patch-dropout and register-token refinements, which subclass it
    here) has our parameter names and computes the same function."""
    return None
