"""nViT (nGPT): hidden states on the unit sphere after every layer, the weights' vectors unit after `norm_weights_`
(which the trainer calls after each step), the update rule and the branches against the paper's formulas written
out, the learned factors stored as the paper stores them; vit-pytorch's checkpoints, converted."""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import load_fixture, move_off_initialisation, reference_case, tiny_vit_kwargs
from vit_pytorch.normalized_vit import NormLinear, nViT
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch


def model_of(dtype=torch.float64, **kwargs):
    torch.manual_seed(0)
    return move_off_initialisation(nViT(**tiny_vit_kwargs(depth=3, **kwargs))).to(dtype).eval()


def unit(t, dim=-1):
    return t / t.norm(dim=dim, keepdim=True)


def test_every_hidden_state_is_on_the_unit_sphere_after_the_embedding_and_after_every_layer():
    model = model_of(torch.float32)
    img = torch.randn(2, 3, 16, 24) * 3
    seen = []
    model.transformer.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        layers = model.forward_intermediates(img)
    for tokens in seen + layers:
        torch.testing.assert_close(tokens.norm(dim=-1), torch.ones(tokens.shape[:2]), rtol=0, atol=1e-5)
    assert len(layers) == 3


def test_norm_weights_puts_every_vector_of_the_embedding_space_back_on_the_unit_sphere():
    """Input-side matrices (q, k, v, the MLP's halves, positions, the classifier) have unit rows; output-side
    ones (the patch embedding, the attention's and the MLP's output projections) unit columns."""
    model = model_of()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.5).add_(0.3)                           # what an optimizer step may leave
    model.norm_weights_()
    rows = ['abs_pos_emb.weight', 'to_pred.weight', 'transformer.layers.1.0.block.to_qkv.weight',
            'transformer.layers.1.1.block.to_hidden_and_gate.weight']
    columns = ['to_patch_embedding.1.weight', 'transformer.layers.1.0.block.to_out.weight',
               'transformer.layers.1.1.block.to_out.weight']
    weights = dict(model.named_parameters())
    for name in rows:
        torch.testing.assert_close(weights[name].norm(dim=1), torch.ones(len(weights[name]), dtype=torch.float64),
                                   rtol=0, atol=1e-12)
    for name in columns:
        torch.testing.assert_close(weights[name].norm(dim=0), torch.ones(weights[name].shape[1], dtype=torch.float64),
                                   rtol=0, atol=1e-12)
    assert sum(isinstance(m, NormLinear) for m in model.modules()) == 2 + 3 * 4 + 1


def test_the_forward_uses_unit_weights_whatever_is_stored_so_norm_weights_keeps_the_function():
    model = model_of()
    img = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, NormLinear):
                module.weight.mul_(2.5)
        before = model(img)
        model.norm_weights_()
        torch.testing.assert_close(model(img), before, rtol=1e-12, atol=1e-12)


def test_the_trainer_puts_the_weights_back_on_the_sphere_after_each_step():
    from vit_pytorch.training.loop import train_epoch

    model = model_of(torch.float32).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    images, labels = torch.randn(4, 3, 16, 24), torch.tensor([0, 1, 2, 3])

    def step_loss(index, generator, rng, global_step):
        loss = F.cross_entropy(model(images[index]), labels[index])
        return loss + 100 * model.transformer.layers[0][0].block.to_qkv.weight.square().sum(), loss.item(), \
            torch.zeros(1, dtype=torch.float64)

    optimizer.param_groups[0]['lr'] = 0.1
    train_epoch(model, optimizer, step_loss, epoch=0, seed=0, images=4, batch_size=4, steps=1, peak=0.1,
                warmup_steps=0, total_steps=1, clip_grad=0)
    weight = model.transformer.layers[0][0].block.to_qkv.weight
    torch.testing.assert_close(weight.norm(dim=1), torch.ones(len(weight)), rtol=0, atol=1e-6)


def attention_by_the_formula(attention, h):
    """eq. 15-16: q = Norm(W_q h) s_qk, k = Norm(W_k h) s_qk per head, softmax(q k^T sqrt(d_k)) v, W_o."""
    heads, _, dim_head = attention.s_qk.param.shape
    dim = h.shape[-1]
    w_q, w_k, w_v = unit(attention.to_qkv.weight).chunk(3)
    s_qk = attention.s_qk.param * math.sqrt(dim)                   # stored at 1/sqrt(dim), used times sqrt(dim)
    split = lambda t: t.unflatten(-1, (heads, dim_head)).transpose(1, 2)   # (b, heads, n, dim_head)
    q, k, v = unit(split(h @ w_q.T)) * s_qk, unit(split(h @ w_k.T)) * s_qk, split(h @ w_v.T)
    out = torch.softmax(q @ k.transpose(-1, -2) * math.sqrt(dim_head), dim=-1) @ v
    return out.transpose(1, 2).flatten(2) @ unit(attention.to_out.weight, dim=0).T


