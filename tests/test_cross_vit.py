import os

import pytest
import torch
import torch.nn.functional as F


from vit_pytorch.cross_vit import CrossFusion, CrossViT, crossvit_small_240, crossvit_tiny_240
from vit_pytorch.pretrained import load_timm, read_checkpoint
from vit_pytorch.vit import ClassAttention


def tiny_cross_vit(**overrides):
    kwargs = dict(image_size=(16, 24), num_classes=5, sm_dim=16, lg_dim=32, sm_patch_size=4, sm_enc_depth=1,
                  sm_enc_heads=2, sm_enc_mlp_dim=32, sm_enc_dim_head=8, lg_patch_size=8, lg_enc_depth=2,
                  lg_enc_heads=2, lg_enc_mlp_dim=64, lg_enc_dim_head=16, cross_attn_depth=1, cross_attn_heads=2,
                  cross_attn_dim_head=None, depth=2, dropout=0., emb_dropout=0.)
    kwargs.update(overrides)
    return CrossViT(**kwargs)


# the features: a pair of token sequences


def test_features_are_both_branches_tokens_and_pre_logits_join_both_cls_tokens():
    model = tiny_cross_vit()
    sm_tokens, lg_tokens = model.forward_features(torch.randn(3, 3, 16, 24))
    assert sm_tokens.shape == (3, 1 + 4 * 6, 16) and lg_tokens.shape == (3, 1 + 2 * 3, 32)
    assert model.forward_head((sm_tokens, lg_tokens), pre_logits=True).shape == (3, 16 + 32)


# the paper's models (counts of the reference implementation, timm's crossvit_*_240)


@pytest.mark.parametrize('build, expected', [(crossvit_tiny_240, 7_014_800), (crossvit_small_240, 26_856_272)])
def test_named_configuration_parameter_counts(build, expected):
    with torch.device('meta'):
        model = build()
    assert sum(p.numel() for p in model.parameters()) == expected


def test_named_configuration_branches_see_20_and_14_patches_per_side():
    with torch.device('meta'):
        model = crossvit_tiny_240()
    assert model.sm_image_embedder.pos_embedding.shape == (1 + 20 * 20, 96)
    assert model.lg_image_embedder.pos_embedding.shape == (1 + 14 * 14, 192)


# what makes CrossViT different


def cross_layer():
    """The first cross-attention layer of the tiny model, small- and large-branch tokens, and its outputs."""
    cross = tiny_cross_vit().eval().multi_scale_encoder.layers[0][2]
    sm_tokens, lg_tokens = torch.randn(2, 25, 16), torch.randn(2, 7, 32)
    with torch.no_grad():
        return cross, sm_tokens, lg_tokens, cross(sm_tokens, lg_tokens)


def test_cross_attention_only_updates_cls_tokens():
    _, sm_tokens, lg_tokens, (sm_out, lg_out) = cross_layer()
    assert torch.equal(sm_out[:, 1:], sm_tokens[:, 1:]) and torch.equal(lg_out[:, 1:], lg_tokens[:, 1:])
    assert not torch.allclose(sm_out[:, 0], sm_tokens[:, 0]) and not torch.allclose(lg_out[:, 0], lg_tokens[:, 0])


def test_cls_token_reads_the_other_branch_only():
    cross, sm_tokens, lg_tokens, (sm_out, lg_out) = cross_layer()
    with torch.no_grad():
        changed_sm = sm_tokens.clone()
        changed_sm[:, 1:] += torch.randn(2, 24, 16)                     # small-branch patches only
        sm_out2, lg_out2 = cross(changed_sm, lg_tokens)
    assert torch.equal(sm_out[:, 0], sm_out2[:, 0])                    # the small cls token read the large patches
    assert not torch.allclose(lg_out[:, 0], lg_out2[:, 0])             # the large cls token read the small patches


