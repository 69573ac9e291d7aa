"""Gated attention (arXiv 2505.06708, G1): a sigmoid gate of the normed input on each head's attention output, and
the sparsity loss of the gate scores; vit-pytorch's module (a gate on the scores) refused."""

import pytest
import torch
import torch.nn.functional as F

from helpers import (check_trainer_adds_auxiliary_loss, load_fixture, move_off_initialisation, reference_case,
                     refused_training_error, tiny_vit_kwargs)
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.simple_vit_with_sparse_gating import GatedAttention, SimpleViTWithSparseGating


def tiny(**overrides):
    torch.manual_seed(0)
    return move_off_initialisation(SimpleViTWithSparseGating(**tiny_vit_kwargs(num_register_tokens=2, **overrides)))


def explicit_gated_attention(attn, x):
    """Y' = (softmax(q k^T / sqrt(d)) v) * sigmoid(LN(x) W_theta), per head, then the output projection."""
    normed = F.layer_norm(x, x.shape[-1:], attn.norm.weight, attn.norm.bias, attn.norm.eps)

    def heads(t):
        return t.unflatten(-1, (attn.heads, -1)).transpose(1, 2)              # (b, h, n, d)
    q, k, v = (heads(t) for t in (normed @ attn.to_qkv.weight.T).chunk(3, dim=-1))
    attended = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v
    gate = torch.sigmoid(heads(normed @ attn.to_gate.weight.T))
    return (attended * gate).transpose(1, 2).flatten(2) @ attn.to_out.weight.T


def gate_scores(model, img):
    """Every layer's gate scores (b, n, heads * dim_head), from the gate projections' outputs, and the model's
    (logits, loss)."""
    seen = []
    hooks = [layer[0].to_gate.register_forward_hook(lambda module, args, output: seen.append(output.sigmoid()))
             for layer in model.transformer.layers]
    try:
        returned = model(img, return_loss=True)
    finally:
        for hook in hooks:
            hook.remove()
    return seen, returned


def test_the_gate_is_a_sigmoid_of_the_normed_input_on_each_heads_attention_output_before_the_projection():
    attn = tiny().double().eval().transformer.layers[0][0]
    x = torch.randn(2, 14, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), explicit_gated_attention(attn, x), rtol=1e-10, atol=1e-10)


def test_the_gate_is_query_dependent_a_token_changes_only_its_own_gate():
    """The gate reads the query's own token: changing token 3 changes the gate at token 3 and nowhere else."""
    attn = tiny().double().eval().transformer.layers[0][0]
    x = torch.randn(2, 14, 32, dtype=torch.float64)
    changed = x.clone()
    changed[:, 3] += torch.randn(2, 32, dtype=torch.float64)   # not a shift, which the norm removes
    with torch.no_grad():
        before, after = attn(x, return_gate=True)[1], attn(changed, return_gate=True)[1]                # (b, h, n, d)
    moved = (after - before).abs().amax(dim=(0, 1, 3))
    assert moved[3] > 1e-3 and moved[torch.arange(14) != 3].max() == 0


@pytest.mark.parametrize('loss_type, threshold', [('l1', 0.05), ('thresholded_l1', 0.05), ('thresholded_l1', 0.5)])
def test_the_sparsity_loss_is_its_formula_of_each_images_mean_gate_score(loss_type, threshold):
    model = tiny(sparsity_loss_type=loss_type, sparsity_threshold=threshold).double().eval()
    img = torch.randn(3, 3, 16, 24, dtype=torch.float64)
    with torch.no_grad():
        gates, (_, loss) = gate_scores(model, img)
    p = torch.stack([gate.mean(dim=(1, 2)) for gate in gates]).mean(dim=0)      # (b,)
    expected = p.mean() if loss_type == 'l1' else (p - threshold).relu().mean()
    assert loss.ndim == 0
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)


def test_a_threshold_above_every_images_mean_gate_gives_a_zero_loss():
    model = tiny(sparsity_threshold=1.0).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 16, 24), return_loss=True)[1] == 0


def test_return_loss_adds_the_loss_and_leaves_the_logits_alone():
    model = tiny().eval()
    img = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        logits, _ = model(img, return_loss=True)
        torch.testing.assert_close(logits, model(img), rtol=0, atol=0)


def test_the_sparsity_loss_alone_trains_every_gate_projection():
    model = tiny()
    model(torch.randn(2, 3, 16, 24), return_loss=True)[1].backward()
    for layer in model.transformer.layers:
        assert layer[0].to_gate.weight.grad.abs().sum() > 0


