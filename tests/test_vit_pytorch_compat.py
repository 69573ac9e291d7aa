"""Checkpoints saved by the vit-pytorch package load here and give that package's outputs.

The fixtures were written by vit-pytorch itself (1.26.14, 1.16.0 and 1.15.7), with
tests/fixtures/make_vit_pytorch_fixtures.py and make_vit_pytorch_variant_fixtures.py (their
docstrings have the commands). `load_vit_pytorch` loads every model whose vit-pytorch counterpart
computes the same function, and refuses the others with what differs.
"""

import pytest
import torch
from helpers import as_tuples, load_fixture

from vit_pytorch import SimpleViT, ViT
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch

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


@pytest.mark.parametrize('name', ['vit_pytorch_1.26.14_vit_cls', 'vit_pytorch_1.26.14_vit_mean',
                                  'vit_pytorch_1.26.14_vit_tokens', 'vit_pytorch_interim_1.16.0_vit_cls',
                                  'vit_pytorch_old_1.15.7_vit_cls'])
def test_load_vit_pytorch_loads_every_vit_layout(name):
    model_cls, config, state_dict, tensors = vit_pytorch_case(name)
    model = load_vit_pytorch(model_cls(**config).eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], atol=1e-5, rtol=1e-5)


def test_load_vit_pytorch_reads_the_file_it_is_given(tmp_path):
    from safetensors.torch import save_file
    model_cls, config, state_dict, tensors = vit_pytorch_case('vit_pytorch_1.26.14_vit_cls')
    save_file(state_dict, tmp_path / 'vit.safetensors')
    model = load_vit_pytorch(model_cls(**config).eval(), tmp_path / 'vit.safetensors')
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], atol=1e-5, rtol=1e-5)


def test_a_checkpoint_that_does_not_fit_names_the_file_and_copies_nothing(tmp_path):
    model_cls, config, state_dict, _ = vit_pytorch_case('vit_pytorch_1.26.14_vit_cls')
    del state_dict['transformer.layers.1.1.net.4.bias']
    torch.save(state_dict, tmp_path / 'vit.pt')
    model = model_cls(**config)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r'(?s)vit\.pt: the vit-pytorch checkpoint does not fit this ViT \(nothing was '
                                              r'copied\).*transformer\.layers\.1\.1\.net\.4\.bias'):
        load_vit_pytorch(model, tmp_path / 'vit.pt')
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


def test_old_mean_pool_checkpoint_is_refused_by_load_vit_pytorch_too():
    _, config, state_dict, _ = vit_pytorch_case('vit_pytorch_old_1.15.7_vit_mean')
    with pytest.raises(CheckpointError, match=r'cls_token.*1\.15\.7.*pool=.mean.'):
        load_vit_pytorch(ViT(**config), state_dict)
