"""Never lose a user's work: state_dict round trips, bit-exact safetensors, corrupt files refused,
no unpickling of arbitrary objects, and old checkpoints that keep loading.

The models come from the table in test_properties.py. The loaders tested are the package's own:
`vit_pytorch.checkpoint` (training checkpoints) and `vit_pytorch.pretrained.read_checkpoint`
(state_dict files from anywhere).
"""

import io
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from test_properties import MODELS, model_table
from vit_pytorch import checkpoint, models
from vit_pytorch.pretrained import CheckpointError as PretrainedCheckpointError
from vit_pytorch.pretrained import read_checkpoint

FIXTURES = Path(__file__).parent / 'fixtures'
PACKAGE = Path(__file__).parent.parent / 'vit_pytorch'


def registry_name(spec):
    """The spec's name in vit_pytorch.models (what checkpoints record)."""
    names = [name for name, target in models.MODELS.items() if target == f'vit_pytorch.{spec.target}']
    if not names:
        pytest.skip(f'{spec.target} is not registered in vit_pytorch.models.MODELS: training checkpoints '
                    f'cannot rebuild it yet')
    return names[0]


def built(spec, seed):
    torch.manual_seed(seed)
    return spec.build(**spec.example).eval()


def example_input(spec, batch=2):
    return torch.randn(batch, *spec.image_shape(spec.example), generator=torch.Generator().manual_seed(1))


