"""RegionViT: regional-to-local attention.

"RegionViT: Regional-to-Local Attention for Vision Transformers", Chen, Panda and Fan,
arXiv 2106.02689: two token maps of one image, **local tokens** (patches of 4 pixels) and
**regional tokens** (patches of 28 pixels: one per window of 7x7 local tokens). Each block
runs **regional self-attention** (every regional token attends to every other of the image),
then **regional-to-local attention**: in each window, the regional token and its 49 local
tokens attend to one another (with a learned relative position bias between local tokens), so
that global information reaches the local tokens through their regional token. The same
attention weights serve both steps (each has its own LayerNorm). Four stages; between them a
LayerNorm, a GELU and a 3x3 depthwise convolution of stride 2 (one, shared by both maps) halve
both maps and widen them; the classifier averages the last stage's regional tokens.

    import torch
    from vit_pytorch.regionvit import RegionViT, regionvit_tiny

    model = RegionViT(dim=(16, 32), depth=(1, 1), window_size=2, local_patch_size=4, num_classes=10,
                      dim_head=8)
    logits = model(torch.randn(2, 3, 32, 32))                      # (2, 10)
    maps = model.forward_intermediates(torch.randn(2, 3, 32, 32))   # local tokens: (2, 16, 8, 8), (2, 32, 4, 4)

    paper_model = regionvit_tiny()                                  # RegionViT-Ti, 13,842,676 parameters

The function is the official code's (IBM/RegionViT at commit 77000c2, `regionvit/regionvit.py`;
read, never copied), whose checkpoints load with `vit_pytorch.pretrained.load_official`;
`regionvit_tiny`, `regionvit_small`, `regionvit_medium` and `regionvit_base` are its
`regionvit_{tiny,small,medium,base}_224`. Images of any size divisible by `local_patch_size`
run: where the local map does not fill whole windows (sizes that are not multiples of
local_patch_size * window_size * 2 ** (stages - 1), 224 for the named models), it is padded at
the bottom and right and the padding is never attended to. The official code masks it too, but
its mask of the bottom-right window lets that window's tokens see part of the padding, so at
such sizes the two differ in that window (tested: equal once its mask is corrected). Left out:
the official `peg` option (a depthwise convolution after each stage's first block, used only by
its `_w14_peg` models) and its detection norms (`det_norm`).

The keyword arguments are vit-pytorch's (1.26.14), which builds another function (its
checkpoints are refused with the reason): `dim` (each stage's width, an int for four equal
stages), `depth`, `window_size`, `local_patch_size`, `tokenize_local_3_conv` (the
official Ti and S stem of three 3x3 convolutions; else one 8x8 convolution of stride 4, as M
and B), `attn_dropout` (on the attention weights and after the output projection), `ff_dropout`,
`channels`. The defaults are vit-pytorch's: RegionViT-Ti's widths and depths with the single
convolution stem (the official M and B stem); `regionvit_tiny()` is RegionViT-Ti, three convolutions. vit-pytorch's `use_peg` is accepted only as False (see above). Beyond it:
`dim_head` (each stage has width / dim_head heads; 32 in every official model), `mlp_mult`,
`drop_path_rate`.
"""

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import multiscale, vit

NORM_EPS = 1e-6           # the blocks' and the final LayerNorm (the stem's and downsampling's: 1e-5)

# helpers


def per_stage(value, stages):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * stages


