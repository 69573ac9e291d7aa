"""The paper's ViT models by name, and the loaders for the checkpoints people have.

"An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale",
Dosovitskiy et al., arXiv 2010.11929. A variant string such as "B/16" is decoded
from one small table (width, depth, MLP size, heads) into the core `ViT` with the
paper's numerics: no LayerNorms around the patch projection, a bias on the qkv
projection, LayerNorm epsilon 1e-6, dim_head = width / heads.

Loaders (nothing downloads; a local file, a folder or an in-memory state_dict):
  load_timm          timm state_dicts (`vit_*`, `deit_*`, `cait_*`, `xcit_*`, `crossvit_*`,
                     the parallel `vit_*_18x2_*`), and DeiT's own `.pth` files;
  load_hf            Hugging Face `ViT*` / `DeiT*` models: a `save_pretrained` folder (config.json
                     and the weights), its `model.safetensors`, or a state_dict (the saved names
                     `...encoder.layer.N.attention.attention.query...` or the in-memory names of
                     transformers 5, `...layers.N.attention.q_proj...`);
  load_jax           the official `.npz` files of google-research/vision_transformer;
  load_vit_pytorch   state_dicts saved by the `vit-pytorch` package (1.26.14 and the older
                     layouts its ViT had), for every model that computes what vit-pytorch's does;
  load_official      checkpoints of a paper's official code, for the models no library of record
                     has (each such model's module says which repository and commit).
Each model says which of these it takes (see "Plans" below); any other pair is a TypeError
naming the formats the model does take. Files are recognised by their content and read with
safetensors, `torch.load(weights_only=True)` or `numpy.load(allow_pickle=False)`: no arbitrary
object is ever unpickled, and a file that is unreadable, truncated, or not what its name says
is a `CheckpointError` naming the file. Every shape is checked before anything is copied;
missing and unexpected keys are reported by their names in the checkpoint.

Numerics that decide parity with each reference (choose them when building):
  GELU        timm and Hugging Face use the exact GELU (`gelu_approximate='none'`, the
              default here); the JAX code uses the tanh approximation: build with
              `gelu_approximate='tanh'` to reproduce its outputs (about 1e-3 apart on logits).
  LayerNorm   1e-6 here, in timm and in JAX; Hugging Face configs usually say
              `layer_norm_eps=1e-12`: pass `norm_eps=config.layer_norm_eps` (a folder's
              config.json is checked against the model).
  resolution  a checkpoint whose patch grid differs from the model's has its position
              embeddings resampled in 2D (prefix rows kept), with `resample=`:
                'timm' bicubic, antialias (timm loading a checkpoint at another size);
                'hf'   bicubic, no antialias (Hugging Face `interpolate_pos_encoding`, and
                       this package's `dynamic_image_size=True`);
                'jax'  bilinear, align_corners=True (the JAX code's scipy.ndimage.zoom, order 1);
              or a dict of `vit_pytorch.vit.resample_pos_embedding` options, e.g.
              `dict(mode='bilinear')` for timm's own `.npz` loader. The checkpoint's grid is
              the model's when the position counts agree, else the folder's config.json,
              else `checkpoint_grid=(h, w)`, else a square.

    import torch
    from vit_pytorch.pretrained import vit, vit_base_patch16_224, num_parameters, load_timm

    num_parameters('B/16')                                  # 86567656, counted on the meta device
    model = vit('Ti/16', image_size=64, num_classes=10)     # the paper's ViT-Ti/16, at 64x64
    logits = model(torch.randn(1, 3, 64, 64))               # (1, 10)
    # with a checkpoint you have:
    #   load_timm(vit_base_patch16_224(), 'vit_base_patch16_224.safetensors')
    #   load_jax(vit('B/16', image_size=384, gelu_approximate='tanh'), 'ViT-B_16.npz')  # resampled to 24x24

Plans. Each model's module ends with a section "# loading checkpoints" holding one function per
format it takes: `timm_plan`, `hf_plan`, `jax_plan`, `vit_pytorch_plan`, `official_plan`, each
`(model, checkpoint_keys) -> (plan, head_prefixes)`:
  plan           {our key: ({checkpoint key: expected shape}, convert)}; convert(*tensors) gives
                 our tensor. A position table has convert = dict(num_prefix_tokens=p, grid=(h, w))
                 and shape None: it is checked and resampled here. A convert that returns None drops its
                 checkpoint keys (a parameter the checkpoint's model keeps but never reads); its plan key is
                 a description, no key of the model.
  head_prefixes  the checkpoint's head keys start with one of these (left out by load_head=False).
A plan raises ValueError saying what differs when the model cannot hold such checkpoints;
`vit_pytorch_plan` returns None when the keys already agree (a strict `load_state_dict`).
The loaders use the module of the model's class, or of the first base class whose module has
that section; the core `ViT`'s plans are the ones at the end of this module (the paper's ViT).

Only torch and einops are needed, plus safetensors or numpy to read those files.
"""

import copy
import json
import math
import os
import pickle
import re
import stat
import sys
import zipfile
from collections.abc import Mapping

import torch
from einops import rearrange
from torch import nn

from vit_pytorch.vit import ViT, positive_pair, resample_pos_embedding

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
    """A weight file that cannot be read safely or does not fit the model: corrupt, truncated or
    disguised files, missing, unexpected or misshapen entries, an unsafe (pickled-object) file, or
    a checkpoint of a model that computes something else. The message names the file."""


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
    'load_timm', 'load_hf', 'load_jax', 'load_vit_pytorch', 'load_official', 'read_checkpoint',
    'vit_tiny_patch16_224', 'vit_tiny_patch16_384', 'vit_small_patch8_224', 'vit_small_patch16_224',
    'vit_small_patch16_384', 'vit_small_patch32_224', 'vit_small_patch32_384', 'vit_base_patch8_224',
    'vit_base_patch16_224', 'vit_base_patch16_384', 'vit_base_patch32_224', 'vit_base_patch32_384',
    'vit_large_patch14_224', 'vit_large_patch16_224', 'vit_large_patch16_384', 'vit_large_patch32_224',
    'vit_large_patch32_384', 'vit_huge_patch14_224',
]


