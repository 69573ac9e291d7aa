"""CrossFormer: a vision transformer based on cross-scale attention.

"CrossFormer: A Versatile Vision Transformer Hinging on Cross-scale Attention", Wang et al.,
arXiv 2108.00154: a four-stage pyramid in which every stage opens with a **cross-scale
embedding** (CEL: several convolutions of one stride and different kernels, 4, 8, 16 and 32 for
the image, 2 and 4 between stages, their outputs concatenated along the channels, the smaller
kernels given more of them), and whose blocks alternate **short-distance attention** (SDA:
attention within G x G groups of adjacent tokens) and **long-distance attention** (LDA: groups
of G x G tokens taken `interval` apart, so each group spans the map), with a **dynamic position
bias** (DPB: an MLP from each relative offset within the group to a bias per head).

    import torch
    from vit_pytorch.crossformer import CrossFormer, crossformer_tiny

    model = CrossFormer(num_classes=10, dim=(16, 32, 64), depth=(2, 2, 1), local_window_size=4,
                        interval=(4, 2, 1), cross_embed_kernel_sizes=((2, 4, 8), (2, 4), (2, 4)),
                        cross_embed_strides=(2, 2, 2))
    logits = model(torch.randn(2, 3, 64, 64))                      # (2, 10)
    maps = model.forward_intermediates(torch.randn(2, 3, 64, 64))   # 32x32, 16x16, 8x8 maps

    paper_model = crossformer_tiny()                                # CrossFormer-T, 27,776,794 parameters

The function is the paper's official code's (github.com/cheerss/CrossFormer at commit 7952010,
models/crossformer.py, configurations configs/crossformer/*.yaml: read for facts and run as the
tests' reference, not copied), whose checkpoints load with
`vit_pytorch.pretrained.load_official`. The keyword arguments are vit-pytorch's where they mean
the same (`dim`, `local_window_size`, `cross_embed_kernel_sizes`, `cross_embed_strides`,
`num_classes`, `attn_dropout`, `ff_dropout`, `channels`), with `depth` counting blocks (SDA and
LDA alternating, SDA first, as the paper's) and `interval`, `heads`, `mlp_mult` and
`drop_path_rate` added. vit-pytorch's `global_window_size` is not taken, as it means another
function: there it is the side of an LDA group (its tokens then lie map side / it apart), where
the paper's `interval` is that distance itself, the group side being `local_window_size`. Like vit-pytorch's, the model takes any image whose sides the product
of the strides divides; the official model is built for one size (224).

As in the official code: a map whose shorter side is at most the group side G is attended as
one group of that side (SDA) in every block; a map the groups (G, or G * interval for LDA) do not
divide is zero-padded at its bottom and right after the block's norm, the padding tokens being
keys masked out by -1e6 (as the official code's mask; -32752 in float16). The named
configurations have the official `USE_ACL: False` (no extra convolution every third block);
the official options that no configuration uses (absolute position table, conditional position
encoding, progressive group sizes of CrossFormer++) are left out, and stochastic depth is off
unless `drop_path_rate` is given (the official training used 0.1, 0.2, 0.3, 0.5 for T, S, B, L).

vit-pytorch 1.26.14's CrossFormer computes another function (its checkpoints are refused with
the reasons, see `vit_pytorch_plan`), and silently builds layers of zero width when a stage is
narrow (no heads under 32 channels, its heads being width // 32; no channel for a kernel when
the width halved per kernel reaches 0, e.g. 4 over four kernels); here a stage under 32 channels
has one head, and a width that leaves a kernel or the position-bias MLP (dim // 16 wide) no
channel is a ValueError.
"""

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import multiscale, vit

