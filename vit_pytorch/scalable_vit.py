"""ScalableViT: scalable self-attention and interactive window attention.

"ScalableViT: Rethinking the Context-oriented Generalization of Vision Transformer", Yang et al.,
arXiv 2203.10790: a four-stage pyramid (an overlapping 7x7 stride-4 stem, 3x3 stride-2 embeddings
between stages) whose blocks alternate two attentions, with CPVT's position encoding generator (a
residual 3x3 depthwise convolution) after each stage's first block:

- **interactive window-based self-attention** (IWSA, section 3.2): attention within
  non-overlapping windows, plus a **local interactive module** (LIM): a 3x3 depthwise convolution
  of the values laid out as the whole map, added to the attention's output, so that neighbouring
  windows exchange information;
- **scalable self-attention** (SSA, section 3.1): keys and values come from the map shrunk
  spatially (a depthwise convolution of kernel and stride `reduction_factor`) and rescaled in
  width (a 1x1 convolution to `heads * ssa_dim_key` channels, then LayerNorm and GELU); queries
  and keys have `ssa_dim_key` channels a head, values the head width, so the attention's inner
  width is free of the model's width (the paper's channel factor r_c = ssa_dim_key / head width).

    import torch
    from vit_pytorch.scalable_vit import ScalableViT, scalable_vit_small

    model = ScalableViT(num_classes=10, dim=16, depth=(2, 2, 2, 2), heads=(1, 2, 2, 4),
                        reduction_factor=(4, 2, 2, 1), window_size=(4, 4, 2, None),
                        ssa_dim_key=(20, 20, 16, 32), head_hidden_dim=64)
    logits = model(torch.randn(2, 3, 64, 64))                     # (2, 10)
    maps = model.forward_intermediates(torch.randn(2, 3, 64, 64))  # 16x16, 8x8, 4x4, 2x2 maps

    paper_model = scalable_vit_small()                             # ScalableViT-S, 32,000,472 parameters

The function is the official code's (Yangr116/ScalableViT @ 8011147,
image_classification/models/scalablevit.py, read for facts and run as the test reference), whose
state_dicts load with `vit_pytorch.pretrained.load_official`. Its head is an MLP: Linear to
`head_hidden_dim` (4096), LayerNorm, GELU, then the classifier (`head_hidden_dim=None`: the
classifier alone, the official `plain_head`). The official code at that commit counts 32,000,472 /
81,881,624 / 109,288,840 parameters for S / B / L; its README says 32.4M / 81.9M / 104.9M: B
agrees, S and L do not (the code, not the README, is what is built and tested here).

The keyword arguments are vit-pytorch's (`dim`, the first stage's width, doubled at every stage;
`depth`, `heads`, `reduction_factor`, `window_size` (None: the whole map is one window),
`ssa_dim_key`, `ff_expansion_factor`, `channels`, `dropout`), with `drop_path_rate` and
`head_hidden_dim` added. vit-pytorch 1.26.14's ScalableViT computes another function and its
checkpoints are refused with this reason: there, each unit of `depth` is an (SSA, feedforward,
IWSA, feedforward) pair of blocks (its ScalableViT-S arguments build 75.9M parameters), SSA comes
first, the PEG follows the first pair, the LIM is a full (not depthwise) 3x3 convolution, keys and
values come from one strided convolution each (no depthwise reduction, no norm, no GELU), the
query/key/value projections have no bias, the patch embeddings no norm, the norms are channel
LayerNorms with a LayerNorm before the head, and the head is one Linear. Here, as in the paper,
`depth` counts blocks (IWSA and SSA alternating, IWSA first). `ssa_dim_value`, `iwsa_dim_key` and
`iwsa_dim_value` are accepted for vit-pytorch's sake only at the paper's value, the head width,
which their default None gives (vit-pytorch's default, 32, is the head width of ScalableViT-S, and
any width at its value 32 fails there only where the head width is not 32). `window_size` (None)
and `ssa_dim_key` (32) default to vit-pytorch's values; ScalableViT-S's widths, depths and heads
are the defaults of the arguments vit-pytorch requires, and `scalable_vit_small()` adds the paper's
windows (7) and key widths (40, 40, 40, 32). A window must divide its stage's map (no padding, as in the official code).
"""

