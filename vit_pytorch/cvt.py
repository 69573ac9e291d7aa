"""CvT: Convolutional vision Transformers.

"CvT: Introducing Convolutions to Vision Transformers", Wu et al., arXiv 2103.15808: three
stages, each opened by a strided, overlapping convolution over the previous stage's map
(the convolutional token embedding, then a LayerNorm), so the grid shrinks and the width
grows as in a CNN. Inside the stages the queries, keys and values are projected by depthwise
3x3 convolutions with BatchNorm over the token map before their linear maps (the
convolutional projection); keys and values are taken with stride 2, four times fewer. There
is no position embedding: the convolutions carry the positions, so any image size works. A
cls token joins the last stage and is classified.

    import torch
    from vit_pytorch.cvt import CvT, cvt_13

    model = CvT(num_classes=1000)                          # vit-pytorch's CvT: CvT-13's widths and depths
    logits = model(torch.randn(2, 3, 64, 64))             # (2, 1000): any image size

    paper_model = cvt_13()                                 # CvT-13, 19,997,480 parameters
    maps = paper_model.forward_intermediates(torch.randn(1, 3, 96, 96))
    [tuple(m.shape) for m in maps]                         # [(1, 64, 24, 24), (1, 192, 12, 12), (1, 384, 6, 6)]

The keyword arguments are vit-pytorch's: `s1_...`, `s2_...`, `s3_...` configure each stage
(`emb_dim`, `emb_kernel`, `emb_stride` of the token embedding, `proj_kernel` and
`kv_proj_stride` of the convolutional projection, `heads`, `depth`, `mlp_mult`). The named
configurations (`cvt_13`, `cvt_21`) are the paper's models as Hugging Face's
`CvtForImageClassification` builds them, whose weights load with `vit_pytorch.pretrained.load_hf`
(the `model.safetensors` file or the state_dict; see `load_hf`).

Known differences: as in the paper's code (and Hugging Face's), attention logits are scaled by
1 / sqrt(width), not 1 / sqrt(width per head), and the cls token skips the convolutional
projection. vit-pytorch's CvT is another model (one convolution for both keys and values, heads
of 64 channels, no cls token, no final norm), so its checkpoints are refused with that reason.
Stochastic depth (the reference's `drop_path_rate`) is not built.
"""

import torch
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit

STAGE_ARGUMENTS = ('emb_dim', 'emb_kernel', 'emb_stride', 'emb_padding', 'proj_kernel', 'kv_proj_stride', 'heads',
                   'depth', 'mlp_mult')

# helpers


def stage_configs(arguments):
    """The three stages' settings, [{'emb_dim': ..., ...}] from the arguments named s1_..., s2_..., s3_..."""
    return [{name: arguments[f's{stage}_{name}'] for name in STAGE_ARGUMENTS} for stage in (1, 2, 3)]


def embedding_padding(config):
    return config['emb_kernel'] // 2 if config['emb_padding'] is None else config['emb_padding']


def conv_projection(dim, kernel, stride):
    """Depthwise convolution (no bias) and BatchNorm over the token map: (b, dim, h, w) -> (b, h' * w', dim)."""
    return nn.Sequential(
        nn.Conv2d(dim, dim, kernel, stride=stride, padding=kernel // 2, groups=dim, bias=False),
        nn.BatchNorm2d(dim),
        Rearrange('b c h w -> b (h w) c'),
    )


# classes


class ConvEmbedding(nn.Module):
    """The convolutional token embedding: a strided convolution, then a LayerNorm over the channels.

    (b, c, h, w) -> tokens (b, h' * w', dim) and their grid (h', w').
    """

    def __init__(self, channels, dim, kernel, stride, padding):
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, kernel, stride=stride, padding=padding)
        self.to_tokens = Rearrange('b c h w -> b (h w) c')
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        x = self.proj(x)
        return self.norm(self.to_tokens(x)), tuple(x.shape[-2:])