PADDING_MASK = -1e6        # the official code's additive mask on padding keys
STAGE_ARGUMENTS = ('dim', 'depth', 'heads', 'local_window_size', 'interval', 'cross_embed_kernel_sizes',
                   'cross_embed_strides', 'mlp_mult')


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
    A map whose shorter side is at most group_size is one group of that side, SDA. The recorded map is
    (b * groups, heads, n, n), n = group side squared, groups ordered (span row, span column, row offset,
    column offset) row-major, batch outermost.
    """

    def __init__(self, dim, heads, dropout=0., *, group_size, interval, proj_dropout=0.):
        super().__init__(dim, heads, dim // heads, dropout, qkv_bias=True,
                         to_out=nn.Sequential(nn.Linear(dim, dim), nn.Dropout(proj_dropout)))
        self.group_size, self.interval = group_size, interval
        self.position_bias = DynamicPositionBias(dim // 16, heads)

    def grouping(self, size):
        """(group side, interval) on an (h, w) map."""
        if min(size) <= self.group_size:
            return min(size), 1
        return self.group_size, self.interval

    def relative_bias(self, group, like):
        """(heads, n, n): the DPB of each query-key offset within a group of side `group`, n = group ** 2."""
        offsets = torch.arange(1 - group, group, device=like.device)
        table = self.position_bias(torch.stack(torch.meshgrid(offsets, offsets, indexing='ij'), dim=-1).to(like.dtype))
        position = torch.arange(group, device=like.device)
        rows, cols = (rearrange(p, 'h w -> (h w)') for p in torch.meshgrid(position, position, indexing='ij'))
        bias = table[rows[:, None] - rows[None, :] + group - 1, cols[:, None] - cols[None, :] + group - 1]
        return rearrange(bias, 'i j h -> h i j')

    def mask(self, bias, size, padded, group, interval, batch):
        """The bias, plus PADDING_MASK on padding keys where the map was padded: (1, heads, n, n) or
        (b * groups, heads, n, n). Four dimensions: with a 3-d mask `scaled_dot_product_attention` on the CPU
        leaves its fused kernel for the math one (torch 2.13, 2.14), which costs CrossFormer-T 10% at batch 1."""
        if padded == tuple(size):
            return rearrange(bias, 'h i j -> 1 h i j')
        rows = torch.arange(padded[0], device=bias.device)[:, None] >= size[0]
        cols = torch.arange(padded[1], device=bias.device)[None, :] >= size[1]
        keys = rearrange(rows | cols, '(nh gh ih) (nw gw iw) -> (nh nw ih iw) 1 1 (gh gw)', gh=group, gw=group,
                         ih=interval, iw=interval)
        fill = max(PADDING_MASK, torch.finfo(bias.dtype).min / 2)
        return repeat(bias.masked_fill(keys, fill), 'g h i j -> (b g) h i j', b=batch)

    def forward(self, x, size):
        group, interval = self.grouping(size)
        span = group * interval
        padded = tuple(-(-side // span) * span for side in size)
        x = rearrange(self.norm(x), 'b (h w) d -> b h w d', h=size[0])
        if padded != tuple(size):
            x = F.pad(x, (0, 0, 0, padded[1] - size[1], 0, padded[0] - size[0]))
        groups = rearrange(x, 'b (nh gh ih) (nw gw iw) d -> (b nh nw ih iw) (gh gw) d', gh=group, gw=group,
                           ih=interval, iw=interval)
        q, k, v = rearrange(self.to_qkv(groups), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=self.heads)
        mask = self.mask(self.relative_bias(group, like=q), size, padded, group, interval, x.shape[0])
        out = rearrange(self.attend(q, k, v, mask=mask), '(b nh nw ih iw) h (gh gw) d -> b (nh gh ih) (nw gw iw) (h d)',
                        nh=padded[0] // span, nw=padded[1] // span, ih=interval, iw=interval, gh=group)
        return self.to_out(rearrange(out[:, :size[0], :size[1]], 'b h w d -> b (h w) d'))


class CrossFormer(multiscale.StagedModel):
    """CrossFormer. Each per-stage argument is one value for every stage or a tuple with one per stage (the
    tuples' common length is the number of stages, 4 when all are single values).

      dim                       each stage's width.
      depth                     each stage's number of blocks: SDA and LDA alternating, SDA first.
      heads                     each stage's attention heads; None: heads of 32 channels (every official
                                configuration's) where 32 divides the width, else one.
      local_window_size         the group side G of both SDA and LDA (the paper's G, official GROUP_SIZE).
      interval                  the distance I between the tokens of an LDA group (the paper's I, official
                                crs_interval).
      cross_embed_kernel_sizes  each stage's embedding kernels (a tuple per stage); the first gets the most
                                channels. Each kernel minus the stride must be even and not negative.
      cross_embed_strides       each stage's embedding stride.
      mlp_mult                  each stage's feedforward width over its width.
    attn_dropout (on the attention weights), ff_dropout (in the feedforward and after the attention's output
    projection, the official drop_rate), drop_path_rate (stochastic depth of the last block, growing linearly
    from 0), channels. num_classes=0 makes `forward` return the pooled embedding (b, dim[-1]).

    `forward_features` returns the last stage's tokens after the final norm, (b, h * w, dim[-1]).
    Recorder layout: one map per block, in stage and block order, (b * groups, heads, n, n) (see
    `CrossScaleAttention`).
    """

    num_prefix_tokens = 0

    def __init__(self, *, num_classes=1000, dim=(64, 128, 256, 512), depth=(1, 1, 8, 6), heads=None,
                 local_window_size=7, interval=(8, 4, 2, 1),
                 cross_embed_kernel_sizes=((4, 8, 16, 32), (2, 4), (2, 4), (2, 4)), cross_embed_strides=(4, 2, 2, 2),
                 mlp_mult=4, attn_dropout=0., ff_dropout=0., drop_path_rate=0., channels=3):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        stages = stage_settings(vit.arguments(locals()))
        self.num_classes, self.channels = num_classes, channels
        self.num_features = stages[-1]['dim']

        depths = [stage['depth'] for stage in stages]
        rates = multiscale.drop_path_rates(drop_path_rate, sum(depths))
        modules, in_dim = [], channels
        for i, stage in enumerate(stages):
            width = stage['dim']
            layers = []
            for j, rate in enumerate(rates[sum(depths[:i]):sum(depths[:i + 1])]):
                attention = CrossScaleAttention(width, stage['heads'], attn_dropout, proj_dropout=ff_dropout,
                                                group_size=stage['local_window_size'],
                                                interval=1 if j % 2 == 0 else stage['interval'])
                feedforward = vit.FeedForward(width, width * stage['mlp_mult'], ff_dropout)
                layers.append((multiscale.DropPath(attention, rate), multiscale.DropPath(feedforward, rate)))
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
        """Refuse what is not an image batch, or sides that the product of the strides does not divide."""
        vit.check_images(img, channels=self.channels, patch_size=(1, 1), dtype=self.norm.weight.dtype)
        reduction = self.feature_info[-1]['reduction']
        height, width = img.shape[-2:]
        if height % reduction or width % reduction:
            raise ValueError(f"img height and width ({height}, {width}) must be divisible by {reduction}, the product "
                             f"of cross_embed_strides (every stage halves an even map, as in the official code), "
                             f"e.g. {max(reduction, height - height % reduction)}x"
                             f"{max(reduction, width - width % reduction)}")


def default_heads(width):
    """Heads of 32 channels where 32 divides the width (every official configuration's), else one head."""
    return width // 32 if isinstance(width, int) and width % 32 == 0 else 1


def stage_settings(settings):
    """One dict of STAGE_ARGUMENTS per stage from the constructor's arguments (single values repeated)."""
    lengths = {len(settings[name]) for name in STAGE_ARGUMENTS if per_stage(name, settings[name])}
    num_stages = lengths.pop() if lengths else 4
    stages = [{name: settings[name][i] if per_stage(name, settings[name]) else settings[name]
               for name in STAGE_ARGUMENTS} for i in range(num_stages)]
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
    """The official CrossFormer `variant` (a key of CONFIGS); keyword arguments of CrossFormer override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    width, depths, heads = CONFIGS[variant]
    kwargs = dict(dim=tuple(width * 2 ** i for i in range(4)), depth=depths, heads=heads, local_window_size=7,
                  interval=(8, 4, 2, 1), cross_embed_kernel_sizes=((4, 8, 16, 32), (2, 4), (2, 4), (2, 4)),
                  cross_embed_strides=(4, 2, 2, 2), mlp_mult=4)
    return CrossFormer(**{**kwargs, 'num_classes': num_classes, **overrides})


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
    for i, stage in enumerate(stage_settings(stage_arguments)):
        check_stage(i, **stage)


def check_stage(i, *, dim, depth, heads, local_window_size, interval, cross_embed_kernel_sizes, cross_embed_strides,
                mlp_mult):
    for name, value in dict(dim=dim, depth=depth, heads=heads, local_window_size=local_window_size,
                            interval=interval, cross_embed_strides=cross_embed_strides, mlp_mult=mlp_mult).items():
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
        "vit-pytorch's CrossFormer computes another function: its depth counts (short, long) attention pairs, its "
        "long-distance groups are global_window_size tokens a side spaced (map side / global_window_size) apart "
        "(the paper's are local_window_size a side, spaced interval apart), its attention has no query/key/value "
        "bias and one position bias shared by all heads, its feedforward is 1x1 convolutions after a channel "
        "LayerNorm, it has no norm after the first embedding, before the later ones or at the end, and it sorts "
        "the embedding kernels; CrossFormer (the paper's official code) alternates SDA and LDA with depth blocks "
        "per stage")
