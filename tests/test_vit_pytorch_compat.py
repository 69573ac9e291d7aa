"""Checkpoints saved by the vit-pytorch package load here and give that package's outputs.

The fixtures were written by vit-pytorch itself (1.26.14, 1.16.0 and 1.15.7), with
tests/fixtures/make_vit_pytorch_fixtures.py (its docstring has the commands).
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vit_pytorch import SimpleViT, ViT

FIXTURES = Path(__file__).parent / 'fixtures'
CLASSES = {'ViT': ViT, 'SimpleViT': SimpleViT}


def load_fixture(name):
    from safetensors import safe_open

    path = FIXTURES / f'{name}.safetensors'
    with safe_open(path, 'pt') as f:
        metadata = f.metadata()
    tensors = load_file(path)
    state_dict = {k.removeprefix('state_dict.'): v for k, v in tensors.items() if k.startswith('state_dict.')}
    config = json.loads(metadata['config'])
    config['image_size'], config['patch_size'] = tuple(config['image_size']), tuple(config['patch_size'])
    return CLASSES[metadata['class']], config, state_dict, tensors


@pytest.mark.parametrize('name', [
    'vit_pytorch_1.26.14_vit_cls',
    'vit_pytorch_1.26.14_vit_mean',
    'vit_pytorch_1.26.14_vit_tokens',
    'vit_pytorch_1.26.14_simple_vit',
    'vit_pytorch_interim_1.16.0_vit_cls',
    'vit_pytorch_interim_1.16.0_vit_mean',
    'vit_pytorch_old_1.15.7_vit_cls',
    'vit_pytorch_old_1.15.7_simple_vit',
])
def test_vit_pytorch_checkpoint_loads_strictly_and_reproduces_outputs(name):
    model_cls, config, state_dict, tensors = load_fixture(name)
    model = model_cls(**config).eval()
    model.load_state_dict(state_dict, strict=True)
    with torch.no_grad():
        out = model(tensors['input'])
    assert out.shape == tensors['output'].shape
    torch.testing.assert_close(out, tensors['output'], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('name', ['vit_pytorch_1.26.14_vit_cls', 'vit_pytorch_1.26.14_vit_mean',
                                  'vit_pytorch_1.26.14_simple_vit'])
def test_our_state_dict_has_vit_pytorch_keys_and_shapes(name):
    model_cls, config, state_dict, _ = load_fixture(name)
    ours = model_cls(**config).state_dict()
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in state_dict.items()}


def test_simple_vit_position_table_equals_vit_pytorch_table():
    _, config, _, tensors = load_fixture('vit_pytorch_1.26.14_simple_vit')
    model = SimpleViT(**config)
    torch.testing.assert_close(model.pos_embedding, tensors['extra.pos_embedding'], atol=1e-6, rtol=0)


def test_old_mean_pool_checkpoint_is_refused_by_name():
    _, config, state_dict, _ = load_fixture('vit_pytorch_old_1.15.7_vit_mean')
    model = ViT(**config)
    with pytest.raises(ValueError, match=r'cls_token.*1.15.7.*pool=.mean.'):
        model.load_state_dict(state_dict)
