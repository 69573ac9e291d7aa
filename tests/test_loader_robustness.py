"""The weight files the loaders read are judged by what they provably are, and every file that cannot be
read (missing, a folder, a FIFO, a broken index or config) is a CheckpointError naming it.

A safetensors file opens with its header's length (8 bytes, little-endian), so the first bytes can be
anything a pickle, a zip or a .npy file starts with; the files here are written byte by byte after the
format's specification (github.com/huggingface/safetensors, "Format"), not with safetensors' writer.
"""

import json
import os
import shutil
import struct
import threading

import numpy as np
import pytest
import torch
from helpers import FIXTURES, as_tuples, load_fixture
from safetensors.torch import load_file, save_file

from vit_pytorch import ViT
from vit_pytorch.crossformer import OfficialCrossFormer
from vit_pytorch.pretrained import (CheckpointError, load_hf, load_jax, load_official, load_timm, load_vit_pytorch,
                                    read_checkpoint)
from vit_pytorch.swin import SwinTransformer, SwinTransformerV2

TINY = dict(image_size=32, patch_size=8, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, num_classes=5,
            patch_norm=False, qkv_bias=True, norm_eps=1e-6)
LOADERS = [load_timm, load_hf, load_jax, load_vit_pytorch]
WEIGHT = np.array([1.5, -2.0], dtype='<f4')


def safetensors_bytes(header_length):
    """A safetensors file of one float32 tensor `w` whose JSON header, padded with spaces as the format
    allows, is `header_length` bytes long."""
    header = json.dumps({'w': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, WEIGHT.nbytes]}}).encode()
    assert len(header) <= header_length, 'the header needs more room'
    return struct.pack('<Q', header_length) + header.ljust(header_length, b' ') + WEIGHT.tobytes()


def header_lengths():
    """For each value of the length's low byte, the smallest header length >= 256 with it; and lengths
    whose two low bytes spell the start of a zip ('PK') or of a .npy file (0x93 'N')."""
    return {**{f'low byte {low:#04x}': 256 + low for low in range(256)},
            "low bytes 'PK'": int.from_bytes(b'PK', 'little'), "low bytes 0x93 'N'": int.from_bytes(b'\x93N', 'little')}


HEADER_LENGTHS = header_lengths()


@pytest.mark.parametrize('case', HEADER_LENGTHS)
def test_a_safetensors_file_is_read_whatever_its_header_length(case, tmp_path):
    path = tmp_path / 'weights.safetensors'
    path.write_bytes(safetensors_bytes(HEADER_LENGTHS[case]))
    assert torch.equal(read_checkpoint(path)['w'], torch.from_numpy(WEIGHT))


@pytest.mark.parametrize('low', [0x80, 0x50], ids=['pickle byte 0x80', "zip's 'P'"])
def test_a_safetensors_file_whose_header_is_cut_off_is_called_truncated(low, tmp_path):
    path = tmp_path / 'weights.safetensors'
    path.write_bytes(safetensors_bytes(256 + low)[:100])
    with pytest.raises(CheckpointError, match=f'^{path}: cannot read it as a safetensors file: it is corrupt or '
                                              f'truncated \\(its header does not fit the file'):
        read_checkpoint(path)


def test_a_legacy_torch_pickle_is_still_a_torch_file(tmp_path):
    path = tmp_path / 'weights.pth'
    torch.save({'w': torch.from_numpy(WEIGHT)}, path, _use_new_zipfile_serialization=False)
    assert path.read_bytes()[:1] == b'\x80'
    assert torch.equal(read_checkpoint(path)['w'], torch.from_numpy(WEIGHT))


