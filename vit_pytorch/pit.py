"""PiT: Pooling-based Vision Transformer.

"Rethinking Spatial Dimensions of Vision Transformers", Heo et al., arXiv 2103.16302: give a
ViT the shape of a CNN. Overlapping patches are embedded by a strided convolution; after each
stage a pooling layer halves the token grid with a stride-2 depthwise convolution that
doubles the width (the cls token goes through a Linear of the same widths), so later
stages attend over fewer, wider tokens.

    import torch
    from vit_pytorch.pit import PiT, pit_ti_224

    model = PiT(image_size=64, patch_size=8, num_classes=10, dim=64, depth=(2, 2, 2),
                heads=(2, 4, 8), mlp_dim=256, dropout=0.1, emb_dropout=0.1)
    logits = model(torch.randn(2, 3, 64, 64))             # (2, 10)

    paper_model = pit_ti_224()                             # PiT-Ti, 4,847,272 parameters
    maps = paper_model.forward_intermediates(torch.randn(1, 3, 224, 224))
    [tuple(m.shape) for m in maps]                         # [(1, 64, 27, 27), (1, 128, 14, 14), (1, 256, 7, 7)]

The keyword arguments are vit-pytorch's: `depth` gives the layers of each stage, `heads` one
count or one per stage, and the width doubles from stage to stage (`dim`, `2 dim`, `4 dim`).
Patches of `patch_size` are taken every `patch_size // 2` pixels. The named configurations
(`pit_ti_224`, `pit_xs_224`, `pit_s_224`, `pit_b_224`) are timm's models, whose released
weights load with `vit_pytorch.pretrained.load_timm`.

Known differences: vit-pytorch's PiT gives the cls token a position embedding too and
follows each pooling convolution with a 1x1 convolution; the paper's model (timm's, and this
one) does neither, so vit-pytorch's checkpoints are refused with that reason. `mlp_dim` may
also be one width per stage (the paper's models use 4x each stage's width). timm's distilled
PiTs (`pit_*_distilled_224`) are not built here.
"""

import torch
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import vit

# helpers


