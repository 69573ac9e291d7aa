"""vit-pytorch's infrastructure modules at its import paths: extractor, efficient, the nested-tensor NaViT
(2D and 3D), the flash-attention SimpleViT (2D and 3D), the ViT with patch dropout, MaxViT with registers.

The reference outputs were written by vit-pytorch 1.26.14 itself
(tests/fixtures/make_vit_pytorch_infra_fixtures.py, its docstring has the command).
"""

import importlib

import pytest
import torch
from helpers import as_tuples, load_fixture
from torch import nn

from vit_pytorch import ViT
from vit_pytorch.efficient import ViT as EfficientViT
from vit_pytorch.extractor import Extractor
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch

MODEL_CASES = ['vit_with_patch_dropout_cls', 'vit_with_patch_dropout_mean', 'simple_flash_attn_vit',
               'simple_flash_attn_vit_3d', 'na_vit_nested_tensor', 'na_vit_nested_tensor_3d']


def reference(case):
    """(our class of vit-pytorch's name, its config, state_dict, tensors, the input) of a fixture."""
    metadata, state_dict, tensors = load_fixture(f'vit_pytorch_1.26.14_{case}')
    module_name, class_name = metadata['class'].split('.')
    cls = getattr(importlib.import_module(f'vit_pytorch.{module_name}'), class_name)
    config = as_tuples(metadata['config'], 'image_size', 'patch_size', 'image_patch_size')
    inputs = sorted((key for key in tensors if key.startswith('input.')), key=lambda key: int(key.split('.')[1]))
    return cls, config, state_dict, tensors, [tensors[key] for key in inputs] if inputs else tensors['input']


def efficient_transformer():
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=24, dropout=0., batch_first=True,
                                       norm_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


@pytest.mark.parametrize('case', MODEL_CASES)
def test_vit_pytorch_checkpoint_loads_and_reproduces_its_outputs(case):
    cls, config, state_dict, tensors, inputs = reference(case)
    model = load_vit_pytorch(cls(**config).eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), tensors['output'], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('case', MODEL_CASES)
def test_a_perturbed_weight_changes_the_output(case):
    cls, config, state_dict, tensors, inputs = reference(case)
    name = next(key for key in state_dict if 'to_out' in key and key.endswith('weight'))
    # random, not constant: a constant shift of the residual stream is removed by the next LayerNorm
    state_dict[name] = state_dict[name] + 0.1 * torch.randn(state_dict[name].shape,
                                                            generator=torch.Generator().manual_seed(0))
    model = load_vit_pytorch(cls(**config).eval(), state_dict)
    with torch.no_grad():
        assert (model(inputs) - tensors['output']).abs().max() > 1e-3


@pytest.mark.parametrize('case, switch', [('simple_flash_attn_vit', 'use_flash'),
                                          ('simple_flash_attn_vit_3d', 'use_flash_attn')])
def test_explicit_attention_gives_the_flash_output(case, switch):
    cls, config, state_dict, tensors, inputs = reference(case)
    model = load_vit_pytorch(cls(**{**config, switch: False}).eval(), state_dict)
    assert not any(module.fused for name, module in model.named_modules() if hasattr(module, 'fused'))
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), tensors['output'], atol=1e-5, rtol=1e-5)


def test_efficient_vit_runs_any_token_module_with_vit_pytorchs_weights():
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_efficient_vit')
    model = EfficientViT(**as_tuples(metadata['config'], 'image_size'), transformer=efficient_transformer()).eval()
    model.load_state_dict(state_dict, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], atol=1e-5, rtol=1e-5)


def test_efficient_vit_names_a_transformer_that_changes_the_shape():
    model = EfficientViT(image_size=16, patch_size=4, num_classes=5, dim=16, transformer=nn.Linear(16, 8))
    with pytest.raises(ValueError, match=r'transformer must map tokens .* got \(2, 17, 8\) from Linear'):
        model(torch.randn(2, 3, 16, 16))


def test_efficient_vit_takes_nystromformer():
    nystrom_attention = pytest.importorskip('nystrom_attention')
    transformer = nystrom_attention.Nystromformer(dim=16, depth=1, heads=2, num_landmarks=4)
    model = EfficientViT(image_size=16, patch_size=4, num_classes=5, dim=16, transformer=transformer)
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 5)


