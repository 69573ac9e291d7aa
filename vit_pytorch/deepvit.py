"""DeepViT: re-attention.

"DeepViT: Towards Deeper Vision Transformer", Zhou et al., arXiv 2103.11886: in deep ViTs the
attention maps of later layers become nearly identical ("attention collapse"); re-attention
regenerates them by mixing the heads' maps with a learned head-by-head matrix, followed by a
normalisation, so that deeper stacks keep learning.

    Re-Attention(Q, K, V) = Norm(Theta^T softmax(Q K^T / sqrt(d))) V

Theta is an (heads, heads) matrix and Norm is a LayerNorm across the heads, as in the
`vit-pytorch` package (the official code uses a 1x1 convolution and a BatchNorm over heads).
Everything else is the core ViT (`vit_pytorch.vit`). Checkpoints of `vit-pytorch`'s DeepViT
(pool='cls') load unchanged: its head LayerNorm becomes the final norm (the same function on the
cls token).

The paper's models (official code, `deepvit_patch16_224_re_attn_{16,24,32}b`): patch 16, width 384,
12 heads of 32, MLP 1152 (ratio 3), re-attention in every block, qkv bias, LayerNorm eps 1e-6,
a plain patch projection:

    deepvit_16()    16 blocks   24.4M parameters (published: 24.5M)
    deepvit_24()    24 blocks   36.3M            (published: 36.3M)
    deepvit_32()    32 blocks   48.1M            (published: 48.1M)

Our re-attention has no bias on its head-mixing matrix (the official 1x1 convolution has one):
12 parameters fewer per block. DeepViT-S and DeepViT-L (the official `deepvit_S`/`deepvit_L`,
27M and 55M) are not offered: they add a two-convolution BatchNorm stem, re-attention only in the
last 5 of 16 / 12 of 32 blocks and a residual rescaling, which this module does not implement.

    import torch
    from vit_pytorch.deepvit import DeepViT

    model = DeepViT(image_size=256, patch_size=32, num_classes=1000,
                    dim=1024, depth=6, heads=16, mlp_dim=2048, dropout=0.1, emb_dropout=0.1)
    logits = model(torch.randn(1, 3, 256, 256))   # (1, 1000)
"""

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit


class ReAttention(vit.Attention):
    """The core attention with the heads' maps remixed by `reattn_weights` and normed across heads.

    Re-attention needs the attention matrix itself, so it is always formed explicitly and always
    passes through `attention_probs` (`fused` stays False); the recorded map is the re-attention
    map, the one that multiplies the values.
    """

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., *, qkv_bias=False, norm_eps=1e-5):
        super().__init__(dim, heads, dim_head, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps)
        self.fused = False
        self.reattn_weights = nn.Parameter(torch.randn(heads, heads))
        self.reattn_norm = nn.Sequential(
            Rearrange('b h i j -> b i j h'),
            nn.LayerNorm(heads),
            Rearrange('b i j h -> b h i j'),
        )

    def forward(self, x):
        q, k, v = self.qkv(x)
        attn = (q @ k.transpose(-1, -2) * self.scale).softmax(dim=-1)
        attn = F.dropout(attn, self.dropout, self.training)
        attn = einsum(attn, self.reattn_weights, 'b h i j, h g -> b g i j')
        attn = self.attention_probs(self.reattn_norm(attn))
        out = rearrange(attn @ v, 'b h n d -> b n (h d)')
        return self.to_out(out)


class Transformer(vit.Transformer):
    """vit-pytorch's `deepvit.Transformer`: `depth` pre-norm (re-attention, feedforward) layers, no final norm
    (DeepViT's head norms the pooled token); (b, n, dim) -> (b, n, dim)."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0.):
        super().__init__(dim, depth, heads, dim_head, mlp_dim, dropout, attention=ReAttention, final_norm=False)


class DeepViT(vit.ViT):
    """The core ViT (same arguments, methods and `num_classes=0` behaviour) with re-attention.

    `patch_norm`, `qkv_bias` and `norm_eps` are the core's (defaults: vit-pytorch's model;
    `patch_norm=False, qkv_bias=True, norm_eps=1e-6`: the paper's).

    `forward_features` returns all tokens after the final norm, (b, prefix + h * w, dim), as `vit.ViT`.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs, attention=ReAttention)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # vit-pytorch's DeepViT has no final norm in its transformer; its head is
        # Sequential(LayerNorm, Linear) applied to the pooled token
        norm_key, linear_key = prefix + 'mlp_head.0.', prefix + 'mlp_head.1.'
        if norm_key + 'weight' in state_dict:
            if self.pool == 'mean':
                raise ValueError(
                    "vit-pytorch's DeepViT(pool='mean') normalises after pooling, which this model (norm, "
                    "then pool) cannot reproduce; only its pool='cls' checkpoints load"
                )
            for name in ('weight', 'bias'):
                state_dict[prefix + 'transformer.norm.' + name] = state_dict.pop(norm_key + name)
                state_dict[prefix + 'mlp_head.' + name] = state_dict.pop(linear_key + name)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


# the paper's models (official code, deepvit_patch16_224_re_attn_*b): name -> depth; all with patch 16,
# width 384, 12 heads of 32, MLP ratio 3, qkv bias, LayerNorm eps 1e-6 and no patch LayerNorm
CONFIGS = {'16': 16, '24': 24, '32': 32}


def deepvit(variant, *, image_size=224, num_classes=1000, **overrides):
    """The paper's DeepViT-`variant` (a key of CONFIGS); keyword arguments override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    kwargs = dict(image_size=image_size, patch_size=16, num_classes=num_classes, dim=384, depth=CONFIGS[variant],
                  heads=12, dim_head=32, mlp_dim=1152, patch_norm=False, qkv_bias=True, norm_eps=1e-6)
    return DeepViT(**{**kwargs, **overrides})


def deepvit_16(**kwargs):
    return deepvit('16', **kwargs)


def deepvit_24(**kwargs):
    return deepvit('24', **kwargs)


def deepvit_32(**kwargs):
    return deepvit('32', **kwargs)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's DeepViT has our parameter names; its head LayerNorm becomes our final norm in
    `DeepViT._load_from_state_dict` (the same function on the cls token)."""
    return None
