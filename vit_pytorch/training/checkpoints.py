"""Training checkpoints: safetensors weights, a JSON model configuration, and the training state.

A checkpoint is a folder:

    model.safetensors      the model's weights; its header repeats config.json, so this one
                           file is enough to rebuild and evaluate the model
    config.json            model name and keyword arguments (see `vit_pytorch.models`), classes,
                           image size and normalisation
    optimizer.safetensors  optimizer tensors (AdamW moments and step counts), for --resume
    state.json             epoch, step, optimizer hyperparameters, the log so far, the run's arguments

Nothing is unpickled: tensors come from safetensors and everything else from JSON. Both weight
files carry a sha256 of their tensors in their header, checked on reading. Every file is read
into memory whole (no memory map stays open on it), and every file that cannot be read or does
not hold what it should is a `CheckpointError` naming it. A folder is written next to the old one
and swapped in, so an interruption leaves the previous checkpoint whole.

    from vit_pytorch.checkpoint import load_model

    model, config = load_model('runs/digits-vit/checkpoint')
"""

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import torch

# one error for every weight file the package reads: training checkpoints and pretrained weights alike
from vit_pytorch.pretrained import CheckpointError

FORMAT = 'vit_pytorch.checkpoint'
VERSION = 1
MODEL_FILE, CONFIG_FILE = 'model.safetensors', 'config.json'
OPTIMIZER_FILE, STATE_FILE = 'optimizer.safetensors', 'state.json'


def _safetensors():
    from vit_pytorch.training.extras import require

    require('safetensors', 'numpy', purpose='reading and writing checkpoints')
    import safetensors.torch
    return safetensors


# writing


def _optimizer_tensors(optimizer):
    """Optimizer state as flat tensors plus the JSON-able rest (hyperparameters, non-tensor state)."""
    state_dict = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, state in state_dict['state'].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f'state.{index}.{key}'] = value.detach().cpu().contiguous()
            else:
                scalars[f'{index}.{key}'] = value
    return tensors, dict(param_groups=state_dict['param_groups'], scalars=scalars)


def save_checkpoint(directory, *, model, config, optimizer=None, state=None):
    """Write `model`'s weights and `config` (plus `optimizer` and the JSON-able `state`) to `directory`."""
    safetensors = _safetensors()
    directory = Path(directory)
    config = dict(config, format=FORMAT, version=VERSION)
    config_text = json.dumps(config, indent=2, sort_keys=True)
    staging = directory.with_name(directory.name + '.tmp')
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    # safetensors' save_file creates its files with mode 0600; written here, every file gets the umask's mode
    weights = {key: value.detach().cpu().contiguous() for key, value in model.state_dict().items()}
    (staging / MODEL_FILE).write_bytes(
        safetensors.torch.save(weights, metadata={'config': config_text, 'sha256': _digest(weights)}))
    (staging / CONFIG_FILE).write_text(config_text + '\n')
    if optimizer is not None:
        tensors, rest = _optimizer_tensors(optimizer)
        (staging / OPTIMIZER_FILE).write_bytes(safetensors.torch.save(tensors, metadata={'sha256': _digest(tensors)}))
        (staging / STATE_FILE).write_text(json.dumps(dict(state or {}, optimizer=rest), indent=1) + '\n')

    # swap: the old folder is removed only once the new one is complete
    previous = directory.with_name(directory.name + '.old')
    shutil.rmtree(previous, ignore_errors=True)
    if directory.exists():
        directory.rename(previous)
    staging.rename(directory)
    shutil.rmtree(previous, ignore_errors=True)
    return directory


# reading


