import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn


from vit_pytorch.t2t import SoftSplit, T2TViT, TokenAttention, sinusoid_table, t2t_vit, t2t_vit_14


def tiny_t2t(**overrides):
    kwargs = dict(image_size=(32, 48), num_classes=5, dim=32, depth=2, heads=2, dim_head=16, mlp_dim=64,
                  t2t_layers=((7, 4), (3, 2)), token_dim=8)
    kwargs.update(overrides)
    return T2TViT(**kwargs)


# shapes (pool='cls': test_conformance's row t2t; num_classes=0: test_properties)


def test_mean_pooling_gives_one_row_of_logits_per_image():
    assert tiny_t2t(pool='mean')(torch.randn(3, 3, 32, 48)).shape == (3, 5)


def test_a_custom_backbone_replaces_the_transformer():
    backbone = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 2, 64, batch_first=True), num_layers=1)
    model = tiny_t2t(depth=None, heads=None, mlp_dim=None, transformer=backbone)
    assert model.transformer is backbone
    assert model(torch.randn(2, 3, 32, 48)).shape == (2, 5)


# the paper's models


def test_t2t_vit_14_has_21_5m_parameters():
    with torch.device('meta'):
        model = t2t_vit_14()
    assert model.to_patch_embedding.grids == [(56, 56), (28, 28), (14, 14)]
    assert round(sum(p.numel() for p in model.parameters()) / 1e5) == 215


@pytest.mark.parametrize('variant, paper_millions', [('14', 21.5), ('19', 39.2), ('24', 64.1)])
def test_counts_with_the_fixed_position_table_round_to_the_papers_figures(variant, paper_millions):
    # the official code stores the fixed sinusoid table as a frozen parameter, which the paper's counts include
    with torch.device('meta'):
        model = t2t_vit(variant)
    total = sum(p.numel() for p in model.parameters()) + model.pos_embedding.numel()
    assert round(total / 1e5) == round(paper_millions * 10)


# what makes T2T-ViT different


def test_soft_split_equals_unfold_semantics():
    img = torch.randn(2, 3, 9, 11)
    kernel_size, stride = 3, 2
    padding = stride // 2
    padded = F.pad(img, (padding,) * 4)
    windows = []
    for top in range(0, padded.shape[2] - kernel_size + 1, stride):
        for left in range(0, padded.shape[3] - kernel_size + 1, stride):
            windows.append(padded[:, :, top:top + kernel_size, left:left + kernel_size].reshape(2, -1))
    expected = torch.stack(windows, dim=1)                              # (b, n, c * k * k), channel-major
    assert torch.equal(SoftSplit(kernel_size, stride)(img), expected)
    assert expected.shape == (2, 5 * 6, 27)


def test_token_attention_keeps_a_residual_through_the_values_and_scales_by_the_input_width():
    attn = TokenAttention(27, 8).eval()
    x = torch.randn(2, 5, 27)
    with torch.no_grad():
        q, k, v = attn.to_qkv(attn.norm(x)).chunk(3, dim=-1)
        weights = (q @ k.transpose(-1, -2) / math.sqrt(27)).softmax(dim=-1)
        expected = v + attn.to_out(weights @ v)
        assert torch.allclose(attn(x), expected, atol=1e-5)
        attn.fused = False
        assert torch.allclose(attn(x), expected, atol=1e-5)


def test_tokens_are_laid_back_out_as_an_image_between_splits():
    module = tiny_t2t().eval().to_patch_embedding
    img = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        reference = module(img)                                         # (1, 4 * 6, dim)

        def perturb(layer, inputs, tokens):                             # the token at row 5, column 7 of 8 x 12
            tokens = tokens.clone()
            tokens[0, 5 * 12 + 7] += torch.randn(8)
            return tokens

        hook = module.transformers[0].register_forward_hook(perturb)
        out = module(img)
        hook.remove()
    changed = (out - reference).abs().sum(-1)[0].view(4, 6) > 0
    expected = torch.zeros(4, 6, dtype=torch.bool)
    expected[2:4, 3:5] = True        # the 3 x 3 windows (stride 2, padding 1) that cover row 5 and column 7
    assert torch.equal(changed, expected)


def test_positions_are_the_fixed_sinusoid_table():
    model = tiny_t2t()
    assert 'pos_embedding' not in dict(model.named_parameters())
    assert 'pos_embedding' not in model.state_dict()
    table = sinusoid_table(5, 6)
    for position in range(5):
        for i in range(6):
            angle = position / 10000 ** (2 * (i // 2) / 6)
            assert math.isclose(table[position, i].item(), math.sin(angle) if i % 2 == 0 else math.cos(angle),
                                abs_tol=1e-6)
    assert torch.equal(model.pos_embedding, sinusoid_table(1 + 24, 32))


# the attention maps (fused == explicit: test_recorder's side-effect test, for every registered model)


def test_one_token_attention_over_the_8x12_tokens_then_the_backbones_over_the_4x6_and_cls():
    model = tiny_t2t().eval()
    maps = []
    for module in model.modules():
        if hasattr(module, 'attention_probs'):
            module.fused = False
            module.attention_probs.register_forward_hook(lambda m, i, o: maps.append(o.shape))
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 48))
    assert maps == [(2, 1, 96, 96), (2, 2, 25, 25), (2, 2, 25, 25)]


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(depth=None), ValueError, 'depth'),
    (dict(pool='max'), ValueError, 'pool'),
    (dict(t2t_layers=()), ValueError, 't2t_layers'),
    (dict(t2t_layers=((7, 4, 1),)), ValueError, 't2t_layers'),
    (dict(t2t_layers=((7, 0),)), ValueError, 'stride'),
    (dict(image_size=2, t2t_layers=((7, 4),)), ValueError, 'too small'),
    (dict(transformer='encoder'), TypeError, 'transformer'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny_t2t(**overrides)


def test_wrong_image_size_is_refused():
    with pytest.raises(ValueError, match='image_size'):
        tiny_t2t()(torch.randn(1, 3, 32, 32))