def mlp_by_the_formula(mlp, h):
    """eq. 20-21: u = W_u h s_u, v = W_v h s_v sqrt(d), W_o (u * SiLU(v))."""
    w_u, w_v = unit(mlp.to_hidden_and_gate.weight).chunk(2)
    u = h @ w_u.T * mlp.s_u.param
    v = h @ w_v.T * mlp.s_v.param * math.sqrt(h.shape[-1])
    return (u * F.silu(v)) @ unit(mlp.to_out.weight, dim=0).T


def test_each_layer_is_the_papers_update_rule_with_its_branches_written_out():
    """h_A = Norm(h + alpha_A (Norm(attention(h)) - h)), then the same with the MLP; alpha = param * alpha_init /
    alpha_scale, alpha_init = 1 / depth, alpha_scale = 1 / sqrt(dim)."""
    model = model_of()
    dim, depth = 32, 3
    h = unit(torch.randn(2, 12, dim, dtype=torch.float64))
    for attention_step, mlp_step in model.transformer.layers:
        alpha_a = attention_step.alpha.param * (1 / depth) * math.sqrt(dim)
        alpha_m = mlp_step.alpha.param * (1 / depth) * math.sqrt(dim)
        with torch.no_grad():
            h_a = unit(h + alpha_a * (unit(attention_by_the_formula(attention_step.block, h)) - h))
            expected = unit(h_a + alpha_m * (unit(mlp_by_the_formula(mlp_step.block, h_a)) - h_a))
            torch.testing.assert_close(mlp_step(attention_step(h)), expected, rtol=1e-10, atol=1e-12)
        h = expected


def test_the_logits_are_the_head_rows_against_the_mean_token_times_s_z():
    model = model_of()
    tokens = unit(torch.randn(2, 12, 32, dtype=torch.float64))
    with torch.no_grad():
        expected = tokens.mean(1) @ unit(model.to_pred.weight).T * model.s_z.param * math.sqrt(32)
        torch.testing.assert_close(model.forward_head(tokens), expected, rtol=1e-12, atol=1e-12)


def test_the_learned_factors_start_where_the_paper_starts_them_stored_at_its_scales():
    """alpha: init 1/depth (or residual_lerp_scale_init), stored at 1/sqrt(dim); s_qk and s_z: init 1, stored at
    1/sqrt(dim); s_u and s_v: init 1, stored at 1 (section 2.6)."""
    dim = 32
    model = nViT(**tiny_vit_kwargs(depth=4))
    attention_step, mlp_step = model.transformer.layers[2]
    for scale, init, stored in [(attention_step.alpha, 1 / 4, dim ** -0.5), (mlp_step.alpha, 1 / 4, dim ** -0.5),
                                (attention_step.block.s_qk, 1., dim ** -0.5), (model.s_z, 1., dim ** -0.5),
                                (mlp_step.block.s_u, 1., 1.), (mlp_step.block.s_v, 1., 1.)]:
        torch.testing.assert_close(scale.param, torch.full_like(scale.param, stored))
        torch.testing.assert_close(scale(), torch.full_like(scale.param, init))
    other = nViT(**tiny_vit_kwargs(depth=4, residual_lerp_scale_init=0.05))
    torch.testing.assert_close(other.transformer.layers[0][1].alpha(), torch.full((dim,), 0.05))


def test_a_new_classifier_has_unit_rows_and_starts_at_zero_logits_through_s_z():
    model = model_of(torch.float32)
    model.reset_classifier(7)
    torch.testing.assert_close(model.to_pred.weight.norm(dim=1), torch.ones(7))
    torch.testing.assert_close(model.s_z(), torch.zeros(7))
    model(torch.randn(2, 3, 16, 24)).sum().backward()
    assert model.s_z.param.grad.abs().min() > 0                    # it learns from the first step
    model.reset_classifier(0)
    assert model(torch.randn(2, 3, 16, 24)).shape == (2, 32)


# vit-pytorch 1.26.14's module (tests/fixtures/make_norm_keel_local_fixtures.py)


def test_vit_pytorchs_checkpoint_loads_converted_and_gives_its_output():
    config, state_dict, img, expected = reference_case('vit_pytorch_1.26.14_normalized_vit', 'image_size')
    model = load_vit_pytorch(nViT(**config), state_dict).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-4, atol=1e-5)


def test_a_vit_pytorch_checkpoint_whose_query_and_key_scales_differ_in_sign_is_refused_naming_it():
    config, state_dict, _, _ = reference_case('vit_pytorch_1.26.14_normalized_vit', 'image_size')
    state_dict = dict(state_dict, **{'layers.1.0.k_scale': -state_dict['layers.1.0.k_scale']})
    with pytest.raises(ValueError, match=r"layers\.1\.0: q_scale \* k_scale is <= 0 .* one s_qk"):
        load_vit_pytorch(nViT(**config), state_dict)