def test_a_pickle_named_safetensors_is_still_called_a_torch_file(tmp_path):
    path = tmp_path / 'weights.safetensors'
    torch.save({'w': torch.from_numpy(WEIGHT)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=r'its name says a safetensors file, but the file is a torch file'):
        read_checkpoint(path)


# every committed weight fixture, through the public reader
FIXTURE_FILES = sorted([*FIXTURES.glob('*.safetensors'), *FIXTURES.glob('*/*.safetensors')])
FIXTURE_FOLDERS = sorted(path.parent for path in FIXTURES.glob('*/config.json'))


@pytest.mark.parametrize('path', FIXTURE_FILES, ids=lambda path: str(path.relative_to(FIXTURES)))
def test_every_committed_safetensors_fixture_is_read_by_read_checkpoint(path):
    expected = load_file(path)       # safetensors' own reader, the reference
    loaded = read_checkpoint(path)
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[key], expected[key]) for key in expected)


@pytest.mark.parametrize('folder', FIXTURE_FOLDERS, ids=lambda path: path.name)
def test_every_committed_folder_fixture_is_read_by_read_checkpoint(folder):
    expected = load_file(folder / 'model.safetensors')
    loaded = read_checkpoint(folder)
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[key], expected[key]) for key in expected)


@pytest.mark.parametrize('path', sorted(FIXTURES.glob('*.npz')), ids=lambda path: path.name)
def test_every_committed_npz_fixture_is_read_by_read_checkpoint(path):
    with np.load(path, allow_pickle=False) as arrays:
        expected = {name: arrays[name] for name in arrays.files}
    loaded = read_checkpoint(path)
    assert loaded.keys() == expected.keys()
    assert all(np.array_equal(loaded[key].numpy(), expected[key]) for key in expected)


def test_the_fixture_lists_are_not_empty():
    assert len(FIXTURE_FILES) > 100 and len(FIXTURE_FOLDERS) >= 2


# files that are not there or not files


