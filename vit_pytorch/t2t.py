"""Tokens-to-Token ViT.

"Tokens-to-Token ViT: Training Vision Transformers from Scratch on ImageNet", Yuan et al.,
arXiv 2101.11986: instead of cutting the image into patches in one step, tokenise it
progressively. A soft split (an unfold with overlapping windows) concatenates each window's
pixels into a token, a small "T2T transformer" layer models the tokens and narrows them to
`token_dim` channels, the tokens are laid back out as an image and split again; after the
last split a linear projection gives the tokens of a plain ViT backbone, with fixed sinusoidal
positions as in the paper.

    import torch
    from vit_pytorch.t2t import T2TViT, t2t_vit_14

    model = T2TViT(image_size=224, num_classes=1000, dim=384, depth=14, heads=6, mlp_dim=1152,
                   t2t_layers=((7, 4), (3, 2), (3, 2)), token_dim=64)
    logits = model(torch.randn(2, 3, 224, 224))   # (2, 1000)

    paper_model = t2t_vit_14()                     # T2T-ViT_t-14, 21.5M parameters

Each `(kernel, stride)` of `t2t_layers` is one soft split with padding stride // 2 (the
paper's 7/4/2, 3/2/1, 3/2/1 shrink a 224 image to 14 x 14 tokens).
"""

import torch
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import vit

# helpers


def sinusoid_table(length, dim):
    """Fixed 1D sin-cos table (Vaswani et al.): (length, dim), sin on even and cos on odd channels."""
    position = torch.arange(length, dtype=torch.float64)[:, None]
    frequency = 10000 ** (2 * torch.div(torch.arange(dim), 2, rounding_mode='floor') / dim)
    angles = position / frequency                                       # (length, dim)
    table = torch.where(torch.arange(dim) % 2 == 0, angles.sin(), angles.cos())
    return table.float()


