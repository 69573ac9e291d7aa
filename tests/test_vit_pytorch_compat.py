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
    with pytest.raises(CheckpointError, match=r'(?s)vit\.pt: the vit-pytorch checkpoint does not fit this ViT '
                                              r'\(nothing was copied\).*transformer\.layers\.1\.1\.net\.4\.bias'):
        load_vit_pytorch(model, tmp_path / 'vit.pt')
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


def test_old_mean_pool_checkpoint_is_refused_by_load_vit_pytorch_too():
    _, config, state_dict, _ = vit_pytorch_case('vit_pytorch_old_1.15.7_vit_mean')
    with pytest.raises(CheckpointError, match=r'cls_token.*1\.15\.7.*pool=.mean.'):
        load_vit_pytorch(ViT(**config), state_dict)


# the variants: every vit-pytorch 1.26.14 model that has a counterpart here
# (fixtures by tests/fixtures/make_vit_pytorch_variant_fixtures.py)


def variant_case(case):
    """(our model built with the reference's arguments, state_dict, input, output) of a variant fixture."""
    import importlib

    metadata, state_dict, tensors = load_fixture(f'vit_pytorch_1.26.14_{case}')
    module_name, class_name = metadata.get('class', {'deepvit_cls': 'deepvit.DeepViT'}.get(case, 'cct.CCT')).split('.')
    module = importlib.import_module(f'vit_pytorch.{module_name}')
    config = as_tuples(metadata['config'], 'image_size', 'patch_size', 'img_size')
    if 't2t_layers' in config:
        config['t2t_layers'] = tuple(tuple(layer) for layer in config['t2t_layers'])
    if class_name == 'Adapter':
        config['vit'] = module.ViT(**as_tuples(config['vit'], 'image_size', 'patch_size'))
    return getattr(module, class_name), config, state_dict, tensors


# case -> keyword arguments our model needs beyond vit-pytorch's (the same function)
LOADS = {
    'deepvit_cls': {},
    'cct_learnable': {},
    'cct_sine': {},
    'simple_vit_with_patch_dropout': {},
    'simple_vit_with_register_tokens': {},
    'parallel_vit': dict(patch_norm=False),       # vit-pytorch's parallel ViT has a bare patch projection
    'learnable_memory_vit': {},
    'distill': {},                                # a plain ViT; its wrapper: tests/test_distill.py
}


@pytest.mark.parametrize('case', LOADS)
def test_variant_checkpoint_loads_and_reproduces_vit_pytorchs_outputs(case):
    model_cls, config, state_dict, tensors = variant_case(case)
    model = load_vit_pytorch(model_cls(**config, **LOADS[case]).eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], atol=1e-5, rtol=1e-5)


def test_vit_pytorchs_distillable_vit_is_a_plain_vit():
    _, config, state_dict, tensors = variant_case('distill')
    model = load_vit_pytorch(ViT(**config).eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], atol=1e-5, rtol=1e-5)


# case -> what the refusal says differs
REFUSED = {
    'cait': r"vit-pytorch's CaiT computes another function: its class-attention layers mix the heads",
    'xcit': r"vit-pytorch's XCiT is another model: it embeds patches with a Linear between LayerNorms",
    'cross_vit': r"vit-pytorch's CrossViT computes another function: it normalises each branch at the end of "
                 r"every encoder",
    't2t': r"vit-pytorch's T2T-ViT computes another function: its T2T layers keep the full unfolded width",
    'vit_for_small_dataset': r"vit-pytorch's shifted patch tokenization moves the image by one pixel left, right, "
                             r"up and down",
    'simple_vit_with_qk_norm': r"vit-pytorch's qk-norm SimpleViT computes another function: it ends in a "
                               r"LayerNorm instead of a classifier",
    'learnable_memory_adapter': r"vit-pytorch's Adapter computes another function: it appends the memories to "
                                r"the keys and values without the layer's LayerNorm",
}


@pytest.mark.parametrize('case', REFUSED)
def test_variant_that_computes_another_function_is_refused_with_what_differs(case):
    model_cls, config, state_dict, _ = variant_case(case)
    model = model_cls(**config)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=f'(?s)^the state_dict: {REFUSED[case]}'):
        load_vit_pytorch(model, state_dict)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


@pytest.mark.parametrize('case, overrides, message', [
    ('parallel_vit', dict(patch_norm=True), r'build the model with patch_norm=False'),
    ('parallel_vit', dict(patch_norm=False, pool='mean'), r"normalises after pooling.*pool='cls'"),
    ('learnable_memory_vit', dict(pool='mean'), r"always reads the cls token.*pool='cls'"),
    ('learnable_memory_vit', dict(qkv_bias=True), r'build the model with patch_norm=True and qkv_bias=False'),
])
def test_a_model_built_otherwise_is_told_what_to_change(case, overrides, message):
    model_cls, config, state_dict, _ = variant_case(case)
    with pytest.raises(CheckpointError, match=message):
        load_vit_pytorch(model_cls(**{**config, **overrides}), state_dict)


def test_a_learned_cct_table_into_a_sine_model_is_a_checkpoint_error():
    model_cls, config, state_dict, _ = variant_case('cct_learnable')
    with pytest.raises(CheckpointError, match=r"the state_dict: positional_emb in the checkpoint is not this "
                                              r"model's fixed sine table"):
        load_vit_pytorch(model_cls(**{**config, 'positional_embedding': 'sine'}), state_dict)


def test_load_vit_pytorch_loads_simple_vit():
    model_cls, config, state_dict, tensors = vit_pytorch_case('vit_pytorch_1.26.14_simple_vit')
    model = load_vit_pytorch(model_cls(**config).eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], atol=1e-5, rtol=1e-5)


# vit-pytorch calling styles not kept, as the README documents


def test_vit_pytorch_calling_styles_that_are_not_kept_are_type_errors():
    from vit_pytorch.cct import CCT

    # Recorder(model, device), Recorder(vit=model) and CCT's positional call are vit-pytorch's now:
    # tests/test_vit_pytorch_dropin.py and tests/test_recorder.py
    with pytest.raises(TypeError, match='seq_pool'):
        CCT(img_size=32, embedding_dim=16, num_layers=1, num_heads=2, seq_pool=False)
