"""3D ViT, 3D SimpleViT and 3D CCT: tubelets, joint space-time attention, the references' outputs.

References: Hugging Face's `VivitForVideoClassification` (transformers 5.24.0, ViViT's Model 1;
tests/fixtures/make_vivit_hf_fixtures.py) and vit-pytorch 1.26.14's `vit_3d`, `simple_vit_3d` and
`cct_3d` (tests/fixtures/make_video_signal_fixtures.py), each through the public loaders.
"""

import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from helpers import FIXTURES, as_tuples, fit_fixed_batch, load_fixture

from vit_pytorch.cct_3d import CCT, cct_7
from vit_pytorch.clips import moving_digits
from vit_pytorch.pretrained import CheckpointError, load_hf, load_vit_pytorch, num_parameters
from vit_pytorch.recorder import Recorder
from vit_pytorch.simple_vit_3d import SimpleViT, posemb_sincos_3d
from vit_pytorch.vit_3d import ViT, vivit_b_16x2_kinetics400

VIDEO = dict(image_size=(16, 24), image_patch_size=(4, 8), frames=4, frame_patch_size=2)
TINY = dict(VIDEO, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32)
# the fixture's HF model: VivitConfig(image_size=[16, 24], num_frames=4, tubelet_size=[2, 4, 8], hidden 16,
# 2 layers, 2 heads, intermediate 24, 5 labels; gelu_fast, eps 1e-6, qkv bias: the defaults)
HF_VIVIT = dict(VIDEO, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=24, patch_norm=False,
                qkv_bias=True, norm_eps=1e-6, gelu_approximate='tanh')
TOL = dict(atol=1e-5, rtol=1e-5)


def video(batch=2, frames=4, size=(16, 24), channels=3):
    return torch.randn(batch, channels, frames, *size)


def vit_pytorch_case(case):
    """(our model built with the fixture's arguments, state_dict, tensors) of a vit-pytorch fixture."""
    metadata, state_dict, tensors = load_fixture(f'vit_pytorch_1.26.14_{case}')
    module, name = metadata['class'].split('.')
    config = as_tuples(metadata['config'], 'image_size', 'image_patch_size', 'img_size')
    model = getattr(importlib.import_module(f'vit_pytorch.{module}'), name)(**config).eval()
    return model, state_dict, tensors


# shapes and gradients


@pytest.mark.parametrize('pool, prefix', [('cls', 1), ('mean', 0)])
def test_the_features_the_headless_output_and_the_token_grid(pool, prefix):
    model = ViT(**TINY, pool=pool)          # the logits' shape: test_conformance's rows vit_3d[, pool=mean]
    x = video(3)
    assert model.forward_features(x).shape == (3, prefix + 2 * 4 * 3, 16)
    assert ViT(**dict(TINY, num_classes=0), pool=pool)(x).shape == (3, prefix + 24, 16)
    assert model.token_grid((4, 16, 24)) == (2, 4, 3) and model.num_prefix_tokens == prefix


# what the model is: tubelets and joint space-time attention


def test_tubelet_embedding_is_a_strided_conv3d():
    model = ViT(**TINY, patch_norm=False)
    x = video()
    linear = model.to_patch_embedding[2]
    # the Linear over (pf p1 p2 c) is a Conv3d whose kernel and stride are the tubelet
    kernel = rearrange(linear.weight, 'd (pf p1 p2 c) -> d c pf p1 p2', pf=2, p1=4, p2=8)
    expected = rearrange(F.conv3d(x, kernel, linear.bias, stride=(2, 4, 8)), 'b d f h w -> b (f h w) d')
    torch.testing.assert_close(model.to_patch_embedding(x), expected, **TOL)


def test_attention_is_joint_over_space_and_time():
    model = ViT(**TINY).eval()
    x = video(1)
    logits, attns = Recorder(model)(x)
    assert attns.shape == (1, 2, 2, 1 + 24, 1 + 24)           # every token attends to every tubelet
    changed = x.clone()
    changed[:, :, 3, :4, :8] += 1.0                           # one tubelet of the last two frames
    with torch.no_grad():
        tokens, changed_tokens = model.forward_features(x), model.forward_features(changed)
    # after one layer every token already differs (a ViT over frames alone would leave the others alone)
    assert ((tokens - changed_tokens).abs().amax(dim=-1) > 1e-6).all()


# Hugging Face's ViViT (Model 1)


