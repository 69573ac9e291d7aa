"""RvT: a ViT with rotary positions instead of a position table.

Rotary position embeddings (RoPE; Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv
2104.09864) made axial for images, as vit-pytorch builds its "Rotary Vision Transformer": each head's queries and
keys are turned, pair of channels by pair, by angles proportional to the token's row (a quarter of the pairs) and
column (another quarter), so that a query and a key meet through the difference of their positions alone; there is
no learned position table, so any image size divisible by the patch size runs. The cls token is not turned. Two more
of vit-pytorch's choices, on by default: the queries come from a depthwise-separable convolution over the patch grid
(`use_ds_conv`, a 5 x 5 depthwise and a pointwise convolution; the cls token's through a Linear), and the MLP is
gated (`use_glu`, GEGLU).

    import torch
    from vit_pytorch.rvt import RvT

    model = RvT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16, mlp_dim=2048)
    logits = model(torch.randn(1, 3, 256, 256))   # (1, 1000)
    logits = model(torch.randn(1, 3, 224, 320))   # (1, 1000): any size divisible by the patch size

The positions run from -1 to 1 along each side of the grid (scaled by pi), the frequencies from 1 to
`image_size / 2` (vit-pytorch's max_freq); channels beyond the largest multiple of 4 of `dim_head` pass unturned.

Where it differs from vit-pytorch 1.26.14, whose checkpoints load through `load_vit_pytorch` with its outputs:
vit-pytorch takes the grid side as the square root of the token count, so only square images work; here each side
of an (h, w) grid gets its own positions. `emb_dropout` is taken and never applied there; here it drops the embedded
tokens, as in the other ViTs (0 by default: the same model). `patch_size` may be an (h, w) pair here.
"""

import math

import torch
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import vit

CONV_QUERY_KERNEL = 5       # vit-pytorch's depthwise kernel of the queries (not an argument of its RvT)


def grid_angles(rotary, grid):
    """The rotary angles (h * w, axes * f) of an (h, w) grid, row-major: the positions spread over [-pi, pi] along
    each side, times `rotary`'s frequencies."""
    device = rotary.frequencies.device
    rows, columns = (torch.linspace(-torch.pi, torch.pi, side, device=device) for side in grid)
    positions = torch.stack(torch.meshgrid(rows, columns, indexing='ij'), dim=-1)
    return rotary(rearrange(positions, 'h w axes -> (h w) axes'))


class AxialRotaryEmbedding(nn.Module):
    """vit-pytorch's `rvt.AxialRotaryEmbedding(dim, max_freq=10)`: `forward(x)`, x (..., n * n, d) the tokens of a
    square grid (no cls token), returns (sin, cos), each (1, n * n, 4 * (dim // 4)): the sine and cosine of each
    token's rotary angles (the rows' dim // 4, then the columns', frequencies from 1 to max_freq / 2), each repeated
    for the two channels of the pair it turns. RvT computes the same angles (`RvT.rotary_angles`) and turns by them
    directly; this is the module under vit-pytorch's name. Its frequencies are the buffer `rotary.frequencies`
    (2, dim // 4) (vit-pytorch's `scales` (dim // 4,), one row per axis). vit-pytorch takes the side as the integer
    square root of the token count; a count that is not a square is refused here."""

    def __init__(self, dim, max_freq=10):
        super().__init__()
        vit.positive_int('dim', dim)
        vit.finite_number('max_freq', max_freq)
        self.dim = dim
        frequencies = torch.linspace(1., max_freq / 2, dim // 4)
        self.rotary = vit.AxialRotaryEmbedding(repeat(frequencies, 'f -> axes f', axes=2))

    def forward(self, x):
        side = math.isqrt(x.shape[-2])
        if side * side != x.shape[-2]:
            raise ValueError(f"x must hold the n * n tokens of a square grid (..., n * n, d), got {x.shape[-2]} "
                             f"tokens")
        angles = repeat(grid_angles(self.rotary, (side, side)), 'n f -> 1 n (f two)', two=2)
        return angles.sin().to(x.dtype), angles.cos().to(x.dtype)


class SpatialConv(nn.Module):
    """RvT's convolutional queries, (b, 1 + h * w, dim) -> (b, 1 + h * w, inner_dim): the patch tokens on their grid
    through a depthwise `kernel` x `kernel` convolution and a pointwise one (`conv`, no biases), the cls token through
    a Linear (`cls_proj`, an identity where the widths agree)."""

    def __init__(self, dim, inner_dim, kernel):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(dim, dim, kernel, padding=kernel // 2, groups=dim, bias=False),
                                  nn.Conv2d(dim, inner_dim, 1, bias=False))
        self.cls_proj = nn.Linear(dim, inner_dim) if dim != inner_dim else nn.Identity()

    def forward(self, x, grid):
        cls_token, patches = x[:, :1], x[:, 1:]
        patches = self.conv(rearrange(patches, 'b (h w) d -> b d h w', h=grid[0], w=grid[1]))
        return torch.cat((self.cls_proj(cls_token), rearrange(patches, 'b d h w -> b (h w) d')), dim=1)


class Attention(vit.RotaryAttention):
    """RvT's attention, (b, 1 + h * w, dim) -> same: `forward(x, *, angles, grid)`; the queries from `SpatialConv`
    (`use_ds_conv`) or a Linear, keys and values from one Linear `to_kv`, q and k turned by the rotary `angles`."""

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., *, use_ds_conv=True):
        self.use_ds_conv = use_ds_conv       # read by build_projections, which vit.Attention's constructor calls
        super().__init__(dim, heads, dim_head, dropout,
                         to_out=nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(dropout)))

    def build_projections(self, dim, inner_dim, *, bias):
        self.to_q = SpatialConv(dim, inner_dim, CONV_QUERY_KERNEL) if self.use_ds_conv else \
            nn.Linear(dim, inner_dim, bias=False)
        self.to_kv = nn.Linear(dim, inner_dim * 2, bias=False)

    def qkv(self, x, grid):
        x = self.norm(x)
        q = self.to_q(x, grid) if self.use_ds_conv else self.to_q(x)
        k, v = self.to_kv(x).chunk(2, dim=-1)
        return tuple(rearrange(t, 'b n (h d) -> b h n d', h=self.heads) for t in (q, k, v))


