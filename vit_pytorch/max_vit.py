"""MaxViT: Multi-Axis Vision Transformer.

"MaxViT: Multi-Axis Vision Transformer", Tu et al., arXiv 2204.01697: a convolutional stem
and four stages, each a stack of MaxViT blocks. A block is an MBConv (inverted bottleneck with
squeeze-excitation), then attention inside non-overlapping local windows (block attention),
then attention across a sparse grid whose windows span the whole map (grid attention), both
with a learned relative-position bias. Every block sees the whole image at a cost linear in
its size.

    import torch
    from vit_pytorch.max_vit import MaxViT, maxvit_tiny_tf_224

    model = MaxViT(num_classes=1000, dim_conv_stem=64, dim=96, dim_head=32, depth=(2, 2, 5, 2),
                   window_size=7, mbconv_expansion_rate=4, mbconv_shrinkage_rate=0.25, dropout=0.1)
    logits = model(torch.randn(1, 3, 224, 224))   # (1, 1000); MaxViT-S, 68,927,956 parameters

    paper_model = maxvit_tiny_tf_224()            # MaxViT-T, 30,916,528 parameters

`num_register_tokens=4` gives vit-pytorch's `max_vit_with_registers`: learned tokens that
join every window (see `MaxViTBlock`).

The architecture is the official TensorFlow MaxViT's, as timm's `maxvit_*_tf_*` models hold it
(their checkpoints load with `vit_pytorch.pretrained.load_timm`): a BatchNorm and GELU inside the
stem, a pre-norm MBConv whose shortcut is average-pooled and projected when it downsamples,
TensorFlow's 'SAME' padding for strided layers (the extra row and column at the bottom and
right), a qkv bias, a (heads, 2 wh - 1, 2 ww - 1) relative-position table indexed by key minus
query, the tanh GELU, BatchNorm epsilon 1e-3, and a Linear + tanh pre-logits layer before the
classifier. vit-pytorch's MaxViT, with the same keyword arguments, builds another network
(80.0M parameters for MaxViT-S), so its checkpoints are refused with what differs. Other
image sizes work when every stage's map divides by the window, as in the reference (a clear
error otherwise); the relative-position tables depend on the window only.
"""

import math

import torch
import torch.nn.functional as F
from einops import rearrange, reduce, repeat
from torch import nn
from torch.utils.checkpoint import checkpoint

from vit_pytorch import multiscale, vit

BATCH_NORM_EPS = 1e-3       # the TensorFlow models' BatchNorm epsilon
LAYER_NORM_EPS = 1e-5

# helpers


def same_padding(size, kernel_size, stride):
    """(before, after) padding of one side by TensorFlow's 'SAME' rule: ceil(size / stride) outputs."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel_size - size, 0)
    return total // 2, total - total // 2


def pad_same(x, kernel_size, stride):
    (top, bottom), (left, right) = (same_padding(size, k, s) for size, k, s in zip(x.shape[-2:], kernel_size, stride))
    return F.pad(x, (left, right, top, bottom))


# classes


class SameConv2d(nn.Conv2d):
    """A convolution padded by TensorFlow's 'SAME' rule for the input at hand (for strided kernels)."""

    def forward(self, x):
        return super().forward(pad_same(x, self.kernel_size, self.stride))


class SamePool2d(nn.Module):
    """2x2 average pooling with stride 2, 'SAME'-padded with zeros that count in the average."""

    def forward(self, x):
        return F.avg_pool2d(pad_same(x, (2, 2), (2, 2)), 2)


class SqueezeExcitation(nn.Module):
    """Scale each channel by a gate computed from the mean of all channels (Hu et al., arXiv 1709.01507)."""

    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.squeeze = nn.Linear(dim, hidden_dim)
        self.excite = nn.Linear(hidden_dim, dim)

    def forward(self, x):
        gate = self.excite(F.silu(self.squeeze(reduce(x, 'b c h w -> b c', 'mean')))).sigmoid()
        return x * rearrange(gate, 'b c -> b c 1 1')


