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

The official code has two kinds of T2T layer: its "T2T-ViT" models use a Performer layer (an
attention linear in the number of tokens, `t2t_layer='performer'`), its "T2T-ViT_t" models a
transformer layer (`t2t_layer='transformer'`, the default). So the official T2T-ViT-14 is
`t2t_vit_14(t2t_layer='performer')`, 21,465,806 parameters (the official count, 21,545,550, adds
its frozen position table and random features, buffers here). `qk_scale` sets the logit scale of
the backbone's attention (None: dim_head ** -0.5); the official code passes
`qk_scale = dim ** -0.5` (256, 384, 448 or 512 by size) when it loads its released weights, in
its Performer and transformer models alike, so build with `qk_scale=dim ** -0.5` to run them.
"""

import functools
import math

import torch
from einops import einsum, rearrange, repeat
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


class TokenPerformer(nn.Module):
    """Single-head pre-norm Performer attention from `dim` channels down to `dim_out`: the official
    T2T-ViT's T2T layer (Choromanski et al., arXiv 2009.14794, positive random features).

    softmax(q k^T) is replaced by phi(q) phi(k)^T with phi(x) = exp(w x - |x|^2 / 2) / sqrt(m),
    for m = dim_out * kernel_ratio fixed random orthogonal directions w of norm sqrt(m) (drawn at
    construction, saved with the weights); q and k are not scaled. Both are the official code's
    choices (FAVOR+'s unbiased estimate of exp(q . k) would draw directions of norm about
    sqrt(dim_out)). As in `TokenAttention` the residual goes through the values:
        out = v + proj(phi(q) (phi(k)^T v) / (phi(q) sum_j phi(k_j) + 1e-8)).
    The q, k, v projection has a bias, as the official one. `fused=True` computes this in time
    linear in the tokens; with `fused=False` the (b, 1, n, n) normalised kernel matrix is formed
    and passed through `attention_probs` (the recorder's protocol): the same values.
    """

    def __init__(self, dim, dim_out, dropout=0., *, kernel_ratio=0.5, norm_eps=1e-5):
        super().__init__()
        self.fused = True
        self.eps = 1e-8
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.to_qkv = nn.Linear(dim, 3 * dim_out)
        self.attention_probs = nn.Identity()
        self.to_out = nn.Sequential(nn.Linear(dim_out, dim_out), nn.Dropout(dropout))
        num_features = int(dim_out * kernel_ratio)
        directions = nn.init.orthogonal_(torch.empty(num_features, dim_out)) * math.sqrt(num_features)
        self.register_buffer('random_features', directions)                 # (m, dim_out)

    def features(self, x):
        """phi(x) = exp(w x - |x|^2 / 2) / sqrt(m): (b, n, dim_out) -> (b, n, m)."""
        projected = einsum(x, self.random_features, 'b n d, m d -> b n m')
        return torch.exp(projected - x.pow(2).sum(dim=-1, keepdim=True) / 2) / math.sqrt(len(self.random_features))

    def forward(self, x):
        q, k, v = self.to_qkv(self.norm(x)).chunk(3, dim=-1)                 # (b, n, dim_out) each
        q, k = self.features(q), self.features(k)                            # (b, n, m)
        if self.fused:
            context = einsum(k, v, 'b n m, b n d -> b m d')
            normaliser = einsum(q, k.sum(dim=1), 'b n m, b m -> b n')
            out = einsum(q, context, 'b n m, b m d -> b n d') / (normaliser[..., None] + self.eps)
        else:
            kernel = einsum(q, k, 'b i m, b j m -> b i j')
            attn = self.attention_probs(rearrange(kernel / (kernel.sum(dim=-1, keepdim=True) + self.eps),
                                                  'b i j -> b 1 i j'))
            out = rearrange(attn, 'b 1 i j -> b i j') @ v
        return v + self.to_out(out)


class TokenTransformer(nn.Module):
    """One T2T layer: (b, n, dim) -> (b, n, dim_out), an MLP of ratio 1 after the attention, which is
    softmax attention (`TokenAttention`, `performer=False`) or `TokenPerformer`."""

    def __init__(self, dim, dim_out, dropout=0., *, qkv_bias=False, norm_eps=1e-5, performer=False):
        super().__init__()
        self.attn = TokenPerformer(dim, dim_out, dropout, norm_eps=norm_eps) if performer else \
            TokenAttention(dim, dim_out, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps)
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


class RearrangeImage(nn.Module):
    """Tokens of a square grid back to an image: (b, h w, c) -> (b, c, h, w), vit-pytorch's block of this name.

    T2TModule itself re-structurizes with the grid it knows, which need not be square.
    """

    def forward(self, x):
        side = math.isqrt(x.shape[1])
        if x.ndim != 3 or side * side != x.shape[1]:
            raise ValueError(f"x must be tokens (b, n, c) of a square grid (n = h * h), got shape {tuple(x.shape)}")
        return rearrange(x, 'b (h w) c -> b c h w', h=side)


class T2TModule(nn.Module):
    """Soft split, T2T transformer, re-structurize (tokens back to an image), repeated; then project."""

    def __init__(self, *, image_size, channels, dim, t2t_layers, token_dim, dropout=0., qkv_bias=False,
                 norm_eps=1e-5, performer=False):
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
                                                          norm_eps=norm_eps, performer=performer))
                width_in = token_dim
        self.project = nn.Linear(width_in, dim)

    def forward(self, img):
        x = self.splits[0](img)
        for transformer, split, (height, width) in zip(self.transformers, self.splits[1:], self.grids):
            x = rearrange(transformer(x), 'b (h w) c -> b c h w', h=height, w=width)
            x = split(x)
        return self.project(x)                                          # (b, n, dim)


class ScaledAttention(vit.Attention):
    """The core attention with its logits scaled by `scale` (the official code's `qk_scale`)."""

    def __init__(self, *args, scale, **kwargs):
        super().__init__(*args, **kwargs)
        self.scale = scale


class T2TViT(vit.TokenFace, nn.Module):
    """T2T-ViT with vit-pytorch's keyword arguments.

    `transformer` replaces the backbone with any module mapping (b, n, dim) to (b, n, dim);
    otherwise `depth`, `heads` and `mlp_dim` are required. `num_classes=0` makes `forward`
    return the backbone's tokens (b, 1 + n, dim).

    Options beyond vit-pytorch's API (defaults give the paper's model):
      token_dim  width of the tokens inside the T2T module (64 in the paper; vit-pytorch keeps
                 the full unfolded width).
      qkv_bias   bias on the query/key/value projections (False in the paper).
      norm_eps   epsilon of every LayerNorm.
      t2t_layer  'transformer' (softmax attention, the official "_t" models) or 'performer'
                 (`TokenPerformer`, the official T2T-ViT models).
      qk_scale   the backbone attention's logit scale; None: dim_head ** -0.5.

    `forward_features` returns [cls, tokens] after the backbone, (b, 1 + n, dim).
    """

    num_prefix_tokens = 1

    def __init__(self, *, image_size, num_classes, dim, depth=None, heads=None, mlp_dim=None, pool='cls',
                 channels=3, dim_head=64, dropout=0., emb_dropout=0., transformer=None,
                 t2t_layers=((7, 4), (3, 2), (3, 2)), token_dim=64, qkv_bias=False, norm_eps=1e-5,
                 t2t_layer='transformer', qk_scale=None):
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
                                            qkv_bias=qkv_bias, norm_eps=norm_eps,
                                            performer=t2t_layer == 'performer')
        num_patches = self.grid_size[0] * self.grid_size[1]
        self.cls_token = nn.Parameter(torch.zeros(1, dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        # fixed, as in the paper; recomputed rather than saved
        self.register_buffer('pos_embedding', sinusoid_table(1 + num_patches, dim), persistent=False)
        self.dropout = nn.Dropout(emb_dropout)

        attention = vit.Attention if qk_scale is None else functools.partial(ScaledAttention, scale=qk_scale)
        self.transformer = transformer if transformer is not None else vit.Transformer(
            dim, depth, heads, dim_head, mlp_dim, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps, attention=attention)
        self.num_features = dim
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
        vit.reset_head(self, num_classes, self.num_features, like=self.cls_token)

    def set_grad_checkpointing(self, enable=True):
        if not isinstance(self.transformer, vit.Stack):
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
                    emb_dropout, transformer, t2t_layers, token_dim, qkv_bias, norm_eps, t2t_layer, qk_scale):
    if t2t_layer not in ('transformer', 'performer'):
        raise ValueError(f"t2t_layer must be 'transformer' or 'performer', got {t2t_layer!r}")
    if qk_scale is not None:
        vit.positive_float('qk_scale', qk_scale)
        if transformer is not None:
            raise ValueError("qk_scale sets the built-in backbone's attention; a custom transformer sets its own")
    image_pair = vit.positive_pair('image_size', image_size)
    for name, value in dict(dim=dim, channels=channels, dim_head=dim_head, token_dim=token_dim).items():
        vit.positive_int(name, value)
    vit.non_negative_int('num_classes', num_classes)
    vit.probability('dropout', dropout)
    vit.probability('emb_dropout', emb_dropout)
    vit.positive_float('norm_eps', norm_eps)
    vit.boolean('qkv_bias', qkv_bias)
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



# loading checkpoints


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's T2T-ViT computes another function: its T2T layers keep the full unfolded width (whole "
        "transformer layers, with the residual on their input and a final LayerNorm), where the paper's (and "
        "ours) narrow the tokens to token_dim with the residual on the values, and it learns its position table "
        "where the paper fixes sinusoids")
