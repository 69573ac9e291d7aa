"""torch.compile, gradient checkpointing and mixed precision on the core models.

Speed itself is measured by benchmarks/throughput.py, never here: these tests pin down
the behaviours the speed depends on (one graph, unchanged gradients, sane low precision).
"""

import pytest
import torch
import torch.nn.functional as F

from helpers import digits_batch, tiny_vit_kwargs
from vit_pytorch import SimpleViT, ViT
from vit_pytorch.vit import Attention


def make_vit(**overrides):
    return ViT(**tiny_vit_kwargs(**overrides))


def make_simple_vit(**overrides):
    return SimpleViT(**tiny_vit_kwargs(**overrides))


MODELS = {
    'vit_cls': lambda: make_vit(),
    'vit_mean': lambda: make_vit(pool='mean', patch_norm=False, qkv_bias=True, norm_eps=1e-6),
    'simple_vit': lambda: make_simple_vit(),
}


def images(batch=4):
    return torch.randn(batch, 3, *tiny_vit_kwargs()['image_size'])


def gradients(model, img, labels):
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(img), labels).backward()
    # a compiled model names its parameters '_orig_mod.<name>'
    return {name.removeprefix('_orig_mod.'): p.grad.clone() for name, p in model.named_parameters()
            if p.grad is not None}


# torch.compile


@pytest.mark.parametrize('name', list(MODELS))
def test_compiles_to_one_graph_forward_and_backward(name):
    torch._dynamo.reset()
    model = MODELS[name]()
    # fullgraph=True raises on any graph break; aot_eager also traces the backward
    compiled = torch.compile(model, fullgraph=True, backend='aot_eager')
    img, labels = images(), torch.tensor([0, 1, 2, 3])

    expected = gradients(model, img, labels)
    torch.testing.assert_close(compiled(img), model(img))
    actual = gradients(compiled, img, labels)
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], msg=key)


def test_compiled_inference_mode_matches_eager():
    torch._dynamo.reset()
    model = make_vit(patch_norm=False, qkv_bias=True).eval()
    compiled = torch.compile(model, fullgraph=True, backend='aot_eager')
    img = images()
    with torch.inference_mode():
        torch.testing.assert_close(compiled(img), model(img))


def test_compiles_to_one_graph_with_grad_checkpointing():
    torch._dynamo.reset()
    model = make_vit()
    model.set_grad_checkpointing(True)
    compiled = torch.compile(model, fullgraph=True, backend='aot_eager')
    img, labels = images(), torch.tensor([0, 1, 2, 3])
    expected = gradients(make_vit_like(model), img, labels)
    actual = gradients(compiled, img, labels)
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], msg=key)


def make_vit_like(model):
    """A copy of `model` with the same weights and checkpointing off."""
    clone = make_vit()
    clone.load_state_dict(model.state_dict())
    return clone


# gradient checkpointing


@pytest.mark.parametrize('name', ['vit_cls', 'vit_mean', 'simple_vit'])
def test_grad_checkpointing_leaves_gradients_unchanged(name):
    model = MODELS[name]()
    img, labels = images(), torch.tensor([0, 1, 2, 3])
    expected = gradients(model, img, labels)
    model.set_grad_checkpointing(True)
    actual = gradients(model, img, labels)
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-6, atol=1e-7, msg=key)


def test_grad_checkpointing_replays_dropout_exactly():
    # the recomputed forward must draw the same dropout masks as the first one
    model = make_vit(dropout=0.3)
    img, labels = images(), torch.tensor([0, 1, 2, 3])
    torch.manual_seed(1)
    expected = gradients(model, img, labels)
    model.set_grad_checkpointing(True)
    torch.manual_seed(1)
    actual = gradients(model, img, labels)
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-6, atol=1e-7, msg=key)


def count_attention_calls(model, fn):
    calls = []
    handles = [m.register_forward_hook(lambda *_: calls.append(1)) for m in model.modules() if isinstance(m, Attention)]
    fn()
    for handle in handles:
        handle.remove()
    return len(calls)


@pytest.mark.parametrize('name', ['vit_cls', 'simple_vit'])
def test_grad_checkpointing_recomputes_each_layer_in_backward(name):
    model = MODELS[name]()
    depth = len(model.transformer.layers)
    img, labels = images(), torch.tensor([0, 1, 2, 3])
    assert count_attention_calls(model, lambda: gradients(model, img, labels)) == depth
    model.set_grad_checkpointing(True)
    assert count_attention_calls(model, lambda: gradients(model, img, labels)) == 2 * depth
    # nothing to recompute without autograd
    with torch.no_grad():
        assert count_attention_calls(model, lambda: model(img)) == depth
    model.set_grad_checkpointing(False)
    assert count_attention_calls(model, lambda: gradients(model, img, labels)) == depth


# mixed precision

# bf16 keeps 8 significant bits (relative step 2**-8 = 0.4%). Stated tolerance: the logits
# stay within 2% of the fp32 logits' range plus 0.01 (measured here: about 0.5% of the range).
BF16_RTOL_OF_RANGE, BF16_ATOL = 0.02, 0.01


def digit_images(count=16):
    img, labels = digits_batch(count, size=16)
    return img.expand(-1, 3, -1, -1).contiguous(), labels


def digit_model(kind, **overrides):
    kwargs = dict(image_size=16, patch_size=4, num_classes=10, dim=64, depth=4, heads=4, dim_head=16, mlp_dim=128)
    kwargs.update(overrides)
    return ViT(**kwargs) if kind == 'vit' else SimpleViT(**kwargs)


@pytest.mark.parametrize('kind, fused', [('vit', True), ('vit', False), ('simple_vit', True)])
def test_autocast_bf16_logits_close_to_fp32(kind, fused):
    model = digit_model(kind).eval()
    for module in model.modules():
        if isinstance(module, Attention):
            module.fused = fused
    img, _ = digit_images()
    with torch.inference_mode():
        reference = model(img)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            low = model(img)
    assert low.dtype == torch.bfloat16
    assert torch.isfinite(low).all()
    scale = (reference.max() - reference.min()).item()
    error = (low.float() - reference).abs().max().item()
    assert error <= BF16_RTOL_OF_RANGE * scale + BF16_ATOL, (error, scale)
    # and bf16 is really in use: the result is not bit-identical to fp32
    assert error > 0


@pytest.mark.parametrize('kind', ['vit', 'simple_vit'])
def test_autocast_bf16_training_step_gives_finite_fp32_gradients(kind):
    model = digit_model(kind, dropout=0.1) if kind == 'vit' else digit_model(kind)
    img, labels = digit_images()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    reference = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = F.cross_entropy(model(img), labels)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad.dtype == torch.float32, name
        assert torch.isfinite(p.grad).all(), name
    optimizer.step()
    changed = [name for name, p in model.named_parameters() if p.numel() and not torch.equal(p, reference[name])]
    assert len(changed) == sum(1 for _, p in model.named_parameters() if p.numel())