# classes


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of a (b, c, h, w) map."""

    def forward(self, x):
        return rearrange(super().forward(rearrange(x, 'b c h w -> b h w c')), 'b h w c -> b c h w')


def local_encoder(channels, dim, *, patch_size, three_convs):
    """The local tokens' stem, (b, channels, h, w) -> (b, dim, h / patch_size, w / patch_size): three 3x3
    convolutions (strides 2, 2, 1; widths dim / 4, dim / 2, dim) with LayerNorms and GELUs between them, or
    one convolution of kernel 2 * patch_size, stride patch_size."""
    if not three_convs:
        return nn.Conv2d(channels, dim, 2 * patch_size, stride=patch_size, padding=patch_size - 1)
    return nn.Sequential(
        nn.Conv2d(channels, dim // 4, 3, stride=2, padding=1), ChannelNorm(dim // 4), nn.GELU(),
        nn.Conv2d(dim // 4, dim // 2, 3, stride=2, padding=1), ChannelNorm(dim // 2), nn.GELU(),
        nn.Conv2d(dim // 2, dim, 3, padding=1),
    )


class RegionEncoder(nn.Conv2d):
    """The regional tokens, (b, channels, h, w) -> (b, dim, ceil(h / p), ceil(w / p)): patches of p = local
    patch size * window size, each embedded by a convolution of that kernel and stride; an image that p does
    not divide is zero-padded around (half each side, the extra row or column at the bottom and right)."""

    def forward(self, img):
        height, width = img.shape[-2:]
        patch = self.kernel_size[0]
        extra_height, extra_width = -height % patch, -width % patch
        if extra_height or extra_width:
            img = F.pad(img, (extra_width // 2, extra_width - extra_width // 2,
                              extra_height // 2, extra_height - extra_height // 2))
        return super().forward(img)


class RegionToLocalAttention(vit.Attention):
    """The attention of a RegionViT block, its weights used twice (section 3.2).

    `among_regions(regions)`: regional self-attention, (b, r, dim) -> (b, r, dim), every regional token
    of an image attending to all of them, after its own LayerNorm (`region_norm`).
    `forward(x, mask=None)`: regional-to-local attention, (b * r, 1 + window ** 2, dim) -> same: in each
    window the regional token (first) and its local tokens (row-major) attend to one another, with a
    learned bias per head and offset between local tokens (none to or from the regional token); `mask`
    (b * r, 1, 1, 1 + window ** 2) adds -inf at padded local tokens.
    """

    def __init__(self, dim, heads, dropout=0., *, window_size):
        super().__init__(dim, heads, dim // heads, dropout, qkv_bias=True, norm_eps=NORM_EPS,
                         to_out=nn.Sequential(nn.Linear(dim, dim), nn.Dropout(dropout)))
        self.region_norm = nn.LayerNorm(dim, eps=NORM_EPS)
        self.relative_position_bias = nn.Parameter(torch.zeros(heads, 2 * window_size - 1, 2 * window_size - 1))
        nn.init.trunc_normal_(self.relative_position_bias, std=0.02)
        index = multiscale.built_on_cpu(multiscale.relative_position_index((window_size, window_size)))
        self.register_buffer('relative_position_index', index, persistent=False)

    def among_regions(self, regions):
        q, k, v = rearrange(self.to_qkv(self.region_norm(regions)), 'b n (qkv h d) -> qkv b h n d', qkv=3,
                            h=self.heads)
        return self.to_out(rearrange(self.attend(q, k, v), 'b h n d -> b n (h d)'))

    def position_bias(self):
        """(heads, 1 + n, 1 + n): the learned bias between local tokens, zero in the regional token's row
        and column."""
        bias = rearrange(self.relative_position_bias, 'h y x -> h (y x)')[:, self.relative_position_index]
        return F.pad(bias, (1, 0, 1, 0))

    def forward(self, x, *, mask=None):
        bias = self.position_bias()
        return super().forward(x, mask=bias if mask is None else bias + mask)


class RegionToLocalBlock(nn.Module):
    """One RegionViT block on a stage's windows, (b * r, 1 + window ** 2, dim) -> same: regional
    self-attention among the r regional tokens of each image, then regional-to-local attention and the
    feedforward in each window, each a residual branch with stochastic depth (per image for the first, per
    window for the others, as the official code)."""

    def __init__(self, dim, heads, mlp_dim, *, window_size, attn_dropout, ff_dropout, drop_path):
        super().__init__()
        self.attention = RegionToLocalAttention(dim, heads, attn_dropout, window_size=window_size)
        self.feedforward = vit.FeedForward(dim, mlp_dim, ff_dropout, norm_eps=NORM_EPS)
        self.drop_path = drop_path

    def forward(self, x, *, regions, mask=None):
        regional = rearrange(x[:, 0], '(b r) d -> b r d', r=regions)
        regional = regional + vit.drop_path(self.attention.among_regions(regional), self.drop_path, self.training)
        x = torch.cat((rearrange(regional, 'b r d -> (b r) 1 d'), x[:, 1:]), dim=1)
        x = x + vit.drop_path(self.attention(x, mask=mask), self.drop_path, self.training)
        return x + vit.drop_path(self.feedforward(x), self.drop_path, self.training)


class RegionToLocalTransformer(vit.Stack):
    """The blocks of a stage, each called with the stage's keyword arguments (regions, mask)."""

    @staticmethod
    def layer(block, x, **kwargs):
        return block(x, **kwargs)