def test_vivit_b_16x2_has_hugging_faces_parameter_count():
    metadata, _, _ = load_fixture('hf_vivit')
    assert num_parameters(vivit_b_16x2_kinetics400) == int(metadata['vivit_b_16x2_kinetics400_parameters'])
    assert num_parameters(vivit_b_16x2_kinetics400) == 88_954_000


@pytest.mark.parametrize('source', ['state_dict', 'folder', 'file'])
def test_logits_equal_hugging_faces_vivit(source):
    _, state_dict, tensors = load_fixture('hf_vivit')
    checkpoint = {'state_dict': state_dict, 'folder': FIXTURES / 'hf_vivit_folder',
                  'file': FIXTURES / 'hf_vivit_folder' / 'model.safetensors'}[source]
    model = load_hf(ViT(**HF_VIVIT).eval(), checkpoint)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], **TOL)


def test_hugging_face_vivit_needs_the_papers_numerics():
    _, state_dict, tensors = load_fixture('hf_vivit')
    with pytest.raises(CheckpointError, match=r"hidden_act='gelu_fast'.*gelu_approximate='tanh'"):
        load_hf(ViT(**dict(HF_VIVIT, gelu_approximate='none')), FIXTURES / 'hf_vivit_folder')
    with pytest.raises(CheckpointError, match=r"layer_norm_eps=1e-06.*norm_eps=1e-06"):
        load_hf(ViT(**dict(HF_VIVIT, norm_eps=1e-5)), FIXTURES / 'hf_vivit_folder')
    # a bare state_dict has no config to check: the exact GELU then gives other logits than HF's gelu_fast
    exact_gelu = load_hf(ViT(**dict(HF_VIVIT, gelu_approximate='none')).eval(), state_dict)
    with torch.no_grad():
        assert not torch.allclose(exact_gelu(tensors['input']), tensors['logits'], **TOL)
    with pytest.raises(CheckpointError, match=r'patch_norm=False'):
        load_hf(ViT(**dict(HF_VIVIT, patch_norm=True)), FIXTURES / 'hf_vivit_folder')
    with pytest.raises(CheckpointError, match=r"qkv_bias=True"):
        load_hf(ViT(**dict(HF_VIVIT, qkv_bias=False)), state_dict)


# vit-pytorch's checkpoints


@pytest.mark.parametrize('case', ['vit_3d_cls', 'simple_vit_3d', 'cct_3d_learnable', 'cct_3d_sine'])
def test_vit_pytorch_checkpoint_loads_and_reproduces_its_outputs(case):
    model, state_dict, tensors = vit_pytorch_case(case)
    load_vit_pytorch(model, state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], **TOL)


def test_vit_pytorch_mean_pool_checkpoint_is_refused_with_what_differs():
    model, state_dict, _ = vit_pytorch_case('vit_3d_mean')
    with pytest.raises(CheckpointError, match=r"pool='mean'.*averages it with the tubelet tokens"):
        load_vit_pytorch(model, state_dict)


def test_cct_3d_sine_checkpoint_of_another_table_is_refused():
    model, state_dict, _ = vit_pytorch_case('cct_3d_sine')
    state_dict['classifier.positional_emb'] = state_dict['classifier.positional_emb'] + 0.5
    with pytest.raises(CheckpointError, match=r"not this model's fixed sine table"):
        load_vit_pytorch(model, state_dict)


# SimpleViT-3D


def test_simple_vit_3d_position_table_is_the_3d_sincos_formula():
    frames, height, width, dim = 2, 3, 4, 20          # 20 = 6 * 3 + 2 channels of padding
    table = posemb_sincos_3d(frames, height, width, dim)
    omega = [10000 ** -(i / 2) for i in range(3)]
    row = 0
    for z in range(frames):
        for y in range(height):
            for x in range(width):
                expected = [f(x * w) for f in (math.sin, math.cos) for w in omega] + \
                           [f(y * w) for f in (math.sin, math.cos) for w in omega] + \
                           [f(z * w) for f in (math.sin, math.cos) for w in omega] + [0.0, 0.0]
                torch.testing.assert_close(table[row], torch.tensor(expected), atol=1e-6, rtol=0)
                row += 1


def test_simple_vit_3d_takes_other_video_sizes():
    model = SimpleViT(**TINY).eval()
    with torch.no_grad():
        assert model(video(2, frames=6, size=(8, 32))).shape == (2, 5)
    with pytest.raises(ValueError, match=r'\bvideo\b.*multiples of the tubelet'):
        model(video(2, frames=5))


