"""LocalViT: a depthwise convolution inside the feed-forward.

Li et al., "LocalViT: Bringing Locality to Vision Transformers", arXiv 2104.05707: attention mixes tokens globally,
the feed-forward network of a ViT not at all; LocalViT lays the patch tokens back on their grid inside the
feed-forward and puts a 3x3 depthwise convolution between its two 1x1 convolutions (eq. 5-7), so that every layer
also mixes each token with its neighbours:

    Y = 1x1(f(dw3x3(f(1x1(X)))))    on the (h, w) token grid, f the h-swish

The cls token has no place on the grid: it is split off before and joined after the feed-forward, which leaves it
unchanged (section 3.2). Each feed-forward is a pre-LN residual on the patch tokens, as in vit-pytorch.

    import torch
    from vit_pytorch.local_vit import LocalViT, local_vit

    model = LocalViT(image_size=224, patch_size=16, num_classes=1000, dim=192, depth=12, heads=3, mlp_dim=768)
    logits = model(torch.randn(1, 3, 224, 224))   # (1, 1000)
    tiny = local_vit('T')                          # the paper's LocalViT-T (CONFIGS), 5,892,568 parameters

The 1x1 convolutions are computed as Linears on the tokens (the same function); only the depthwise convolution
runs on the (b, c, h, w) map. Everything else is the core ViT with a cls token (`vit_pytorch.vit`).

Where it differs from vit-pytorch 1.26.14, whose LocalViT fails for any normal configuration: its feed-forward
applies LayerNorm(dim) after turning the tokens into a (b, dim, h, w) map, so the norm meets the map's last axis,
its width, and raises unless the grid is exactly `dim` wide (and it is then a norm over each channel's row, not
over each token's channels); it takes the grid's side as sqrt(number of tokens), so non-square images fail; and its
depthwise convolution is followed by a second 1x1 convolution (1x1, dw3x3, 1x1, 1x1). Ours norms each token's
channels and follows the paper's 1x1, dw3x3, 1x1 on the model's grid, so vit-pytorch's checkpoints (which load only
from its models with a grid as wide as `dim`) compute another function: `load_vit_pytorch` refuses them, naming
this. The official code adds BatchNorms after the convolutions (bias-free); this module keeps vit-pytorch's pre-LN
instead. Its models add a squeeze-excitation after the depthwise convolution ('hs+se'): `se_reduction` here (its
ECA and ReLU6 options are not). `local_vit(variant)` builds the paper's models (`CONFIGS`: 'T', 'T-SE4', 'S');
each has the official model's parameters less 2 * mlp_dim - dim a layer (its BatchNorms against ours' biases and
LayerNorm), e.g. LocalViT-T 5,892,568 against the official 5,908,696.
"""

import functools

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from vit_pytorch import vit


