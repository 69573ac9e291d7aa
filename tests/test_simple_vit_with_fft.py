"""SimpleViT with Fourier tokens (vit-pytorch's variant, no paper): what it adds to SimpleViT.

The registry-wide tests (tests/test_conformance.py) cover the face, gradients and export; here: the Fourier
tokens against the DFT written out as sums of complex exponentials, their global reach, the pooling,
vit-pytorch 1.26.14's checkpoints (fixture written by tests/fixtures/make_simple_vit_with_fft_fixtures.py).
"""

import math

import pytest
import torch

from helpers import reference_case
from vit_pytorch.pretrained import load_vit_pytorch
from vit_pytorch.simple_vit import posemb_sincos_2d
from vit_pytorch.simple_vit_with_fft import SimpleViT

CONFIG = dict(image_size=(16, 24), patch_size=(4, 8), freq_patch_size=(8, 4), num_classes=5, dim=16, depth=2,
              heads=2, dim_head=8, mlp_dim=32)
FREQ_GRID = (2, 6)                           # 16 / 8 x 24 / 4 Fourier tokens


def model():
    torch.manual_seed(0)
    return SimpleViT(**CONFIG).eval()


def images(seed=1):
    return torch.randn(2, 3, 16, 24, generator=torch.Generator().manual_seed(seed))


def explicit_dft(img):
    """X[b, c, u, v] = sum_{y, x} img[b, c, y, x] exp(-2 pi i (u y / h + v x / w)), in float64."""
    h, w = img.shape[-2:]
    rows = torch.exp(-2j * math.pi * torch.outer(torch.arange(h), torch.arange(h)).double() / h)     # (u, y)
    cols = torch.exp(-2j * math.pi * torch.outer(torch.arange(w), torch.arange(w)).double() / w)     # (v, x)
    return torch.einsum('uy, bcyx, vx -> bcuv', rows, img.double().to(torch.complex128), cols)


def explicit_fourier_patches(img, patch=(8, 4)):
    """Each Fourier token's input, vit-pytorch's order: for frequency patch (i, j), its values
    X[c, i * p1 + a, j * p2 + b] as (a, b, real / imaginary, c), flattened."""
    spectrum = explicit_dft(img)
    b, c, h, w = spectrum.shape
    tokens = []
    for i in range(h // patch[0]):
        for j in range(w // patch[1]):
            values = [part[:, channel, i * patch[0] + a, j * patch[1] + q]
                      for a in range(patch[0]) for q in range(patch[1])
                      for part in (spectrum.real, spectrum.imag) for channel in range(c)]
            tokens.append(torch.stack(values, dim=1))
    return torch.stack(tokens, dim=1)                        # (b, Fourier tokens, p1 p2 2 c)


def test_the_fourier_tokens_embed_each_channels_dft_in_frequency_patches():
    net, img = model(), images()
    _, norm_in, linear, norm_out = net.to_freq_embedding
    with torch.no_grad():
        expected = norm_out(linear(norm_in(explicit_fourier_patches(img).float()))) + \
            posemb_sincos_2d(*FREQ_GRID, 16)
        torch.testing.assert_close(net.fourier_tokens(img), expected, rtol=1e-4, atol=1e-4)


def test_the_transformer_reads_the_fourier_tokens_first_then_the_patch_tokens():
    net, img = model(), images()
    with torch.no_grad():
        x = net.embed(img)
        assert x.shape == (2, 12 + 12, 16) and net.num_prefix_tokens == 12
        torch.testing.assert_close(x[:, :12], net.fourier_tokens(img), rtol=0, atol=0)
        torch.testing.assert_close(x[:, 12:], net.to_patch_embedding(img) + net.pos_embedding, rtol=0, atol=0)


def test_one_pixel_changes_every_fourier_token_and_one_patch_token():
    """A Fourier token is global: the DFT of a one-pixel change is non-zero at every frequency."""
    net, img = model(), images()
    changed = img.clone()
    changed[:, :, 5, 10] += 3.0                                # patch (1, 1) of the 4x3 grid
    with torch.no_grad():
        moved = (net.embed(changed) - net.embed(img)).abs().amax(dim=-1)      # (b, tokens)
    assert (moved[:, :12] > 1e-3).all()
    assert (moved[:, 12:] > 0).sum(dim=1).tolist() == [1, 1]
    assert (moved[:, 12 + 1 * 3 + 1] > 0).all()


def test_the_pooling_reads_the_patch_tokens_only():
    net, img = model(), images()
    with torch.no_grad():
        tokens = net.forward_features(img)
        changed = tokens.clone()
        changed[:, :12] = 0.0
        torch.testing.assert_close(net.forward_head(changed), net(img), rtol=0, atol=0)
        torch.testing.assert_close(net.forward_head(tokens, pre_logits=True), tokens[:, 12:].mean(dim=1))


def test_images_of_another_size_are_refused_by_name():
    with pytest.raises(ValueError, match=r"img must be 16x24 .* the model's image_size .* got 8x24"):
        model()(torch.randn(1, 3, 8, 24))


def test_an_image_size_that_the_freq_patch_does_not_divide_is_refused_by_name():
    with pytest.raises(ValueError, match=r'image_size \(16, 24\) must be divisible by freq_patch_size \(5, 4\)'):
        SimpleViT(**dict(CONFIG, freq_patch_size=(5, 4)))


# vit-pytorch 1.26.14


def test_vit_pytorch_checkpoints_load_and_give_its_outputs():
    config, state, img, expected = reference_case('vit_pytorch_1.26.14_simple_vit_with_fft', 'image_size',
                                                  'freq_patch_size')
    net = load_vit_pytorch(SimpleViT(**config).eval(), state)
    with torch.no_grad():
        torch.testing.assert_close(net(img), expected, rtol=1e-5, atol=1e-5)


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                     # vit-pytorch's sizes: 2048 tokens of width 1024, a batch of 8
def test_vit_pytorchs_main_block_runs():
    vit = SimpleViT(num_classes=1000, image_size=256, patch_size=8, freq_patch_size=8, dim=1024, depth=1, heads=8,
                    mlp_dim=2048)
    images = torch.randn(8, 3, 256, 256)
    with torch.no_grad():
        logits = vit(images)
    assert logits.shape == (8, 1000)