# reading files

SAFETENSORS, NPZ, TORCH = 'safetensors', 'npz', 'torch'
WHAT = {SAFETENSORS: 'a safetensors file', NPZ: 'a numpy .npz archive', TORCH: 'a torch file (torch.save)',
        'npy': 'a single numpy array (.npy), not a set of named weights', 'zip': 'a zip archive of other files',
        'empty': 'empty (truncated to nothing, or never written)',
        'unknown': 'none of safetensors, .npz or a torch file'}
ZIPPED = (NPZ, TORCH)   # both are zip archives
# the weights a Hugging Face `save_pretrained` folder may hold, in the order they are looked for
FOLDER_WEIGHTS = ('model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin',
                  'pytorch_model.bin.index.json')


def read_checkpoint(source):
    """A flat {name: tensor} from a path (.safetensors, .npz, a torch file, or a `save_pretrained`
    folder) or a mapping.

    A file is recognised by its content; one whose content is not what its name says is refused.
    Torch files are read with `weights_only=True`; a `{'model': ...}` or `{'state_dict': ...}`
    wrapper (DeiT's and many training scripts' `.pth` files) is unwrapped.
    """
    return _read(source)[0]


def _read(source):
    """(state_dict, name of the source for messages, the folder's config.json as a dict or None)."""
    if isinstance(source, Mapping):
        return _tensors(dict(source), 'the state_dict'), 'the state_dict', None
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"checkpoint must be a path or a state_dict mapping, got {type(source).__name__}")
    path = os.fspath(source)
    if stat.S_ISDIR(_stat(path, 'a weight file or a save_pretrained folder').st_mode):
        return _read_folder(path)
    return _read_file(path), path, None


def _stat(path, expected):
    """The path's stat, or a CheckpointError saying why there is nothing readable there.

    Judged before anything is opened: opening a FIFO blocks until something writes to it."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        broken = ' (a link to nothing)' if os.path.islink(path) else ''
        raise CheckpointError(f"{path}: does not exist{broken}; expected {expected}") from None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot look at it ({error.strerror or error}); expected {expected}") from None


def _regular_file(path, expected):
    """Refuse anything at `path` but a regular file (a folder, a FIFO, a socket or a device)."""
    mode = _stat(path, expected).st_mode
    if not stat.S_ISREG(mode):
        kind = ('a folder' if stat.S_ISDIR(mode) else 'a FIFO (named pipe)' if stat.S_ISFIFO(mode) else
                'a socket' if stat.S_ISSOCK(mode) else 'a device' if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
                'not a regular file')
        raise CheckpointError(f"{path}: is {kind}, not a file; expected {expected}")


# safetensors' own reader refuses headers above 100 MB
MAX_SAFETENSORS_HEADER = 100_000_000


def _file_kind(path):
    """What the file holds, judged by what it provably is: a safetensors header that fits the file
    and parses, a zip archive's member names, then the magic bytes of .npy and pickle files."""
    try:
        size = os.path.getsize(path)
        with open(path, 'rb') as file:
            head = file.read(16)
            # safetensors: an 8-byte little-endian header length, then a JSON header starting with '{'.
            # Tested first, because the length's low bytes can be anything, 'PK' or 0x80 included.
            if head[8:9] == b'{':
                length = int.from_bytes(head[:8], 'little')
                if length > min(size - 8, MAX_SAFETENSORS_HEADER):
                    return 'broken safetensors'
                file.seek(8)
                try:
                    header = json.loads(file.read(length).decode('utf-8'))
                except ValueError:       # not UTF-8, or not JSON (UnicodeDecodeError is a ValueError)
                    return 'broken safetensors'
                if isinstance(header, dict):
                    return SAFETENSORS
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read it ({error.strerror or error})") from error
    if not head:
        return 'empty'
    if head.startswith(b'PK'):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except zipfile.BadZipFile:
            return 'broken zip'
        if names and all(name.endswith('.npy') for name in names):
            return NPZ
        return TORCH if any(name.endswith('data.pkl') for name in names) else 'zip'
    if head.startswith(b'\x93NUMPY'):
        return 'npy'
    if head.startswith(b'\x80'):          # a pickle: torch's legacy (pre-1.6) format
        return TORCH
    return 'unknown'


# what each damaged container is, when the file's name says it should be that container
BROKEN = {'broken zip': (ZIPPED, 'a zip archive whose directory cannot be read'),
          'broken safetensors': ((SAFETENSORS,), 'its header does not fit the file or is not a JSON object')}


def _read_file(path):
    expected = SAFETENSORS if path.endswith('.safetensors') else NPZ if path.endswith('.npz') else TORCH
    _regular_file(path, WHAT[expected])
    kind = _file_kind(path)
    if kind in BROKEN and expected in BROKEN[kind][0]:
        raise CheckpointError(f"{path}: cannot read it as {WHAT[expected]}: it is corrupt or truncated "
                              f"({BROKEN[kind][1]})")
    if kind in BROKEN:
        kind = 'unknown'
    if kind != expected:
        raise CheckpointError(f"{path}: its name says {WHAT[expected]}, but the file is {WHAT[kind]}"
                              + ("; rename it if that is what it holds" if kind in (SAFETENSORS, NPZ, TORCH) else ''))
    try:
        if kind == SAFETENSORS:
            from safetensors.torch import load_file
            state_dict = load_file(path)
        elif kind == NPZ:
            import numpy as np
            with np.load(path, allow_pickle=False) as arrays:
                state_dict = {name: torch.from_numpy(arrays[name]) for name in arrays.files}
        else:
            state_dict = torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{path}: refused to unpickle it: it holds objects other than tensors and plain containers, "
            f"and unpickling those can run arbitrary code. Re-save only the state_dict, or use safetensors. "
            f"({str(error).splitlines()[0]})") from error
    except Exception as error:    # whatever the reader met: the file is not what it claims to be
        detail = str(error).splitlines()[0] if str(error) else 'no detail'
        if kind == NPZ and 'pickle' in detail:
            raise CheckpointError(f"{path}: refused to read an .npz holding pickled objects ({detail})") from error
        raise CheckpointError(f"{path}: cannot read it as {WHAT[kind]}: it is corrupt or truncated "
                              f"({type(error).__name__}: {detail})") from error
    if not isinstance(state_dict, Mapping):
        raise CheckpointError(f"{path}: holds a {type(state_dict).__name__}, not a state_dict of named tensors")
    return _tensors(dict(state_dict), path)