class SqueezeExcitation(nn.Module):
    """The official 'hs+se' channel gate of the depthwise convolution's output map (b, c, h, w): the channels' means
    over the grid, Linear to `channels // reduction`, ReLU, Linear back, h-sigmoid; each channel times its gate."""

    def __init__(self, channels, reduction):
        super().__init__()
        self.squeeze = nn.Linear(channels, channels // reduction)
        self.excite = nn.Linear(channels // reduction, channels)

    def forward(self, x):
        gate = F.hardsigmoid(self.excite(F.relu(self.squeeze(x.mean(dim=(-2, -1))))))     # (b, c)
        return x * rearrange(gate, 'b c -> b c 1 1')


class LocalFeedForward(nn.Module):
    """The locality feed-forward of the patch tokens, (b, h * w, dim) -> (b, h * w, dim) given the (h, w) grid:
    LayerNorm, 1x1 conv to `hidden_dim`, h-swish, depthwise 3x3 conv, h-swish, (with `se_reduction`: the official
    squeeze-excitation of the map, `SqueezeExcitation`), dropout, 1x1 conv back, dropout."""

    def __init__(self, dim, hidden_dim, dropout=0., se_reduction=None):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.expand = nn.Linear(dim, hidden_dim)
        self.depthwise = nn.Conv2d(hidden_dim, hidden_dim, 3, padding=1, groups=hidden_dim)
        self.se = None if se_reduction is None else SqueezeExcitation(hidden_dim, se_reduction)
        self.reduce = nn.Linear(hidden_dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, grid):
        x = F.hardswish(self.expand(self.norm(x)))
        x = rearrange(x, 'b (h w) c -> b c h w', h=grid[0], w=grid[1])
        x = F.hardswish(self.depthwise(x))
        if self.se is not None:
            x = self.se(x)
        x = rearrange(x, 'b c h w -> b (h w) c')
        return self.dropout(self.reduce(self.dropout(x)))


class Transformer(vit.Stack):
    """`depth` layers: pre-LN attention over every token, then the locality feed-forward of the patch tokens (the
    cls token, first, bypasses it); a final LayerNorm (vit-pytorch's head norm, the same on the cls token).
    `forward(x, grid=(h, w))`."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0., *, qkv_bias=False, norm_eps=1e-5,
                 attention=vit.Attention, se_reduction=None, **_):
        super().__init__([(attention(dim, heads, dim_head, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps),
                           LocalFeedForward(dim, mlp_dim, dropout, se_reduction)) for _ in range(depth)],
                         norm=nn.LayerNorm(dim, eps=norm_eps))

    @staticmethod
    def layer(branches, x, *, grid):
        attn, ff = branches
        x = attn(x) + x
        cls_token, patches = x[:, :1], x[:, 1:]
        return torch.cat((cls_token, ff(patches, grid) + patches), dim=1)


class LocalViT(vit.ViT):
    """vit-pytorch's `LocalViT` (its arguments; a cls token classifies) with the paper's locality feed-forward.

    `se_reduction` (ours, keyword only): None (default) leaves the squeeze-excitation out (the official act='hs');
    an int r puts the official 'hs+se' gate after the depthwise convolution, `mlp_dim // r` wide (the official
    `reduction`; its models use 192 and 384, `mlp_dim // r` = 4, and 4 for LocalViT-T-SE4: see CONFIGS).
    `forward_features` returns all tokens after the final norm, (b, 1 + h * w, dim); `num_classes=0` makes
    `forward` return them too, as `vit.ViT`. Images smaller than `image_size` (sides divisible by the patch) take the
    top-left sub-grid of positions, as the core ViT's.
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 dropout=0., emb_dropout=0., se_reduction=None, **options):
        check_arguments(mlp_dim=mlp_dim, se_reduction=se_reduction)
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, pool='cls', channels=channels, dim_head=dim_head,
                         dropout=dropout, emb_dropout=emb_dropout,
                         transformer=functools.partial(Transformer, se_reduction=se_reduction), **options)

    def forward_features(self, img):
        """All tokens after the final norm: (b, 1 + h * w, dim)."""
        return self.transformer(self.embed(img), grid=self.token_grid(img.shape[-2:]))


# the paper's models, as the official code builds them (models/localvit.py at f497260, the names its README gives:
# LocalViT-T localvit_tiny_mlp4_act3_r192, LocalViT-T-SE4 localvit_tiny_mlp4_act3_r4, LocalViT-S
# localvit_small_mlp4_act3_r384): name -> (dim, heads, se_reduction); all 12 layers, patches of 16, MLP ratio 4,
# heads of 48 channels, qkv bias, LayerNorm eps 1e-6, h-swish and SE ('hs+se'), the patch convolution without norms
CONFIGS = {'T': (192, 4, 192), 'T-SE4': (192, 4, 4), 'S': (384, 8, 384)}


def local_vit(variant, *, image_size=224, num_classes=1000, **overrides):
    """The paper's LocalViT-`variant` (a key of CONFIGS) at `image_size`; keyword arguments override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, heads, se_reduction = CONFIGS[variant]
    config = dict(image_size=image_size, patch_size=16, num_classes=num_classes, dim=dim, depth=12, heads=heads,
                  dim_head=dim // heads, mlp_dim=4 * dim, se_reduction=se_reduction, qkv_bias=True, norm_eps=1e-6,
                  patch_norm=False)
    return LocalViT(**{**config, **overrides})


# argument checks


def check_arguments(*, mlp_dim, se_reduction):
    if se_reduction is None:
        return
    vit.positive_int('se_reduction', se_reduction)
    if isinstance(mlp_dim, int) and not isinstance(mlp_dim, bool) and mlp_dim // se_reduction < 1:
        raise ValueError(f"se_reduction must be at most mlp_dim ({mlp_dim}) so that the SE layer is at least one "
                         f"channel wide (mlp_dim // se_reduction), got {se_reduction}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's LocalViT normalises its feed-forward's input over the width axis of the (b, dim, h, w) token "
        "map (LayerNorm(dim) on the map's last axis: it runs only when the grid is dim wide) and follows the "
        "depthwise convolution with a second 1x1 convolution; this model norms each token's channels and follows "
        "the paper's 1x1, depthwise 3x3, 1x1, so its weights would compute another function")
