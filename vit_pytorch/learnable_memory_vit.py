"""Learnable memory: fine-tune a frozen ViT through a few new tokens per layer.

"Fine-tuning Image Transformers using Learnable Memory", Sandler, Zhmoginov, Vladymyrov and
Jackson, arXiv 2203.15243: to adapt a pretrained ViT to a new task, keep all its weights and
learn only (a) a few "memory" tokens per layer, concatenated to that layer's input as extra keys
and values (their own outputs are discarded), (b) a new class token and (c) a new head.

With the paper's attention mask (its "non-destructive fine-tuning" setting) the original tokens
attend neither to the memories nor to the new class token, so they compute exactly what the
frozen model computes, and one forward pass can serve the old task and the new one; only the new
class token reads the memories. `Adapter` implements that setting: its tokens after the
new class token are the frozen model's own tokens.

`ViT` is the core ViT (same arguments and parameter names, so a `vit_pytorch.ViT` checkpoint
loads into it) whose layers accept memories and a mask.

    import torch
    from vit_pytorch.learnable_memory_vit import ViT, Adapter

    vit = ViT(image_size=256, patch_size=16, num_classes=1000, dim=1024, depth=6, heads=16,
              mlp_dim=2048)                                  # pretrained in practice
    adapter = Adapter(vit=vit, num_memories_per_layer=10, num_classes=2)
    logits = adapter(torch.randn(4, 3, 256, 256))            # (4, 2)
    optimizer = torch.optim.AdamW(adapter.parameters())      # only the adapter's tensors train

The paper adapts ViT-B/16 (the ViT paper's model: patch 16, width 768, depth 12, 12 heads, MLP
3072, qkv bias, LayerNorm eps 1e-6, a plain patch projection), 86.6M parameters; an adapter with m
memories per layer adds 12 m 768 + 768 + (768 + 1) classes trainable parameters:

    vit_b_16(num_classes=1000)                              the frozen backbone, 86.6M
    memory_adapter_b_16(num_memories_per_layer=m, num_classes=c, vit=None)
                                                            a new ViT-B/16 (or `vit`) with an adapter
"""

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn
from torch.utils.checkpoint import checkpoint

from vit_pytorch import vit as core


class Attention(core.Attention):
    """The core attention, optionally with memory tokens (keys and values only) and a boolean mask.

    `memories` (m, dim) or (b, m, dim) join the layer input, so they are normed and projected like
    tokens, but only the n real tokens ask queries. `attn_mask` (n, n + m), True where a query may
    attend, follows the key order (tokens, then memories). The recorded map is (b, heads, n, n + m).
    """

    def forward(self, x, memories=None, attn_mask=None):
        num_tokens = x.shape[1]
        if memories is not None:
            memories = repeat(memories, 'm d -> b m d', b=x.shape[0]) if memories.ndim == 2 else memories
            x = torch.cat((x, memories), dim=1)
        x = self.norm(x)
        q, k, v = rearrange(self.to_qkv(x), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=self.heads)
        q = q[:, :, :num_tokens]
        dropout_p = self.dropout if self.training else 0.
        if self.fused:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=self.scale)
        else:
            dots = q @ k.transpose(-1, -2) * self.scale
            if attn_mask is not None:
                dots = dots.masked_fill(~attn_mask, float('-inf'))
            attn = self.attention_probs(dots.softmax(dim=-1))
            out = F.dropout(attn, dropout_p) @ v
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class Transformer(core.Transformer):
    """The core pre-norm stack; `memories` (depth, m, dim) hands each layer its own memory tokens."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0., *, qkv_bias=False, norm_eps=1e-5):
        super().__init__(dim, 0, heads, dim_head, mlp_dim, dropout, norm_eps=norm_eps)
        self.layers.extend(
            nn.ModuleList([Attention(dim, heads, dim_head, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps),
                           core.FeedForward(dim, mlp_dim, dropout, norm_eps=norm_eps)])
            for _ in range(depth)
        )

    @staticmethod
    def layer(attn, ff, x, memories=None, attn_mask=None):
        x = attn(x, memories, attn_mask) + x
        return ff(x) + x

    def forward(self, x, *, memories=None, attn_mask=None, return_layers=False):
        outputs = []
        for index, (attn, ff) in enumerate(self.layers):
            layer_memories = None if memories is None else memories[index]
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(self.layer, attn, ff, x, layer_memories, attn_mask, use_reentrant=False)
            else:
                x = self.layer(attn, ff, x, layer_memories, attn_mask)
            outputs.append(x)
        x = self.norm(x)
        return (x, outputs) if return_layers else x


class ViT(core.ViT):
    """The core ViT (same arguments, parameters and methods) whose transformer accepts memories.

    `patch_norm`, `qkv_bias` and `norm_eps` are the core's (defaults: vit-pytorch's model;
    `patch_norm=False, qkv_bias=True, norm_eps=1e-6`: the ViT paper's).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim,
                 pool='cls', channels=3, dim_head=64, dropout=0., emb_dropout=0.,
                 patch_norm=True, qkv_bias=False, norm_eps=1e-5):
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim,
                         depth=depth, heads=heads, mlp_dim=mlp_dim, pool=pool, channels=channels,
                         dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout,
                         patch_norm=patch_norm, qkv_bias=qkv_bias, norm_eps=norm_eps)
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout,
                                       qkv_bias=qkv_bias, norm_eps=norm_eps)


