"""SimpleViT with orthogonal residual updates.

Oh et al., "Revisiting Residual Connections: Orthogonal Updates for Stable and Efficient Deep Networks",
arXiv 2505.11881: a residual branch's output f(x) has a part parallel to the stream x, which only rescales what is
already there, and a part orthogonal to it, which adds a new direction. Adding only the orthogonal part,
x + f(x) - (<f(x), x> / <x, x>) x per token, makes every branch contribute something new to the stream; the paper
reports more stable and faster training. A token's stream can then only grow: |x + u|^2 = |x|^2 + |u|^2.

    import torch
    from vit_pytorch.simple_vit_orthog_residual_update import SimpleViT, ortho_vit

    model = SimpleViT(image_size=256, patch_size=16, num_classes=10, dim=512, depth=2, heads=4, mlp_dim=2048,
                      orthog_residual_update_kwargs=dict(learned=True))
    logits = model(torch.randn(2, 3, 256, 256))   # (2, 10)
    small = ortho_vit('S/4', num_classes=10)       # the paper's ViT-S on CIFAR-10 (32 px): 10,661,866 parameters

`orthog_residual_update_kwargs` as in vit-pytorch 1.26.14 (whose checkpoints load unchanged, same keys):
`double_precision` (default True) computes the projection in float64 and casts back; `learned=True` (vit-pytorch's
refinement, not the paper's) adds both parts, each scaled by a sigmoid of a Linear of the branch's output per token.
Ours also takes `orthogonal_method`, the official code's option: 'feature' (the default, the paper's Orthogonal-F and
vit-pytorch's update, per token) or 'global' (one projection per image: f - (<f, x> / <x, x>) x with the inner
products over all the image's tokens and channels, so the update is orthogonal to the image's whole stream, not to
each token, and only the image's norm is sure to grow).
Where it differs from vit-pytorch: `orthog_residual_update_kwargs` defaults to None (vit-pytorch: an empty dict, the
same model); an unknown key, a non-boolean flag or an unknown method in that dict is refused by name (vit-pytorch
passes it on, to a TypeError); and a zero stream token (norm below 1e-12; for 'global', a zero image) takes the whole
branch output, as vit-pytorch's `F.normalize` gives.
"""

import functools
import re

from torch import nn

from vit_pytorch import simple_vit, vit

ORTHOGONAL_METHODS = ('feature', 'global')     # the official code's names: per token, per image


class OrthogonalResidualUpdate(nn.Module):
    """A residual branch `block` whose `forward(x)` returns the update to add to the stream x (b, n, dim): the part
    of block(x) orthogonal to x (`learned`: both parts, each scaled by sigmoid(Linear(block(x))) per token), per
    token (`orthogonal_method='feature'`) or per image, over all its tokens and channels at once ('global')."""

    def __init__(self, block, dim=None, double_precision=True, learned=False, *, orthogonal_method='feature'):
        super().__init__()
        if learned and dim is None:
            raise ValueError("dim must be given for a learned orthogonal residual update, got None")
        check_orthogonal_method(orthogonal_method)
        self.block = block
        self.double_precision = double_precision
        self.learned = learned
        self.orthogonal_method = orthogonal_method
        if learned:
            self.to_modulation = nn.Linear(dim, 2)

    def orthog_proj(self, block_out, residual):
        """(parallel, orthogonal) parts of `block_out` with respect to `residual`, per token or per image (the
        residual flattened over all axes but the batch's); in float64 if asked."""
        dtype = residual.dtype
        if self.double_precision:
            block_out, residual = block_out.double(), residual.double()
        axes = -1 if self.orthogonal_method == 'feature' else tuple(range(1, residual.ndim))
        unit = residual / residual.norm(dim=axes, keepdim=True).clamp_min(1e-12)    # F.normalize over `axes`
        parallel = (block_out * unit).sum(dim=axes, keepdim=True) * unit
        return parallel.to(dtype), (block_out - parallel).to(dtype)

    def forward(self, x):
        block_out = self.block(x)
        parallel, orthogonal = self.orthog_proj(block_out, x)
        if not self.learned:
            return orthogonal
        parallel_mod, orthog_mod = self.to_modulation(block_out).sigmoid().chunk(2, dim=-1)   # (b, n, 1) each
        return parallel * parallel_mod + orthogonal * orthog_mod


