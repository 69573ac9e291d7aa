"""The paper's ViT models by name, and the loaders for the checkpoints people have.

"An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale",
Dosovitskiy et al., arXiv 2010.11929. A variant string such as "B/16" is decoded
from one small table (width, depth, MLP size, heads) into the core `ViT` with the
paper's numerics: no LayerNorms around the patch projection, a bias on the qkv
projection, LayerNorm epsilon 1e-6, dim_head = width / heads.

Loaders (nothing downloads; a local file or an in-memory state_dict):
  load_timm   timm `vit_*` / `deit_*` state_dicts, and DeiT's own `.pth` files
              (distilled ones into `vit_pytorch.distill.DistillableViT`);
  load_hf     Hugging Face `ViTModel` / `ViTForImageClassification` (saved legacy
              names `...encoder.layer.N.attention.attention.query...` or the
              in-memory names of transformers 5 `...layers.N.attention.q_proj...`);
  load_jax    the official `.npz` files of google-research/vision_transformer.
Files are read with safetensors, `torch.load(weights_only=True)` or
`numpy.load(allow_pickle=False)`: no arbitrary object is ever unpickled. Every
shape is checked before anything is copied; missing and unexpected keys are
reported by their names in the checkpoint.

Numerics that decide parity with each reference (choose them when building):
  GELU        timm and Hugging Face use the exact GELU (`gelu_approximate='none'`, the
              default here); the JAX code uses the tanh approximation: build with
              `gelu_approximate='tanh'` to reproduce its outputs (about 1e-3 apart on logits).
  LayerNorm   1e-6 here, in timm and in JAX; Hugging Face configs usually say
              `layer_norm_eps=1e-12`: pass `norm_eps=config.layer_norm_eps`.
  resolution  a checkpoint whose patch grid differs from the model's has its position
              embeddings resampled in 2D (prefix rows kept), with `resample=`:
                'timm' bicubic, antialias (timm loading a checkpoint at another size);
                'hf'   bicubic, no antialias (Hugging Face `interpolate_pos_encoding`, and
                       this package's `dynamic_image_size=True`);
                'jax'  bilinear, align_corners=True (the JAX code's scipy.ndimage.zoom, order 1);
              or a dict of `vit_pytorch.vit.resample_pos_embedding` options, e.g.
              `dict(mode='bilinear')` for timm's own `.npz` loader.

    import torch
    from vit_pytorch.pretrained import vit, vit_base_patch16_224, num_parameters, load_timm

    num_parameters('B/16')                                  # 86567656, counted on the meta device
    model = vit('Ti/16', image_size=64, num_classes=10)     # the paper's ViT-Ti/16, at 64x64
    logits = model(torch.randn(1, 3, 64, 64))               # (1, 10)
    # with a checkpoint you have:
    #   load_timm(vit_base_patch16_224(), 'vit_base_patch16_224.safetensors')
    #   load_jax(vit('B/16', image_size=384, gelu_approximate='tanh'), 'ViT-B_16.npz')  # resampled to 24x24

Only torch and einops are needed, plus safetensors or numpy to read those files.
"""

import math
import os
import pickle
import re
from collections.abc import Mapping

import torch
from einops import rearrange

from vit_pytorch.distill import DistillableViT
from vit_pytorch.vit import ViT, resample_pos_embedding

# width, depth, MLP size, heads (paper Table 1; Ti and S from "How to train your ViT?", arXiv 2106.10270)
VARIANTS = {
    'Ti': (192, 12, 768, 3),
    'S': (384, 12, 1536, 6),
    'B': (768, 12, 3072, 12),
    'L': (1024, 24, 4096, 16),
    'H': (1280, 32, 5120, 16),
}
PATCH_SIZES = (8, 14, 16, 32)

RESAMPLE = {
    'timm': dict(mode='bicubic', antialias=True),
    'hf': dict(mode='bicubic', antialias=False),
    'jax': dict(mode='bilinear', align_corners=True),
}


class CheckpointError(ValueError):
    """A weight file that cannot be read safely or does not fit the model: missing, corrupt or truncated
    files, missing, unexpected or misshapen entries, or an unsafe (pickled-object) file."""


