"""SepViT: Separable Vision Transformer.

"SepViT: Separable Vision Transformer", Li et al., arXiv 2203.15380: a four-stage pyramid
(overlapping strided patch embeddings, CPVT's position encoding generator after each stage's first
block) whose attention is **depthwise separable self-attention**, made of two steps:
**depthwise self-attention** (DSA) within each window of the token map, each window carrying a
learned **window token** that attends with its window's tokens and so summarises it; then
**pointwise self-attention** (PSA) among the windows: queries and keys come from the window
tokens (LayerNorm, GELU, a projection), the values are whole windows, so each window's output is
a mixture of all windows, position by position. Every second block of a stage uses
**grouped self-attention**: windows twice as large (the paper's 14x14 against 7x7), so that
several adjacent windows attend as one. A window that covers the whole map is global attention
without a window token and without PSA (as the official code at SepViT-T's last stage).

    import torch
    from vit_pytorch.sep_vit import SepViT, sep_vit_tiny

    model = SepViT(num_classes=10, image_size=64, dim=16, depth=(1, 2, 2, 1), heads=(1, 2, 2, 4),
                   window_size=4, grouped_window_size=8)
    logits = model(torch.randn(2, 3, 64, 64))                      # (2, 10)
    maps = model.forward_intermediates(torch.randn(2, 3, 64, 64))   # 16x16, 8x8, 4x4, 2x2 maps

    paper_model = sep_vit_tiny()                                    # SepViT-T, 31,182,856 parameters

Source: the paper and its authors' code (github liwei109/SepViT @ 2b420d3, classification/sepvit.py,
read for facts, not copied), whose outputs the tests match through `load_official`. Its counts
are the paper's for SepViT-T (31.2M) and SepViT-S (46.6M); for SepViT-B the official code gives
82,377,064 parameters (82.4M), the paper and the repository's README say 82.3M.

As the official code: the window tokens are one learned vector per window and per block (so the
model is built for one `image_size`, which the windows must divide), the block's first norm is
applied to the window tokens too, DSA's and PSA's outputs each add their input (residuals inside
the attention, before the output projection), the head width is the stage's width over its
heads, and the windows never pad (the classification code's rule).

The keyword arguments are vit-pytorch's (`num_classes`, `dim`, the first stage's width, doubled
at each stage, `depth`, `heads`, `window_size`, `dim_head`, `ff_mult`, `channels`, `dropout`)
with `grouped_window_size`, `image_size` and `drop_path_rate` added; the defaults build SepViT-T.
vit-pytorch 1.26.14's SepViT computes another function and its checkpoints are refused with this
reason: it has no grouped self-attention (every block uses `window_size`), one window token shared
by all windows, a window token even where one window covers the map, no residuals inside the
attention, PSA queries and keys from a LayerNorm over each head's channels, no query/key/value
bias, no norm after the patch embeddings, the PEG before the first block, channel LayerNorms with a
norm ending every stage but the last, and its final LayerNorm after the pooling; here `dim_head`
(vit-pytorch's default 32, a free head width there) defaults to None and, if given, must be each
stage's width over its heads, as in the official code (the README's SepViT-Lite call, 32, is).
"""

import torch
from einops import rearrange
from torch import nn

from vit_pytorch import multiscale, vit

BLOCK_EPS = 1e-6      # the blocks' and the final LayerNorm (the patch embeddings' and the window tokens': 1e-5)
NUM_STAGES = 4


# classes


class PatchEmbedding(nn.Module):
    """(b, c, h, w) -> (b, h / stride, w / stride, dim): an overlapping convolution (kernel 2 * stride - 1,
    padding stride - 1), then a LayerNorm."""

    def __init__(self, channels, dim, stride):
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, 2 * stride - 1, stride=stride, padding=stride - 1)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(rearrange(self.proj(x), 'b d h w -> b h w d'))