from functools import partial

import torch
from einops import rearrange
from torch import nn

from vit_pytorch import multiscale, vit

BLOCK_EPS = 1e-6      # every LayerNorm's epsilon but the SSA reduction's (PyTorch's default 1e-5)
STAGE_ARGUMENTS = ('heads', 'reduction_factor', 'window_size', 'ssa_dim_key', 'ssa_dim_value', 'iwsa_dim_key',
                   'iwsa_dim_value')


# classes


class ConvPatchEmbedding(nn.Module):
    """(b, c, h, w) -> (b, h', w', dim): a convolution wider than its stride, padded by the difference
    (neighbouring patches overlap), then a LayerNorm."""

    def __init__(self, channels, dim, *, kernel_size, stride):
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, kernel_size, stride=stride, padding=kernel_size - stride)
        self.norm = nn.LayerNorm(dim, eps=BLOCK_EPS)

    def forward(self, x):
        return self.norm(rearrange(self.proj(x), 'b d h w -> b h w d'))


class InteractiveWindowAttention(vit.Attention):
    """IWSA: pre-norm attention within non-overlapping windows, plus the local interactive module (a 3x3
    depthwise convolution of the values as a map), (b, h * w, dim) tokens of an (h, w) map -> (b, h * w, dim).
    `window_size` None: the whole map is one window. The recorded map is (b * windows, heads, wh * ww,
    wh * ww), windows in row-major order of the map, batch outermost."""

    def __init__(self, dim, heads, dropout=0., *, window_size):
        super().__init__(dim, heads, dim // heads, dropout, qkv_bias=True, norm_eps=BLOCK_EPS,
                         to_out=nn.Sequential(nn.Linear(dim, dim), nn.Dropout(dropout)))
        self.window_size = window_size
        self.local_interaction = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x, size):
        (height, width), dim = size, x.shape[-1]
        window_height, window_width = size if self.window_size is None else (self.window_size,) * 2
        qkv = self.to_qkv(self.norm(x))                                  # (b, h * w, 3 * dim)
        # contiguous: the convolution saves its input for the backward, and a view of the slice would keep all of
        # qkv alive (scalable_vit_small, batch 8: 48 MiB more saved, the step's peak 1008 -> 959 MiB)
        values = rearrange(qkv[..., 2 * dim:], 'b (h w) d -> b d h w', h=height).contiguous()
        local = rearrange(self.local_interaction(values), 'b d h w -> b (h w) d')
        q, k, v = rearrange(qkv, 'b (nh wh nw ww) (qkv heads d) -> qkv (b nh nw) heads (wh ww) d', qkv=3,
                            heads=self.heads, wh=window_height, ww=window_width, nw=width // window_width)
        out = rearrange(self.attend(q, k, v), '(b nh nw) heads (wh ww) d -> b (nh wh nw ww) (heads d)',
                        nh=height // window_height, nw=width // window_width, wh=window_height)
        return self.to_out(out + local)


class ScalableSelfAttention(nn.Module):
    """SSA: pre-norm attention of every token to the map scaled in space and width, (b, h * w, dim) tokens of an
    (h, w) map -> (b, h * w, dim).

    With `reduction` > 1 the normed map is shrunk by a depthwise convolution of kernel and stride `reduction`,
    widened (or narrowed) to heads * key_dim channels by a 1x1 convolution, then LayerNorm and GELU; keys
    (key_dim a head) and values (the head width) are projected from it, queries (key_dim a head) from every
    token. With `reduction` 1 the map itself gives keys and values, and key_dim is the head width. The
    recorded map is (b, heads, h * w, m), m the reduced tokens (h // r) * (w // r).
    """

    def __init__(self, dim, heads, dropout=0., *, reduction, key_dim):
        super().__init__()
        self.heads = heads
        self.scale = key_dim ** -0.5
        self.dropout = dropout
        self.fused = True

        keys_width = heads * key_dim
        self.norm = nn.LayerNorm(dim, eps=BLOCK_EPS)
        self.to_q = nn.Linear(dim, keys_width)
        if reduction > 1:
            self.reduce = nn.Sequential(nn.Conv2d(dim, dim, reduction, stride=reduction, groups=dim),
                                        nn.Conv2d(dim, keys_width, 1))
            self.reduce_norm = nn.Sequential(nn.LayerNorm(keys_width), nn.GELU())
        else:
            self.reduce, self.reduce_norm = None, None
        self.to_k = nn.Linear(keys_width if reduction > 1 else dim, keys_width)
        self.to_v = nn.Linear(keys_width if reduction > 1 else dim, dim)
        self.attention_probs = nn.Identity()
        self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(dropout))

    def keys_from(self, x, size):
        """The tokens keys and values are made of: the normed tokens, or their scaled map (b, m, heads * key_dim)."""
        if self.reduce is None:
            return x
        reduced = self.reduce(rearrange(x, 'b (h w) d -> b d h w', h=size[0], w=size[1]))
        return self.reduce_norm(rearrange(reduced, 'b d h w -> b (h w) d'))

    def forward(self, x, size):
        x = self.norm(x)
        context = self.keys_from(x, size)
        q = rearrange(self.to_q(x), 'b n (h d) -> b h n d', h=self.heads)
        k = rearrange(self.to_k(context), 'b m (h d) -> b h m d', h=self.heads)
        v = rearrange(self.to_v(context), 'b m (h d) -> b h m d', h=self.heads)
        # scaled_dot_product_attention takes its slow math path on the CPU when values are not as wide as keys
        # (measured 2.3x the explicit matrix at stage 0 of ScalableViT-S): the explicit path serves there
        fused = self.fused and q.shape[-1] == v.shape[-1]
        out = vit.attend(q, k, v, scale=self.scale, fused=fused, probs=self.attention_probs,
                         dropout=self.dropout if self.training else 0.)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class ScalableViT(multiscale.StagedModel):
    """ScalableViT with vit-pytorch's keyword arguments (`scalable_vit_small()` builds ScalableViT-S).

    dim                 the first stage's width; every later stage doubles it.
    depth               blocks of each stage (a tuple): IWSA and SSA alternating, IWSA first.
    heads               attention heads of each stage (an int: every stage).
    reduction_factor    each stage's SSA spatial reduction (the paper's r_n = reduction ** -2).
    window_size         each stage's IWSA window side; None: the whole map.
    ssa_dim_key         each stage's SSA query/key width a head (the paper's r_c times the head width); it must
                        be the head width where reduction_factor is 1.
    ssa_dim_value, iwsa_dim_key, iwsa_dim_value   vit-pytorch's; only the head width (None) is the paper's.
    ff_expansion_factor the feedforward width over the block's width.
    dropout             on the attention weights, after the attention projections and in the feedforward.
    drop_path_rate      stochastic depth of the last block, growing linearly from 0 in the first.
    head_hidden_dim     the head's hidden width (Linear, LayerNorm, GELU before the classifier); None: none.
    channels            input channels. num_classes=0: `forward` returns the pre-logits (b, num_features).

    `forward_features` returns the last stage's tokens after the final norm, (b, h * w, dim * 2^(stages - 1)),
    stages = len(depth).
    Recorder layout: one map per attention block, in stage and block order: IWSA blocks (b * windows,
    heads, wh * ww, wh * ww) (see `InteractiveWindowAttention`), SSA blocks (b, heads, h * w, m), m the
    reduced tokens (h // r) * (w // r).
    """

    num_prefix_tokens = 0

    def __init__(self, *, num_classes, dim=64, depth=(2, 2, 20, 2), heads=(2, 4, 8, 16),
                 reduction_factor=(8, 4, 2, 1), window_size=None, ssa_dim_key=32, ssa_dim_value=None,
                 iwsa_dim_key=None, iwsa_dim_value=None, ff_expansion_factor=4, channels=3, dropout=0.,
                 drop_path_rate=0., head_hidden_dim=4096):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        settings = vit.arguments(locals())
        stages = [dict(zip(STAGE_ARGUMENTS, values)) for values in
                  zip(*(per_stage(settings[name], len(depth)) for name in STAGE_ARGUMENTS))]
        self.num_classes, self.channels = num_classes, channels
        self.stage_settings = stages
        self.depths = tuple(depth)
        widths = [dim * 2 ** i for i in range(len(depth))]

        rates = multiscale.drop_path_rates(drop_path_rate, sum(depth))
        modules, in_dim = [], channels
        for i, (stage, width) in enumerate(zip(stages, widths)):
            layers = []
            for j, rate in enumerate(rates[sum(depth[:i]):sum(depth[:i + 1])]):
                if j % 2 == 0:
                    attention = InteractiveWindowAttention(width, stage['heads'], dropout,
                                                           window_size=stage['window_size'])
                else:
                    key_dim = stage['ssa_dim_key'] if stage['reduction_factor'] > 1 else width // stage['heads']
                    attention = ScalableSelfAttention(width, stage['heads'], dropout,
                                                      reduction=stage['reduction_factor'], key_dim=key_dim)
                feedforward = vit.FeedForward(width, width * ff_expansion_factor, dropout, norm_eps=BLOCK_EPS)
                layers.append((multiscale.DropPath(attention, rate), multiscale.DropPath(feedforward, rate)))
                if j == 0:
                    layers.append((multiscale.PositionEncodingGenerator(width),))
            embed = ConvPatchEmbedding(in_dim, width, kernel_size=7, stride=4) if i == 0 else \
                ConvPatchEmbedding(in_dim, width, kernel_size=3, stride=2)
            modules.append(multiscale.MapStage(embed, multiscale.MapTransformer(layers)))
            in_dim = width
        self.stages = nn.ModuleList(modules)
        self.feature_info = [dict(num_chs=width, reduction=4 * 2 ** i, module=f'stages.{i}')
                             for i, width in enumerate(widths)]

        self.norm = nn.LayerNorm(widths[-1], eps=BLOCK_EPS)
        self.head_hidden = None if head_hidden_dim is None else nn.Sequential(
            nn.Linear(widths[-1], head_hidden_dim), nn.LayerNorm(head_hidden_dim, eps=BLOCK_EPS), nn.GELU())
        self.num_features = widths[-1] if head_hidden_dim is None else head_hidden_dim
        self.mlp_head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else None
        self.apply(multiscale.init_conv_weights)

    def stage_sizes(self, image_size):
        """(h, w) token map of each stage for images of `image_size`."""
        sizes = [tuple(vit.conv_output_size(side, 7, 4, 3) for side in image_size)]
        for _ in self.stages[1:]:
            sizes.append(tuple(vit.conv_output_size(side, 3, 2, 1) for side in sizes[-1]))
        return sizes

    def check_image(self, img):
        """Refuse what is not an image batch, or an image that leaves a stage a map its windows do not divide or
        smaller than its reduction."""
        vit.check_images(img, channels=self.channels, patch_size=(1, 1), dtype=self.norm.weight.dtype)
        image = f"img of {img.shape[-2]}x{img.shape[-1]}"
        for i, (size, stage, depth) in enumerate(zip(self.stage_sizes(img.shape[-2:]), self.stage_settings,
                                                     self.depths)):
            window, reduction = stage['window_size'], stage['reduction_factor']
            if window is not None and (size[0] % window or size[1] % window):
                raise ValueError(f"{image} leaves stage {i} a {size[0]}x{size[1]} map, which its window_size "
                                 f"{window} does not divide; use images whose stage maps the windows divide (each "
                                 f"stage's map is the image / {self.feature_info[i]['reduction']}), or window_size "
                                 f"None there")
            if depth > 1 and min(size) < reduction:
                raise ValueError(f"{image} leaves stage {i} a {size[0]}x{size[1]} map, smaller than its "
                                 f"reduction_factor {reduction}; use images of at least "
                                 f"{reduction * self.feature_info[i]['reduction']} pixels a side")

    def forward_head(self, x, pre_logits=False):
        """Average the tokens and run the head's hidden layer; return those pre-logits (b, num_features), or the
        logits."""
        x = x.mean(dim=1)
        if self.head_hidden is not None:
            x = self.head_hidden(x)
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)


