"""Every invalid configuration or input raises ValueError/TypeError naming the argument."""

import numpy as np
import pytest
import torch

from helpers import tiny_vit_kwargs
from vit_pytorch import SimpleViT, ViT, models
from vit_pytorch.models import build_model

MODELS = [ViT, SimpleViT]


@pytest.mark.parametrize('model_cls', MODELS)
@pytest.mark.parametrize('override, error, message', [
    (dict(image_size=(16, 25)), ValueError, r'image_size \(16, 25\).*patch_size \(4, 8\)'),
    (dict(image_size=0), ValueError, r'image_size must be a positive int, got 0'),
    (dict(patch_size=-4), ValueError, r'patch_size must be a positive int, got -4'),
    (dict(image_size=(16, 24, 3)), ValueError, r'image_size must be an int or an \(h, w\) pair'),
    (dict(image_size=16.0), TypeError, r'image_size must be a positive int, got 16.0'),
    (dict(dim=0), ValueError, r'dim must be a positive int, got 0'),
    (dict(depth=-1), ValueError, r'depth must be a positive int, got -1'),
    (dict(heads=0), ValueError, r'heads must be a positive int, got 0'),
    (dict(mlp_dim=0), ValueError, r'mlp_dim must be a positive int'),
    (dict(dim_head=0), ValueError, r'dim_head must be a positive int'),
    (dict(channels=0), ValueError, r'channels must be a positive int'),
    (dict(num_classes=-1), ValueError, r'num_classes must be a non-negative int, got -1'),
    (dict(num_classes=2.5), TypeError, r'num_classes must be a non-negative int'),
    (dict(heads=True), TypeError, r'heads must be a positive int'),
])
def test_invalid_configuration(model_cls, override, error, message):
    with pytest.raises(error, match=message):
        model_cls(**tiny_vit_kwargs(**override))


@pytest.mark.parametrize('override, error, message', [
    (dict(pool='max'), ValueError, r"pool must be 'cls'.*or 'mean'.*got 'max'"),
    (dict(dropout=1.0), ValueError, r'dropout must be in \[0, 1\), got 1.0'),
    (dict(emb_dropout=-0.1), ValueError, r'emb_dropout must be in \[0, 1\)'),
    (dict(dropout='0.1'), TypeError, r'dropout must be a float'),
    (dict(gelu_approximate='fast'), ValueError, r"gelu_approximate must be 'none' or 'tanh'"),
    (dict(pre_logits_dim=0), ValueError, r'pre_logits_dim must be a positive int'),
    (dict(norm_eps=0.0), ValueError, r'norm_eps must be a positive finite float, got 0.0'),
    (dict(qkv_bias='yes'), TypeError, r"qkv_bias must be True or False, got 'yes'"),
    (dict(dynamic_image_size=1), TypeError, r'dynamic_image_size must be True or False'),
    (dict(patch_norm=None), TypeError, r'patch_norm must be True or False'),
])
def test_invalid_vit_option(override, error, message):
    with pytest.raises(error, match=message):
        ViT(**tiny_vit_kwargs(**override))


@pytest.mark.parametrize('dim', [30, 4])
def test_simple_vit_dim_must_suit_the_sincos_table(dim):
    with pytest.raises(ValueError, match=rf'dim must be a multiple of 4 and at least 8.*got {dim}'):
        SimpleViT(**tiny_vit_kwargs(dim=dim))


def test_constructor_is_keyword_only():
    with pytest.raises(TypeError):
        ViT((16, 24), (4, 8), 5, 32, 2, 2, 64)


@pytest.mark.parametrize('model_cls', MODELS)
@pytest.mark.parametrize('img, error, message', [
    (torch.randn(3, 16, 24), ValueError, r'\(b, c, h, w\).*3-d.*unsqueeze\(0\)'),
    (torch.randn(1, 1, 3, 16, 24), ValueError, r'\(b, c, h, w\).*5-d'),
    (torch.randn(2, 1, 16, 24), ValueError, r'3 channels.*\(2, 1, 16, 24\)'),
    (torch.randint(0, 255, (2, 3, 16, 24)), TypeError, r'floating point.*torch.int64'),
    (torch.randn(2, 3, 18, 24), ValueError, r'divisible by patch_size|16x24'),
    ([[0.0]], TypeError, r'torch.Tensor.*list'),
])
def test_invalid_input(model_cls, img, error, message):
    model = model_cls(**tiny_vit_kwargs())
    with pytest.raises(error, match=message):
        model(img)