def read_without_hanging(read, path, named):
    """read(path) in a thread; a reader that opened the FIFO `named` is released (an EOF) after 5 s."""
    outcome = {}

    def target():
        try:
            outcome['value'] = read(path)
        except Exception as error:
            outcome['error'] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():
        os.close(os.open(named, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
        pytest.fail(f'the reader opened the FIFO {named} and waited for a writer')
    if 'error' in outcome:
        raise outcome['error']
    return outcome['value']


def tiny():
    return ViT(**TINY).eval()


def hf_folder(tmp_path):
    folder = tmp_path / 'folder'
    shutil.copytree(FIXTURES / 'hf_vit_folder', folder)
    return folder


def sharded_folder(tmp_path):
    folder = tmp_path / 'sharded'
    folder.mkdir()
    state_dict = load_file(FIXTURES / 'hf_vit_folder' / 'model.safetensors')
    keys = sorted(state_dict)
    shards = {'model-00001-of-00002.safetensors': keys[:10], 'model-00002-of-00002.safetensors': keys[10:]}
    for shard, names in shards.items():
        save_file({key: state_dict[key] for key in names}, folder / shard)
    weight_map = {key: shard for shard, names in shards.items() for key in names}
    (folder / 'model.safetensors.index.json').write_text(json.dumps({'metadata': {}, 'weight_map': weight_map}))
    return folder


def missing_shard(tmp_path):
    folder = sharded_folder(tmp_path)
    os.remove(folder / 'model-00002-of-00002.safetensors')
    return folder, folder / 'model-00002-of-00002.safetensors'


def shard_index_names_a_key_its_shard_lacks(tmp_path):
    folder = sharded_folder(tmp_path)
    index = folder / 'model.safetensors.index.json'
    content = json.loads(index.read_text())
    content['weight_map']['vit.extra.weight'] = 'model-00001-of-00002.safetensors'
    index.write_text(json.dumps(content))
    return folder, folder / 'model-00001-of-00002.safetensors'


def shard_is_a_folder(tmp_path):
    folder = sharded_folder(tmp_path)
    shard = folder / 'model-00001-of-00002.safetensors'
    os.remove(shard)
    shard.mkdir()
    return folder, shard


def index_with_invalid_json(tmp_path):
    folder = sharded_folder(tmp_path)
    (folder / 'model.safetensors.index.json').write_text('{"weight_map": {"a": ')
    return folder, folder / 'model.safetensors.index.json'


def index_outside_its_folder(tmp_path):
    folder = sharded_folder(tmp_path)
    (folder / 'model.safetensors.index.json').write_text(json.dumps({'weight_map': {'a': '../elsewhere.safetensors'}}))
    return folder, folder / 'model.safetensors.index.json'


def config_not_utf8(tmp_path):
    folder = hf_folder(tmp_path)
    (folder / 'config.json').write_bytes(b'{"model_type": "vit\xff"}')
    return folder, folder / 'config.json'


def config_is_a_folder(tmp_path):
    folder = hf_folder(tmp_path)
    os.remove(folder / 'config.json')
    (folder / 'config.json').mkdir()
    return folder, folder / 'config.json'


def weights_are_a_folder(tmp_path):
    folder = hf_folder(tmp_path)
    os.remove(folder / 'model.safetensors')
    (folder / 'model.safetensors').mkdir()
    return folder, folder / 'model.safetensors'


def weights_are_a_fifo(tmp_path):
    folder = hf_folder(tmp_path)
    os.remove(folder / 'model.safetensors')
    os.mkfifo(folder / 'model.safetensors')
    return folder, folder / 'model.safetensors'


def missing_file(tmp_path):
    return tmp_path / 'nothing.safetensors', tmp_path / 'nothing.safetensors'


def dangling_link(tmp_path):
    os.symlink(tmp_path / 'gone.safetensors', tmp_path / 'link.safetensors')
    return tmp_path / 'link.safetensors', tmp_path / 'link.safetensors'


def fifo(tmp_path):
    os.mkfifo(tmp_path / 'weights.safetensors')
    return tmp_path / 'weights.safetensors', tmp_path / 'weights.safetensors'


# (writer -> (what to read, the file the message names), what the message says)
ODD_FILES = {
    'missing file': (missing_file, r'does not exist; expected a weight file or a save_pretrained folder'),
    'link to nothing': (dangling_link, r'does not exist \(a link to nothing\)'),
    'FIFO': (fifo, r'is a FIFO \(named pipe\), not a file'),
    'FIFO in a folder': (weights_are_a_fifo, r'is a FIFO \(named pipe\), not a file'),
    'weights are a folder': (weights_are_a_folder, r'is a folder, not a file; expected a safetensors file'),
    'config.json is a folder': (config_is_a_folder, r'is a folder, not a file'),
    'config.json is not UTF-8': (config_not_utf8, r'not UTF-8 text'),
    'missing shard': (missing_shard, r'does not exist, but the shard index .*model\.safetensors\.index\.json names it'),
    'shard is a folder': (shard_is_a_folder, r'is a folder, not a file'),
    'shard lacks a key its index gives it': (shard_index_names_a_key_its_shard_lacks,
                                             r'does not hold what the shard index .* says; it lacks vit\.extra\.weight'),
    'index is not JSON': (index_with_invalid_json, r'cannot read it as JSON: corrupt or truncated'),
    'index names a file outside its folder': (index_outside_its_folder,
                                              r"names the shard '\.\./elsewhere\.safetensors', which is not a file name"),
}


@pytest.mark.parametrize('case', ODD_FILES)
def test_an_odd_file_is_a_checkpoint_error_naming_it(case, tmp_path):
    write, message = ODD_FILES[case]
    source, named = write(tmp_path)
    with pytest.raises(CheckpointError, match=f'^{named}: {message}'):
        read_without_hanging(read_checkpoint, source, named)


@pytest.mark.parametrize('loader', LOADERS, ids=lambda loader: loader.__name__)
@pytest.mark.parametrize('case', ['missing file', 'FIFO', 'missing shard'])
def test_every_loader_names_an_odd_file(loader, case, tmp_path):
    write, message = ODD_FILES[case]
    source, named = write(tmp_path)
    with pytest.raises(CheckpointError, match=f'^{named}: {message}'):
        read_without_hanging(lambda path: loader(tiny(), path), source, named)


# a file of another model is said to be one, before any advice on an option or a key


def timm_case(name):
    metadata, state_dict, _ = load_fixture(name)
    return as_tuples(metadata['config'], 'img_size', 'depths', 'num_heads'), state_dict


@pytest.mark.parametrize('cls', [SwinTransformer, SwinTransformerV2])
def test_maxvit_weights_given_to_swin_are_called_another_models_not_an_option(cls):
    config, _ = timm_case('timm_swin')
    _, maxvit = timm_case('timm_max_vit')
    with pytest.raises(CheckpointError, match=r"^the state_dict: it holds weights for another model \(it looks like "
                                              r"timm's MaxViT \(maxvit_\*\); its keys start with head, stages, stem\)"):
        load_timm(cls(**config), maxvit)


def test_swin_weights_given_to_the_vit_are_called_another_models():
    _, swin = timm_case('timm_swin')
    with pytest.raises(CheckpointError, match=r"another model \(it looks like timm's Swin \(swin_\*\)"):
        load_timm(tiny(), swin)


def test_swin_weights_given_to_vit_pytorch_s_vit_are_called_another_models():
    _, swin = timm_case('timm_swin')
    with pytest.raises(CheckpointError, match=r"another model \(it looks like timm's Swin .* of ViT hold"):
        load_vit_pytorch(tiny(), swin)


def test_keys_of_no_known_model_are_named_by_their_prefixes():
    unknown = {f'trunk.{i}.conv.weight': torch.zeros(3) for i in range(4)} | {'classifier.weight': torch.zeros(5, 16)}
    with pytest.raises(CheckpointError, match=r'another model \(its keys start with classifier, trunk\): it has 0 of '
                                              r'the \d+ kinds of key that timm checkpoints of ViT hold'):
        load_timm(tiny(), unknown)


def test_a_checkpoint_of_the_same_model_with_another_depth_still_lists_its_keys():
    state_dict = read_checkpoint(FIXTURES / 'timm_vit.safetensors')
    deeper = ViT(**dict(TINY, depth=TINY['depth'] + 1))
    with pytest.raises(CheckpointError, match=r'the timm checkpoint does not fit this ViT:\n  missing keys \(\d+\): '
                                              r'blocks\.2\.'):
        load_timm(deeper, state_dict)


def test_an_option_of_the_same_model_still_gets_its_advice():
    config, swin = timm_case('timm_swin')
    with pytest.raises(CheckpointError, match=r'^the state_dict: build the model with qkv_bias=True'):
        load_timm(SwinTransformer(**dict(config, qkv_bias=False)), swin)


# the messages name the paper's official code in a sentence


def test_a_model_without_official_checkpoints_says_so_in_a_sentence():
    with pytest.raises(TypeError, match=r"^no checkpoints of the paper's official code exist for ViT; it loads: timm, "
                                        r"Hugging Face, JAX, vit-pytorch$"):
        load_official(tiny(), {})


def test_a_misfit_official_checkpoint_says_so_in_a_sentence():
    _, state_dict, _ = load_fixture('official_crossformer')
    model = OfficialCrossFormer(num_classes=5, dim=(16, 32, 64), depth=(2, 2, 2), heads=(1, 2, 2),
                                local_window_size=(5, 6, 3), interval=(2, 2, 1),
                                cross_embed_kernel_sizes=((4, 8), (2, 4), (2, 4)), cross_embed_strides=(4, 2, 2),
                                mlp_mult=2)
    with pytest.raises(CheckpointError, match=r"^the state_dict: the checkpoint of the paper's official code does not "
                                              r"fit this OfficialCrossFormer:\n  missing keys \(26\): layers\.2\.blocks\.1\."):
        load_official(model, state_dict)
