"""Hugging Face checkpoints as users have them: `save_pretrained` folders, non-square image sizes,
`qkv_bias=False`, and DeiT with its distillation token.

References: fixtures written by transformers 5.24 (tests/fixtures/make_loader_fixtures.py), tiny
random-weight models moved off their initialisation.
"""

import math
import shutil

import pytest
import torch
from helpers import FIXTURES

from vit_pytorch import ViT
from vit_pytorch.distill import DeiT
from vit_pytorch.pretrained import RESAMPLE, CheckpointError, load_hf, read_checkpoint
from vit_pytorch.vit import resample_pos_embedding

FOLDER = FIXTURES / 'hf_vit_folder'
# the folder's model: ViTConfig(image_size=[40, 56], patch_size=8, hidden_size=16, 2 layers, 2 heads,
# intermediate_size=32, 5 labels, qkv_bias=False); layer_norm_eps is HF's default 1e-12
FOLDER_VIT = dict(image_size=(40, 56), patch_size=8, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, num_classes=5,
                  patch_norm=False, qkv_bias=False, norm_eps=1e-12)
TOL = dict(atol=1e-5, rtol=1e-5)


def reference(name):
    return read_checkpoint(FIXTURES / f'{name}_reference.safetensors')


def folder_vit(**overrides):
    return ViT(**{**FOLDER_VIT, **overrides}).eval()


def test_save_pretrained_folder_loads_and_gives_its_logits():
    ref = reference('hf_vit_folder')
    model = load_hf(folder_vit(), FOLDER)
    with torch.no_grad():
        torch.testing.assert_close(model(ref['input']), ref['logits'], **TOL)


def test_the_folders_weights_file_alone_loads_on_the_models_non_square_grid():
    ref = reference('hf_vit_folder')
    model = load_hf(folder_vit(), FOLDER / 'model.safetensors')       # a 5 x 7 grid, taken from the model
    with torch.no_grad():
        torch.testing.assert_close(model(ref['input']), ref['logits'], **TOL)


def test_qkv_bias_false_checkpoint_needs_a_model_without_qkv_bias():
    with pytest.raises(CheckpointError, match=r'hf_vit_folder.*build the model with qkv_bias=False'):
        load_hf(folder_vit(qkv_bias=True), FOLDER)


def test_the_folders_config_is_checked_against_the_model():
    with pytest.raises(CheckpointError, match=r'config\.json says layer_norm_eps=1e-12.*build the model with '
                                              r'norm_eps=1e-12'):
        load_hf(folder_vit(norm_eps=1e-6), FOLDER)
    with pytest.raises(CheckpointError, match=r"config\.json says hidden_act='gelu'.*gelu_approximate='none'"):
        load_hf(folder_vit(gelu_approximate='tanh'), FOLDER)
    load_hf(folder_vit(norm_eps=1e-6), FOLDER / 'model.safetensors')   # the bare file: the user decides


def test_a_folder_resamples_from_the_grid_its_config_gives():
    table = read_checkpoint(FOLDER / 'model.safetensors')['vit.embeddings.position_embeddings'][0]   # 1 + 5 * 7 rows
    expected = resample_pos_embedding(table, old_grid=(5, 7), new_grid=(6, 8), num_prefix_tokens=1, **RESAMPLE['hf'])
    from_folder = load_hf(folder_vit(image_size=(48, 64)), FOLDER)
    from_file = load_hf(folder_vit(image_size=(48, 64)), FOLDER / 'model.safetensors', checkpoint_grid=(5, 7))
    torch.testing.assert_close(from_folder.pos_embedding.detach(), expected, atol=0, rtol=0)
    torch.testing.assert_close(from_file.pos_embedding.detach(), expected, atol=0, rtol=0)
    # 7 x 5 has as many positions but is another grid: the table differs
    transposed = load_hf(folder_vit(image_size=(48, 64)), FOLDER / 'model.safetensors', checkpoint_grid=(7, 5))
    assert not torch.allclose(transposed.pos_embedding, expected)


def test_a_non_square_table_of_unknown_grid_is_refused_with_the_way_out():
    with pytest.raises(CheckpointError, match=r"35 positions after 1 prefix token\(s\) are neither the model's 6 x 8 "
                                              r"grid nor a square one: pass checkpoint_grid=\(h, w\)"):
        load_hf(folder_vit(image_size=(48, 64)), FOLDER / 'model.safetensors')
    with pytest.raises(CheckpointError, match=r'checkpoint_grid=\(6, 6\) has 36'):
        load_hf(folder_vit(image_size=(48, 64)), FOLDER / 'model.safetensors', checkpoint_grid=(6, 6))


