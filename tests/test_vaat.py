"""VAAT (vit_pytorch.vaat): the spectrogram against its formula and torchaudio, the AST, and the policy reading
both towers; vit-pytorch's checkpoints."""

import math

import pytest
import torch

from helpers import count, load_fixture
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.vaat import (AST, AST_CONFIGS, VAAT, Spectrogram, ViT, audio_spectrogram_transformer, hz_to_mel,
                              mel_filterbank, mel_to_hz)

TOWER = dict(image_size=16, patch_size=8, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32)
AUDIO_TOWER = dict(dim=16, depth=2, mlp_dim=32, patch_size=8, dim_head=8, heads=2)
POLICY = dict(dim=16, depth=2, heads=2, dim_head=8, dim_action=2, mlp_dim=32, num_image_views=2, num_audio_views=2,
              action_chunk_len=3, self_attn_heads=2, self_attn_dim_head=8)


# the spectrogram


def test_a_pure_tone_puts_its_energy_in_its_frequency_bin():
    sample_rate, n_fft = 16000, 128
    t = torch.arange(4000, dtype=torch.float64) / sample_rate
    for k in (5, 10, 30):
        tone = torch.cos(2 * math.pi * (k * sample_rate / n_fft) * t)
        spec = Spectrogram(n_fft=n_fft, win_length=n_fft).double()(tone)          # (65, frames)
        assert (spec[:, 2:-2].argmax(dim=0) == k).all()


