"""LeViT: a Vision Transformer in ConvNet's clothing, for fast inference.

"LeViT: a Vision Transformer in ConvNet's Clothing for Faster Inference", Graham et al.,
arXiv 2104.01136: a convolutional stem (four stride-2 3x3 convolutions) feeds a pyramid of
attention stages on ever smaller token grids. Every linear map is followed by a BatchNorm
(which folds into it at inference) instead of a LayerNorm before it, activations are
Hardswish, positions enter as a learned attention bias per head for each relative offset
(|dy|, |dx|), and between stages a shrinking attention takes its queries from every other
token of every other row, halving the grid and widening the channels. A second
(distillation) head, trained from a teacher as in DeiT, is averaged with the first at
inference.

    import torch
    from vit_pytorch.levit import LeViT, levit_128s

    model = LeViT(image_size=224, num_classes=1000, stages=3, dim=(256, 384, 512), depth=4,
                  heads=(4, 6, 8), mlp_mult=2, dropout=0.1)
    logits = model(torch.randn(2, 3, 224, 224))           # (2, 1000)

    paper_model = levit_128s().eval()                      # LeViT-128S, 7,777,058 parameters
    logits = paper_model(torch.randn(2, 3, 224, 224))      # the average of its two heads
    maps = paper_model.forward_intermediates(torch.randn(1, 3, 224, 224))
    [tuple(m.shape) for m in maps]                         # [(1, 128, 14, 14), (1, 256, 7, 7), (1, 384, 4, 4)]

The keyword arguments are vit-pytorch's (`dim`, `depth` and `heads` per stage, or one value
for every stage; `dim_key` and `dim_value` per head). The shrinking attention between stages
follows the paper's code: `width / dim_key` heads with values of `4 dim_key`, then an MLP of
twice the width. The named configurations (`levit_128s` ... `levit_384`) are timm's models
(their non-convolutional form, as the released weights are), which load with
`vit_pytorch.pretrained.load_timm`.

With `num_distill_classes` (which must equal `num_classes`: the two heads are averaged)
`forward` returns `(logits, distill_logits)` in training mode and their average in eval mode,
as DeiT's distilled models do; `forward_distill` returns the pair in either mode.

Known differences: vit-pytorch's LeViT is another model (convolutions with biases and no
BatchNorm in the stem and the MLPs, GELU in the attention's output, biases indexed by a
different offset), so its checkpoints are refused with that reason. The heads are the paper's,
BatchNorm then Linear, where vit-pytorch's is a bare Linear: in training mode a batch of one image
has no variance for that BatchNorm, so vit-pytorch's README example (a freshly built model, which
is in training mode, called on one image) raises a ValueError here that says to call
`model.eval()` first. Only images of `image_size` are accepted: the attention biases are learned
for its grids.
"""

import torch
from einops import rearrange
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit

STEM_STRIDE = 16

# helpers


def per_stage(value, stages):
    """vit-pytorch's rule: a value, or a tuple padded with its last value, for each of `stages` stages."""
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    return values + values[-1:] * (stages - len(values))