class Stage(nn.Module):
    """A stage: both maps halved and widened by one shared downsampling (none in the first stage), then its
    blocks on the windows: ((b, c, rh, rw) regional, (b, c, h, w) local) -> the same at (b, dim, ...)."""

    def __init__(self, downsample, transformer, *, window_size):
        super().__init__()
        self.downsample = nn.Identity() if downsample is None else downsample
        self.transformer = transformer
        self.window_size = window_size

    def forward(self, regional, local):
        regional, local = self.downsample(regional), self.downsample(local)
        (region_height, region_width), (height, width) = regional.shape[-2:], local.shape[-2:]
        window = self.window_size
        extra_height, extra_width = region_height * window - height, region_width * window - width
        local = F.pad(local, (0, extra_width, 0, extra_height))
        x = torch.cat((rearrange(regional, 'b d rh rw -> (b rh rw) 1 d'),
                       rearrange(local, 'b d (rh wh) (rw ww) -> (b rh rw) (wh ww) d', wh=window, ww=window)), dim=1)
        mask = padding_mask((region_height, region_width), (height, width), window, batch=local.shape[0],
                            dtype=x.dtype, device=x.device) if extra_height or extra_width else None
        x = self.transformer(x, regions=region_height * region_width, mask=mask)
        regional = rearrange(x[:, 0], '(b rh rw) d -> b d rh rw', rh=region_height, rw=region_width)
        local = rearrange(x[:, 1:], '(b rh rw) (wh ww) d -> b d (rh wh) (rw ww)', rh=region_height, rw=region_width,
                          wh=window)
        return regional, local[..., :height, :width]


def padding_mask(region_grid, size, window, *, batch, dtype, device):
    """(batch * regions, 1, 1, 1 + window ** 2): 0 at each window's regional token and at the image's local
    tokens, -inf at the padding that fills the (h, w) local map up to whole windows."""
    valid = torch.zeros(region_grid[0] * window, region_grid[1] * window, dtype=torch.bool, device=device)
    valid[:size[0], :size[1]] = True
    valid = rearrange(valid, '(rh wh) (rw ww) -> (rh rw) (wh ww)', wh=window, ww=window)
    valid = torch.cat((valid.new_ones(valid.shape[0], 1), valid), dim=1)
    mask = torch.zeros(valid.shape, dtype=dtype, device=device).masked_fill(~valid, float('-inf'))
    return repeat(mask, 'r n -> (b r) 1 1 n', b=batch)