def per_stage(value, stages):
    """An int for every stage, or the tuple of one per stage, as a tuple."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * stages


# classes


class Pool(nn.Module):
    """[cls, patches] (b, 1 + h * w, dim) -> (b, 1 + h' * w', dim_out), h' = ceil(h / 2).

    The patches go through a 3x3 depthwise convolution of stride 2 with dim_out / dim filters
    per channel; the cls token through a Linear (PiT section 3.2).
    """

    def __init__(self, dim, dim_out):
        super().__init__()
        self.downsample = nn.Conv2d(dim, dim_out, kernel_size=3, stride=2, padding=1, groups=dim)
        self.cls_ff = nn.Linear(dim, dim_out)

    def forward(self, x, grid):
        cls_token, patches = x[:, :1], x[:, 1:]
        patches = self.downsample(rearrange(patches, 'b (h w) c -> b c h w', h=grid[0], w=grid[1]))
        return torch.cat((self.cls_ff(cls_token), rearrange(patches, 'b c h w -> b (h w) c')), dim=1)


class PiT(nn.Module):
    """PiT with vit-pytorch's keyword arguments.

    Stage i has width `dim * 2 ** i`, `heads[i]` heads of `dim_head` and an MLP of
    `mlp_dim[i]`; only images of `image_size` are accepted (the position table is learned
    for its grid). `num_classes=0` makes `forward` return the pooled embedding (b, width of
    the last stage): the cls token after the final norm.

    Options beyond vit-pytorch's API (the named configurations set the paper's values):
      qkv_bias   bias on the query/key/value projections (True: the paper).
      norm_eps   epsilon of every LayerNorm (1e-6 in the paper's code).

    Recorded attention (`vit_pytorch.recorder.Recorder`): one (b, heads[i], 1 + n_i, 1 + n_i)
    map per layer, in stage order, where n_i is stage i's number of patches (the cls token
    first).

    `forward_features` returns the last stage's tokens [cls, patches] after the final norm, (b, 1 + h * w, width).
    """

    num_prefix_tokens = 1

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, dim_head=64,
                 dropout=0., emb_dropout=0., channels=3, qkv_bias=False, norm_eps=1e-5):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.stride = tuple(side // 2 for side in self.patch_size)
        self.channels, self.num_classes = channels, num_classes
        stages = len(depth)
        heads, mlp_dims = per_stage(heads, stages), per_stage(mlp_dim, stages)
        self.dims = tuple(dim * 2 ** i for i in range(stages))
        self.grid_size = tuple(vit.conv_output_size(size, patch, stride)
                               for size, patch, stride in zip(self.image_size, self.patch_size, self.stride))

        # overlapping patches: a convolution with kernel patch_size and stride patch_size // 2
        self.to_patch_embedding = nn.Conv2d(channels, dim, kernel_size=self.patch_size, stride=self.stride)
        self.pos_embedding = nn.Parameter(torch.zeros(self.grid_size[0] * self.grid_size[1], dim))
        self.cls_token = nn.Parameter(torch.zeros(1, dim))
        nn.init.trunc_normal_(self.pos_embedding, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.dropout = nn.Dropout(emb_dropout)

        self.transformers = nn.ModuleList([
            vit.Transformer(stage_dim, stage_depth, stage_heads, dim_head, stage_mlp, dropout, qkv_bias=qkv_bias,
                        norm_eps=norm_eps, final_norm=False)
            for stage_dim, stage_depth, stage_heads, stage_mlp in zip(self.dims, depth, heads, mlp_dims)
        ])
        self.pools = nn.ModuleList([Pool(dim_in, dim_out) for dim_in, dim_out in zip(self.dims, self.dims[1:])])

        self.norm = nn.LayerNorm(self.dims[-1], eps=norm_eps)
        self.num_features = self.dims[-1]
        self.mlp_head = nn.Linear(self.dims[-1], num_classes) if num_classes > 0 else None

    @property
    def feature_info(self):
        """Channels and stride (as timm counts it: the patch stride, doubled by each pooling) of each stage."""
        return [dict(num_chs=stage_dim, reduction=self.stride[0] * 2 ** i, module=f'transformers.{i}')
                for i, stage_dim in enumerate(self.dims)]

    def embed(self, img):
        """The checked image's [cls, patches] with positions: (b, 1 + h * w, dim), on the first stage's grid."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, dtype=self.cls_token.dtype)
        if tuple(img.shape[-2:]) != self.image_size:
            raise ValueError(f"img must be {self.image_size[0]}x{self.image_size[1]} (h x w), the model's image_size, "
                             f"got {img.shape[-2]}x{img.shape[-1]}: the position table is learned for its grid")
        patches = rearrange(self.to_patch_embedding(img), 'b d h w -> b (h w) d')
        x = torch.cat((repeat(self.cls_token, 'n d -> b n d', b=img.shape[0]), patches + self.pos_embedding), dim=1)
        return self.dropout(x)

    def stage(self, i, x, grid):
        """Stage i (pooling first, after the first stage) on tokens of an (h, w) grid: its tokens and grid."""
        if i > 0:
            x = self.pools[i - 1](x, grid)
            grid = tuple(vit.conv_output_size(side, 3, 2, 1) for side in grid)
        return self.transformers[i](x), grid

    def forward_features(self, img):
        """The last stage's tokens [cls, patches] after the final norm: (b, 1 + h * w, width)."""
        x, grid = self.embed(img), self.grid_size
        for i in range(len(self.transformers)):
            x, grid = self.stage(i, x, grid)
        return self.norm(x)

    def forward_intermediates(self, img, indices=None):
        """Each chosen stage's patch tokens as a map (b, width, h, w), before the final norm (as timm)."""
        chosen = vit.take_indices(indices, len(self.transformers))
        x, grid, maps = self.embed(img), self.grid_size, {}
        for i in range(max(chosen) + 1):
            x, grid = self.stage(i, x, grid)
            maps[i] = rearrange(x[:, 1:], 'b (h w) d -> b d h w', h=grid[0], w=grid[1])
        return [maps[i] for i in chosen]

    def forward_head(self, tokens, pre_logits=False):
        x = tokens[:, 0]
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.cls_token)

    def set_grad_checkpointing(self, enable=True):
        for transformer in self.transformers:
            transformer.grad_checkpointing = enable


# the paper's models (Table 1, timm's pit_*_224): name -> (patch size, width per head, layers per stage,
# heads per stage); patches every patch_size // 2 pixels, MLP 4x each stage's width
CONFIGS = {
    'ti': (16, 32, (2, 6, 4), (2, 4, 8)),
    'xs': (16, 48, (2, 6, 4), (2, 4, 8)),
    's': (16, 48, (2, 6, 4), (3, 6, 12)),
    'b': (14, 64, (3, 6, 4), (4, 8, 16)),
}


