"""Register tokens, QK-normalisation and PatchDropout: each tested for what it changes in SimpleViT."""

import pytest
import torch

from helpers import tiny_vit_kwargs
from vit_pytorch import simple_vit
from vit_pytorch.simple_vit_with_patch_dropout import PatchDropout
from vit_pytorch.simple_vit_with_patch_dropout import SimpleViT as PatchDropoutViT
from vit_pytorch.simple_vit_with_qk_norm import Attention as QKNormAttention
from vit_pytorch.simple_vit_with_qk_norm import SimpleViT as QKNormViT
from vit_pytorch.simple_vit_with_register_tokens import SimpleViT as RegisterViT


def transformer_inputs(model, img):
    seen = []
    hook = model.transformer.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    try:
        model(img)
    finally:
        hook.remove()
    return seen[0]


# register tokens


def test_registers_are_returned_by_forward_features_and_dropped_before_pooling():
    model = RegisterViT(**tiny_vit_kwargs(num_register_tokens=3)).eval()
    img = torch.randn(2, 3, 16, 24)
    tokens = model.forward_features(img)
    assert tokens.shape == (2, 3 + 12, 32)
    torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), tokens[:, 3:].mean(dim=1))
    # whatever the registers hold at the output, the prediction does not read them
    scrambled = torch.cat((torch.randn(2, 3, 32), tokens[:, 3:]), dim=1)
    torch.testing.assert_close(model.forward_head(scrambled), model(img))


def test_registers_enter_attention_without_a_position():
    model = RegisterViT(**tiny_vit_kwargs(num_register_tokens=2)).eval()
    inputs = transformer_inputs(model, torch.randn(2, 3, 16, 24))
    assert torch.equal(inputs[:, :2], model.register_tokens.expand(2, -1, -1))


def test_registers_change_the_patch_tokens_through_attention():
    model = RegisterViT(**tiny_vit_kwargs()).eval()
    img = torch.randn(2, 3, 16, 24)
    before = model(img)
    with torch.no_grad():
        model.register_tokens.mul_(50)
    assert not torch.allclose(model(img), before)


def test_register_model_state_loads_into_simple_vit_apart_from_the_registers():
    model = RegisterViT(**tiny_vit_kwargs())
    state = model.state_dict()
    assert state.pop('register_tokens').shape == (4, 32)
    simple_vit.SimpleViT(**tiny_vit_kwargs()).load_state_dict(state)


# QK-normalisation


def test_qk_norm_layer_norms_queries_and_keys_per_head_before_the_dot_product():
    attn = QKNormAttention(32, heads=4, dim_head=8).double().eval()
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
        attn.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    q, k, v = attn.to_qkv(attn.norm(x)).chunk(3, dim=-1)
    q, k, v = (t.reshape(2, 6, 4, 8).transpose(1, 2) for t in (q, k, v))

    def layer_norm(t, weight):                     # over each head's 8 channels, no bias
        return (t - t.mean(-1, keepdim=True)) / torch.sqrt(t.var(-1, unbiased=False, keepdim=True) + 1e-5) * weight

    q, k = layer_norm(q, attn.q_norm.weight), layer_norm(k, attn.k_norm.weight)
    out = (torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1) @ v).transpose(1, 2).reshape(2, 6, 32)
    torch.testing.assert_close(attn(x), attn.to_out(out), atol=1e-10, rtol=0)
    assert attn.q_norm.bias is None and attn.k_norm.bias is None


def test_attention_logits_stay_bounded_when_queries_and_keys_grow():
    # the point of QK-norm: scaling the query/key projections up leaves the attention (nearly:
    # up to the LayerNorm's eps) unchanged, where plain attention saturates
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    def change_when_scaled(attn):
        before = attn(x)
        with torch.no_grad():
            attn.to_qkv.weight[:64].mul_(100.0)     # the q and k rows of the projection
        return (attn(x) - before).abs().max()

    assert change_when_scaled(QKNormAttention(32, heads=4, dim_head=8).double().eval()) < 1e-3
    assert change_when_scaled(simple_vit.Attention(32, heads=4, dim_head=8).double().eval()) > 1e-2


