"""Parallel ViT.

"Three things everyone should know about Vision Transformers", Touvron et al., arXiv 2203.09795:
replace pairs of sequential blocks by parallel ones. Each layer sums several
attention branches, then several MLP branches, all reading the same input:

    x = x + attn_1(x) + ... + attn_k(x)
    x = x + mlp_1(x) + ... + mlp_k(x)

With k = 2 branches and half the depth, the model has the same parameters and compute as the
sequential one but is shallower and wider; the paper finds it about as accurate, with lower
latency. The branches are the core's pre-norm `Attention` and `FeedForward`, unchanged, and
the rest is the core ViT, with its patch embedding a bare Linear by default (`patch_norm=False`),
as in the paper and vit-pytorch's parallel ViT, whose checkpoints load with
`vit_pytorch.pretrained.load_vit_pytorch`.

    import torch
    from vit_pytorch.parallel_vit import ViT

    model = ViT(image_size=256, patch_size=16, num_classes=1000, dim=1024, depth=6, heads=8,
                mlp_dim=2048, num_parallel_branches=2, dropout=0.1, emb_dropout=0.1)
    logits = model(torch.randn(4, 3, 256, 256))   # (4, 1000)

The paper's models (its Table 1 and released checkpoints) are the DeiT widths, written
depth x branches, at patch 16 and MLP ratio 4, with qkv bias, LayerNorm eps 1e-6 and a plain
patch projection; each has exactly the parameters of the sequential ViT with depth x branches
blocks:

    vit_small_6x2()     ViT-S 12x1 -> 6x2    width 384, 6 heads     22.1M
    vit_small_18x2()    ViT-S 36x1 -> 18x2   width 384, 6 heads     64.6M
    vit_base_6x2()      ViT-B 12x1 -> 6x2    width 768, 12 heads    86.6M
    vit_base_18x2()     ViT-B 36x1 -> 18x2   width 768, 12 heads   256.7M
    vit_large_12x2()    ViT-L 24x1 -> 12x2   width 1024, 16 heads  304.3M

The paper trains them with DeiT III's recipe, whose LayerScale (2 x dim per branch) is off by
default, as in `vit-pytorch`; `layer_scale_init=1e-5` turns it on, each branch's output multiplied
by its own learned per-channel factor before the sum. timm's `vit_small_patch16_18x2_224` and
`vit_base_patch16_18x2_224` are `vit_small_18x2(layer_scale_init=1e-5)` and
`vit_base_18x2(layer_scale_init=1e-5)`, and load with `vit_pytorch.pretrained.load_timm`.
"""

from einops import rearrange
from torch import nn

from vit_pytorch import vit


class Parallel(nn.Module):
    """The sum of the branches' outputs on the same input."""

    def __init__(self, *fns):
        super().__init__()
        self.fns = nn.ModuleList(fns)

    def forward(self, x):
        return sum(fn(x) for fn in self.fns)


def parallel(block, branches, *, layer_scale_init=None):
    """A builder of `Parallel` blocks: `branches` copies of what `block(dim, *args, **kwargs)` builds,
    each in a `vit.LayerScale` starting at `layer_scale_init` when that is given."""
    def build(dim, *args, **kwargs):
        fns = [block(dim, *args, **kwargs) for _ in range(branches)]
        if layer_scale_init is not None:
            fns = [vit.LayerScale(dim, fn, layer_scale_init) for fn in fns]
        return Parallel(*fns)
    return build