def pit(variant, *, image_size=224, num_classes=1000, **overrides):
    """The paper's PiT `variant` (a key of CONFIGS); keyword arguments override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    patch_size, dim_head, depth, heads = CONFIGS[variant]
    kwargs = dict(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim_head * heads[0],
                  depth=depth, heads=heads, dim_head=dim_head, mlp_dim=tuple(4 * dim_head * h for h in heads),
                  qkv_bias=True, norm_eps=1e-6)
    return PiT(**{**kwargs, **overrides})


def pit_ti_224(**kwargs):
    return pit('ti', **kwargs)


def pit_xs_224(**kwargs):
    return pit('xs', **kwargs)


def pit_s_224(**kwargs):
    return pit('s', **kwargs)


def pit_b_224(**kwargs):
    return pit('b', **kwargs)


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, dim_head, dropout,
                    emb_dropout, channels, qkv_bias, norm_eps):
    image_pair, patch_pair = vit.positive_pair('image_size', image_size), vit.positive_pair('patch_size', patch_size)
    vit.patch_grid(image_pair, patch_pair)
    if min(patch_pair) < 2:
        raise ValueError(f"patch_size must be at least 2 (patches are taken every patch_size // 2 pixels), "
                         f"got {patch_size!r}")
    if not isinstance(depth, (tuple, list)) or not depth:
        raise TypeError(f"depth must be a tuple with the number of layers of each stage, e.g. (3, 6, 4), "
                        f"got {depth!r}")
    for value in depth:
        vit.positive_int('depth', value)
    for name, value in dict(heads=heads, mlp_dim=mlp_dim).items():
        if isinstance(value, (tuple, list)) and len(value) != len(depth):
            raise ValueError(f"{name} must be an int or one value per stage ({len(depth)}, as depth), got {value!r}")
        for stage_value in per_stage(value, len(depth)):
            vit.positive_int(name, stage_value)
    for name, value in dict(dim=dim, dim_head=dim_head, channels=channels).items():
        vit.positive_int(name, value)
    vit.non_negative_int('num_classes', num_classes)
    vit.probability('dropout', dropout)
    vit.probability('emb_dropout', emb_dropout)
    vit.boolean('qkv_bias', qkv_bias)
    vit.positive_float('norm_eps', norm_eps)


# loading checkpoints


def timm_plan(model, keys):
    """timm's `PoolingVisionTransformer` (the `pit_*_224` models) -> PiT.

    Names differ, values do not, except: timm's position table is a (1, dim, h, w) map (rows
    of (h w) here) and its cls token carries a leading batch axis.
    """
    if 'head_dist.weight' in keys or 'head_dist.bias' in keys:
        raise ValueError("the checkpoint is a distilled PiT (it has head_dist): this PiT has no distillation "
                         "token or head")
    state = model.state_dict()
    if ('transformers.0.blocks.0.attn.qkv.bias' in keys) != ('transformers.0.layers.0.0.to_qkv.bias' in state):
        has = 'transformers.0.blocks.0.attn.qkv.bias' in keys
        raise ValueError(f"build the model with qkv_bias={has} (the checkpoint's attention "
                         f"{'has' if has else 'has no'} qkv bias)")
    dim, (height, width) = model.dims[0], model.grid_size
    plan = {
        'cls_token': ({'cls_token': (1, 1, dim)}, lambda t: t[0]),
        'pos_embedding': ({'pos_embed': (1, dim, height, width)}, lambda t: rearrange(t, '1 d h w -> (h w) d')),
    }
    names = {'to_patch_embedding.': 'patch_embed.conv.', 'norm.': 'norm.', 'mlp_head.': 'head.'}
    for i, transformer in enumerate(model.transformers):
        if i > 0:
            names[f'pools.{i - 1}.downsample.'] = f'transformers.{i}.pool.conv.'
            names[f'pools.{i - 1}.cls_ff.'] = f'transformers.{i}.pool.fc.'
        for j in range(len(transformer.layers)):
            ours, block = f'transformers.{i}.layers.{j}.', f'transformers.{i}.blocks.{j}.'
            names.update({
                ours + '0.norm.': block + 'norm1.', ours + '0.to_qkv.': block + 'attn.qkv.',
                ours + '0.to_out.0.': block + 'attn.proj.', ours + '1.net.0.': block + 'norm2.',
                ours + '1.net.1.': block + 'mlp.fc1.', ours + '1.net.4.': block + 'mlp.fc2.',
            })
    for key, tensor in state.items():
        if key not in plan:
            prefix = next((prefix for prefix in names if key.startswith(prefix)), None)
            if prefix is None:
                raise ValueError(f"timm's PiT has no counterpart of {key}: build the model with an output "
                                 f"projection in every attention (heads > 1 or dim_head != width)")
            plan[key] = ({names[prefix] + key[len(prefix):]: tuple(tensor.shape)}, lambda t: t)
    return plan, ('head.',)


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's PiT computes another function: it adds a position embedding to the cls token as well "
        "(a (1, 1 + n, dim) table) and follows each pooling's depthwise convolution with a 1x1 convolution, where "
        "PiT (the paper's code, timm's and this one) gives positions to the patches only and pools with the "
        "depthwise convolution alone")
