"""The blocks that multi-scale models share: windows, stages, spatial reduction, position generators.

Swin, Twins, PVT v2, NesT, CrossFormer, ScalableViT, SepViT, MaxViT and RegionViT are built from these on
top of `vit.py`, which never imports this file. A multi-scale model copied out of the package needs
vit.py, this file and its own file.

It reads top to bottom: the tables and schedules (relative positions, drop-path rates, initialisation),
the shifted windows, the residual branches of a map's tokens, then the stages and their face.
"""

import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from vit_pytorch.vit import Stack, attend, drop_path, init_linear_weights, non_negative_int, take_indices, zero_linear


def relative_position_index(window):
    """(n, n), n = wh * ww: for query i and key j of an (wh, ww) window (row-major), the index of their offset
    (key minus query, rows then columns) in a flattened ((2 wh - 1), (2 ww - 1)) table."""
    height, width = window
    rows, cols = torch.meshgrid(torch.arange(height, device='cpu'), torch.arange(width, device='cpu'), indexing='ij')
    coords = rearrange(torch.stack((rows, cols)), 'two h w -> two (h w)')
    offsets = coords[:, None, :] - coords[:, :, None]                  # (2, query, key): key minus query
    return (offsets[0] + height - 1) * (2 * width - 1) + offsets[1] + width - 1


def drop_path_rates(drop_path_rate, count):
    """Stochastic depth rising linearly from 0 at the first block to `drop_path_rate` at the last of `count`
    (Swin, section 4.1; every model here follows it)."""
    return torch.linspace(0, drop_path_rate, count, device='cpu').tolist()


def init_conv_weights(module):
    """The PVT papers' initialisation (their code, and timm's): truncated normal (std 0.02) Linear weights, zero
    biases; convolutions normal with std sqrt(2 / fan_out), fan_out counted per group."""
    if isinstance(module, nn.Conv2d):
        fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels // module.groups
        nn.init.normal_(module.weight, 0, math.sqrt(2.0 / fan_out))
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    else:
        init_linear_weights(module)


# windows (Swin, Twins): cut a (b, h, w, c) map into (shifted) windows and put it back

WINDOW_MASK = -100.  # Swin's additive mask between tokens the cyclic shift brought together


def padded_size(size, window):
    """The map size rounded up to whole windows."""
    return tuple(math.ceil(side / length) * length for side, length in zip(size, window))


def built_on_cpu(tensor):
    """A table computed on the CPU, moved to the device models are being built on (meta tensors would need
    torch's reference decompositions, slow to import, to compute it there)."""
    return tensor.to(torch.get_default_device())


def shifted_window_mask(size, window, shift, *, device=None, dtype=torch.float32):
    """(windows, n, n) additive mask of shifted windows on a padded (h, w) map: WINDOW_MASK between tokens of
    different regions, 0 within one.

    Along each axis the last window's span [L - window, L) is split at L - shift: the cyclic
    shift moved the image's first rows there, next to its last ones (the reference's regions).
    """
    bands = []
    for length, length_window, length_shift in zip(size, window, shift):
        position = torch.arange(length, device=device)
        bands.append((position >= length - length_window).long() + (position >= length - length_shift).long())
    region = bands[0][:, None] * 3 + bands[1][None, :]
    region = rearrange(region, '(nh wh) (nw ww) -> (nh nw) (wh ww)', wh=window[0], ww=window[1])
    apart = region[:, :, None] != region[:, None, :]
    return torch.zeros(apart.shape, device=device, dtype=dtype).masked_fill(apart, WINDOW_MASK)