def test_vit_names_the_expected_size():
    model = ViT(**tiny_vit_kwargs())
    with pytest.raises(ValueError, match=r'img must be at most 16x24.*got 32x32.*dynamic_image_size=True'):
        model(torch.randn(1, 3, 32, 32))


def test_a_size_the_patches_do_not_divide_names_a_size_that_works():
    # 30x30 on a 32-pixel, 8-pixel-patch ViT: dynamic_image_size=True would fail too; the message names a size
    # that works
    model = ViT(**tiny_vit_kwargs(image_size=32, patch_size=8))
    with pytest.raises(ValueError, match=r'img height and width \(30, 30\) must be divisible by patch_size '
                                         r'\(8, 8\), e.g. 24x24'):
        model(torch.randn(1, 3, 30, 30))
    assert model(torch.randn(1, 3, 24, 24)).shape == (1, 5)
    dynamic = ViT(**tiny_vit_kwargs(image_size=32, patch_size=8, dynamic_image_size=True))
    assert dynamic(torch.randn(1, 3, 24, 24)).shape == (1, 5)        # the size it names works


@pytest.mark.parametrize('model_cls', MODELS)
def test_a_numpy_array_is_told_how_to_become_a_tensor(model_cls):
    model = model_cls(**tiny_vit_kwargs())
    with pytest.raises(TypeError, match=r'torch.Tensor.*got ndarray; convert a numpy array with '
                                        r'torch.from_numpy\(array\).float\(\)'):
        model(np.zeros((1, 3, 16, 24), dtype=np.float32))


@pytest.mark.parametrize('model_cls', MODELS)
def test_image_dtype_must_match_the_model_outside_autocast(model_cls):
    model = model_cls(**tiny_vit_kwargs())
    with pytest.raises(TypeError, match=r'img has dtype torch.float64.*torch.float32'):
        model(torch.randn(1, 3, 16, 24, dtype=torch.float64))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert model(torch.randn(1, 3, 16, 24)).shape == (1, 5)


def test_dynamic_vit_still_requires_divisible_sizes():
    model = ViT(**tiny_vit_kwargs(dynamic_image_size=True))
    with pytest.raises(ValueError, match=r'divisible by patch_size \(4, 8\)'):
        model(torch.randn(1, 3, 16, 20))


# messages name the argument the user typed (issue 22, item 10)


def registered_mobile_vit_kwargs(**overrides):
    return dict(models.SMALL_CONFIGS['mobile_vit'], image_size=32, num_classes=10, **overrides)


def test_registered_mobile_vit_names_widths_for_a_wrong_count_of_widths():
    # RegisteredMobileViT's `widths` is MobileViT's `channels`; the message must not send the user to `channels`
    with pytest.raises(ValueError, match=r'^widths must be a list of 11 ints, got \(16,'):
        build_model('mobile_vit', **registered_mobile_vit_kwargs(widths=(16,) * 10))


def test_registered_mobile_vit_names_channels_for_bad_image_channels():
    # its `channels` is MobileViT's `in_chans`
    with pytest.raises(ValueError, match=r'^channels must be a positive int, got 0$'):
        build_model('mobile_vit', **registered_mobile_vit_kwargs(channels=0))


def test_cross_vit_names_the_patch_size_that_does_not_divide_the_image():
    kwargs = dict(image_size=32, num_classes=10, sm_dim=32, lg_dim=64, sm_patch_size=3, lg_patch_size=4, depth=1)
    with pytest.raises(ValueError, match=r'image_size \(32, 32\) must be divisible by sm_patch_size \(3, 3\)'):
        build_model('cross_vit', **kwargs)
    with pytest.raises(ValueError, match=r'lg_image_size \(32, 32\) must be divisible by lg_patch_size \(5, 5\)'):
        build_model('cross_vit', **dict(kwargs, sm_patch_size=4, lg_patch_size=5))