class DepthwiseSelfAttention(nn.Module):
    """DSA: attention among the tokens of each window, its window token first: (b, windows, n, dim) normed tokens
    -> (b, windows, n, dim), without the output projection. The recorded map is (b * windows, heads, n, n)."""

    def __init__(self, dim, heads, dropout=0.):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.dropout = dropout
        self.fused = True
        self.to_qkv = nn.Linear(dim, dim * 3)
        self.attention_probs = nn.Identity()

    def forward(self, x):
        windows = x.shape[1]
        q, k, v = rearrange(self.to_qkv(x), 'b w n (qkv h d) -> qkv (b w) h n d', qkv=3, h=self.heads)
        out = vit.attend(q, k, v, scale=self.scale, fused=self.fused, probs=self.attention_probs,
                         dropout=self.dropout if self.training else 0.)
        return rearrange(out, '(b w) h n d -> b w n (h d)', w=windows)


class PointwiseSelfAttention(nn.Module):
    """PSA: attention among the windows, (b, windows, dim) window tokens and (b, windows, n, dim) window maps ->
    (b, windows, n, dim). Queries and keys come from the window tokens (LayerNorm, GELU, projection); each head's
    value is a whole window (its n tokens' channels of that head), so every output token mixes the tokens at the
    same place of all windows. The recorded map is (b, heads, windows, windows)."""

    def __init__(self, dim, heads, dropout=0.):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.dropout = dropout
        self.fused = True
        self.norm = nn.LayerNorm(dim)
        self.act = nn.GELU()
        self.to_qk = nn.Linear(dim, dim * 2)
        self.attention_probs = nn.Identity()

    def forward(self, tokens, maps):
        q, k = rearrange(self.to_qk(self.act(self.norm(tokens))), 'b w (qk h d) -> qk b h w d', qk=2, h=self.heads)
        v = rearrange(maps, 'b w n (h d) -> b h w (n d)', h=self.heads)
        out = vit.attend(q, k, v, scale=self.scale, fused=self.fused, probs=self.attention_probs,
                         dropout=self.dropout if self.training else 0.)
        return rearrange(out, 'b h w (n d) -> b w n (h d)', n=maps.shape[2])


