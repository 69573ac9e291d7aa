import pytest
import torch
import torch.nn.functional as F

from helpers import count, digits_batch, fit_fixed_batch, tiny_vit_kwargs
from vit_pytorch import vit as core
from vit_pytorch.learnable_memory_vit import (Adapter, Attention, ViT, memory_adapter_b_16, memory_attention_mask,
                                              vit_b_16)


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


def make_adapter(memories=3, classes=4, **overrides):
    base = ViT(**tiny_vit_kwargs(**overrides)).eval()
    return base, Adapter(vit=base, num_memories_per_layer=memories, num_classes=classes)


def test_the_adapter_has_its_own_classes_and_cls_token():
    # the base ViT's shapes: test_conformance's row learnable_memory_vit
    _, adapter = make_adapter()
    img = torch.randn(2, 3, 16, 24)
    assert adapter(img).shape == (2, 4)
    assert adapter.forward_features(img).shape == (2, 1 + 13, 32)


def test_vit_loads_a_core_vit_checkpoint_and_matches_it():
    core_model = core.ViT(**tiny_vit_kwargs()).eval()
    model = ViT(**tiny_vit_kwargs()).eval()
    model.load_state_dict(core_model.state_dict())
    img = torch.randn(2, 3, 16, 24)
    torch.testing.assert_close(model(img), core_model(img))


def test_only_the_adapter_tensors_get_gradients():
    base, adapter = make_adapter()
    adapter.train()
    adapter(torch.randn(2, 3, 16, 24)).sum().backward()
    trainable = {name for name, p in adapter.named_parameters() if p.requires_grad}
    assert trainable == {'memory_cls_token', 'memories_per_layer', 'mlp_head.weight', 'mlp_head.bias'}
    for name, param in adapter.named_parameters():
        if name in trainable:
            assert param.grad is not None and param.grad.abs().sum() > 0, name
        else:
            assert param.grad is None, name
    # every layer's memories are read
    assert (adapter.memories_per_layer.grad.abs().sum(dim=(1, 2)) > 0).all()


@pytest.mark.parametrize('pool', ['cls', 'mean'])
def test_the_adapter_leaves_the_frozen_models_tokens_unchanged(pool):
    base, adapter = make_adapter(pool=pool)
    img = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        adapter.memories_per_layer.normal_(std=3.0)     # memories that would change any token reading them
    torch.testing.assert_close(adapter.forward_features(img)[:, 1:], base.forward_features(img), atol=1e-5, rtol=0)
    # so one pass serves both tasks: the old head on the old cls token gives the old prediction
    tokens = adapter.forward_features(img)
    torch.testing.assert_close(base.forward_head(tokens[:, 1:]), base(img), atol=1e-5, rtol=0)


