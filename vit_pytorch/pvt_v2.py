"""PVT v2: Pyramid Vision Transformer v2.

"PVT v2: Improved Baselines with Pyramid Vision Transformer", Wang et al., arXiv 2106.13797: a
pyramid of four stages, each opened by an overlapping patch embedding (a strided convolution
wider than its stride, then a LayerNorm: 7x7 stride 4 for the image, 3x3 stride 2 between
stages), whose tokens attend to a spatially reduced copy of themselves (keys and values from
the map shrunk by a convolution of kernel and stride `sr_ratio`, or, in the linear variant,
average-pooled to 7x7), and whose feedforward carries a 3x3 depthwise convolution on the token
map in place of position embeddings. No position table: any image size runs.

    import torch
    from vit_pytorch.pvt_v2 import PyramidVisionTransformerV2, pvt_v2_b0

    model = PyramidVisionTransformerV2(num_classes=10, depths=(1, 1), embed_dims=(16, 32), num_heads=(1, 2),
                                       sr_ratios=(2, 1), mlp_ratios=(4, 4))
    logits = model(torch.randn(2, 3, 64, 48))                     # (2, 10)
    maps = model.forward_intermediates(torch.randn(2, 3, 64, 48))  # (2, 16, 16, 12), (2, 32, 8, 6)

    paper_model = pvt_v2_b0()                                      # PVT-v2-b0, 3,666,760 parameters

The arguments and the computation are timm's (`timm.models.pvt_v2.PyramidVisionTransformerV2`,
timm 1.0.31, which follows the paper's code), and its checkpoints load with
`vit_pytorch.pretrained.load_timm`; vit-pytorch has no PVT v2. As in timm, the LayerNorms of
the blocks and of each stage's output have epsilon 1e-6, those of the patch embeddings and of
the reduced keys 1e-5 (PyTorch's default). An image must leave every stage a map at least
`sr_ratio` tokens high and wide (the reduction is an unpadded convolution).
"""

import math

import torch
from einops import rearrange
from torch import nn

from vit_pytorch import multiscale, vit

BLOCK_EPS = 1e-6          # the blocks' and stages' LayerNorms (the patch embeddings' and reductions': 1e-5)

# helpers


def stage_sizes(image_size, num_stages):
    """(h, w) token map of each stage: the image through the 7x7 stride-4 stem, then 3x3 stride-2 embeddings."""
    sizes = [tuple(vit.conv_output_size(side, 7, 4, 3) for side in image_size)]
    for _ in range(num_stages - 1):
        sizes.append(tuple(vit.conv_output_size(side, 3, 2, 1) for side in sizes[-1]))
    return sizes


# classes


class OverlapPatchEmbedding(nn.Module):
    """(b, c, h, w) -> (b, h', w', dim): a convolution of kernel `patch_size`, stride `stride` and padding
    patch_size // 2 (neighbouring patches overlap), then a LayerNorm."""

    def __init__(self, channels, dim, *, patch_size, stride):
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, patch_size, stride=stride, padding=patch_size // 2)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(rearrange(self.proj(x), 'b d h w -> b h w d'))


class ConvFeedForward(nn.Module):
    """Pre-norm feedforward with a 3x3 depthwise convolution on the hidden map (PVT v2, section 3.2):
    (b, h * w, dim) tokens of an (h, w) map -> (b, h * w, dim). The linear variant puts a ReLU
    before the convolution (`extra_relu`)."""

    def __init__(self, dim, hidden_dim, dropout=0., *, extra_relu=False, norm_eps=BLOCK_EPS):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.relu = nn.ReLU() if extra_relu else nn.Identity()
        self.dwconv = nn.Conv2d(hidden_dim, hidden_dim, 3, padding=1, groups=hidden_dim)
        self.act = nn.GELU()
        self.dropout = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x, size):
        x = self.relu(rearrange(self.fc1(self.norm(x)), 'b (h w) d -> b d h w', h=size[0], w=size[1]))
        # rebinding x frees the fc1 output before GELU allocates its own output, which can then reuse that block;
        # held to the end of one expression, GELU's 25 MB output (stage 1, batch 8) was a fresh mmap each call,
        # page-faulted in (16,000 minor faults, GELU at 44 against 20 ms of a 250 ms eval forward, issue 29)
        x = rearrange(self.dwconv(x), 'b d h w -> b (h w) d')
        x = self.dropout(self.act(x))
        return self.dropout(self.fc2(x))


