"""CaiT: Class-Attention in Image Transformers.

"Going deeper with Image Transformers", Touvron et al., arXiv 2103.17239: make deep ViTs
trainable with LayerScale (each residual branch is multiplied by a learned per-channel
factor that starts near zero) and talking-heads attention, and let the patch tokens attend
only among themselves; a cls token then reads them in two class-attention layers, where
only the cls token is updated.

    import torch
    from vit_pytorch.cait import CaiT, cait_xxs24_224

    model = CaiT(image_size=224, patch_size=16, num_classes=1000, dim=192, depth=24,
                 cls_depth=2, heads=4, mlp_dim=768, dim_head=48, layer_dropout=0.05)
    logits = model(torch.randn(2, 3, 224, 224))   # (2, 1000)

    paper_model = cait_xxs24_224()                 # CaiT-XXS24, 11,956,264 parameters

`layer_dropout` is the paper's stochastic depth: each residual branch is dropped per sample
with that probability while training (and the kept ones rescaled).
"""

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit

# helpers


def layer_scale_init_for(depth):
    """The paper's LayerScale initialisation for a network of `depth` layers (section 2.1)."""
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


def drop_path(x, p, training):
    """Stochastic depth: zero a residual branch for a random subset of the samples, rescale the rest."""
    if p == 0. or not training:
        return x
    keep = torch.empty(x.shape[0], *((1,) * (x.ndim - 1)), device=x.device, dtype=x.dtype).bernoulli_(1 - p)
    return x * keep / (1 - p)


# classes


class LayerScale(nn.Module):
    """`fn(x) * scale`, one learned scale per channel starting at `init_value`, then stochastic depth."""

    def __init__(self, dim, fn, init_value, layer_dropout=0.):
        super().__init__()
        self.fn = fn
        self.scale = nn.Parameter(torch.full((dim,), float(init_value)))
        self.layer_dropout = layer_dropout

    def forward(self, x, **kwargs):
        return drop_path(self.fn(x, **kwargs) * self.scale, self.layer_dropout, self.training)


class TalkingHeadsAttention(nn.Module):
    """Pre-norm self-attention whose heads exchange information before and after the softmax.

    Talking heads (Shazeer et al., arXiv 2003.02436): the (b, heads, n, n) logits are mixed
    across heads by a learned heads x heads linear map, softmaxed, and mixed again. Mixing
    the maps needs them explicitly, so there is no fused path; `fused` exists only so that
    one recorder works for every model. `attention_probs` sees the softmax output, before
    the second mixing.
    """

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., *, qkv_bias=False, norm_eps=1e-5):
        super().__init__()
        inner_dim = heads * dim_head
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.fused = False

        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=qkv_bias)
        self.mix_heads_pre_attn = nn.Linear(heads, heads)
        self.mix_heads_post_attn = nn.Linear(heads, heads)
        self.attention_probs = nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(dropout))

    @staticmethod
    def mix_heads(attn, linear):
        attn = torch.einsum('b h i j, g h -> b g i j', attn, linear.weight)
        return attn + rearrange(linear.bias, 'g -> g 1 1')

    def forward(self, x):
        x = self.norm(x)
        q, k, v = rearrange(self.to_qkv(x), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=self.heads)
        dots = self.mix_heads(q @ k.transpose(-1, -2) * self.scale, self.mix_heads_pre_attn)
        attn = self.attention_probs(dots.softmax(dim=-1))
        attn = self.dropout(self.mix_heads(attn, self.mix_heads_post_attn))
        out = rearrange(attn @ v, 'b h n d -> b n (h d)')
        return self.to_out(out)