class MBConv(nn.Module):
    """MaxViT's pre-norm inverted bottleneck (section 3.3), (b, dim_in, h, w) -> (b, dim_out, h', w').

    BatchNorm, a 1x1 expansion to `expansion_rate * dim_out` channels, a depthwise 3x3 (stride 2
    when downsampling), squeeze-excitation to `shrinkage_rate * dim_out` channels, and a 1x1
    projection; added to the input, which is average-pooled and projected when it downsamples.
    """

    def __init__(self, dim_in, dim_out, *, downsample, expansion_rate=4, shrinkage_rate=0.25, layer_dropout=0.):
        super().__init__()
        hidden_dim = int(expansion_rate * dim_out)
        depthwise = SameConv2d(hidden_dim, hidden_dim, 3, stride=2, groups=hidden_dim, bias=False) if downsample \
            else nn.Conv2d(hidden_dim, hidden_dim, 3, padding=1, groups=hidden_dim, bias=False)
        self.net = nn.Sequential(
            nn.BatchNorm2d(dim_in, eps=BATCH_NORM_EPS),
            nn.Conv2d(dim_in, hidden_dim, 1, bias=False),
            nn.BatchNorm2d(hidden_dim, eps=BATCH_NORM_EPS),
            nn.GELU(approximate='tanh'),
            depthwise,
            nn.BatchNorm2d(hidden_dim, eps=BATCH_NORM_EPS),
            nn.GELU(approximate='tanh'),
            SqueezeExcitation(hidden_dim, int(shrinkage_rate * dim_out)),
            nn.Conv2d(hidden_dim, dim_out, 1),
        )
        if not downsample:
            self.shortcut = nn.Identity()
        elif dim_in == dim_out:
            self.shortcut = SamePool2d()
        else:
            self.shortcut = nn.Sequential(SamePool2d(), nn.Conv2d(dim_in, dim_out, 1))
        self.layer_dropout = layer_dropout

    def forward(self, x):
        return vit.drop_path(self.net(x), self.layer_dropout, self.training) + self.shortcut(x)