class MapTransformer(vit.Stack):
    """`vit.Stack` whose residual branches read the (h, w) map the tokens lie on (keyword `size`)."""

    @staticmethod
    def layer(branches, x, *, size):
        for branch in branches:
            x = branch(x, size) + x
        return x


class Stage(nn.Module):
    """A stage: its overlapping patch embedding, its blocks and its norm, (b, c, h, w) -> (b, dim, h', w')."""

    def __init__(self, downsample, blocks):
        super().__init__()
        self.downsample = downsample
        self.blocks = blocks

    def forward(self, x):
        x = self.downsample(x)                                       # (b, h, w, dim)
        height, width = x.shape[1:3]
        x = self.blocks(rearrange(x, 'b h w d -> b (h w) d'), size=(height, width))
        return rearrange(x, 'b (h w) d -> b d h w', h=height).contiguous()


class PyramidVisionTransformerV2(nn.Module):
    """PVT v2 with timm's keyword arguments.

    in_chans           input channels.
    num_classes        0: `forward` returns the pooled embedding (b, embed_dims[-1]).
    depths             blocks of each stage.
    embed_dims         width of each stage.
    num_heads          heads of each stage (an int: every stage).
    sr_ratios          each stage's spatial reduction of keys and values (an int: every stage).
    mlp_ratios         each stage's feedforward width over its width (a number: every stage).
    qkv_bias           bias on the query and key/value projections.
    linear             the linear variant (PVT-v2-li): keys and values pooled to 7x7 in every stage.
    drop_rate          dropout before the head; proj_drop_rate after the attention projection and in
                       the feedforward; attn_drop_rate on the attention weights.
    drop_path_rate     stochastic depth of the last block, growing linearly from 0 in the first.

    `forward_features` returns the last stage's normed map (b, embed_dims[-1], h, w), as timm's;
    `forward_head` averages it. Recorder layout: one map per block, in stage and block order, of
    shape (b, heads, h_i * w_i, m_i) where (h_i, w_i) is stage i's map and m_i its reduced keys:
    (h_i // sr) * (w_i // sr), or 49 with `linear`; with different shapes per stage the
    Recorder returns a list.

    `num_classes=0` makes `forward` return the pooled embedding (b, num_features).
    """

    num_prefix_tokens = 0

    def __init__(self, *, in_chans=3, num_classes=1000, depths=(3, 4, 6, 3), embed_dims=(64, 128, 256, 512),
                 num_heads=(1, 2, 4, 8), sr_ratios=(8, 4, 2, 1), mlp_ratios=(8., 8., 4., 4.), qkv_bias=True,
                 linear=False, drop_rate=0., proj_drop_rate=0., attn_drop_rate=0., drop_path_rate=0.):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        num_stages = len(depths)
        num_heads, sr_ratios, mlp_ratios = (per_stage(value, num_stages) for value in (num_heads, sr_ratios, mlp_ratios))
        self.in_chans, self.num_classes = in_chans, num_classes
        self.sr_ratios, self.linear = sr_ratios, linear
        self.num_features = embed_dims[-1]

        rates = multiscale.drop_path_rates(drop_path_rate, sum(depths))
        stages = []
        for i, (depth, dim, heads, sr_ratio, mlp_ratio) in enumerate(
                zip(depths, embed_dims, num_heads, sr_ratios, mlp_ratios)):
            downsample = OverlapPatchEmbedding(in_chans, dim, patch_size=7, stride=4) if i == 0 else \
                OverlapPatchEmbedding(embed_dims[i - 1], dim, patch_size=3, stride=2)
            blocks = [(multiscale.DropPath(multiscale.SpatialReductionAttention(dim, heads, attn_drop_rate, sr_ratio=sr_ratio, linear=linear,
                                                          qkv_bias=qkv_bias, proj_dropout=proj_drop_rate), rate),
                       multiscale.DropPath(ConvFeedForward(dim, int(dim * mlp_ratio), proj_drop_rate, extra_relu=linear), rate))
                      for rate in rates[sum(depths[:i]):sum(depths[:i + 1])]]
            stages.append(Stage(downsample, MapTransformer(blocks, norm=nn.LayerNorm(dim, eps=BLOCK_EPS))))
        self.stages = nn.ModuleList(stages)
        self.feature_info = [dict(num_chs=dim, reduction=4 * 2 ** i, module=f'stages.{i}')
                             for i, dim in enumerate(embed_dims)]

        self.dropout = nn.Dropout(drop_rate)
        self.mlp_head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else None
        self.apply(multiscale.init_conv_weights)

    def check_image(self, img):
        """Refuse what is not an image batch, or an image that leaves a stage a map smaller than its reduction."""
        vit.check_images(img, channels=self.in_chans, patch_size=(1, 1), dtype=self.stages[0].downsample.norm.weight.dtype)
        sizes = stage_sizes(img.shape[-2:], len(self.stages))
        for i, (size, sr_ratio) in enumerate(zip(sizes, self.sr_ratios)):
            if not self.linear and sr_ratio > 1 and min(size) < sr_ratio:
                raise ValueError(f"img of {img.shape[-2]}x{img.shape[-1]} leaves stage {i} a {size[0]}x{size[1]} map, "
                                 f"smaller than its sr_ratio {sr_ratio}; use images of at least "
                                 f"{4 * 2 ** i * sr_ratio - 4 * 2 ** i + 1} pixels a side, or smaller sr_ratios")

    def forward_features(self, img):
        """The last stage's map after its norm: (b, embed_dims[-1], h, w), as timm's."""
        self.check_image(img)
        x = img
        for stage in self.stages:
            x = stage(x)
        return x

    def forward_head(self, x, pre_logits=False):
        """Average the map; return the pooled embedding (b, num_features), or the logits."""
        x = self.dropout(x.mean(dim=(-2, -1)))
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, img):
        """Logits (b, num_classes); with num_classes=0 the pooled embedding (b, num_features), as timm's."""
        return self.forward_head(self.forward_features(img))

    def forward_intermediates(self, img, indices=None):
        """Each chosen stage's normed output map, (b, c, h, w) with `feature_info`'s channels and stride:
        indices None for every stage, an int n for the last n, or a list of stage numbers."""
        chosen = vit.take_indices(indices, len(self.stages))
        self.check_image(img)
        x, maps = img, {}
        for i, stage in enumerate(self.stages[:max(chosen) + 1]):
            x = maps[i] = stage(x)
        return [maps[i] for i in chosen]

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.non_negative_int('num_classes', num_classes)
        self.num_classes = num_classes
        like = self.stages[-1].blocks.norm.weight
        self.mlp_head = vit.zero_linear(self.num_features, num_classes, like=like) if num_classes > 0 else None

    def set_grad_checkpointing(self, enable=True):
        for stage in self.stages:
            stage.blocks.grad_checkpointing = enable