def per_stage(value, stages):
    """A value for every stage, or the tuple of one per stage, as a tuple."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * stages


# the paper's models (the official scalable_vit_*): name -> (dim, depth, heads, ssa_dim_key); reductions
# (8, 4, 2, 1), windows 7, feedforward ratio 4 and a head of hidden width 4096 in all three; ssa_dim_key is
# the official c_ratios times the head width 32
CONFIGS = {
    'small': (64, (2, 2, 20, 2), (2, 4, 8, 16), (40, 40, 40, 32)),
    'base': (96, (2, 2, 14, 6), (3, 6, 12, 24), (64, 40, 40, 32)),
    'large': (128, (2, 6, 12, 4), (4, 8, 16, 32), (8, 16, 32, 32)),
}


def scalable_vit(variant, *, num_classes=1000, **overrides):
    """The paper's ScalableViT `variant` (a key of CONFIGS); keyword arguments of ScalableViT override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, depth, heads, ssa_dim_key = CONFIGS[variant]
    kwargs = dict(dim=dim, depth=depth, heads=heads, ssa_dim_key=ssa_dim_key, reduction_factor=(8, 4, 2, 1),
                  window_size=7, ff_expansion_factor=4, head_hidden_dim=4096)
    return ScalableViT(**{**kwargs, 'num_classes': num_classes, **overrides})