def _read_json(path, expected):
    """A JSON object from a file (a folder's config.json or shard index), or a CheckpointError naming it."""
    _regular_file(path, expected)
    try:
        with open(path, 'rb') as file:
            text = file.read().decode('utf-8')
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read it ({error.strerror or error}); expected {expected}") from error
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{path}: not UTF-8 text ({error}); expected {expected}") from error
    try:
        value = json.loads(text)
    except ValueError as error:
        raise CheckpointError(f"{path}: cannot read it as JSON: corrupt or truncated ({error}); "
                              f"expected {expected}") from error
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: holds a JSON {type(value).__name__}, not an object; expected {expected}")
    return value


def _read_folder(path):
    """The weights and config.json of a `save_pretrained` folder (Hugging Face, or timm's hub folders)."""
    config_path = os.path.join(path, 'config.json')
    # lexists: a folder, a FIFO or a dangling link under a name save_pretrained writes is an error, not skipped
    config = _read_json(config_path, 'the JSON object save_pretrained writes') \
        if os.path.lexists(config_path) else None
    for name in FOLDER_WEIGHTS:
        weights = os.path.join(path, name)
        if not os.path.lexists(weights):
            continue
        if not name.endswith('.index.json'):
            return _read_file(weights), weights, config
        return _read_shards(path, weights), weights, config
    present = ', '.join(sorted(os.listdir(path))) or 'nothing'
    raise CheckpointError(f"{path}: a folder without weights: expected one of {', '.join(FOLDER_WEIGHTS)} "
                          f"(as save_pretrained writes them); it holds {present}")


def _read_shards(folder, index):
    """The state_dict of the shards an index names, each holding exactly the keys the index gives it."""
    weight_map = _read_json(index, "a shard index (a JSON object with a 'weight_map')").get('weight_map')
    if not isinstance(weight_map, dict) or not all(isinstance(shard, str) for shard in weight_map.values()):
        raise CheckpointError(f"{index}: not a readable shard index: its 'weight_map' must map each key to a "
                              f"shard's file name, got {type(weight_map).__name__}")
    state_dict = {}
    for shard in sorted(set(weight_map.values())):
        if os.path.basename(shard) != shard or shard in ('', '.', '..'):
            raise CheckpointError(f"{index}: names the shard {shard!r}, which is not a file name in {folder}")
        shard_path = os.path.join(folder, shard)
        if not os.path.lexists(shard_path):
            raise CheckpointError(f"{shard_path}: does not exist, but the shard index {index} names it")
        tensors = _read_file(shard_path)
        wanted = {key for key, name in weight_map.items() if name == shard}
        if tensors.keys() != wanted:
            lacks, extra = sorted(wanted - tensors.keys()), sorted(tensors.keys() - wanted)
            raise CheckpointError(f"{shard_path}: does not hold what the shard index {index} says"
                                  + (f"; it lacks {', '.join(lacks[:5])}" if lacks else '')
                                  + (f"; it also holds {', '.join(extra[:5])}" if extra else ''))
        state_dict.update(tensors)
    return state_dict


def _tensors(state_dict, name):
    for wrapper in ('model', 'state_dict'):
        if set(state_dict) == {wrapper} and isinstance(state_dict[wrapper], Mapping):
            state_dict = dict(state_dict[wrapper])
    tensors = {key: _as_tensor(value) for key, value in state_dict.items()}
    others = [f"{key} ({type(state_dict[key]).__name__})" for key, value in tensors.items() if value is None]
    if others:
        raise CheckpointError(f"{name}: these entries are not tensors: {', '.join(others[:5])}"
                              f"{' ...' if len(others) > 5 else ''}; save only the model's state_dict")
    return tensors


def _as_tensor(value):
    """A tensor, or a numpy array of numbers as one (in-memory JAX parameters); None for anything else."""
    if isinstance(value, torch.Tensor):
        return value
    if type(value).__module__ == 'numpy' and getattr(getattr(value, 'dtype', None), 'kind', 'O') in 'biuf':
        return torch.as_tensor(value)
    return None


# the loaders


FORMATS = {'timm': 'timm', 'hf': 'Hugging Face', 'jax': 'JAX', 'vit_pytorch': 'vit-pytorch',
           'official': "the paper's official code"}
# the same as a noun, for messages ("no timm checkpoints exist", "the timm checkpoint does not fit")
CHECKPOINTS = {**{fmt: f'{source} checkpoints' for fmt, source in FORMATS.items()},
               'official': "checkpoints of the paper's official code"}


def _one_checkpoint(fmt):
    return CHECKPOINTS[fmt].replace('checkpoints', 'checkpoint')


