"""What the loaders read: files recognised by their content, folders, and a CheckpointError naming the
file for everything unreadable, truncated or disguised, from every loader.

The well-formed files are committed fixtures written by timm and transformers
(tests/fixtures/make_reference_fixtures.py, make_loader_fixtures.py).
"""

import os
import shutil

import numpy as np
import pytest
import torch
from helpers import FIXTURES
from safetensors.torch import save_file

from vit_pytorch import ViT
from vit_pytorch.pretrained import CheckpointError, load_hf, load_jax, load_timm, load_vit_pytorch, read_checkpoint

TINY = dict(image_size=32, patch_size=8, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, num_classes=5,
            patch_norm=False, qkv_bias=True, norm_eps=1e-6)
LOADERS = [load_timm, load_hf, load_jax, load_vit_pytorch]


def tiny():
    return ViT(**TINY).eval()


def timm_state_dict():
    return read_checkpoint(FIXTURES / 'timm_vit.safetensors')


def torch_file(path):
    torch.save(timm_state_dict(), path)
    return path


def truncated(source, path):
    data = open(source, 'rb').read()
    path.write_bytes(data[:len(data) // 2])
    return path


def zip_of(folder, path):
    os.rename(shutil.make_archive(str(path)[:-4], 'zip', folder), path)


# (file name, writer, what the message says); each writer makes the file under tmp_path
BAD_FILES = {
    'torch zip renamed .npz': ('weights.npz', torch_file, r'its name says a numpy \.npz archive, but the file is a '
                               r'torch file \(torch\.save\); rename it'),
    'safetensors renamed .pth': ('weights.pth', lambda path: shutil.copy(FIXTURES / 'timm_vit.safetensors', path),
                                 r'its name says a torch file .* but the file is a safetensors file'),
    'npz renamed .safetensors': ('weights.safetensors', lambda path: shutil.copy(FIXTURES / 'jax_vit.npz', path),
                                 r'its name says a safetensors file, but the file is a numpy \.npz archive'),
    'truncated safetensors': ('weights.safetensors', lambda path: truncated(FIXTURES / 'timm_vit.safetensors', path),
                              r'cannot read it as a safetensors file: it is corrupt or truncated'),
    'truncated torch file': ('weights.pth', lambda path: truncated(torch_file(path), path),
                             r'cannot read it as a torch file .*: it is corrupt or truncated'),
    'truncated npz': ('weights.npz', lambda path: truncated(FIXTURES / 'jax_vit.npz', path),
                      r'cannot read it as a numpy \.npz archive: it is corrupt or truncated'),
    'empty file': ('weights.bin', lambda path: path.write_bytes(b''), r'but the file is empty'),
    'text file': ('weights.bin', lambda path: path.write_text('{"not": "weights"}'),
                  r'but the file is none of safetensors, \.npz or a torch file'),
    'single .npy array': ('weights.pth', lambda path: np.save(open(path, 'wb'), np.zeros(3)),
                          r'a single numpy array \(\.npy\), not a set of named weights'),
    'zip of other files': ('weights.npz', lambda path: zip_of(FIXTURES / 'hf_vit_folder', path),
                           r'but the file is a zip archive of other files'),
    'torch file of a list': ('weights.pth', lambda path: torch.save([torch.zeros(2)], path),
                             r'holds a list, not a state_dict of named tensors'),
    'torch file with non-tensor entries': ('weights.pth',
                                           lambda path: torch.save({'epoch': 3, 'weights': timm_state_dict()}, path),
                                           r'these entries are not tensors: epoch \(int\), weights \(dict\)'),
}


@pytest.mark.parametrize('case', BAD_FILES)
def test_bad_file_is_a_checkpoint_error_naming_it(case, tmp_path):
    name, write, message = BAD_FILES[case]
    path = tmp_path / name
    write(path)
    with pytest.raises(CheckpointError, match=f'^{str(path)}: .*{message}'):
        read_checkpoint(path)


@pytest.mark.parametrize('loader', LOADERS, ids=lambda loader: loader.__name__)
@pytest.mark.parametrize('case', ['torch zip renamed .npz', 'truncated safetensors', 'empty file'])
def test_every_loader_gives_the_same_error(loader, case, tmp_path):
    name, write, message = BAD_FILES[case]
    path = tmp_path / name
    write(path)
    model = tiny()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=f'^{str(path)}: .*{message}'):
        loader(model, path)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


def test_a_missing_file_is_a_checkpoint_error_naming_it(tmp_path):
    path = tmp_path / 'nothing.safetensors'
    with pytest.raises(CheckpointError, match=f'^{path}: does not exist'):
        load_timm(tiny(), path)


@pytest.mark.parametrize('name', ['weights.bin', 'weights.pt', 'weights.ckpt', 'weights'])
def test_torch_files_load_whatever_their_suffix(name, tmp_path):
    state_dict = timm_state_dict()
    torch_file(tmp_path / name)
    loaded = read_checkpoint(tmp_path / name)
    assert loaded.keys() == state_dict.keys()
    assert all(torch.equal(loaded[key], state_dict[key]) for key in state_dict)


def test_in_memory_numpy_arrays_are_read_as_tensors():
    arrays = dict(np.load(FIXTURES / 'jax_vit.npz'))
    loaded = read_checkpoint(arrays)
    assert all(torch.equal(loaded[key], torch.from_numpy(arrays[key])) for key in arrays)


def test_a_folder_without_weights_says_what_it_expected_and_what_it_holds(tmp_path):
    (tmp_path / 'config.json').write_text('{}')
    with pytest.raises(CheckpointError, match=r'a folder without weights: expected one of model\.safetensors, '
                                              r'.*pytorch_model\.bin.*; it holds config\.json'):
        read_checkpoint(tmp_path)


def test_a_folder_with_a_corrupt_config_is_named(tmp_path):
    shutil.copy(FIXTURES / 'hf_vit_folder' / 'model.safetensors', tmp_path)
    (tmp_path / 'config.json').write_text('{"image_size": [40, ')
    with pytest.raises(CheckpointError, match=f'^{tmp_path / "config.json"}: cannot read it as JSON'):
        load_hf(tiny(), tmp_path)


def test_a_sharded_folder_is_read_whole(tmp_path):
    state_dict = read_checkpoint(FIXTURES / 'hf_vit_folder' / 'model.safetensors')
    keys = sorted(state_dict)
    shards = {'model-00001-of-00002.safetensors': keys[:10], 'model-00002-of-00002.safetensors': keys[10:]}
    for shard, names in shards.items():
        save_file({key: state_dict[key] for key in names}, tmp_path / shard)
    weight_map = {key: shard for shard, names in shards.items() for key in names}
    (tmp_path / 'model.safetensors.index.json').write_text(f'{{"metadata": {{}}, "weight_map": {weight_map}}}'
                                                           .replace("'", '"'))
    loaded = read_checkpoint(tmp_path)
    assert loaded.keys() == state_dict.keys()
    assert all(torch.equal(loaded[key], state_dict[key]) for key in keys)