def test_qk_norm_explicit_path_equals_fused_path():
    attn = QKNormAttention(32, heads=4, dim_head=8).double().eval()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    fused = attn(x)
    attn.fused = False
    maps = []
    attn.attention_probs.register_forward_hook(lambda _m, _i, out: maps.append(out))
    torch.testing.assert_close(attn(x), fused, atol=1e-12, rtol=0)
    assert maps[0].shape == (2, 4, 6, 6)


def test_qk_norm_model_respects_num_classes():
    # vit-pytorch's module of the same name ends in a LayerNorm and ignores num_classes
    model = QKNormViT(**tiny_vit_kwargs(num_classes=7))
    assert model(torch.randn(1, 3, 16, 24)).shape == (1, 7)
    assert isinstance(model.linear_head, torch.nn.Linear) and model.linear_head.out_features == 7


def test_every_qk_norm_model_layer_uses_qk_norm():
    model = QKNormViT(**tiny_vit_kwargs(depth=3))
    assert [type(attn) for attn, _ in model.transformer.layers] == [QKNormAttention] * 3


# PatchDropout


def test_patch_dropout_keeps_a_random_subset_of_the_embedded_patches_in_training():
    model = PatchDropoutViT(**tiny_vit_kwargs(patch_dropout=0.5)).train()
    img = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        full = model.to_patch_embedding(img) + model.pos_embedding_for(model.grid_size)   # (2, 12, 32)
        kept = transformer_inputs(model, img)
    assert kept.shape == (2, 6, 32)
    for sample in range(2):
        distances = torch.cdist(kept[sample], full[sample])                             # (6, 12)
        assert torch.all(distances.min(dim=1).values < 1e-5)                            # rows of the full input
        assert len(set(distances.argmin(dim=1).tolist())) == 6                          # without repetition


def test_patch_dropout_picks_different_patches_per_sample_and_per_step():
    dropout = PatchDropout(0.5).train()
    x = torch.arange(10.)[None, :, None].expand(8, 10, 1)
    picks = {tuple(sorted(row.flatten().tolist())) for row in dropout(x)}
    assert len(picks) > 1


def test_patch_dropout_keeps_every_patch_at_eval_and_equals_simple_vit():
    model = PatchDropoutViT(**tiny_vit_kwargs(patch_dropout=0.75)).eval()
    img = torch.randn(2, 3, 16, 24)
    assert transformer_inputs(model, img).shape == (2, 12, 32)
    plain = simple_vit.SimpleViT(**tiny_vit_kwargs()).eval()
    plain.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(img), plain(img))


@pytest.mark.parametrize('prob, tokens, kept', [(0.5, 12, 6), (0.25, 12, 9), (0.99, 12, 1), (0.0, 12, 12)])
def test_patch_dropout_keep_count(prob, tokens, kept):
    assert PatchDropout(prob).train()(torch.randn(3, tokens, 4)).shape == (3, kept, 4)


# errors


@pytest.mark.parametrize('model_cls, override, error, message', [
    (RegisterViT, dict(num_register_tokens=0), ValueError, r'num_register_tokens must be a positive int, got 0'),
    (RegisterViT, dict(num_register_tokens=2.0), TypeError, r'num_register_tokens must be a positive int'),
    (PatchDropoutViT, dict(patch_dropout=1.0), ValueError, r'patch_dropout must be in \[0, 1\), got 1.0'),
    (QKNormViT, dict(dim_head=0), ValueError, r'dim_head must be a positive int'),
])
def test_invalid_configuration(model_cls, override, error, message):
    with pytest.raises(error, match=message):
        model_cls(**tiny_vit_kwargs(**override))


@pytest.mark.parametrize('model_cls, tokens, prefix', [(RegisterViT, 16, 4), (QKNormViT, 12, 0), (PatchDropoutViT, 12, 0)])
def test_recorder_sees_every_layer(model_cls, tokens, prefix):
    from vit_pytorch.recorder import Recorder

    model = model_cls(**tiny_vit_kwargs()).eval()
    img = torch.randn(2, 3, 16, 24)
    with Recorder(model) as recorder:
        model(img)
    # the recording's side effects: test_recorder's, for every registered model
    assert recorder.attentions.shape == (2, 2, 2, tokens, tokens)
    assert recorder.grid == (4, 3) and recorder.num_prefix_tokens == prefix