def load_timm(model, checkpoint, *, resample='timm', load_head=True, checkpoint_grid=None):
    """Load a timm state_dict (or file) into `model`; returns the model.

    `model` is the matching model of this package: `ViT` for `vit_*` / `deit_*`, `deit.DeiT`
    for `deit_*_distilled_*`, `CaiT`, `XCiT`, `CrossViT`, or the parallel `ViT` for
    `vit_*_18x2_*`. `load_head=False` leaves the checkpoint's head(s) and pre-logits layer out
    (fine-tuning on other classes); `checkpoint_grid=(h, w)` is the patch grid the checkpoint
    was trained at, needed only to resample a table that is neither the model's nor square.
    """
    return _load_format(model, checkpoint, 'timm', resample=resample, load_head=load_head,
                        checkpoint_grid=checkpoint_grid)


def load_hf(model, checkpoint, *, resample='hf', load_head=True, checkpoint_grid=None):
    """Load a Hugging Face `ViTModel` / `ViTForImageClassification` (into `ViT`) or a
    `DeiTForImageClassificationWithTeacher` (into `deit.DeiT`): a `save_pretrained` folder,
    its `model.safetensors`, or a state_dict.

    A folder's config.json gives the checkpoint's grid and is checked against the model: its
    `layer_norm_eps` (usually 1e-12) and `hidden_act` must be the model's `norm_eps` and GELU.
    `qkv_bias=False` checkpoints load into models built with `qkv_bias=False`. A `ViTModel`
    pooler loads into the pre-logits layer (`pre_logits_dim=dim`), or is left out with
    `load_head=False`.
    """
    return _load_format(model, checkpoint, 'hf', resample=resample, load_head=load_head,
                        checkpoint_grid=checkpoint_grid)


def load_jax(model, checkpoint, *, resample='jax', load_head=True, checkpoint_grid=None):
    """Load an official JAX `.npz` checkpoint (google-research/vision_transformer) into `model`.

    The JAX code uses the tanh GELU: build with `gelu_approximate='tanh'` to reproduce its
    outputs, or keep the exact GELU to reproduce timm / Hugging Face running the same weights.
    The ImageNet-21k files carry `pre_logits` (build with `pre_logits_dim=dim`, or `load_head=False`).
    """
    return _load_format(model, checkpoint, 'jax', resample=resample, load_head=load_head,
                        checkpoint_grid=checkpoint_grid)


def load_official(model, checkpoint, *, load_head=True):
    """Load a checkpoint saved by a paper's official code (for models that no library of record has:
    CrossFormer, RegionViT, ScalableViT, SepViT; Jumbo built with `patch_side='paper'` and ViT-5 with
    `rope_layout='official'`) into the matching model; returns the model.

    Build the model as the checkpoint's configuration (its named configuration, e.g.
    `crossformer_tiny()`), at the checkpoint's image size. `load_head=False` leaves the head out.
    """
    return _load_format(model, checkpoint, 'official', resample='timm', load_head=load_head,
                        checkpoint_grid=None)


def load_vit_pytorch(model, checkpoint):
    """Load a state_dict saved by the `vit-pytorch` package into the matching model; returns the model.

    Build the model with the keyword arguments the checkpoint was saved with. Models whose
    parameters already carry vit-pytorch's names load strictly; the others are converted
    (split or fused projections, a head LayerNorm that is our final norm). A model whose
    vit-pytorch counterpart computes another function is refused with what differs.
    """
    plan_function = _plan_function(model, 'vit_pytorch')
    state_dict, name, _ = _read(checkpoint)
    planned = _make_plan(plan_function, model, state_dict, name, 'vit_pytorch')
    if planned is not None:
        return _load(model, state_dict, *planned, name=name, fmt='vit_pytorch', resample=RESAMPLE['timm'],
                     load_head=True)
    # the keys agree: the model's own load hooks bring older layouts up to date. Tried on a copy
    # first, so that a checkpoint that does not fit leaves the model untouched.
    _refuse_another_model(list(model.state_dict()), (), state_dict, name, 'vit_pytorch', model)
    trial = copy.deepcopy(model)
    try:
        trial.load_state_dict(state_dict, strict=True)
    except (RuntimeError, ValueError) as error:
        raise CheckpointError(f"{name}: the vit-pytorch checkpoint does not fit this {type(model).__name__} "
                              f"(nothing was copied): {error}") from error
    model.load_state_dict(trial.state_dict())
    return model


def _load_format(model, checkpoint, fmt, *, resample, load_head, checkpoint_grid):
    plan_function = _plan_function(model, fmt)
    state_dict, name, config = _read(checkpoint)
    if fmt == 'jax' and any(key.startswith('opt/target/') for key in state_dict):
        # old optimizer checkpoints nest the parameters under opt/target/
        state_dict = {key.removeprefix('opt/target/'): value for key, value in state_dict.items()}
    config_grid = _check_hf_config(model, config, name) if fmt == 'hf' and config else None
    plan, head_prefixes = _make_plan(plan_function, model, state_dict, name, fmt)
    return _load(model, state_dict, plan, head_prefixes, name=name, fmt=fmt, resample=resample,
                 load_head=load_head, checkpoint_grid=checkpoint_grid, config_grid=config_grid)


def _plans_of(cls):
    """{format: plan function} of the module that defines `cls` (this module for the core ViT)."""
    module = sys.modules[__name__] if cls is ViT else sys.modules.get(cls.__module__)
    return {fmt: getattr(module, f'{fmt}_plan') for fmt in FORMATS if callable(getattr(module, f'{fmt}_plan', None))}


def _plan_function(model, fmt):
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a vit_pytorch model (an nn.Module), got {type(model).__name__}")
    for cls in type(model).__mro__:
        plans = _plans_of(cls)
        if plans:
            if fmt not in plans:
                raise TypeError(f"no {CHECKPOINTS[fmt]} exist for {_model_name(model)}; it loads: "
                                f"{', '.join(FORMATS[other] for other in plans)}")
            return plans[fmt]
    raise TypeError(f"model must be a vit_pytorch model with checkpoint plans, got {type(model).__name__}")


