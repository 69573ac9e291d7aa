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

The paper's models are `CONFIGS` (U-ViT-S, S-Deep, M, L, H), built by `uvit(variant)` with the patch size after a
slash as the paper names them, `uvit('H/2', num_classes=1000)`. A configuration maps onto this classifier as: depth,
the paper's layers, counts every block (the official code's `depth` argument is one less: depth // 2 in-blocks, a
mid-block, depth // 2 out-blocks), so depth // 2 long skips; dim, its hidden size, in heads of dim // heads channels;
an MLP 4 * dim wide; the patch size, 16 x 16 patches by default (the grid of every model of the paper: 32-pixel
CIFAR-10 with patches of 2, 64-pixel CelebA and ImageNet with 4, the autoencoder's 32 x 32 and 64 x 64 latents of 4
channels with 2 and 4). The diffusion model's parts this classifier does not have: the time token, the class-label
token (an Embedding) or the 77 text tokens (a Linear from the text encoder's width), the learned position table (here
fixed sin-cos, and registers where those tokens stand), and the output head (a Linear back to patch pixels, then a
3 x 3 convolution). In the parts they share, the attention's output projection here has no bias (SimpleViT's) and
the patch projection is a Linear between two LayerNorms (there a strided convolution: the same count without the
norms). So the blocks, skips and final norm count the official code's less dim per block, and the patch projection
counts the official one (tests/test_simple_uvit.py, against counts of the official models).
"""

import re

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


# The paper's models (its table of configurations; the official code's configs/*.py at baofff/U-ViT @ ce55170 build
# S, M, L and H with these widths, depths and heads; S-Deep, its text-to-image model, is in the table alone):
# name -> (dim, depth, heads), depth counting every block. All have an MLP 4 * dim wide (mlp_ratio=4) and heads of
# dim // heads channels.
CONFIGS = {'S': (512, 13, 8), 'S-Deep': (512, 17, 8), 'M': (768, 17, 12), 'L': (1024, 21, 16), 'H': (1152, 29, 16)}
GRID = 16                       # patches a side in every model of the paper


def uvit(variant, *, image_size=None, num_classes=1000, **overrides):
    """The paper's U-ViT-`variant`, a key of CONFIGS and a patch size ('S/2', 'H/4', 'S-Deep/2'), as this
    classifier, on images of `image_size` (default: 16 patches a side); keyword arguments override the table."""
    match = re.fullmatch(r'(.+)/([1-9][0-9]*)', variant) if isinstance(variant, str) else None
    if match is None or match[1] not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, a slash and a patch size, as 'H/2', "
                         f"got {variant!r}")
    dim, depth, heads = CONFIGS[match[1]]
    patch = int(match[2])
    kwargs = dict(image_size=GRID * patch if image_size is None else image_size, patch_size=patch,
                  num_classes=num_classes, dim=dim, depth=depth, heads=heads, dim_head=dim // heads, mlp_dim=4 * dim)
    return SimpleUViT(**{**kwargs, **overrides})


# argument checks


def check_arguments(*, num_register_tokens, **_):
    vit.non_negative_int('num_register_tokens', num_register_tokens)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    raise ValueError("vit-pytorch's simple_uvit hands each shallow block's input to the deep block mirroring it (its "
                     "last block receives the patch tokens); the paper (arXiv 2209.12152) and this model hand on "
                     "each shallow block's output: its checkpoints compute another function and cannot be loaded")