def _digest(tensors):
    """sha256 of the tensors' names, dtypes, shapes and bytes: safetensors itself has no checksum."""
    digest = hashlib.sha256()
    for key in sorted(tensors):
        tensor = tensors[key].detach().cpu().contiguous()
        digest.update(f'{key}|{tensor.dtype}|{tuple(tensor.shape)}|'.encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _locate(path):
    """(folder, model file) for a checkpoint folder or its model.safetensors."""
    path = Path(path)
    if path.is_dir():
        return path, path / MODEL_FILE
    if path.exists():
        return path.parent, path
    hint = ''
    if path.with_name(path.name + '.old').is_dir():
        hint = f" (an interrupted save left {path.name}.old next to it: rename it to {path.name} to use it)"
    raise CheckpointError(f"no checkpoint at {path}: expected a folder with {MODEL_FILE} and {CONFIG_FILE}{hint}")


def _read_bytes(file, what):
    """The whole of `file`, in memory: a CheckpointError naming it when it is missing or not a readable file."""
    if not file.exists():
        raise CheckpointError(f"checkpoint file {file} is missing ({what})")
    if not file.is_file():                    # a folder, a FIFO (reading one waits forever), a device: never opened
        raise CheckpointError(f"cannot read {file} ({what}): it is not a regular file")
    try:
        return file.read_bytes()
    except OSError as error:                                         # a folder in its place, no permission, ...
        raise CheckpointError(f"cannot read {file} ({what}): {error.strerror or error}") from error


def _read_tensors(file, what):
    """(tensors, header metadata) of a safetensors file, read into memory: nothing is left mapped onto the file,
    which may then be rewritten in place without pulling the pages from under the tensors (SIGBUS)."""
    from_bytes = _safetensors().torch.load                          # safetensors' reader: no pickle involved
    data = _read_bytes(file, what)
    try:
        tensors = from_bytes(data)                                  # each tensor owns a copy of its bytes
        header = json.loads(data[8:8 + int.from_bytes(data[:8], 'little')])
    except Exception as error:  # safetensors raises its own SafetensorError for bad headers and sizes
        raise CheckpointError(f"cannot read {file} ({what}): the file is corrupt, truncated or not "
                              f"safetensors ({error})") from error
    metadata = header.get('__metadata__') or {}
    if 'sha256' in metadata and _digest(tensors) != metadata['sha256']:
        raise CheckpointError(f"{file} ({what}) is corrupt: its tensors do not match the checksum saved with them")
    return tensors, metadata


def _read_json(file, what):
    """The JSON object in `file`; a CheckpointError naming the file for anything else."""
    data = _read_bytes(file, what)
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{file} ({what}) is not UTF-8 text (corrupt?): {error}") from error
    return _parse_json(text, file)


def _parse_json(text, source):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{source} is not valid JSON (corrupt or truncated?): {error}") from error
    if not isinstance(value, dict):
        raise CheckpointError(f"{source} must hold a JSON object, got {type(value).__name__}")
    return value


def _check_config(config, source):
    if config.get('format') != FORMAT:
        raise CheckpointError(f"{source} is not a vit_pytorch training checkpoint (format "
                              f"{config.get('format')!r}, expected {FORMAT!r})")
    if not _is_kind(config.get('version', 0), int):
        raise CheckpointError(f"{source}: 'version' must be an integer, got {config['version']!r}")
    if config.get('version', 0) > VERSION:
        raise CheckpointError(f"{source} was written by a newer vit_pytorch (checkpoint version "
                              f"{config['version']}, this one reads up to {VERSION}); upgrade vit_pytorch")
    for key, kind in (('model', str), ('model_kwargs', dict)):
        if key not in config:
            raise CheckpointError(f"{source} lacks the entry {key!r}")
        if not isinstance(config[key], kind):
            raise CheckpointError(f"{source}: {key!r} must be a JSON {_JSON_NAMES[kind]}, got "
                                  f"{type(config[key]).__name__} {config[key]!r}")
    data = config.get('data', {})
    if not isinstance(data, dict):
        raise CheckpointError(f"{source}: 'data' must be a JSON object, got {type(data).__name__}")
    for key, fits in (('channels', lambda value: _is_kind(value, int)),
                      ('image_size', lambda value: _is_kind(value, int) or (
                          isinstance(value, list) and all(_is_kind(side, int) for side in value))),
                      ('mean', lambda value: isinstance(value, list) and all(_is_kind(x, float) for x in value)),
                      ('std', lambda value: isinstance(value, list) and all(_is_kind(x, float) for x in value)),
                      ('classes', lambda value: isinstance(value, list))):
        if data.get(key) is not None and not fits(data[key]):
            raise CheckpointError(f"{source}: 'data.{key}' is {_shorten(data[key])}, which is not a {key} "
                                  f"(corrupt, or edited by hand?)")
    return config


def load_config(path):
    """The model configuration of the checkpoint at `path` (folder or model.safetensors)."""
    folder, model_file = _locate(path)
    config_file = folder / CONFIG_FILE
    if config_file.exists():
        return _check_config(_read_json(config_file, 'model configuration'), config_file)
    _, metadata = _read_tensors(model_file, 'model weights')
    if 'config' not in metadata:
        raise CheckpointError(f"{config_file} is missing and {model_file} carries no configuration in its header")
    return _check_config(_parse_json(metadata['config'], f'the header of {model_file}'), model_file)


def load_weights(model, path, *, config=None):
    """Load the checkpoint's weights into `model`; a CheckpointError lists every entry that does not fit."""
    folder, model_file = _locate(path)
    weights, metadata = _read_tensors(model_file, 'model weights')
    if config is not None and 'config' in metadata:
        stored = _parse_json(metadata['config'], f'the header of {model_file}')
        if (stored.get('model'), stored.get('model_kwargs')) != (config.get('model'), config.get('model_kwargs')):
            raise CheckpointError(
                f"{model_file} and {folder / CONFIG_FILE} disagree: the weights were saved for model "
                f"{stored.get('model')!r} {stored.get('model_kwargs')}, the config describes {config.get('model')!r} "
                f"{config.get('model_kwargs')}; were files from two runs mixed?")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    misshapen = [f"{key}: checkpoint {tuple(weights[key].shape)}, model {tuple(expected[key].shape)}"
                 for key in sorted(set(expected) & set(weights)) if weights[key].shape != expected[key].shape]
    if missing or unexpected or misshapen:
        problems = []
        for label, items in (('missing', missing), ('unexpected', unexpected), ('wrong shape', misshapen)):
            if items:
                shown = ', '.join(items[:8]) + (f', ... ({len(items)} in all)' if len(items) > 8 else '')
                problems.append(f"{label}: {shown}")
        raise CheckpointError(f"{model_file} does not fit the model ({type(model).__name__}): "
                              + '; '.join(problems))
    model.load_state_dict(weights)
    return model


def load_model(path, *, device='cpu'):
    """(model, config): the model rebuilt from the checkpoint's configuration, weights loaded, in eval mode."""
    from vit_pytorch.training.registry import build_model

    config = load_config(path)
    try:
        model = build_model(config['model'], **config['model_kwargs'])
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"cannot build model {config['model']!r} from the checkpoint at {path}: {error}") \
            from error
    load_weights(model, path, config=config)
    return model.to(device).eval(), config