class RegionViT(nn.Module):
    """RegionViT with vit-pytorch's keyword arguments (see the module docstring).

    dim, depth              each stage's width and number of blocks (an int: four equal stages).
    window_size             local tokens per window side: each regional token covers window_size **
                            2 local tokens (7 in the paper).
    local_patch_size        the local tokens' patch side (4); regional patches are window_size times it.
    tokenize_local_3_conv   the stem of three 3x3 convolutions (RegionViT-Ti and S; needs
                            local_patch_size 4), else one convolution of kernel 2 * local_patch_size.
    dim_head                every stage has dim / dim_head heads.
    mlp_mult                feedforward width over the stage's width.
    num_classes=0 makes `forward` return the pooled embedding (b, dim[-1]).

    `forward_features` returns the last stage's regional tokens after the final norm as a map
    (b, dim[-1], rh, rw); `forward_head` averages them. `forward_intermediates` returns each stage's
    local tokens (b, dim[i], h / (local_patch_size * 2 ** i), w / ...) (the official code's detection
    outputs). Recorder layout: two maps per block, in stage order: the regional self-attention
    (b, heads, r, r), then the regional-to-local attention (b * r, heads, 1 + window_size ** 2, same),
    its first row and column the regional token, then the window's local tokens row-major; r the
    stage's regional tokens, row-major, batch outermost.
    """

    num_prefix_tokens = 0

    def __init__(self, *, dim=(64, 128, 256, 512), depth=(2, 2, 8, 2), window_size=7, num_classes=1000,
                 tokenize_local_3_conv=False, local_patch_size=4, use_peg=False, attn_dropout=0., ff_dropout=0.,
                 channels=3, dim_head=32, mlp_mult=4, drop_path_rate=0.):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        stages = len(dim) if isinstance(dim, (tuple, list)) else \
            len(depth) if isinstance(depth, (tuple, list)) else 4
        self.dims, depths = per_stage(dim, stages), per_stage(depth, stages)
        self.channels, self.num_classes = channels, num_classes
        self.local_patch_size, self.window_size = local_patch_size, window_size
        self.num_features = self.dims[-1]

        self.local_encoder = local_encoder(channels, self.dims[0], patch_size=local_patch_size,
                                           three_convs=tokenize_local_3_conv)
        region_patch = local_patch_size * window_size
        self.region_encoder = RegionEncoder(channels, self.dims[0], region_patch, stride=region_patch)
        rates = multiscale.drop_path_rates(drop_path_rate, sum(depths))
        self.stages = nn.ModuleList()
        for i, (width, blocks) in enumerate(zip(self.dims, depths)):
            downsample = None if i == 0 else nn.Sequential(
                ChannelNorm(self.dims[i - 1]), nn.GELU(),
                nn.Conv2d(self.dims[i - 1], width, 3, stride=2, padding=1, groups=self.dims[i - 1]))
            transformer = RegionToLocalTransformer([
                RegionToLocalBlock(width, width // dim_head, width * mlp_mult, window_size=window_size,
                                   attn_dropout=attn_dropout, ff_dropout=ff_dropout, drop_path=rate)
                for rate in rates[sum(depths[:i]):sum(depths[:i + 1])]])
            self.stages.append(Stage(downsample, transformer, window_size=window_size))
        self.feature_info = [dict(num_chs=width, reduction=local_patch_size * 2 ** i, module=f'stages.{i}')
                             for i, width in enumerate(self.dims)]

        self.norm = nn.LayerNorm(self.num_features, eps=NORM_EPS)
        self.mlp_head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else None
        self.apply(vit.init_linear_weights)

    def embed(self, img):
        """The checked image's (regional, local) token maps: (b, dim[0], rh, rw), (b, dim[0], h / p, w / p)."""
        vit.check_images(img, channels=self.channels, patch_size=(self.local_patch_size,) * 2,
                         dtype=self.norm.weight.dtype)
        return self.region_encoder(img), self.local_encoder(img)

    def forward_features(self, img):
        """The last stage's regional tokens after the final norm, as a map (b, dim[-1], rh, rw)."""
        regional, local = self.embed(img)
        for stage in self.stages:
            regional, local = stage(regional, local)
        return rearrange(self.norm(rearrange(regional, 'b d h w -> b h w d')), 'b h w d -> b d h w')

    def forward_head(self, x, pre_logits=False):
        """Average the regional tokens; return the pooled embedding (b, num_features), or the logits."""
        x = x.mean(dim=(-2, -1))
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def forward_intermediates(self, img, indices=None):
        """Each chosen stage's local tokens (b, c, h, w), with `feature_info`'s channels and stride: indices
        None for every stage, an int n for the last n, or a list of stage numbers."""
        chosen = vit.take_indices(indices, len(self.stages))
        (regional, local), maps = self.embed(img), {}
        for i, stage in enumerate(self.stages[:max(chosen) + 1]):
            regional, local = stage(regional, local)
            maps[i] = local
        return [maps[i] for i in chosen]

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.norm.weight)

    def set_grad_checkpointing(self, enable=True):
        for stage in self.stages:
            stage.transformer.grad_checkpointing = enable