def memory_attention_mask(num_tokens, num_memories, device=None):
    """The paper's mask for [new cls, the model's n tokens] attending to [the same, memories]: (1 + n, 1 + n + m).

    The new class token attends to everything; the model's own tokens attend only to each other.
    """
    mask = torch.zeros(1 + num_tokens, 1 + num_tokens + num_memories, dtype=torch.bool, device=device)
    mask[0] = True
    mask[1:, 1:1 + num_tokens] = True
    return mask


class Adapter(nn.Module):
    """Fine-tune a frozen learnable-memory `ViT` through memory tokens, a new class token and a new head.

    The wrapped ViT is frozen (`requires_grad_(False)`) and never modified: `adapter.parameters()`
    with `requires_grad` are `memory_cls_token`, `memories_per_layer` and `mlp_head`'s. The
    adapter reuses the ViT's final norm; its head is one Linear.
    """

    def __init__(self, *, vit, num_memories_per_layer=10, num_classes=2):
        super().__init__()
        if not isinstance(vit, ViT):
            raise TypeError(f"vit must be a vit_pytorch.learnable_memory_vit.ViT (load a vit_pytorch.ViT checkpoint "
                            f"into one), got {type(vit).__name__}")
        core.positive_int('num_memories_per_layer', num_memories_per_layer)
        core.positive_int('num_classes', num_classes)
        dim = vit.pos_embedding.shape[-1]
        depth = len(vit.transformer.layers)

        self.vit = vit.requires_grad_(False)
        self.num_memories_per_layer = num_memories_per_layer
        self.memory_cls_token = nn.Parameter(torch.zeros(dim))
        self.memories_per_layer = nn.Parameter(torch.zeros(depth, num_memories_per_layer, dim))
        nn.init.trunc_normal_(self.memory_cls_token, std=0.02)
        nn.init.trunc_normal_(self.memories_per_layer, std=0.02)
        self.mlp_head = nn.Linear(dim, num_classes)

    def forward_features(self, img):
        """[new class token, the frozen model's tokens] after the final norm: (b, 1 + prefix + h * w, dim).

        Everything after the first token equals `self.vit.forward_features(img)`.
        """
        tokens = self.vit.embed(img)                                   # (b, prefix + h * w, dim)
        memory_cls = repeat(self.memory_cls_token, 'd -> b 1 d', b=tokens.shape[0])
        x = torch.cat((memory_cls, tokens), dim=1)
        mask = memory_attention_mask(tokens.shape[1], self.num_memories_per_layer, device=x.device)
        return self.vit.transformer(x, memories=self.memories_per_layer, attn_mask=mask)

    def forward_head(self, tokens, pre_logits=False):
        x = tokens[:, 0]
        return x if pre_logits else self.mlp_head(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))


def vit_b_16(*, image_size=224, num_classes=1000, **overrides):
    """ViT-B/16 as the paper adapts it (the ViT paper's model), with memory-ready layers."""
    kwargs = dict(image_size=image_size, patch_size=16, num_classes=num_classes, dim=768, depth=12, heads=12,
                  dim_head=64, mlp_dim=3072, patch_norm=False, qkv_bias=True, norm_eps=1e-6)
    return ViT(**{**kwargs, **overrides})


def memory_adapter_b_16(*, num_memories_per_layer=10, num_classes=2, vit=None):
    """An `Adapter` on `vit` (a new `vit_b_16()` when None, to be loaded with pretrained weights)."""
    return Adapter(vit=vit_b_16() if vit is None else vit, num_memories_per_layer=num_memories_per_layer,
                   num_classes=num_classes)
