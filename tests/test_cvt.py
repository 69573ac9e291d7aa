import json
import textwrap

import pytest
import torch
from einops import rearrange
from safetensors.torch import save_file

from helpers import count, feature_pyramid, load_fixture
from vit_pytorch.cvt import ConvAttention, CvT, cvt, cvt_13, cvt_21
from vit_pytorch.pretrained import CheckpointError, load_hf, load_vit_pytorch

TINY = dict(num_classes=5, s1_emb_dim=8, s1_depth=1, s1_mlp_mult=2, s2_emb_dim=16, s2_heads=2, s2_depth=1,
            s2_mlp_mult=2, s3_emb_dim=24, s3_heads=3, s3_depth=2, s3_mlp_mult=2)


def tiny_cvt(**overrides):
    return CvT(**{**TINY, **overrides})


# the face and forward_features' declared layout: tests/test_conformance.py


def test_vit_pytorchs_default_arguments_build_cvt_13s_shape():
    model = CvT(num_classes=1000)
    assert model.dims == (64, 192, 384)
    assert [len(transformer.layers) for transformer in model.transformers] == [1, 2, 10]
    assert model.grids((224, 224)) == [(56, 56), (28, 28), (14, 14)]


# the paper's models (counts of the reference implementation: Hugging Face transformers 5.24.0's
# CvtForImageClassification)


@pytest.mark.parametrize('build, expected', [(cvt_13, 19_997_480), (cvt_21, 31_622_696)])
def test_named_configuration_parameter_counts(build, expected):
    with torch.device('meta'):
        model = build()
    assert count(model) == expected


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match='variant'):
        cvt('w24')


# what makes CvT different


def test_any_image_size_works_without_position_embeddings():
    model = tiny_cvt().eval()
    for size in ((32, 32), (40, 56), (64, 24)):
        assert model(torch.randn(1, 3, *size)).shape == (1, 5)
    assert not any('pos' in name for name, _ in model.named_parameters())


def test_keys_and_values_are_strided_and_the_cls_token_skips_the_convolutions():
    attn = ConvAttention(8, 2, proj_kernel=3, kv_proj_stride=2, num_prefix_tokens=1).eval()
    x = torch.randn(2, 1 + 5 * 7, 8)
    with torch.no_grad():
        q, k, v = attn.qkv(x, (5, 7))
        assert q.shape == (2, 2, 1 + 5 * 7, 4) and k.shape == v.shape == (2, 2, 1 + 3 * 4, 4)
        # the cls token: LayerNorm and the Linear maps only
        cls = attn.norm(x[:, :1])
        torch.testing.assert_close(rearrange(attn.to_k(cls), 'b n (h d) -> b h n d', h=2), k[:, :, :1])
        # a patch: its query reads its 3x3 neighbourhood only
        moved = x.clone()
        moved[:, 1 + 0] += 1.0                          # grid cell (0, 0)
        q_moved, _, _ = attn.qkv(moved, (5, 7))
    changed = rearrange((q_moved - q).abs().sum(dim=(0, 1, 3))[1:] > 0, '(h w) -> h w', h=5)
    assert changed.nonzero().tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]


def test_stages_widen_and_shrink_as_the_embeddings_prescribe():
    model = tiny_cvt()
    maps = model.forward_intermediates(torch.randn(2, 3, 40, 56))
    assert [tuple(m.shape) for m in maps] == [(2, 8, 10, 14), (2, 16, 5, 7), (2, 24, 3, 4)]
    assert [(info['num_chs'], info['reduction']) for info in model.feature_info] == [(8, 4), (16, 8), (24, 16)]


# the reference: Hugging Face's CvtForImageClassification, tiny, noisy weights (tests/fixtures/make_cvt_fixtures.py)


def hf_case(**overrides):
    metadata, state_dict, tensors = load_fixture('hf_cvt')
    config = metadata['config']
    kwargs = dict(num_classes=config['num_labels'], s1_emb_padding=2, cls_token=True, qkv_bias=True,
                  **{f's{i + 1}_{name}': int(config[key][i]) for i in range(3)
                     for name, key in (('emb_dim', 'embed_dim'), ('heads', 'num_heads'), ('depth', 'depth'),
                                       ('mlp_mult', 'mlp_ratio'))})
    return CvT(**{**kwargs, **overrides}), metadata, state_dict, tensors