def soft_split_size(size, kernel_size, stride):
    """Tokens per side after an unfold with padding stride // 2."""
    return (size + 2 * (stride // 2) - kernel_size) // stride + 1


# classes


class TokenAttention(vit.Attention):
    """Single-head pre-norm attention from `dim` channels down to `dim_out` (T2T section 3.1).

    The input and output widths differ, so the residual goes through the values:
    out = v + proj(attention @ v). The logits are scaled by dim ** -0.5 (the input width) as
    in the official code. The recorded map is (b, 1, n, n).
    """

    def __init__(self, dim, dim_out, dropout=0., *, qkv_bias=False, norm_eps=1e-5):
        super().__init__(dim, 1, dim_out, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps,
                         to_out=nn.Sequential(nn.Linear(dim_out, dim_out), nn.Dropout(dropout)))
        self.scale = dim ** -0.5

    def forward(self, x):
        q, k, v = self.qkv(x)
        out = self.to_out(rearrange(self.attend(q, k, v), 'b h n d -> b n (h d)'))
        return rearrange(v, 'b h n d -> b n (h d)') + out


class TokenTransformer(nn.Module):
    """One T2T transformer layer: (b, n, dim) -> (b, n, dim_out), an MLP of ratio 1 after the attention."""

    def __init__(self, dim, dim_out, dropout=0., *, qkv_bias=False, norm_eps=1e-5):
        super().__init__()
        self.attn = TokenAttention(dim, dim_out, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps)
        self.ff = vit.FeedForward(dim_out, dim_out, dropout, norm_eps=norm_eps)

    def forward(self, x):
        x = self.attn(x)
        return self.ff(x) + x


class SoftSplit(nn.Module):
    """Overlapping windows of an image (b, c, h, w) as tokens (b, n, c * kernel * kernel).

    The channels of a token are ordered (c, kernel row, kernel column), as nn.Unfold gives them.
    """

    def __init__(self, kernel_size, stride):
        super().__init__()
        self.unfold = nn.Unfold(kernel_size=kernel_size, stride=stride, padding=stride // 2)

    def forward(self, img):
        return rearrange(self.unfold(img), 'b c n -> b n c')


class T2TModule(nn.Module):
    """Soft split, T2T transformer, re-structurize (tokens back to an image), repeated; then project."""

    def __init__(self, *, image_size, channels, dim, t2t_layers, token_dim, dropout=0., qkv_bias=False,
                 norm_eps=1e-5):
        super().__init__()
        self.splits = nn.ModuleList()
        self.transformers = nn.ModuleList()
        self.grids = []
        height, width = image_size
        width_in = channels
        for i, (kernel_size, stride) in enumerate(t2t_layers):
            height, width = soft_split_size(height, kernel_size, stride), soft_split_size(width, kernel_size, stride)
            self.grids.append((height, width))
            self.splits.append(SoftSplit(kernel_size, stride))
            width_in = width_in * kernel_size ** 2
            if i < len(t2t_layers) - 1:
                self.transformers.append(TokenTransformer(width_in, token_dim, dropout, qkv_bias=qkv_bias,
                                                          norm_eps=norm_eps))
                width_in = token_dim
        self.project = nn.Linear(width_in, dim)

    def forward(self, img):
        x = self.splits[0](img)
        for transformer, split, (height, width) in zip(self.transformers, self.splits[1:], self.grids):
            x = rearrange(transformer(x), 'b (h w) c -> b c h w', h=height, w=width)
            x = split(x)
        return self.project(x)                                          # (b, n, dim)


class T2TViT(nn.Module):
    """T2T-ViT with vit-pytorch's keyword arguments.

    `transformer` replaces the backbone with any module mapping (b, n, dim) to (b, n, dim);
    otherwise `depth`, `heads` and `mlp_dim` are required. `num_classes=0` makes `forward`
    return the backbone's tokens (b, 1 + n, dim).

    Options beyond vit-pytorch's API (defaults give the paper's model):
      token_dim  width of the tokens inside the T2T module (64 in the paper; vit-pytorch keeps
                 the full unfolded width).
      qkv_bias   bias on the query/key/value projections (False in the paper).
      norm_eps   epsilon of every LayerNorm.
    """

    num_prefix_tokens = 1

    def __init__(self, *, image_size, num_classes, dim, depth=None, heads=None, mlp_dim=None, pool='cls',
                 channels=3, dim_head=64, dropout=0., emb_dropout=0., transformer=None,
                 t2t_layers=((7, 4), (3, 2), (3, 2)), token_dim=64, qkv_bias=False, norm_eps=1e-5):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size = vit.pair(image_size)
        self.t2t_layers = tuple(tuple(layer) for layer in t2t_layers)
        self.grid_size = self.token_grid(self.image_size)
        self.pool = pool
        self.channels = channels
        self.num_classes = num_classes
        self.to_patch_embedding = T2TModule(image_size=self.image_size, channels=channels, dim=dim,
                                            t2t_layers=t2t_layers, token_dim=token_dim, dropout=dropout,
                                            qkv_bias=qkv_bias, norm_eps=norm_eps)
        num_patches = self.grid_size[0] * self.grid_size[1]
        self.cls_token = nn.Parameter(torch.zeros(1, dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        # fixed, as in the paper; recomputed rather than saved
        self.register_buffer('pos_embedding', sinusoid_table(1 + num_patches, dim), persistent=False)
        self.dropout = nn.Dropout(emb_dropout)

        self.transformer = transformer if transformer is not None else vit.encoder(
            dim, depth, heads, dim_head, mlp_dim, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps)
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else None

    def forward_features(self, img):
        """[cls, tokens] after the backbone: (b, 1 + n, dim)."""
        vit.check_images(img, channels=self.channels, patch_size=(1, 1), image_size=self.image_size,
                         dtype=self.cls_token.dtype)
        x = self.to_patch_embedding(img)                                # (b, n, dim)
        x = torch.cat((repeat(self.cls_token, 'n d -> b n d', b=x.shape[0]), x), dim=1)
        return self.transformer(self.dropout(x + self.pos_embedding))

    def forward_head(self, tokens, pre_logits=False):
        x = tokens.mean(dim=1) if self.pool == 'mean' else tokens[:, 0]
        if pre_logits or self.mlp_head is None:
            return x
        return self.mlp_head(x)

    def forward(self, img):
        tokens = self.forward_features(img)
        return tokens if self.mlp_head is None else self.forward_head(tokens)

    def token_grid(self, image_size):
        """The (h, w) grid of tokens after the soft splits, for images of `image_size` (h, w)."""
        height, width = image_size
        for kernel_size, stride in self.t2t_layers:
            height, width = soft_split_size(height, kernel_size, stride), soft_split_size(width, kernel_size, stride)
        return height, width

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.non_negative_int('num_classes', num_classes)
        self.num_classes = num_classes
        self.mlp_head = vit.zero_linear(self.cls_token.shape[-1], num_classes, like=self.cls_token) \
            if num_classes > 0 else None

    def set_grad_checkpointing(self, enable=True):
        if not isinstance(self.transformer, vit.Transformer):
            raise TypeError("set_grad_checkpointing needs the built-in transformer, not a custom one")
        self.transformer.grad_checkpointing = enable


# the paper's models (Table 1, T2T-ViT_t: T2T transformer layers): name -> (dim, depth, heads,
# MLP ratio); all with token_dim 64 and the soft splits (7, 4), (3, 2), (3, 2)
CONFIGS = {
    '7': (256, 7, 4, 2),
    '10': (256, 10, 4, 2),
    '12': (256, 12, 4, 2),
    '14': (384, 14, 6, 3),
    '19': (448, 19, 7, 3),
    '24': (512, 24, 8, 3),
}


def t2t_vit(variant, *, image_size=224, num_classes=1000, **overrides):
    """The paper's T2T-ViT `variant` (a key of CONFIGS); keyword arguments override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, depth, heads, mlp_ratio = CONFIGS[variant]
    kwargs = dict(image_size=image_size, num_classes=num_classes, dim=dim, depth=depth, heads=heads,
                  mlp_dim=mlp_ratio * dim, dim_head=dim // heads, token_dim=64)
    return T2TViT(**{**kwargs, **overrides})


def t2t_vit_7(**kwargs):
    return t2t_vit('7', **kwargs)


def t2t_vit_10(**kwargs):
    return t2t_vit('10', **kwargs)


def t2t_vit_12(**kwargs):
    return t2t_vit('12', **kwargs)


def t2t_vit_14(**kwargs):
    return t2t_vit('14', **kwargs)


def t2t_vit_19(**kwargs):
    return t2t_vit('19', **kwargs)


def t2t_vit_24(**kwargs):
    return t2t_vit('24', **kwargs)


# argument checks


def check_arguments(*, image_size, num_classes, dim, depth, heads, mlp_dim, pool, channels, dim_head, dropout,
                    emb_dropout, transformer, t2t_layers, token_dim, qkv_bias, norm_eps):
    image_pair = vit.positive_pair('image_size', image_size)
    for name, value in dict(dim=dim, channels=channels, dim_head=dim_head, token_dim=token_dim).items():
        vit.positive_int(name, value)
    vit.non_negative_int('num_classes', num_classes)
    vit.probability('dropout', dropout)
    vit.probability('emb_dropout', emb_dropout)
    if pool not in ('cls', 'mean'):
        raise ValueError(f"pool must be 'cls' (cls token) or 'mean' (mean pooling), got {pool!r}")
    if transformer is None:
        missing = [name for name, value in dict(depth=depth, heads=heads, mlp_dim=mlp_dim).items() if value is None]
        if missing:
            raise ValueError(f"{', '.join(missing)} must be given when transformer is None")
        for name, value in dict(depth=depth, heads=heads, mlp_dim=mlp_dim).items():
            vit.positive_int(name, value)
    elif not isinstance(transformer, nn.Module):
        raise TypeError(f"transformer must be an nn.Module or None, got {type(transformer).__name__}")
    if not isinstance(t2t_layers, (tuple, list)) or len(t2t_layers) == 0:
        raise ValueError(f"t2t_layers must be a non-empty sequence of (kernel_size, stride) pairs, "
                         f"got {t2t_layers!r}")
    size = image_pair
    for layer in t2t_layers:
        if not isinstance(layer, (tuple, list)) or len(layer) != 2:
            raise ValueError(f"t2t_layers must hold (kernel_size, stride) pairs, got {layer!r}")
        kernel_size, stride = (vit.positive_int('t2t_layers kernel_size', layer[0]),
                               vit.positive_int('t2t_layers stride', layer[1]))
        size = tuple(soft_split_size(side, kernel_size, stride) for side in size)
        if min(size) < 1:
            raise ValueError(f"image_size {image_pair} is too small for t2t_layers {t2t_layers!r}")

