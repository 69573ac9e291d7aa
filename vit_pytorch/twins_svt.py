"""Twins: Twins-SVT and Twins-PCPVT.

"Twins: Revisiting the Design of Spatial Attention in Vision Transformers", Chu et al., arXiv
2104.13840: a four-stage pyramid (strided patch embeddings between stages) whose blocks alternate
**locally-grouped self-attention** (LSA: attention within non-overlapping windows of the token
map) and **global sub-sampled attention** (GSA: every token attends to the map shrunk by a strided
convolution, one key per window), with a **position encoding generator** (CPVT's PEG, a residual
3x3 depthwise convolution on the map) after each stage's first block instead of a position table.
Twins-PCPVT is PVT with the PEG: every block global sub-sampled; here it is the configuration
without local windows (`sN_local_patch_size=None`).

    import torch
    from vit_pytorch.twins_svt import TwinsSVT, twins_svt_small

    model = TwinsSVT(num_classes=10, s1_emb_dim=16, s1_depth=2, s1_local_patch_size=4, s1_global_k=4, s1_heads=1,
                     s2_emb_dim=32, s2_depth=2, s2_local_patch_size=4, s2_global_k=2, s2_heads=2,
                     s3_emb_dim=48, s3_depth=2, s3_local_patch_size=2, s3_global_k=1, s3_heads=2,
                     s4_emb_dim=64, s4_depth=2, s4_local_patch_size=2, s4_global_k=1, s4_heads=4)
    logits = model(torch.randn(2, 3, 64, 64))                      # (2, 10)
    maps = model.forward_intermediates(torch.randn(2, 3, 64, 64))   # 16x16, 8x8, 4x4, 2x2 maps

    paper_model = twins_svt_small()                                 # Twins-SVT-S, 24,060,776 parameters

The keyword arguments are vit-pytorch's (`sN_emb_dim`, `sN_patch_size`, `sN_local_patch_size`
(the LSA window), `sN_global_k` (the GSA sub-sampling), `sN_depth`, `peg_kernel_size`,
`dropout`), with `sN_heads`, `sN_mlp_mult`, `channels` and `drop_path_rate` added; the function
is the paper's (timm's `Twins`, timm 1.0.31), whose checkpoints load with
`vit_pytorch.pretrained.load_timm`. The defaults build Twins-SVT-S.

Known differences from vit-pytorch 1.26.14's TwinsSVT, which computes another function (its
checkpoints are refused with this reason): there, `sN_depth` counts (local, global) pairs after
an extra pair placed before the PEG, the last stage has no local attention, every attention has
8 heads of 64 whatever the width and no query/key/value bias, keys and values come from one
strided convolution without a norm, and the patch embedding norms its input too. Here, as in
the paper, `sN_depth` is the stage's number of blocks (local and global alternating, local
first). The defaults differ for that reason too: vit-pytorch's (`sN_global_k` 7 in every stage,
`sN_depth` 1, 1, 5, 4 of its pairs) count its units; here they build the paper's Twins-SVT-S
(sub-sampling 8, 4, 2, 1; 2, 2, 10, 4 blocks). As in timm, an LSA window larger than the map, or a map the windows do not divide, is
zero-padded at its bottom and right (after the block's norm) and the padding tokens are keys like
any other.
"""

import torch
from einops import rearrange
from torch import nn

from vit_pytorch import multiscale, vit

BLOCK_EPS = 1e-6      # the blocks' and the final LayerNorm (the patch embeddings' and reductions': 1e-5)
STAGE_ARGUMENTS = ('emb_dim', 'patch_size', 'local_patch_size', 'global_k', 'depth', 'heads', 'mlp_mult')


# classes


class PatchEmbedding(nn.Module):
    """(b, c, h, w) -> (b, h // p, w // p, dim): a convolution of kernel and stride p (the map's last rows and
    columns that do not fill a patch are dropped), then a LayerNorm."""

    def __init__(self, channels, dim, patch_size):
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(rearrange(self.proj(x), 'b d h w -> b h w d'))