def test_logits_and_stage_maps_equal_hugging_faces_cvt():
    model, _, state_dict, tensors = hf_case()
    model = load_hf(model.eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-4, rtol=1e-4)
        maps = model.forward_intermediates(tensors['input'])
    assert len(maps) == 3
    for i, found in enumerate(maps):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


def test_model_safetensors_file_loads(tmp_path):
    model, _, state_dict, tensors = hf_case()
    save_file(state_dict, tmp_path / 'model.safetensors')
    model = load_hf(model.eval(), tmp_path / 'model.safetensors')
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-4, rtol=1e-4)


def test_save_pretrained_folder_loads(tmp_path):
    # every CvtConfig says layer_norm_eps=1e-12, which Hugging Face's CvT does not use (its LayerNorms keep 1e-5)
    model, metadata, state_dict, tensors = hf_case()
    save_file(state_dict, tmp_path / 'model.safetensors')
    (tmp_path / 'config.json').write_text(metadata['hf_config'] if isinstance(metadata['hf_config'], str)
                                          else json.dumps(metadata['hf_config']))
    model = load_hf(model.eval(), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-4, rtol=1e-4)


def test_feature_pyramid_from_forward_intermediates_has_the_shapes_of_hugging_faces_hidden_states():
    model, _, _, tensors = hf_case()
    img = tensors['input']
    maps = model.eval().forward_intermediates(img)
    width = 8
    pyramid = feature_pyramid(maps, model.feature_info, width)
    for level, info, i in zip(pyramid, model.feature_info, range(3)):
        hidden = tensors[f'feature.{i}']
        assert info['num_chs'] == hidden.shape[1]
        assert level.shape == (2, width, *hidden.shape[-2:])
        assert all(abs(side - image_side / info['reduction']) < 1
                   for side, image_side in zip(level.shape[-2:], img.shape[-2:]))


def test_a_model_without_the_cls_token_is_told_to_build_it():
    model, _, state_dict, _ = hf_case(cls_token=False)
    with pytest.raises(CheckpointError, match='cls_token=True'):
        load_hf(model, state_dict)


def test_a_model_without_qkv_bias_is_told_to_build_with_it():
    model, _, state_dict, _ = hf_case(qkv_bias=False)
    with pytest.raises(CheckpointError, match='qkv_bias=True'):
        load_hf(model, state_dict)


# vit-pytorch 1.26.14's CvT is another model (tests/fixtures/make_cvt_fixtures.py)


def test_vit_pytorch_checkpoint_is_refused_with_what_differs():
    metadata, _, _ = load_fixture('vit_pytorch_1.26.14_cvt')
    state_dict = {key: torch.zeros(shape) for key, shape in metadata['keys'].items()}
    model = CvT(**metadata['config'])
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"vit-pytorch's CvT is another model: one depthwise convolution feeds "
                                              r"both keys and values"):
        load_vit_pytorch(model, state_dict)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(s2_heads=3), ValueError, 's2_emb_dim must be divisible by s2_heads'),
    (dict(s1_proj_kernel=4), ValueError, 's1_proj_kernel must be odd'),
    (dict(cls_token=1), TypeError, 'cls_token'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny_cvt(**overrides)


def test_too_small_an_image_is_refused():
    with pytest.raises(ValueError, match='img of 4x4 is too small'):
        tiny_cvt(s1_emb_padding=0)(torch.randn(1, 3, 4, 4))


# the module's example


def test_module_docstring_example_runs_and_says_what_it_gives():
    from vit_pytorch import cvt as module
    example = module.__doc__.split('    import torch', 1)[1].split('\nThe keyword', 1)[0]
    namespace = {}
    exec(textwrap.dedent('    import torch' + example), namespace)
    assert namespace['logits'].shape == (2, 1000)
    assert count(namespace['paper_model']) == 19_997_480
    assert [tuple(m.shape) for m in namespace['maps']] == [(1, 64, 24, 24), (1, 192, 12, 12), (1, 384, 6, 6)]


# found by tests/test_properties.py: a middle stage emptied by an unpadded embedding was a conv RuntimeError
def test_an_image_that_empties_a_middle_stage_is_refused():
    model = tiny_cvt(s2_emb_kernel=2, s2_emb_stride=1, s2_emb_padding=0, s3_emb_kernel=2, s3_emb_stride=1,
                     s3_emb_padding=1)
    assert model.grids((4, 4)) == [(1, 1), (0, 0), (1, 1)]
    with pytest.raises(ValueError, match=r'img of 4x4 is too small.*every stage needs at least one token'):
        model(torch.randn(2, 3, 4, 4))
