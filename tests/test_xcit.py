import math
import os

import pytest
import torch


from vit_pytorch.pretrained import load_timm, read_checkpoint
from vit_pytorch.vit import ClassAttention
from vit_pytorch.xcit import (FourierPositionEncoding, LocalPatchInteraction, XCAttention, XCiT,
                              xcit_tiny_12_p16_224)


def tiny_xcit(**overrides):
    kwargs = dict(image_size=(16, 24), patch_size=4, num_classes=5, dim=32, depth=2, cls_depth=2,
                  heads=2, dim_head=16, mlp_dim=64)
    kwargs.update(overrides)
    return XCiT(**kwargs)


def attention_maps(model, img):
    """Every attention map of one explicit forward pass, in call order."""
    maps, hooks = [], []
    for module in model.modules():
        if isinstance(module, (XCAttention, ClassAttention)):
            module.fused = False
            hooks.append(module.attention_probs.register_forward_hook(lambda m, i, o: maps.append(o)))
    with torch.no_grad():
        out = model(img)
    for hook in hooks:
        hook.remove()
    return out, maps


# shapes (at image_size: test_conformance's row xcit; num_classes=0: test_properties)


def test_any_image_size_divisible_by_the_patch_size_works():
    model = tiny_xcit().eval()
    assert model(torch.randn(1, 3, 32, 8)).shape == (1, 5)


# the paper's model (count of the reference implementation, timm's xcit_tiny_12_p16_224)


def test_named_configuration_parameter_count():
    with torch.device('meta'):
        model = xcit_tiny_12_p16_224()
    assert sum(p.numel() for p in model.parameters()) == 6_716_272


def test_conv_stem_halves_the_image_log2_patch_size_times():
    model = xcit_tiny_12_p16_224()
    convs = [m for m in model.to_patch_embedding[0] if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.stride) for c in convs] == [
        (3, 24, (2, 2)), (24, 48, (2, 2)), (48, 96, (2, 2)), (96, 192, (2, 2))]


# what makes XCiT different


def test_xca_attention_map_is_dim_head_square_and_rows_sum_to_one():
    model = tiny_xcit().eval()
    for height, width in ((16, 24), (32, 32)):
        _, maps = attention_maps(model, torch.randn(2, 3, height, width))
        xca_maps = maps[:2]
        assert all(m.shape == (2, 2, 16, 16) for m in xca_maps)       # (b, heads, dim_head, dim_head)
        assert all(torch.allclose(m.sum(-1), torch.ones(())) for m in xca_maps)


def test_xca_equals_the_papers_formula():
    attn = XCAttention(12, heads=3, dim_head=4).eval()
    with torch.no_grad():
        attn.temperature.copy_(torch.tensor([0.5, 1.0, 2.0]).view(3, 1, 1))
    x = torch.randn(2, 7, 12)
    with torch.no_grad():
        q, k, v = attn.to_qkv(attn.norm(x)).chunk(3, dim=-1)
        heads = []
        for h in range(3):
            qh, kh, vh = (t[..., 4 * h:4 * h + 4] for t in (q, k, v))   # (b, n, d)
            qh, kh = qh / qh.norm(dim=1, keepdim=True), kh / kh.norm(dim=1, keepdim=True)
            weights = (kh.transpose(1, 2) @ qh * attn.temperature[h]).softmax(dim=1)   # (b, d_k, d_q)
            heads.append(vh @ weights)                                  # V softmax(K^T Q / tau), (b, n, d)
        expected = attn.to_out(torch.cat(heads, dim=-1))
        assert torch.allclose(attn(x), expected, atol=1e-5)
        attn.fused = False
        assert torch.allclose(attn(x), expected, atol=1e-5)