# the Extractor


@pytest.mark.parametrize('case, arguments', [('extractor_vit', {}),
                                             ('extractor_vit_input', dict(layer_save_input=True))])
def test_extractor_returns_vit_pytorchs_logits_and_embeddings(case, arguments):
    metadata, state_dict, tensors = load_fixture(f'vit_pytorch_1.26.14_{case}')
    model = load_vit_pytorch(ViT(**as_tuples(metadata['config'], 'image_size', 'patch_size')).eval(), state_dict)
    logits, embeddings = Extractor(model, **arguments)(tensors['input'])
    torch.testing.assert_close(logits, tensors['output'], atol=1e-5, rtol=1e-5)
    if arguments:       # the layer's positional inputs: a tuple, as vit-pytorch gives
        assert isinstance(embeddings, tuple) and len(embeddings) == 1
        embeddings = embeddings[0]
        expected = tensors['latents.0']
    else:
        expected = tensors['latents']
    torch.testing.assert_close(embeddings, expected, atol=1e-5, rtol=1e-5)


def test_extractor_keeps_both_branches_of_cross_vits_multi_scale_encoder():
    from vit_pytorch.cross_vit import CrossViT
    metadata, _, tensors = load_fixture('vit_pytorch_1.26.14_extractor_cross_vit')
    model = CrossViT(**as_tuples(metadata['config'], 'image_size')).eval()
    seen = {}
    model.multi_scale_encoder.register_forward_hook(lambda module, args, output: seen.update(output=output))
    _, (small, large) = Extractor(model, layer_name='multi_scale_encoder')(tensors['input'])
    assert small.shape == tensors['latents.0'].shape and large.shape == tensors['latents.1'].shape
    assert torch.equal(small, seen['output'][0]) and torch.equal(large, seen['output'][1])


def test_extractor_detaches_a_copy_unless_told_not_to():
    model = ViT(image_size=16, patch_size=4, num_classes=5, dim=16, depth=1, heads=2, mlp_dim=24)
    img = torch.randn(2, 3, 16, 16)
    _, detached = Extractor(model)(img)
    _, attached = Extractor(model, detach=False)(img)
    assert not detached.requires_grad and attached.requires_grad


def test_extractor_moves_embeddings_to_device_and_can_return_them_alone():
    model = ViT(image_size=16, patch_size=4, num_classes=5, dim=16, depth=1, heads=2, mlp_dim=24)
    embeddings = Extractor(model, torch.device('meta'), return_embeddings_only=True)(torch.randn(2, 3, 16, 16))
    assert embeddings.device.type == 'meta' and embeddings.shape == (2, 17, 16)


def test_extractor_eject_removes_the_hook_and_refuses_later_calls():
    model = ViT(image_size=16, patch_size=4, num_classes=5, dim=16, depth=1, heads=2, mlp_dim=24)
    extractor = Extractor(model)
    extractor(torch.randn(1, 3, 16, 16))
    assert extractor.eject() is model and not model.transformer._forward_hooks
    with pytest.raises(RuntimeError, match='ejected'):
        extractor(torch.randn(1, 3, 16, 16))


def test_extractor_names_a_missing_layer():
    model = ViT(image_size=16, patch_size=4, num_classes=5, dim=16, depth=1, heads=2, mlp_dim=24)
    with pytest.raises(ValueError, match=r"layer_name 'encoder' is not a module of ViT.*transformer"):
        Extractor(model, layer_name='encoder')(torch.randn(1, 3, 16, 16))


# behaviours


def test_patch_dropout_keeps_the_right_number_of_patches_in_training_and_all_in_eval():
    from vit_pytorch.vit_with_patch_dropout import ViT as PatchDropoutViT
    model = PatchDropoutViT(image_size=16, patch_size=4, num_classes=5, dim=16, depth=1, heads=2, mlp_dim=24,
                            patch_dropout=0.25)
    img = torch.randn(2, 3, 16, 16)
    assert model.train().forward_features(img).shape == (2, 1 + 12, 16)     # 16 patches, int(16 * 0.75) kept
    assert model.eval().forward_features(img).shape == (2, 1 + 16, 16)