def test_training_the_adapter_does_not_change_the_base_model():
    images, labels = digits_batch(8)
    base = ViT(image_size=8, patch_size=2, num_classes=10, dim=32, depth=2, heads=2, dim_head=16,
               mlp_dim=64, channels=1).eval()
    state = {key: value.clone() for key, value in base.state_dict().items()}
    before = base(images)
    adapter = Adapter(vit=base, num_memories_per_layer=2, num_classes=10)
    optimizer = torch.optim.AdamW([p for p in adapter.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        loss = F.cross_entropy(adapter(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for key, value in base.state_dict().items():
        assert torch.equal(value, state[key]), key
    torch.testing.assert_close(base(images), before)


def test_attention_mask_follows_the_paper():
    mask = memory_attention_mask(3, 2)
    expected = torch.tensor([
        # new cls, the model's 3 tokens, 2 memories
        [1, 1, 1, 1, 1, 1],     # the new class token attends to everything
        [0, 1, 1, 1, 0, 0],     # the model's tokens attend to each other only
        [0, 1, 1, 1, 0, 0],
        [0, 1, 1, 1, 0, 0],
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_recorded_attention_shows_who_reads_the_memories():
    base, adapter = make_adapter(memories=3)
    for module in adapter.modules():
        if isinstance(module, Attention):
            module.fused = False
    maps = record_attention(adapter, torch.randn(2, 3, 16, 24))
    assert len(maps) == 2
    for attention in maps:
        assert attention.shape == (2, 2, 14, 14 + 3)           # memories are keys only: no query rows
        assert (attention[:, :, 0, 14:] > 0).all()             # the new class token reads the memories
        assert torch.equal(attention[:, :, 1:, 14:], torch.zeros(2, 2, 13, 3))
        assert torch.equal(attention[:, :, 1:, 0], torch.zeros(2, 2, 13))
        torch.testing.assert_close(attention.sum(-1), torch.ones(2, 2, 14))


def test_fused_and_explicit_paths_agree_with_memories_and_mask():
    attn = Attention(32, heads=4, dim_head=8).double().eval()
    attn.layer_index = 1
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    memories = torch.randn(2, 3, 32, dtype=torch.float64)        # (depth, m, dim): this layer reads row 1
    mask = memory_attention_mask(4, 3)
    fused = attn(x, memories=memories, mask=mask)
    attn.fused = False
    torch.testing.assert_close(attn(x, memories=memories, mask=mask), fused, atol=1e-12, rtol=0)


def test_memories_are_keys_and_values_of_the_normed_layer_input():
    attn = Attention(32, heads=1, dim_head=16).double().eval()
    attn.layer_index = 0
    x = torch.randn(1, 4, 32, dtype=torch.float64)
    memories = torch.randn(2, 32, dtype=torch.float64)
    full = torch.cat((x, memories[None]), dim=1)
    q, k, v = attn.to_qkv(attn.norm(full)).chunk(3, dim=-1)
    weights = torch.softmax(q[:, :4] @ k.transpose(-1, -2) / 4.0, dim=-1)
    torch.testing.assert_close(attn(x, memories=memories[None]), attn.to_out(weights @ v), atol=1e-12, rtol=0)


@pytest.mark.slow
def test_works_with_torch_compile():
    _, adapter = make_adapter()
    img = torch.randn(2, 3, 16, 24)
    compiled = torch.compile(adapter, backend='eager', fullgraph=True)
    torch.testing.assert_close(compiled(img), adapter(img))


def test_grad_checkpointing_gives_the_same_gradients():
    base, adapter = make_adapter()
    img = torch.randn(2, 3, 16, 24)
    adapter(img).sum().backward()
    expected = adapter.memories_per_layer.grad.clone()
    adapter.zero_grad()
    base.set_grad_checkpointing()
    adapter(img).sum().backward()
    torch.testing.assert_close(adapter.memories_per_layer.grad, expected)


def test_adapter_alone_fits_32_real_digits_on_a_frozen_model():
    # the frozen model is random here, so the fit comes from the memories, new class token and head
    images, labels = digits_batch(32)
    base = ViT(image_size=8, patch_size=2, num_classes=10, dim=64, depth=2, heads=4, dim_head=16,
               mlp_dim=128, channels=1).eval()
    before = base(images)
    adapter = Adapter(vit=base, num_memories_per_layer=4, num_classes=10)
    trainable = [p for p in adapter.parameters() if p.requires_grad]
    accuracy, steps = fit_fixed_batch(adapter, images, labels, parameters=trainable, lr=1e-2)
    assert accuracy == 1.0, f'training accuracy {accuracy} after {steps} steps'
    with torch.no_grad():
        torch.testing.assert_close(base(images), before)


@pytest.mark.parametrize('kwargs, error, message', [
    (dict(num_memories_per_layer=0), ValueError, r'num_memories_per_layer must be a positive int, got 0'),
    (dict(num_classes=0), ValueError, r'num_classes must be a positive int, got 0'),
    (dict(num_classes=2.0), TypeError, r'num_classes must be a positive int'),
])
def test_invalid_adapter_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        Adapter(vit=ViT(**tiny_vit_kwargs()), **kwargs)


def test_adapter_needs_a_memory_vit():
    with pytest.raises(TypeError, match=r'vit must be a vit_pytorch.learnable_memory_vit.ViT.*got ViT'):
        Adapter(vit=core.ViT(**tiny_vit_kwargs()))
    with pytest.raises(TypeError, match=r'got Linear'):
        Adapter(vit=torch.nn.Linear(2, 2))


def test_recorder_sees_the_memory_columns():
    from vit_pytorch.recorder import Recorder

    _, adapter = make_adapter(memories=3)
    img = torch.randn(2, 3, 16, 24)
    logits, attns = Recorder(adapter)(img)
    assert attns.shape == (2, 2, 2, 14, 17)                   # (b, layers, heads, queries, keys + memories)
    torch.testing.assert_close(logits, adapter(img), atol=1e-5, rtol=1e-5)


# the paper's model, counted on the meta device (nothing allocated)


def vit_b_16_formula_count(num_classes=1000, dim=768, depth=12, mlp_dim=3072, patch=16, image=224):
    """The ViT paper's B/16 (qkv bias, pre-norm blocks, plain patch projection) from its definition."""
    patch_embed = 3 * patch * patch * dim + dim
    tokens = (image // patch) ** 2 + 1
    attention = 2 * dim + (dim * 3 * dim + 3 * dim) + (dim * dim + dim)
    mlp = 2 * dim + (dim * mlp_dim + mlp_dim) + (mlp_dim * dim + dim)
    head = 2 * dim + dim * num_classes + num_classes
    return patch_embed + dim + tokens * dim + depth * (attention + mlp) + head



def test_vit_b_16_count_matches_the_architecture_and_the_published_figure():
    with torch.device('meta'):
        model = vit_b_16()
    assert model.pos_embedding.is_meta
    assert count(model) == vit_b_16_formula_count()
    # ViT paper (arXiv 2010.11929) Table 1: ViT-Base 86M; the exact count is timm's vit_base_patch16_224's
    assert count(model) // 10 ** 6 == 86
    assert count(model) == 86_567_656


@pytest.mark.parametrize('memories, classes', [(1, 2), (5, 100), (20, 1000)])
def test_memory_adapter_trains_only_the_memories_the_new_cls_token_and_head(memories, classes):
    with torch.device('meta'):
        adapter = memory_adapter_b_16(num_memories_per_layer=memories, num_classes=classes)
    assert count(adapter, trainable_only=True) == 12 * memories * 768 + 768 + 768 * classes + classes
    assert count(adapter) - count(adapter, trainable_only=True) == vit_b_16_formula_count()


def test_memory_adapter_wraps_a_given_vit():
    with torch.device('meta'):
        backbone = vit_b_16(num_classes=10)
        adapter = memory_adapter_b_16(vit=backbone, num_memories_per_layer=2)
    assert adapter.vit is backbone
    assert adapter.memories_per_layer.shape == (12, 2, 768)