def test_a_model_taking_the_absolute_step_refuses_vit_pytorchs_checkpoint_naming_the_option():
    config, state_dict, _, _ = reference_case('vit_pytorch_1.26.14_normalized_vit', 'image_size')
    with pytest.raises(CheckpointError, match=r'\|alpha\| \(alpha_abs=True.*alpha_abs=False'):
        load_vit_pytorch(nViT(**config, alpha_abs=True), state_dict)


# the official code (NVIDIA/ngpt @ ed19eb2, a language model; fixture written by
# tests/fixtures/make_ngpt_official_fixtures.py, run outside this repository, its attention kernel and rotary
# positions replaced as that script says)


def official_blocks(alpha_abs=True):
    """(our nViT holding the official GPT's blocks and head, the fixture's tensors). Its query, key and value rows
    are our to_qkv, its c_fc our to_hidden_and_gate (u, then the half that goes through SiLU); sqk (dim,) is s_qk
    per head; suv is (s_u, s_v), both times sqrt(dim) there: on u that constant factor is removed by the
    normalisation of the branch's output, so s_u is suv's first half as it is. Its factors are stored as ours
    (base_scale 1 / sqrt(dim), alpha's init 0.05 hard-coded there)."""
    metadata, state, tensors = load_fixture('ngpt_official')
    config = metadata['config']
    dim, heads, depth = config['n_embd'], config['n_head'], config['n_layer']
    assert config['base_scale'] == dim ** -0.5
    model = nViT(image_size=8, patch_size=4, num_classes=config['vocab_size'], dim=dim, depth=depth, heads=heads,
                 dim_head=dim // heads, mlp_dim=6 * dim, residual_lerp_scale_init=0.05,
                 alpha_abs=alpha_abs).double().eval()          # SwiGLU width int(6 * dim * 2 / 3) = 4 * dim
    ours = dict(model.state_dict())
    ours.update({'to_pred.weight': state['lm_head.weight'], 's_z.param': state['sz']})
    for i in range(depth):
        block, layer = f'transformer.h.{i}', f'transformer.layers.{i}'
        inner = state[f'{block}.suv'].shape[0] // 2
        ours.update({
            f'{layer}.0.block.to_qkv.weight': torch.cat([state[f'{block}.{x}.weight'] for x in ('query', 'key',
                                                                                                  'value')]),
            f'{layer}.0.block.s_qk.param': state[f'{block}.sqk'].reshape(heads, 1, dim // heads),
            f'{layer}.0.block.to_out.weight': state[f'{block}.att_c_proj.weight'],
            f'{layer}.0.alpha.param': state[f'{block}.attn_alpha'],
            f'{layer}.1.block.to_hidden_and_gate.weight': state[f'{block}.c_fc.weight'],
            f'{layer}.1.block.s_u.param': state[f'{block}.suv'][:inner],
            f'{layer}.1.block.s_v.param': state[f'{block}.suv'][inner:],
            f'{layer}.1.block.to_out.weight': state[f'{block}.mlp_c_proj.weight'],
            f'{layer}.1.alpha.param': state[f'{block}.mlp_alpha'],
        })
    model.load_state_dict({key: value.to(torch.float64) for key, value in ours.items()})
    return model, tensors


def test_the_official_codes_blocks_and_logits_are_ours_with_the_absolute_step():
    # float64: agreement to float64 rounding (measured 1.1e-16 on the unit hidden states, 2.2e-16 on logits of size
    # 0.7); the step by alpha as it is (the paper's, vit-pytorch's) moves the hidden states by 0.19, every other
    # channel's alpha being negative in the fixture. Leaving the branch's output unnormalised moves them by 3e-2
    model, tensors = official_blocks()
    with torch.no_grad():
        hidden = model.transformer(tensors['tokens'])
        logits = model.to_pred(hidden) * model.s_z()
    torch.testing.assert_close(hidden, tensors['hidden'], rtol=0, atol=1e-13)
    torch.testing.assert_close(logits, tensors['logits'], rtol=0, atol=1e-12)
    signed, _ = official_blocks(alpha_abs=False)
    with torch.no_grad():
        assert (signed.transformer(tensors['tokens']) - tensors['hidden']).abs().max() > 1e-2


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(residual_lerp_scale_init=0.), ValueError, 'residual_lerp_scale_init must be a positive finite float'),
    (dict(mlp_dim=1), ValueError, 'mlp_dim must be at least 2'),
    (dict(alpha_abs=1), TypeError, 'alpha_abs must be True or False'),
])
def test_bad_arguments_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        nViT(**tiny_vit_kwargs(**kwargs))


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                 # vit-pytorch's own sizes: seconds on 2 cores
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block: 256 pixels, patches of 16, width 1024, depth 6, 8 heads, MLP 2048 (one image here,
    it takes four)."""
    model = nViT(image_size=256, patch_size=16, num_classes=1000, dim=1024, depth=6, heads=8, mlp_dim=2048)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 256, 256)).shape == (1, 1000)