def per_stage(value, stages):
    """A value for every stage, or the tuple of one per stage, as a tuple."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * stages


# the paper's models (Table 1, timm's pvt_v2_*): name -> (depths, embed_dims, mlp_ratios); heads (1, 2, 5, 8)
# and reductions (8, 4, 2, 1) in every model; b2_li is b2 with linear spatial-reduction attention
CONFIGS = {
    'b0': ((2, 2, 2, 2), (32, 64, 160, 256), (8, 8, 4, 4)),
    'b1': ((2, 2, 2, 2), (64, 128, 320, 512), (8, 8, 4, 4)),
    'b2': ((3, 4, 6, 3), (64, 128, 320, 512), (8, 8, 4, 4)),
    'b3': ((3, 4, 18, 3), (64, 128, 320, 512), (8, 8, 4, 4)),
    'b4': ((3, 8, 27, 3), (64, 128, 320, 512), (8, 8, 4, 4)),
    'b5': ((3, 6, 40, 3), (64, 128, 320, 512), (4, 4, 4, 4)),
    'b2_li': ((3, 4, 6, 3), (64, 128, 320, 512), (8, 8, 4, 4)),
}


def pvt_v2(variant, **overrides):
    """The paper's PVT v2 `variant` (a key of CONFIGS); keyword arguments of the class override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    depths, embed_dims, mlp_ratios = CONFIGS[variant]
    kwargs = dict(depths=depths, embed_dims=embed_dims, num_heads=(1, 2, 5, 8), sr_ratios=(8, 4, 2, 1),
                  mlp_ratios=mlp_ratios, linear=variant.endswith('_li'))
    return PyramidVisionTransformerV2(**{**kwargs, **overrides})


