import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import count, reference_case, tiny_vit_kwargs
from vit_pytorch.deepvit import DeepViT, ReAttention, deepvit, deepvit_16, deepvit_24, deepvit_32
from vit_pytorch.vit import Attention


def record_attention(model, img):
    maps = []
    hooks = [m.attention_probs.register_forward_hook(lambda _m, _i, out: maps.append(out))
             for m in model.modules() if hasattr(m, 'attention_probs')]
    try:
        model(img)
    finally:
        for hook in hooks:
            hook.remove()
    return maps


def test_every_layer_uses_re_attention():
    model = DeepViT(**tiny_vit_kwargs(depth=3))
    assert [type(attn) for attn, _ in model.transformer.layers] == [ReAttention] * 3


def test_identity_mixing_without_norm_is_plain_attention():
    attn = ReAttention(32, heads=4, dim_head=8).double().eval()
    with torch.no_grad():
        attn.reattn_weights.copy_(torch.eye(4))
    attn.reattn_norm = nn.Identity()
    plain = Attention(32, heads=4, dim_head=8).double().eval()
    plain.load_state_dict(attn.state_dict(), strict=False)
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    torch.testing.assert_close(attn(x), plain(x), atol=1e-12, rtol=0)


def test_re_attention_matches_the_paper_formula():
    # Norm(Theta^T softmax(q k^T / sqrt(d))) v, with Norm a LayerNorm across the heads
    attn = ReAttention(32, heads=4, dim_head=8).double().eval()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    q, k, v = attn.to_qkv(attn.norm(x)).chunk(3, dim=-1)
    q, k, v = (t.reshape(2, 5, 4, 8).transpose(1, 2) for t in (q, k, v))
    maps = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1)            # (b, h, n, n)
    mixed = torch.einsum('bhij,hg->bgij', maps, attn.reattn_weights)
    layer_norm = attn.reattn_norm[1]
    normed = F.layer_norm(mixed.permute(0, 2, 3, 1), (4,), layer_norm.weight, layer_norm.bias, layer_norm.eps)
    out = (normed.permute(0, 3, 1, 2) @ v).transpose(1, 2).reshape(2, 5, 32)
    torch.testing.assert_close(attn(x), attn.to_out(out), atol=1e-12, rtol=0)


def test_recorded_map_is_the_re_attention_map_normed_across_heads():
    model = DeepViT(**tiny_vit_kwargs(heads=4, dim_head=8)).eval()
    maps = record_attention(model, torch.randn(2, 3, 16, 24))
    assert len(maps) == 2
    for attention in maps:
        assert attention.shape == (2, 4, 13, 13)
        # the LayerNorm across heads starts with weight 1 and bias 0: zero mean, (nearly) unit variance
        torch.testing.assert_close(attention.mean(dim=1), torch.zeros(2, 13, 13), atol=1e-5, rtol=0)
        torch.testing.assert_close(attention.var(dim=1, unbiased=False), torch.ones(2, 13, 13), atol=2e-2, rtol=0)


def test_re_attention_is_always_explicit():
    attn = ReAttention(32, heads=2, dim_head=16)
    assert attn.fused is False
    assert len(record_attention(attn, torch.randn(1, 4, 32))) == 1


@pytest.mark.parametrize('override, error, message', [
    (dict(pool='max'), ValueError, r"pool must be 'cls'.*got 'max'"),
])
def test_invalid_configuration(override, error, message):
    with pytest.raises(error, match=message):
        DeepViT(**tiny_vit_kwargs(**override))


def test_invalid_input_names_the_expected_shape():
    model = DeepViT(**tiny_vit_kwargs())
    with pytest.raises(ValueError, match=r'3 channels'):
        model(torch.randn(1, 1, 16, 24))


# parity with vit-pytorch 1.26.14 (fixture written by tests/fixtures/make_vit_pytorch_variant_fixtures.py)


def test_vit_pytorch_deepvit_checkpoint_loads_and_gives_its_outputs():
    config, state, img, expected = reference_case('vit_pytorch_1.26.14_deepvit_cls')
    model = DeepViT(**config).eval()
    model.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, atol=1e-5, rtol=1e-5)


def test_vit_pytorch_mean_pool_checkpoint_is_refused():
    config, state, _, _ = reference_case('vit_pytorch_1.26.14_deepvit_cls')
    with pytest.raises(ValueError, match=r"pool='mean'.*only its pool='cls' checkpoints load"):
        DeepViT(**dict(config, pool='mean')).load_state_dict(state)


# the paper's models, counted on the meta device (nothing allocated)


def paper_formula_count(depth, dim=384, heads=12, mlp_dim=1152, patch=16, image=224, num_classes=1000):
    """DeepViT-`depth` from its definition: a qkv-biased pre-norm ViT plus (heads x heads) mixing and a
    LayerNorm over heads per block; the official 1x1 convolution's bias (heads per block) left out."""
    patch_embed = 3 * patch * patch * dim + dim
    tokens = (image // patch) ** 2 + 1
    attention = 2 * dim + (dim * 3 * dim + 3 * dim) + (dim * dim + dim)
    mlp = 2 * dim + (dim * mlp_dim + mlp_dim) + (mlp_dim * dim + dim)
    re_attention = heads * heads + 2 * heads
    head = 2 * dim + dim * num_classes + num_classes
    return patch_embed + dim + tokens * dim + depth * (attention + mlp + re_attention) + head


@pytest.mark.parametrize('build, depth', [(deepvit_16, 16), (deepvit_24, 24), (deepvit_32, 32)])
def test_named_configuration_counts_match_the_architecture(build, depth):
    with torch.device('meta'):
        model = build()
    assert model.pos_embedding.is_meta
    assert len(model.transformer.layers) == depth
    assert count(model) == paper_formula_count(depth)


@pytest.mark.parametrize('build, published_millions', [(deepvit_24, 36.3), (deepvit_32, 48.1)])
def test_named_configuration_counts_round_to_the_published_figures(build, published_millions):
    # official README, "Comparison with ViTs" table (#params of DeepViT-24 / DeepViT-32)
    with torch.device('meta'):
        model = build()
    assert round(count(model) / 1e5) == round(published_millions * 10)


def test_deepvit_16_is_24_4_million_where_the_paper_prints_24_5():
    # the same table prints 24.5M for DeepViT-16, but its own definition (official
    # deepvit_patch16_224_re_attn_16b, conv bias included: 24,426,664) rounds to 24.4M
    with torch.device('meta'):
        model = deepvit_16()
    assert round(count(model) / 1e5) == 244
    assert count(model) + 16 * 12 == 24_426_664


def test_named_configuration_overrides_and_validation():
    with torch.device('meta'):
        model = deepvit_24(num_classes=10, image_size=384)
    assert model.mlp_head.out_features == 10
    assert model.pos_embedding.shape == (1 + 24 * 24, 384)
    with pytest.raises(ValueError, match=r"variant must be one of \['16', '24', '32'\], got 'S'"):
        deepvit('S')
