"""Checkpoints saved by the vit-pytorch package load here and give that package's outputs.

The fixtures were written by vit-pytorch itself (1.26.14, 1.16.0 and 1.15.7), with
tests/fixtures/make_vit_pytorch_fixtures.py (its docstring has the commands).
"""

import pytest
import torch
from helpers import as_tuples, load_fixture

from vit_pytorch import SimpleViT, ViT

CLASSES = {'ViT': ViT, 'SimpleViT': SimpleViT}


def vit_pytorch_case(name):
    metadata, state_dict, tensors = load_fixture(name)
    return CLASSES[metadata['class']], as_tuples(metadata['config'], 'image_size', 'patch_size'), state_dict, tensors


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
    model_cls, config, state_dict, tensors = vit_pytorch_case(name)
    model = model_cls(**config).eval()
    model.load_state_dict(state_dict, strict=True)
    with torch.no_grad():
        out = model(tensors['input'])
    assert out.shape == tensors['output'].shape
    torch.testing.assert_close(out, tensors['output'], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('name', ['vit_pytorch_1.26.14_vit_cls', 'vit_pytorch_1.26.14_vit_mean',
                                  'vit_pytorch_1.26.14_simple_vit'])
def test_our_state_dict_has_vit_pytorch_keys_and_shapes(name):
    model_cls, config, state_dict, _ = vit_pytorch_case(name)
    ours = model_cls(**config).state_dict()
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in state_dict.items()}


def test_simple_vit_position_table_equals_vit_pytorch_table():
    _, config, _, tensors = vit_pytorch_case('vit_pytorch_1.26.14_simple_vit')
    model = SimpleViT(**config)
    torch.testing.assert_close(model.pos_embedding, tensors['extra.pos_embedding'], atol=1e-6, rtol=0)


def test_old_mean_pool_checkpoint_is_refused_by_name():
    _, config, state_dict, _ = vit_pytorch_case('vit_pytorch_old_1.15.7_vit_mean')
    model = ViT(**config)
    with pytest.raises(ValueError, match=r'cls_token.*1.15.7.*pool=.mean.'):
        model.load_state_dict(state_dict)
