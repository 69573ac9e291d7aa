"""SimpleViT with a relative position bias projected from each query token.

vit-pytorch's module (no paper; its docstring credits the design of a released model, "Inkling" by
Thinking Machines): every attention adds to its logits a bias b[i, j] built from the query token's
content and the offset between the two tokens. Per axis of the grid, the query token x_i is projected
to `num_distance_basis` weights per head; a learned bank holds, per axis, `num_distance_basis` curves
over the offsets -(max_dist - 1) .. max_dist - 1; b[i, j] is the sum over the axes of the weighted
curves read at that axis's offset pos_i - pos_j. For a fixed query content the bias is therefore a
function of the relative position only (translation-equivariant); offsets of `max_dist` or more on
any axis get no bias. The sin-cos position table of SimpleViT is still added to the patch tokens.

    import torch
    from vit_pytorch.simple_vit_with_relative_proj_pos_bias import SimpleViT

    model = SimpleViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=2,
                      heads=8, mlp_dim=2048)
    logits = model(torch.randn(2, 3, 256, 256))   # (2, 1000)

Where it differs from vit-pytorch 1.26.14 (whose checkpoints load unchanged, same keys): the grid of
each input is used, so any image whose sides divide by the patch size works (vit-pytorch's is fixed
at `image_size`); each axis's curves are evaluated at the offsets the grid has (2 s - 1 for a side
of s) instead of all 2 max_dist - 1, which gives the same bias at a fraction of the cost.
"""

import functools

import torch
from einops import rearrange
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import simple_vit, vit


class RelativeProjPositionalBias(nn.Module):
    """(b, *grid, dim) tokens on an N-D grid (`dim_pos` axes) -> (b, heads, n, n) additive attention bias,
    n the number of grid cells in row-major order; b[.., i, j] reads the query token i only."""

    def __init__(self, dim, heads, dim_pos=2, num_distance_basis=16, max_dist=512):
        super().__init__()
        self.heads, self.dim_pos, self.num_distance_basis, self.max_dist = heads, dim_pos, num_distance_basis, max_dist
        self.to_distance_weights = nn.Sequential(
            nn.Linear(dim, heads * dim_pos * num_distance_basis),
            Rearrange('b ... (w h d) -> w b h (...) d', w=dim_pos, h=heads),
        )
        # one bank of curves per axis over the offsets -(max_dist - 1) .. max_dist - 1 (index offset + max_dist - 1)
        self.distance_banks = nn.Parameter(torch.randn(dim_pos, num_distance_basis, 2 * max_dist - 1) * 0.02)

    def forward(self, x):
        grid = tuple(x.shape[1:-1])
        if len(grid) != self.dim_pos:
            raise ValueError(f"x must have {self.dim_pos} grid axes between batch and channels (b, *grid, dim), got "
                             f"shape {tuple(x.shape)}")
        weights = self.to_distance_weights(x)                       # (axes, b, heads, n, basis)
        coords = torch.meshgrid(*(torch.arange(side, device=x.device) for side in grid), indexing='ij')
        bias, valid = 0., None
        for axis, (side, coord) in enumerate(zip(grid, coords)):
            # the offsets this axis can have, -(side - 1) .. side - 1, as far as the bank reaches
            low, high = max(0, self.max_dist - side), min(2 * self.max_dist - 1, self.max_dist + side - 1)
            curves = weights[axis] @ self.distance_banks[axis, :, low:high]       # (b, heads, n, offsets)
            coord = coord.flatten()
            offset = coord[:, None] - coord[None, :] + self.max_dist - 1           # (n, n) bank index
            inside = (offset >= low) & (offset < high)
            valid = inside if valid is None else valid & inside
            index = (offset.clamp(low, high - 1) - low).expand(*curves.shape[:2], -1, -1)
            bias = bias + curves.gather(-1, index)                                 # (b, heads, n, n)
        return bias.masked_fill(~valid, 0.)


class Attention(simple_vit.Attention):
    """SimpleViT's attention plus the projected relative bias, computed from the block's input (before its norm,
    as vit-pytorch's): `forward(x, grid=(h, w))` for x (b, h * w, dim) in row-major grid order."""

    def __init__(self, dim, heads=8, dim_head=64, num_distance_basis=16, max_dist=512):
        super().__init__(dim, heads, dim_head)
        self.rel_pos_bias = RelativeProjPositionalBias(dim, heads, dim_pos=2, num_distance_basis=num_distance_basis,
                                                       max_dist=max_dist)

    def forward(self, x, *, grid):
        bias = self.rel_pos_bias(rearrange(x, 'b (h w) d -> b h w d', h=grid[0], w=grid[1]))
        out = self.attend(*self.qkv(x), mask=bias.to(x.dtype))
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class SimpleViT(simple_vit.SimpleViT):
    """`vit_pytorch.simple_vit.SimpleViT` (same arguments and methods) whose attentions add the projected relative
    position bias; `num_distance_basis` curves per axis, offsets up to `max_dist - 1` patches.

    `forward_features` returns all tokens after the final norm, (b, h * w, dim).
    `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 num_distance_basis=16, max_dist=512):
        check_arguments(**vit.arguments(locals()))
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                         attention=functools.partial(Attention, num_distance_basis=num_distance_basis,
                                                     max_dist=max_dist))

    def forward_features(self, img):
        """All tokens after the final norm: (b, h * w, dim); each attention reads the grid for its bias."""
        return self.transformer(self.embed(img), grid=self.token_grid(img.shape[-2:]))


# argument checks


def check_arguments(*, num_distance_basis, max_dist, **_):
    vit.positive_int('num_distance_basis', num_distance_basis)
    vit.positive_int('max_dist', max_dist)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's module has our parameter names and computes the same function."""
    return None
