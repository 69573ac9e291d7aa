"""SimpleViT with value residual learning (ResFormer).

Zhou et al., "Value Residual Learning For Alleviating Attention Concentration In Transformers", arXiv 2410.17897:
in a deep stack the later layers' attention concentrates on few tokens and the first layer's token-level
information fades; giving every later layer a residual path to the first layer's values keeps it. Layer n attends
with the values mixed with the first layer's, V'_n = lambda V_n + (1 - lambda) V_1 (the first layer attends over its
own), while its queries and keys are its own.

By default (`value_residual_mix=None`), as in vit-pytorch, lambda is learned and depends on the token: each later
layer maps its normed input through a Linear(dim, heads) and a sigmoid, one weight per token and head. A float
`value_residual_mix` fixes lambda instead, with no parameters: 0.5 is the paper's ResFormer (lambda_1 = lambda_2 =
0.5).

    import torch
    from vit_pytorch.simple_vit_with_value_residual import SimpleViT

    model = SimpleViT(num_classes=1000, image_size=256, patch_size=8, dim=1024, depth=6, heads=8, mlp_dim=2048)
    logits = model(torch.randn(2, 3, 256, 256))   # (2, 1000)

With `value_residual_mix=0.5` the attention layers compute the official ResFormer's (github.com/Zcchill/
Value-Residual-Learning, a Llama language model): its weights give its outputs over a residual stream of three
layers (tests/test_simple_vit_with_value_residual.py, its causal mask and rotary positions aside).

Where it differs from vit-pytorch 1.26.14 (whose checkpoints load unchanged, same keys): the fixed mix
`value_residual_mix` is ours (vit-pytorch's model always learns it); the first layer's values are handed down as the
stack's layer-to-layer state, so gradient checkpointing and `forward_intermediates` work as for every SimpleViT.
"""

import functools

from einops import rearrange
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import simple_vit, vit


class Attention(simple_vit.Attention):
    """SimpleViT's attention whose values can be mixed with the first layer's: `forward(x, value_residual=None)`
    returns (output (b, n, dim), the values it attended over (b, heads, n, dim_head)).

    `learned_value_residual_mix=True`: the weight of its own values is sigmoid(Linear(normed x)), per token and
    head; else the fixed `value_residual_mix`."""

    def __init__(self, dim, heads=8, dim_head=64, learned_value_residual_mix=False, *, value_residual_mix=0.5):
        super().__init__(dim, heads, dim_head)
        self.value_residual_mix = value_residual_mix
        if learned_value_residual_mix:
            self.to_residual_mix = nn.Sequential(nn.Linear(dim, heads), nn.Sigmoid(), Rearrange('b n h -> b h n 1'))

    def qkv(self, x, value_residual=None):
        """Queries, keys and values (mixed with `value_residual` where given): 3 x (b, heads, n, dim_head)."""
        normed = self.norm(x)
        q, k, v = rearrange(self.to_qkv(normed), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=self.heads)
        if value_residual is not None:
            mix = self.to_residual_mix(normed) if hasattr(self, 'to_residual_mix') else self.value_residual_mix
            v = v * mix + value_residual * (1. - mix)
        return q, k, v

    def forward(self, x, value_residual=None):
        q, k, v = self.qkv(x, value_residual)
        return self.to_out(rearrange(self.attend(q, k, v), 'b h n d -> b n (h d)')), v


def feedforward(dim, hidden_dim):
    """SimpleViT's MLP as a bare Sequential (keys 0, 1, 3), the layout of vit-pytorch's value-residual module."""
    return nn.Sequential(*simple_vit.FeedForward(dim, hidden_dim).net)


class Transformer(vit.Stack):
    """vit-pytorch's value-residual `Transformer`: `depth` (attention, feedforward) layers, then a LayerNorm. The
    first layer leaves its values in the state as 'first_values'; every later layer mixes them into its own.
    `attention` builds each layer's as this file's `Attention`."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, *, value_residual_mix=None, attention=Attention):
        learned = value_residual_mix is None
        super().__init__([
            (attention(dim, heads, dim_head, learned_value_residual_mix=learned and index > 0,
                       value_residual_mix=0.5 if learned else value_residual_mix),
             feedforward(dim, mlp_dim))
            for index in range(depth)
        ], norm=nn.LayerNorm(dim))

    def step(self, entry, x, state):
        attn, ff = entry
        first = state.get('first_values')
        out, values = attn(x, value_residual=first)
        x = out + x
        return ff(x) + x, {} if first is not None else {'first_values': values}


class SimpleViT(simple_vit.SimpleViT):
    """`vit_pytorch.simple_vit.SimpleViT` (same arguments and methods) with value residuals; `value_residual_mix`
    (keyword only, ours): None learns the weight of each layer's own values per token and head (vit-pytorch), a float
    in [0, 1] fixes it (0.5: the paper's ResFormer).

    `forward_features` returns all tokens after the final norm, (b, h * w, dim).
    `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 value_residual_mix=None):
        check_arguments(**vit.arguments(locals()))
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                         attention=Attention,
                         transformer=functools.partial(Transformer, value_residual_mix=value_residual_mix))


# argument checks


def check_arguments(*, value_residual_mix, **_):
    if value_residual_mix is not None:
        vit.fraction('value_residual_mix', value_residual_mix, " (the weight of each layer's own values) or None")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's module has our parameter names and computes the same function, with the learned mix."""
    fixed = [attn.value_residual_mix for attn, _ in model.transformer.layers[1:]
             if not hasattr(attn, 'to_residual_mix')]
    if fixed:
        raise ValueError(f"vit-pytorch's value-residual SimpleViT learns the mix of the values per token "
                         f"(to_residual_mix); this model fixes it at value_residual_mix={fixed[0]}: build it with "
                         f"value_residual_mix=None to load the checkpoint")
    return None