def _model_name(model):
    # the variants' `ViT` classes share the core's name: say which module's
    cls = type(model)
    if cls.__name__ == ViT.__name__ and cls is not ViT:
        return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"
    return cls.__name__


def _make_plan(plan_function, model, state_dict, name, fmt):
    try:
        return plan_function(model, list(state_dict))
    except ValueError as error:      # the plan says what differs between the model and such checkpoints
        # advice on an option is for a file of this model: judge that first, against the plan the
        # model's own options give (the plan with no checkpoint keys to sense options from)
        try:
            plan, head_prefixes = plan_function(model, [])
        except ValueError:
            plan = None
        if plan is not None:
            _refuse_another_model([key for sources, _ in plan.values() for key in sources], tuple(head_prefixes),
                                  state_dict, name, fmt, model)
        raise CheckpointError(f"{name}: {error}") from error


def _key_pattern(key):
    # block, stage and layer numbers do not tell one model's keys from another's
    return re.sub(r'(?<=[./_])\d+(?=[./]|$)', '#', key)


def _shares_pattern(pattern, patterns):
    # one wrapper module around the model (`vit.`, `module.`) does not make a key another model's
    return any(pattern == other or pattern.partition('.')[2] == other or other.partition('.')[2] == pattern
               for other in patterns)


# key patterns characteristic of the models people load, to say what another model's file looks like
LOOKS_LIKE = (
    (r'^stages\.#\.blocks\.#\.attn_block\.', "timm's MaxViT (maxvit_*)"),
    (r'^layers\.#\.blocks\.#\.attn\.cpb_mlp\.', "timm's Swin V2 (swinv2_*)"),
    (r'^layers\.#\.blocks\.#\.attn\.relative_position_bias_table$', "timm's Swin (swin_*)"),
    (r'^stages\.#\.blocks\.#\.attn\.attention_biases$', "timm's LeViT (levit_*)"),
    (r'^stages\.#\.blocks\.#\.attn\.kv\.weight$', "timm's PVT v2 (pvt_v2_*)"),
    (r'^levels\.#\.transformer_encoder\.', "timm's NesT (nest_*)"),
    (r'^transformers\.#\.blocks\.#\.attn\.', "timm's PiT (pit_*)"),
    (r'^blocks\.#\.#\.attn\.kv\.weight$', "timm's Twins (twins_*)"),
    (r'^stages\.#\.#\.conv1_1x1\.', "timm's MobileViT (mobilevit_*)"),
    (r'^blocks_token_only\.', "timm's CaiT (cait_*)"),
    (r'^cls_attn_blocks\.', "timm's XCiT (xcit_*)"),
    (r'^blocks\.#\.blocks\.#\.#\.attn\.', "timm's CrossViT (crossvit_*)"),
    (r'^blocks\.#\.attn\.qkv\.weight$', "timm's ViT or DeiT (vit_*, deit_*)"),
    (r'(^|\.)encoder\.layer\.#\.attention\.attention\.query\.weight$', "a Hugging Face ViT or DeiT"),
    (r'^cvt\.encoder\.stages\.', "Hugging Face's CvT"),
    (r'^Transformer/encoderblock_#/', "the official JAX ViT (.npz)"),
    (r'^transformer\.layers\.#\.', "vit-pytorch's parameter names"),
)


def _refuse_another_model(expected_keys, head_prefixes, state_dict, name, fmt, model):
    """A CheckpointError when the file has under a quarter of the key patterns (numbers aside, heads
    aside) that such checkpoints of this model have: no option of this model would make it fit."""
    expected = {_key_pattern(key) for key in expected_keys if not (head_prefixes and key.startswith(head_prefixes))}
    held = {_key_pattern(key) for key in state_dict}
    shared = [pattern for pattern in expected if _shares_pattern(pattern, held)]
    if not expected or 4 * len(shared) >= len(expected):
        return
    looks = next((what for regex, what in LOOKS_LIKE
                  if any(re.search(regex, key) or re.search(regex, key.partition('.')[2]) for key in held)), None)
    tops = sorted({re.split(r'[./]', key)[0] for key in state_dict})
    missing = sorted(expected - set(shared))
    raise CheckpointError(
        f"{name}: it holds weights for another model ({'it looks like ' + looks + '; ' if looks else ''}"
        f"its keys start with {', '.join(tops[:8])}{' ...' if len(tops) > 8 else ''}): it has {len(shared)} of the "
        f"{len(expected)} kinds of key that {CHECKPOINTS[fmt]} of {_model_name(model)} hold (it lacks "
        f"{', '.join(missing[:3])} ...). Load it into the model it was saved from, with the loader of its source")


def _check_hf_config(model, config, name):
    """Refuse a folder whose config.json computes another function than the model; its patch grid.

    Only ViT-family configs (model_type 'vit', 'deit', 'vivit') apply `layer_norm_eps` and `hidden_act`
    to every LayerNorm and GELU; other models' configs may carry these fields unused (CvT keeps eps 1e-5).
    """
    if config.get('model_type') not in ('vit', 'deit', 'vivit'):
        return None
    eps = config.get('layer_norm_eps')
    ours = sorted({module.eps for module in model.modules() if isinstance(module, nn.LayerNorm)})
    if eps is not None and any(not math.isclose(value, eps, rel_tol=1e-6) for value in ours):
        raise CheckpointError(f"{name}: its config.json says layer_norm_eps={eps}, the model's LayerNorms use "
                              f"eps {', '.join(map(str, ours))}: build the model with norm_eps={eps}")
    act = config.get('hidden_act')
    approximate = {'gelu': 'none', 'gelu_new': 'tanh', 'gelu_pytorch_tanh': 'tanh', 'gelu_fast': 'tanh'}
    gelus = sorted({module.approximate for module in model.modules() if isinstance(module, nn.GELU)})
    if act is not None and (act not in approximate or any(value != approximate[act] for value in gelus)):
        wanted = f"gelu_approximate={approximate[act]!r}" if act in approximate else "an activation this package has"
        raise CheckpointError(f"{name}: its config.json says hidden_act={act!r}, the model's GELUs use "
                              f"approximate={gelus}: build the model with {wanted}")
    image_size, patch_size = config.get('image_size'), config.get('patch_size')
    try:
        (image_height, image_width), (patch_height, patch_width) = (
            [value] * 2 if isinstance(value, int) else value for value in (image_size, patch_size))
        return image_height // patch_height, image_width // patch_width
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def _resample_options(resample):
    if isinstance(resample, str):
        if resample not in RESAMPLE:
            raise ValueError(f"resample must be one of {sorted(RESAMPLE)} or a dict of resample_pos_embedding "
                             f"options, got {resample!r}")
        return RESAMPLE[resample]
    if not isinstance(resample, Mapping):
        raise TypeError(f"resample must be one of {sorted(RESAMPLE)} or a dict of resample_pos_embedding options, "
                        f"got {type(resample).__name__}")
    return dict(resample)