class ViT(vit.ViT):
    """The core ViT (same arguments, methods and `num_classes=0` behaviour) with parallel blocks.

    `patch_norm`, `qkv_bias` and `norm_eps` are the core's (defaults: vit-pytorch's model, a bare Linear
    patch projection; `qkv_bias=True, norm_eps=1e-6`: the paper's released models). `layer_scale_init`: None (no
    LayerScale, vit-pytorch's model) or the initial value of a LayerScale on every branch.

    `forward_features` returns all tokens after the final norm, (b, prefix + h * w, dim), as `vit.ViT`.
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, pool='cls',
                 num_parallel_branches=2, channels=3, dim_head=64, dropout=0., emb_dropout=0.,
                 patch_norm=False, qkv_bias=False, norm_eps=1e-5, layer_scale_init=None):
        vit.positive_int('num_parallel_branches', num_parallel_branches)
        if layer_scale_init is not None:
            vit.positive_float('layer_scale_init', layer_scale_init)
        branches = dict(branches=num_parallel_branches, layer_scale_init=layer_scale_init)
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim,
                         depth=depth, heads=heads, mlp_dim=mlp_dim, pool=pool, channels=channels,
                         dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout,
                         patch_norm=patch_norm, qkv_bias=qkv_bias, norm_eps=norm_eps,
                         attention=parallel(vit.Attention, **branches),
                         feedforward=parallel(vit.FeedForward, **branches))


# the paper's models: width -> (dim, heads); all with patch 16, heads of 64, MLP ratio 4
WIDTHS = {'small': (384, 6), 'base': (768, 12), 'large': (1024, 16)}


def parallel_vit(width, depth, branches=2, *, image_size=224, num_classes=1000, **overrides):
    """The paper's ViT-`width` (a key of WIDTHS) as `depth` parallel blocks of `branches` branches."""
    if width not in WIDTHS:
        raise ValueError(f"width must be one of {sorted(WIDTHS)}, got {width!r}")
    dim, heads = WIDTHS[width]
    kwargs = dict(image_size=image_size, patch_size=16, num_classes=num_classes, dim=dim, depth=depth,
                  heads=heads, dim_head=64, mlp_dim=4 * dim, num_parallel_branches=branches,
                  patch_norm=False, qkv_bias=True, norm_eps=1e-6)
    return ViT(**{**kwargs, **overrides})


def vit_small_6x2(**kwargs):
    return parallel_vit('small', 6, 2, **kwargs)


def vit_small_18x2(**kwargs):
    return parallel_vit('small', 18, 2, **kwargs)


def vit_base_6x2(**kwargs):
    return parallel_vit('base', 6, 2, **kwargs)


def vit_base_18x2(**kwargs):
    return parallel_vit('base', 18, 2, **kwargs)


def vit_large_12x2(**kwargs):
    return parallel_vit('large', 12, 2, **kwargs)


# loading checkpoints


def _patch_projection_checks(model, state):
    if 'to_patch_embedding.1.weight' in state:
        raise ValueError("build the model with patch_norm=False: the checkpoint's patch projection is a bare "
                         "Linear, without LayerNorms")