class WindowAttention(vit.Attention):
    """Pre-norm attention inside windows of wh x ww tokens, (windows, r + wh * ww, dim) -> same.

    Each head adds a learned bias for the offset (dy, dx) of the key from the query, one value
    per offset in a (heads, 2 wh - 1, 2 ww - 1) table (`relative_position_bias`), the official
    MaxViT's layout. The first `num_register_tokens` tokens of each window are registers: every
    pair with a register in it gets one learned bias per head (`register_bias`), as in
    vit-pytorch. dim / dim_head heads and a qkv bias, as the official model has.
    """

    def __init__(self, dim, dim_head, dropout=0., *, window_size, num_register_tokens=0):
        heads = dim // dim_head
        super().__init__(dim, heads, dim_head, dropout, qkv_bias=True, norm_eps=LAYER_NORM_EPS,
                         to_out=nn.Sequential(nn.Linear(dim, dim), nn.Dropout(dropout)))
        window_height, window_width = window_size
        self.relative_position_bias = nn.Parameter(torch.zeros(heads, 2 * window_height - 1, 2 * window_width - 1))
        nn.init.trunc_normal_(self.relative_position_bias, std=0.02)

        index = multiscale.built_on_cpu(multiscale.relative_position_index(window_size))  # (n, n) into the table
        if num_register_tokens:
            self.register_bias = nn.Parameter(torch.zeros(heads))
            registers = (2 * window_height - 1) * (2 * window_width - 1)   # the entry after the table
            index = F.pad(index, (num_register_tokens, 0, num_register_tokens, 0), value=registers)
        self.register_buffer('relative_position_index', index, persistent=False)

    def bias(self):
        """The (heads, n, n) additive bias of one window's attention logits."""
        table = rearrange(self.relative_position_bias, 'h dy dx -> h (dy dx)')
        if hasattr(self, 'register_bias'):
            table = torch.cat((table, self.register_bias[:, None]), dim=1)
        return table[:, self.relative_position_index]

    def forward(self, x):
        q, k, v = self.qkv(x)
        out = vit.attend(q, k, v, scale=self.scale, mask=self.bias().to(q.dtype), fused=self.fused,
                         dropout=self.dropout if self.training else 0., probs=self.attention_probs)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class MaxViTBlock(nn.Module):
    """MBConv, then block attention and an MLP in local windows, then grid attention and an MLP in
    dilated windows that span the map (section 3.2, Figure 2). (b, dim_in, h, w) -> (b, dim, h', w').

    Block windows are the wh x ww tiles of the map, in raster order. Grid windows are G x G
    tokens spaced h / G and w / G apart (G = window_size): cut the map into G x G tiles of
    h / G x w / G tokens, and grid window (y, x) holds the token at offset (y, x) of every tile.
    Attention and MLP are pre-norm residual branches, dropped per sample with `layer_dropout`
    while training.

    Register tokens (vit-pytorch's `max_vit_with_registers`; "Vision Transformers Need
    Registers", Darcet et al., arXiv 2309.16588): the block's `num_register_tokens` learned
    tokens go before every block window's tokens through block attention and its MLP; their
    mean over the windows of an image then goes before every grid window's tokens through grid
    attention, after which they are dropped (the grid MLP sees the map's tokens only).
    """

    def __init__(self, dim_in, dim, *, downsample, dim_head, window_size, expansion_rate, shrinkage_rate,
                 dropout, layer_dropout, num_register_tokens):
        super().__init__()
        self.window_size = window_size
        self.num_register_tokens = num_register_tokens
        self.layer_dropout = layer_dropout
        self.conv = MBConv(dim_in, dim, downsample=downsample, expansion_rate=expansion_rate,
                           shrinkage_rate=shrinkage_rate, layer_dropout=layer_dropout)
        attention = dict(window_size=window_size, num_register_tokens=num_register_tokens)
        feedforward = dict(norm_eps=LAYER_NORM_EPS, gelu_approximate='tanh')
        self.block_attn = WindowAttention(dim, dim_head, dropout, **attention)
        self.block_ff = vit.FeedForward(dim, 4 * dim, dropout, **feedforward)
        self.grid_attn = WindowAttention(dim, dim_head, dropout, **attention)
        self.grid_ff = vit.FeedForward(dim, 4 * dim, dropout, **feedforward)
        if num_register_tokens:
            self.register_tokens = nn.Parameter(torch.zeros(num_register_tokens, dim))
            nn.init.trunc_normal_(self.register_tokens, std=0.02)

    def residual(self, branch, x):
        return x + vit.drop_path(branch(x), self.layer_dropout, self.training)

    def forward(self, x):
        x = self.conv(x)
        wh, ww = self.window_size
        tiles_y, tiles_x = x.shape[-2] // wh, x.shape[-1] // ww       # block windows down and across
        r = self.num_register_tokens

        x = rearrange(x, 'b c (y wh) (x ww) -> (b y x) (wh ww) c', wh=wh, ww=ww)       # block windows
        if r:
            x = torch.cat((repeat(self.register_tokens, 'r c -> n r c', n=x.shape[0]), x), dim=1)
        x = self.residual(self.block_ff, self.residual(self.block_attn, x))
        registers, x = x[:, :r], x[:, r:]
        x = rearrange(x, '(b y x) (wh ww) c -> b (y wh) (x ww) c', y=tiles_y, x=tiles_x, wh=wh)

        x = rearrange(x, 'b (wh y) (ww x) c -> (b y x) (wh ww) c', wh=wh, ww=ww)       # grid windows
        if r:
            registers = reduce(registers, '(b n) r c -> b r c', 'mean', n=tiles_y * tiles_x)
            x = torch.cat((repeat(registers, 'b r c -> (b n) r c', n=tiles_y * tiles_x), x), dim=1)
        x = self.residual(self.grid_attn, x)[:, r:]
        x = self.residual(self.grid_ff, x)
        return rearrange(x, '(b y x) (wh ww) c -> b c (wh y) (ww x)', y=tiles_y, x=tiles_x, wh=wh)


