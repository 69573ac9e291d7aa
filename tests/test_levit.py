import textwrap

import pytest
import torch
from einops import rearrange
from torch import nn

from helpers import count, feature_pyramid, load_fixture
from vit_pytorch.levit import (Attention, LeViT, LinearNorm, SubsampleAttention, levit, levit_128, levit_128s,
                               levit_192, levit_256, levit_384)
from vit_pytorch.pretrained import CheckpointError, load_timm, load_vit_pytorch


def tiny_levit(**overrides):
    kwargs = dict(image_size=(48, 64), num_classes=5, dim=(16, 24), depth=(1, 2), heads=(2, 3), mlp_mult=2,
                  stages=2, dim_key=4, dim_value=8)
    kwargs.update(overrides)
    return LeViT(**kwargs)


# the face and forward_features' declared layout: tests/test_conformance.py


def test_vit_pytorchs_readme_arguments_build_the_model():
    model = LeViT(image_size=224, num_classes=1000, stages=3, dim=(256, 384, 512), depth=4, heads=(4, 6, 8),
                  mlp_mult=2, dropout=0.1)
    assert model.dims == (256, 384, 512)
    assert [len(transformer.layers) for transformer in model.transformers] == [4, 4, 4]
    assert model.grids == [(14, 14), (7, 7), (4, 4)]


# the paper's models (counts of the reference implementation, timm 1.0.31's levit_*, with the distillation head)


@pytest.mark.parametrize('build, expected', [
    (levit_128s, 7_777_058), (levit_128, 9_213_936), (levit_192, 10_947_069), (levit_256, 18_893_876),
    (levit_384, 39_128_836)])
def test_named_configuration_parameter_counts(build, expected):
    with torch.device('meta'):
        model = build()
    assert count(model) == expected


def test_named_configuration_without_distillation_has_one_head():
    with torch.device('meta'):
        model = levit_128s(distillation=False)
    assert model.distill_head is None
    assert count(model) == 7_777_058 - (384 * 1000 + 1000 + 2 * 384)


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match='variant'):
        levit('1024')


# what makes LeViT different


def test_linear_norm_folds_into_one_linear_at_inference():
    layer = LinearNorm(6, 4).eval()
    with torch.no_grad():
        layer.norm.weight.normal_()
        layer.norm.bias.normal_()
        layer.norm.running_mean.normal_()
        layer.norm.running_var.uniform_(0.5, 2.0)
    gain = layer.norm.weight / torch.sqrt(layer.norm.running_var + layer.norm.eps)
    folded = nn.Linear(6, 4)
    with torch.no_grad():
        folded.weight.copy_(layer.linear.weight * gain[:, None])
        folded.bias.copy_(layer.norm.bias - layer.norm.running_mean * gain)
        x = torch.randn(2, 5, 6)
        torch.testing.assert_close(layer(x), folded(x))


def test_attention_bias_is_one_value_per_head_for_each_absolute_offset():
    attn = Attention(8, heads=2, dim_key=4, dim_value=4, grid=(3, 4))
    assert attn.pos_bias.shape == (2, 3 * 4)
    index = attn.pos_bias_index
    position = lambda n: divmod(n, 4)                                      # (row, column) of token n
    for query in range(12):
        for key in range(12):
            (qy, qx), (ky, kx) = position(query), position(key)
            assert index[query, key] == abs(qy - ky) * 4 + abs(qx - kx)


def test_subsample_attention_queries_every_other_row_and_column():
    attn = SubsampleAttention(8, heads=2, dim_key=4, dim_value=16, grid=(3, 4), dim_out=12).eval()
    x = torch.randn(1, 3 * 4, 8)
    with torch.no_grad():
        out = attn(x)
        assert out.shape == (1, 2 * 2, 12)
        # a token that is no query changes every output through the keys; a query token changes its own row most
        q, _, _ = attn.qkv(x)
        grid = rearrange(x, 'b (h w) c -> b h w c', h=3)
        expected_q = rearrange(attn.to_q(rearrange(grid[:, ::2, ::2], 'b h w c -> b (h w) c')), 'b n (h d) -> b h n d',
                               h=2)
        torch.testing.assert_close(q, expected_q)
    # the queries sit at rows 0, 2 and columns 0, 2 of the key grid: offsets to key (1, 3)
    assert attn.pos_bias_index[:, 1 * 4 + 3].tolist() == [1 * 4 + 3, 1 * 4 + 1, 1 * 4 + 3, 1 * 4 + 1]


def test_distillation_heads_give_the_pair_in_training_and_their_average_in_eval():
    model = tiny_levit(num_distill_classes=5)
    img = torch.randn(4, 3, 48, 64)
    model.train()
    logits, distill_logits = model(img)
    model.eval()
    with torch.no_grad():
        pair = model.forward_distill(img)
        torch.testing.assert_close(model(img), (pair[0] + pair[1]) / 2)
    assert logits.shape == distill_logits.shape == (4, 5)
    assert not torch.allclose(pair[0], pair[1])


# the reference: timm's LevitDistilled, tiny, noisy weights (tests/fixtures/make_levit_fixtures.py)


def timm_case(**overrides):
    metadata, state_dict, tensors = load_fixture('timm_levit')
    config = metadata['config']
    kwargs = dict(image_size=tuple(config['img_size']), num_classes=config['num_classes'],
                  dim=tuple(config['embed_dim']), depth=tuple(config['depth']), heads=tuple(config['num_heads']),
                  mlp_mult=int(config['mlp_ratio']), stages=len(config['embed_dim']), dim_key=config['key_dim'],
                  dim_value=int(config['attn_ratio'] * config['key_dim']), num_distill_classes=config['num_classes'])
    model = LeViT(**{**kwargs, **overrides})
    return model, metadata, state_dict, tensors