def load_state(path):
    """The JSON training state of the checkpoint at `path` (epoch, elapsed, history, args, optimizer), its
    schema checked: a CheckpointError naming state.json for a missing file or any entry of the wrong kind."""
    folder, _ = _locate(path)
    state_file = folder / STATE_FILE
    if not state_file.exists():
        raise CheckpointError(f"{folder} has no training state ({STATE_FILE}): it holds weights only and cannot "
                              f"be resumed; start a new run from it instead")
    state = _read_json(state_file, 'training state')
    for key, kind in (('epoch', int), ('elapsed', float), ('history', list), ('args', dict), ('optimizer', dict)):
        if key not in state:
            raise CheckpointError(f"{state_file} lacks the entry {key!r} (corrupt, or not written by vit_pytorch?)")
        if not _is_kind(state[key], kind):
            raise CheckpointError(f"{state_file}: {key!r} must be a JSON {_JSON_NAMES[kind]}, got "
                                  f"{type(state[key]).__name__} {_shorten(state[key])}")
    if state['epoch'] < 0 or not math.isfinite(state['elapsed']) or state['elapsed'] < 0:
        raise CheckpointError(f"{state_file}: 'epoch' {state['epoch']} and 'elapsed' {state['elapsed']} must be "
                              f"counts of epochs and seconds, at least 0")
    history = state['history']
    if [record.get('epoch') if isinstance(record, dict) else None for record in history] != \
            list(range(1, state['epoch'] + 1)):
        raise CheckpointError(f"{state_file}: 'history' must hold one JSON object per epoch done ({state['epoch']}), "
                              f"numbered from 1, got {_shorten(history)}")
    rest = state['optimizer']
    groups, scalars = rest.get('param_groups'), rest.get('scalars', {})
    if not isinstance(groups, list) or not groups or not all(
            isinstance(group, dict) and isinstance(group.get('params'), list) for group in groups):
        raise CheckpointError(f"{state_file}: 'optimizer.param_groups' must be a list of JSON objects with "
                              f"'params', got {_shorten(groups)}")
    if not isinstance(scalars, dict):
        raise CheckpointError(f"{state_file}: 'optimizer.scalars' must be a JSON object, got {_shorten(scalars)}")
    return state


