"""timm checkpoints of every model timm has: ViT at non-square sizes, and the variants' models.

References: fixtures written by timm 1.0.31 (tests/fixtures/make_loader_fixtures.py and
make_variant_timm_fixtures.py), tiny random-weight models moved off their initialisation.
"""

import pytest
import torch
from helpers import FIXTURES

from vit_pytorch import SimpleViT, ViT
from vit_pytorch.cait import CaiT
from vit_pytorch.cct import CCT
from vit_pytorch.deepvit import DeepViT
from vit_pytorch.learnable_memory_vit import Adapter
from vit_pytorch.learnable_memory_vit import ViT as MemoryViT
from vit_pytorch.parallel_vit import ViT as ParallelViT
from vit_pytorch.pretrained import CheckpointError, load_hf, load_timm, read_checkpoint
from vit_pytorch.simple_vit_with_patch_dropout import SimpleViT as PatchDropoutSimpleViT
from vit_pytorch.simple_vit_with_qk_norm import SimpleViT as QkNormSimpleViT
from vit_pytorch.simple_vit_with_register_tokens import SimpleViT as RegisterSimpleViT
from vit_pytorch.t2t import T2TViT
from vit_pytorch.vit_for_small_dataset import ViT as SmallDatasetViT

TOL = dict(atol=1e-5, rtol=1e-5)
# timm VisionTransformer(img_size=(32, 24), patch_size=8, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2, 5 classes)
NONSQUARE = dict(image_size=(32, 24), patch_size=8, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, num_classes=5,
                 patch_norm=False, qkv_bias=True, norm_eps=1e-6)


def reference(name):
    return read_checkpoint(FIXTURES / f'{name}_reference.safetensors')


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
    state_dict = read_checkpoint(FIXTURES / 'timm_vit_nonsquare.safetensors')
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


# the variants' timm models; CaiT, XCiT and CrossViT are loaded through load_timm in their own test files
# (tests/test_cait.py, test_xcit.py, test_cross_vit.py), the parallel ViT here


PARALLEL = dict(image_size=32, patch_size=8, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32,
                num_parallel_branches=2, patch_norm=False, qkv_bias=True, norm_eps=1e-6)


def test_parallel_vit_with_layer_scale_from_timm():
    ref = reference('timm_parallel_vit')     # timm ParallelThingsBlock x 2, LayerScale init 0.3
    model = load_timm(ParallelViT(**PARALLEL, layer_scale_init=1e-5).eval(), FIXTURES / 'timm_parallel_vit.safetensors')
    with torch.no_grad():
        torch.testing.assert_close(model(ref['input']), ref['logits'], **TOL)


def test_parallel_checkpoint_with_layer_scale_needs_a_model_with_it():
    with pytest.raises(CheckpointError, match=r'LayerScale.*build the model with layer_scale_init'):
        load_timm(ParallelViT(**PARALLEL), FIXTURES / 'timm_parallel_vit.safetensors')


def test_a_sequential_checkpoint_into_a_parallel_model_is_named():
    with pytest.raises(CheckpointError, match=r'blocks\.0\.attns\.0\.norm\.weight'):
        load_timm(ParallelViT(**PARALLEL), FIXTURES / 'timm_vit.safetensors')


SOME = dict(image_size=32, patch_size=8, num_classes=3, dim=16, depth=1, heads=2, mlp_dim=32)
NO_TIMM = {    # models no timm checkpoint exists for
    'CCT': lambda: CCT(img_size=32, embedding_dim=16, num_layers=1, num_heads=2, num_classes=3),
    'SimpleViT': lambda: SimpleViT(**SOME),
    'SimpleViT (qk norm)': lambda: QkNormSimpleViT(**SOME),
    'SimpleViT (patch dropout)': lambda: PatchDropoutSimpleViT(**SOME),
    'SimpleViT (register tokens)': lambda: RegisterSimpleViT(**SOME),
    'DeepViT': lambda: DeepViT(**SOME),
    'T2TViT': lambda: T2TViT(image_size=32, num_classes=3, dim=16, depth=1, heads=2, mlp_dim=32),
    'vit_for_small_dataset.ViT': lambda: SmallDatasetViT(**SOME),
}


@pytest.mark.parametrize('name', NO_TIMM)
def test_a_model_no_timm_checkpoint_exists_for_is_refused_by_type(name):
    model = NO_TIMM[name]()
    with pytest.raises(TypeError, match=f'^no timm checkpoints exist for {name.split(" ")[0]}; it loads: vit-pytorch$'):
        load_timm(model, FIXTURES / 'timm_vit.safetensors')


def test_the_learnable_memory_vit_loads_timms_vit():
    ref = reference('timm_vit')
    model = load_timm(MemoryViT(**{**NONSQUARE, 'image_size': 32}).eval(), FIXTURES / 'timm_vit.safetensors')
    with torch.no_grad():
        torch.testing.assert_close(model(ref['input']), ref['logits'], **TOL)


def test_an_adapter_is_told_to_load_its_vit():
    adapter = Adapter(vit=MemoryViT(**{**NONSQUARE, 'image_size': 32}))
    with pytest.raises(CheckpointError, match=r'an Adapter wraps a frozen ViT: load the checkpoint into that ViT'):
        load_timm(adapter, FIXTURES / 'timm_vit.safetensors')


def test_a_model_no_hugging_face_checkpoint_exists_for_names_the_formats_it_loads():
    model = CaiT(image_size=32, patch_size=8, num_classes=7, dim=24, depth=1, cls_depth=1, heads=3, mlp_dim=48)
    with pytest.raises(TypeError, match=r'^no Hugging Face checkpoints exist for CaiT; it loads: timm, vit-pytorch$'):
        load_hf(model, FIXTURES / 'hf_vit_folder')


def test_live_timm_variants():
    timm = pytest.importorskip('timm')
    cases = [
        (timm.models.cait.Cait(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3, init_values=0.3,
                               num_classes=7),
         CaiT(image_size=32, patch_size=8, num_classes=7, dim=24, depth=2, cls_depth=2, heads=3, dim_head=8,
              mlp_dim=96, patch_norm=False, qkv_bias=True, norm_eps=1e-6)),
        (timm.models.vision_transformer.VisionTransformer(
            img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5,
            block_fn=timm.models.vision_transformer.ParallelThingsBlock),
         ParallelViT(**PARALLEL)),
    ]
    x = torch.randn(2, 3, 32, 32)
    for reference_model, model in cases:
        with torch.no_grad():
            for param in reference_model.parameters():
                param.add_(0.1 * torch.randn_like(param))
        load_timm(model.eval(), reference_model.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(model(x), reference_model.eval()(x), **TOL)
