"""NesT: Nested Hierarchical Transformer.

"Nested Hierarchical Transformer: Towards Accurate, Data-Efficient and Interpretable Visual
Understanding" (first titled "Aggregating Nested Transformers"), Zhang et al., arXiv 2105.12723:
cut the patch map into square **blocks** and run a plain Transformer in each block independently
(no communication between blocks), then **aggregate**: a 3x3 convolution, a LayerNorm and a 3x3
max-pool of stride 2 halve the map, so that four neighbouring blocks become one, and the next
level (twice as wide) attends within the merged blocks. Every level has the same tokens per block;
the last level is a single block over the whole map.

    import torch
    from vit_pytorch.nest import NesT, nest_tiny

    model = NesT(image_size=32, patch_size=2, num_classes=10, dim=32, heads=2, num_hierarchies=3,
                 block_repeats=(2, 1, 1))
    logits = model(torch.randn(2, 3, 32, 32))                      # (2, 10)
    maps = model.forward_intermediates(torch.randn(2, 3, 32, 32))   # (2, 32, 16, 16), (2, 64, 8, 8), (2, 128, 4, 4)

    paper_model = nest_tiny()                                       # NesT-T, 17,057,608 parameters

The keyword arguments are vit-pytorch's: level i has width `dim * 2 ** i` and `heads * 2 ** i`
heads, `block_repeats` Transformer layers (one int, or one per level), and 4 ** (num_hierarchies
- 1 - i) blocks. The function is the paper's (timm's `Nest`, timm 1.0.31, which follows the
official JAX code), whose checkpoints load with `vit_pytorch.pretrained.load_timm`; `nest_tiny`,
`nest_small` and `nest_base` are its named models (timm's `nest_*`, not the `_jx` ones, whose
convolutions pad as TensorFlow's 'SAME').

Known differences from vit-pytorch 1.26.14's NesT, which computes another function (its
checkpoints are refused with this reason): there, the position embedding is one learned scalar per
token position, shared by all channels and blocks; every LayerNorm is over channels of a 2D map with
epsilon 1e-5; the patch embedding norms its input too; and the query/key/value projection has no
bias. Here, as in the paper, each level has a learned (blocks, tokens, width) position table, and
there is no LayerNorm before the first level. vit-pytorch accepts `dim_head` (default 64) and
ignores it (its heads are the level's width / heads, as here); here it defaults to None and may only
repeat that width, so that a value that would not be used is an error rather than silently dropped.
"""

from functools import partial

import torch
from einops import rearrange
from torch import nn

from vit_pytorch import multiscale, vit

NORM_EPS = 1e-6       # every LayerNorm of the model (the JAX code's, and timm's)

# helpers


def per_level(value, levels):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * levels


# classes


class Aggregate(nn.Module):
    """Block aggregation (NesT, section 3.2): a 3x3 convolution, a LayerNorm over channels and a 3x3 max-pool
    of stride 2, (b, dim, h, w) -> (b, dim_out, h / 2, w / 2)."""

    def __init__(self, dim, dim_out):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim_out, 3, padding=1)
        self.norm = nn.LayerNorm(dim_out, eps=NORM_EPS)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)

    def forward(self, x):
        x = self.norm(rearrange(self.conv(x), 'b d h w -> b h w d'))
        return self.pool(rearrange(x, 'b h w d -> b d h w'))