class ConvAttention(nn.Module):
    """Pre-norm attention with convolutional projections, (b, prefix + h * w, dim) -> the same shape.

    The normed patch tokens are laid on their grid; q, k and v each come from a depthwise conv
    and BatchNorm (k and v with stride `kv_proj_stride`), then a Linear. Prefix tokens (the cls
    token) skip the convolutions and join q, k and v as they are (CvT section 3.2). `fused` and
    `attention_probs` are the recorder's protocol. Reshapes of known sizes are layers, which
    torch.compile traces far faster than `rearrange` calls.
    """

    def __init__(self, dim, heads, *, proj_kernel, kv_proj_stride, dropout=0., qkv_bias=False, num_prefix_tokens=0):
        super().__init__()
        self.heads = heads
        self.scale = dim ** -0.5            # the paper's code scales by the full width
        self.dropout = dropout
        self.fused = True
        self.num_prefix_tokens = num_prefix_tokens

        self.norm = nn.LayerNorm(dim)
        self.to_q_conv = conv_projection(dim, proj_kernel, 1)
        self.to_k_conv = conv_projection(dim, proj_kernel, kv_proj_stride)
        self.to_v_conv = conv_projection(dim, proj_kernel, kv_proj_stride)
        self.to_q = nn.Linear(dim, dim, bias=qkv_bias)
        self.to_k = nn.Linear(dim, dim, bias=qkv_bias)
        self.to_v = nn.Linear(dim, dim, bias=qkv_bias)
        self.split_heads = Rearrange('b n (h d) -> b h n d', h=heads)
        self.attention_probs = nn.Identity()
        self.merge_heads = Rearrange('b h n d -> b n (h d)')
        self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(dropout))

    def qkv(self, x, grid):
        """Queries (b, heads, prefix + h * w, d), keys and values (b, heads, prefix + h' * w', d)."""
        x = self.norm(x)
        prefix, patches = x[:, :self.num_prefix_tokens], x[:, self.num_prefix_tokens:]
        token_map = rearrange(patches, 'b (h w) c -> b c h w', h=grid[0], w=grid[1])
        return [self.split_heads(linear(torch.cat((prefix, conv(token_map)), dim=1)))
                for conv, linear in ((self.to_q_conv, self.to_q), (self.to_k_conv, self.to_k),
                                     (self.to_v_conv, self.to_v))]

    def forward(self, x, *, grid):
        q, k, v = self.qkv(x, grid)
        out = vit.attend(q, k, v, scale=self.scale, fused=self.fused, probs=self.attention_probs,
                         dropout=self.dropout if self.training else 0.)
        return self.to_out(self.merge_heads(out))


