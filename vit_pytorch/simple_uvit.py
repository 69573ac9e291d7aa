"""SimpleViT with U-ViT's long skip connections and register tokens.

Bao et al., "All are Worth Words: A ViT Backbone for Diffusion Models" (U-ViT), arXiv 2209.12152: a ViT whose
shallow and deep blocks are joined like a U-Net's. The first depth // 2 blocks are shallow, each leaving its output
for the deep block that mirrors it; with an odd depth one middle block follows; each deep block first joins the
stream x with the output it receives, Linear([x, skip]) (the paper's best way to combine them, a Linear on the
concatenation), then runs as a pre-norm block. The i-th shallow block's output (from 0) reaches block depth - 1 - i.

    import torch
    from vit_pytorch.simple_uvit import SimpleUViT

    model = SimpleUViT(image_size=256, patch_size=32, num_classes=1000, dim=256, depth=7, heads=8, mlp_dim=512)
    logits = model(torch.randn(2, 3, 256, 256))   # (2, 1000)

The registers (`num_register_tokens`, learned, without positions) come before the patch tokens and are dropped
before the mean pooling; they stand where U-ViT's time and condition tokens stand in the paper.

Where it differs from vit-pytorch 1.26.14, which does not compute the paper's function (its checkpoints are
refused, naming it): vit-pytorch's skips carry the shallow blocks' inputs, not their outputs, so its last deep block
receives the patch tokens and the last shallow block's output reaches no skip; the paper (and its official code)
hands each shallow block's output on. vit-pytorch concatenates [skip, x], the paper [x, skip] (the same function
class: the Linear's columns swap). With an even depth there is no middle block, as in vit-pytorch, and the innermost
skip joins the first deep block's input with itself; the paper's configurations have an odd depth.
"""

import torch
from torch import nn

from vit_pytorch import simple_vit, vit


class Transformer(vit.Stack):
    """vit-pytorch's U-ViT `Transformer`: `depth` layers of (skip Linear or None, attention, feedforward), then a
    LayerNorm. Shallow layers leave their outputs in the state ('skips', a tuple); a deep layer takes the latest."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, *, attention=simple_vit.Attention):
        self.num_shallow = depth // 2
        super().__init__([
            (nn.Linear(2 * dim, dim) if index >= depth - self.num_shallow else None, attention(dim, heads, dim_head),
             nn.Sequential(*simple_vit.FeedForward(dim, mlp_dim).net))     # vit-pytorch's bare MLP (keys 0, 1, 3)
            for index in range(depth)
        ], norm=nn.LayerNorm(dim))

    def step(self, entry, x, state):
        combine_skip, attn, ff = entry
        index, skips = state.get('index', 0), state.get('skips', ())
        if combine_skip is not None:
            x = combine_skip(torch.cat((x, skips[-1]), dim=-1))
            skips = skips[:-1]
        x = attn(x) + x
        x = ff(x) + x
        if index < self.num_shallow:
            skips = (*skips, x)
        return x, {'index': index + 1, 'skips': skips}


class SimpleUViT(simple_vit.Registers, simple_vit.SimpleViT):
    """`vit_pytorch.simple_vit.SimpleViT` (same arguments and methods) with U-ViT's long skips and
    `num_register_tokens` registers before the patch tokens.

    `forward_features` returns all tokens after the final norm, (b, registers + h * w, dim); `forward_head` drops the
    registers before the mean pooling. `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, num_register_tokens=4,
                 channels=3, dim_head=64):
        check_arguments(**vit.arguments(locals()))
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                         transformer=Transformer)
        self.add_registers(num_register_tokens, dim, lambda tokens: vit.init_tokens(tokens, patch_norm=True))


# argument checks


def check_arguments(*, num_register_tokens, **_):
    vit.non_negative_int('num_register_tokens', num_register_tokens)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    raise ValueError("vit-pytorch's simple_uvit hands each shallow block's input to the deep block mirroring it (its "
                     "last block receives the patch tokens); the paper (arXiv 2209.12152) and this model hand on "
                     "each shallow block's output: its checkpoints compute another function and cannot be loaded")