def timm_plan(model, keys):
    """timm's `VisionTransformer` with `ParallelThingsBlock` (`vit_small_patch16_18x2_224`,
    `vit_base_patch16_18x2_224`) -> the parallel ViT with `patch_norm=False`, and
    `layer_scale_init` when the checkpoint's branches have LayerScale.

    Names differ, values do not, except: the patch projection is a convolution (a Linear over
    (p1 p2 c) here) and the cls token has a leading batch axis.
    """
    state = model.state_dict()
    _patch_projection_checks(model, state)
    if model.pool != 'cls':
        raise ValueError("timm's parallel ViT reads its cls token: build the model with pool='cls'")
    scaled = 'transformer.layers.0.0.fns.0.scale' in state
    if 'blocks.0.attns.0.attn.qkv.weight' in keys:      # a parallel checkpoint: say what the model lacks
        their_scale, their_bias = 'blocks.0.attns.0.ls.gamma' in keys, 'blocks.0.attns.0.attn.qkv.bias' in keys
        if scaled != their_scale:
            wanted = '1e-5 (any value: it is loaded)' if their_scale else 'None'
            raise ValueError(f"the checkpoint's branches {'have' if their_scale else 'have no'} LayerScale: build "
                             f"the model with layer_scale_init={wanted}")
        if any(key.endswith('to_qkv.bias') for key in state) != their_bias:
            raise ValueError(f"build the model with qkv_bias={their_bias} (the checkpoint's attention "
                             f"{'has' if their_bias else 'has no'} qkv bias)")
    dim = state['cls_token'].shape[-1]
    plan = {
        'to_patch_embedding.2.weight': ({'patch_embed.proj.weight': (dim, model.channels, *model.patch_size)},
                                        lambda w: rearrange(w, 'd c p1 p2 -> d (p1 p2 c)')),
        'cls_token': ({'cls_token': (1, 1, dim)}, lambda t: t[0]),
        'pos_embedding': ({'pos_embed': None}, dict(num_prefix_tokens=model.num_prefix_tokens,
                                                    grid=model.grid_size)),
    }
    names = {'to_patch_embedding.2.': 'patch_embed.proj.', 'transformer.norm.': 'norm.', 'mlp_head.': 'head.'}
    for i, (attns, ffs) in enumerate(model.transformer.layers):
        for j in range(len(attns.fns)):
            attn, ff = f'transformer.layers.{i}.0.fns.{j}.', f'transformer.layers.{i}.1.fns.{j}.'
            their_attn, their_ff = f'blocks.{i}.attns.{j}.', f'blocks.{i}.ffns.{j}.'
            inner_attn, inner_ff = (attn + 'fn.', ff + 'fn.') if scaled else (attn, ff)
            names.update({
                attn + 'scale': their_attn + 'ls.gamma', inner_attn + 'norm.': their_attn + 'norm.',
                inner_attn + 'to_qkv.': their_attn + 'attn.qkv.', inner_attn + 'to_out.0.': their_attn + 'attn.proj.',
                ff + 'scale': their_ff + 'ls.gamma', inner_ff + 'net.0.': their_ff + 'norm.',
                inner_ff + 'net.1.': their_ff + 'mlp.fc1.', inner_ff + 'net.4.': their_ff + 'mlp.fc2.',
            })
    vit.prefixed_plan(state, names, "timm's parallel ViT", plan)
    return plan, ('head.',)


def vit_pytorch_plan(model, keys):
    """vit-pytorch's parallel `ViT`: its bare Linear patch projection is ours with `patch_norm=False`, and
    its head's LayerNorm is our final norm (the same function on the cls token)."""
    state = model.state_dict()
    _patch_projection_checks(model, state)
    if model.pool != 'cls':
        raise ValueError("vit-pytorch's parallel ViT normalises after pooling, which differs from this model's "
                         "norm-then-pool under pool='mean': only its pool='cls' checkpoints load, into pool='cls'")
    if any(key.endswith(('to_qkv.bias', '.scale')) for key in state):
        raise ValueError("vit-pytorch's parallel ViT has no qkv bias and no LayerScale: build the model with "
                         "qkv_bias=False and layer_scale_init=None")
    if 'mlp_head.weight' not in state:
        raise ValueError("vit-pytorch's parallel ViT always has a head: build the model with its num_classes")
    plan = {f'to_patch_embedding.2.{kind}': ({f'to_patch_embedding.1.{kind}': tuple(tensor.shape)}, lambda t: t)
            for kind, tensor in (('weight', state['to_patch_embedding.2.weight']),
                                 ('bias', state['to_patch_embedding.2.bias']))}
    plan.update({
        'cls_token': ({'cls_token': (1, *state['cls_token'].shape)}, lambda t: t[0]),
        'pos_embedding': ({'pos_embedding': (1, *state['pos_embedding'].shape)}, lambda t: t[0]),
    })
    for ours, theirs in (('transformer.norm.', 'mlp_head.0.'), ('mlp_head.', 'mlp_head.1.')):
        for kind in ('weight', 'bias'):
            plan[ours + kind] = ({theirs + kind: tuple(state[ours + kind].shape)}, lambda t: t)
    for key, tensor in state.items():
        if key not in plan:
            plan[key] = ({key: tuple(tensor.shape)}, lambda t: t)
    return plan, ()