class ShiftedWindows(nn.Module):
    """Cuts a (b, h, w, c) map into windows and puts them back; holds the mask of its shifted windows.

    `split` rolls the map by -shift (when shifted), zero-pads it at the bottom and right to whole
    windows and returns (b * windows, wh * ww, c), windows in row-major order, batch outermost;
    `merge` undoes all three. The mask for the map size the model was built for is kept; other
    sizes (dynamic image size) get theirs computed.
    """

    def __init__(self, window_size, shift_size, feature_size):
        super().__init__()
        self.window_size, self.shift_size = tuple(window_size), tuple(shift_size)
        self.shifted = any(self.shift_size)
        self.padded = padded_size(feature_size, self.window_size)
        mask = built_on_cpu(shifted_window_mask(self.padded, self.window_size, self.shift_size, device='cpu')) \
            if self.shifted else None
        self.register_buffer('mask', mask, persistent=False)

    def split(self, x):
        """(b, h, w, c) -> (b * windows, wh * ww, c)."""
        height, width = x.shape[1:3]
        if self.shifted:
            x = torch.roll(x, shifts=(-self.shift_size[0], -self.shift_size[1]), dims=(1, 2))
        padded_height, padded_width = padded_size((height, width), self.window_size)
        x = F.pad(x, (0, 0, 0, padded_width - width, 0, padded_height - height))
        return rearrange(x, 'b (nh wh) (nw ww) c -> (b nh nw) (wh ww) c', wh=self.window_size[0],
                         ww=self.window_size[1])

    def merge(self, windows, size):
        """(b * windows, wh * ww, c) -> (b, h, w, c) for the map `size` (h, w) that `split` cut."""
        padded_height, padded_width = padded_size(size, self.window_size)
        window_height, window_width = self.window_size
        x = rearrange(windows, '(b nh nw) (wh ww) c -> b (nh wh) (nw ww) c', nh=padded_height // window_height,
                      nw=padded_width // window_width, wh=window_height)
        x = x[:, :size[0], :size[1]]
        return torch.roll(x, shifts=self.shift_size, dims=(1, 2)) if self.shifted else x

    def token_positions(self, size):
        """(windows, wh * ww): the row-major index on the unshifted (h, w) map of each window's tokens
        (h * w for padding), in the order of `split`."""
        count = size[0] * size[1]
        # each token carries its index + 1 through the shift and the windows; the padding carries 0
        numbered = rearrange(torch.arange(1, count + 1, device='cpu'), '(h w) -> 1 h w 1', h=size[0], w=size[1])
        positions = self.split(numbered)[..., 0] - 1                   # (windows, n)
        return positions.masked_fill(positions < 0, count)

    def attention_mask(self, bias, batch, size):
        """bias (heads, n, n) plus, in a shifted block, the window mask: (b * windows, heads, n, n)."""
        if not self.shifted:
            return bias
        padded = padded_size(size, self.window_size)
        mask = self.mask if padded == self.padded else \
            shifted_window_mask(padded, self.window_size, self.shift_size, device=bias.device, dtype=bias.dtype)
        return repeat(bias + mask[:, None], 'w h i j -> (b w) h i j', b=batch)


# blocks of multi-scale models (Swin, PVT v2, Twins, NesT, CrossFormer, ScalableViT, SepViT)


class DropPath(nn.Module):
    """A residual branch `fn(x, *args)` (args: e.g. the map's size) with stochastic depth: dropped for a random
    subset of the samples in training."""

    def __init__(self, fn, p=0.):
        super().__init__()
        self.fn = fn
        self.p = p

    def forward(self, x, *args):
        return drop_path(self.fn(x, *args), self.p, self.training)


class SpatialReductionAttention(nn.Module):
    """Pre-norm attention of every token to a reduced map: (b, h * w, dim) tokens of an (h, w) map ->
    (b, h * w, dim).

    Queries come from every token; keys and values from the normed map shrunk by a convolution of
    kernel and stride `sr_ratio` and a LayerNorm (PVT, section 3.3), or, with `linear=True`,
    average-pooled to 7x7, a 1x1 convolution, a LayerNorm and a GELU (PVT v2, section 3.1);
    `sr_ratio=1` without `linear` attends to the map itself. The recorded map is (b, heads, h * w,
    m), m the number of reduced tokens.
    """

    def __init__(self, dim, heads, dropout=0., *, sr_ratio=1, linear=False, qkv_bias=True, proj_dropout=0.,
                 norm_eps=1e-6):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.dropout = dropout
        self.fused = True

        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.to_q = nn.Linear(dim, dim, bias=qkv_bias)
        self.to_kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        if linear:
            self.reduce = nn.Sequential(nn.AdaptiveAvgPool2d(7), nn.Conv2d(dim, dim, 1))
        elif sr_ratio > 1:
            self.reduce = nn.Conv2d(dim, dim, sr_ratio, stride=sr_ratio)
        else:
            self.reduce = None
        self.reduce_norm = None if self.reduce is None else nn.LayerNorm(dim)
        self.reduce_act = nn.GELU() if linear else nn.Identity()
        self.attention_probs = nn.Identity()
        self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(proj_dropout))

    def keys_from(self, x, size):
        """The tokens keys and values are made of: the normed tokens, or their reduced map (b, m, dim)."""
        if self.reduce is None:
            return x
        reduced = self.reduce(rearrange(x, 'b (h w) d -> b d h w', h=size[0], w=size[1]))
        return self.reduce_act(self.reduce_norm(rearrange(reduced, 'b d h w -> b (h w) d')))

    def forward(self, x, size):
        x = self.norm(x)
        q = rearrange(self.to_q(x), 'b n (h d) -> b h n d', h=self.heads)
        k, v = rearrange(self.to_kv(self.keys_from(x, size)), 'b m (kv h d) -> kv b h m d', kv=2, h=self.heads)
        out = attend(q, k, v, scale=self.scale, fused=self.fused, probs=self.attention_probs,
                     dropout=self.dropout if self.training else 0.)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class PositionEncodingGenerator(nn.Module):
    """CPVT's PEG (arXiv 2102.10882): a depthwise convolution of the token map, (b, h * w, dim) -> (b, h * w, dim);
    the layer adds it to the tokens, so positions come from the zero padding at the borders (Twins, ScalableViT,
    SepViT)."""

    def __init__(self, dim, kernel_size=3):
        super().__init__()
        self.proj = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)

    def forward(self, x, size):
        x = self.proj(rearrange(x, 'b (h w) d -> b d h w', h=size[0], w=size[1]))
        return rearrange(x, 'b d h w -> b (h w) d')


