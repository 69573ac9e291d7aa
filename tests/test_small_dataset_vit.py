import pytest
import torch
import torch.nn.functional as F

from helpers import count, tiny_vit_kwargs
from vit_pytorch.vit import Attention
from vit_pytorch.vit_for_small_dataset import LSA, SPT, ViT, sl_vit, sl_vit_cifar, sl_vit_tiny_imagenet


def record_attention(model, img):
    from vit_pytorch.recorder import Recorder

    with Recorder(model) as recorder:
        model(img)
    return recorder.maps


# shifted patch tokenization


def test_shifted_copies_move_the_image_half_a_patch_diagonally():
    spt = SPT(dim=8, patch_size=(4, 6), channels=1)          # shifts of 2 rows and 3 columns
    img = torch.randn(1, 1, 8, 12)
    copies = spt.shifted_copies(img)
    assert copies.shape == (1, 5, 8, 12)
    assert torch.equal(copies[:, :1], img)
    shifts = [(-2, -3), (-2, 3), (2, -3), (2, 3)]             # (rows down, columns right)
    for channel, (dy, dx) in enumerate(shifts, start=1):
        for y in range(8):
            for x in range(12):
                sy, sx = y - dy, x - dx                        # the source pixel
                expected = img[0, 0, sy, sx] if 0 <= sy < 8 and 0 <= sx < 12 else 0.0
                assert copies[0, channel, y, x] == expected, (channel, y, x)


def test_spt_token_is_a_projection_of_the_normed_shifted_patch():
    spt = SPT(dim=16, patch_size=2, channels=3).eval()
    img = torch.randn(2, 3, 4, 6)
    copies = spt.shifted_copies(img)                           # (2, 15, 4, 6)
    patch = copies[:, :, 2:4, 4:6]                             # the patch in grid row 1, column 2
    flat = patch.permute(0, 2, 3, 1).reshape(2, -1)            # (p1 p2 c), as the tokenizer reads it
    _, norm, linear = spt.to_patch_tokens
    expected = linear(F.layer_norm(flat, flat.shape[-1:], norm.weight, norm.bias, norm.eps))
    torch.testing.assert_close(spt(img)[:, 1 * 3 + 2], expected)


# locality self-attention


def test_recorded_attention_has_zero_diagonal_and_rows_summing_to_one():
    model = ViT(**tiny_vit_kwargs()).eval()
    maps = record_attention(model, torch.randn(2, 3, 16, 24))
    assert len(maps) == 2
    for attention in maps:
        assert attention.shape == (2, 2, 13, 13)
        assert torch.equal(torch.diagonal(attention, dim1=-2, dim2=-1), torch.zeros(2, 2, 13))
        torch.testing.assert_close(attention.sum(dim=-1), torch.ones(2, 2, 13))


def test_lsa_matches_formula_with_learned_temperature():
    lsa = LSA(32, heads=4, dim_head=8).double().eval()
    with torch.no_grad():
        lsa.temperature.fill_(0.7)                             # a learned value, not the initial one
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    q, k, v = lsa.to_qkv(lsa.norm(x)).chunk(3, dim=-1)
    q, k, v = (t.reshape(2, 6, 4, 8).transpose(1, 2) for t in (q, k, v))
    dots = q @ k.transpose(-1, -2) * torch.exp(torch.tensor(0.7, dtype=torch.float64))
    dots = dots - torch.diag(torch.full((6,), float('inf'), dtype=torch.float64))
    out = (dots.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, 32)
    torch.testing.assert_close(lsa(x), lsa.to_out(out), atol=1e-12, rtol=0)


def test_temperature_starts_at_the_usual_scale_and_is_learned():
    lsa = LSA(32, heads=4, dim_head=8)
    torch.testing.assert_close(lsa.temperature.exp(), torch.tensor(8 ** -0.5))
    lsa(torch.randn(2, 5, 32)).sum().backward()
    assert lsa.temperature.grad is not None and lsa.temperature.grad != 0


def test_fused_and_explicit_lsa_agree():
    lsa = LSA(32, heads=2, dim_head=16).double().eval()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    fused = lsa(x)
    lsa.fused = False
    torch.testing.assert_close(lsa(x), fused, atol=1e-12, rtol=0)
    lone = torch.randn(2, 1, 32, dtype=torch.float64)                # a lone token attends to itself only
    explicit = lsa(lone)
    lsa.fused = True
    assert torch.isfinite(lsa(lone)).all()
    torch.testing.assert_close(lsa(lone), explicit, atol=1e-12, rtol=0)