def test_logits_and_feature_maps_equal_timms_levit():
    model, _, state_dict, tensors = timm_case()
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-4, rtol=1e-4)
        maps = model.forward_intermediates(tensors['input'])
    for i, found in enumerate(maps):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


def test_timms_convolutional_levit_loads_as_the_same_model():
    model, metadata, state_dict, tensors = timm_case()
    # levit_conv_* keeps every Linear (but the heads') as a 1x1 convolution: the fixture has timm's shapes
    conv_state = {key: value.reshape(metadata['conv_shapes'].get(key, value.shape))
                  for key, value in state_dict.items()}
    assert len(metadata['conv_shapes']) > 0
    model = load_timm(model.eval(), conv_state)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits_conv'], atol=1e-4, rtol=1e-4)


def test_feature_pyramid_from_forward_intermediates_has_timms_strides_and_channels():
    model, metadata, _, tensors = timm_case()
    channels_and_strides = lambda info: [(stage['num_chs'], stage['reduction']) for stage in info]
    assert channels_and_strides(model.feature_info) == channels_and_strides(metadata['feature_info'])
    assert all(stage['module'] in dict(model.named_modules()) for stage in model.feature_info)
    img = tensors['input']
    maps = model.eval().forward_intermediates(img)
    width = 8
    pyramid = feature_pyramid(maps, model.feature_info, width)
    for level, info, i in zip(pyramid, model.feature_info, range(3)):
        assert level.shape == (2, width, *tensors[f'feature.{i}'].shape[-2:])
        assert all(abs(side - image_side / info['reduction']) < 1
                   for side, image_side in zip(level.shape[-2:], img.shape[-2:]))


def test_a_model_without_the_distillation_head_is_told_to_build_it():
    model, _, state_dict, _ = timm_case(num_distill_classes=None)
    with pytest.raises(CheckpointError, match='num_distill_classes=num_classes'):
        load_timm(model, state_dict)


def test_checkpoint_heads_can_be_left_out_for_fine_tuning():
    model, _, state_dict, tensors = timm_case()
    model = load_timm(model.eval(), state_dict, load_head=False)
    model.reset_classifier(3)
    with torch.no_grad():
        assert torch.equal(model(tensors['input']), torch.zeros(2, 3))


# vit-pytorch 1.26.14's LeViT is another model (tests/fixtures/make_levit_fixtures.py)


def test_vit_pytorch_checkpoint_is_refused_with_what_differs():
    metadata, _, _ = load_fixture('vit_pytorch_1.26.14_levit')
    config = {key: tuple(value) if isinstance(value, list) else value for key, value in metadata['config'].items()}
    state_dict = {key: torch.zeros(shape) for key, shape in metadata['keys'].items()}
    model = LeViT(**config)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"vit-pytorch's LeViT is another model: its stem is four convolutions"):
        load_vit_pytorch(model, state_dict)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


# the fused path, the heads


def test_the_fused_path_with_the_bias_equals_the_explicit_one():
    # the model takes the fused path on accelerators only: compare the two paths of the primitive directly
    from vit_pytorch import vit

    attn = SubsampleAttention(8, heads=2, dim_key=4, dim_value=16, grid=(3, 4), dim_out=12).eval()
    with torch.no_grad():
        attn.pos_bias.normal_()
        q, k, v = attn.qkv(torch.randn(2, 12, 8))
        paths = [vit.attend(q, k, v, scale=attn.scale, mask=attn.bias(), fused=fused) for fused in (True, False)]
    torch.testing.assert_close(*paths)


def test_reset_classifier_keeps_the_distillation_head_and_brings_it_back_after_0():
    # a zero head, and 0 as num_classes=0 builds: tests/test_conformance.py
    model = tiny_levit(num_distill_classes=5).eval()
    model.reset_classifier(3)
    assert model.distill_head is not None
    model.reset_classifier(0)
    model.reset_classifier(4)
    assert model.distill_head is not None and model(torch.randn(2, 3, 48, 64)).shape == (2, 4)


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(image_size=40), ValueError, 'image_size must be divisible by 16'),
    (dict(dim=(12, 24)), ValueError, 'divisible by 8'),
    (dict(dim=(16, 24, 32)), ValueError, 'at most 2'),
    (dict(dim_key=32), ValueError, 'dim_key'),
    (dict(num_distill_classes=4), ValueError, 'num_distill_classes'),
    (dict(mlp_mult=1.5), TypeError, 'mlp_mult'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny_levit(**overrides)


def test_wrong_image_size_is_refused():
    with pytest.raises(ValueError, match='img must be 48x64'):
        tiny_levit()(torch.randn(1, 3, 64, 64))


def test_forward_distill_without_a_distillation_head_is_refused():
    with pytest.raises(ValueError, match='num_distill_classes'):
        tiny_levit().forward_distill(torch.randn(2, 3, 48, 64))


# the module's example


def test_module_docstring_example_runs_and_says_what_it_gives():
    from vit_pytorch import levit as module
    example = module.__doc__.split('    import torch', 1)[1].split('\nThe keyword', 1)[0]
    namespace = {}
    exec(textwrap.dedent('    import torch' + example), namespace)
    assert namespace['logits'].shape == (2, 1000)
    assert count(namespace['paper_model']) == 7_777_058
    assert [tuple(m.shape) for m in namespace['maps']] == [(1, 128, 14, 14), (1, 256, 7, 7), (1, 384, 4, 4)]