# the official code (qiuzh20/gated_attention @ 49645df, Qwen3 attention with the elementwise G1 gate; fixture written
# by tests/fixtures/make_llm_attention_official_fixtures.py gated_attention, run outside this repository)


def official_attention():
    """(our GatedAttention holding the official attention's weights, the fixture's tensors). Its q_proj gives, head
    by head, the head's query rows and then its gate rows: the former are our to_qkv's query rows, the latter our
    to_gate; k_proj, v_proj and o_proj are the rest of to_qkv and to_out."""
    metadata, state, tensors = load_fixture('gated_attention_official')
    config = metadata['config']
    dim, heads, dim_head = config['hidden_size'], config['num_attention_heads'], config['head_dim']
    attn = GatedAttention(dim, heads, dim_head).double().eval()
    query, gate = state['q_proj.weight'].unflatten(0, (heads, 2, dim_head)).unbind(1)
    with torch.no_grad():
        attn.to_qkv.weight.copy_(torch.cat((query.flatten(0, 1), state['k_proj.weight'], state['v_proj.weight'])))
        attn.to_gate.weight.copy_(gate.flatten(0, 1))
        attn.to_out.weight.copy_(state['o_proj.weight'])
    return attn, tensors


def test_the_official_codes_gated_attention_is_ours():
    # float64 from float32 weights; the official softmax runs in float32 whatever the input: measured 1.9e-8 on
    # outputs of size 0.3 (atol 1e-6). Gating after the output projection instead moves them by 0.16, one gate for
    # both heads (the first head's rows) by 0.15, the gate of the input before the norm by 4.1e-2
    attn, tensors = official_attention()
    with torch.no_grad():
        torch.testing.assert_close(attn(tensors['tokens']), tensors['output'], rtol=0, atol=1e-6)


# vit-pytorch 1.26.14's module (tests/fixtures/make_gate_jet_looped_fixtures.py)


def test_vit_pytorchs_checkpoint_is_refused_naming_its_gate_on_the_scores():
    config, state_dict, _, _ = reference_case('vit_pytorch_1.26.14_simple_vit_with_sparse_gating', 'image_size')
    with pytest.raises(CheckpointError, match=r'gates the attention weights .*q_mask . k_mask.*G1'):
        load_vit_pytorch(SimpleViTWithSparseGating(**config), state_dict)


# clear errors


@pytest.mark.parametrize('overrides, error, name', [
    (dict(sparsity_loss_type='l2'), ValueError, 'sparsity_loss_type'),
])
def test_a_bad_argument_is_refused_by_name(overrides, error, name):
    with pytest.raises(error, match=name):
        SimpleViTWithSparseGating(**tiny_vit_kwargs(**overrides))


# the training command: cross-entropy + --sparsity-aux-loss-weight x the sparsity loss


@pytest.mark.parametrize('weight', [5, 0])
def test_the_trainers_loss_is_the_cross_entropy_plus_the_weighted_sparsity_loss(weight, monkeypatch, tmp_path):
    check_trainer_adds_auxiliary_loss(monkeypatch, tmp_path, 'simple_vit_with_sparse_gating',
                                      '--sparsity-aux-loss-weight', weight, lambda model, images: model(images, return_loss=True))


@pytest.mark.parametrize('options, message', [
    (['--model', 'vit', '--sparsity-aux-loss-weight', 1], '--model vit has none'),
    (['--model', 'vit_with_decorr', '--sparsity-aux-loss-weight', 1], '--model vit_with_decorr has none'),
    (['--model', 'simple_vit_with_sparse_gating', '--sparsity-aux-loss-weight', -1],
     'must be a finite number >= 0, got -1'),
])
def test_a_sparsity_weight_for_another_model_or_below_zero_is_refused(options, message, tmp_path, capsys):
    assert message in refused_training_error(tmp_path, capsys, *options)


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block: 256 pixels, patches of 32, width 1024, depth 6, both loss types, a backward pass."""
    img = torch.randn(2, 3, 256, 256)
    for loss_type in ('thresholded_l1', 'l1'):
        model = SimpleViTWithSparseGating(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6,
                                          heads=16, mlp_dim=2048, num_register_tokens=4, dim_mask=4,
                                          sparsity_loss_type=loss_type, sparsity_threshold=0.05)
        assert model(img).shape == (2, 1000)
        logits, loss = model(img, return_loss=True)
        assert logits.shape == (2, 1000) and loss.ndim == 0
        loss.backward()