class Level(nn.Module):
    """One level: aggregation of the previous level (none in the first), then a Transformer run in each
    block independently, (b, c, h, w) -> (b, dim, h', w'). Blocks are `block_size` tokens a side, in
    row-major order; the position table is (blocks, block_size ** 2, dim)."""

    def __init__(self, aggregate, transformer, *, num_blocks, block_size, dim):
        super().__init__()
        self.aggregate = nn.Identity() if aggregate is None else aggregate
        self.block_size = block_size
        self.pos_embedding = nn.Parameter(torch.zeros(num_blocks, block_size ** 2, dim))
        nn.init.trunc_normal_(self.pos_embedding, std=0.02, a=-2, b=2)
        self.transformer = transformer

    def forward(self, x):
        x = self.aggregate(x)
        height, width = x.shape[-2:]
        side = self.block_size
        blocks = rearrange(x, 'b d (nh h) (nw w) -> b (nh nw) (h w) d', h=side, w=side) + self.pos_embedding
        blocks = self.transformer(rearrange(blocks, 'b t n d -> (b t) n d'))
        return rearrange(blocks, '(b nh nw) (h w) d -> b d (nh h) (nw w)', nh=height // side, nw=width // side, h=side)


class NesT(nn.Module):
    """NesT with vit-pytorch's keyword arguments.

    image_size        the side of the square images (the position tables are learned for it); an (h, w)
                      pair with h == w is taken too.
    patch_size        the side of the square patches, embedded by a convolution of that kernel and stride.
    dim, heads        the first level's width and heads; each later level doubles both.
    num_hierarchies   the number of levels; the first has 4 ** (num_hierarchies - 1) blocks.
    block_repeats     Transformer layers of each level (an int: every level).
    mlp_mult          feedforward width over the level's width.
    channels, dropout input channels; dropout on the attention weights, after the attention projection and
                      in the feedforward.
    dim_head          vit-pytorch accepts and ignores it; here None, or each level's width / heads.
    drop_path_rate    stochastic depth of the last layer, growing linearly from 0 (beyond vit-pytorch).
    num_classes=0 makes `forward` return the pooled embedding (b, dim * 2 ** (num_hierarchies - 1)).

    `forward_features` returns the last level's map after the final norm, (b, width, h, w), as
    timm's. Recorder layout: one map per Transformer layer, in level order, of shape (b * blocks,
    heads_i, n, n): n = (image_size / patch_size / 2 ** (num_hierarchies - 1)) ** 2 tokens per
    block at every level, blocks in row-major order, batch outermost.
    """

    num_prefix_tokens = 0

    def __init__(self, *, image_size, patch_size, num_classes, dim, heads, num_hierarchies, block_repeats, mlp_mult=4,
                 channels=3, dim_head=None, dropout=0., drop_path_rate=0.):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size)[0], vit.pair(patch_size)[0]
        image_size, patch_size = self.image_size, self.patch_size
        self.channels, self.num_classes = channels, num_classes
        depths = per_level(block_repeats, num_hierarchies)
        self.dims = tuple(dim * 2 ** i for i in range(num_hierarchies))
        self.num_features = self.dims[-1]
        block_size = image_size // patch_size // 2 ** (num_hierarchies - 1)

        self.to_patch_embedding = nn.Conv2d(channels, dim, patch_size, stride=patch_size)
        rates = multiscale.drop_path_rates(drop_path_rate, sum(depths))
        levels = []
        for i, (width, depth) in enumerate(zip(self.dims, depths)):
            level_heads = heads * 2 ** i
            layers = [(multiscale.DropPath(vit.Attention(width, level_heads, width // level_heads, dropout, qkv_bias=True,
                                              norm_eps=NORM_EPS,
                                              to_out=nn.Sequential(nn.Linear(width, width), nn.Dropout(dropout))),
                                rate),
                       multiscale.DropPath(vit.FeedForward(width, width * mlp_mult, dropout, norm_eps=NORM_EPS), rate))
                      for rate in rates[sum(depths[:i]):sum(depths[:i + 1])]]
            levels.append(Level(Aggregate(self.dims[i - 1], width) if i > 0 else None, vit.Stack(layers),
                                num_blocks=4 ** (num_hierarchies - 1 - i), block_size=block_size, dim=width))
        self.levels = nn.ModuleList(levels)
        self.feature_info = [dict(num_chs=width, reduction=patch_size * 2 ** i, module=f'levels.{i}')
                             for i, width in enumerate(self.dims)]

        self.norm = nn.LayerNorm(self.num_features, eps=NORM_EPS)
        self.mlp_head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else None
        self.apply(init_weights)

    def embed(self, img):
        """The checked image's patch map: (b, dim, h, w)."""
        vit.check_images(img, channels=self.channels, patch_size=(self.patch_size,) * 2, dtype=self.norm.weight.dtype,
                         image_size=(self.image_size,) * 2)
        return self.to_patch_embedding(img)

    def forward_features(self, img):
        """The last level's map after the final norm: (b, width, h, w), as timm's."""
        x = self.embed(img)
        for level in self.levels:
            x = level(x)
        return rearrange(self.norm(rearrange(x, 'b d h w -> b h w d')), 'b h w d -> b d h w')

    def forward_head(self, x, pre_logits=False):
        """Average the map; return the pooled embedding (b, num_features), or the logits."""
        x = x.mean(dim=(-2, -1))
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def forward_intermediates(self, img, indices=None):
        """Each chosen level's output map (b, c, h, w), before the final norm (as timm's): indices None for every
        level, an int n for the last n, or a list of level numbers."""
        chosen = vit.take_indices(indices, len(self.levels), what='level')
        x, maps = self.embed(img), {}
        for i, level in enumerate(self.levels[:max(chosen) + 1]):
            x = maps[i] = level(x)
        return [maps[i] for i in chosen]

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.norm.weight)

    def set_grad_checkpointing(self, enable=True):
        for level in self.levels:
            level.transformer.grad_checkpointing = enable


def init_weights(module):
    """The JAX code's initialisation (and timm's): Linear and convolution weights truncated normal (std 0.02),
    zero biases."""
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        nn.init.trunc_normal_(module.weight, std=0.02, a=-2, b=2)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


# the paper's models (Table A1 as the JAX code builds them, timm's nest_*): name -> (dim, heads, block_repeats);
# 224 px images, patches of 4, three levels
CONFIGS = {
    'tiny': (96, 3, (2, 2, 8)),
    'small': (96, 3, (2, 2, 20)),
    'base': (128, 4, (2, 2, 20)),
}