class SeparableAttention(nn.Module):
    """Depthwise separable self-attention on (b, h * w, dim) tokens of an (h, w) map -> (b, h * w, dim).

    The map is cut into windows of `window_size` (row-major, no padding) and each window gets its learned window
    token; the norm, DSA with its input added, then PSA with its input added, then the output projection. A single
    window (`windows=1`) is plain global attention with its input added, with no window token and no PSA.
    """

    def __init__(self, dim, heads, dropout=0., *, window_size, windows):
        super().__init__()
        self.window_size = window_size
        self.norm = nn.LayerNorm(dim, eps=BLOCK_EPS)
        self.window_tokens = nn.Parameter(torch.zeros(windows, dim)) if windows > 1 else None
        self.dsa = DepthwiseSelfAttention(dim, heads, dropout)
        self.psa = PointwiseSelfAttention(dim, heads, dropout) if windows > 1 else None
        self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(dropout))

    def forward(self, x, size):
        side = self.window_size
        x = rearrange(x, 'b (nh wh nw ww) d -> b (nh nw) (wh ww) d', nh=size[0] // side, wh=side, ww=side)
        if self.window_tokens is not None:
            tokens = self.window_tokens.expand(x.shape[0], -1, -1)
            x = torch.cat((tokens[:, :, None], x), dim=2)                  # (b, windows, 1 + n, dim)
        x = self.norm(x)
        x = self.dsa(x) + x
        if self.psa is not None:
            maps = x[:, :, 1:]
            x = self.psa(x[:, :, 0], maps) + maps
        x = rearrange(x, 'b (nh nw) (wh ww) d -> b (nh wh nw ww) d', nh=size[0] // side, wh=side)
        return self.to_out(x)


class SepViT(multiscale.StagedModel):
    """SepViT with vit-pytorch's keyword arguments (see the module docstring).

    num_classes          classes of the head; 0 makes `forward` return the pooled embedding (b, 8 * dim).
    dim                  the first stage's width; each later stage doubles it.
    depth                the number of blocks of each of the four stages (a 4-tuple).
    heads                attention heads, an int or one per stage; each head has width / heads channels.
    window_size          the side of the windows of DSA (int or one per stage), in the even blocks (0, 2, ...).
    grouped_window_size  the side of the grouped windows of the odd blocks (1, 3, ...) (int or one per stage);
                         None: every block uses `window_size`. A window at least as large as the stage's map is
                         the whole map (global attention, no window token).
    image_size           the images the model takes (int or (h, w)): it sets the number of window tokens; every
                         stage's map must be a whole number of windows.
    dim_head             None, or width / heads of every stage (vit-pytorch's argument; there it was free).
    ff_mult              the feedforward width over the stage's width (a positive number, or one per stage);
                         the hidden width is int(width * ff_mult), as in vit-pytorch, so 2.5 is accepted.
    channels, dropout, drop_path_rate  input channels; dropout of the attention weights, after the attention
                         projection and in the feedforward; stochastic depth of the last block, growing from 0.

    `forward_features` returns the last stage's tokens after the final norm, (b, h * w, 8 * dim). Recorder
    layout: per block, in stage and block order, the DSA map (b * windows, heads, 1 + n, 1 + n) (window token
    first, windows row-major over the map, batch outermost, n = window side squared) and then, where the block
    has several windows, the PSA map (b, heads, windows, windows); a single-window block records (b, heads, h * w,
    h * w) only.

    `num_classes=0` makes `forward` return the pooled embedding (b, num_features).
    """

    num_prefix_tokens = 0

    def __init__(self, *, num_classes, dim=96, depth=(1, 2, 6, 2), heads=(3, 6, 12, 24), window_size=7,
                 grouped_window_size=14, image_size=224, dim_head=None, ff_mult=4, channels=3, dropout=0.,
                 drop_path_rate=0.):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.num_classes, self.channels = num_classes, channels
        self.image_size = vit.pair(image_size)
        self.num_features = dim * 2 ** (NUM_STAGES - 1)
        self.windows = block_windows(self.image_size, depth, per_stage(window_size), per_stage(grouped_window_size))
        heads, ff_mult = per_stage(heads), per_stage(ff_mult)

        rates = multiscale.drop_path_rates(drop_path_rate, sum(depth))
        modules, in_dim = [], channels
        for i, size in enumerate(stage_sizes(self.image_size)):
            width, stride = dim * 2 ** i, 4 if i == 0 else 2
            layers = []
            for j, rate in enumerate(rates[sum(depth[:i]):sum(depth[:i + 1])]):
                side = self.windows[i][j]
                attention = SeparableAttention(width, heads[i], dropout, window_size=side,
                                               windows=(size[0] // side) * (size[1] // side))
                feedforward = vit.FeedForward(width, int(width * ff_mult[i]), dropout, norm_eps=BLOCK_EPS)
                layers.append((multiscale.DropPath(attention, rate), multiscale.DropPath(feedforward, rate)))
                if j == 0:
                    layers.append((multiscale.PositionEncodingGenerator(width),))
            modules.append(multiscale.MapStage(PatchEmbedding(in_dim, width, stride), multiscale.MapTransformer(layers)))
            in_dim = width
        self.stages = nn.ModuleList(modules)
        self.feature_info = [dict(num_chs=dim * 2 ** i, reduction=4 * 2 ** i, module=f'stages.{i}')
                             for i in range(NUM_STAGES)]

        self.norm = nn.LayerNorm(self.num_features, eps=BLOCK_EPS)
        self.mlp_head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else None
        self.apply(multiscale.init_conv_weights)

    def check_image(self, img):
        """Refuse what is not an image batch of the model's image_size."""
        vit.check_images(img, channels=self.channels, patch_size=(1, 1), dtype=self.norm.weight.dtype)
        size = tuple(img.shape[-2:])
        if size != self.image_size:
            raise ValueError(f"img must be {self.image_size[0]}x{self.image_size[1]} (h x w), the model's "
                             f"image_size (its window tokens are one per window), got {size[0]}x{size[1]}")


def per_stage(value):
    """An int (or None) for every stage, or the per-stage tuple itself."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * NUM_STAGES


def stage_sizes(image_size):
    """The (h, w) map of each stage: each patch embedding's convolution (kernel 2s - 1, stride s, padding s - 1)
    leaves ceil(side / s) of a side."""
    sizes, size = [], tuple(image_size)
    for i in range(NUM_STAGES):
        stride = 4 if i == 0 else 2
        size = tuple(vit.conv_output_size(side, 2 * stride - 1, stride, stride - 1) for side in size)
        sizes.append(size)
    return sizes


def block_windows(image_size, depth, window_sizes, grouped_sizes):
    """The window side of every block, per stage: `window_size` in even blocks, `grouped_window_size` in odd ones;
    on a square map, a window larger than the map is the map."""
    windows = []
    for size, stage_depth, window, grouped in zip(stage_sizes(image_size), depth, window_sizes, grouped_sizes):
        sides = [window if j % 2 == 0 or grouped is None else grouped for j in range(stage_depth)]
        windows.append([min(side, size[0]) if size[0] == size[1] else side for side in sides])
    return windows


# the paper's models (SepViT Table 1, the official SepViT_Tiny/Small/Base): name -> (dim, depth, heads)
# windows 7, grouped windows 14, MLP ratio 4 everywhere
CONFIGS = {
    'tiny': (96, (1, 2, 6, 2), (3, 6, 12, 24)),
    'small': (96, (1, 2, 14, 2), (3, 6, 12, 24)),
    'base': (128, (1, 2, 14, 2), (4, 8, 16, 32)),
}


def sep_vit(variant, *, num_classes=1000, **overrides):
    """The paper's SepViT `variant` (a key of CONFIGS); keyword arguments of SepViT override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, depth, heads = CONFIGS[variant]
    return SepViT(**{**dict(dim=dim, depth=depth, heads=heads), 'num_classes': num_classes, **overrides})


def sep_vit_tiny(**kwargs):
    return sep_vit('tiny', **kwargs)


def sep_vit_small(**kwargs):
    return sep_vit('small', **kwargs)


def sep_vit_base(**kwargs):
    return sep_vit('base', **kwargs)


# argument checks


def check_arguments(*, num_classes, dim, depth, heads, window_size, grouped_window_size, image_size, dim_head,
                    ff_mult, channels, dropout, drop_path_rate):
    vit.non_negative_int('num_classes', num_classes)
    vit.positive_int('dim', dim)
    if not isinstance(depth, (tuple, list)) or len(depth) != NUM_STAGES:
        raise TypeError(f"depth must be a tuple of {NUM_STAGES} block counts, one per stage, got {depth!r}")
    for value in depth:
        vit.positive_int('depth', value)
    for name, value in dict(heads=heads, window_size=window_size, ff_mult=ff_mult,
                            grouped_window_size=grouped_window_size).items():
        if isinstance(value, (tuple, list)) and len(value) != NUM_STAGES:
            raise ValueError(f"{name} must be an int or {NUM_STAGES} values, one per stage, got {tuple(value)!r}")
        for item in per_stage(value):
            if name == 'ff_mult':
                vit.positive_float(name, item)      # a width ratio: vit-pytorch takes int(width * ff_mult)
            elif not (name == 'grouped_window_size' and item is None):
                vit.positive_int(name, item)
    image_size = vit.positive_pair('image_size', image_size)
    vit.positive_int('channels', channels)
    vit.probability('dropout', dropout)
    vit.probability('drop_path_rate', drop_path_rate)
    for i, (stage_heads, stage_ff_mult) in enumerate(zip(per_stage(heads), per_stage(ff_mult))):
        width = dim * 2 ** i
        if int(width * stage_ff_mult) < 1:
            raise ValueError(f"ff_mult {stage_ff_mult} of stage {i + 1} leaves no hidden unit: the feedforward width "
                             f"is int({width} * ff_mult), which must be at least 1")
        if width % stage_heads:
            raise ValueError(f"heads {stage_heads} of stage {i + 1} must divide its width {width} (dim * {2 ** i})")
        if dim_head is not None and vit.positive_int('dim_head', dim_head) != width // stage_heads:
            raise ValueError(f"dim_head must be None or each stage's width over its heads (the official code's head "
                             f"width), got {dim_head}, but stage {i + 1} has {width} channels and {stage_heads} "
                             f"heads ({width // stage_heads} a head)")
    windows = block_windows(image_size, depth, per_stage(window_size), per_stage(grouped_window_size))
    for i, (size, sides) in enumerate(zip(stage_sizes(image_size), windows)):
        for j, side in enumerate(sides):
            if size[0] % side or size[1] % side:
                name = 'window_size' if j % 2 == 0 or per_stage(grouped_window_size)[i] is None \
                    else 'grouped_window_size'
                raise ValueError(f"{name} {side} must divide the {size[0]}x{size[1]} map of stage {i + 1} (at "
                                 f"image_size {image_size[0]}x{image_size[1]}), or, on a square map, be at least its "
                                 f"side; windows are not padded")


# loading checkpoints


def official_plan(model, keys):
    """The official code's SepViT (liwei109/SepViT, classification/sepvit.py) -> SepViT.

    Names differ, values do not, except the window tokens, (1, windows, 1, dim) there. The official
    code keeps the patch embeddings, blocks and PEGs of all stages in three lists (`patch_embeds.i`,
    `blocks.i.j`, `pos_block.i`); here each stage holds its own, the PEG as a layer after the first block.
    """
    names = {'norm.': 'norm.', 'mlp_head.': 'head.'}
    window_tokens = {}
    for i, stage in enumerate(model.stages):
        names[f'stages.{i}.embed.'] = f'patch_embeds.{i}.'
        block = 0
        for index, layer in enumerate(stage.blocks.layers):
            ours = f'stages.{i}.blocks.layers.{index}.'
            if isinstance(layer[0], multiscale.PositionEncodingGenerator):
                names[ours + '0.proj.'] = f'pos_block.{i}.proj.0.'
                continue
            theirs = f'blocks.{i}.{block}.'
            has_tokens, holds_tokens = f'{theirs}win_tokens' in keys, layer[0].fn.window_tokens is not None
            if has_tokens != holds_tokens and f'{theirs}norm1.weight' in keys:
                raise ValueError(f"the checkpoint's block {i}.{block} has {'' if has_tokens else 'no '}window tokens "
                                 f"(several windows), the model's has {'' if holds_tokens else 'none'}: build the "
                                 f"model at the checkpoint's image_size and window sizes (224, 7 and 14 officially)")
            names.update({ours + a: theirs + b for a, b in {
                '0.fn.norm.': 'norm1.', '0.fn.dsa.to_qkv.': 'attn.DSA_qkv.', '0.fn.psa.norm.': 'attn.win_tokens_norm.',
                '0.fn.psa.to_qk.': 'attn.PSA_qk.', '0.fn.to_out.0.': 'attn.proj.', '1.fn.net.0.': 'norm2.',
                '1.fn.net.1.': 'mlp.fc1.', '1.fn.net.4.': 'mlp.fc2.'}.items()})
            window_tokens[ours + '0.fn.window_tokens'] = theirs + 'win_tokens'
            block += 1
    state = model.state_dict()
    plan = {key: ({theirs: (1, state[key].shape[0], 1, state[key].shape[1])}, _window_tokens)
            for key, theirs in window_tokens.items() if key in state}
    vit.prefixed_plan(state, names, "the official SepViT", plan)
    return plan, ('head.',)


def _window_tokens(tensor):
    return rearrange(tensor, '1 w 1 d -> w d')


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's SepViT computes another function: it has no grouped self-attention (every block uses "
        "window_size), one window token shared by all windows and a window token even where one window covers the "
        "map, no residuals inside the attention, PSA queries and keys from a LayerNorm over each head's channels, "
        "no query/key/value bias, no norm after the patch embeddings, the PEG before the first block, channel "
        "LayerNorms with a norm ending every stage but the last, and its final LayerNorm after the pooling; SepViT is "
        "the paper's (its official code's)")