def _load(model, state_dict, plan, head_prefixes, *, name, fmt, resample, load_head, checkpoint_grid=None,
          config_grid=None):
    resample = _resample_options(resample)
    head_prefixes = tuple(head_prefixes)
    tables = [ours for ours, (_, convert) in plan.items() if isinstance(convert, Mapping)]
    if checkpoint_grid is not None:
        checkpoint_grid = positive_pair('checkpoint_grid', checkpoint_grid)
        if len(tables) != 1:
            raise ValueError(f"checkpoint_grid needs a model with one position table; "
                             f"{type(model).__name__} has {len(tables)}")
    heads = {ours for ours, (sources, _) in plan.items()
             if sources and all(key.startswith(head_prefixes) for key in sources)} if head_prefixes else set()
    planned = set(plan)
    if not load_head:
        plan = {ours: entry for ours, entry in plan.items() if ours not in heads}

    wanted = [key for sources, _ in plan.values() for key in sources]
    ignored = head_prefixes if not load_head else ()
    missing = [key for key in wanted if key not in state_dict]
    unexpected = sorted(key for key in set(state_dict) - set(wanted) if not (ignored and key.startswith(ignored)))
    if missing or unexpected:
        _refuse_another_model(wanted, head_prefixes, state_dict, name, fmt, model)
        lines = [f"{name}: the {_one_checkpoint(fmt)} does not fit this {type(model).__name__}:"]
        if missing:
            lines.append(f"  missing keys ({len(missing)}): {', '.join(missing)}")
        if unexpected:
            lines.append(f"  unexpected keys ({len(unexpected)}): {', '.join(unexpected)}")
        raise CheckpointError('\n'.join(lines + _head_hint(missing + unexpected, head_prefixes)))

    targets = model.state_dict()
    converted, problems = {}, []
    for ours, (sources, convert) in plan.items():
        tensors = [state_dict[key] for key in sources]
        mismatched = [f"{key}: shape {tuple(tensor.shape)}, expected {shape}"
                      for (key, shape), tensor in zip(sources.items(), tensors)
                      if shape is not None and tuple(tensor.shape) != tuple(shape)]
        if mismatched:
            problems += mismatched
            continue
        if isinstance(convert, Mapping):
            tensor, problem = _position_table(next(iter(sources)), tensors[0], targets[ours].shape, resample,
                                              checkpoint_grid=checkpoint_grid, config_grid=config_grid, **convert)
            if problem:
                problems.append(problem)
                continue
        else:
            tensor = convert(*tensors)
            if tensor is None:      # a checkpoint's parameter the model has no use for, read and dropped
                continue
        if ours in targets and tuple(tensor.shape) != tuple(targets[ours].shape):
            problems.append(f"{', '.join(sources)}: gives {ours} of shape {tuple(tensor.shape)}, "
                            f"the model's is {tuple(targets[ours].shape)}")
            continue
        converted[ours] = tensor
    if problems:
        lines = [f"{name}: the {_one_checkpoint(fmt)} does not fit this {type(model).__name__} "
                 f"(nothing was copied):"] + [f"  {line}" for line in problems]
        raise CheckpointError('\n'.join(lines + _head_hint(problems, head_prefixes)))

    left_out = sorted(set(targets) - planned)
    if left_out:
        raise CheckpointError(f"{name}: {CHECKPOINTS[fmt]} have nothing for these parameters of "
                              f"{type(model).__name__}: {', '.join(left_out)}")
    try:
        with torch.no_grad():
            result = model.load_state_dict(converted, strict=False)
    except (RuntimeError, ValueError) as error:      # a model's own load hook refused (e.g. CCT's sine table)
        raise CheckpointError(f"{name}: {error}") from error
    if result.unexpected_keys or set(result.missing_keys) - heads:
        raise CheckpointError(f"{name}: {type(model).__name__}'s plan for {CHECKPOINTS[fmt]} does not match the "
                              f"model: missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    return model


def _position_table(key, table, target_shape, resample, *, num_prefix_tokens, grid, checkpoint_grid=None,
                    config_grid=None):
    """A checkpoint's (1, prefix + h * w, d) or (prefix + h * w, d) table on the model's grid, or a problem."""
    dim, prefix = target_shape[-1], num_prefix_tokens
    if table.ndim == 3 and table.shape[0] == 1:
        table = table[0]
    rows = table.shape[0] - prefix if table.ndim == 2 else 0
    if table.ndim != 2 or table.shape[1] != dim or rows <= 0:
        return None, (f"{key}: shape {tuple(table.shape)}, expected (1, {prefix} + h * w, {dim}) with {prefix} "
                      f"prefix token(s) before an h x w grid")
    side = math.isqrt(rows)
    if checkpoint_grid is not None:
        if math.prod(checkpoint_grid) != rows:
            return None, (f"{key}: {rows} positions after {prefix} prefix token(s), but checkpoint_grid="
                          f"{checkpoint_grid} has {math.prod(checkpoint_grid)}")
        source = checkpoint_grid
    elif config_grid is not None and math.prod(config_grid) == rows:
        source = config_grid
    elif rows == math.prod(grid):
        source = tuple(grid)
    elif side * side == rows:
        source = (side, side)
    else:
        return None, (f"{key}: {rows} positions after {prefix} prefix token(s) are neither the model's "
                      f"{grid[0]} x {grid[1]} grid nor a square one: pass checkpoint_grid=(h, w), the grid "
                      f"the checkpoint was trained at")
    table = resample_pos_embedding(table, old_grid=source, new_grid=grid, num_prefix_tokens=prefix, **resample)
    return table.reshape(target_shape), None


def _head_hint(names, head_prefixes):
    if not head_prefixes or not any(name.startswith(head_prefixes) for name in names):
        return []
    return ["  the head or pre-logits layer differs: build the model with the checkpoint's num_classes (and "
            "pre-logits layer), or pass load_head=False and call model.reset_classifier(num_classes)"]


# loading checkpoints: the paper's ViT (the core `ViT`, and the models that reuse its plans)


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


def describe_paper_vit(model, *, qkv_bias=None):
    """The sizes a plan of the paper's ViT needs, read from the core `ViT` (or a model with its
    parameter names); a ValueError names the arguments to change. `qkv_bias`: whether the
    checkpoint has a qkv bias (None: unknown)."""
    shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    first = 'transformer.layers.0.0.'
    problems = []
    if 'to_patch_embedding.1.weight' in shapes:
        problems.append('patch_norm=False')
    if getattr(model, 'pool', 'cls') != 'cls':
        problems.append("pool='cls'")
    if first + 'to_out.0.weight' not in shapes:
        problems.append('an output projection (heads > 1)')
    if qkv_bias is not None and (first + 'to_qkv.bias' in shapes) != qkv_bias:
        problems.append(f'qkv_bias={qkv_bias}')
    if problems:
        raise ValueError(f"these checkpoints hold the paper's ViT; build the model with {', '.join(problems)} "
                         f"(e.g. vit_pytorch.pretrained.vit('B/16'))")
    dim = shapes['to_patch_embedding.2.weight'][0]
    heads = model.transformer.layers[0][0].heads
    return dict(
        dim=dim, depth=len(model.transformer.layers), heads=heads,
        dim_head=shapes[first + 'to_qkv.weight'][0] // 3 // heads,
        mlp_dim=shapes['transformer.layers.0.1.net.1.weight'][0],
        patch=tuple(model.patch_size), channels=model.channels, qkv_bias=first + 'to_qkv.bias' in shapes,
        num_classes=shapes['mlp_head.weight'][0] if 'mlp_head.weight' in shapes else 0,
        pre_logits=shapes['to_latent.0.weight'][0] if 'to_latent.0.weight' in shapes else None,
        table=dict(num_prefix_tokens=model.num_prefix_tokens, grid=tuple(model.grid_size)),
    )


def _head_plan(m, names, *, transposed=False):
    """Plan entries of the pre-logits layer and head; `names` gives their checkpoint keys.

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
    return plan


def _refuse_distilled(model, keys, token):
    if token in keys and getattr(model, 'distill_token', None) is None:
        raise ValueError(f"the checkpoint is a distilled DeiT (it has {token}): load it into "
                         f"vit_pytorch.deit.DeiT, which has the distillation token and head")


def timm_plan(model, keys):
    """timm `VisionTransformer` (`vit_*`, `deit_*`) -> the core ViT."""
    _refuse_distilled(model, keys, 'dist_token')
    m = describe_paper_vit(model, qkv_bias='blocks.0.attn.qkv.bias' in keys if 'blocks.0.attn.qkv.weight' in keys
                           else None)
    d, inner, mlp, (ph, pw) = m['dim'], m['heads'] * m['dim_head'], m['mlp_dim'], m['patch']
    plan = {
        'to_patch_embedding.2.weight': ({'patch_embed.proj.weight': (d, m['channels'], ph, pw)}, _conv_to_linear),
        'to_patch_embedding.2.bias': ({'patch_embed.proj.bias': (d,)}, _same),
        'cls_token': ({'cls_token': (1, 1, d)}, _first),
        'pos_embedding': ({'pos_embed': None}, m['table']),
        'transformer.norm.weight': ({'norm.weight': (d,)}, _same),
        'transformer.norm.bias': ({'norm.bias': (d,)}, _same),
    }
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
            if our_name != '0.to_qkv.bias' or m['qkv_bias']:
                plan[ours + our_name] = ({theirs + their_name: shape}, _same)
    # timm before 0.6 kept the paper's representation layer as pre_logits.fc
    plan.update(_head_plan(m, {'pre_logits.weight': 'pre_logits.fc.weight', 'pre_logits.bias': 'pre_logits.fc.bias',
                               'head.weight': 'head.weight', 'head.bias': 'head.bias'}))
    return plan, ('head.', 'pre_logits.')


def hf_plan(model, keys):
    """Hugging Face `ViTModel` / `ViTForImageClassification` (and the encoder of `DeiT*`) -> the core ViT."""
    # the encoder sits under `vit.` (ViTForImageClassification), `deit.` (DeiT) or at the top (ViTModel)
    anchors = [key for key in keys if key.endswith('embeddings.cls_token')]
    p = anchors[0][:-len('embeddings.cls_token')] if anchors else ''
    # files on disk (and transformers < 5 in memory) use the legacy names; transformers 5 renamed them in memory
    legacy = not any(key.startswith(f'{p}layers.') for key in keys)
    layer = f'{p}encoder.layer.{{}}.' if legacy else f'{p}layers.{{}}.'
    q, k, v, o, fc1, fc2 = (
        ('attention.attention.query', 'attention.attention.key', 'attention.attention.value',
         'attention.output.dense', 'intermediate.dense', 'output.dense') if legacy else
        ('attention.q_proj', 'attention.k_proj', 'attention.v_proj', 'attention.o_proj', 'mlp.fc1', 'mlp.fc2'))
    first = layer.format(0)
    _refuse_distilled(model, keys, f'{p}embeddings.distillation_token')
    m = describe_paper_vit(model, qkv_bias=f'{first}{q}.bias' in keys if f'{first}{q}.weight' in keys else None)
    d, inner, mlp, (ph, pw) = m['dim'], m['heads'] * m['dim_head'], m['mlp_dim'], m['patch']
    plan = {
        'to_patch_embedding.2.weight': (
            {f'{p}embeddings.patch_embeddings.projection.weight': (d, m['channels'], ph, pw)}, _conv_to_linear),
        'to_patch_embedding.2.bias': ({f'{p}embeddings.patch_embeddings.projection.bias': (d,)}, _same),
        'cls_token': ({f'{p}embeddings.cls_token': (1, 1, d)}, _first),
        'pos_embedding': ({f'{p}embeddings.position_embeddings': None}, m['table']),
        'transformer.norm.weight': ({f'{p}layernorm.weight': (d,)}, _same),
        'transformer.norm.bias': ({f'{p}layernorm.bias': (d,)}, _same),
    }
    for i in range(m['depth']):
        ours, theirs = f'transformer.layers.{i}.', layer.format(i)
        for kind in ('weight', 'bias'):
            if kind == 'weight' or m['qkv_bias']:
                # HF keeps q, k and v apart; ours is one Linear with rows [q; k; v], head-major within each
                qkv_shape = (inner, d) if kind == 'weight' else (inner,)
                plan[ours + f'0.to_qkv.{kind}'] = ({theirs + f'{name}.{kind}': qkv_shape for name in (q, k, v)},
                                                  _concat)
            for our_name, their_name, shape in [
                ('0.norm', 'layernorm_before', (d,)), ('0.to_out.0', o, (d, inner)),
                ('1.net.0', 'layernorm_after', (d,)),
                ('1.net.1', fc1, (mlp, d)), ('1.net.4', fc2, (d, mlp)),
            ]:
                shape = shape[:1] if kind == 'bias' else shape
                plan[ours + f'{our_name}.{kind}'] = ({theirs + f'{their_name}.{kind}': shape}, _same)
    # ViTModel's pooler (Linear + tanh on token 0) has the shape and place of the paper's pre-logits layer
    plan.update(_head_plan(m, {'pre_logits.weight': 'pooler.dense.weight', 'pre_logits.bias': 'pooler.dense.bias',
                               'head.weight': 'classifier.weight', 'head.bias': 'classifier.bias'}))
    return plan, ('classifier.', f'{p}pooler.')


def jax_plan(model, keys):
    """The official JAX `.npz` files (pre-Linen names) -> the core ViT."""
    attn0 = 'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/'
    m = describe_paper_vit(model, qkv_bias=attn0 + 'query/bias' in keys if attn0 + 'query/kernel' in keys else None)
    d, h, e, mlp, (ph, pw) = m['dim'], m['heads'], m['dim_head'], m['mlp_dim'], m['patch']
    plan = {
        # conv kernel HWIO (p1, p2, c, d) flattens straight into our (p1 p2 c) patch order
        'to_patch_embedding.2.weight': ({'embedding/kernel': (ph, pw, m['channels'], d)},
                                        lambda w: rearrange(w, 'p1 p2 c d -> d (p1 p2 c)')),
        'to_patch_embedding.2.bias': ({'embedding/bias': (d,)}, _same),
        'cls_token': ({'cls': (1, 1, d)}, _first),
        'pos_embedding': ({'Transformer/posembed_input/pos_embedding': None}, m['table']),
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
        if m['qkv_bias']:
            plan[ours + '0.to_qkv.bias'] = (
                {attn + f'{name}/bias': (h, e) for name in ('query', 'key', 'value')},
                lambda *bs: torch.cat([rearrange(b, 'h e -> (h e)') for b in bs]))
        plan[ours + '0.to_out.0.weight'] = ({attn + 'out/kernel': (h, e, d)},
                                           lambda w: rearrange(w, 'h e d -> d (h e)'))
        plan[ours + '0.to_out.0.bias'] = ({attn + 'out/bias': (d,)}, _same)
        for our_name, norm in (('0.norm', 'LayerNorm_0'), ('1.net.0', 'LayerNorm_2')):
            plan[ours + our_name + '.weight'] = ({block + norm + '/scale': (d,)}, _same)
            plan[ours + our_name + '.bias'] = ({block + norm + '/bias': (d,)}, _same)
        plan[ours + '1.net.1.weight'] = ({mlp_block + 'Dense_0/kernel': (d, mlp)}, _transpose)
        plan[ours + '1.net.1.bias'] = ({mlp_block + 'Dense_0/bias': (mlp,)}, _same)
        plan[ours + '1.net.4.weight'] = ({mlp_block + 'Dense_1/kernel': (mlp, d)}, _transpose)
        plan[ours + '1.net.4.bias'] = ({mlp_block + 'Dense_1/bias': (d,)}, _same)
    plan.update(_head_plan(m, {'pre_logits.weight': 'pre_logits/kernel', 'pre_logits.bias': 'pre_logits/bias',
                               'head.weight': 'head/kernel', 'head.bias': 'head/bias'}, transposed=True))
    return plan, ('head/', 'pre_logits/')


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `ViT` has our parameter names (older layouts are fixed by `ViT`'s load hook)."""
    return None
