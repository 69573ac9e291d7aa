import os

import pytest
import torch

from helpers import count
from vit_pytorch.cait import CaiT, TalkingHeadsAttention, cait_s24_224, cait_xxs24_224
from vit_pytorch.pretrained import load_timm, read_checkpoint
from vit_pytorch.vit import ClassAttention


def tiny_cait(**overrides):
    kwargs = dict(image_size=(16, 24), patch_size=(4, 8), num_classes=5, dim=32, depth=2, cls_depth=2,
                  heads=2, dim_head=16, mlp_dim=64)
    kwargs.update(overrides)
    return CaiT(**kwargs)


# the paper's models (counts of the reference implementation, timm's cait_*_224)


@pytest.mark.parametrize('build, expected', [(cait_xxs24_224, 11_956_264), (cait_s24_224, 46_916_200)])
def test_named_configuration_parameter_counts(build, expected):
    with torch.device('meta'):
        model = build()
    assert count(model) == expected


# what makes CaiT different


def test_layer_scale_starts_at_its_init_value_and_scales_the_residual():
    model = tiny_cait(layer_scale_init=0.25).eval()
    attn_branch = model.patch_transformer.layers[0][0]
    assert torch.equal(attn_branch.scale, torch.full((32,), 0.25))
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        assert torch.allclose(attn_branch(x), 0.25 * attn_branch.fn(x))
        attn_branch.scale.zero_()
        assert torch.equal(attn_branch(x), torch.zeros_like(x))


@pytest.mark.parametrize('depth, expected', [(12, 0.1), (18, 0.1), (24, 1e-5), (36, 1e-6)])
def test_layer_scale_default_follows_the_papers_depth_rule(depth, expected):
    model = tiny_cait(depth=depth)
    branches = [branch for layer in model.patch_transformer.layers for branch in layer]
    branches += [branch for layer in model.cls_transformer.layers for branch in layer]
    assert len(branches) == 2 * depth + 2 * 2
    assert all(torch.equal(branch.scale.data, torch.full((32,), expected)) for branch in branches)


def test_class_attention_leaves_patch_tokens_unchanged():
    model = tiny_cait().eval()
    img = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        patches = model.patch_transformer(model.to_patch_embedding(img) + model.pos_embedding)
        tokens = model.forward_features(img)
    assert torch.allclose(tokens[:, 1:], model.norm(patches), atol=1e-6)


def test_patch_tokens_do_not_see_the_cls_token():
    model = tiny_cait().eval()
    img = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        before = model.forward_features(img)
        model.cls_token.add_(torch.randn_like(model.cls_token))   # a constant shift vanishes in LayerNorm
        after = model.forward_features(img)
    assert torch.equal(before[:, 1:], after[:, 1:])
    assert not torch.allclose(before[:, 0], after[:, 0])


