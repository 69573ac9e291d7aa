import textwrap

import pytest
import torch
from einops import rearrange

from helpers import count, feature_pyramid, load_fixture
from vit_pytorch.pit import PiT, Pool, pit, pit_b_224, pit_s_224, pit_ti_224, pit_xs_224
from vit_pytorch.pretrained import CheckpointError, load_timm, load_vit_pytorch


def tiny_pit(**overrides):
    kwargs = dict(image_size=(16, 24), patch_size=4, num_classes=5, dim=8, depth=(1, 2), heads=(2, 4), dim_head=4,
                  mlp_dim=16)
    kwargs.update(overrides)
    return PiT(**kwargs)


# the face and forward_features' declared layout: tests/test_conformance.py


def test_vit_pytorchs_readme_arguments_build_the_model():
    model = PiT(image_size=224, patch_size=14, dim=256, num_classes=1000, depth=(3, 3, 3), heads=16, mlp_dim=2048,
                dropout=0.1, emb_dropout=0.1)
    assert model.dims == (256, 512, 1024)
    assert [len(transformer.layers) for transformer in model.transformers] == [3, 3, 3]
    assert model.grid_size == (31, 31)           # (224 - 14) // 7 + 1


# the paper's models (counts of the reference implementation, timm 1.0.31's pit_*_224)


@pytest.mark.parametrize('build, expected', [
    (pit_ti_224, 4_847_272), (pit_xs_224, 10_618_888), (pit_s_224, 23_461_912), (pit_b_224, 73_764_840)])
def test_named_configuration_parameter_counts(build, expected):
    with torch.device('meta'):
        model = build()
    assert count(model) == expected


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match='variant'):
        pit('huge')


# what makes PiT different: pooling between stages


def test_pooling_halves_the_grid_and_each_output_channel_reads_one_input_channel_near_it():
    pool = Pool(4, 8).eval()
    x = torch.randn(1, 1 + 6 * 5, 4)
    with torch.no_grad():
        out = pool(x, (6, 5))
        assert out.shape == (1, 1 + 3 * 3, 8)
        assert torch.allclose(out[:, 0], pool.cls_ff(x[:, 0]))
        # move input channel 1 at grid cell (4, 4): only output channels 2 and 3 (its two filters), only at
        # the output cells whose 3x3 stride-2 window covers it: rows 2, columns 2
        moved = x.clone()
        moved[0, 1 + 4 * 5 + 4, 1] += 1.0
        changed = (pool(moved, (6, 5)) - out).abs() > 0
    changed = rearrange(changed[0, 1:], '(h w) c -> c h w', h=3)
    assert changed.nonzero().tolist() == [[2, 2, 2], [3, 2, 2]]
    assert not changed.any(dim=(1, 2))[[0, 1, 4, 5, 6, 7]].any()


def test_stages_widen_and_shrink_as_the_cnn_shape_prescribes():
    model = tiny_pit(depth=(1, 1, 1), heads=(2, 4, 8))
    maps = model.forward_intermediates(torch.randn(2, 3, 16, 24))
    assert [tuple(m.shape) for m in maps] == [(2, 8, 7, 11), (2, 16, 4, 6), (2, 32, 2, 3)]
    assert [info['num_chs'] for info in model.feature_info] == [8, 16, 32]


def test_position_embedding_reaches_the_patches_but_not_the_cls_token():
    model = tiny_pit(depth=(1,), heads=2).eval()
    x0 = model.embed(torch.zeros(1, 3, 16, 24))
    with torch.no_grad():
        model.pos_embedding.add_(1.0)
    x1 = model.embed(torch.zeros(1, 3, 16, 24))
    assert torch.equal(x0[:, 0], x1[:, 0])
    assert torch.allclose(x1[:, 1:] - x0[:, 1:], torch.ones(()))


# the reference: timm's PoolingVisionTransformer, tiny, noisy weights (tests/fixtures/make_pit_fixtures.py)