class ClassAttention(nn.Module):
    """The cls token attends to itself and the patch tokens; only the cls token is computed.

    Input `cls_tokens` (b, 1, dim) and `context` (b, n, dim); output (b, 1, dim). One
    LayerNorm normalises [cls, patches] for both the query and the keys/values (CaiT eq. 1).
    With `fused=False` the (b, heads, 1, 1 + n) map passes through `attention_probs`.
    """

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., *, qkv_bias=False, norm_eps=1e-5):
        super().__init__()
        inner_dim = heads * dim_head
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.dropout = dropout
        self.fused = True

        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.to_q = nn.Linear(dim, inner_dim, bias=qkv_bias)
        self.to_kv = nn.Linear(dim, inner_dim * 2, bias=qkv_bias)
        self.attention_probs = nn.Identity()
        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(dropout))

    def forward(self, cls_tokens, *, context):
        x = self.norm(torch.cat((cls_tokens, context), dim=1))       # (b, 1 + n, dim)
        q = rearrange(self.to_q(x[:, :1]), 'b n (h d) -> b h n d', h=self.heads)
        k, v = rearrange(self.to_kv(x), 'b n (kv h d) -> kv b h n d', kv=2, h=self.heads)
        dropout_p = self.dropout if self.training else 0.
        if self.fused:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=self.scale)
        else:
            attn = self.attention_probs((q @ k.transpose(-1, -2) * self.scale).softmax(dim=-1))
            out = F.dropout(attn, dropout_p) @ v
        out = rearrange(out, 'b h n d -> b n (h d)')
        return self.to_out(out)


class Transformer(vit.Transformer):
    """The self-attention stage: the core's pre-norm stack with LayerScale and talking heads.

    No final norm: CaiT normalises once, after the class-attention stage.
    """

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0., *, layer_dropout=0.,
                 layer_scale_init=1e-5, qkv_bias=False, norm_eps=1e-5):
        super().__init__(dim, 0, heads, dim_head, mlp_dim)
        self.norm = nn.Identity()
        self.layers.extend(
            nn.ModuleList([
                LayerScale(dim, TalkingHeadsAttention(dim, heads, dim_head, dropout, qkv_bias=qkv_bias,
                                                      norm_eps=norm_eps), layer_scale_init, layer_dropout),
                LayerScale(dim, vit.FeedForward(dim, mlp_dim, dropout, norm_eps=norm_eps),
                           layer_scale_init, layer_dropout),
            ])
            for _ in range(depth)
        )


