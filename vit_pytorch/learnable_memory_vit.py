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
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import vit as core


class Attention(core.Attention):
    """The core attention, optionally with memory tokens (keys and values only) and a boolean mask.

    `memories` (depth, m, dim) holds every layer's memory tokens; this layer takes row
    `layer_index`. They join the layer input, so they are normed and projected like tokens, but
    only the n real tokens ask queries. `mask` (n, n + m), True where a query may attend,
    follows the key order (tokens, then memories). The recorded map is (b, heads, n, n + m).
    """

    layer_index = None      # set by the ViT that holds the layer

    def forward(self, x, *, memories=None, mask=None):
        num_tokens = x.shape[1]
        if memories is not None:
            x = torch.cat((x, repeat(memories[self.layer_index], 'm d -> b m d', b=x.shape[0])), dim=1)
        q, k, v = self.qkv(x)
        out = self.attend(q[:, :, :num_tokens], k, v, mask=mask)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class ViT(core.ViT):
    """The core ViT (same arguments, parameters and methods) whose transformer accepts memories:
    `transformer(tokens, memories=(depth, m, dim), mask=(n, n + m))`.

    `patch_norm`, `qkv_bias` and `norm_eps` are the core's (defaults: vit-pytorch's model;
    `patch_norm=False, qkv_bias=True, norm_eps=1e-6`: the ViT paper's).

    `forward_features` returns all tokens after the final norm, (b, prefix + h * w, dim), as `vit.ViT`.
    `num_classes=0` makes `forward` return those tokens, as `vit.ViT`.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs, attention=Attention)
        for index, (attn, _) in enumerate(self.transformer.layers):
            attn.layer_index = index


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
        self.num_prefix_tokens = 1 + vit.num_prefix_tokens

    def token_grid(self, image_size):
        """The frozen ViT's grid of patch tokens for images of `image_size` (h, w)."""
        return self.vit.token_grid(image_size)

    def forward_features(self, img):
        """[new class token, the frozen model's tokens] after the final norm: (b, 1 + prefix + h * w, dim).

        Everything after the first token equals `self.vit.forward_features(img)`.
        """
        tokens = self.vit.embed(img)                                   # (b, prefix + h * w, dim)
        memory_cls = repeat(self.memory_cls_token, 'd -> b 1 d', b=tokens.shape[0])
        x = torch.cat((memory_cls, tokens), dim=1)
        mask = memory_attention_mask(tokens.shape[1], self.num_memories_per_layer, device=x.device)
        return self.vit.transformer(x, memories=self.memories_per_layer, mask=mask)

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


# loading checkpoints


def _refuse_adapter(model):
    if isinstance(model, Adapter):
        raise ValueError("an Adapter wraps a frozen ViT: load the checkpoint into that ViT (adapter.vit), "
                         "then wrap it")


def timm_plan(model, keys):
    """timm's ViT (the backbone the paper adapts): the paper ViT's plan (vit_pytorch.pretrained)."""
    from vit_pytorch import pretrained
    _refuse_adapter(model)
    return pretrained.timm_plan(model, keys)


def hf_plan(model, keys):
    from vit_pytorch import pretrained
    _refuse_adapter(model)
    return pretrained.hf_plan(model, keys)


def jax_plan(model, keys):
    from vit_pytorch import pretrained
    _refuse_adapter(model)
    return pretrained.jax_plan(model, keys)


def vit_pytorch_plan(model, keys):
    """vit-pytorch's learnable-memory `ViT`: its separate q and kv projections are our one qkv projection,
    and its head's LayerNorm is our final norm (the same function on the cls token it reads)."""
    if isinstance(model, Adapter):
        raise ValueError(
            "vit-pytorch's Adapter computes another function: it appends the memories to the keys and values "
            "without the layer's LayerNorm (ours normalises them with the tokens, as the paper concatenates them "
            "to the layer's input) and has a LayerNorm of its own before the head (ours reuses the ViT's final "
            "norm). Its ViT (the `vit.` entries) loads into learnable_memory_vit.ViT")
    state = model.state_dict()
    if model.pool != 'cls':
        raise ValueError("vit-pytorch's learnable-memory ViT always reads the cls token, whatever its pool: "
                         "build the model with pool='cls'")
    if 'to_patch_embedding.1.weight' not in state or 'transformer.layers.0.0.to_qkv.bias' in state:
        raise ValueError("vit-pytorch's learnable-memory ViT has LayerNorms around the patch projection and no qkv "
                         "bias: build the model with patch_norm=True and qkv_bias=False (the defaults)")
    if 'mlp_head.weight' not in state:
        raise ValueError("vit-pytorch's learnable-memory ViT always has a head: build the model with its num_classes")
    plan = {'cls_token': ({'cls_token': (1, *state['cls_token'].shape)}, lambda t: t[0]),
            'pos_embedding': ({'pos_embedding': (1, *state['pos_embedding'].shape)}, lambda t: t[0])}
    for ours, theirs in (('transformer.norm.', 'mlp_head.0.'), ('mlp_head.', 'mlp_head.1.')):
        for kind in ('weight', 'bias'):
            plan[ours + kind] = ({theirs + kind: tuple(state[ours + kind].shape)}, lambda t: t)
    for i in range(len(model.transformer.layers)):
        key = f'transformer.layers.{i}.0.to_qkv.weight'
        inner, dim = state[key].shape[0] // 3, state[key].shape[1]
        plan[key] = ({f'transformer.layers.{i}.0.to_q.weight': (inner, dim),
                      f'transformer.layers.{i}.0.to_kv.weight': (2 * inner, dim)}, lambda q, kv: torch.cat((q, kv)))
    for key, tensor in state.items():
        if key not in plan:
            plan[key] = ({key: tuple(tensor.shape)}, lambda t: t)
    return plan, ()