def load_training_state(path, optimizer):
    """Restore `optimizer` from the checkpoint at `path`; returns the JSON training state (epoch, log, ...).

    The optimizer file is checked before anything is restored: its checksum, every key (`state.<index>.<name>`
    of one of the optimizer's parameters), every tensor's shape (a step count is a scalar, every other tensor
    has its parameter's shape), finite values and non-negative second moments; a CheckpointError names the
    file and the key."""
    folder, _ = _locate(path)
    state = load_state(folder)
    state_file, optimizer_file = folder / STATE_FILE, folder / OPTIMIZER_FILE
    tensors, _ = _read_tensors(optimizer_file, 'optimizer state')
    rest = state.pop('optimizer')
    groups = rest['param_groups']
    if [len(group['params']) for group in groups] != [len(group['params']) for group in optimizer.param_groups]:
        raise CheckpointError(
            f"{state_file}: the optimizer's parameter groups hold {[len(group['params']) for group in groups]} "
            f"parameters, this model's optimizer {[len(group['params']) for group in optimizer.param_groups]}: "
            f"the checkpoint is of another model")
    for saved, group in zip(groups, optimizer.param_groups):
        for name, value in group.items():
            if name != 'params' and name in saved and not _same_kind(saved[name], value):
                raise CheckpointError(f"{state_file}: the optimizer's {name!r} is {saved[name]!r}, expected a "
                                      f"value like {value!r}")
    parameters = dict(zip((index for group in groups for index in group['params']),
                          (parameter for group in optimizer.param_groups for parameter in group['params'])))

    optimizer_state = {}
    for key, value in tensors.items():
        index, name = _state_key(key, r'state\.(\d+)\.(\w+)', 'state.<index>.<name>', parameters, optimizer_file)
        _check_moment(value, name, parameters[index], key, optimizer_file)
        optimizer_state.setdefault(index, {})[name] = value
    for key, value in rest.get('scalars', {}).items():
        index, name = _state_key(key, r'(\d+)\.(\w+)', '<index>.<name>', parameters, state_file)
        optimizer_state.setdefault(index, {})[name] = value
    kinds = {frozenset(entries) for entries in optimizer_state.values()}
    if len(kinds) > 1:
        raise CheckpointError(f"{optimizer_file} is incomplete: its parameters hold different entries "
                              f"({', '.join(sorted(map(str, map(sorted, kinds))))})")
    try:
        optimizer.load_state_dict(dict(state=optimizer_state, param_groups=groups))
    except (ValueError, KeyError, TypeError, RuntimeError) as error:
        raise CheckpointError(f"the optimizer state in {folder} does not fit this model's optimizer: {error}") \
            from error
    return state


# the parts of a file's contents: what each must be

_JSON_NAMES = {int: 'integer', float: 'number', str: 'string', list: 'list', dict: 'object'}


def _is_kind(value, kind):
    """Whether the JSON value is of `kind` (a number may be an integer; a bool is neither)."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, (int, float) if kind is float else kind)


def _same_kind(saved, current):
    """Whether a hyperparameter read from JSON can stand where the optimizer's `current` value is."""
    if current is None or isinstance(current, bool):
        return saved is None or isinstance(saved, bool)
    if isinstance(current, (int, float)):
        return _is_kind(saved, float) and math.isfinite(saved)
    if isinstance(current, (tuple, list)):
        return isinstance(saved, list) and len(saved) == len(current) and all(map(_same_kind, saved, current))
    return isinstance(saved, type(current))


def _shorten(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + '...'


def _state_key(key, pattern, form, parameters, file):
    """(parameter index, entry name) of an optimizer entry's key, which must name one of the parameters."""
    match = re.fullmatch(pattern, key)
    if match is None or int(match[1]) not in parameters:
        raise CheckpointError(f"{file}: the optimizer entry {key!r} is malformed or names no parameter of this "
                              f"model's optimizer (expected {form}, the index one of its {len(parameters)} "
                              f"parameters)")
    return int(match[1]), match[2]


def _check_moment(value, name, parameter, key, file):
    """An optimizer tensor: a finite scalar step count >= 0, or a finite tensor of its parameter's shape (a second
    moment, a mean of squares, also >= 0)."""
    shape = () if name == 'step' else tuple(parameter.shape)
    if tuple(value.shape) != shape:
        raise CheckpointError(f"{file}: {key} has shape {tuple(value.shape)}, expected {shape}"
                              + ('' if name == 'step' else ' (its parameter\'s)'))
    if not value.is_floating_point() and name != 'step':
        raise CheckpointError(f"{file}: {key} is {value.dtype}, expected a floating-point tensor")
    if not torch.isfinite(value).all():
        raise CheckpointError(f"{file}: {key} holds non-finite values (NaN or infinity)")
    if (name == 'step' or name.endswith('exp_avg_sq')) and (value < 0).any():
        raise CheckpointError(f"{file}: {key} holds negative values, which a "
                              f"{'step count' if name == 'step' else 'mean of squares'} cannot")
