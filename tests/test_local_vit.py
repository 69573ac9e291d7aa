"""LocalViT: the patch tokens' feed-forward is 1x1 conv, depthwise 3x3, 1x1 conv on the token grid (against the
convolutions computed explicitly), so it mixes only 3x3 neighbourhoods; the cls token bypasses it; vit-pytorch's
checkpoints, which compute another function, are refused naming the difference."""

import pytest
import torch
import torch.nn.functional as F

from helpers import move_off_initialisation, reference_case, tiny_vit_kwargs
from vit_pytorch.local_vit import LocalViT
from vit_pytorch.pretrained import load_vit_pytorch


def model_of():
    torch.manual_seed(0)
    return move_off_initialisation(LocalViT(**tiny_vit_kwargs())).double().eval()


def test_the_patch_tokens_feed_forward_is_1x1_conv_depthwise_3x3_1x1_conv_on_the_token_grid():
    """On the 4x3 grid (rows of 3 tokens): LN per token, conv 1x1 (dim -> hidden), h-swish, depthwise 3x3 (zero
    padding 1), h-swish, conv 1x1 (hidden -> dim), each by F.conv2d with the weights as kernels."""
    ff = model_of().transformer.layers[1][1]
    tokens = torch.randn(2, 12, 32, dtype=torch.float64)
    hidden = ff.expand.out_features
    with torch.no_grad():
        normed = F.layer_norm(tokens, (32,), ff.norm.weight, ff.norm.bias)
        grid = normed.transpose(1, 2).reshape(2, 32, 4, 3)                      # token 3 i + j at row i, column j
        y = F.hardswish(F.conv2d(grid, ff.expand.weight[:, :, None, None], ff.expand.bias))
        y = F.hardswish(F.conv2d(y, ff.depthwise.weight, ff.depthwise.bias, padding=1, groups=hidden))
        y = F.conv2d(y, ff.reduce.weight[:, :, None, None], ff.reduce.bias)
        expected = y.reshape(2, 32, 12).transpose(1, 2)
        torch.testing.assert_close(ff(tokens, (4, 3)), expected, rtol=1e-12, atol=1e-12)


def test_the_feed_forward_of_a_token_reads_only_its_3x3_neighbourhood():
    ff = model_of().transformer.layers[0][1]
    tokens = torch.randn(1, 12, 32, dtype=torch.float64)
    moved = tokens.clone()
    moved[0, 3 * 3 + 2] += torch.randn(32, dtype=torch.float64)                # row 3, column 2
    with torch.no_grad():
        changed = (ff(moved, (4, 3)) - ff(tokens, (4, 3))).abs().amax(-1)[0].reshape(4, 3)
    assert (changed[2:, 1:] > 1e-3).all()                                      # the 3x3 around (3, 2), in the grid
    changed[2:, 1:] = 0
    assert changed.max() < 1e-12


def test_the_cls_token_bypasses_the_feed_forward():
    """After a layer the cls token is the attention's residual alone: x_cls + attention(x)_cls."""
    model = model_of()
    attn, ff = model.transformer.layers[0]
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    with torch.no_grad():
        out = model.transformer.layer(model.transformer.layers[0], x, grid=(4, 3))
        torch.testing.assert_close(out[:, 0], (attn(x) + x)[:, 0], rtol=0, atol=0)
        for parameter in ff.parameters():
            parameter.add_(1.)
        torch.testing.assert_close(model.transformer.layer(model.transformer.layers[0], x, grid=(4, 3))[:, 0],
                                   out[:, 0], rtol=0, atol=0)


def test_images_smaller_than_image_size_lay_their_tokens_on_their_own_grid():
    model = model_of()
    with torch.no_grad():
        tokens = model.forward_features(torch.randn(2, 3, 8, 16, dtype=torch.float64))
    assert tokens.shape == (2, 1 + 2 * 2, 32)


# vit-pytorch 1.26.14's module (tests/fixtures/make_norm_keel_local_fixtures.py)


def test_vit_pytorchs_checkpoint_is_refused_naming_its_width_axis_norm_and_extra_convolution():
    """Its fixture comes from the one kind of configuration where vit-pytorch's LocalViT runs: a grid as wide as dim
    (8x8 images, patches of 2, dim 4)."""
    config, state_dict, _, _ = reference_case('vit_pytorch_1.26.14_local_vit')
    with pytest.raises(ValueError, match=r"over the width axis .* second 1x1 convolution"):
        load_vit_pytorch(LocalViT(**config), state_dict)