def test_without_the_mask_lsa_is_plain_attention():
    # the diagonal mask is the only difference at the initial temperature: the off-diagonal
    # weights are the plain attention's weights renormalised without the diagonal
    lsa = LSA(32, heads=2, dim_head=16).double().eval()
    plain = Attention(32, heads=2, dim_head=16).double().eval()
    plain.load_state_dict(lsa.state_dict(), strict=False)
    lsa.fused = plain.fused = False
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    maps = {}
    lsa.attention_probs.register_forward_hook(lambda _m, _i, out: maps.setdefault('lsa', out))
    plain.attention_probs.register_forward_hook(lambda _m, _i, out: maps.setdefault('plain', out))
    lsa(x), plain(x)
    off_diagonal = maps['plain'] * (1 - torch.eye(5, dtype=torch.float64))
    torch.testing.assert_close(maps['lsa'], off_diagonal / off_diagonal.sum(-1, keepdim=True))


def test_a_single_token_is_still_defined():
    lsa = LSA(16, heads=2, dim_head=8)
    assert torch.isfinite(lsa(torch.randn(2, 1, 16))).all()


@pytest.mark.parametrize('override, error, message', [
    (dict(patch_size=(1, 8), image_size=(16, 24)), ValueError, r'patch_size must be at least 2.*\(1, 8\)'),
    (dict(pool='max'), ValueError, r"pool must be 'cls'"),
])
def test_invalid_configuration(override, error, message):
    with pytest.raises(error, match=message):
        ViT(**tiny_vit_kwargs(**override))


def test_invalid_input_is_refused():
    with pytest.raises(ValueError, match=r'img must be at most 16x24'):
        ViT(**tiny_vit_kwargs())(torch.randn(1, 3, 16, 32))


# the paper's models, counted on the meta device (nothing allocated)


def official_sl_vit_count(image, patch, num_classes, dim=192, depth=9, heads=12, dim_head=16, mlp_ratio=2):
    """SL-ViT as the official code builds it (SPT, LSA with one temperature per head, no qkv bias,
    pre-norm blocks, LayerNorm + Linear head), from its definition."""
    inner, mlp_dim = heads * dim_head, dim * mlp_ratio
    spt_dim = 5 * 3 * patch * patch
    spt = 2 * spt_dim + spt_dim * dim + dim
    tokens = (image // patch) ** 2 + 1
    attention = 2 * dim + dim * 3 * inner + (inner * dim + dim) + heads
    mlp = 2 * dim + (dim * mlp_dim + mlp_dim) + (mlp_dim * dim + dim)
    head = 2 * dim + dim * num_classes + num_classes
    return spt + dim + tokens * dim + depth * (attention + mlp) + head


@pytest.mark.parametrize('build, image, patch, num_classes', [
    (sl_vit_cifar, 32, 4, 100), (sl_vit_tiny_imagenet, 64, 8, 200)])
def test_named_configuration_counts_are_the_official_ones_but_the_per_head_temperatures(build, image, patch,
                                                                                        num_classes):
    with torch.device('meta'):
        model = build()
    assert model.pos_embedding.is_meta
    assert model.patch_size == (patch, patch) and model.mlp_head.out_features == num_classes
    # one learned temperature per layer here, one per head (12) in the official code
    assert count(model) + 9 * (12 - 1) == official_sl_vit_count(image, patch, num_classes)


def test_named_configuration_counts_in_millions():
    with torch.device('meta'):
        cifar, tiny = sl_vit_cifar(), sl_vit_tiny_imagenet()
    assert (round(count(cifar) / 1e4), round(count(tiny) / 1e4)) == (275, 291)


def test_patch_follows_the_image_size_as_in_the_official_code():
    with torch.device('meta'):
        assert sl_vit(image_size=32, num_classes=10).patch_size == (4, 4)
        assert sl_vit(image_size=64, num_classes=10).patch_size == (8, 8)
        assert sl_vit_cifar(num_classes=10, patch_size=2).patch_size == (2, 2)