class MaxViT(nn.Module):
    """MaxViT with vit-pytorch's keyword arguments; the official (TensorFlow) architecture.

    Stage i has width dim * 2^i, `depth[i]` blocks and dim * 2^i / dim_head heads; its first
    block halves the map. Images of any size work whose every stage map (size / 2^(i + 2),
    rounded up) divides by the window. `num_classes=0` makes `forward` return the pooled
    embedding (b, dim * 2^(stages - 1)), after the pre-logits layer, as timm does.

    Options beyond vit-pytorch's API (defaults keep its arguments' meaning):
      num_register_tokens  learned tokens per block that join every window (vit-pytorch's
                           max_vit_with_registers uses 4); 0: none.
      layer_dropout        stochastic depth: the last block's residual branches are dropped
                           with this probability while training, earlier ones linearly less.
      pre_logits           a Linear + tanh layer between the pooled, normed features and the
                           classifier, as in the official models (False: vit-pytorch's head).

    Recorder layout: every block records its block attention, then its grid attention, in
    stage order. Each map is (b * windows, heads, r + wh * ww, r + wh * ww), the first r rows
    and columns the register tokens (`num_prefix_tokens`). Block windows are the tiles of the
    map in raster order, their tokens in raster order; grid windows are numbered by their
    offset (y, x) in raster order, their tokens in raster order of the tiles (see MaxViTBlock).

    `forward_features` returns the last stage's map, (b, dim * 2^(stages - 1), h / 2^(stages + 1), w / 2^(stages +
    1)), stages = len(depth).
    """

    def __init__(self, *, num_classes, dim, depth, dim_head=32, dim_conv_stem=None, window_size=7,
                 mbconv_expansion_rate=4, mbconv_shrinkage_rate=0.25, dropout=0.1, channels=3,
                 num_register_tokens=0, layer_dropout=0., pre_logits=True):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        dim_conv_stem = dim if dim_conv_stem is None else dim_conv_stem
        self.window_size = vit.pair(window_size)
        self.channels, self.num_classes = channels, num_classes
        self.num_prefix_tokens = num_register_tokens
        dims = [dim * 2 ** i for i in range(len(depth))]

        self.conv_stem = nn.Sequential(
            SameConv2d(channels, dim_conv_stem, 3, stride=2),
            nn.BatchNorm2d(dim_conv_stem, eps=BATCH_NORM_EPS),
            nn.GELU(approximate='tanh'),
            nn.Conv2d(dim_conv_stem, dim_conv_stem, 3, padding=1),
        )

        total, rates = sum(depth), iter(range(sum(depth)))
        self.stages = nn.ModuleList()
        for stage_dim_in, stage_dim, stage_depth in zip([dim_conv_stem] + dims[:-1], dims, depth):
            self.stages.append(nn.Sequential(*[
                MaxViTBlock(stage_dim_in if i == 0 else stage_dim, stage_dim, downsample=i == 0, dim_head=dim_head,
                            window_size=self.window_size, expansion_rate=mbconv_expansion_rate,
                            shrinkage_rate=mbconv_shrinkage_rate, dropout=dropout,
                            layer_dropout=layer_dropout * next(rates) / max(total - 1, 1),
                            num_register_tokens=num_register_tokens)
                for i in range(stage_depth)
            ]))
        self.feature_info = [dict(num_chs=dim_conv_stem, reduction=2, module='conv_stem')] + [
            dict(num_chs=stage_dim, reduction=2 ** (i + 2), module=f'stages.{i}') for i, stage_dim in enumerate(dims)]

        self.norm = nn.LayerNorm(dims[-1], eps=LAYER_NORM_EPS)
        self.to_latent = nn.Sequential(nn.Linear(dims[-1], dims[-1]), nn.Tanh()) if pre_logits else nn.Identity()
        self.num_features = dims[-1]
        self.mlp_head = nn.Linear(dims[-1], num_classes) if num_classes > 0 else None
        self.grad_checkpointing = False

    def check_image_size(self, img):
        """A ValueError unless every stage's map of `img` divides by the window (block and grid attention)."""
        vit.check_images(img, channels=self.channels, patch_size=(1, 1), dtype=self.norm.weight.dtype)
        sizes, size = [], tuple(img.shape[-2:])
        for _ in range(len(self.stages) + 1):
            size = tuple(math.ceil(side / 2) for side in size)
            sizes.append(size)
        if any(side % window for size in sizes[1:] for side, window in zip(size, self.window_size)):
            step = [window * 2 ** (len(self.stages) + 1) for window in self.window_size]
            suggestion = 'x'.join(str(max(step_side, round(side / step_side) * step_side))
                                  for side, step_side in zip(img.shape[-2:], step))
            maps = ', '.join(f'{h}x{w}' for h, w in sizes[1:])
            raise ValueError(
                f"img of {img.shape[-2]}x{img.shape[-1]} gives stage maps {maps}; MaxViT's block and grid attention "
                f"need every stage map divisible by the window {self.window_size[0]}x{self.window_size[1]}: use "
                f"sides that are multiples of {step[0]}x{step[1]} (e.g. {suggestion})")

    def run_stage(self, stage, x):
        for block in stage:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x

    def forward_intermediates(self, img, indices=None):
        """The stem's and every stage's map, (b, num_chs, h / reduction, w / reduction) as in `feature_info`;
        `indices` chooses some (None: all, n: the last n, or a list of positions)."""
        chosen = vit.take_indices(indices, len(self.feature_info))
        self.check_image_size(img)
        x = self.conv_stem(img)
        maps = [x]
        for stage in self.stages[:max(chosen)]:
            x = self.run_stage(stage, x)
            maps.append(x)
        return [maps[i] for i in chosen]

    def forward_features(self, img):
        """The last stage's map, (b, dim * 2^(stages - 1), h / 2^(stages + 1), w / 2^(stages + 1))."""
        self.check_image_size(img)
        x = self.conv_stem(img)
        for stage in self.stages:
            x = self.run_stage(stage, x)
        return x

    def forward_head(self, x, pre_logits=False):
        """Average-pool the map, normalise, the pre-logits layer; then the classifier unless `pre_logits`."""
        x = self.to_latent(self.norm(reduce(x, 'b c h w -> b c', 'mean')))
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.norm.weight)

    def set_grad_checkpointing(self, enable=True):
        self.grad_checkpointing = enable