class CvT(nn.Module):
    """CvT with vit-pytorch's keyword arguments.

    Stage i embeds the previous map with an `si_emb_kernel` convolution of stride
    `si_emb_stride` to `si_emb_dim` channels, then runs `si_depth` layers of convolutional
    attention (`si_heads` heads) and an MLP of `si_mlp_mult` times the width. Any image size
    that leaves every stage at least one token works. `num_classes=0` makes `forward` return
    the pooled embedding (b, s3_emb_dim): the cls token, or without one the mean token, after
    the final norm.

    Options beyond vit-pytorch's API (the named configurations set the paper's values):
      s1_emb_padding, s2_emb_padding, s3_emb_padding
                 padding of each token embedding (None: emb_kernel // 2, vit-pytorch's; the
                 paper's code pads the first 7x7 embedding by 2).
      cls_token  a cls token joins the last stage and is classified (the paper's models);
                 otherwise the mean of the last stage's tokens is.
      qkv_bias   bias on the query/key/value Linear maps (True: the paper).

    Recorded attention (`vit_pytorch.recorder.Recorder`): one (b, heads, p + h * w, p + h' * w')
    map per layer, in stage order, where (h, w) is the stage's grid, (h', w') the grid of its
    strided keys and p = 1 in the last stage with a cls token (first), else 0.

    `forward_features` returns the last stage's tokens after the final norm, (b, prefix + h * w, s3_emb_dim) (prefix
    1 with cls_token=True, else 0).
    """

    def __init__(self, *, num_classes, s1_emb_dim=64, s1_emb_kernel=7, s1_emb_stride=4, s1_proj_kernel=3,
                 s1_kv_proj_stride=2, s1_heads=1, s1_depth=1, s1_mlp_mult=4, s2_emb_dim=192, s2_emb_kernel=3,
                 s2_emb_stride=2, s2_proj_kernel=3, s2_kv_proj_stride=2, s2_heads=3, s2_depth=2, s2_mlp_mult=4,
                 s3_emb_dim=384, s3_emb_kernel=3, s3_emb_stride=2, s3_proj_kernel=3, s3_kv_proj_stride=2, s3_heads=6,
                 s3_depth=10, s3_mlp_mult=4, dropout=0., channels=3, s1_emb_padding=None, s2_emb_padding=None,
                 s3_emb_padding=None, cls_token=False, qkv_bias=False):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.configs = stage_configs(vit.arguments(locals()))
        self.channels, self.num_classes = channels, num_classes
        self.dims = tuple(config['emb_dim'] for config in self.configs)
        self.num_prefix_tokens = int(cls_token)

        self.embeddings, self.transformers = nn.ModuleList(), nn.ModuleList()
        dim_in = channels
        for i, config in enumerate(self.configs):
            dim, prefix = config['emb_dim'], self.num_prefix_tokens if i == len(self.configs) - 1 else 0
            self.embeddings.append(ConvEmbedding(dim_in, dim, config['emb_kernel'], config['emb_stride'],
                                                 embedding_padding(config)))
            self.transformers.append(vit.Stack([
                (ConvAttention(dim, config['heads'], proj_kernel=config['proj_kernel'],
                               kv_proj_stride=config['kv_proj_stride'], dropout=dropout, qkv_bias=qkv_bias,
                               num_prefix_tokens=prefix),
                 vit.FeedForward(dim, dim * config['mlp_mult'], dropout))
                for _ in range(config['depth'])
            ]))
            dim_in = dim
        if cls_token:
            self.cls_token = nn.Parameter(torch.zeros(1, self.dims[-1]))
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        else:
            self.cls_token = None

        self.norm = nn.LayerNorm(self.dims[-1])
        self.num_features = self.dims[-1]
        self.mlp_head = nn.Linear(self.dims[-1], num_classes) if num_classes > 0 else None

    @property
    def feature_info(self):
        """Channels and stride of each stage (the product of the embeddings' strides so far)."""
        info, reduction = [], 1
        for i, config in enumerate(self.configs):
            reduction *= config['emb_stride']
            info.append(dict(num_chs=config['emb_dim'], reduction=reduction, module=f'transformers.{i}'))
        return info

    def grids(self, image_size):
        """The (h, w) token grid of every stage for images of `image_size` (h, w)."""
        grids, grid = [], tuple(image_size)
        for config in self.configs:
            grid = tuple(vit.conv_output_size(side, config['emb_kernel'], config['emb_stride'], embedding_padding(config))
                         for side in grid)
            grids.append(grid)
        return grids

    def check(self, img):
        vit.check_images(img, channels=self.channels, patch_size=(1, 1), dtype=self.norm.weight.dtype)
        grids = self.grids(img.shape[-2:])
        if min(min(grid) for grid in grids) < 1:
            raise ValueError(f"img of {img.shape[-2]}x{img.shape[-1]} is too small: the token embeddings leave "
                             f"grids {grids}; every stage needs at least one token")

    def stage(self, i, x):
        """Stage i on the previous stage's map (the image for i = 0): its tokens [cls, patches] and grid."""
        x, grid = self.embeddings[i](x)
        if i == len(self.transformers) - 1 and self.cls_token is not None:
            x = torch.cat((repeat(self.cls_token, 'n d -> b n d', b=x.shape[0]), x), dim=1)
        return self.transformers[i](x, grid=grid), grid

    def to_map(self, x, grid):
        """The patch tokens of a stage's output as a map (b, dim, h, w)."""
        return rearrange(x[:, x.shape[1] - grid[0] * grid[1]:], 'b (h w) d -> b d h w', h=grid[0], w=grid[1])

    def forward_features(self, img):
        """The last stage's tokens [cls, patches] after the final norm: (b, prefix + h * w, s3_emb_dim)."""
        self.check(img)
        x = img
        for i in range(len(self.transformers)):
            x, grid = self.stage(i, x)
            if i < len(self.transformers) - 1:
                x = self.to_map(x, grid)
        return self.norm(x)

    def forward_intermediates(self, img, indices=None):
        """Each chosen stage's patch tokens as a map (b, dim, h, w): Hugging Face's `hidden_states`."""
        self.check(img)
        chosen = vit.take_indices(indices, len(self.transformers))
        x, maps = img, {}
        for i in range(max(chosen) + 1):
            x, grid = self.stage(i, x)
            x = maps[i] = self.to_map(x, grid)
        return [maps[i] for i in chosen]

    def forward_head(self, tokens, pre_logits=False):
        x = tokens[:, 0] if self.cls_token is not None else tokens.mean(dim=1)
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.norm.weight)

    def set_grad_checkpointing(self, enable=True):
        for transformer in self.transformers:
            transformer.grad_checkpointing = enable


# the paper's models (Table 2), as Hugging Face's CvtConfig builds them: name -> layers per stage; widths 64,
# 192, 384 with 1, 3, 6 heads, embeddings 7x7/4 (padding 2), 3x3/2, 3x3/2, a cls token in the last stage
CONFIGS = {
    '13': (1, 2, 10),
    '21': (1, 4, 16),
}