class ClassTransformer(nn.Module):
    """The class-attention stage: updates the cls token from fixed patch tokens."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0., *, layer_dropout=0.,
                 layer_scale_init=1e-5, qkv_bias=False, norm_eps=1e-5):
        super().__init__()
        self.layers = nn.ModuleList([
            nn.ModuleList([
                LayerScale(dim, ClassAttention(dim, heads, dim_head, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps),
                           layer_scale_init, layer_dropout),
                LayerScale(dim, vit.FeedForward(dim, mlp_dim, dropout, norm_eps=norm_eps),
                           layer_scale_init, layer_dropout),
            ])
            for _ in range(depth)
        ])

    def forward(self, cls_tokens, *, context):
        for attn, ff in self.layers:
            cls_tokens = attn(cls_tokens, context=context) + cls_tokens
            cls_tokens = ff(cls_tokens) + cls_tokens
        return cls_tokens


class CaiT(nn.Module):
    """CaiT with vit-pytorch's keyword arguments.

    `depth` self-attention layers over the patch tokens, then `cls_depth` class-attention
    layers. `num_classes=0` makes `forward` return the normed tokens (b, 1 + n, dim), cls first.

    Options beyond vit-pytorch's API (defaults keep its model; the named configurations such
    as `cait_xxs24_224` set the paper's):
      channels          input channels.
      layer_scale_init  initial LayerScale value; None: the paper's rule from `depth`
                        (0.1 up to 18 layers, 1e-5 up to 24, 1e-6 beyond).
      patch_norm        LayerNorms around the patch projection (False: the paper).
      qkv_bias          bias on the query/key/value projections (True: the paper).
      norm_eps          epsilon of every LayerNorm (1e-6 in the paper's code).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, cls_depth, heads, mlp_dim,
                 dim_head=64, dropout=0., emb_dropout=0., layer_dropout=0., channels=3,
                 layer_scale_init=None, patch_norm=True, qkv_bias=False, norm_eps=1e-5):
        super().__init__()
        self.image_size = vit.positive_pair('image_size', image_size)
        self.patch_size = patch_height, patch_width = vit.positive_pair('patch_size', patch_size)
        self.grid_size = vit.patch_grid(self.image_size, self.patch_size)
        for name, value in dict(dim=dim, depth=depth, cls_depth=cls_depth, heads=heads, mlp_dim=mlp_dim,
                                dim_head=dim_head, channels=channels).items():
            vit.positive_int(name, value)
        vit.non_negative_int('num_classes', num_classes)
        for name, value in dict(dropout=dropout, emb_dropout=emb_dropout, layer_dropout=layer_dropout).items():
            vit.probability(name, value)
        if layer_scale_init is None:
            layer_scale_init = layer_scale_init_for(depth)
        elif isinstance(layer_scale_init, bool) or not isinstance(layer_scale_init, (int, float)) \
                or layer_scale_init <= 0:
            raise ValueError(f"layer_scale_init must be a positive float or None (the paper's rule), "
                             f"got {layer_scale_init!r}")

        self.channels = channels
        self.num_classes = num_classes
        patch_dim = channels * patch_height * patch_width

        self.to_patch_embedding = nn.Sequential(
            Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=patch_height, p2=patch_width),
            nn.LayerNorm(patch_dim, eps=norm_eps) if patch_norm else nn.Identity(),
            nn.Linear(patch_dim, dim),
            nn.LayerNorm(dim, eps=norm_eps) if patch_norm else nn.Identity(),
        )
        # positions for the patches only: the cls token joins after the self-attention stage
        self.pos_embedding = nn.Parameter(torch.zeros(self.grid_size[0] * self.grid_size[1], dim))
        self.cls_token = nn.Parameter(torch.zeros(1, dim))
        nn.init.trunc_normal_(self.pos_embedding, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.dropout = nn.Dropout(emb_dropout)

        blocks = dict(layer_dropout=layer_dropout, layer_scale_init=layer_scale_init, qkv_bias=qkv_bias,
                      norm_eps=norm_eps)
        self.patch_transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout, **blocks)
        self.cls_transformer = ClassTransformer(dim, cls_depth, heads, dim_head, mlp_dim, dropout, **blocks)

        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else None

    def set_grad_checkpointing(self, enable=True):
        self.patch_transformer.grad_checkpointing = enable

    def forward_features(self, img):
        """[cls, patch tokens] after both stages and the final norm: (b, 1 + h * w, dim)."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.pos_embedding.dtype)
        x = self.dropout(self.to_patch_embedding(img) + self.pos_embedding)
        x = self.patch_transformer(x)                                   # (b, h * w, dim)
        cls_tokens = repeat(self.cls_token, 'n d -> b n d', b=x.shape[0])
        cls_tokens = self.cls_transformer(cls_tokens, context=x)        # (b, 1, dim)
        return self.norm(torch.cat((cls_tokens, x), dim=1))

    def forward_head(self, tokens, pre_logits=False):
        x = tokens[:, 0]
        if pre_logits or self.mlp_head is None:
            return x
        return self.mlp_head(x)

    def forward(self, img):
        tokens = self.forward_features(img)
        if self.mlp_head is None:
            return tokens
        return self.forward_head(tokens)


# the paper's models (Table 3): name -> (dim, depth, heads, LayerScale init), all with patch 16,
# MLP ratio 4, two class-attention layers; inits as in the released weights
CONFIGS = {
    'xxs24': (192, 24, 4, 1e-5),
    'xxs36': (192, 36, 4, 1e-5),
    'xs24': (288, 24, 6, 1e-5),
    's24': (384, 24, 8, 1e-5),
    's36': (384, 36, 8, 1e-6),
    'm36': (768, 36, 16, 1e-6),
    'm48': (768, 48, 16, 1e-6),
}


def cait(variant, *, image_size=224, num_classes=1000, **overrides):
    """The paper's CaiT `variant` (a key of CONFIGS); keyword arguments override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, depth, heads, init = CONFIGS[variant]
    kwargs = dict(image_size=image_size, patch_size=16, num_classes=num_classes, dim=dim, depth=depth,
                  cls_depth=2, heads=heads, mlp_dim=4 * dim, dim_head=dim // heads, layer_scale_init=init,
                  patch_norm=False, qkv_bias=True, norm_eps=1e-6)
    return CaiT(**{**kwargs, **overrides})


def cait_xxs24_224(**kwargs):
    return cait('xxs24', **kwargs)


def cait_xxs36_224(**kwargs):
    return cait('xxs36', **kwargs)


def cait_xs24_384(**kwargs):
    return cait('xs24', **{'image_size': 384, **kwargs})


def cait_s24_224(**kwargs):
    return cait('s24', **kwargs)


def cait_s36_384(**kwargs):
    return cait('s36', **{'image_size': 384, **kwargs})


def cait_m36_384(**kwargs):
    return cait('m36', **{'image_size': 384, **kwargs})


def cait_m48_448(**kwargs):
    return cait('m48', **{'image_size': 448, **kwargs})
