"""timm checkpoints of every model timm has: ViT at non-square sizes, and the variants' models.

References: fixtures written by timm 1.0.31 (tests/fixtures/make_loader_fixtures.py and
make_variant_timm_fixtures.py), tiny random-weight models moved off their initialisation.
"""

import pytest
import torch
from helpers import FIXTURES
from safetensors.torch import load_file

from vit_pytorch import ViT
from vit_pytorch.pretrained import CheckpointError, load_timm

TOL = dict(atol=1e-5, rtol=1e-5)
# timm VisionTransformer(img_size=(32, 24), patch_size=8, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2, 5 classes)
NONSQUARE = dict(image_size=(32, 24), patch_size=8, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, num_classes=5,
                 patch_norm=False, qkv_bias=True, norm_eps=1e-6)


def reference(name):
    return load_file(FIXTURES / f'{name}_reference.safetensors')


def test_non_square_checkpoint_loads_on_the_models_grid():
    ref = reference('timm_vit_nonsquare')
    model = load_timm(ViT(**NONSQUARE).eval(), FIXTURES / 'timm_vit_nonsquare.safetensors')   # 4 x 3, from the model
    with torch.no_grad():
        torch.testing.assert_close(model(ref['input']), ref['logits'], **TOL)


def test_non_square_checkpoint_resampled_from_the_grid_given():
    ref = reference('timm_vit_nonsquare')
    model = ViT(**{**NONSQUARE, 'image_size': (40, 32)}).eval()                     # 5 x 4
    load_timm(model, FIXTURES / 'timm_vit_nonsquare.safetensors', checkpoint_grid=(4, 3))
    with torch.no_grad():
        torch.testing.assert_close(model(ref['input_40x32']), ref['logits_40x32'], **TOL)


def test_non_square_checkpoint_of_unknown_grid_is_refused():
    model = ViT(**{**NONSQUARE, 'image_size': (40, 32)})
    with pytest.raises(CheckpointError, match=r"(?s)timm_vit_nonsquare\.safetensors: .*pos_embed: 12 positions after 1 "
                                              r"prefix token\(s\) are neither the model's 5 x 4 grid nor a square one: "
                                              r"pass checkpoint_grid=\(h, w\)"):
        load_timm(model, FIXTURES / 'timm_vit_nonsquare.safetensors')


def test_checkpoint_grid_is_validated():
    model = ViT(**{**NONSQUARE, 'image_size': (40, 32)})
    with pytest.raises(ValueError, match='checkpoint_grid'):
        load_timm(model, FIXTURES / 'timm_vit_nonsquare.safetensors', checkpoint_grid=(4, 0))


def test_qkv_bias_false_timm_checkpoint_needs_a_model_without_qkv_bias():
    state_dict = load_file(FIXTURES / 'timm_vit_nonsquare.safetensors')
    state_dict = {key: value for key, value in state_dict.items() if not key.endswith('attn.qkv.bias')}
    with pytest.raises(CheckpointError, match=r'build the model with qkv_bias=False'):
        load_timm(ViT(**NONSQUARE), state_dict)
    model = load_timm(ViT(**{**NONSQUARE, 'qkv_bias': False}), state_dict)
    assert model.transformer.layers[0][0].to_qkv.bias is None


def test_live_timm_non_square_without_qkv_bias():
    timm = pytest.importorskip('timm')
    reference_model = timm.models.vision_transformer.VisionTransformer(
        img_size=(24, 40), patch_size=8, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5,
        qkv_bias=False).eval()
    with torch.no_grad():
        for param in reference_model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    model = load_timm(ViT(**{**NONSQUARE, 'image_size': (24, 40), 'qkv_bias': False}).eval(),
                      reference_model.state_dict())
    x = torch.randn(2, 3, 24, 40)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference_model(x), **TOL)