def test_max_vit_with_registers_has_vit_pytorchs_four_registers_in_every_window():
    from vit_pytorch.max_vit_with_registers import MaxViT
    model = MaxViT(num_classes=5, dim=16, depth=(1,), dim_head=8, window_size=2).eval()
    block = model.stages[0][0]
    assert block.register_tokens.shape == (4, 16)
    seen = {}
    block.block_attn.register_forward_hook(lambda module, args, output: seen.update(tokens=args[0].shape))
    model(torch.randn(1, 3, 16, 16))
    assert seen['tokens'][1] == 4 + 2 * 2          # registers, then the 2 x 2 window


def test_max_vit_with_registers_refuses_vit_pytorchs_checkpoint_with_what_differs():
    from vit_pytorch.max_vit_with_registers import MaxViT
    metadata, state_dict, _ = load_fixture('vit_pytorch_1.26.14_max_vit_with_registers')
    config = as_tuples(metadata['config'], 'depth')
    with pytest.raises(CheckpointError, match="max_vit_with_registers MaxViT computes another function"):
        load_vit_pytorch(MaxViT(**config), state_dict)


def test_nested_tensor_navit_gives_each_image_the_logits_it_has_alone():
    from vit_pytorch.na_vit_nested_tensor import NaViT
    model = NaViT(image_size=16, patch_size=4, num_classes=5, dim=16, depth=1, heads=2, dim_head=8, mlp_dim=24).eval()
    images = [torch.randn(3, 16, 8), torch.randn(3, 8, 8), torch.randn(3, 16, 8)]
    with torch.no_grad():
        together = model(images)
        alone = torch.cat([model([image]) for image in images])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_nested_tensor_navit_token_dropping_keeps_at_least_one_token():
    from vit_pytorch.na_vit_nested_tensor import NaViT
    model = NaViT(image_size=16, patch_size=4, num_classes=5, dim=16, depth=1, heads=2, dim_head=8, mlp_dim=24,
                  token_dropout_prob=0.9).train()
    tokens, _, slot = model.forward_features([torch.randn(3, 16, 16), torch.randn(3, 4, 4)])
    assert tokens.shape == (1, 1 + 1, 16) and len(slot) == 2        # int(16 * 0.1) = 1, and max(1, 0) = 1


# argument checks


@pytest.mark.parametrize('module, cls, arguments, error, message', [
    ('vit_with_patch_dropout', 'ViT', dict(patch_dropout=1.0), ValueError, r'patch_dropout must be in \[0, 1\)'),
    ('vit_with_patch_dropout', 'ViT', dict(pool='max'), ValueError, r"pool must be 'cls'"),
    ('simple_flash_attn_vit', 'SimpleViT', dict(use_flash='yes'), TypeError, 'use_flash must be True or False'),
    ('na_vit_nested_tensor', 'NaViT', dict(token_dropout_prob=1.5), ValueError, 'token_dropout_prob must be in'),
])
def test_bad_arguments_are_named(module, cls, arguments, error, message):
    base = dict(image_size=16, patch_size=4, num_classes=5, dim=16, depth=1, heads=2, mlp_dim=24)
    with pytest.raises(error, match=message):
        getattr(importlib.import_module(f'vit_pytorch.{module}'), cls)(**{**base, **arguments})


def test_nested_tensor_navit_names_a_bad_image():
    from vit_pytorch.na_vit_nested_tensor import NaViT
    model = NaViT(image_size=16, patch_size=4, num_classes=5, dim=16, depth=1, heads=2, mlp_dim=24)
    with pytest.raises(ValueError, match=r'images\[1\]: sides \(6, 8\) must be positive multiples of the patch'):
        model([torch.randn(3, 8, 8), torch.randn(3, 6, 8)])
    with pytest.raises(ValueError, match=r'images\[0\]: sides \(32, 8\) exceed \(16, 16\)'):
        model([torch.randn(3, 32, 8)])


def test_extractor_refuses_a_non_module():
    with pytest.raises(TypeError, match='vit must be a torch.nn.Module'):
        Extractor(lambda img: img)
