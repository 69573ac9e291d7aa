"""CrossFormer: a vision transformer based on cross-scale attention.

"CrossFormer: A Versatile Vision Transformer Hinging on Cross-scale Attention", Wang et al.,
arXiv 2108.00154: a four-stage pyramid in which every stage opens with a **cross-scale
embedding** (CEL: several convolutions of one stride and different kernels, 4, 8, 16 and 32 for
the image, 2 and 4 between stages, their outputs concatenated along the channels, the smaller
kernels given more of them), and whose blocks alternate **short-distance attention** (SDA:
attention within G x G groups of adjacent tokens) and **long-distance attention** (LDA: groups
of tokens taken at a fixed interval, so each group spans the map), with a **dynamic position
bias** (DPB: an MLP from each relative offset within the group to a bias per head).

    import torch
    from vit_pytorch.crossformer import CrossFormer, OfficialCrossFormer, crossformer_tiny

    model = CrossFormer(num_classes=10, dim=(16, 32, 64), depth=(1, 1, 1), global_window_size=(4, 2, 1),
                        local_window_size=4, cross_embed_kernel_sizes=((2, 4, 8), (2, 4), (2, 4)),
                        cross_embed_strides=(2, 2, 2))
    logits = model(torch.randn(2, 3, 64, 64))                      # (2, 10)
    maps = model.forward_intermediates(torch.randn(2, 3, 64, 64))   # 32x32, 16x16, 8x8 maps

    official = OfficialCrossFormer(num_classes=10, dim=(16, 32, 64), depth=(1, 1, 2), interval=(4, 2, 1),
                                   local_window_size=4, cross_embed_kernel_sizes=((2, 4, 8), (2, 4), (2, 4)),
                                   cross_embed_strides=(2, 2, 2))
    paper_model = crossformer_tiny()                                # CrossFormer-T, 27,776,794 parameters

Two argument sets build the same blocks. `CrossFormer` takes vit-pytorch 1.26.14's arguments with
their meaning there: `depth` counts (SDA, LDA) pairs per stage, `global_window_size` is the side
of an LDA group whose tokens lie (map side / global_window_size) apart, so that every group
spreads over the map, and the embedding kernels are sorted; vit-pytorch's README call builds
its stages, blocks, widths, heads and kernels (28,536,624 parameters against vit-pytorch's
28,780,740: the differences below). `OfficialCrossFormer` takes the official code's: `depth`
counts blocks (CrossFormer-T's first stages have one, an SDA), and `interval` is the LDA's
distance I with groups of `local_window_size` a side, as the paper's G and I. Where the map
side is G * I (the official size, 224: maps 56, 28, 14, 7 with G = 7 and I = 8, 4, 2, 1) the two
are one function: the official LDA is `CrossFormer`'s with global_window_size G in every stage,
and vit-pytorch's default (8, 4, 2, 1) takes the official intervals as group sides. The official
configurations are `crossformer_tiny()` ... `crossformer_large()` (OfficialCrossFormer).

The function is the paper's official code's (github.com/cheerss/CrossFormer at commit 7952010,
models/crossformer.py, configurations configs/crossformer/*.yaml: read for facts and run as the
tests' reference, not copied), whose checkpoints load with
`vit_pytorch.pretrained.load_official`. Like vit-pytorch's, the model takes any image whose sides
the product of the strides divides (with `global_window_size`, also each stage's LDA group side);
the official model is built for one size (224).

As in the official code: a map whose shorter side is at most the group side G is attended as
one group of that side (SDA) in every block of `OfficialCrossFormer` and in the SDA of
`CrossFormer`; a map the groups (G, or G * interval for LDA) do not divide is zero-padded at its
bottom and right after the block's norm, the padding tokens being keys masked out by -1e6 (as
the official code's mask; -32752 in float16). The named configurations have the official
`USE_ACL: False` (no extra convolution every third block); the official options that no
configuration uses (absolute position table, conditional position encoding, progressive group
sizes of CrossFormer++) are left out, and stochastic depth is off unless `drop_path_rate` is
given (the official training used 0.1, 0.2, 0.3, 0.5 for T, S, B, L).

vit-pytorch 1.26.14's CrossFormer contradicts the paper's position bias, so its checkpoints are
refused naming it (`vit_pytorch_plan`): its DPB does not read the query-key offset (it indexes
its table of offsets -G..G with the strides of offsets -(G-1)..G-1: in a 3x3 group none of the
81 pairs reads its own offset, measured on 1.26.14). Where the official code differs from it too:
vit-pytorch's DPB gives one bias shared by all heads and is 4x wider (dim / 4, official dim / 16),
and it has no query/key/value bias and no norm after the first embedding, before the later ones
or at the end. It also silently builds layers of zero
width when a stage is narrow (no heads under 32 channels, its heads being width // 32; no
channel for a kernel when the width halved per kernel reaches 0, e.g. 4 over four kernels);
here a stage under 32 channels has one head, and a width that leaves a kernel or the
position-bias MLP (dim // 16 wide) no channel is a ValueError. Its dropout (`ff_dropout`) sits
only inside the feedforward; here also after the attention's projection, as the official
drop_rate.
"""