# the model table


def decode_variant(variant):
    """'B/16' -> dict(dim=768, depth=12, mlp_dim=3072, heads=12, dim_head=64, patch_size=16)."""
    match = re.fullmatch(r'(Ti|S|B|L|H)/(\d+)', variant) if isinstance(variant, str) else None
    if match is None or int(match[2]) not in PATCH_SIZES:
        raise ValueError(f"variant must look like 'B/16': one of {'/'.join(VARIANTS)} and a patch size in "
                         f"{PATCH_SIZES}, got {variant!r}")
    dim, depth, mlp_dim, heads = VARIANTS[match[1]]
    return dict(dim=dim, depth=depth, mlp_dim=mlp_dim, heads=heads, dim_head=dim // heads, patch_size=int(match[2]))


def vit(variant, *, image_size=224, num_classes=1000, **overrides):
    """The paper's ViT for a variant such as 'B/16'; keyword arguments of `ViT` override anything."""
    config = dict(decode_variant(variant), image_size=image_size, num_classes=num_classes,
                  patch_norm=False, qkv_bias=True, norm_eps=1e-6)
    return ViT(**{**config, **overrides})


def num_parameters(build, /, *args, **kwargs):
    """Parameters of `build(*args, **kwargs)` (a variant string means `vit`), built on the meta device."""
    if isinstance(build, str):
        build, args = vit, (build, *args)
    with torch.device('meta'):
        model = build(*args, **kwargs)
    return sum(p.numel() for p in model.parameters())


def vit_tiny_patch16_224(**kwargs): return vit('Ti/16', image_size=224, **kwargs)
def vit_tiny_patch16_384(**kwargs): return vit('Ti/16', image_size=384, **kwargs)
def vit_small_patch8_224(**kwargs): return vit('S/8', image_size=224, **kwargs)
def vit_small_patch16_224(**kwargs): return vit('S/16', image_size=224, **kwargs)
def vit_small_patch16_384(**kwargs): return vit('S/16', image_size=384, **kwargs)
def vit_small_patch32_224(**kwargs): return vit('S/32', image_size=224, **kwargs)
def vit_small_patch32_384(**kwargs): return vit('S/32', image_size=384, **kwargs)
def vit_base_patch8_224(**kwargs): return vit('B/8', image_size=224, **kwargs)
def vit_base_patch16_224(**kwargs): return vit('B/16', image_size=224, **kwargs)
def vit_base_patch16_384(**kwargs): return vit('B/16', image_size=384, **kwargs)
def vit_base_patch32_224(**kwargs): return vit('B/32', image_size=224, **kwargs)
def vit_base_patch32_384(**kwargs): return vit('B/32', image_size=384, **kwargs)
def vit_large_patch14_224(**kwargs): return vit('L/14', image_size=224, **kwargs)
def vit_large_patch16_224(**kwargs): return vit('L/16', image_size=224, **kwargs)
def vit_large_patch16_384(**kwargs): return vit('L/16', image_size=384, **kwargs)
def vit_large_patch32_224(**kwargs): return vit('L/32', image_size=224, **kwargs)
def vit_large_patch32_384(**kwargs): return vit('L/32', image_size=384, **kwargs)
def vit_huge_patch14_224(**kwargs): return vit('H/14', image_size=224, **kwargs)


__all__ = [
    'VARIANTS', 'RESAMPLE', 'CheckpointError', 'decode_variant', 'vit', 'num_parameters',
    'load_timm', 'load_hf', 'load_jax', 'read_checkpoint',
    'vit_tiny_patch16_224', 'vit_tiny_patch16_384', 'vit_small_patch8_224', 'vit_small_patch16_224',
    'vit_small_patch16_384', 'vit_small_patch32_224', 'vit_small_patch32_384', 'vit_base_patch8_224',
    'vit_base_patch16_224', 'vit_base_patch16_384', 'vit_base_patch32_224', 'vit_base_patch32_384',
    'vit_large_patch14_224', 'vit_large_patch16_224', 'vit_large_patch16_384', 'vit_large_patch32_224',
    'vit_large_patch32_384', 'vit_huge_patch14_224',
]


# reading files


def read_checkpoint(source):
    """A flat {name: tensor} from a path (.safetensors, .npz, or a torch file) or a mapping.

    Torch files are read with `weights_only=True`; a `{'model': ...}` or `{'state_dict': ...}`
    wrapper (DeiT's and many training scripts' `.pth` files) is unwrapped.
    """
    if isinstance(source, Mapping):
        state_dict = dict(source)
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if path.endswith('.safetensors'):
            from safetensors import SafetensorError
            from safetensors.torch import load_file
            try:
                state_dict = load_file(path)
            except SafetensorError as error:
                raise CheckpointError(f"{path}: cannot read it: the file is corrupt, truncated or not "
                                      f"safetensors ({error})") from error
        elif path.endswith('.npz'):
            import numpy as np
            try:
                with np.load(path, allow_pickle=False) as arrays:
                    state_dict = {name: arrays[name] for name in arrays.files}
            except ValueError as error:
                raise CheckpointError(f"{path}: refused to read an .npz holding pickled objects ({error})") from error
        else:
            try:
                state_dict = torch.load(path, map_location='cpu', weights_only=True)
            except FileNotFoundError:
                raise
            except pickle.UnpicklingError as error:
                raise CheckpointError(
                    f"{path}: refused to unpickle it: it holds objects other than tensors and plain containers, "
                    f"and unpickling those can run arbitrary code. Re-save only the state_dict, or use safetensors. "
                    f"({str(error).splitlines()[0]})") from error
            except (RuntimeError, OSError, EOFError, UnicodeDecodeError) as error:
                raise CheckpointError(f"{path}: cannot read it as a torch file: it is corrupt or truncated "
                                      f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no detail'})"
                                      ) from error
    else:
        raise TypeError(f"checkpoint must be a path or a state_dict mapping, got {type(source).__name__}")
    for wrapper in ('model', 'state_dict'):
        if set(state_dict) == {wrapper} and isinstance(state_dict[wrapper], Mapping):
            state_dict = dict(state_dict[wrapper])
    return {name: value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
            for name, value in state_dict.items()}


# loading: each format is a plan, one entry per tensor of our model:
#   our key -> ({checkpoint key: expected shape}, convert(*tensors) -> our tensor)
# The position table (shape None, convert None) is checked and resampled by _position_table.


def _describe(model):
    """The sizes a plan needs, read from the model (which must be the paper's ViT)."""
    if not isinstance(model, ViT):
        raise TypeError(f"model must be a vit_pytorch ViT, got {type(model).__name__}")
    first_attn, first_ff = model.transformer.layers[0]
    problems = []
    if not isinstance(model.to_patch_embedding[1], torch.nn.Identity):
        problems.append('patch_norm=False')
    if first_attn.to_qkv.bias is None:
        problems.append('qkv_bias=True')
    if model.pool != 'cls':
        problems.append("pool='cls'")
    if isinstance(first_attn.to_out, torch.nn.Identity):
        problems.append('an output projection (heads > 1)')
    if problems:
        raise ValueError(f"these checkpoints hold the paper's ViT; build the model with {', '.join(problems)} "
                         f"(e.g. vit_pytorch.pretrained.vit('B/16'))")
    linear = model.to_patch_embedding[2]
    return dict(
        dim=linear.out_features, depth=len(model.transformer.layers), heads=first_attn.heads,
        dim_head=first_attn.to_qkv.out_features // 3 // first_attn.heads, mlp_dim=first_ff.net[1].out_features,
        patch=model.patch_size, channels=model.channels, num_classes=model.num_classes,
        pre_logits=None if isinstance(model.to_latent, torch.nn.Identity) else model.to_latent[0].out_features,
        distilled=isinstance(model, DistillableViT),
    )


def _same(tensor):
    return tensor


def _first(tensor):
    return tensor[0]


def _transpose(tensor):
    return tensor.T


def _conv_to_linear(weight):
    # Conv2d (out, c, p1, p2) -> our Linear over patches flattened as (p1 p2 c)
    return rearrange(weight, 'd c p1 p2 -> d (p1 p2 c)')


def _concat(*tensors):
    return torch.cat(tensors)


def _head_plan(m, names, *, transposed=False):
    """Plan entries of the pre-logits layer and head(s); `names` gives their checkpoint keys.

    `transposed`: the checkpoint stores Dense kernels (in, out) as JAX does, not Linear weights (out, in).
    """
    def weight(key, out_features, in_features):
        shape = (in_features, out_features) if transposed else (out_features, in_features)
        return {names[key]: shape}, _transpose if transposed else _same

    plan = {}
    if m['pre_logits']:
        plan['to_latent.0.weight'] = weight('pre_logits.weight', m['pre_logits'], m['dim'])
        plan['to_latent.0.bias'] = ({names['pre_logits.bias']: (m['pre_logits'],)}, _same)
    if m['num_classes']:
        k = m['num_classes']
        plan['mlp_head.weight'] = weight('head.weight', k, m['pre_logits'] or m['dim'])
        plan['mlp_head.bias'] = ({names['head.bias']: (k,)}, _same)
        if m['distilled']:
            plan['distill_head.weight'] = weight('head_dist.weight', k, m['dim'])
            plan['distill_head.bias'] = ({names['head_dist.bias']: (k,)}, _same)
    return plan


def _timm_plan(m):
    d, inner, mlp, (ph, pw) = m['dim'], m['heads'] * m['dim_head'], m['mlp_dim'], m['patch']
    plan = {
        'to_patch_embedding.2.weight': ({'patch_embed.proj.weight': (d, m['channels'], ph, pw)}, _conv_to_linear),
        'to_patch_embedding.2.bias': ({'patch_embed.proj.bias': (d,)}, _same),
        'cls_token': ({'cls_token': (1, 1, d)}, _first),
        'pos_embedding': ({'pos_embed': None}, None),
        'transformer.norm.weight': ({'norm.weight': (d,)}, _same),
        'transformer.norm.bias': ({'norm.bias': (d,)}, _same),
    }
    if m['distilled']:
        plan['distill_token'] = ({'dist_token': (1, 1, d)}, _first)
    for i in range(m['depth']):
        ours, theirs = f'transformer.layers.{i}.', f'blocks.{i}.'
        for our_name, their_name, shape in [
            ('0.norm.weight', 'norm1.weight', (d,)), ('0.norm.bias', 'norm1.bias', (d,)),
            ('0.to_qkv.weight', 'attn.qkv.weight', (3 * inner, d)), ('0.to_qkv.bias', 'attn.qkv.bias', (3 * inner,)),
            ('0.to_out.0.weight', 'attn.proj.weight', (d, inner)), ('0.to_out.0.bias', 'attn.proj.bias', (d,)),
            ('1.net.0.weight', 'norm2.weight', (d,)), ('1.net.0.bias', 'norm2.bias', (d,)),
            ('1.net.1.weight', 'mlp.fc1.weight', (mlp, d)), ('1.net.1.bias', 'mlp.fc1.bias', (mlp,)),
            ('1.net.4.weight', 'mlp.fc2.weight', (d, mlp)), ('1.net.4.bias', 'mlp.fc2.bias', (d,)),
        ]:
            plan[ours + our_name] = ({theirs + their_name: shape}, _same)
    # timm before 0.6 kept the paper's representation layer as pre_logits.fc
    names = {'pre_logits.weight': 'pre_logits.fc.weight', 'pre_logits.bias': 'pre_logits.fc.bias',
             'head.weight': 'head.weight', 'head.bias': 'head.bias',
             'head_dist.weight': 'head_dist.weight', 'head_dist.bias': 'head_dist.bias'}
    plan.update(_head_plan(m, names))
    return plan, ('head.', 'head_dist.', 'pre_logits.')


def _hf_plan(m, keys):
    d, inner, mlp, (ph, pw) = m['dim'], m['heads'] * m['dim_head'], m['mlp_dim'], m['patch']
    # ViTForImageClassification nests the encoder under `vit.`; ViTModel does not
    p = 'vit.' if any(key.startswith('vit.') for key in keys) else ''
    # files on disk (and transformers < 5 in memory) use the legacy names; transformers 5 renamed them in memory
    legacy = not any(key.startswith(f'{p}layers.') for key in keys)
    layer = f'{p}encoder.layer.{{}}.' if legacy else f'{p}layers.{{}}.'
    q, k, v, o, fc1, fc2 = (
        ('attention.attention.query', 'attention.attention.key', 'attention.attention.value',
         'attention.output.dense', 'intermediate.dense', 'output.dense') if legacy else
        ('attention.q_proj', 'attention.k_proj', 'attention.v_proj', 'attention.o_proj', 'mlp.fc1', 'mlp.fc2'))
    plan = {
        'to_patch_embedding.2.weight': ({f'{p}embeddings.patch_embeddings.projection.weight': (d, m['channels'], ph, pw)},
                                        _conv_to_linear),
        'to_patch_embedding.2.bias': ({f'{p}embeddings.patch_embeddings.projection.bias': (d,)}, _same),
        'cls_token': ({f'{p}embeddings.cls_token': (1, 1, d)}, _first),
        'pos_embedding': ({f'{p}embeddings.position_embeddings': None}, None),
        'transformer.norm.weight': ({f'{p}layernorm.weight': (d,)}, _same),
        'transformer.norm.bias': ({f'{p}layernorm.bias': (d,)}, _same),
    }
    for i in range(m['depth']):
        ours, theirs = f'transformer.layers.{i}.', layer.format(i)
        for kind in ('weight', 'bias'):
            qkv_shape = (inner, d) if kind == 'weight' else (inner,)
            # HF keeps q, k and v apart; ours is one Linear with rows [q; k; v], head-major within each
            plan[ours + f'0.to_qkv.{kind}'] = ({theirs + f'{name}.{kind}': qkv_shape for name in (q, k, v)}, _concat)
            for our_name, their_name, shape in [
                ('0.norm', 'layernorm_before', (d,)), ('0.to_out.0', o, (d, inner)), ('1.net.0', 'layernorm_after', (d,)),
                ('1.net.1', fc1, (mlp, d)), ('1.net.4', fc2, (d, mlp)),
            ]:
                shape = shape[:1] if kind == 'bias' else shape
                plan[ours + f'{our_name}.{kind}'] = ({theirs + f'{their_name}.{kind}': shape}, _same)
    # ViTModel's pooler (Linear + tanh on token 0) has the shape and place of the paper's pre-logits layer
    names = {'pre_logits.weight': 'pooler.dense.weight', 'pre_logits.bias': 'pooler.dense.bias',
             'head.weight': 'classifier.weight', 'head.bias': 'classifier.bias'}
    plan.update(_head_plan(m, names))
    return plan, ('classifier.', 'pooler.')


def _jax_plan(m):
    d, h, e, mlp, (ph, pw) = m['dim'], m['heads'], m['dim_head'], m['mlp_dim'], m['patch']
    plan = {
        # conv kernel HWIO (p1, p2, c, d) flattens straight into our (p1 p2 c) patch order
        'to_patch_embedding.2.weight': ({'embedding/kernel': (ph, pw, m['channels'], d)},
                                        lambda w: rearrange(w, 'p1 p2 c d -> d (p1 p2 c)')),
        'to_patch_embedding.2.bias': ({'embedding/bias': (d,)}, _same),
        'cls_token': ({'cls': (1, 1, d)}, _first),
        'pos_embedding': ({'Transformer/posembed_input/pos_embedding': None}, None),
        'transformer.norm.weight': ({'Transformer/encoder_norm/scale': (d,)}, _same),
        'transformer.norm.bias': ({'Transformer/encoder_norm/bias': (d,)}, _same),
    }
    for i in range(m['depth']):
        ours, block = f'transformer.layers.{i}.', f'Transformer/encoderblock_{i}/'
        # the published files keep pre-Linen names: one module counter per block, across classes
        attn, mlp_block = block + 'MultiHeadDotProductAttention_1/', block + 'MlpBlock_3/'
        plan[ours + '0.to_qkv.weight'] = (
            {attn + f'{name}/kernel': (d, h, e) for name in ('query', 'key', 'value')},
            lambda *ws: torch.cat([rearrange(w, 'd h e -> (h e) d') for w in ws]))
        plan[ours + '0.to_qkv.bias'] = (
            {attn + f'{name}/bias': (h, e) for name in ('query', 'key', 'value')},
            lambda *bs: torch.cat([rearrange(b, 'h e -> (h e)') for b in bs]))
        plan[ours + '0.to_out.0.weight'] = ({attn + 'out/kernel': (h, e, d)}, lambda w: rearrange(w, 'h e d -> d (h e)'))
        plan[ours + '0.to_out.0.bias'] = ({attn + 'out/bias': (d,)}, _same)
        for our_name, norm in (('0.norm', 'LayerNorm_0'), ('1.net.0', 'LayerNorm_2')):
            plan[ours + our_name + '.weight'] = ({block + norm + '/scale': (d,)}, _same)
            plan[ours + our_name + '.bias'] = ({block + norm + '/bias': (d,)}, _same)
        plan[ours + '1.net.1.weight'] = ({mlp_block + 'Dense_0/kernel': (d, mlp)}, _transpose)
        plan[ours + '1.net.1.bias'] = ({mlp_block + 'Dense_0/bias': (mlp,)}, _same)
        plan[ours + '1.net.4.weight'] = ({mlp_block + 'Dense_1/kernel': (mlp, d)}, _transpose)
        plan[ours + '1.net.4.bias'] = ({mlp_block + 'Dense_1/bias': (d,)}, _same)
    names = {'pre_logits.weight': 'pre_logits/kernel', 'pre_logits.bias': 'pre_logits/bias',
             'head.weight': 'head/kernel', 'head.bias': 'head/bias'}
    plan.update(_head_plan(m, names, transposed=True))
    return plan, ('head/', 'pre_logits/')


def _position_table(name, table, model, resample):
    """Check a (1, prefix + n, d) checkpoint table; resample its square grid to the model's grid."""
    prefix, dim = model.num_prefix_tokens, model.pos_embedding.shape[-1]
    rows = table.shape[1] - prefix if table.ndim == 3 else 0
    side = math.isqrt(max(rows, 0))
    if table.ndim != 3 or table.shape[0] != 1 or table.shape[2] != dim or rows <= 0 or side * side != rows:
        return None, (f"{name}: shape {tuple(table.shape)}, expected (1, {prefix} + h * w, {dim}) with "
                      f"{prefix} prefix token(s) and a square h x w grid")
    return resample_pos_embedding(table[0], old_grid=(side, side), new_grid=model.grid_size,
                                  num_prefix_tokens=prefix, **resample), None


def _load(model, source, plan, head_prefixes, *, resample, load_head, fmt):
    state_dict = read_checkpoint(source)
    if isinstance(resample, str):
        if resample not in RESAMPLE:
            raise ValueError(f"resample must be one of {sorted(RESAMPLE)} or a dict of resample_pos_embedding "
                             f"options, got {resample!r}")
        resample = RESAMPLE[resample]
    head_keys = {'to_latent.0.weight', 'to_latent.0.bias', 'mlp_head.weight', 'mlp_head.bias',
                 'distill_head.weight', 'distill_head.bias'}
    if not load_head:
        plan = {ours: entry for ours, entry in plan.items() if ours not in head_keys}

    wanted = [name for sources, _ in plan.values() for name in sources]
    ignored = tuple(head_prefixes) if not load_head else ()
    missing = [name for name in wanted if name not in state_dict]
    unexpected = sorted(name for name in set(state_dict) - set(wanted) if not name.startswith(ignored))
    if missing or unexpected:
        lines = [f"{fmt} checkpoint does not fit this model:"]
        if missing:
            lines.append(f"  missing keys ({len(missing)}): {', '.join(missing)}")
        if unexpected:
            lines.append(f"  unexpected keys ({len(unexpected)}): {', '.join(unexpected)}")
        raise CheckpointError('\n'.join(lines + _head_hint(missing + unexpected, head_prefixes)))

    converted, problems = {}, []
    for ours, (sources, convert) in plan.items():
        tensors = [state_dict[name] for name in sources]
        problems += [f"{name}: shape {tuple(tensor.shape)}, expected {shape}"
                     for (name, shape), tensor in zip(sources.items(), tensors)
                     if shape is not None and tuple(tensor.shape) != shape]
        if not problems:
            if ours == 'pos_embedding':
                converted[ours], problem = _position_table(next(iter(sources)), tensors[0], model, resample)
                if problem:
                    problems.append(problem)
            else:
                converted[ours] = convert(*tensors)
    if problems:
        lines = [f"{fmt} checkpoint does not fit this model (nothing was copied):"] + [f"  {line}" for line in problems]
        raise CheckpointError('\n'.join(lines + _head_hint(problems, head_prefixes)))

    targets = model.state_dict()
    left_out = sorted(set(targets) - set(converted) - (head_keys if not load_head else set()))
    if left_out:
        raise CheckpointError(f"the {fmt} format has nothing for these parameters of the model: {', '.join(left_out)}")
    with torch.no_grad():
        for ours, tensor in converted.items():
            targets[ours].copy_(tensor)
    return model


def _head_hint(names, head_prefixes):
    if not any(name.startswith(head_prefixes) for name in names):
        return []
    return ["  the head or pre-logits layer differs: build the model with the checkpoint's num_classes and "
            "pre_logits_dim, or pass load_head=False and call model.reset_classifier(num_classes)"]


def load_timm(model, checkpoint, *, resample='timm', load_head=True):
    """Load a timm `vit_*` / `deit_*` state_dict (or file) into `model`; returns the model.

    A `deit_*_distilled_*` checkpoint loads into a `DistillableViT`. `load_head=False` leaves the
    checkpoint's head(s) and pre-logits layer out (fine-tuning on other classes).
    """
    return _load(model, checkpoint, *_timm_plan(_describe(model)), resample=resample, load_head=load_head, fmt='timm')


def load_hf(model, checkpoint, *, resample='hf', load_head=True):
    """Load a Hugging Face `ViTModel` / `ViTForImageClassification` state_dict (or `model.safetensors`).

    HF configs usually carry `layer_norm_eps=1e-12`: build the model with that `norm_eps` for parity.
    A `ViTModel` pooler loads into the pre-logits layer (`pre_logits_dim=dim`), or is left out
    with `load_head=False`.
    """
    state_dict = read_checkpoint(checkpoint)
    plan, heads = _hf_plan(_no_distill(_describe(model), 'Hugging Face ViT'), state_dict)
    return _load(model, state_dict, plan, heads, resample=resample, load_head=load_head, fmt='Hugging Face')


def load_jax(model, checkpoint, *, resample='jax', load_head=True):
    """Load an official JAX `.npz` checkpoint (google-research/vision_transformer) into `model`.

    The JAX code uses the tanh GELU: build with `gelu_approximate='tanh'` to reproduce its
    outputs, or keep the exact GELU to reproduce timm / Hugging Face running the same weights.
    The ImageNet-21k files carry `pre_logits` (build with `pre_logits_dim=dim`, or `load_head=False`).
    """
    state_dict = read_checkpoint(checkpoint)
    # old optimizer checkpoints nest the parameters under opt/target/
    if any(name.startswith('opt/target/') for name in state_dict):
        state_dict = {name.removeprefix('opt/target/'): value for name, value in state_dict.items()}
    plan, heads = _jax_plan(_no_distill(_describe(model), 'JAX'))
    return _load(model, state_dict, plan, heads, resample=resample, load_head=load_head, fmt='JAX')


def _no_distill(description, fmt):
    if description['distilled']:
        raise ValueError(f"{fmt} checkpoints have no distillation token: load them into a ViT, not a DistillableViT")
    return description