def raw_bytes(tensor):
    """The tensor's bytes, so that NaN payloads and signed zeros compare too."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def snapshot(model):
    return {key: value.clone() for key, value in model.state_dict().items()}


def assert_same_state(model, state):
    current = model.state_dict()
    assert current.keys() == state.keys()
    for key in state:
        assert torch.equal(raw_bytes(current[key]), raw_bytes(state[key])), key


# round trips (the plain state_dict round trip: tests/test_conformance.py, for every registered model)


@model_table
def test_safetensors_reads_back_bit_for_bit(spec, tmp_path):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        check_safetensors_round_trip(built(spec, seed=0).state_dict(), dtype, tmp_path / f'{dtype}.safetensors')


def check_safetensors_round_trip(state, dtype, path):
    state = {key: value.to(dtype) if value.is_floating_point() else value for key, value in state.items()}
    # values a lossy path would change: NaN with a payload, negative zero, infinities, subnormals
    key = next(key for key, value in state.items() if value.is_floating_point() and value.numel() >= 5)
    special = torch.tensor([float('nan'), -0.0, float('inf'), -float('inf'), torch.finfo(dtype).tiny / 2])
    state[key] = state[key].clone()
    state[key].view(-1)[:5] = special.to(dtype)
    save_file(state, path)
    loaded = load_file(path)
    assert loaded.keys() == state.keys()
    for name, value in state.items():
        assert loaded[name].dtype == value.dtype and loaded[name].shape == value.shape, (dtype, name)
        assert torch.equal(raw_bytes(loaded[name]), raw_bytes(value)), (dtype, name)


@model_table
def test_training_checkpoint_rebuilds_the_model_bit_for_bit(spec, tmp_path):
    model = built(spec, seed=0)
    config = dict(model=registry_name(spec), model_kwargs=spec.example)
    checkpoint.save_checkpoint(tmp_path / 'checkpoint', model=model, config=config)
    rebuilt, _ = checkpoint.load_model(tmp_path / 'checkpoint')
    assert type(rebuilt) is type(model)
    assert_same_state(rebuilt, model.state_dict())
    img = example_input(spec)
    with torch.no_grad():
        assert torch.equal(rebuilt(img), model(img))


# truncated and corrupted files


def corruptions(data):
    """name -> corrupted bytes of a safetensors file (an 8-byte length, a JSON header, the data)."""
    header_length = int.from_bytes(data[:8], 'little')
    return {
        'empty': b'',
        'length only': data[:8],
        'header cut': data[:8 + header_length // 2],
        'data cut in half': data[:8 + header_length + (len(data) - 8 - header_length) // 2],
        'last byte missing': data[:-1],
        'header byte flipped': data[:20] + bytes([data[20] ^ 0xFF]) + data[21:],
        'header length too large': (len(data) * 2).to_bytes(8, 'little') + data[8:],
        'not safetensors': pickle.dumps({'weight': [0.0]}),
        'extra bytes': data + b'\0' * 16,
    }


SAFETENSORS_CORRUPTIONS = list(corruptions(b'\x10' + b'\0' * 7 + b'{}' + b' ' * 14 + b'\0' * 32))


@pytest.mark.parametrize('corruption', SAFETENSORS_CORRUPTIONS)
def test_corrupt_training_checkpoint_is_refused_and_leaves_the_model_untouched(corruption, tmp_path):
    spec = MODELS[0]
    folder = checkpoint.save_checkpoint(tmp_path / 'checkpoint', model=built(spec, seed=0),
                                        config=dict(model=registry_name(spec), model_kwargs=spec.example))
    weights = folder / checkpoint.MODEL_FILE
    weights.write_bytes(corruptions(weights.read_bytes())[corruption])
    target = built(spec, seed=1)
    before = snapshot(target)
    with pytest.raises(checkpoint.CheckpointError, match=re.escape(str(weights))):
        checkpoint.load_weights(target, folder)
    assert_same_state(target, before)
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.load_model(folder)


# safetensors has no checksum of its own: checkpoint.py stores a sha256 of the tensors in the header
def test_flipped_bit_in_the_weights_is_refused(tmp_path):
    spec = MODELS[0]
    folder = checkpoint.save_checkpoint(tmp_path / 'checkpoint', model=built(spec, seed=0),
                                        config=dict(model=registry_name(spec), model_kwargs=spec.example))
    weights = folder / checkpoint.MODEL_FILE
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0x40                                  # inside the last tensor's bytes
    weights.write_bytes(bytes(data))
    target = built(spec, seed=1)
    before = snapshot(target)
    with pytest.raises(checkpoint.CheckpointError, match='corrupt'):
        checkpoint.load_weights(target, folder)
    assert_same_state(target, before)


def test_checkpoint_of_another_model_is_refused_before_anything_is_copied(tmp_path):
    spec = MODELS[0]
    folder = checkpoint.save_checkpoint(tmp_path / 'checkpoint', model=built(spec, seed=0),
                                        config=dict(model=registry_name(spec), model_kwargs=spec.example))
    target = spec.build(**dict(spec.example, depth=spec.example['depth'] + 1))
    before = snapshot(target)
    with pytest.raises(checkpoint.CheckpointError, match=r'missing: transformer\.layers\.2\.'):
        checkpoint.load_weights(target, folder)
    assert_same_state(target, before)


def test_save_interrupted_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    spec = MODELS[0]
    config = dict(model=registry_name(spec), model_kwargs=spec.example)
    old_model = built(spec, seed=0)
    folder = checkpoint.save_checkpoint(tmp_path / 'checkpoint', model=old_model, config=config)

    write_bytes = Path.write_bytes

    def write_half_then_die(self, data):
        write_bytes(self, data[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.Path, 'write_bytes', write_half_then_die)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(folder, model=built(spec, seed=1), config=config)
    monkeypatch.undo()
    restored, _ = checkpoint.load_model(folder)
    assert_same_state(restored, old_model.state_dict())


def test_save_interrupted_while_swapping_leaves_the_previous_checkpoint_named_in_the_error(tmp_path, monkeypatch):
    spec = MODELS[0]
    config = dict(model=registry_name(spec), model_kwargs=spec.example)
    old_model = built(spec, seed=0)
    folder = checkpoint.save_checkpoint(tmp_path / 'checkpoint', model=old_model, config=config)
    rename = Path.rename
    calls = []

    def die_on_second_rename(self, target):
        calls.append(target)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return rename(self, target)

    monkeypatch.setattr(checkpoint.Path, 'rename', die_on_second_rename)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(folder, model=built(spec, seed=1), config=config)
    monkeypatch.undo()
    with pytest.raises(checkpoint.CheckpointError, match=r'checkpoint\.old'):
        checkpoint.load_model(folder)
    restored, _ = checkpoint.load_model(folder.with_name('checkpoint.old'))
    assert_same_state(restored, old_model.state_dict())


# found by the reliability tests: read_checkpoint passed the reader's own errors through
# (SafetensorError, a RuntimeError from PytorchStreamReader, OSError, EOFError)
@pytest.mark.parametrize('suffix', ['.safetensors', '.pt'])
@pytest.mark.parametrize('cut', ['empty', 'half', 'last byte missing'])
def test_truncated_state_dict_file_is_a_clear_value_error(suffix, cut, tmp_path):
    path = tmp_path / f'weights{suffix}'
    state = built(MODELS[0], seed=0).state_dict()
    save_file(state, path) if suffix == '.safetensors' else torch.save(state, path)
    data = path.read_bytes()
    path.write_bytes({'empty': b'', 'half': data[:len(data) // 2], 'last byte missing': data[:-1]}[cut])
    with pytest.raises(ValueError, match=rf'{re.escape(str(path))}.*(corrupt|truncated)'):
        read_checkpoint(path)


# never unpickle arbitrary objects


class Payload:
    """Unpickling this creates a file: the proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, 'w')


def write_malicious_checkpoint(path, marker):
    state = dict(built(MODELS[0], seed=0).state_dict(), payload=Payload(marker))
    torch.save(state, path)