class MapTransformer(Stack):
    """`Stack` whose first residual branch in a layer (an attention, or a PEG) also reads the (h, w) map the
    tokens lie on (keyword `size`)."""

    @staticmethod
    def layer(branches, x, *, size):
        attention, *rest = branches
        x = attention(x, size) + x
        for branch in rest:
            x = branch(x) + x
        return x


class MapStage(nn.Module):
    """A stage of a multi-scale model: its patch embedding ((b, c, h, w) -> (b, h', w', dim)), then its blocks (a
    `MapTransformer`): (b, c, h, w) -> tokens (b, h' * w', dim) and their map's (h', w')."""

    def __init__(self, embed, blocks):
        super().__init__()
        self.embed = embed
        self.blocks = blocks

    def forward(self, x):
        x = self.embed(x)                                            # (b, h, w, dim)
        size = tuple(x.shape[1:3])
        return self.blocks(rearrange(x, 'b h w d -> b (h w) d'), size=size), size


class StagedModel(nn.Module):
    """The face of a multi-scale model made of `MapStage`s, each run on the previous one's map, then a final norm
    and the average of the last stage's tokens (Twins, CrossFormer, ScalableViT, SepViT).

    A subclass builds `self.stages` (stages returning (tokens, (h, w))), `self.norm`, `self.mlp_head` (None
    without classes), `self.num_features`, `self.num_classes`, and `check_image(img)`.
    """

    def stage_outputs(self, img, last):
        """Tokens and map size of stages 0..last, each stage run on the previous one's map."""
        self.check_image(img)
        x, outputs = img, []
        for stage in self.stages[:last + 1]:
            tokens, size = stage(x)
            outputs.append((tokens, size))
            x = rearrange(tokens, 'b (h w) d -> b d h w', h=size[0])
        return outputs

    def forward_features(self, img):
        """The last stage's tokens after the final norm: (b, h * w, num_features)."""
        tokens, _ = self.stage_outputs(img, len(self.stages) - 1)[-1]
        return self.norm(tokens)

    def forward_head(self, x, pre_logits=False):
        """Average the tokens; return the pooled embedding (b, num_features), or the logits."""
        x = x.mean(dim=1)
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def forward_intermediates(self, img, indices=None):
        """Each chosen stage's output map (b, c, h, w), before the final norm: indices None for every stage, an int n
        for the last n, or a list of stage numbers (0-based)."""
        chosen = take_indices(indices, len(self.stages))
        outputs = self.stage_outputs(img, max(chosen))
        return [rearrange(outputs[i][0], 'b (h w) d -> b d h w', h=outputs[i][1][0]) for i in chosen]

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        non_negative_int('num_classes', num_classes)
        self.num_classes = num_classes
        self.mlp_head = zero_linear(self.num_features, num_classes, like=self.norm.weight) if num_classes > 0 else None

    def set_grad_checkpointing(self, enable=True):
        for stage in self.stages:
            stage.blocks.grad_checkpointing = enable