def timm_case():
    metadata, state_dict, tensors = load_fixture('timm_pit')
    config = metadata['config']
    model = PiT(image_size=tuple(config['img_size']), patch_size=config['patch_size'],
                num_classes=config['num_classes'], dim=config['base_dims'][0] * config['heads'][0],
                depth=tuple(config['depth']), heads=tuple(config['heads']), dim_head=config['base_dims'][0],
                mlp_dim=tuple(config['mlp_ratio'] * b * h for b, h in zip(config['base_dims'], config['heads'])),
                qkv_bias=True, norm_eps=1e-6)
    return model, metadata, state_dict, tensors


def test_logits_and_feature_maps_equal_timms_pit():
    model, _, state_dict, tensors = timm_case()
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-4, rtol=1e-4)
        maps = model.forward_intermediates(tensors['input'])
    for i, found in enumerate(maps):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


def test_feature_pyramid_from_forward_intermediates_has_timms_strides_and_channels():
    model, metadata, _, tensors = timm_case()
    assert model.feature_info == metadata['feature_info']
    img = tensors['input']
    maps = model.forward_intermediates(img)
    width = 8
    pyramid = feature_pyramid(maps, model.feature_info, width)
    for level, info, reference in zip(pyramid, model.feature_info, (tensors[f'feature.{i}'] for i in range(3))):
        assert level.shape == (2, width, *reference.shape[-2:])
        # the grid is the image divided by the stride, within the one cell the convolutions' rounding costs
        assert all(abs(side - image_side / info['reduction']) <= 1
                   for side, image_side in zip(level.shape[-2:], img.shape[-2:]))


def test_forward_intermediates_returns_the_listed_stages():
    # indices None and an int n: tests/test_conformance.py; a list with a negative number: here
    model, _, state_dict, tensors = timm_case()
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        maps = model.forward_intermediates(tensors['input'], indices=[0, -1])
    assert [m.shape for m in maps] == [tensors[f'feature.{i}'].shape for i in (0, 2)]


def test_a_distilled_timm_pit_is_refused():
    model, _, state_dict, _ = timm_case()
    state_dict = dict(state_dict, **{f'head_dist.{kind}': state_dict[f'head.{kind}'] for kind in ('weight', 'bias')})
    with pytest.raises(CheckpointError, match='distilled PiT'):
        load_timm(model, state_dict)


def test_a_model_without_qkv_bias_is_told_to_build_with_it():
    _, _, state_dict, _ = timm_case()
    model = PiT(image_size=(32, 40), patch_size=8, num_classes=7, dim=8, depth=(1, 2, 1), heads=(2, 4, 8),
                dim_head=4, mlp_dim=(32, 64, 128), qkv_bias=False)
    with pytest.raises(CheckpointError, match='qkv_bias=True'):
        load_timm(model, state_dict)


# vit-pytorch 1.26.14's PiT computes another function (tests/fixtures/make_pit_fixtures.py)


def test_vit_pytorch_checkpoint_is_refused_with_what_differs():
    metadata, state_dict, _ = load_fixture('vit_pytorch_1.26.14_pit')
    config = dict(metadata['config'], depth=tuple(metadata['config']['depth']))
    model = PiT(**config)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"vit-pytorch's PiT computes another function: it adds a position "
                                              r"embedding to the cls token"):
        load_vit_pytorch(model, state_dict)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(depth=3), TypeError, 'depth'),
    (dict(depth=(1, 0)), ValueError, 'depth'),
    (dict(heads=(2, 2, 2)), ValueError, 'heads'),
    (dict(mlp_dim=(16,)), ValueError, 'mlp_dim'),
    (dict(patch_size=1), ValueError, 'patch_size'),
    (dict(patch_size=5), ValueError, 'divisible'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny_pit(**overrides)


def test_wrong_image_size_is_refused():
    with pytest.raises(ValueError, match='img must be 16x24'):
        tiny_pit()(torch.randn(1, 3, 16, 16))


# the module's example


def test_module_docstring_example_runs_and_says_what_it_gives():
    from vit_pytorch import pit as module
    example = module.__doc__.split('    import torch', 1)[1].split('\nThe keyword', 1)[0]
    namespace = {}
    exec(textwrap.dedent('    import torch' + example), namespace)
    assert namespace['logits'].shape == (2, 10)
    assert count(namespace['paper_model']) == 4_847_272
    assert [tuple(m.shape) for m in namespace['maps']] == [(1, 64, 27, 27), (1, 128, 14, 14), (1, 256, 7, 7)]