def test_each_frame_is_the_dft_of_the_windowed_reflection_padded_samples():
    spectrogram = Spectrogram(n_fft=128, win_length=24).double()
    audio = torch.randn(300, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(audio[None, None], (64, 64), mode='reflect')[0, 0]
    n = torch.arange(128, dtype=torch.float64)
    window = torch.zeros(128, dtype=torch.float64)
    window[52:76] = 0.5 - 0.5 * torch.cos(2 * math.pi * torch.arange(24, dtype=torch.float64) / 24)  # periodic Hann
    spec = spectrogram(audio)
    for frame in (0, 7, spec.shape[-1] - 1):
        samples = padded[frame * 12:frame * 12 + 128] * window
        for k in (0, 3, 64):
            dft = (samples * torch.exp(-2j * math.pi * k * n / 128)).sum()
            torch.testing.assert_close(spec[k, frame], dft.abs() ** 2, rtol=1e-6, atol=1e-9)  # the window is float32


def test_the_mel_scale_is_the_htk_formula():
    for hz in (0., 440., 1000., 7999.):
        assert hz_to_mel(hz).item() == pytest.approx(2595 * math.log10(1 + hz / 700), rel=1e-12)
        assert mel_to_hz(hz_to_mel(hz)).item() == pytest.approx(hz, abs=1e-9)


def test_each_mel_filter_peaks_at_one_on_its_centre_bin_and_is_zero_outside_its_neighbours():
    # 10 mel points chosen so that each centre lies on a bin: an 8 kHz range over 801 bins (10 Hz apart)
    fb = mel_filterbank(801, 8, 16000)
    centres = mel_to_hz(torch.linspace(0, hz_to_mel(8000.).item(), 10))[1:-1]
    peaks = fb.argmax(dim=0)
    assert ((peaks.double() * 10 - centres).abs() <= 10).all()
    assert (fb.max(dim=0).values > 0.9).all()
    assert (fb[centres.ceil().long().div(10, rounding_mode='floor')[-1] + 100:, :-1] == 0).all()


def test_the_spectrogram_at_vit_pytorchs_settings_is_torchaudios():
    metadata, _, tensors = load_fixture('torchaudio_2.11.1_spectrogram')
    ours = Spectrogram(**metadata['spectrogram'])(tensors['audio'])
    torch.testing.assert_close(ours, tensors['spectrogram'], rtol=1e-4, atol=1e-5)


def test_the_mel_spectrogram_through_our_filterbank_is_torchaudios():
    metadata, _, tensors = load_fixture('torchaudio_2.11.1_spectrogram')
    settings = metadata['mel_spectrogram']
    fb = mel_filterbank(settings['n_fft'] // 2 + 1, settings['n_mels'], settings['sample_rate'])
    torch.testing.assert_close(fb, tensors['mel_filterbank'], rtol=1e-5, atol=1e-5)     # torchaudio's is float32 math
    spec = Spectrogram(n_fft=settings['n_fft'], win_length=settings['win_length'])(tensors['audio'])
    mel = torch.einsum('... f t, f m -> ... m t', spec, fb)
    torch.testing.assert_close(mel, tensors['mel_spectrogram'], rtol=1e-4, atol=1e-5)



# the AST paper's towers, against the official code (YuanGongND/ast @ 31088be, src/models/ast_models.py; counted by
# tests/fixtures/count_official_ast.py): model_size -> ((dim, depth, heads) of its DeiT, the ASTModel's parameters
# at the AudioSet recipe (527 classes, 128 x 1024 input, strides 10: 12 x 101 patches), of which the DeiT's two
# ImageNet heads that its forward never calls)
OFFICIAL_AST = {'tiny224': ((192, 12, 3), 6_109_663, 386_000), 'small224': ((384, 12, 6), 22_833_631, 770_000),
                'base224': ((768, 12, 12), 88_132_063, 1_538_000), 'base384': ((768, 12, 12), 88_132_063, 1_538_000)}


@pytest.mark.parametrize('variant', sorted(OFFICIAL_AST))
def test_named_ast_towers_take_the_official_widths(variant):
    (dim, depth, heads), _, _ = OFFICIAL_AST[variant]
    with torch.device('meta'):
        tower = audio_spectrogram_transformer(variant)
    attention, feedforward = tower.transformer.layers[0]
    assert (tower.dim, tower.depth, attention.heads, tower.patch_size) == (dim, depth, heads, (16, 16))
    assert attention.to_q.out_features == dim                               # heads of dim // heads = 64 channels
    assert feedforward.net[1].out_features == 4 * dim                       # mlp_ratio 4
    assert tower.mlp_head.out_features == 527 and tower.accept_spec and tower.accept_spec_time_first
    assert set(AST_CONFIGS) == set(OFFICIAL_AST)


@pytest.mark.parametrize('variant', sorted(OFFICIAL_AST))
def test_named_ast_towers_count_the_official_models_less_what_vit_pytorchs_tower_does_otherwise(variant):
    """The official ASTModel less its two unused ImageNet heads, then vit-pytorch's tower against it: no learned
    position table (1212 patches + 2 tokens rows) and no cls and distillation tokens (2 dim), 4 registers (4 dim)
    instead; per layer no query/key/value biases (3 dim), a sigmoid gate per head on the attention's output
    (Linear(dim, heads)); Dual PatchNorm's LayerNorms on the flattened 16 x 16 patch and on its projection. The
    patch projection (256 dim + dim: a Conv2d there, a Linear here), the final norms (the DeiT's and the head's
    LayerNorm there, the encoder's and `final_norm` here) and the 527-way Linear are alike."""
    (dim, depth, heads), total, unused_heads = OFFICIAL_AST[variant]
    with torch.device('meta'):
        tower = audio_spectrogram_transformer(variant)
    expected = (total - unused_heads - (12 * 101 + 2) * dim - 2 * dim + 4 * dim
                + depth * (dim * heads + heads - 3 * dim) + 2 * (16 * 16) + 2 * dim)
    assert count(tower) == expected


def test_an_unknown_ast_variant_is_refused_by_name():
    with pytest.raises(ValueError, match="variant must be one of .*'base384'.*got 'huge'"):
        audio_spectrogram_transformer('huge')


def test_a_named_ast_tower_reads_the_recipes_time_first_spectrograms():
    tower = audio_spectrogram_transformer('tiny224', depth=1)
    assert tower(torch.randn(2, 64, 128)).shape == (2, 527)                 # (b, frames, mel bins)


# the policy


def build(seed=0, **changes):
    torch.manual_seed(seed)
    model = VAAT(ViT(**TOWER), AST(**AUDIO_TOWER), **dict(POLICY, **changes)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.1)
    return model


def inputs(seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, 2, 3, 16, 16, generator=generator), torch.randn(2, 2, 300, generator=generator)


def predict(model, *args, **kwargs):
    with torch.no_grad():
        return model(*args, **kwargs)


def test_with_actions_the_forward_returns_the_mean_absolute_error_of_its_prediction():
    model, (images, audio) = build(), inputs()
    actions = torch.randn(2, 3, 2, generator=torch.Generator().manual_seed(2))
    pred = predict(model, images, audio)
    assert pred.shape == (2, 3, 2)
    expected = sum(abs(pred[b, k, d] - actions[b, k, d]) for b in range(2) for k in range(3) for d in range(2)) / 12
    torch.testing.assert_close(predict(model, images, audio, actions=actions), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('modality', ['images', 'audio'])
@pytest.mark.parametrize('view', [0, 1])
def test_every_image_and_audio_view_reaches_the_action_tokens(modality, view):
    model, (images, audio) = build(), inputs()
    changed = [images.clone(), audio.clone()]
    index = 0 if modality == 'images' else 1
    changed[index][:, view] += torch.randn(changed[index][:, view].shape)
    assert not torch.allclose(predict(model, images, audio), predict(model, *changed), atol=1e-4)


def test_the_policy_reads_only_the_ast_states_named_by_ast_layer_indices():
    model, (images, audio) = build(ast_layer_indices=(0, 0)), inputs()
    before = predict(model, images, audio)
    with torch.no_grad():
        for p in model.ast.transformer.parameters():
            p.add_(torch.randn(p.shape))
    torch.testing.assert_close(predict(model, images, audio), before, rtol=0, atol=0)


# without audio views (num_audio_views=None, audio (b, samples)), and with one (audio (b, 1, samples): the
# configuration benchmarks/wrapper_steps.py's vaat row times)
@pytest.mark.parametrize('fixture, views, audio_shape', [('vit_pytorch_1.26.14_vaat', None, None),
                                                         ('vit_pytorch_1.26.14_vaat_one_audio_view', 1, (2, 1, 300))])
def test_loads_vit_pytorchs_checkpoint_and_gives_its_prediction_and_loss(fixture, views, audio_shape):
    metadata, state_dict, tensors = load_fixture(fixture)
    config = dict(metadata['config'], **{key: tuple(metadata['config'][key])
                                         for key in ('ast_layer_indices', 'vit_layer_indices')})
    assert config.get('num_audio_views') == views
    if audio_shape is not None:
        assert tensors['audio'].shape == audio_shape
    torch.manual_seed(1)
    model = load_vit_pytorch(VAAT(ViT(**metadata['vit_config']), AST(**metadata['ast_config']), **config),
                             state_dict).eval()
    extra = dict(tasks=tensors['tasks'], advantages=tensors['advantages'], extra=tensors['extra'])
    torch.testing.assert_close(predict(model, tensors['input'], tensors['audio'], **extra), tensors['output'],
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(predict(model, tensors['input'], tensors['audio'], actions=tensors['actions'],
                                       **extra), tensors['loss'], rtol=1e-5, atol=1e-5)


def test_vit_pytorchs_checkpoint_with_audio_views_is_refused_naming_its_view_embedding():
    metadata, state_dict, _ = load_fixture('vit_pytorch_1.26.14_vaat_audio_views')
    config = dict(metadata['config'], **{key: tuple(metadata['config'][key])
                                         for key in ('ast_layer_indices', 'vit_layer_indices')})
    model = VAAT(ViT(**metadata['vit_config']), AST(**metadata['ast_config']), **config)
    with pytest.raises(CheckpointError, match='audio view embedding .* reaches batch element i'):
        load_vit_pytorch(model, state_dict)


@pytest.mark.slow
def test_vit_pytorchs_main_block_runs():
    vit = ViT(image_size=256, patch_size=32, num_classes=1000, dim=384, heads=8, depth=4, mlp_dim=384 * 4)
    ast = AST(dim=384, depth=4, heads=8, num_classes=1000, patch_size=16, mlp_dim=384 * 4)
    vaat = VAAT(vit, ast, dim=512, depth=9, heads=8, dim_head=64, mlp_dim=2048, dim_action=20, action_chunk_len=7,
                time_seq_len=4, num_image_views=2, num_audio_views=2, num_tasks=4, num_advantage_bins=2,
                add_self_attn=True, dim_extra_token=33, vit_layer_indices=(0, 0, 1, 1, 2, 2, 3, 3, 4),
                ast_layer_indices=(1, 1, 1, 2, 2, 2, 3, 3, 3))
    images, audio = torch.randn(2, 2, 3, 4, 256, 256), torch.randn(2, 2, 14_100 * 5)
    tasks, extra, advantages = torch.randint(0, 4, (2,)), torch.randn(2, 33), torch.randint(-1, 2, (2,))
    loss = vaat(images, audio, actions=torch.randn(2, 7, 20), advantages=advantages, tasks=tasks, extra=extra,
                freeze_vit=True)
    loss.backward()
    pred_actions, hiddens = vaat(images, audio, advantages=advantages, tasks=tasks, extra=extra, return_hiddens=True)
    assert pred_actions.shape == (2, 7, 20)


# clear errors


def test_audio_of_another_view_count_is_refused_by_name():
    images, audio = inputs()
    with pytest.raises(ValueError, match='has 3 views, expected num_audio_views=2'):
        build()(images, torch.randn(2, 3, 300))


def test_audio_too_short_for_one_patch_or_for_the_padding_is_refused():
    images, _ = inputs()
    with pytest.raises(ValueError, match='smaller than one patch'):
        build()(images, torch.randn(2, 2, 80))             # 65 x 7: fewer frames than the patch is wide
    with pytest.raises(ValueError, match='too short for the spectrogram'):
        build()(images, torch.randn(2, 2, 50))


def test_an_ast_depth_other_than_the_policys_needs_ast_layer_indices():
    with pytest.raises(ValueError, match='ast_layer_indices'):
        VAAT(ViT(**TOWER), AST(**dict(AUDIO_TOWER, depth=3)), **POLICY)