# the paper's models (Table 1, as the official code's `_model_cfg` builds them): name -> (dim, depth, 3conv stem);
# 224 px images, local patches of 4, windows of 7, 32 channels per head
CONFIGS = {
    'tiny': ((64, 128, 256, 512), (2, 2, 8, 2), True),
    'small': ((96, 192, 384, 768), (2, 2, 8, 2), True),
    'medium': ((96, 192, 384, 768), (2, 2, 14, 2), False),
    'base': ((128, 256, 512, 1024), (2, 2, 14, 2), False),
}


def regionvit(variant, *, num_classes=1000, **overrides):
    """The paper's RegionViT `variant` (a key of CONFIGS); keyword arguments of RegionViT override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, depth, three_convs = CONFIGS[variant]
    kwargs = dict(dim=dim, depth=depth, window_size=7, local_patch_size=4, tokenize_local_3_conv=three_convs,
                  dim_head=32, mlp_mult=4, num_classes=num_classes)
    return RegionViT(**{**kwargs, **overrides})


def regionvit_tiny(**kwargs):
    return regionvit('tiny', **kwargs)


def regionvit_small(**kwargs):
    return regionvit('small', **kwargs)


def regionvit_medium(**kwargs):
    return regionvit('medium', **kwargs)


def regionvit_base(**kwargs):
    return regionvit('base', **kwargs)


# argument checks


def check_arguments(*, dim, depth, window_size, num_classes, tokenize_local_3_conv, local_patch_size, use_peg,
                    attn_dropout, ff_dropout, channels, dim_head, mlp_mult, drop_path_rate):
    for name, value in dict(window_size=window_size, local_patch_size=local_patch_size, channels=channels,
                            dim_head=dim_head, mlp_mult=mlp_mult).items():
        vit.positive_int(name, value)
    vit.non_negative_int('num_classes', num_classes)
    for name, value in dict(dim=dim, depth=depth).items():
        if isinstance(value, (tuple, list)) and not value:
            raise ValueError(f"{name} must be an int or one value per stage, got {value!r}")
    if all(isinstance(value, (tuple, list)) for value in (dim, depth)) and len(dim) != len(depth):
        raise ValueError(f"dim {tuple(dim)!r} and depth {tuple(depth)!r} must have one value per stage each")
    stages = len(dim) if isinstance(dim, (tuple, list)) else len(depth) if isinstance(depth, (tuple, list)) else 4
    dims = per_stage(dim, stages)
    for value in dims:
        vit.positive_int('dim', value)
    for value in per_stage(depth, stages):
        vit.positive_int('depth', value)
    for i, width in enumerate(dims):
        if width % dim_head:
            raise ValueError(f"dim_head {dim_head} must divide every stage's width (it has width / dim_head heads), "
                             f"got dim {dims!r}")
        if i and width % dims[i - 1]:
            raise ValueError(f"each stage's width must be a multiple of the previous one (the downsampling is a "
                             f"depthwise convolution), got dim {dims!r}")
    vit.boolean('tokenize_local_3_conv', tokenize_local_3_conv)
    if tokenize_local_3_conv and local_patch_size != 4:
        raise ValueError(f"tokenize_local_3_conv=True (strides 2, 2, 1) needs local_patch_size 4, got "
                         f"{local_patch_size}; use tokenize_local_3_conv=False for other patch sizes")
    if not tokenize_local_3_conv and local_patch_size < 2:
        raise ValueError(f"local_patch_size must be at least 2 with tokenize_local_3_conv=False (its convolution of "
                         f"kernel 2 * p, stride p, padding p - 1 gives h / p tokens only then), got {local_patch_size}")
    if tokenize_local_3_conv and dims[0] % 4:
        raise ValueError(f"tokenize_local_3_conv=True needs dim[0] divisible by 4 (its convolutions are dim / 4 "
                         f"and dim / 2 wide), got {dims[0]}")
    vit.boolean('use_peg', use_peg)
    if use_peg:
        raise ValueError("use_peg=True is not built here: the official code's position convolution is used only by "
                         "its `_w14_peg` models, not by the paper's RegionViT-Ti/S/M/B; leave it False")
    vit.probability('attn_dropout', attn_dropout)
    vit.probability('ff_dropout', ff_dropout)
    vit.probability('drop_path_rate', drop_path_rate)


# loading checkpoints


def official_plan(model, keys):
    """The official code's RegionViT (IBM/RegionViT @ 77000c2, `regionvit_*_224`) -> RegionViT.

    Names differ; values too in three places: its 2D LayerNorms hold (1, c, 1, 1) weights; its relative
    position table is (heads, (2w - 1) ** 2), read at offset (key - query + w // 2) modulo 2w - 1 per axis
    (ours at key - query + w - 1: the same table rolled by w - 1 - w // 2); and its state_dict holds the
    shared downsampling twice (`proj` and `proj_cls`, one module), of which the first is read.
    """
    plan = {}
    three_convs = isinstance(model.local_encoder, nn.Sequential)
    stem = {'local_encoder.0.': 'patch_embed.proj.0.', 'local_encoder.1.': 'patch_embed.proj.1.',
            'local_encoder.3.': 'patch_embed.proj.3.', 'local_encoder.4.': 'patch_embed.proj.4.',
            'local_encoder.6.': 'patch_embed.proj.6.'} if three_convs else {'local_encoder.': 'patch_embed.proj.'}
    names = {**stem, 'region_encoder.': 'cls_token.proj.', 'norm.': 'norm.', 'mlp_head.': 'head.'}
    for i, stage in enumerate(model.stages):
        if i > 0:
            for part in ('0', '2'):
                for kind in ('weight', 'bias'):
                    ours = f'stages.{i}.downsample.{part}.{kind}'
                    shape = tuple(model.state_dict()[ours].shape)
                    theirs = (1, shape[0], 1, 1) if part == '0' else shape
                    plan[ours] = ({f'layers.{i}.block.0.proj.{part}.{kind}': theirs,
                                   f'layers.{i}.block.0.proj_cls.{part}.{kind}': theirs},
                                  _first_flat if part == '0' else _first)
        for j, block in enumerate(stage.transformer.layers):
            ours, theirs = f'stages.{i}.transformer.layers.{j}.', f'layers.{i}.block.{j + 1}.'
            names.update({ours + a: theirs + b for a, b in {
                'attention.region_norm.': 'norm0.', 'attention.norm.': 'norm1.', 'attention.to_qkv.': 'attn.qkv.',
                'attention.to_out.0.': 'attn.proj.', 'feedforward.net.0.': 'norm2.',
                'feedforward.net.1.': 'mlp.fc1.', 'feedforward.net.4.': 'mlp.fc2.'}.items()})
            table = block.attention.relative_position_bias
            heads, side = table.shape[:2]
            window = (side + 1) // 2
            plan[ours + 'attention.relative_position_bias'] = (
                {theirs + 'attn.rel_pos': (heads, side * side)},
                lambda tensor, side=side, shift=window - 1 - window // 2: torch.roll(
                    rearrange(tensor, 'h (y x) -> h y x', y=side), shifts=(shift, shift), dims=(1, 2)))
    for key, tensor in model.state_dict().items():
        if key in plan:
            continue
        prefix = next((prefix for prefix in names if key.startswith(prefix)), None)
        if prefix is None:
            raise ValueError(f"the official RegionViT has no counterpart of {key}")
        theirs = names[prefix] + key[len(prefix):]
        norm_2d = three_convs and prefix in ('local_encoder.1.', 'local_encoder.4.')
        plan[key] = ({theirs: (1, tensor.shape[0], 1, 1) if norm_2d else tuple(tensor.shape)},
                     _flat if norm_2d else _same)
    return plan, ('head.',)


def _same(tensor):
    return tensor


def _flat(tensor):
    return tensor.reshape(-1)


def _first(tensor, copy):
    return tensor


def _first_flat(tensor, copy):
    return tensor.reshape(-1)


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's RegionViT computes another function: its attention has 4 heads in every stage, no "
        "query/key/value bias and one LayerNorm shared by the regional and the regional-to-local attention; its "
        "relative position bias is one table per stage; its downsampling is a full 3x3 convolution (no LayerNorm, "
        "GELU or depthwise grouping); its three-convolution stem keeps the full width throughout; and its head "
        "averages the regional tokens before the LayerNorm. RegionViT here is the official code's (IBM/RegionViT): "
        "load its checkpoints with load_official")
