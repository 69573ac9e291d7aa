"""SimpleViT for signals and time series.

"Better plain ViT baselines for ImageNet-1k", Beyer, Zhai and Kolesnikov, arXiv 2205.01580, with
patches cut along one axis: fixed 1D sin-cos position embeddings, global average pooling, no
dropout, no biases in the attention projections. The arguments and the function are
vit-pytorch's (`vit_pytorch.simple_vit_1d.SimpleViT`), whose checkpoints load unchanged.

The position table is computed for each input, so any signal whose length divides by the patch
size works, not only `seq_len`.

    import torch
    from vit_pytorch.simple_vit_1d import SimpleViT

    model = SimpleViT(seq_len=256, patch_size=16, num_classes=1000, dim=1024, depth=6, heads=8,
                      mlp_dim=2048)
    logits = model(torch.randn(4, 3, 256))   # (4, 1000)
    logits = model(torch.randn(4, 3, 512))   # other lengths work too
"""

import torch
from torch import nn

from vit_pytorch import vit, vit_1d

# helpers


def posemb_sincos_1d(length, dim, temperature=10000, dtype=torch.float32, device=None):
    """Fixed 1D sin-cos position table, (length, dim): sin(n w) in the first half of the channels,
    cos(n w) in the second, for position n and frequencies w = temperature ** -(i / (dim / 2 - 1))."""
    if dim % 2 or dim < 4:
        raise ValueError(f"dim must be even and at least 4 for the 1D sin-cos position table, got {dim}")
    omega = temperature ** -(torch.arange(dim // 2, device=device) / (dim // 2 - 1))
    angles = torch.arange(length, device=device)[:, None] * omega           # (length, dim / 2)
    return torch.cat((angles.sin(), angles.cos()), dim=1).to(dtype)


# classes


class SimpleViT(vit.TokenFace, nn.Module):
    """SimpleViT over patches of a signal; `num_classes=0` makes `forward` return the pooled embedding.

    `forward_features` returns all tokens after the final norm, (b, n, dim).
    """

    num_prefix_tokens = 0

    def __init__(self, *, seq_len, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.seq_len, self.patch_size, self.channels, self.num_classes = seq_len, patch_size, channels, num_classes
        self.to_patch_embedding = vit_1d.PatchEmbedding1d(channels=channels, patch_size=patch_size, dim=dim)
        # fixed, so not saved; a buffer so that it follows .to(device)
        self.register_buffer('pos_embedding', posemb_sincos_1d(seq_len // patch_size, dim), persistent=False)
        self.transformer = vit.SimpleTransformer(dim, depth, heads, dim_head, mlp_dim)
        self.num_features = dim
        self.linear_head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def pos_embedding_for(self, num_patches):
        """The sin-cos table of `num_patches` patches: (num_patches, dim)."""
        if num_patches == self.pos_embedding.shape[0]:
            return self.pos_embedding
        return posemb_sincos_1d(num_patches, self.pos_embedding.shape[-1], device=self.pos_embedding.device)

    def embed(self, series):
        """Patch tokens with their positions: (b, n, dim); any length divisible by the patch size."""
        vit_1d.check_series(series, channels=self.channels, patch_size=self.patch_size,
                            dtype=self.pos_embedding.dtype)
        x = self.to_patch_embedding(series)
        return x + self.pos_embedding_for(x.shape[1]).to(x.dtype)

    def forward_features(self, series):
        """All tokens after the final norm: (b, n, dim)."""
        return self.transformer(self.embed(series))

    def forward_head(self, tokens, pre_logits=False):
        x = tokens.mean(dim=1)
        return x if pre_logits else self.linear_head(x)

    def forward(self, series):
        return self.forward_head(self.forward_features(series))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.pos_embedding,
                       name='linear_head', removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, seq_len, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dim_head):
    vit_1d.check_length(seq_len=seq_len, patch_size=patch_size)
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                    channels=channels, dim_head=dim_head)
    if dim % 2 or dim < 4:
        raise ValueError(f"dim must be even and at least 4 for the 1D sin-cos position table, got {dim}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's 1D SimpleViT has our parameter names and computes the same function."""
    return None