def pvt_v2_b0(**kwargs):
    return pvt_v2('b0', **kwargs)


def pvt_v2_b1(**kwargs):
    return pvt_v2('b1', **kwargs)


def pvt_v2_b2(**kwargs):
    return pvt_v2('b2', **kwargs)


def pvt_v2_b3(**kwargs):
    return pvt_v2('b3', **kwargs)


def pvt_v2_b4(**kwargs):
    return pvt_v2('b4', **kwargs)


def pvt_v2_b5(**kwargs):
    return pvt_v2('b5', **kwargs)


def pvt_v2_b2_li(**kwargs):
    return pvt_v2('b2_li', **kwargs)


# argument checks


def check_stage_values(name, value, num_stages, check):
    """`value` is one valid value or one per stage (`num_stages`); `check(name, v)` validates each."""
    if isinstance(value, (tuple, list)) and len(value) != num_stages:
        raise ValueError(f"{name} must be one value or one per stage ({num_stages} stages in depths), got {value!r}")
    return [check(name, v) for v in per_stage(value, num_stages)]


def check_arguments(*, in_chans, num_classes, depths, embed_dims, num_heads, sr_ratios, mlp_ratios, qkv_bias, linear,
                    drop_rate, proj_drop_rate, attn_drop_rate, drop_path_rate):
    vit.positive_int('in_chans', in_chans)
    vit.non_negative_int('num_classes', num_classes)
    if not isinstance(depths, (list, tuple)) or not depths:
        raise TypeError(f"depths must be a non-empty tuple of blocks per stage, e.g. (2, 2, 2, 2), got {depths!r}")
    for depth in depths:
        vit.positive_int('depths', depth)
    if not isinstance(embed_dims, (list, tuple)) or len(embed_dims) != len(depths):
        raise ValueError(f"embed_dims must give one width per stage ({len(depths)} stages in depths), "
                         f"got {embed_dims!r}")
    for dim in embed_dims:
        vit.positive_int('embed_dims', dim)
    heads = check_stage_values('num_heads', num_heads, len(depths), vit.positive_int)
    for i, (dim, count) in enumerate(zip(embed_dims, heads)):
        if dim % count:
            raise ValueError(f"num_heads {count} must divide stage {i}'s width embed_dims[{i}] = {dim}")
    check_stage_values('sr_ratios', sr_ratios, len(depths), vit.positive_int)
    ratios = check_stage_values('mlp_ratios', mlp_ratios, len(depths), vit.positive_float)
    for i, (dim, ratio) in enumerate(zip(embed_dims, ratios)):
        if int(dim * ratio) < 1:
            raise ValueError(f"mlp_ratios {ratio} leaves stage {i} (width {dim}) a feedforward of width 0")
    vit.boolean('qkv_bias', qkv_bias)
    vit.boolean('linear', linear)
    for name, value in dict(drop_rate=drop_rate, proj_drop_rate=proj_drop_rate, attn_drop_rate=attn_drop_rate,
                            drop_path_rate=drop_path_rate).items():
        vit.probability(name, value)