def scalable_vit_small(**kwargs):
    return scalable_vit('small', **kwargs)


def scalable_vit_base(**kwargs):
    return scalable_vit('base', **kwargs)


def scalable_vit_large(**kwargs):
    return scalable_vit('large', **kwargs)


# argument checks


def check_arguments(*, num_classes, dim, depth, ff_expansion_factor, channels, dropout, drop_path_rate,
                    head_hidden_dim, **stage_arguments):
    vit.non_negative_int('num_classes', num_classes)
    vit.positive_int('dim', dim)
    if not isinstance(depth, (tuple, list)) or not depth:
        raise TypeError(f"depth must be a non-empty tuple of blocks per stage, e.g. (2, 2, 20, 2), got {depth!r}")
    for blocks in depth:
        vit.positive_int('depth', blocks)
    vit.positive_int('ff_expansion_factor', ff_expansion_factor)
    vit.positive_int('channels', channels)
    vit.probability('dropout', dropout)
    vit.probability('drop_path_rate', drop_path_rate)
    if head_hidden_dim is not None:
        vit.positive_int('head_hidden_dim', head_hidden_dim)
    stages = len(depth)
    values = {}
    for name, value in stage_arguments.items():
        if isinstance(value, (tuple, list)) and len(value) != stages:
            raise ValueError(f"{name} must be one value or one per stage ({stages} stages in depth), got {value!r}")
        values[name] = per_stage(value, stages)
    for i in range(stages):
        width = dim * 2 ** i
        heads = vit.positive_int('heads', values['heads'][i])
        if width % heads:
            raise ValueError(f"heads {heads} must divide stage {i}'s width {width} (dim * 2 ** {i})")
        head_width = width // heads
        reduction = vit.positive_int('reduction_factor', values['reduction_factor'][i])
        if values['window_size'][i] is not None:
            vit.positive_int('window_size', values['window_size'][i])
        key_dim = vit.positive_int('ssa_dim_key', values['ssa_dim_key'][i])
        if reduction == 1 and key_dim != head_width:
            raise ValueError(f"ssa_dim_key {key_dim} of stage {i} must be its head width {head_width} where "
                             f"reduction_factor is 1 (the official SSA without reduction keeps the head width)")
        for name in ('ssa_dim_value', 'iwsa_dim_key', 'iwsa_dim_value'):
            value = values[name][i]
            if value is not None and vit.positive_int(name, value) != head_width:
                raise ValueError(f"{name} {value} of stage {i} must be its head width {head_width} (width "
                                 f"{width} / {heads} heads), as in the paper; vit-pytorch's other widths are not "
                                 f"ScalableViT's")