def test_talking_heads_equals_per_head_formula():
    attn = TalkingHeadsAttention(16, heads=3, dim_head=4).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        q, k, v = attn.to_qkv(attn.norm(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(2, 5, 3, 4).transpose(1, 2) for t in (q, k, v))
        logits = q @ k.transpose(-1, -2) / 2.0                        # dim_head ** 0.5 = 2
        w1, b1 = attn.mix_heads_pre_attn.weight, attn.mix_heads_pre_attn.bias
        w2, b2 = attn.mix_heads_post_attn.weight, attn.mix_heads_post_attn.bias
        mixed = torch.stack([sum(w1[g, h] * logits[:, h] for h in range(3)) + b1[g] for g in range(3)], dim=1)
        probs = mixed.softmax(dim=-1)
        weights = torch.stack([sum(w2[g, h] * probs[:, h] for h in range(3)) + b2[g] for g in range(3)], dim=1)
        expected = attn.to_out((weights @ v).transpose(1, 2).reshape(2, 5, 12))
        assert torch.allclose(attn(x), expected, atol=1e-5)


def test_head_mixing_is_the_formula_and_leaves_the_logits_contiguous_for_the_softmax():
    # issue 29: an einsum left the mixed (b, heads, n, n) logits permuted at batch 8, and the bias add and softmax
    # on them strided (cait infer@8 0.92); the gradients must reach the mixing weight and bias as the formula's do
    linear = torch.nn.Linear(3, 3)
    logits = torch.randn(4, 3, 7, 7, requires_grad=True)
    mixed = TalkingHeadsAttention.mix_heads(logits, linear)
    assert mixed.is_contiguous()
    expected = torch.stack([sum(linear.weight[g, h] * logits[:, h] for h in range(3)) + linear.bias[g]
                            for g in range(3)], dim=1)
    assert torch.allclose(mixed, expected, atol=1e-6)
    grads = torch.autograd.grad(mixed.square().sum(), (logits, linear.weight, linear.bias))
    expected_grads = torch.autograd.grad(expected.square().sum(), (logits, linear.weight, linear.bias))
    for got, want in zip(grads, expected_grads):
        assert torch.allclose(got, want, atol=1e-4)


def test_talking_heads_mixes_information_across_heads():
    attn = TalkingHeadsAttention(16, heads=2, dim_head=8).eval()
    x = torch.randn(1, 4, 16)
    with torch.no_grad():
        attn.mix_heads_pre_attn.weight.copy_(torch.eye(2))
        attn.mix_heads_post_attn.weight.copy_(torch.eye(2))
        attn.mix_heads_pre_attn.bias.zero_()
        attn.mix_heads_post_attn.bias.zero_()
        separate = attn(x)
        attn.mix_heads_post_attn.weight.copy_(torch.tensor([[0., 1.], [1., 0.]]))
        swapped = attn(x)
    assert not torch.allclose(separate, swapped)


def test_stochastic_depth_drops_branches_per_sample_only_in_training():
    model = tiny_cait(layer_dropout=0.5)
    branch = model.patch_transformer.layers[0][1]
    x = torch.randn(64, 3, 32)
    model.train()
    out = branch(x)
    dropped = (out.abs().sum(dim=(1, 2)) == 0)
    assert 0 < dropped.sum() < 64
    kept = ~dropped
    assert torch.allclose(out[kept], branch.fn(x[kept]) * branch.scale / 0.5, atol=1e-6)
    model.eval()
    assert torch.allclose(branch(x), branch.fn(x) * branch.scale)


# the reference implementation: timm's Cait, tiny, with noisy weights (tests/fixtures/make_variant_timm_fixtures.py),
# loaded by vit_pytorch.pretrained.load_timm through the plan at the end of vit_pytorch/cait.py

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures')


def test_logits_equal_timms_cait():
    reference = read_checkpoint(os.path.join(FIXTURES, 'timm_cait_reference.safetensors'))
    model = CaiT(image_size=32, patch_size=8, num_classes=7, dim=24, depth=2, cls_depth=2, heads=3, dim_head=8,
                 mlp_dim=96, patch_norm=False, qkv_bias=True, norm_eps=1e-6).eval()
    load_timm(model, os.path.join(FIXTURES, 'timm_cait.safetensors'))     # the public loader
    with torch.no_grad():
        torch.testing.assert_close(model(reference['input']), reference['logits'], atol=1e-5, rtol=1e-5)


# the attention maps (that they are distributions and that the explicit path equals the fused one:
# tests/test_recorder.py, for every registered model)


def test_patches_attend_over_the_patches_and_the_class_attention_is_one_query_over_every_token():
    model = tiny_cait().eval()
    maps = []
    for module in model.modules():
        if isinstance(module, (TalkingHeadsAttention, ClassAttention)):
            module.fused = False
            module.attention_probs.register_forward_hook(lambda m, i, o: maps.append(o))
    with torch.no_grad():
        model(torch.randn(2, 3, 16, 24))
    assert [tuple(m.shape) for m in maps] == [(2, 2, 12, 12)] * 2 + [(2, 2, 1, 13)] * 2


# errors


def test_wrong_image_size_is_refused():
    with pytest.raises(ValueError, match='image_size'):
        tiny_cait()(torch.randn(1, 3, 16, 16))


def test_unknown_variant_is_refused():
    from vit_pytorch.cait import cait
    with pytest.raises(ValueError, match='variant'):
        cait('tiny')
