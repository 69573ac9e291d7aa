"""Training checkpoints: safetensors weights, a JSON model configuration, and the training state.

A checkpoint is a folder:

    model.safetensors      the model's weights; its header repeats config.json, so this one
                           file is enough to rebuild and evaluate the model
    config.json            model name and keyword arguments (see `vit_pytorch.models`), classes,
                           image size and normalisation
    optimizer.safetensors  optimizer tensors (AdamW moments and step counts), for --resume
    state.json             epoch, step, optimizer hyperparameters, the log so far, the run's arguments

Nothing is unpickled: tensors come from safetensors and everything else from JSON. A folder is
written next to the old one and swapped in, so an interruption leaves the previous checkpoint
whole.

    from vit_pytorch.checkpoint import load_model

    model, config = load_model('runs/digits-vit/checkpoint')
"""

import hashlib
import json
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
    from vit_pytorch.evaluate import require

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
        (staging / OPTIMIZER_FILE).write_bytes(safetensors.torch.save(tensors))
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


def _read_tensors(file, what):
    safetensors = _safetensors()
    if not file.exists():
        raise CheckpointError(f"checkpoint file {file} is missing ({what})")
    try:
        with safetensors.safe_open(str(file), framework='pt') as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as error:  # safetensors raises its own SafetensorError for bad headers and sizes
        raise CheckpointError(f"cannot read {file} ({what}): the file is corrupt, truncated or not "
                              f"safetensors ({error})") from error
    if 'sha256' in metadata and _digest(tensors) != metadata['sha256']:
        raise CheckpointError(f"{file} ({what}) is corrupt: its tensors do not match the checksum saved with them")
    return tensors, metadata


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
    if config.get('version', 0) > VERSION:
        raise CheckpointError(f"{source} was written by a newer vit_pytorch (checkpoint version "
                              f"{config['version']}, this one reads up to {VERSION}); upgrade vit_pytorch")
    for key in ('model', 'model_kwargs'):
        if key not in config:
            raise CheckpointError(f"{source} lacks the entry {key!r}")
    return config


def load_config(path):
    """The model configuration of the checkpoint at `path` (folder or model.safetensors)."""
    folder, model_file = _locate(path)
    config_file = folder / CONFIG_FILE
    if config_file.exists():
        return _check_config(_parse_json(config_file.read_text(), config_file), config_file)
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
    from vit_pytorch.models import build_model

    config = load_config(path)
    try:
        model = build_model(config['model'], **config['model_kwargs'])
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"cannot build model {config['model']!r} from the checkpoint at {path}: {error}") \
            from error
    load_weights(model, path, config=config)
    return model.to(device).eval(), config


def load_training_state(path, optimizer):
    """Restore `optimizer` from the checkpoint at `path`; returns the JSON training state (epoch, log, ...)."""
    folder, _ = _locate(path)
    state_file = folder / STATE_FILE
    if not state_file.exists():
        raise CheckpointError(f"{folder} has no training state ({STATE_FILE}): it holds weights only and cannot "
                              f"be resumed; start a new run from it instead")
    state = _parse_json(state_file.read_text(), state_file)
    tensors, _ = _read_tensors(folder / OPTIMIZER_FILE, 'optimizer state')
    rest = state.pop('optimizer', None)
    if not isinstance(rest, dict) or 'param_groups' not in rest:
        raise CheckpointError(f"{state_file} lacks the optimizer's hyperparameters")
    optimizer_state = {}
    for key, value in tensors.items():
        _, index, name = key.split('.', 2)
        optimizer_state.setdefault(int(index), {})[name] = value
    for key, value in rest.get('scalars', {}).items():
        index, name = key.split('.', 1)
        optimizer_state.setdefault(int(index), {})[name] = value
    try:
        optimizer.load_state_dict(dict(state=optimizer_state, param_groups=rest['param_groups']))
    except (ValueError, KeyError, RuntimeError) as error:
        raise CheckpointError(f"the optimizer state in {folder} does not fit this model's optimizer: {error}") \
            from error
    return state