# loading checkpoints


IWSA = {'to_qkv.': 'attn.qkv.', 'to_out.0.': 'attn.proj.', 'local_interaction.': 'attn.lim_func.'}
SSA = {'to_q.': 'attn.q.', 'to_k.': 'attn.k.', 'to_v.': 'attn.v.', 'to_out.0.': 'attn.proj.',
       'reduce.0.': 'attn.reduction.0.', 'reduce.1.': 'attn.reduction.1.', 'reduce_norm.0.': 'attn.norm_act.0.'}
FEEDFORWARD = {'net.0.': 'norm2.', 'net.1.': 'mlp.fc1.', 'net.4.': 'mlp.fc2.'}


def official_plan(model, keys):
    """The official ScalableViT (Yangr116/ScalableViT @ 8011147) -> ScalableViT.

    Names differ, values do not, but for SSA without reduction, whose keys and values the official code
    projects together (`attn.kv`, keys first): here they are two Linears. The official code keeps the patch
    embeddings, blocks and PEGs of all stages in three lists (`patch_embeds.i`, `stages.i.j`, `pos_block.i`);
    here each stage holds its own, the PEG as a layer after the first block.
    """
    plain_head = 'head.weight' in keys
    if plain_head != (model.head_hidden is None):
        raise ValueError(f"the checkpoint's head is {'one Linear' if plain_head else 'an MLP'}: build the model "
                         f"with head_hidden_dim={'None' if plain_head else 'its hidden width (4096)'}")
    names = {'norm.': ('norm.', None)}
    if model.head_hidden is not None:
        names.update({'head_hidden.0.': ('head.0.', None), 'head_hidden.1.': ('head.1.', None),
                      'mlp_head.': ('head.3.', None)})
    else:
        names['mlp_head.'] = ('head.', None)
    for i, stage in enumerate(model.stages):
        names[f'stages.{i}.embed.'] = (f'patch_embeds.{i}.', None)
        block = 0
        for index, layer in enumerate(stage.blocks.layers):
            ours = f'stages.{i}.blocks.layers.{index}.'
            if isinstance(layer[0], multiscale.PositionEncodingGenerator):
                names[ours + '0.proj.'] = (f'pos_block.{i}.proj.0.', None)
                continue
            theirs = f'stages.{i}.{block}.'
            attention = layer[0].fn
            names[ours + '0.fn.norm.'] = (theirs + 'norm1.', None)
            if isinstance(attention, InteractiveWindowAttention):
                names.update({ours + '0.fn.' + a: (theirs + b, None) for a, b in IWSA.items()})
            elif attention.reduce is not None:
                names.update({ours + '0.fn.' + a: (theirs + b, None) for a, b in SSA.items()})
            else:
                names.update({ours + '0.fn.to_q.': (theirs + 'attn.q.', None),
                              ours + '0.fn.to_out.0.': (theirs + 'attn.proj.', None),
                              ours + '0.fn.to_k.': (theirs + 'attn.kv.', 0),
                              ours + '0.fn.to_v.': (theirs + 'attn.kv.', 1)})
            names.update({ours + '1.fn.' + a: (theirs + b, None) for a, b in FEEDFORWARD.items()})
            block += 1
    plan = {}
    for key, tensor in model.state_dict().items():
        prefix = next((prefix for prefix in names if key.startswith(prefix)), None)
        if prefix is None:
            raise ValueError(f"the official ScalableViT has no counterpart of {key}")
        theirs, half = names[prefix]
        source = theirs + key[len(prefix):]
        if half is None:
            plan[key] = ({source: tuple(tensor.shape)}, _same)
        else:
            plan[key] = ({source: (2 * tensor.shape[0], *tensor.shape[1:])}, partial(_half, half))
    return plan, ('head.',)


def _same(tensor):
    return tensor


def _half(which, tensor):
    """The keys' (0) or the values' (1) rows of a joint key/value projection."""
    return tensor.chunk(2)[which]


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's ScalableViT computes another function: each unit of its depth is an (SSA, feedforward, IWSA, "
        "feedforward) pair of blocks with SSA first, its local interactive module is a full 3x3 convolution, its keys "
        "and values come from strided convolutions without the depthwise reduction, norm and GELU, its "
        "query/key/value projections have no bias, its norms are channel LayerNorms and its head is one Linear; "
        "ScalableViT (the paper's, the official code's) counts blocks in depth, IWSA first, and has the official SSA "
        "and MLP head")