def nest(variant, *, image_size=224, num_classes=1000, **overrides):
    """The paper's NesT `variant` (a key of CONFIGS); keyword arguments of NesT override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, heads, block_repeats = CONFIGS[variant]
    kwargs = dict(image_size=image_size, patch_size=4, num_classes=num_classes, dim=dim, heads=heads,
                  num_hierarchies=3, block_repeats=block_repeats)
    return NesT(**{**kwargs, **overrides})


def nest_tiny(**kwargs):
    return nest('tiny', **kwargs)


def nest_small(**kwargs):
    return nest('small', **kwargs)


def nest_base(**kwargs):
    return nest('base', **kwargs)


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, heads, num_hierarchies, block_repeats, mlp_mult,
                    channels, dim_head, dropout, drop_path_rate):
    for name, value in dict(dim=dim, heads=heads, num_hierarchies=num_hierarchies, mlp_mult=mlp_mult,
                            channels=channels).items():
        vit.positive_int(name, value)
    image, patch = vit.positive_pair('image_size', image_size), vit.positive_pair('patch_size', patch_size)
    blocks_per_side = 2 ** (num_hierarchies - 1)
    if any(side % (patch_side * blocks_per_side) for side, patch_side in zip(image, patch)):
        raise ValueError(f"image_size {image_size!r} must be divisible by patch_size {patch_size!r} times "
                         f"2 ** (num_hierarchies - 1) = {blocks_per_side} (the first level's blocks per side), so that "
                         f"each aggregation halves whole blocks")
    for name, (height, width) in dict(image_size=image, patch_size=patch).items():
        if height != width:
            raise ValueError(f"{name} must be square (an int), as the blocks are, got {(height, width)}")
    vit.non_negative_int('num_classes', num_classes)
    if isinstance(block_repeats, (tuple, list)) and len(block_repeats) != num_hierarchies:
        raise ValueError(f"block_repeats must be an int or one per level ({num_hierarchies}, num_hierarchies), "
                         f"got {block_repeats!r}")
    for value in per_level(block_repeats, num_hierarchies):
        vit.positive_int('block_repeats', value)
    if dim % heads:
        raise ValueError(f"heads {heads} must divide dim {dim}")
    if dim_head is not None:
        vit.positive_int('dim_head', dim_head)
        if dim_head != dim // heads:
            raise ValueError(f"dim_head {dim_head} must be each level's width / heads = {dim // heads} (vit-pytorch "
                             f"ignores it); leave it out")
    vit.probability('dropout', dropout)
    vit.probability('drop_path_rate', drop_path_rate)


# loading checkpoints


LAYER = {'0.fn.norm.': 'norm1.', '0.fn.to_qkv.': 'attn.qkv.', '0.fn.to_out.0.': 'attn.proj.',
         '1.fn.net.0.': 'norm2.', '1.fn.net.1.': 'mlp.fc1.', '1.fn.net.4.': 'mlp.fc2.'}


def timm_plan(model, keys):
    """timm's `Nest` (`nest_tiny`, `nest_small`, `nest_base`) -> NesT.

    Names differ, values do not, except: the position tables carry a leading batch axis there, and the
    attention's output projection reads the heads' outputs concatenated channel by channel, (d h), as
    the JAX code does (head by head, (h d), here).
    """
    names = {'to_patch_embedding.': 'patch_embed.proj.', 'norm.': 'norm.', 'mlp_head.': 'head.'}
    plan = {}
    for i, level in enumerate(model.levels):
        names[f'levels.{i}.aggregate.conv.'] = f'levels.{i}.pool.conv.'
        names[f'levels.{i}.aggregate.norm.'] = f'levels.{i}.pool.norm.'
        for j, (attention, _) in enumerate(level.transformer.layers):
            names.update({f'levels.{i}.transformer.layers.{j}.{a}': f'levels.{i}.transformer_encoder.{j}.{b}'
                          for a, b in LAYER.items()})
            # the reference concatenates the heads' outputs channel by channel, (d h), where ours are head by head
            projection = attention.fn.to_out[0].weight
            plan[f'levels.{i}.transformer.layers.{j}.0.fn.to_out.0.weight'] = (
                {f'levels.{i}.transformer_encoder.{j}.attn.proj.weight': tuple(projection.shape)},
                partial(_heads_outermost, heads=attention.fn.heads))
        plan[f'levels.{i}.pos_embedding'] = ({f'levels.{i}.pos_embed': (1, *level.pos_embedding.shape)}, _first)
    vit.prefixed_plan(model.state_dict(), names, "timm's NesT", plan)
    return plan, ('head.',)


def _heads_outermost(weight, *, heads):
    return rearrange(weight, 'o (d h) -> o (h d)', h=heads)


def _first(tensor):
    return tensor[0]


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's NesT computes another function: its position embedding is one learned scalar per token "
        "position shared by all channels and blocks, its LayerNorms are over the channels of 2D maps with epsilon "
        "1e-5 (one of them before the patch projection), and its query/key/value projection has no bias; NesT (the "
        "paper's, timm's) learns a (blocks, tokens, width) position table per level")