def halved(grid):
    """The grid of every other row and column, (h, w) -> (ceil(h / 2), ceil(w / 2))."""
    return tuple((side - 1) // 2 + 1 for side in grid)


def conv_norm(dim_in, dim_out):
    """A stride-2 3x3 convolution without bias, then BatchNorm (a step of the stem)."""
    return nn.Sequential(nn.Conv2d(dim_in, dim_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(dim_out))


# classes


class LinearNorm(nn.Module):
    """A Linear without bias, then BatchNorm over the channels of every token: (b, n, dim_in) -> (b, n, dim_out).

    `norm_weight_init=0` starts the block it ends at zero (the residual branches of the paper's code).
    """

    def __init__(self, dim_in, dim_out, norm_weight_init=1.):
        super().__init__()
        self.linear = nn.Linear(dim_in, dim_out, bias=False)
        self.norm = nn.BatchNorm1d(dim_out)
        nn.init.constant_(self.norm.weight, norm_weight_init)

    def forward(self, x):
        x = self.linear(x)
        # (b n) c for the BatchNorm: torch's own views, as this runs ~85 times per image, where two rearrange
        # calls cost ~3% of LeViT-128S's inference and BatchNorm on a (b, c, n) transpose 3x its time
        return self.norm(x.flatten(0, 1)).view_as(x)


def feedforward(dim, hidden_dim, dropout=0.):
    return nn.Sequential(
        LinearNorm(dim, hidden_dim),
        nn.Hardswish(),
        nn.Dropout(dropout),
        LinearNorm(hidden_dim, dim, norm_weight_init=0.),
    )


def offset_index(key_grid, stride):
    """(n_query, n_key) index |dy| * key_width + |dx| into a table of one bias per key position.

    Queries sit on every `stride`-th row and column of the key grid.
    """
    def positions(height, width, step):
        rows, cols = torch.meshgrid(torch.arange(0, height, step), torch.arange(0, width, step), indexing='ij')
        return rows.flatten(), cols.flatten()

    query_rows, query_cols = positions(*key_grid, stride)
    key_rows, key_cols = positions(*key_grid, 1)
    dy = (query_rows[:, None] - key_rows[None, :]).abs()
    dx = (query_cols[:, None] - key_cols[None, :]).abs()
    return dy * key_grid[1] + dx


class Attention(nn.Module):
    """LeViT's attention on the tokens of a `grid`: (b, h * w, dim) -> (b, h * w, dim_out).

    Queries and keys have `dim_key` channels per head, values `dim_value`, all from one
    LinearNorm (per head: q, k, v). The logits get a learned bias per head for each relative
    offset (|dy|, |dx|) (LeViT section 4.3, "attention bias"); the heads' values pass through
    Hardswish and a LinearNorm that starts at zero. No norm before: the residual stream is
    normalised by the BatchNorms. `fused` and `attention_probs` are the recorder's protocol; the fused
    path runs on accelerators only (see `forward`).
    """

    stride = 1

    def __init__(self, dim, *, heads, dim_key, dim_value, grid, dim_out=None, dropout=0., out_norm_weight_init=0.):
        super().__init__()
        self.heads, self.dim_key, self.dim_value = heads, dim_key, dim_value
        self.scale = dim_key ** -0.5
        self.dropout = dropout
        self.fused = True
        self.grid = tuple(grid)

        self.make_projections(dim)
        self.split_heads = Rearrange('b n (h d) -> b h n d', h=heads)
        self.attention_probs = nn.Identity()
        self.merge_heads = Rearrange('b h n d -> b n (h d)')
        self.to_out = nn.Sequential(nn.Hardswish(), LinearNorm(heads * dim_value, dim_out or dim, out_norm_weight_init))
        self.pos_bias = nn.Parameter(torch.zeros(heads, self.grid[0] * self.grid[1]))
        self.register_buffer('pos_bias_index', offset_index(self.grid, self.stride), persistent=False)
        self.to_query_key = Rearrange('h (q k) -> h q k', q=self.pos_bias_index.shape[0])

    def make_projections(self, dim):
        self.to_qkv = LinearNorm(dim, self.heads * (2 * self.dim_key + self.dim_value))

    def qkv(self, x):
        return self.split_heads(self.to_qkv(x)).split((self.dim_key, self.dim_key, self.dim_value), dim=-1)

    def bias(self):
        """The attention bias of every (query, key) pair, (heads, n_query, n_key), from the table of offsets."""
        # index_select on the flat index: ~6x faster than indexing with the (n_query, n_key) index
        return self.to_query_key(self.pos_bias.index_select(1, self.pos_bias_index.flatten()))

    def forward(self, x):
        q, k, v = self.qkv(x)
        # the explicit path on the CPU, where scaled_dot_product_attention runs its math kernel for these shapes
        # (values wider than keys, a float mask): 1.7x slower than the explicit product (torch 2.13, 2.14)
        fused = self.fused and q.device.type != 'cpu'
        out = vit.attend(q, k, v, scale=self.scale, mask=self.bias().to(q.dtype), fused=fused,
                         probs=self.attention_probs, dropout=self.dropout if self.training else 0.)
        return self.to_out(self.merge_heads(out))


class SubsampleAttention(Attention):
    """The shrinking attention between stages: queries from every other row and column of the
    grid, keys and values from all of it, so (b, h * w, dim) -> (b, ceil(h / 2) * ceil(w / 2), dim_out).

    No residual connection goes around it (the widths differ).
    """

    stride = 2

    def make_projections(self, dim):
        self.to_grid = Rearrange('b (h w) c -> b h w c', h=self.grid[0])
        self.to_tokens = Rearrange('b h w c -> b (h w) c')
        self.to_q = LinearNorm(dim, self.heads * self.dim_key)
        self.to_kv = LinearNorm(dim, self.heads * (self.dim_key + self.dim_value))

    def qkv(self, x):
        queries = self.to_tokens(self.to_grid(x)[:, ::2, ::2])          # every other row and column
        k, v = self.split_heads(self.to_kv(x)).split((self.dim_key, self.dim_value), dim=-1)
        return self.split_heads(self.to_q(queries)), k, v


class Subsample(nn.Module):
    """Shrinking attention, then a residual MLP of twice the new width (the paper's code)."""

    def __init__(self, dim, dim_out, *, dim_key, grid, dropout=0.):
        super().__init__()
        self.attn = SubsampleAttention(dim, heads=dim // dim_key, dim_key=dim_key, dim_value=4 * dim_key, grid=grid,
                                       dim_out=dim_out, dropout=dropout, out_norm_weight_init=1.)
        self.ff = feedforward(dim_out, 2 * dim_out, dropout)

    def forward(self, x):
        x = self.attn(x)
        return self.ff(x) + x


def norm_linear(dim, num_classes, dropout=0.):
    """BatchNorm, then a Linear: LeViT's classifier."""
    head = nn.Sequential(nn.BatchNorm1d(dim), nn.Dropout(dropout), nn.Linear(dim, num_classes))
    nn.init.trunc_normal_(head[2].weight, std=0.02)
    nn.init.zeros_(head[2].bias)
    return head


class LeViT(nn.Module):
    """LeViT with vit-pytorch's keyword arguments.

    `stages` stages; stage i has width `dim[i]`, `depth[i]` residual (attention, MLP) layers
    with `heads[i]` heads and an MLP of `mlp_mult` times the width, on a grid of image / 16 /
    2 ** i (rounded up). `num_classes=0` makes `forward` return the pooled embedding
    (b, dim[-1]): the mean of the last stage's tokens.

    Options beyond vit-pytorch's API: `channels`, the input channels.

    Recorded attention (`vit_pytorch.recorder.Recorder`): one (b, heads, n_query, n_key) map
    per attention, in order: stage 0's layers, then for each later stage its shrinking
    attention ((b, dim[i-1] / dim_key, n_i, n_(i-1)), queries on the halved grid) and its layers.

    `forward_features` returns the last stage's tokens, (b, h * w, dim[-1]).
    """

    num_prefix_tokens = 0

    def __init__(self, *, image_size, num_classes, dim, depth, heads, mlp_mult, stages=3, dim_key=32, dim_value=64,
                 dropout=0., num_distill_classes=None, channels=3):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.channels, self.num_classes = vit.pair(image_size), channels, num_classes
        self.dims = dims = per_stage(dim, stages)
        depths, stage_heads = per_stage(depth, stages), per_stage(heads, stages)
        grid = tuple(side // STEM_STRIDE for side in self.image_size)

        self.to_patch_embedding = nn.Sequential(
            conv_norm(channels, dims[0] // 8), nn.Hardswish(),
            conv_norm(dims[0] // 8, dims[0] // 4), nn.Hardswish(),
            conv_norm(dims[0] // 4, dims[0] // 2), nn.Hardswish(),
            conv_norm(dims[0] // 2, dims[0]),
            Rearrange('b c h w -> b (h w) c'),
        )

        self.grids, self.subsamples, self.transformers = [], nn.ModuleList(), nn.ModuleList()
        for i, (stage_dim, stage_depth, stage_head) in enumerate(zip(dims, depths, stage_heads)):
            if i > 0:
                self.subsamples.append(Subsample(dims[i - 1], stage_dim, dim_key=dim_key, grid=grid, dropout=dropout))
                grid = halved(grid)
            self.grids.append(grid)
            self.transformers.append(vit.Stack([
                (Attention(stage_dim, heads=stage_head, dim_key=dim_key, dim_value=dim_value, grid=grid,
                           dropout=dropout),
                 feedforward(stage_dim, stage_dim * mlp_mult, dropout))
                for _ in range(stage_depth)
            ]))

        self.head_dropout, self.distillation = dropout, num_distill_classes is not None
        self.num_features = dims[-1]
        self.mlp_head = norm_linear(dims[-1], num_classes, dropout) if num_classes > 0 else None
        self.distill_head = norm_linear(dims[-1], num_classes, dropout) if self.distillation and num_classes > 0 \
            else None

    @property
    def feature_info(self):
        """Channels and stride of each stage (as timm's `feature_info`)."""
        return [dict(num_chs=stage_dim, reduction=STEM_STRIDE * 2 ** i, module=f'transformers.{i}')
                for i, stage_dim in enumerate(self.dims)]

    def embed(self, img):
        """The checked image through the convolutional stem: tokens (b, h / 16 * w / 16, dim[0])."""
        vit.check_images(img, channels=self.channels, patch_size=(STEM_STRIDE, STEM_STRIDE),
                         dtype=self.to_patch_embedding[0][0].weight.dtype)
        if tuple(img.shape[-2:]) != self.image_size:
            raise ValueError(f"img must be {self.image_size[0]}x{self.image_size[1]} (h x w), the model's image_size, "
                             f"got {img.shape[-2]}x{img.shape[-1]}: the attention biases are learned for its grids")
        # the smallest map a BatchNorm sees: the stem's last (stage 0's grid) or a later stage's grid; counted
        # once img is known to be a batch of images, by its shape (len() would fix an exported graph's batch)
        self.check_training_batch(img.shape[0], min(h * w for h, w in self.grids), where='on its smallest token grid')
        return self.to_patch_embedding(img)

    def stage(self, i, x):
        """Stage i (the shrinking attention first, after the first stage) on the previous stage's tokens."""
        if i > 0:
            x = self.subsamples[i - 1](x)
        return self.transformers[i](x)

    def forward_features(self, img):
        """The last stage's tokens: (b, h * w, dim[-1])."""
        x = self.embed(img)
        for i in range(len(self.transformers)):
            x = self.stage(i, x)
        return x

    def forward_intermediates(self, img, indices=None):
        """Each chosen stage's tokens as a map (b, dim[i], h, w)."""
        chosen = vit.take_indices(indices, len(self.transformers))
        x, maps = self.embed(img), {}
        for i in range(max(chosen) + 1):
            x = self.stage(i, x)
            maps[i] = rearrange(x, 'b (h w) d -> b d h w', h=self.grids[i][0])
        return [maps[i] for i in chosen]

    def forward_head(self, tokens, pre_logits=False):
        """The mean token (`pre_logits=True`); else the logits, or with a distillation head the pair
        in training and their average in eval mode."""
        x = tokens.mean(dim=1)
        if pre_logits or self.mlp_head is None:
            return x
        self.check_training_batch(x.shape[0], 1, where='in its head, on the pooled embedding')
        if self.distill_head is None:
            return self.mlp_head(x)
        logits, distill_logits = self.mlp_head(x), self.distill_head(x)
        return (logits, distill_logits) if self.training else (logits + distill_logits) / 2

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def forward_distill(self, img):
        """`(logits, distill_logits)` from both heads, in any mode."""
        if self.distill_head is None:
            raise ValueError("this LeViT has no distillation head: build it with num_distill_classes=num_classes")
        x = self.forward_features(img).mean(dim=1)
        self.check_training_batch(x.shape[0], 1, where='in its heads, on the pooled embedding')
        return self.mlp_head(x), self.distill_head(x)

    def check_training_batch(self, batch, values, *, where):
        """A ValueError in training mode when a BatchNorm would get one value per channel (`batch` images of
        `values` positions each), which has no variance to normalise by (PyTorch refuses it too, in its words)."""
        if self.training and batch * values == 1:
            raise ValueError(f"LeViT in training mode needs a batch of at least 2 images, got {batch}: its BatchNorm "
                             f"layers normalise each channel by the batch's own mean and variance, and {where} one "
                             f"image gives a single value per channel; call model.eval() to classify a single "
                             f"image (BatchNorm then uses its running statistics)")

    def reset_classifier(self, num_classes):
        """New zero-initialised heads for `num_classes` (the distillation head too, if the model was built with
        one; 0 removes them). The BatchNorm before each head is new as well (timm's `reset_classifier` does the same).
        """
        vit.non_negative_int('num_classes', num_classes)
        like = self.to_patch_embedding[0][0].weight

        def head():
            new = norm_linear(self.dims[-1], num_classes, self.head_dropout).to(like.device, like.dtype)
            new[2] = vit.zero_linear(self.dims[-1], num_classes, like=like)
            return new.train(self.training)

        self.num_classes = num_classes
        self.mlp_head = head() if num_classes > 0 else None
        self.distill_head = head() if num_classes > 0 and self.distillation else None

    def set_grad_checkpointing(self, enable=True):
        for transformer in self.transformers:
            transformer.grad_checkpointing = enable


# the paper's models (Table 2; timm's levit_*): name -> (widths, dim_key, heads, layers per stage);
# values of 2 dim_key, MLPs of twice the width
CONFIGS = {
    '128s': ((128, 256, 384), 16, (4, 6, 8), (2, 3, 4)),
    '128': ((128, 256, 384), 16, (4, 8, 12), (4, 4, 4)),
    '192': ((192, 288, 384), 32, (3, 5, 6), (4, 4, 4)),
    '256': ((256, 384, 512), 32, (4, 6, 8), (4, 4, 4)),
    '384': ((384, 512, 768), 32, (6, 9, 12), (4, 4, 4)),
}


def levit(variant, *, image_size=224, num_classes=1000, distillation=True, **overrides):
    """The paper's LeViT `variant` (a key of CONFIGS), with its distillation head unless
    `distillation=False`; keyword arguments override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dims, dim_key, heads, depth = CONFIGS[variant]
    kwargs = dict(image_size=image_size, num_classes=num_classes, dim=dims, depth=depth, heads=heads, mlp_mult=2,
                  stages=len(dims), dim_key=dim_key, dim_value=2 * dim_key,
                  num_distill_classes=num_classes if distillation and num_classes > 0 else None)
    return LeViT(**{**kwargs, **overrides})


def levit_128s(**kwargs):
    return levit('128s', **kwargs)


def levit_128(**kwargs):
    return levit('128', **kwargs)


def levit_192(**kwargs):
    return levit('192', **kwargs)


def levit_256(**kwargs):
    return levit('256', **kwargs)


def levit_384(**kwargs):
    return levit('384', **kwargs)


# argument checks


def check_arguments(*, image_size, num_classes, dim, depth, heads, mlp_mult, stages, dim_key, dim_value, dropout,
                    num_distill_classes, channels):
    height, width = vit.positive_pair('image_size', image_size)
    if height % STEM_STRIDE or width % STEM_STRIDE:
        raise ValueError(f"image_size must be divisible by {STEM_STRIDE} (the stem's four stride-2 convolutions), "
                         f"got {image_size!r}")
    vit.positive_int('stages', stages)
    for name, value in dict(dim=dim, depth=depth, heads=heads).items():
        if isinstance(value, (tuple, list)) and not 1 <= len(value) <= stages:
            raise ValueError(f"{name} must be an int or a tuple of at most {stages} values (stages={stages}), "
                             f"got {value!r}")
        for stage_value in per_stage(value, stages):
            vit.positive_int(name, stage_value)
    for name, value in dict(mlp_mult=mlp_mult, dim_key=dim_key, dim_value=dim_value, channels=channels).items():
        vit.positive_int(name, value)
    dims = per_stage(dim, stages)
    if dims[0] % 8:
        raise ValueError(f"dim of the first stage must be divisible by 8 (the stem's widths are dim / 8, / 4, / 2), "
                         f"got {dims[0]}")
    if any(stage_dim < dim_key for stage_dim in dims[:-1]):
        raise ValueError(f"dim must be at least dim_key={dim_key} in every stage but the last (the shrinking "
                         f"attention has dim / dim_key heads), got dim={dim!r}")
    vit.non_negative_int('num_classes', num_classes)
    if num_distill_classes is not None and num_distill_classes != num_classes:
        raise ValueError(f"num_distill_classes must be None or num_classes={num_classes} (the two heads are averaged "
                         f"at inference), got {num_distill_classes!r}")
    vit.probability('dropout', dropout)


# loading checkpoints


def timm_plan(model, keys):
    """timm's `Levit` / `LevitDistilled` (the `levit_*` models, and `levit_conv_*`) -> LeViT.

    Names differ, values do not: timm's Linear + BatchNorm pairs, the per-head (q, k, v)
    layout of its qkv projection and its attention-bias tables are ours. The convolutional
    models (`levit_conv_*`) compute the same function with 1x1 convolutions, whose kernels
    become Linear weights.
    """
    has_distill = any(key.startswith('head_dist.') for key in keys)
    if has_distill != (model.distill_head is not None) and model.mlp_head is not None:
        raise ValueError(f"build the model with num_distill_classes={'num_classes' if has_distill else None} (the "
                         f"checkpoint {'has' if has_distill else 'has no'} distillation head)")
    names = {'mlp_head.0.': 'head.bn.', 'mlp_head.2.': 'head.linear.', 'distill_head.0.': 'head_dist.bn.',
             'distill_head.2.': 'head_dist.linear.'}
    for index, step in enumerate((0, 2, 4, 6)):
        names[f'to_patch_embedding.{step}.0.'] = f'stem.conv{index + 1}.linear.'
        names[f'to_patch_embedding.{step}.1.'] = f'stem.conv{index + 1}.bn.'

    def linear_norm(ours, theirs):
        names[ours + '.linear.'], names[ours + '.norm.'] = theirs + '.linear.', theirs + '.bn.'

    def mlp(ours, theirs):
        linear_norm(ours + '.0', theirs + '.ln1')
        linear_norm(ours + '.3', theirs + '.ln2')

    for i, transformer in enumerate(model.transformers):
        if i > 0:
            ours, theirs = f'subsamples.{i - 1}.', f'stages.{i}.downsample.'
            linear_norm(ours + 'attn.to_q', theirs + 'attn_downsample.q.ln')
            linear_norm(ours + 'attn.to_kv', theirs + 'attn_downsample.kv')
            linear_norm(ours + 'attn.to_out.1', theirs + 'attn_downsample.proj.ln')
            names[ours + 'attn.pos_bias'] = theirs + 'attn_downsample.attention_biases'
            mlp(ours + 'ff', theirs + 'mlp')
        for j in range(len(transformer.layers)):
            ours, theirs = f'transformers.{i}.layers.{j}.', f'stages.{i}.blocks.{j}.'
            linear_norm(ours + '0.to_qkv', theirs + 'attn.qkv')
            linear_norm(ours + '0.to_out.1', theirs + 'attn.proj.ln')
            names[ours + '0.pos_bias'] = theirs + 'attn.attention_biases'
            mlp(ours + '1', theirs + 'mlp')
    plan = {}
    for key, tensor in model.state_dict().items():
        prefix = next((prefix for prefix in names if key.startswith(prefix)), None)
        if prefix is None:
            raise ValueError(f"timm's LeViT has no counterpart of {key}")
        theirs = names[prefix] + key[len(prefix):]
        if key.endswith('.linear.weight'):
            # (out, in) or a 1x1 convolution's (out, in, 1, 1); the converted shape is checked against ours
            plan[key] = ({theirs: None}, _linear_weight)
        else:
            plan[key] = ({theirs: tuple(tensor.shape)}, lambda t: t)
    return plan, ('head.', 'head_dist.')


def _linear_weight(weight):
    # timm's levit_conv_* models hold the same weights as 1x1 convolutions: (out, in, 1, 1)
    return weight.flatten(1) if weight.ndim == 4 and weight.shape[-2:] == (1, 1) else weight


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's LeViT is another model: its stem is four convolutions with biases and no BatchNorm or "
        "activation between them, its MLPs are convolutions with biases and no BatchNorm, its attention output "
        "goes through GELU and a biased convolution, its position biases are indexed by |dy| * side + |dx| and "
        "divided by the attention scale, and its shrinking attention has twice the stage's heads, where LeViT "
        "(the paper's code, timm's and this one) uses Linear + BatchNorm pairs and Hardswish throughout")