def test_the_malicious_pickle_runs_code_when_unpickled(tmp_path):
    """The payload is live: a plain torch.load would run it (so the next test can fail)."""
    marker = tmp_path / 'pwned'
    write_malicious_checkpoint(tmp_path / 'evil.pt', marker)
    torch.load(tmp_path / 'evil.pt', weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize('name', ['evil.pt', 'evil.pth', 'evil.bin'])
def test_read_checkpoint_refuses_a_malicious_pickle(name, tmp_path):
    marker = tmp_path / 'pwned'
    write_malicious_checkpoint(tmp_path / name, marker)
    with pytest.raises(PretrainedCheckpointError, match='refused to unpickle'):
        read_checkpoint(tmp_path / name)
    assert not marker.exists()


def test_read_checkpoint_refuses_an_npz_with_pickled_objects(tmp_path):
    marker = tmp_path / 'pwned'
    np.savez(tmp_path / 'evil.npz', weight=np.zeros(3), payload=np.array([Payload(marker)], dtype=object))
    with pytest.raises(PretrainedCheckpointError, match='pickled objects'):
        read_checkpoint(tmp_path / 'evil.npz')
    assert not marker.exists()


def test_training_checkpoint_never_unpickles(tmp_path):
    spec = MODELS[0]
    folder = checkpoint.save_checkpoint(tmp_path / 'checkpoint', model=built(spec, seed=0),
                                        config=dict(model=registry_name(spec), model_kwargs=spec.example))
    marker = tmp_path / 'pwned'
    write_malicious_checkpoint(folder / checkpoint.MODEL_FILE, marker)
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.load_model(folder)
    assert not marker.exists()


UNSAFE_CALLS = [
    (r'torch\.load\((?![^)]*weights_only\s*=\s*True)', 'torch.load without weights_only=True'),
    (r'\bpickle\.loads?\(|\bUnpickler\(', 'pickle.load'),
    (r'allow_pickle\s*=\s*True', 'numpy allow_pickle=True'),
    (r'weights_only\s*=\s*False', 'weights_only=False'),
]


@pytest.mark.parametrize('pattern, what', UNSAFE_CALLS, ids=[what for _, what in UNSAFE_CALLS])
def test_library_code_has_no_unpickling_call(pattern, what):
    offenders = [f'{path.name}:{number}' for path in sorted(PACKAGE.rglob('*.py'))
                 for number, line in enumerate(path.read_text().splitlines(), 1) if re.search(pattern, line)]
    assert not offenders, f'{what} in {offenders}'


# backward compatibility


COMPAT_FIXTURES = sorted(FIXTURES.glob('compat_*.safetensors'))
# classes renamed since their fixture was written (issue 25): our DeiT student was distill.DistillableViT, and
# crossformer.CrossFormer took the official code's arguments (depth in blocks, interval), now OfficialCrossFormer's
RENAMED = {'distill:DistillableViT': 'distill:DeiT', 'crossformer:CrossFormer': 'crossformer:OfficialCrossFormer'}
# defaults changed since their fixture was written (issue 25: vit-pytorch's defaults at vit-pytorch's classes); a
# checkpoint of the old default loads into a model built with the old value, and is refused by its keys otherwise
CHANGED_DEFAULTS = {'parallel_vit:ViT': dict(patch_norm=True), 'regionvit:RegionViT': dict(tokenize_local_3_conv=True)}


def test_every_model_in_the_table_has_a_compat_fixture():
    names = {path.stem.removeprefix('compat_') for path in COMPAT_FIXTURES}
    missing = [spec.name for spec in MODELS if spec.name not in names]
    assert not missing, f'run python tests/fixtures/make_compat_fixtures.py to record {missing}'


@pytest.mark.parametrize('path', COMPAT_FIXTURES, ids=lambda path: path.stem)
def test_old_checkpoint_still_loads_and_gives_the_same_output(path):
    from safetensors import safe_open

    with safe_open(str(path), framework='pt') as handle:     # the metadata only: tensors via read_checkpoint
        metadata = handle.metadata()
    tensors = read_checkpoint(path)
    img, expected = tensors.pop('compat:input'), tensors.pop('compat:output')
    module, name = RENAMED.get(metadata['target'], metadata['target']).split(':')
    cls = getattr(__import__(f'vit_pytorch.{module}', fromlist=[name]), name)
    kwargs = {key: tuple(value) if isinstance(value, list) else value
              for key, value in json.loads(metadata['kwargs']).items()}
    model = cls(**{**CHANGED_DEFAULTS.get(metadata['target'], {}), **kwargs}).eval()
    model.load_state_dict(tensors, strict=True)
    with torch.no_grad():
        output = model(img)
    torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-5,
                               msg=lambda m: f'{path.name} (written {metadata["written"]}) no longer '
                                             f'reproduces its output: {m}')


def test_compat_fixture_check_can_fail(tmp_path):
    """A renamed key (what a refactor of the module tree does) is caught."""
    state = built(MODELS[0], seed=0).state_dict()
    state['transformer.blocks.0.norm.weight'] = state.pop('transformer.layers.0.0.norm.weight')
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    with pytest.raises(RuntimeError, match='Missing key.*transformer.layers.0.0.norm.weight'):
        MODELS[0].build(**MODELS[0].example).load_state_dict(torch.load(buffer, weights_only=True))