# CCT-3D


@pytest.mark.parametrize('kwargs', [
    dict(n_conv_layers=1, frame_kernel_size=3, frame_stride=1),
    dict(n_conv_layers=2, frame_kernel_size=1, frame_stride=2, frame_pooling_kernel_size=3, frame_pooling_stride=1),
])
def test_cct_3d_token_grid_is_the_tokenizers_output(kwargs):
    model = CCT(img_size=(16, 24), num_frames=6, embedding_dim=16, kernel_size=3, stride=1, padding=1, num_layers=1,
                num_heads=2, num_classes=0, positional_embedding='none', **kwargs)
    frames, height, width = model.token_grid((6, 16, 24))
    assert model.forward_features(video(1, frames=6)).shape == (1, frames * height * width, 16)
    assert model.tokenizer.conv_layers(video(1, frames=6)).shape[2:] == (frames, height, width)


def test_cct_3d_named_model_counts_as_the_2d_one_plus_its_3d_kernels():
    from vit_pytorch.cct import cct_7 as cct_7_2d

    video_model = num_parameters(cct_7, img_size=32, num_frames=8, num_classes=10)
    image_model = num_parameters(cct_7_2d, img_size=32, num_classes=10)
    # only the tokenizer's 3 x 3 kernels (3 -> 256 channels) gain a frame axis, of 3
    assert video_model - image_model == 256 * 3 * 3 * 3 * (3 - 1)


def test_cct_3d_too_few_frames_for_the_tokenizer_is_refused():
    with pytest.raises(ValueError, match=r'num_frames'):
        CCT(img_size=16, num_frames=1, frame_kernel_size=3, frame_padding=0, embedding_dim=16, num_layers=1,
            num_heads=2)


# learning: real digits moving


@pytest.mark.parametrize('build', [
    lambda: ViT(image_size=16, image_patch_size=8, frames=4, frame_patch_size=2, num_classes=10, dim=32, depth=1,
                heads=2, dim_head=16, mlp_dim=64, channels=1),
    lambda: SimpleViT(image_size=16, image_patch_size=8, frames=4, frame_patch_size=2, num_classes=10, dim=32,
                      depth=1, heads=2, dim_head=16, mlp_dim=64, channels=1),
], ids=['vit_3d', 'simple_vit_3d'])
def test_tiny_model_overfits_16_clips_of_real_digits(build):
    clips = moving_digits('train', count=16, frames=4, size=16, digit_size=8, speed=2)
    accuracy, steps = fit_fixed_batch(build(), clips.floats(), clips.labels)
    assert accuracy == 1.0, f'training accuracy {accuracy} after {steps} steps'


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(frames=5), ValueError, r'frames \(5\).*frame_patch_size \(2\)'),
    (dict(image_patch_size=5), ValueError, 'image_patch_size'),
    (dict(pool='max'), ValueError, 'pool'),
    (dict(gelu_approximate='fast'), ValueError, 'gelu_approximate'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        ViT(**{**TINY, **overrides})


@pytest.mark.parametrize('bad, error, match', [
    (torch.randn(2, 3, 16, 24), ValueError, r'video must have shape \(b, c, frames, h, w\).*unsqueeze'),
    (torch.randn(2, 1, 4, 16, 24), ValueError, r'video must have 3 channels'),
    (torch.randn(2, 3, 2, 16, 24), ValueError, r'video must be 4 frames of 16x24'),
    (torch.randn(2, 3, 4, 16, 24).double(), TypeError, r'video has dtype torch.float64'),
    (torch.zeros(2, 3, 4, 16, 24, dtype=torch.long), TypeError, r'video must be a floating point'),
    ('video', TypeError, r'video must be a torch.Tensor'),
])
def test_bad_videos_are_refused_naming_video(bad, error, match):
    for model in (ViT(**TINY), SimpleViT(**TINY)):
        if isinstance(model, SimpleViT) and 'frames of' in match:
            continue                                    # SimpleViT takes any size divisible by the tubelet
        with pytest.raises(error, match=match):
            model(bad)


def test_simple_vit_3d_dim_too_small_for_its_table_is_refused():
    with pytest.raises(ValueError, match=r'dim must be at least 12'):
        SimpleViT(**dict(TINY, dim=8))