import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import multiscale, vit

PADDING_MASK = -1e6        # the official code's additive mask on padding keys
STAGE_ARGUMENTS = ('dim', 'depth', 'heads', 'local_window_size', 'interval', 'cross_embed_kernel_sizes',
                   'cross_embed_strides', 'mlp_mult')
VIT_PYTORCH_STAGE_ARGUMENTS = tuple('global_window_size' if name == 'interval' else name for name in STAGE_ARGUMENTS)


# classes


def kernel_widths(dim, kernels):
    """The channels of each kernel of a cross-scale embedding to `dim`: dim / 2, dim / 4, ... for all but the
    last, which takes the rest (the official code's split, where it adds up to `dim`)."""
    widths = [dim // 2 ** (i + 1) for i in range(len(kernels) - 1)]
    return [*widths, dim - sum(widths)]


class CrossScaleEmbedding(nn.Module):
    """CEL: (b, c, h, w) -> (b, h / s, w / s, dim): convolutions of stride s and the kernels given, each padded by
    (kernel - s) / 2 so that all give the same map, concatenated along the channels (the first kernel
    outermost). The image's embedding norms its output; between stages the input map is normed first."""

    def __init__(self, in_dim, dim, *, kernels, stride, norm_input):
        super().__init__()
        self.norm_input = norm_input
        self.convs = nn.ModuleList(nn.Conv2d(in_dim, width, kernel, stride=stride, padding=(kernel - stride) // 2)
                                   for kernel, width in zip(kernels, kernel_widths(dim, kernels)))
        self.norm = nn.LayerNorm(in_dim if norm_input else dim)

    def forward(self, x):
        if self.norm_input:
            x = rearrange(self.norm(rearrange(x, 'b d h w -> b h w d')), 'b h w d -> b d h w')
        x = rearrange(torch.cat([conv(x) for conv in self.convs], dim=1), 'b d h w -> b h w d')
        return x if self.norm_input else self.norm(x)


class DynamicPositionBias(nn.Sequential):
    """DPB (paper section 3.3): (..., 2) relative offsets (dy, dx) -> (..., heads) biases: a Linear to `width`,
    then three times LayerNorm, ReLU, Linear, the last to `heads`."""

    def __init__(self, width, heads):
        layers = [nn.Linear(2, width)]
        for out in (width, width, heads):
            layers += [nn.LayerNorm(width), nn.ReLU(), nn.Linear(width, out)]
        super().__init__(*layers)


class CrossScaleAttention(vit.Attention):
    """SDA (`interval=1`) or LDA: pre-norm attention within groups, (b, h * w, dim) tokens of an (h, w) map ->
    (b, h * w, dim).

    The map, zero-padded to whole spans of group_size * interval tokens, is cut into spans; within a
    span the tokens `interval` apart form a group of group_size x group_size (SDA: the span itself).
    A map whose shorter side is at most group_size is one group of that side, SDA. With `interval=None`
    (vit-pytorch's `global_window_size`) the span is the map: the tokens h / group_size rows and
    w / group_size columns apart form a group, and group_size must divide both sides. The recorded map is
    (b * groups, heads, n, n), n = group side squared, groups ordered (span row, span column, row offset,
    column offset) row-major, batch outermost.
    """

    def __init__(self, dim, heads, dropout=0., *, group_size, interval, proj_dropout=0.):
        super().__init__(dim, heads, dim // heads, dropout, qkv_bias=True,
                         to_out=nn.Sequential(nn.Linear(dim, dim), nn.Dropout(proj_dropout)))
        self.group_size, self.interval = group_size, interval
        self.position_bias = DynamicPositionBias(dim // 16, heads)

    def grouping(self, size):
        """(group side, (row interval, column interval)) on an (h, w) map."""
        if self.interval is None:
            if size[0] % self.group_size or size[1] % self.group_size:
                raise ValueError(f"a {size[0]}x{size[1]} map cannot be cut into long-distance groups of "
                                 f"{self.group_size}x{self.group_size} tokens spread over it: global_window_size "
                                 f"{self.group_size} must divide both sides")
            return self.group_size, (size[0] // self.group_size, size[1] // self.group_size)
        if min(size) <= self.group_size:
            return min(size), (1, 1)
        return self.group_size, (self.interval, self.interval)

    def relative_bias(self, group, like):
        """(heads, n, n): the DPB of each query-key offset within a group of side `group`, n = group ** 2."""
        offsets = torch.arange(1 - group, group, device=like.device)
        table = self.position_bias(torch.stack(torch.meshgrid(offsets, offsets, indexing='ij'), dim=-1).to(like.dtype))
        position = torch.arange(group, device=like.device)
        rows, cols = (rearrange(p, 'h w -> (h w)') for p in torch.meshgrid(position, position, indexing='ij'))
        bias = table[rows[:, None] - rows[None, :] + group - 1, cols[:, None] - cols[None, :] + group - 1]
        return rearrange(bias, 'i j h -> h i j')

    def mask(self, bias, size, padded, group, intervals, batch):
        """The bias, plus PADDING_MASK on padding keys where the map was padded: (1, heads, n, n) or
        (b * groups, heads, n, n). Four dimensions: with a 3-d mask `scaled_dot_product_attention` on the CPU
        leaves its fused kernel for the math one (torch 2.13, 2.14), which costs CrossFormer-T 10% at batch 1."""
        if padded == tuple(size):
            return rearrange(bias, 'h i j -> 1 h i j')
        rows = torch.arange(padded[0], device=bias.device)[:, None] >= size[0]
        cols = torch.arange(padded[1], device=bias.device)[None, :] >= size[1]
        keys = rearrange(rows | cols, '(nh gh ih) (nw gw iw) -> (nh nw ih iw) 1 1 (gh gw)', gh=group, gw=group,
                         ih=intervals[0], iw=intervals[1])
        fill = max(PADDING_MASK, torch.finfo(bias.dtype).min / 2)
        return repeat(bias.masked_fill(keys, fill), 'g h i j -> (b g) h i j', b=batch)

    def forward(self, x, size):
        group, (ih, iw) = self.grouping(size)
        padded = tuple(-(-side // (group * i)) * group * i for side, i in zip(size, (ih, iw)))
        x = rearrange(self.norm(x), 'b (h w) d -> b h w d', h=size[0])
        if padded != tuple(size):
            x = F.pad(x, (0, 0, 0, padded[1] - size[1], 0, padded[0] - size[0]))
        groups = rearrange(x, 'b (nh gh ih) (nw gw iw) d -> (b nh nw ih iw) (gh gw) d', gh=group, gw=group,
                           ih=ih, iw=iw)
        q, k, v = rearrange(self.to_qkv(groups), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=self.heads)
        mask = self.mask(self.relative_bias(group, like=q), size, padded, group, (ih, iw), x.shape[0])
        out = rearrange(self.attend(q, k, v, mask=mask), '(b nh nw ih iw) h (gh gw) d -> b (nh gh ih) (nw gw iw) (h d)',
                        nh=padded[0] // (group * ih), nw=padded[1] // (group * iw), ih=ih, iw=iw, gh=group)
        return self.to_out(rearrange(out[:, :size[0], :size[1]], 'b h w d -> b (h w) d'))


class CrossFormerBase(multiscale.StagedModel):
    """The model both argument sets build: stages of a cross-scale embedding and blocks of one attention (SDA or
    LDA, `CrossScaleAttention`) and one feedforward each, a final norm, the mean token, a head."""

    num_prefix_tokens = 0

    def build(self, stages, groups, *, num_classes, attn_dropout, ff_dropout, drop_path_rate, channels):
        """`stages`: one dict of settings per stage; `groups`: per stage, the (group side, interval) of each
        block's attention (interval None: the group spreads over the map)."""
        self.num_classes, self.channels = num_classes, channels
        self.num_features = stages[-1]['dim']
        self.global_window_sizes = [next((g for g, i in blocks if i is None), None) for blocks in groups]
        rates = multiscale.drop_path_rates(drop_path_rate, sum(map(len, groups)))
        modules, in_dim, first = [], channels, 0
        for i, (stage, blocks) in enumerate(zip(stages, groups)):
            width, layers = stage['dim'], []
            for (group, interval), rate in zip(blocks, rates[first:first + len(blocks)]):
                attention = CrossScaleAttention(width, stage['heads'], attn_dropout, proj_dropout=ff_dropout,
                                                group_size=group, interval=interval)
                feedforward = vit.FeedForward(width, width * stage['mlp_mult'], ff_dropout)
                layers.append((multiscale.DropPath(attention, rate), multiscale.DropPath(feedforward, rate)))
            first += len(blocks)
            embed = CrossScaleEmbedding(in_dim, width, kernels=stage['cross_embed_kernel_sizes'],
                                        stride=stage['cross_embed_strides'], norm_input=i > 0)
            modules.append(multiscale.MapStage(embed, multiscale.MapTransformer(layers)))
            in_dim = width
        self.stages = nn.ModuleList(modules)
        strides = torch.tensor([stage['cross_embed_strides'] for stage in stages], device='cpu').cumprod(0).tolist()
        self.feature_info = [dict(num_chs=stage['dim'], reduction=stride, module=f'stages.{i}')
                             for i, (stage, stride) in enumerate(zip(stages, strides))]

        self.norm = nn.LayerNorm(self.num_features)
        self.mlp_head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else None
        self.apply(vit.init_linear_weights)

    def check_image(self, img):
        """Refuse what is not an image batch, sides that the product of the strides does not divide, or (for
        `global_window_size`) stage maps that a stage's long-distance groups do not divide."""
        vit.check_images(img, channels=self.channels, patch_size=(1, 1), dtype=self.norm.weight.dtype)
        reduction = self.feature_info[-1]['reduction']
        height, width = img.shape[-2:]
        if height % reduction or width % reduction:
            raise ValueError(f"img height and width ({height}, {width}) must be divisible by {reduction}, the product "
                             f"of cross_embed_strides (every stage halves an even map, as in the official code), "
                             f"e.g. {max(reduction, height - height % reduction)}x"
                             f"{max(reduction, width - width % reduction)}")
        steps = [info['reduction'] * window for info, window in zip(self.feature_info, self.global_window_sizes)
                 if window is not None]
        step = math.lcm(*steps) if steps else 1
        if height % step or width % step:
            maps = [f"{height // info['reduction']}x{width // info['reduction']}" for info in self.feature_info]
            raise ValueError(f"img height and width ({height}, {width}) must be divisible by {step}: the stage maps "
                             f"({', '.join(maps)}) must be divisible by global_window_size "
                             f"{tuple(self.global_window_sizes)}, whose long-distance groups spread over the map "
                             f"(as in vit-pytorch), e.g. {max(step, height - height % step)}x"
                             f"{max(step, width - width % step)}")


class CrossFormer(CrossFormerBase):
    """CrossFormer with vit-pytorch's arguments and their meaning there, computing the paper's function (the
    official code's blocks). Each per-stage argument is one value for every stage or a tuple with one per stage
    (the tuples' common length is the number of stages, 4 when all are single values).

      dim                       each stage's width.
      depth                     each stage's number of (SDA, LDA) block pairs.
      global_window_size        each stage's LDA group side: the group's tokens lie (map side / it) apart, so
                                that each group spreads over the whole map; it must divide the stage's map.
      local_window_size         each stage's SDA group side (a map the groups do not divide is padded, as in
                                the official code).
      cross_embed_kernel_sizes  each stage's embedding kernels (a tuple per stage), sorted: the smallest gets the
                                most channels. Each kernel minus the stride must be even and not negative.
      cross_embed_strides       each stage's embedding stride.
      heads                     each stage's attention heads; None: heads of 32 channels (vit-pytorch's and every
                                official configuration's) where 32 divides the width, else one.
      mlp_mult                  each stage's feedforward width over its width (vit-pytorch's 4).
    attn_dropout (on the attention weights), ff_dropout (in the feedforward and after the attention's output
    projection, the official drop_rate), drop_path_rate (not in vit-pytorch: stochastic depth of the last block,
    growing linearly from 0), channels.
    num_classes=0 makes `forward` return the pooled embedding (b, dim[-1]); `forward_features` returns the last
    stage's tokens after the final norm, (b, h * w, dim[-1]). Recorder layout: one map per block, in stage and
    block order, (b * groups, heads, n, n) (see `CrossScaleAttention`).
    """

    def __init__(self, *, dim=(64, 128, 256, 512), depth=(2, 2, 8, 2), global_window_size=(8, 4, 2, 1),
                 local_window_size=7, cross_embed_kernel_sizes=((4, 8, 16, 32), (2, 4), (2, 4), (2, 4)),
                 cross_embed_strides=(4, 2, 2, 2), num_classes=1000, attn_dropout=0., ff_dropout=0., channels=3,
                 heads=None, mlp_mult=4, drop_path_rate=0.):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        stages = stage_settings(vit.arguments(locals()), VIT_PYTORCH_STAGE_ARGUMENTS)
        for stage in stages:
            stage['cross_embed_kernel_sizes'] = tuple(sorted(stage['cross_embed_kernel_sizes']))
        groups = [[(stage['local_window_size'], 1), (stage['global_window_size'], None)] * stage['depth']
                  for stage in stages]
        self.build(stages, groups, num_classes=num_classes, attn_dropout=attn_dropout, ff_dropout=ff_dropout,
                   drop_path_rate=drop_path_rate, channels=channels)


class OfficialCrossFormer(CrossFormerBase):
    """CrossFormer with the official code's arguments (its configurations' `crossformer_tiny()` ... are these).
    Each per-stage argument is one value for every stage or a tuple with one per stage.

      dim                       each stage's width.
      depth                     each stage's number of blocks: SDA and LDA alternating, SDA first (the
                                official DEPTHS; CrossFormer-T's first stages have one block, an SDA).
      heads                     each stage's attention heads; None: heads of 32 channels where 32 divides the
                                width, else one.
      local_window_size         the group side G of both SDA and LDA (the paper's G, official GROUP_SIZE).
      interval                  the distance I between the tokens of an LDA group (the paper's I, official
                                crs_interval); a map larger than G * I holds several groups per offset.
      cross_embed_kernel_sizes  each stage's embedding kernels (a tuple per stage); the first gets the most
                                channels. Each kernel minus the stride must be even and not negative.
      cross_embed_strides       each stage's embedding stride.
      mlp_mult                  each stage's feedforward width over its width.
    attn_dropout, ff_dropout, drop_path_rate, channels as in `CrossFormer`.
    num_classes=0 makes `forward` return the pooled embedding (b, dim[-1]); `forward_features` returns the last
    stage's tokens after the final norm, (b, h * w, dim[-1]). Recorder layout: one map per block, in stage and
    block order, (b * groups, heads, n, n) (see `CrossScaleAttention`).
    """

    def __init__(self, *, num_classes=1000, dim=(64, 128, 256, 512), depth=(1, 1, 8, 6), heads=None,
                 local_window_size=7, interval=(8, 4, 2, 1),
                 cross_embed_kernel_sizes=((4, 8, 16, 32), (2, 4), (2, 4), (2, 4)), cross_embed_strides=(4, 2, 2, 2),
                 mlp_mult=4, attn_dropout=0., ff_dropout=0., drop_path_rate=0., channels=3):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        stages = stage_settings(vit.arguments(locals()), STAGE_ARGUMENTS)
        groups = [[(stage['local_window_size'], 1 if j % 2 == 0 else stage['interval']) for j in range(stage['depth'])]
                  for stage in stages]
        self.build(stages, groups, num_classes=num_classes, attn_dropout=attn_dropout, ff_dropout=ff_dropout,
                   drop_path_rate=drop_path_rate, channels=channels)


def default_heads(width):
    """Heads of 32 channels where 32 divides the width (every official configuration's), else one head."""
    return width // 32 if isinstance(width, int) and width % 32 == 0 else 1


def stage_settings(settings, names):
    """One dict of the stage arguments `names` per stage from the constructor's arguments (single values
    repeated)."""
    lengths = {len(settings[name]) for name in names if per_stage(name, settings[name])}
    num_stages = lengths.pop() if lengths else 4
    stages = [{name: settings[name][i] if per_stage(name, settings[name]) else settings[name]
               for name in names} for i in range(num_stages)]
    for stage in stages:
        stage['heads'] = default_heads(stage['dim']) if stage['heads'] is None else stage['heads']
        stage['cross_embed_kernel_sizes'] = tuple(stage['cross_embed_kernel_sizes'])
    return stages


def per_stage(name, value):
    """Whether `value` of argument `name` holds one value per stage (kernel sizes: a tuple of tuples)."""
    if name == 'cross_embed_kernel_sizes':
        return isinstance(value, (tuple, list)) and all(isinstance(kernels, (tuple, list)) for kernels in value)
    return isinstance(value, (tuple, list))


# the official configurations (configs/crossformer/*_patch4_group7_224.yaml): name -> (width of the first stage,
# blocks, heads); widths double per stage; groups 7, intervals 8, 4, 2, 1; kernels 4, 8, 16, 32 then 2, 4
CONFIGS = {
    'tiny': (64, (1, 1, 8, 6), (2, 4, 8, 16)),
    'small': (96, (2, 2, 6, 2), (3, 6, 12, 24)),
    'base': (96, (2, 2, 18, 2), (3, 6, 12, 24)),
    'large': (128, (2, 2, 18, 2), (4, 8, 16, 32)),
}


def crossformer(variant, *, num_classes=1000, **overrides):
    """The official CrossFormer `variant` (a key of CONFIGS); keyword arguments of OfficialCrossFormer override
    the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    width, depths, heads = CONFIGS[variant]
    kwargs = dict(dim=tuple(width * 2 ** i for i in range(4)), depth=depths, heads=heads, local_window_size=7,
                  interval=(8, 4, 2, 1), cross_embed_kernel_sizes=((4, 8, 16, 32), (2, 4), (2, 4), (2, 4)),
                  cross_embed_strides=(4, 2, 2, 2), mlp_mult=4)
    return OfficialCrossFormer(**{**kwargs, 'num_classes': num_classes, **overrides})


def crossformer_tiny(**kwargs):
    return crossformer('tiny', **kwargs)


def crossformer_small(**kwargs):
    return crossformer('small', **kwargs)


def crossformer_base(**kwargs):
    return crossformer('base', **kwargs)


def crossformer_large(**kwargs):
    return crossformer('large', **kwargs)


# argument checks


def check_arguments(*, num_classes, attn_dropout, ff_dropout, drop_path_rate, channels, **stage_arguments):
    vit.non_negative_int('num_classes', num_classes)
    vit.probability('attn_dropout', attn_dropout)
    vit.probability('ff_dropout', ff_dropout)
    vit.probability('drop_path_rate', drop_path_rate)
    vit.positive_int('channels', channels)
    lengths = {name: len(value) for name, value in stage_arguments.items() if per_stage(name, value)}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"the per-stage arguments must all have one value per stage, got lengths {lengths}")
    if 0 in lengths.values():
        raise ValueError(f"the per-stage arguments must have at least one stage, got lengths {lengths}")
    kernels = stage_arguments['cross_embed_kernel_sizes']
    if not isinstance(kernels, (tuple, list)) or not kernels:
        raise TypeError(f"cross_embed_kernel_sizes must be a tuple of kernel sizes, or one such tuple per stage, "
                        f"got {kernels!r}")
    names = VIT_PYTORCH_STAGE_ARGUMENTS if 'global_window_size' in stage_arguments else STAGE_ARGUMENTS
    for i, stage in enumerate(stage_settings(stage_arguments, names)):
        check_stage(i, **stage)


def check_stage(i, *, dim, heads, cross_embed_kernel_sizes, cross_embed_strides, **sizes):
    for name, value in dict(dim=dim, heads=heads, **sizes, cross_embed_strides=cross_embed_strides).items():
        vit.positive_int(f'{name} of stage {i + 1}', value)
    if dim % heads:
        raise ValueError(f"heads {heads} of stage {i + 1} must divide its dim {dim}")
    if dim < 16:
        raise ValueError(f"dim of stage {i + 1} must be at least 16, got {dim}: the dynamic position bias MLP is "
                         f"dim // 16 wide (the official code's), and would have no channel")
    if not cross_embed_kernel_sizes:
        raise ValueError(f"cross_embed_kernel_sizes of stage {i + 1} must hold at least one kernel size")
    for kernel in cross_embed_kernel_sizes:
        vit.positive_int(f'cross_embed_kernel_sizes of stage {i + 1}', kernel)
        if kernel < cross_embed_strides or (kernel - cross_embed_strides) % 2:
            raise ValueError(f"cross_embed_kernel_sizes of stage {i + 1}: kernel {kernel} minus the stride "
                             f"{cross_embed_strides} must be even and not negative (each kernel is padded by "
                             f"(kernel - stride) / 2 so that all give the same map)")
    widths = kernel_widths(dim, cross_embed_kernel_sizes)
    if min(widths) < 1:
        raise ValueError(f"dim {dim} of stage {i + 1} is too narrow for its {len(widths)} embedding kernels: they "
                         f"would get {widths} channels (dim / 2, dim / 4, ... and the rest); give the stage at "
                         f"least {2 ** (len(widths) - 1)} channels or fewer kernels")


# loading checkpoints


ATTENTION = {'norm.': 'norm1.', 'to_qkv.': 'attn.qkv.', 'to_out.0.': 'attn.proj.',
             'position_bias.0.': 'attn.pos.pos_proj.', 'position_bias.1.': 'attn.pos.pos1.0.',
             'position_bias.3.': 'attn.pos.pos1.2.', 'position_bias.4.': 'attn.pos.pos2.0.',
             'position_bias.6.': 'attn.pos.pos2.2.', 'position_bias.7.': 'attn.pos.pos3.0.',
             'position_bias.9.': 'attn.pos.pos3.2.'}
FEEDFORWARD = {'net.0.': 'norm2.', 'net.1.': 'mlp.fc1.', 'net.4.': 'mlp.fc2.'}


def official_plan(model, keys):
    """The official CrossFormer's state_dict (cheerss/CrossFormer @ 7952010, `models/crossformer.py`), alone or
    under 'model' -> CrossFormer. A training checkpoint of its main.py also pickles its configuration object,
    which safe loading refuses: save the 'model' entry alone.

    Names differ, values do not. The official stem is `patch_embed`; each later stage's embedding (with
    the norm before it) is the previous stage's `downsample`.
    """
    extras = sorted({key.split('.')[-2] for key in keys if '.ex_conv.' in key or '.ex_ln.' in key}
                    | {key for key in keys if key.startswith('absolute_pos_embed') or '.cpe.' in key})
    if extras:
        raise ValueError(f"the checkpoint has parts no official configuration uses ({', '.join(extras)}: the extra "
                         f"convolutions of USE_ACL, an absolute position table or conditional position encoding); "
                         f"CrossFormer builds the configurations with USE_ACL False, APE False, USE_CPE False")
    names = {'norm.': 'norm.', 'mlp_head.': 'head.', 'stages.0.embed.convs.': 'patch_embed.projs.',
             'stages.0.embed.norm.': 'patch_embed.norm.'}
    for i, stage in enumerate(model.stages):
        if i > 0:
            names[f'stages.{i}.embed.convs.'] = f'layers.{i - 1}.downsample.reductions.'
            names[f'stages.{i}.embed.norm.'] = f'layers.{i - 1}.downsample.norm.'
        for j in range(len(stage.blocks.layers)):
            ours, theirs = f'stages.{i}.blocks.layers.{j}.', f'layers.{i}.blocks.{j}.'
            names.update({f'{ours}0.fn.{a}': theirs + b for a, b in ATTENTION.items()})
            names.update({f'{ours}1.fn.{a}': theirs + b for a, b in FEEDFORWARD.items()})
    plan = {}
    for key, tensor in model.state_dict().items():
        prefix = next(prefix for prefix in names if key.startswith(prefix))
        plan[key] = ({names[prefix] + key[len(prefix):]: tuple(tensor.shape)}, _same)
    return plan, ('head.',)


def _same(tensor):
    return tensor


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's CrossFormer computes another function than the paper's: its dynamic position bias does not "
        "read the offset between query and key (it indexes a table of offsets -G..G with the strides of offsets "
        "-(G-1)..G-1, so in a 3x3 group none of the 81 pairs reads its own offset); and unlike the official code's, "
        "it is one bias shared by all heads, with no query/key/value bias and no norm after the first embedding, "
        "before the later ones or at the end. CrossFormer takes vit-pytorch's arguments with their meaning there and computes the "
        "official code's function, whose checkpoints load with load_official")