def cvt(variant, *, num_classes=1000, **overrides):
    """The paper's CvT `variant` (a key of CONFIGS); keyword arguments override."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    depths = CONFIGS[variant]
    kwargs = dict(num_classes=num_classes, s1_emb_padding=2, cls_token=True, qkv_bias=True,
                  **{f's{stage}_depth': depth for stage, depth in zip((1, 2, 3), depths)})
    return CvT(**{**kwargs, **overrides})


def cvt_13(**kwargs):
    return cvt('13', **kwargs)


def cvt_21(**kwargs):
    return cvt('21', **kwargs)


# argument checks


def check_arguments(*, num_classes, dropout, channels, cls_token, qkv_bias, **stages):
    vit.non_negative_int('num_classes', num_classes)
    vit.probability('dropout', dropout)
    vit.positive_int('channels', channels)
    vit.boolean('cls_token', cls_token)
    vit.boolean('qkv_bias', qkv_bias)
    for stage, config in zip((1, 2, 3), stage_configs(stages)):
        for name in ('emb_dim', 'emb_kernel', 'emb_stride', 'proj_kernel', 'kv_proj_stride', 'heads', 'depth',
                     'mlp_mult'):
            vit.positive_int(f's{stage}_{name}', config[name])
        if config['emb_padding'] is not None:
            vit.non_negative_int(f's{stage}_emb_padding', config['emb_padding'])
        if config['proj_kernel'] % 2 == 0:
            raise ValueError(f"s{stage}_proj_kernel must be odd (the query projection keeps the grid), "
                             f"got {config['proj_kernel']}")
        if config['emb_dim'] % config['heads']:
            raise ValueError(f"s{stage}_emb_dim must be divisible by s{stage}_heads (heads split the width), "
                             f"got {config['emb_dim']} and {config['heads']}")


# loading checkpoints


def hf_plan(model, keys):
    """Hugging Face `CvtForImageClassification` / `CvtModel` -> CvT.

    Names differ, values do not, except that the cls token carries a leading batch axis.
    """
    # the encoder sits under `cvt.encoder.` (CvtForImageClassification) or `encoder.` (CvtModel)
    anchor = 'stages.0.embedding.convolution_embeddings.projection.weight'
    anchors = [key for key in keys if key.endswith('encoder.' + anchor)]
    p = anchors[0][:-len(anchor)] if anchors else 'cvt.encoder.'
    last = len(model.transformers) - 1
    has_cls = f'{p}stages.{last}.cls_token' in keys
    if has_cls != (model.cls_token is not None):
        raise ValueError(f"build the model with cls_token={has_cls} (the checkpoint's last stage "
                         f"{'has' if has_cls else 'has no'} cls token)")
    first = f'{p}stages.0.layers.0.attention.attention.projection_query.'
    ours_biased = model.transformers[0].layers[0][0].to_q.bias is not None
    if first + 'weight' in keys and (first + 'bias' in keys) != ours_biased:
        raise ValueError(f"build the model with qkv_bias={first + 'bias' in keys} (the checkpoint's projections "
                         f"{'have' if first + 'bias' in keys else 'have no'} bias)")
    plan = {}
    if has_cls:
        plan['cls_token'] = ({f'{p}stages.{last}.cls_token': (1, 1, model.dims[-1])}, lambda t: t[0])
    names = {'norm.': 'layernorm.', 'mlp_head.': 'classifier.'}
    for i, transformer in enumerate(model.transformers):
        stage = f'{p}stages.{i}.'
        names[f'embeddings.{i}.proj.'] = stage + 'embedding.convolution_embeddings.projection.'
        names[f'embeddings.{i}.norm.'] = stage + 'embedding.convolution_embeddings.normalization.'
        for j in range(len(transformer.layers)):
            ours, theirs = f'transformers.{i}.layers.{j}.', f'{stage}layers.{j}.'
            attention = theirs + 'attention.attention.'
            names[ours + '0.norm.'] = theirs + 'layernorm_before.'
            for short, long in (('q', 'query'), ('k', 'key'), ('v', 'value')):
                conv = f'{attention}convolution_projection_{long}.convolution_projection.'
                names[ours + f'0.to_{short}_conv.0.'] = conv + 'convolution.'
                names[ours + f'0.to_{short}_conv.1.'] = conv + 'normalization.'
                names[ours + f'0.to_{short}.'] = f'{attention}projection_{long}.'
            names.update({
                ours + '0.to_out.0.': theirs + 'attention.output.dense.',
                ours + '1.net.0.': theirs + 'layernorm_after.',
                ours + '1.net.1.': theirs + 'intermediate.dense.',
                ours + '1.net.4.': theirs + 'output.dense.',
            })
    vit.prefixed_plan(model.state_dict(), names, "Hugging Face's CvT", plan)
    return plan, ('classifier.',)


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's CvT is another model: one depthwise convolution feeds both keys and values (CvT: one each), "
        "its heads have 64 channels whatever the width (CvT: width / heads) and are scaled by 1 / sqrt(64), its "
        "token embedding pads the 7x7 convolution by 3, and it has no cls token and no norm before its head")