def test_the_temperatures_gradient_keeps_the_small_map_not_a_copy_of_q():
    # scaling the (d, d) map by the temperature, as XCiT's code does, saves that map for the temperature's
    # gradient; scaling q (b, heads, d, n) saved a second copy of q for the backward
    attn = XCAttention(12, heads=3, dim_head=4).train()
    out = attn(torch.randn(2, 7, 12))
    saved, stack, seen = [], [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.name() == 'MulBackward0':
            saved += [getattr(node, name) for name in ('_saved_self', '_saved_other')
                      if isinstance(getattr(node, name, None), torch.Tensor)]
        stack += [fn for fn, _ in node.next_functions]
    assert saved and all(tuple(t.shape) != (2, 3, 4, 7) for t in saved), [tuple(t.shape) for t in saved]


def test_local_patch_interaction_only_mixes_neighbours_within_two_convolutions():
    lpi = LocalPatchInteraction(8).eval()
    x = torch.randn(1, 7 * 7, 8, requires_grad=True)
    lpi(x, grid=(7, 7))[0, 3 * 7 + 3].sum().backward()                  # the token at row 3, column 3
    reached = (x.grad[0].abs().sum(-1) > 0).view(7, 7)
    expected = torch.zeros(7, 7, dtype=torch.bool)
    expected[1:6, 1:6] = True                                           # two 3x3 convs: a 5x5 window
    assert torch.equal(reached, expected)


def test_fourier_position_encoding_matches_formula():
    encoding = FourierPositionEncoding(dim=6, hidden_dim=4, temperature=100)
    with torch.no_grad():
        encoding.to_embedding.weight.copy_(torch.eye(6, 8))
        encoding.to_embedding.bias.zero_()
        table = encoding(2, 3)
    for row in range(2):
        for col in range(3):
            y, x = (row + 1) / 2 * 2 * math.pi, (col + 1) / 3 * 2 * math.pi
            features = []
            for value in (y, x):
                for i in range(4):
                    angle = value / 100 ** (2 * (i // 2) / 4)
                    features.append(math.sin(angle) if i % 2 == 0 else math.cos(angle))
            assert torch.allclose(table[row * 3 + col], torch.tensor(features[:6]), atol=1e-5)


def test_patch_tokens_do_not_see_the_cls_token():
    model = tiny_xcit().eval()
    img = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        before = model.forward_features(img)
        model.cls_token.add_(torch.randn_like(model.cls_token))   # a constant shift vanishes in LayerNorm
        after = model.forward_features(img)
    assert torch.allclose(before[:, 1:], after[:, 1:], atol=1e-6)
    assert not torch.allclose(before[:, 0], after[:, 0])


def test_layer_scale_starts_at_its_init_value():
    model = tiny_xcit(layer_scale_init=1e-5)
    scales = [branch.scale for layer in model.xcit_transformer.layers for branch in layer]
    scales += [p for block in model.cls_transformer for p in (block.attn_scale, block.ff_scale)]
    assert len(scales) == 3 * 2 + 2 * 2
    assert all(torch.equal(s.data, torch.full((32,), 1e-5)) for s in scales)


# the reference implementation: timm's Xcit, tiny, with noisy weights (tests/fixtures/make_variant_timm_fixtures.py),
# loaded by vit_pytorch.pretrained.load_timm through the plan at the end of vit_pytorch/xcit.py

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures')


def test_logits_equal_timms_xcit_at_another_image_size():
    reference = read_checkpoint(os.path.join(FIXTURES, 'timm_xcit_reference.safetensors'))
    model = XCiT(image_size=32, patch_size=8, num_classes=7, dim=32, depth=2, cls_depth=2, heads=4, dim_head=8,
                 mlp_dim=128, tokens_norm=True, qkv_bias=True, norm_eps=1e-6).eval()
    load_timm(model, os.path.join(FIXTURES, 'timm_xcit.safetensors'))     # the public loader
    assert reference['input'].shape[-2:] == (32, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(reference['input']), reference['logits'], atol=1e-5, rtol=1e-5)


# the attention maps (fused == explicit: test_recorder's side-effect test, for every registered model)


def test_the_maps_are_channel_maps_then_one_cls_query_over_every_token():
    _, maps = attention_maps(tiny_xcit().eval(), torch.randn(2, 3, 16, 24))
    assert [tuple(m.shape) for m in maps] == [(2, 2, 16, 16)] * 2 + [(2, 2, 1, 25)] * 2


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(patch_size=6), ValueError, 'patch_size'),
    (dict(patch_size=(4, 8)), ValueError, 'patch_size'),
    (dict(dim=30, patch_size=8, image_size=16), ValueError, 'dim'),
    (dict(local_patch_kernel_size=4), ValueError, 'local_patch_kernel_size'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny_xcit(**overrides)


def test_image_not_divisible_by_the_patch_size_is_refused():
    with pytest.raises(ValueError, match='divisible'):
        tiny_xcit()(torch.randn(1, 3, 18, 24))