# loading checkpoints


ATTENTION = {'norm.': 'norm1.', 'to_q.': 'attn.q.', 'to_kv.': 'attn.kv.', 'to_out.0.': 'attn.proj.',
             'reduce_norm.': 'attn.norm.'}
FEEDFORWARD = {'norm.': 'norm2.', 'fc1.': 'mlp.fc1.', 'dwconv.': 'mlp.dwconv.', 'fc2.': 'mlp.fc2.'}


def timm_plan(model, keys):
    """timm's `PyramidVisionTransformerV2` (`pvt_v2_*`) -> PyramidVisionTransformerV2.

    Names differ, values do not: timm's stem (`patch_embed`) is our first stage's embedding, its
    stride-2 embeddings each later stage's.
    """
    if any(key.startswith(('block1.', 'patch_embed1.')) for key in keys):
        raise ValueError("this is the original PVT v2 layout (block1, patch_embed1, ...); timm's layout is expected: "
                         "load the file into timm's model (which converts it) and save its state_dict")
    # the linear variant reduces keys in every stage; the other only where sr_ratio > 1
    reduced_everywhere = all(f'stages.{i}.blocks.0.attn.sr.weight' in keys for i in range(len(model.stages)))
    if model.linear and not reduced_everywhere or \
            not model.linear and reduced_everywhere and 1 in model.sr_ratios:
        raise ValueError(f"build the model with linear={not model.linear} (the checkpoint "
                         f"{'does not reduce' if model.linear else 'reduces'} the keys of every stage)")
    has_bias = 'stages.0.blocks.0.attn.q.bias' in keys
    if has_bias != (model.stages[0].blocks.layers[0][0].fn.to_q.bias is not None):
        raise ValueError(f"build the model with qkv_bias={has_bias} (the checkpoint's attention "
                         f"{'has' if has_bias else 'has no'} qkv bias)")
    names = {'stages.0.downsample.': 'patch_embed.', 'mlp_head.': 'head.'}
    for i, stage in enumerate(model.stages):
        if i > 0:
            names[f'stages.{i}.downsample.'] = f'stages.{i}.downsample.'
        names[f'stages.{i}.blocks.norm.'] = f'stages.{i}.norm.'
        for j, (attention, _) in enumerate(stage.blocks.layers):
            ours, theirs = f'stages.{i}.blocks.layers.{j}.', f'stages.{i}.blocks.{j}.'
            names.update({f'{ours}0.fn.{a}': f'{theirs}{b}' for a, b in ATTENTION.items()})
            names.update({f'{ours}1.fn.{a}': f'{theirs}{b}' for a, b in FEEDFORWARD.items()})
            # the reduction: a strided convolution (attn.sr), or in the linear variant pooling then attn.sr
            names[f'{ours}0.fn.reduce.1.' if model.linear else f'{ours}0.fn.reduce.'] = f'{theirs}attn.sr.'
    plan = {}
    for key, tensor in model.state_dict().items():
        prefix = next((prefix for prefix in names if key.startswith(prefix)), None)
        if prefix is None:
            raise ValueError(f"timm's PVT v2 has no counterpart of {key}")
        plan[key] = ({names[prefix] + key[len(prefix):]: tuple(tensor.shape)}, _same)
    return plan, ('head.',)


def _same(tensor):
    return tensor
