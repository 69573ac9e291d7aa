"""Keel: each sub-layer is LN_post(alpha x + F(x)) with alpha the number of sub-layers; through the residual path
the gradient of a deep stack stays near 1 where plain post-LN loses it geometrically; vit-pytorch's weights."""

import pytest
import torch
import torch.nn.functional as F

from helpers import move_off_initialisation, reference_case, tiny_vit_kwargs
from vit_pytorch.pretrained import load_vit_pytorch
from vit_pytorch.vit_with_keel_post_ln import ViT


def model_of(depth=3, **kwargs):
    torch.manual_seed(0)
    return move_off_initialisation(ViT(**tiny_vit_kwargs(depth=depth, **kwargs))).double().eval()


def test_each_sub_layer_after_the_first_is_the_post_norm_of_alpha_times_the_stream_plus_the_branch():
    """x_1 = x_0 + F_0(x_0); x_{i+1} = LN(2 depth x_i + F_i(x_i)), LN without bias, F_i the pre-LN branch."""
    model = model_of(depth=3)
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    with torch.no_grad():
        _, outputs = model.transformer(x, return_layers=True)
        layers = model.transformer.layers
        assert len(layers) == 6 and len(layers[0]) == 1
        expected = x + layers[0][0](x)
        torch.testing.assert_close(outputs[0], expected, rtol=1e-12, atol=1e-12)
        for i in range(1, 6):
            branch, post_norm = layers[i]
            z = 6 * outputs[i - 1] + branch(outputs[i - 1])
            z = (z - z.mean(-1, keepdim=True)) / (z.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
            torch.testing.assert_close(outputs[i], z * post_norm.weight, rtol=1e-10, atol=1e-10)
            pre_norm = branch.norm if i % 2 == 0 else branch.net[0]
            assert post_norm.bias is None and pre_norm.bias is None


def test_keel_residual_scale_sets_alpha():
    model = ViT(**tiny_vit_kwargs(depth=3, keel_residual_scale=2.5))
    assert model.transformer.keel_residual_scale == 2.5
    assert ViT(**tiny_vit_kwargs(depth=5)).transformer.keel_residual_scale == 10


def residual_path_gain(keel_residual_scale, depth=16, dim=32, branch_gain=6.):
    """(|dL/dx_0| / |dL/dx_{L-1}| through the residual path alone, the branches' output std over the stream's) of a
    deep stack whose branches' output projections are scaled by `branch_gain` (branch outputs of the stream's
    scale, as in a trained network); each branch's input is detached, so only the residual path carries gradient."""
    torch.manual_seed(0)
    model = ViT(image_size=16, patch_size=4, num_classes=0, dim=dim, depth=depth, heads=2, dim_head=16, mlp_dim=64,
                keel_residual_scale=keel_residual_scale).double()
    stack = model.transformer
    with torch.no_grad():
        for branch, *_ in stack.layers:
            last = branch.to_out[0] if hasattr(branch, 'to_out') else branch.net[4]
            last.weight.mul_(branch_gain)
    for branch, *_ in stack.layers:
        branch.register_forward_pre_hook(lambda module, args: (args[0].detach(),))
    x = torch.randn(4, 17, dim, dtype=torch.float64, requires_grad=True)
    y, outputs = stack(x, return_layers=True)
    outputs[-2].retain_grad()
    (y * torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))).sum().backward()
    with torch.no_grad():
        ratio = stack.layers[5][0](outputs[4]).std() / outputs[4].std()
    return (x.grad.norm() / outputs[-2].grad.norm()).item(), ratio.item()


def test_through_a_deep_stack_the_residual_path_keeps_its_gradient_where_plain_post_ln_loses_it():
    """32 sub-layers whose branch output r is of the stream's scale (0.5 < r < 2). Each post-LN divides by the
    sum's std, sqrt(alpha^2 + r^2) for a branch uncorrelated with the stream, and passes alpha of the stream (on the
    directions it keeps: not the mean, not the sum's own direction): a gain of about alpha / sqrt(alpha^2 + r^2) per
    sub-layer. Keel (alpha = 32): (1 - r^2 / 2048)^31 ~ 0.97 at r = 1.5 (measured: 0.89); plain post-LN (alpha = 1):
    1 / sqrt(1 + r^2)^31 ~ 2e-5 at r = 1 (measured: 4e-8), below 0.02 for any r > 0.25."""
    keel, r_keel = residual_path_gain(None)
    plain, r_plain = residual_path_gain(1.)
    assert 0.5 < r_keel < 2 and 0.5 < r_plain < 2
    assert 0.5 < keel < 2
    assert plain < 0.02


# vit-pytorch 1.26.14's module (tests/fixtures/make_norm_keel_local_fixtures.py)


def test_vit_pytorchs_checkpoint_loads_and_gives_its_output():
    config, state_dict, img, expected = reference_case('vit_pytorch_1.26.14_vit_with_keel_post_ln', 'image_size')
    model = load_vit_pytorch(ViT(**config), state_dict).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('value, error', [(0, ValueError)])
def test_a_bad_residual_scale_is_refused_by_name(value, error):
    with pytest.raises(error, match='keel_residual_scale must be a positive finite float'):
        ViT(**tiny_vit_kwargs(keel_residual_scale=value))


def test_the_model_trains_a_step_with_finite_gradients_at_depth_one():
    model = ViT(**tiny_vit_kwargs(depth=1))
    F.cross_entropy(model(torch.randn(2, 3, 16, 24)), torch.tensor([0, 1])).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                 # vit-pytorch's own sizes: seconds on 2 cores
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block: 256 pixels, patches of 32, width 1024, depth 6, 16 heads, dropout 0.1."""
    model = ViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16, mlp_dim=2048,
                dropout=0.1, emb_dropout=0.1)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 256, 256)).shape == (1, 1000)