def test_fusion_follows_the_papers_equations():
    fusion = CrossFusion(16, 32, depth=1, heads=2, dim_head=16).eval()
    cls_token, other_patches = torch.randn(2, 1, 16), torch.randn(2, 6, 32)
    with torch.no_grad():
        projected = fusion.project_in(cls_token)                        # f(x_cls)
        attn = fusion.layers[0]
        x = attn.norm(torch.cat((projected, other_patches), dim=1))
        q = attn.to_q(x[:, :1]).view(2, 1, 2, 16).transpose(1, 2)
        k, v = (t.view(2, 7, 2, 16).transpose(1, 2) for t in attn.to_kv(x).chunk(2, dim=-1))
        weights = (q @ k.transpose(-1, -2) / 4.0).softmax(dim=-1)       # dim_head ** 0.5 = 4
        updated = projected + attn.to_out((weights @ v).transpose(1, 2).reshape(2, 1, 32))   # eq. 7
        expected = fusion.project_out(updated)                          # eq. 8: g(y_cls) replaces x_cls
        assert torch.allclose(fusion(cls_token, other_patches), expected, atol=1e-5)


def test_large_branch_sees_the_image_resized():
    model = tiny_cross_vit(lg_image_size=8, lg_patch_size=4).eval()
    img = torch.randn(2, 3, 16, 24)
    resized = F.interpolate(img, size=(8, 8), mode='bicubic', align_corners=False)
    with torch.no_grad():
        tokens = model.lg_image_embedder(img)
        expected = model.lg_image_embedder(resized)
    assert tokens.shape == (2, 1 + 2 * 2, 32)
    assert torch.equal(tokens, expected)


def test_logits_are_the_mean_of_both_heads():
    model = tiny_cross_vit().eval()
    img = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        sm_tokens, lg_tokens = model.forward_features(img)
        expected = (model.sm_mlp_head(sm_tokens[:, 0]) + model.lg_mlp_head(lg_tokens[:, 0])) / 2
        assert torch.allclose(model(img), expected, atol=1e-6)


# the reference implementation: timm's CrossVit, tiny, with noisy weights
# (tests/fixtures/make_variant_timm_fixtures.py), loaded by vit_pytorch.pretrained.load_timm through the plan at
# the end of vit_pytorch/cross_vit.py

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures')


def test_logits_equal_timms_crossvit():
    reference = read_checkpoint(os.path.join(FIXTURES, 'timm_cross_vit_reference.safetensors'))
    model = CrossViT(image_size=48, num_classes=7, sm_dim=12, lg_dim=24, sm_patch_size=12, sm_enc_depth=1,
                     sm_enc_heads=3, sm_enc_mlp_dim=48, sm_enc_dim_head=4, lg_patch_size=16, lg_enc_depth=2,
                     lg_enc_heads=3, lg_enc_mlp_dim=96, lg_enc_dim_head=8, cross_attn_depth=1, cross_attn_heads=3,
                     cross_attn_dim_head=None, depth=2, dropout=0., emb_dropout=0., lg_image_size=32,
                     patch_norm=False, qkv_bias=True, norm_eps=1e-6).eval()
    load_timm(model, os.path.join(FIXTURES, 'timm_cross_vit.safetensors'))     # the public loader
    with torch.no_grad():
        torch.testing.assert_close(model(reference['input']), reference['logits'], atol=1e-5, rtol=1e-5)


# the cross-attention maps (fused == explicit and the maps' side effects: tests/test_recorder.py, every model)


def test_each_cls_token_attends_over_itself_and_the_other_branchs_patches():
    model = tiny_cross_vit().eval()
    maps = []
    for module in model.modules():
        if isinstance(module, ClassAttention):
            module.fused = False
            module.attention_probs.register_forward_hook(lambda m, i, o: maps.append(o.shape))
    with torch.no_grad():
        model(torch.randn(2, 3, 16, 24))
    assert maps == [(2, 2, 1, 1 + 6), (2, 2, 1, 1 + 24)] * 2           # sm cls over large patches, and back


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(sm_patch_size=5), ValueError, 'image_size'),
    (dict(lg_image_size=20), ValueError, 'lg_image_size'),
    (dict(cross_attn_heads=3), ValueError, 'cross_attn_heads'),
    (dict(depth=1.0), TypeError, 'depth'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny_cross_vit(**overrides)


def test_wrong_image_size_is_refused():
    with pytest.raises(ValueError, match='image_size'):
        tiny_cross_vit()(torch.randn(1, 3, 24, 24))