class RvT(vit.TokenFace, vit.NormedHead, nn.Module):
    """Rotary Vision Transformer: a cls token and the patches, positions only as rotations of queries and keys.

    `forward_features` returns all tokens after the last layer, not normed (the head's LayerNorm norms the cls
    token), (b, 1 + h * w, dim); `num_classes=0` makes `forward` return the normed cls token (b, dim). Recorded
    attention maps: one (b, heads, 1 + h * w, 1 + h * w) map per layer over [cls, patches].
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 dropout=0., emb_dropout=0., use_rotary=True, use_ds_conv=True, use_glu=True):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = image_size, vit.pair(patch_size)
        self.channels, self.num_classes, self.embed_dim, self.num_features = channels, num_classes, dim, dim
        self.pool, self.num_prefix_tokens, self.use_rotary = 'cls', 1, use_rotary

        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim,
                                                     patch_norm=False)
        self.cls_token = nn.Parameter(torch.randn(1, dim))
        self.dropout = nn.Dropout(emb_dropout)
        # dim_head // 4 frequencies for the rows' pairs, the same for the columns'
        self.rotary = vit.AxialRotaryEmbedding(
            repeat(torch.linspace(1., image_size / 2, dim_head // 4), 'f -> axes f', axes=2))
        self.transformer = vit.Stack([
            (Attention(dim, heads, dim_head, dropout, use_ds_conv=use_ds_conv),
             vit.FeedForward(dim, mlp_dim, dropout, gated=use_glu))
            for _ in range(depth)
        ])
        self.to_latent = nn.Identity()
        self.mlp_head = vit.normed_head(dim, num_classes)

    def token_grid(self, image_size):
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def rotary_angles(self, grid):
        """Each token's rotary angles, (1 + h * w, 2 * (dim_head // 4)): 0 for the cls token (not turned), the patch
        in row r, column c at (r, c) of the grid spread over [-pi, pi] along each side."""
        patches = grid_angles(self.rotary, grid)
        return torch.cat((patches.new_zeros(1, patches.shape[1]), patches))

    def forward_features(self, img):
        """All tokens after the last layer: (b, 1 + h * w, dim)."""
        grid = vit.check_images(img, channels=self.channels, patch_size=self.patch_size, dtype=self.cls_token.dtype)
        x = self.to_patch_embedding(img)
        x = self.dropout(torch.cat((repeat(self.cls_token, 'n d -> b n d', b=x.shape[0]), x), dim=1))
        angles = self.rotary_angles(grid) if self.use_rotary else None
        return self.transformer(x, angles=angles, grid=grid)

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dim_head, dropout,
                    emb_dropout, use_rotary, use_ds_conv, use_glu):
    vit.positive_int('image_size', image_size)
    vit.positive_pair('patch_size', patch_size)
    for name, value in dict(dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels,
                            dim_head=dim_head).items():
        vit.positive_int(name, value)
    vit.non_negative_int('num_classes', num_classes)
    vit.probability('dropout', dropout)
    vit.probability('emb_dropout', emb_dropout)
    for name, value in dict(use_rotary=use_rotary, use_ds_conv=use_ds_conv, use_glu=use_glu).items():
        vit.boolean(name, value)


# loading checkpoints

# vit-pytorch's key -> ours
VIT_PYTORCH_KEYS = [
    (r'to_patch_embedding\.1\.', 'to_patch_embedding.2.'),
    (r'(transformer\.layers\.\d+\.0\.to_q\.conv)\.net\.', r'\1.'),
    (r'transformer\.pos_emb\.scales$', 'rotary.frequencies'),
]


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `rvt.RvT`: renamed by VIT_PYTORCH_KEYS; its cls token loses a leading axis, its frequencies
    (`scales`, one vector for both axes) gain the axis dimension of ours."""
    axes, count = model.rotary.frequencies.shape
    plan, unknown = vit.renamed_plan(model, keys, VIT_PYTORCH_KEYS, {
        'cls_token': ((1, *model.cls_token.shape), lambda t: t[0]),
        'rotary.frequencies': ((count,), lambda t: repeat(t, 'f -> axes f', axes=axes))})
    if unknown:
        raise ValueError(f"no part of this RvT takes {', '.join(unknown[:5])}: build it with the checkpoint's "
                         f"depth, use_ds_conv and use_glu")
    return plan, ('mlp_head.1.',)