def test_a_folder_with_pytorch_model_bin_loads_too(tmp_path):
    ref = reference('hf_vit_folder')
    shutil.copy(FOLDER / 'config.json', tmp_path)
    torch.save(read_checkpoint(FOLDER / 'model.safetensors'), tmp_path / 'pytorch_model.bin')
    model = load_hf(folder_vit(), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(model(ref['input']), ref['logits'], **TOL)


# DeiT (DeiTForImageClassificationWithTeacher): cls and distillation tokens, two heads

DEIT = dict(image_size=32, patch_size=8, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, num_classes=5,
            patch_norm=False, qkv_bias=True, norm_eps=1e-12)


def test_hf_deit_with_teacher_loads_into_a_distillable_vit():
    ref = reference('hf_deit_distilled')
    model = load_hf(DeiT(**DEIT).eval(), FIXTURES / 'hf_deit_distilled.safetensors')
    with torch.no_grad():
        torch.testing.assert_close(model(ref['input']), ref['logits'], **TOL)         # the mean of both heads
        logits, distill_logits = model.forward_distill(ref['input'])
    torch.testing.assert_close(logits, ref['cls_logits'], **TOL)
    torch.testing.assert_close(distill_logits, ref['distillation_logits'], **TOL)


def test_hf_deit_tokens_without_the_heads():
    ref = reference('hf_deit_distilled')
    model = load_hf(DeiT(**{**DEIT, 'num_classes': 0}).eval(), FIXTURES / 'hf_deit_distilled.safetensors',
                    load_head=False)
    with torch.no_grad():
        torch.testing.assert_close(model(ref['input']), ref['last_hidden_state'], **TOL)


def test_hf_deit_into_a_plain_vit_names_the_distillation_token():
    with pytest.raises(CheckpointError, match=r'a distilled DeiT \(it has deit\.embeddings\.distillation_token\): '
                                              r'load it into vit_pytorch\.deit\.DeiT'):
        load_hf(ViT(**DEIT), FIXTURES / 'hf_deit_distilled.safetensors')


def test_position_table_of_deit_keeps_both_prefix_rows_when_resampled():
    table = read_checkpoint(FIXTURES / 'hf_deit_distilled.safetensors')['deit.embeddings.position_embeddings'][0]
    model = load_hf(DeiT(**{**DEIT, 'image_size': 40}), FIXTURES / 'hf_deit_distilled.safetensors')
    assert model.pos_embedding.shape == (2 + 25, 16)
    torch.testing.assert_close(model.pos_embedding[:2].detach(), table[:2], atol=0, rtol=0)
    assert math.isclose(model.pos_embedding[2:].mean().item(), table[2:].mean().item(), abs_tol=0.05)


def test_live_hf_vit_folder_non_square_without_qkv_bias(tmp_path):
    transformers = pytest.importorskip('transformers')
    config = transformers.ViTConfig(image_size=[24, 40], patch_size=8, hidden_size=16, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32, num_labels=5, qkv_bias=False)
    reference_model = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():
        for param in reference_model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    reference_model.save_pretrained(tmp_path)
    model = load_hf(ViT(**{**FOLDER_VIT, 'image_size': (24, 40)}).eval(), tmp_path)
    x = torch.randn(2, 3, 24, 40)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference_model(pixel_values=x).logits, **TOL)


# the models Hugging Face has no checkpoints of, and the learnable-memory ViT, whose backbone it has


def no_hf_models():
    from vit_pytorch import SimpleViT
    from vit_pytorch.cait import CaiT
    from vit_pytorch.cct import CCT
    from vit_pytorch.cross_vit import CrossViT
    from vit_pytorch.deepvit import DeepViT
    from vit_pytorch.parallel_vit import ViT as ParallelViT
    from vit_pytorch.t2t import T2TViT
    from vit_pytorch.vit_for_small_dataset import ViT as SmallDatasetViT
    from vit_pytorch.xcit import XCiT
    some = dict(image_size=32, patch_size=8, num_classes=3, dim=16, depth=1, heads=2, mlp_dim=32)
    return {
        'SimpleViT': (lambda: SimpleViT(**some), 'vit-pytorch'),
        'CaiT': (lambda: CaiT(**some, cls_depth=1), 'timm, vit-pytorch'),
        'XCiT': (lambda: XCiT(**some, cls_depth=1), 'timm, vit-pytorch'),
        'CrossViT': (lambda: CrossViT(image_size=32, num_classes=3, sm_dim=16, lg_dim=16, sm_patch_size=8,
                                      lg_patch_size=16), 'timm, vit-pytorch'),
        'T2TViT': (lambda: T2TViT(image_size=32, num_classes=3, dim=16, depth=1, heads=2, mlp_dim=32), 'vit-pytorch'),
        'CCT': (lambda: CCT(img_size=32, embedding_dim=16, num_layers=1, num_heads=2, num_classes=3), 'vit-pytorch'),
        'DeepViT': (lambda: DeepViT(**some), 'vit-pytorch'),
        'vit_for_small_dataset.ViT': (lambda: SmallDatasetViT(**some), 'vit-pytorch'),
        'parallel_vit.ViT': (lambda: ParallelViT(**some), 'timm, vit-pytorch'),
    }


@pytest.mark.parametrize('name', no_hf_models())
def test_a_model_no_hugging_face_checkpoint_exists_for_is_refused_by_type(name):
    build, formats = no_hf_models()[name]
    with pytest.raises(TypeError, match=f'^no Hugging Face checkpoints exist for {name}; it loads: {formats}$'):
        load_hf(build(), FOLDER)


def test_the_learnable_memory_vit_loads_a_hugging_face_folder():
    from vit_pytorch.learnable_memory_vit import Adapter
    from vit_pytorch.learnable_memory_vit import ViT as MemoryViT
    ref = reference('hf_vit_folder')
    model = load_hf(MemoryViT(**FOLDER_VIT).eval(), FOLDER)
    with torch.no_grad():
        torch.testing.assert_close(model(ref['input']), ref['logits'], **TOL)
    with pytest.raises(CheckpointError, match=r'an Adapter wraps a frozen ViT'):
        load_hf(Adapter(vit=MemoryViT(**FOLDER_VIT)), FOLDER)


def test_live_hf_deit_in_memory_names_of_transformers_5():
    transformers = pytest.importorskip('transformers')
    config = transformers.DeiTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32, num_labels=5)
    reference_model = transformers.DeiTForImageClassificationWithTeacher(config).eval()
    with torch.no_grad():
        for param in reference_model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    state_dict = reference_model.state_dict()
    assert 'deit.layers.0.attention.q_proj.weight' in state_dict
    model = load_hf(DeiT(**DEIT).eval(), state_dict)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference_model(pixel_values=x).logits, **TOL)