class LocallyGroupedAttention(vit.Attention):
    """LSA: pre-norm attention within non-overlapping windows of the map, (b, h * w, dim) tokens of an
    (h, w) map -> (b, h * w, dim). The recorded map is (b * windows, heads, wh * ww, wh * ww), windows
    in row-major order of the map zero-padded to whole windows, batch outermost."""

    def __init__(self, dim, heads, dropout=0., *, window_size, proj_dropout=0.):
        super().__init__(dim, heads, dim // heads, dropout, qkv_bias=True, norm_eps=BLOCK_EPS,
                         to_out=nn.Sequential(nn.Linear(dim, dim), nn.Dropout(proj_dropout)))
        window = (window_size, window_size)
        self.windows = multiscale.ShiftedWindows(window, (0, 0), window)

    def forward(self, x, size):
        windows = self.windows.split(rearrange(self.norm(x), 'b (h w) d -> b h w d', h=size[0], w=size[1]))
        q, k, v = rearrange(self.to_qkv(windows), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=self.heads)
        out = self.windows.merge(rearrange(self.attend(q, k, v), 'b h n d -> b n (h d)'), size)
        return self.to_out(rearrange(out, 'b h w d -> b (h w) d'))


class TwinsSVT(multiscale.StagedModel):
    """Twins-SVT (and, without local windows, Twins-PCPVT) with vit-pytorch's keyword arguments.

    For each stage N in 1..4:
      sN_emb_dim          its width.
      sN_patch_size       the stride (and kernel) of its patch embedding.
      sN_local_patch_size the side of its LSA windows; None: no local attention, every block global
                          (Twins-PCPVT).
      sN_global_k         the sub-sampling of its GSA keys (1: none).
      sN_depth            its number of blocks: local and global alternating, local first.
      sN_heads            its attention heads (beyond vit-pytorch, which has 8 of 64 in every stage); None:
                          heads of 32 channels (the paper's SVT) where 32 divides the width, else one.
      sN_mlp_mult         its feedforward width over its width (beyond vit-pytorch).
    peg_kernel_size       the PEG's depthwise convolution (odd).
    dropout               on the attention weights, after the attention projection and in the feedforward.
    channels, drop_path_rate  input channels; stochastic depth of the last block, growing linearly from 0.
    num_classes=0 makes `forward` return the pooled embedding (b, s4_emb_dim).

    `forward_features` returns the last stage's tokens after the final norm, (b, h * w, s4_emb_dim),
    as timm's. Recorder layout: one map per block, in stage and block order: LSA blocks (b *
    windows, heads, wh * ww, wh * ww) (see `LocallyGroupedAttention`), GSA blocks (b, heads, h * w,
    m), m the sub-sampled keys (h // k) * (w // k).
    """

    num_prefix_tokens = 0

    def __init__(self, *, num_classes, s1_emb_dim=64, s1_patch_size=4, s1_local_patch_size=7, s1_global_k=8,
                 s1_depth=2, s1_heads=None, s1_mlp_mult=4, s2_emb_dim=128, s2_patch_size=2, s2_local_patch_size=7,
                 s2_global_k=4, s2_depth=2, s2_heads=None, s2_mlp_mult=4, s3_emb_dim=256, s3_patch_size=2,
                 s3_local_patch_size=7, s3_global_k=2, s3_depth=10, s3_heads=None, s3_mlp_mult=4, s4_emb_dim=512,
                 s4_patch_size=2, s4_local_patch_size=7, s4_global_k=1, s4_depth=4, s4_heads=None, s4_mlp_mult=4,
                 peg_kernel_size=3, dropout=0., channels=3, drop_path_rate=0.):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        settings = vit.arguments(locals())
        stages = [{name: settings[f's{i}_{name}'] for name in STAGE_ARGUMENTS} for i in range(1, 5)]
        for stage in stages:
            stage['heads'] = default_heads(stage['emb_dim']) if stage['heads'] is None else stage['heads']
        self.num_classes, self.channels = num_classes, channels
        self.stage_settings = stages
        self.num_features = s4_emb_dim

        depths = [stage['depth'] for stage in stages]
        rates = multiscale.drop_path_rates(drop_path_rate, sum(depths))
        modules, in_dim = [], channels
        for i, stage in enumerate(stages):
            dim, heads = stage['emb_dim'], stage['heads']
            layers = []
            for j, rate in enumerate(rates[sum(depths[:i]):sum(depths[:i + 1])]):
                if stage['local_patch_size'] is not None and j % 2 == 0:
                    attention = LocallyGroupedAttention(dim, heads, dropout, window_size=stage['local_patch_size'],
                                                        proj_dropout=dropout)
                else:
                    attention = multiscale.SpatialReductionAttention(dim, heads, dropout, sr_ratio=stage['global_k'],
                                                          proj_dropout=dropout)
                feedforward = vit.FeedForward(dim, dim * stage['mlp_mult'], dropout, norm_eps=BLOCK_EPS)
                layers.append((multiscale.DropPath(attention, rate), multiscale.DropPath(feedforward, rate)))
                if j == 0:
                    layers.append((multiscale.PositionEncodingGenerator(dim, peg_kernel_size),))
            modules.append(multiscale.MapStage(PatchEmbedding(in_dim, dim, stage['patch_size']), multiscale.MapTransformer(layers)))
            in_dim = dim
        self.stages = nn.ModuleList(modules)
        strides = torch.tensor([stage['patch_size'] for stage in stages], device='cpu').cumprod(0).tolist()
        self.feature_info = [dict(num_chs=stage['emb_dim'], reduction=stride, module=f'stages.{i}')
                             for i, (stage, stride) in enumerate(zip(stages, strides))]

        self.norm = nn.LayerNorm(s4_emb_dim, eps=BLOCK_EPS)
        self.mlp_head = nn.Linear(s4_emb_dim, num_classes) if num_classes > 0 else None
        self.apply(multiscale.init_conv_weights)

    def check_image(self, img):
        """Refuse what is not an image batch, or an image that leaves a stage a map smaller than its sub-sampling."""
        vit.check_images(img, channels=self.channels, patch_size=(1, 1), dtype=self.norm.weight.dtype)
        size = tuple(img.shape[-2:])
        for i, stage in enumerate(self.stage_settings):
            size = tuple(side // stage['patch_size'] for side in size)
            least = max(1, stage['global_k'] if stage['local_patch_size'] is None or stage['depth'] > 1 else 1)
            if min(size) < least:
                needed = least * self.feature_info[i]['reduction']
                raise ValueError(f"img of {img.shape[-2]}x{img.shape[-1]} leaves stage {i + 1} a {size[0]}x{size[1]} "
                                 f"map, smaller than {least} (its global_k and patch); use images of at least "
                                 f"{needed} pixels a side")


def default_heads(width):
    """Heads of 32 channels where 32 divides the width (Twins-SVT's), else one head."""
    return width // 32 if width % 32 == 0 else 1


# the paper's models (Twins Tables 1-2, timm's twins_*): name -> (widths, heads, mlp ratios, blocks, local windows);
# patches 4, 2, 2, 2; GSA sub-sampling 8, 4, 2, 1
CONFIGS = {
    'svt_small': ((64, 128, 256, 512), (2, 4, 8, 16), (4, 4, 4, 4), (2, 2, 10, 4), 7),
    'svt_base': ((96, 192, 384, 768), (3, 6, 12, 24), (4, 4, 4, 4), (2, 2, 18, 2), 7),
    'svt_large': ((128, 256, 512, 1024), (4, 8, 16, 32), (4, 4, 4, 4), (2, 2, 18, 2), 7),
    'pcpvt_small': ((64, 128, 320, 512), (1, 2, 5, 8), (8, 8, 4, 4), (3, 4, 6, 3), None),
    'pcpvt_base': ((64, 128, 320, 512), (1, 2, 5, 8), (8, 8, 4, 4), (3, 4, 18, 3), None),
    'pcpvt_large': ((64, 128, 320, 512), (1, 2, 5, 8), (8, 8, 4, 4), (3, 8, 27, 3), None),
}


def twins(variant, *, num_classes=1000, **overrides):
    """The paper's Twins `variant` (a key of CONFIGS); keyword arguments of TwinsSVT override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    widths, heads, mlp_mults, depths, window = CONFIGS[variant]
    kwargs = {}
    for i, values in enumerate(zip(widths, heads, mlp_mults, depths, (4, 2, 2, 2), (8, 4, 2, 1)), start=1):
        for name, value in zip(('emb_dim', 'heads', 'mlp_mult', 'depth', 'patch_size', 'global_k'), values):
            kwargs[f's{i}_{name}'] = value
        kwargs[f's{i}_local_patch_size'] = window
    return TwinsSVT(**{**kwargs, 'num_classes': num_classes, **overrides})


def twins_svt_small(**kwargs):
    return twins('svt_small', **kwargs)


def twins_svt_base(**kwargs):
    return twins('svt_base', **kwargs)


def twins_svt_large(**kwargs):
    return twins('svt_large', **kwargs)


def twins_pcpvt_small(**kwargs):
    return twins('pcpvt_small', **kwargs)


def twins_pcpvt_base(**kwargs):
    return twins('pcpvt_base', **kwargs)


def twins_pcpvt_large(**kwargs):
    return twins('pcpvt_large', **kwargs)


# argument checks


def check_arguments(*, num_classes, peg_kernel_size, dropout, channels, drop_path_rate, **stage_arguments):
    vit.non_negative_int('num_classes', num_classes)
    vit.positive_int('peg_kernel_size', peg_kernel_size)
    if peg_kernel_size % 2 == 0:
        raise ValueError(f"peg_kernel_size must be odd (the map keeps its size), got {peg_kernel_size}")
    vit.probability('dropout', dropout)
    vit.positive_int('channels', channels)
    vit.probability('drop_path_rate', drop_path_rate)
    for i in range(1, 5):
        values = {name: stage_arguments[f's{i}_{name}'] for name in STAGE_ARGUMENTS}
        for name in ('emb_dim', 'patch_size', 'global_k', 'depth', 'mlp_mult'):
            vit.positive_int(f's{i}_{name}', values[name])
        for name in ('local_patch_size', 'heads'):
            if values[name] is not None:
                vit.positive_int(f's{i}_{name}', values[name])
        if values['heads'] is not None and values['emb_dim'] % values['heads']:
            raise ValueError(f"s{i}_heads {values['heads']} must divide s{i}_emb_dim {values['emb_dim']}")


# loading checkpoints


LOCAL = {'0.fn.norm.': 'norm1.', '0.fn.to_qkv.': 'attn.qkv.', '0.fn.to_out.0.': 'attn.proj.'}
GLOBAL = {'0.fn.norm.': 'norm1.', '0.fn.to_q.': 'attn.q.', '0.fn.to_kv.': 'attn.kv.', '0.fn.to_out.0.': 'attn.proj.',
          '0.fn.reduce.': 'attn.sr.', '0.fn.reduce_norm.': 'attn.norm.'}
FEEDFORWARD = {'1.fn.net.0.': 'norm2.', '1.fn.net.1.': 'mlp.fc1.', '1.fn.net.4.': 'mlp.fc2.'}


def timm_plan(model, keys):
    """timm's `Twins` (`twins_svt_*`, `twins_pcpvt_*`) -> TwinsSVT.

    Names differ, values do not. timm keeps the patch embeddings, blocks and PEGs of all stages
    in three lists (`patch_embeds.i`, `blocks.i.j`, `pos_block.i`); here each stage holds its own,
    the PEG as a layer after the first block.
    """
    names = {'norm.': 'norm.', 'mlp_head.': 'head.'}
    for i, stage in enumerate(model.stages):
        names[f'stages.{i}.embed.'] = f'patch_embeds.{i}.'
        block = 0
        for index, layer in enumerate(stage.blocks.layers):
            ours = f'stages.{i}.blocks.layers.{index}.'
            if isinstance(layer[0], multiscale.PositionEncodingGenerator):
                names[ours + '0.proj.'] = f'pos_block.{i}.proj.0.'
                continue
            local = isinstance(layer[0].fn, LocallyGroupedAttention)
            theirs = f'blocks.{i}.{block}.'
            has_local = f'{theirs}attn.qkv.weight' in keys
            if has_local != local and f'{theirs}norm1.weight' in keys:
                raise ValueError(f"the checkpoint's block {i}.{block} is {'locally grouped' if has_local else 'global'} "
                                 f"attention, the model's is not: build the model with s{i + 1}_local_patch_size "
                                 f"{'set (Twins-SVT)' if has_local else '= None (Twins-PCPVT)'}")
            names.update({ours + a: theirs + b for a, b in {**(LOCAL if local else GLOBAL), **FEEDFORWARD}.items()})
            block += 1
    plan = vit.prefixed_plan(model.state_dict(), names, "timm's Twins")
    return plan, ('head.',)


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's TwinsSVT computes another function: its sN_depth counts (local, global) attention pairs after "
        "an extra pair before the PEG, its last stage has no local attention, every attention has 8 heads of 64 and "
        "no query/key/value bias, its keys and values come from one strided convolution without a norm, and its "
        "patch embedding norms its input too; TwinsSVT (the paper's, timm's) alternates local and global blocks "
        "with sN_depth blocks per stage")