# the paper's models (Table 1, as the official TensorFlow weights and timm's maxvit_*_tf_* hold them):
# name -> (stem width, first stage width, blocks per stage); dim_head 32, window 7 at 224
CONFIGS = {
    'tiny': (64, 64, (2, 2, 5, 2)),
    'small': (64, 96, (2, 2, 5, 2)),
    'base': (64, 96, (2, 6, 14, 2)),
    'large': (128, 128, (2, 6, 14, 2)),
}


def max_vit(variant, *, num_classes=1000, **overrides):
    """The paper's MaxViT `variant` (a key of CONFIGS) for 224x224 images; keyword arguments override."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    stem, dim, depth = CONFIGS[variant]
    kwargs = dict(num_classes=num_classes, dim=dim, depth=depth, dim_head=32, dim_conv_stem=stem, window_size=7,
                  dropout=0.)
    return MaxViT(**{**kwargs, **overrides})


def maxvit_tiny_tf_224(**kwargs):
    return max_vit('tiny', **kwargs)


def maxvit_small_tf_224(**kwargs):
    return max_vit('small', **kwargs)


def maxvit_base_tf_224(**kwargs):
    return max_vit('base', **kwargs)


def maxvit_large_tf_224(**kwargs):
    return max_vit('large', **kwargs)


# argument checks


def check_arguments(*, num_classes, dim, depth, dim_head, dim_conv_stem, window_size, mbconv_expansion_rate,
                    mbconv_shrinkage_rate, dropout, channels, num_register_tokens, layer_dropout, pre_logits):
    vit.non_negative_int('num_classes', num_classes)
    for name, value in dict(dim=dim, dim_head=dim_head, channels=channels).items():
        vit.positive_int(name, value)
    if not isinstance(depth, (tuple, list)) or not depth:
        raise TypeError(f"depth must be a tuple of blocks per stage, e.g. (2, 2, 5, 2), got {depth!r}")
    for blocks in depth:
        vit.positive_int('depth', blocks)
    if dim % dim_head:
        raise ValueError(f"dim must be divisible by dim_head (each stage has width / dim_head heads), "
                         f"got dim={dim}, dim_head={dim_head}")
    if dim_conv_stem is not None:
        vit.positive_int('dim_conv_stem', dim_conv_stem)
    vit.positive_pair('window_size', window_size)
    vit.positive_float('mbconv_expansion_rate', mbconv_expansion_rate)
    vit.positive_float('mbconv_shrinkage_rate', mbconv_shrinkage_rate)
    if int(mbconv_expansion_rate * dim) < 1 or int(mbconv_shrinkage_rate * dim) < 1:
        raise ValueError(f"mbconv_expansion_rate * dim and mbconv_shrinkage_rate * dim must be at least 1 (the "
                         f"MBConv's hidden and squeeze-excitation widths), got {mbconv_expansion_rate} and "
                         f"{mbconv_shrinkage_rate} with dim={dim}")
    vit.probability('dropout', dropout)
    vit.probability('layer_dropout', layer_dropout)
    vit.non_negative_int('num_register_tokens', num_register_tokens)
    vit.boolean('pre_logits', pre_logits)


# loading checkpoints


def timm_plan(model, keys):
    """timm's `MaxxVit` of the `maxvit_*_tf_*` models (the official TensorFlow weights) -> MaxViT.

    Names differ, values do not, except the squeeze-excitation's 1x1 convolutions, Linear layers
    here (the kernel's trailing 1 x 1 dropped).
    """
    if model.num_prefix_tokens:
        raise ValueError("timm's MaxViT has no register tokens: build the model with num_register_tokens=0")
    if isinstance(model.to_latent, nn.Identity) and any(key.startswith('head.pre_logits.') for key in keys):
        raise ValueError("the checkpoint has a pre-logits layer (head.pre_logits.fc): build the model with "
                         "pre_logits=True")
    state = model.state_dict()
    names = {'conv_stem.0.': 'stem.conv1.', 'conv_stem.1.': 'stem.norm1.', 'conv_stem.3.': 'stem.conv2.',
             'norm.': 'head.norm.', 'to_latent.0.': 'head.pre_logits.fc.', 'mlp_head.': 'head.fc.'}
    conv = {'net.0.': 'pre_norm.', 'net.1.': 'conv1_1x1.', 'net.2.': 'norm1.', 'net.4.': 'conv2_kxk.',
            'net.5.': 'norm2.', 'net.7.squeeze.': 'se.fc1.', 'net.7.excite.': 'se.fc2.', 'net.8.': 'conv3_1x1.',
            'shortcut.1.': 'shortcut.expand.'}
    for s, stage in enumerate(model.stages):
        for i in range(len(stage)):
            ours, theirs = f'stages.{s}.{i}.', f'stages.{s}.blocks.{i}.'
            names.update({ours + 'conv.' + key: theirs + 'conv.' + value for key, value in conv.items()})
            for kind in ('block', 'grid'):
                attn, ff, partition = f'{ours}{kind}_attn.', f'{ours}{kind}_ff.', f'{theirs}attn_{kind}.'
                names.update({
                    attn + 'norm.': partition + 'norm1.', attn + 'to_qkv.': partition + 'attn.qkv.',
                    attn + 'relative_position_bias': partition + 'attn.rel_pos.relative_position_bias_table',
                    attn + 'to_out.0.': partition + 'attn.proj.',
                    ff + 'net.0.': partition + 'norm2.', ff + 'net.1.': partition + 'mlp.fc1.',
                    ff + 'net.4.': partition + 'mlp.fc2.',
                })
    plan = {}
    for key, tensor in state.items():
        prefix = next((prefix for prefix in names if key.startswith(prefix)), None)
        if prefix is None:
            raise ValueError(f"timm's MaxViT has no counterpart of {key}")
        theirs, shape = names[prefix] + key[len(prefix):], tuple(tensor.shape)
        if '.net.7.' in key and key.endswith('.weight'):     # squeeze-excitation: a 1x1 convolution in timm
            plan[key] = ({theirs: shape + (1, 1)}, lambda w: w[:, :, 0, 0])
        else:
            plan[key] = ({theirs: shape}, lambda t: t)
    return plan, ('head.fc.',)


def vit_pytorch_plan(model, keys):
    registers = any(key.startswith('register_tokens.') for key in keys)
    raise ValueError(
        f"vit-pytorch's {'max_vit_with_registers ' if registers else ''}MaxViT computes another function than the "
        f"official MaxViT (and this one): its stem has no BatchNorm or GELU, its MBConv has no pre-norm, pads "
        f"strided convolutions symmetrically, drops the shortcut when it downsamples and sizes the "
        f"squeeze-excitation from the expanded width, its attention has no qkv bias and a (2w - 1)^2 x heads "
        f"position table indexed by query minus key, it uses the exact GELU and BatchNorm epsilon 1e-5, and its "
        f"head has no pre-logits layer (its README's MaxViT-S has 79,981,380 parameters, the official "
        f"maxvit_small_tf_224 68,927,956)")