class Transformer(vit.Stack):
    """vit-pytorch's `Transformer` of this module: `depth` layers of (attention, feedforward), each branch wrapped in
    an `OrthogonalResidualUpdate` (the stack adds what it returns), then a LayerNorm."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, orthog_residual_update_kwargs=None, *,
                 attention=simple_vit.Attention):
        kwargs = orthog_residual_update_kwargs or {}
        super().__init__([
            (OrthogonalResidualUpdate(attention(dim, heads, dim_head), dim=dim, **kwargs),
             OrthogonalResidualUpdate(simple_vit.FeedForward(dim, mlp_dim), dim=dim, **kwargs))
            for _ in range(depth)
        ], norm=nn.LayerNorm(dim))


class SimpleViT(simple_vit.SimpleViT):
    """`vit_pytorch.simple_vit.SimpleViT` (same arguments and methods) whose branches add only their part orthogonal
    to the stream; `orthog_residual_update_kwargs`: `double_precision` (True), `learned` (False), `orthogonal_method`
    ('feature': per token, or 'global': per image).

    `forward_features` returns all tokens after the final norm, (b, h * w, dim).
    `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 orthog_residual_update_kwargs=None):
        check_arguments(**vit.arguments(locals()))
        kwargs = dict(orthog_residual_update_kwargs or {})
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                         transformer=functools.partial(Transformer, orthog_residual_update_kwargs=kwargs))


# the paper's ViT sizes, as the official code builds them (BootsofLagrangian/ortho-residual @ 4f663d3, base.py's
# PRESET_VIT, for the paper's ViT-S and ViT-B): size -> (dim, depth, heads); MLP ratio 4, heads of 64 channels. Its
# train_classifier.py takes the patch size and image size from the dataset: patch size -> image size (CIFAR-10/100
# 32 px, patches of 4; Tiny-ImageNet 64 px, patches of 8; ImageNet-1k 224 px, patches of 16).
CONFIGS = {'S': (384, 6, 6), 'B': (768, 12, 12)}
IMAGE_SIZES = {4: 32, 8: 64, 16: 224}


def ortho_vit(variant, *, image_size=None, num_classes=1000, **overrides):
    """The paper's ViT-`variant`, a size of CONFIGS, a slash and a patch size of IMAGE_SIZES ('S/4' .. 'B/16'), at
    the image size the official code trains that patch size on (unless `image_size` is given); keyword arguments
    override the table. The orthogonal update as `SimpleViT`'s default (the paper's, per token)."""
    match = re.fullmatch(r'(.+)/([0-9]+)', variant) if isinstance(variant, str) else None
    if match is None or match[1] not in CONFIGS or int(match[2]) not in IMAGE_SIZES:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, a slash and a patch size of "
                         f"{sorted(IMAGE_SIZES)}, as 'S/4', got {variant!r}")
    dim, depth, heads = CONFIGS[match[1]]
    patch_size = int(match[2])
    config = dict(image_size=IMAGE_SIZES[patch_size] if image_size is None else image_size, patch_size=patch_size,
                  num_classes=num_classes, dim=dim, depth=depth, heads=heads, dim_head=dim // heads, mlp_dim=4 * dim)
    return SimpleViT(**{**config, **overrides})


# argument checks


def check_orthogonal_method(value, name='orthogonal_method'):
    if not isinstance(value, str) or value not in ORTHOGONAL_METHODS:
        raise ValueError(f"{name} must be one of {ORTHOGONAL_METHODS}, got {value!r}")


def check_arguments(*, orthog_residual_update_kwargs, **_):
    if orthog_residual_update_kwargs is None:
        return
    if not isinstance(orthog_residual_update_kwargs, dict):
        raise TypeError(f"orthog_residual_update_kwargs must be a dict or None, got "
                        f"{orthog_residual_update_kwargs!r} ({type(orthog_residual_update_kwargs).__name__})")
    unknown = set(orthog_residual_update_kwargs) - {'double_precision', 'learned', 'orthogonal_method'}
    if unknown:
        raise ValueError(f"orthog_residual_update_kwargs takes 'double_precision', 'learned' and "
                         f"'orthogonal_method', got {sorted(unknown)}")
    for name, value in orthog_residual_update_kwargs.items():
        if name == 'orthogonal_method':
            check_orthogonal_method(value, "orthog_residual_update_kwargs['orthogonal_method']")
        else:
            vit.boolean(f'orthog_residual_update_kwargs[{name!r}]', value)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's module has our parameter names and computes the same function."""
    return None
