import pytest
import torch
import torch.nn.functional as F

from conftest import digits_batch, tiny_vit_kwargs
from vit_pytorch import vit
from vit_pytorch.parallel_vit import Parallel, ViT


def count(model):
    return sum(p.numel() for p in model.parameters())


def test_output_shapes():
    model = ViT(**tiny_vit_kwargs(num_parallel_branches=3))
    img = torch.randn(2, 3, 16, 24)
    assert model(img).shape == (2, 5)
    assert model.forward_features(img).shape == (2, 13, 32)
    assert ViT(**tiny_vit_kwargs(num_classes=0))(img).shape == (2, 13, 32)


@pytest.mark.parametrize('branches', [1, 2, 3])
def test_every_layer_has_the_requested_branches(branches):
    model = ViT(**tiny_vit_kwargs(num_parallel_branches=branches))
    for attns, ffs in model.transformer.layers:
        assert [type(fn) for fn in attns.fns] == [vit.Attention] * branches
        assert [type(fn) for fn in ffs.fns] == [vit.FeedForward] * branches


def test_every_parameter_gets_a_gradient():
    model = ViT(**tiny_vit_kwargs())
    model(torch.randn(2, 3, 16, 24)).sum().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_layer_adds_every_branch_to_the_same_input():
    model = ViT(**tiny_vit_kwargs(num_parallel_branches=3)).eval()
    attns, ffs = model.transformer.layers[0]
    x = torch.randn(2, 13, 32)
    y = x + sum(attn(x) for attn in attns.fns)
    expected = y + sum(ff(y) for ff in ffs.fns)
    torch.testing.assert_close(model.transformer.layer(attns, ffs, x), expected)


def test_branches_are_independent_modules():
    parallel = Parallel(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    assert parallel.fns[0].weight.data_ptr() != parallel.fns[1].weight.data_ptr()
    x = torch.randn(3, 4)
    torch.testing.assert_close(parallel(x), parallel.fns[0](x) + parallel.fns[1](x))


def test_one_branch_is_the_core_vit():
    model = ViT(**tiny_vit_kwargs(num_parallel_branches=1)).eval()
    core = vit.ViT(**tiny_vit_kwargs()).eval()
    state = {key.replace('.fns.0', ''): value for key, value in model.state_dict().items()}
    core.load_state_dict(state)
    img = torch.randn(2, 3, 16, 24)
    torch.testing.assert_close(model(img), core(img))


def test_two_branches_at_half_depth_have_the_parameters_of_the_sequential_model():
    # the paper's comparison: ViT with 2 x (depth / 2) parallel blocks vs depth sequential blocks
    with torch.device('meta'):
        parallel = ViT(image_size=224, patch_size=16, num_classes=1000, dim=384, depth=6, heads=6,
                       mlp_dim=1536, num_parallel_branches=2)
        sequential = vit.ViT(image_size=224, patch_size=16, num_classes=1000, dim=384, depth=12, heads=6,
                             mlp_dim=1536)
    assert count(parallel) == count(sequential)


def test_grad_checkpointing_gives_the_same_gradients():
    model = ViT(**tiny_vit_kwargs())
    img = torch.randn(2, 3, 16, 24)
    model(img).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing()
    model(img).sum().backward()
    for grad, param in zip(expected, model.parameters()):
        torch.testing.assert_close(param.grad, grad)


def test_works_with_torch_compile():
    model = ViT(**tiny_vit_kwargs()).eval()
    img = torch.randn(2, 3, 16, 24)
    compiled = torch.compile(model, backend='eager', fullgraph=True)
    torch.testing.assert_close(compiled(img), model(img))


def test_tiny_model_overfits_32_real_digits():
    images, labels = digits_batch(32)
    model = ViT(image_size=8, patch_size=2, num_classes=10, dim=64, depth=1, heads=4, dim_head=16,
                mlp_dim=128, channels=1, num_parallel_branches=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for step in range(300):
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 9 and (model(images).argmax(-1) == labels).all():
            break
    model.eval()
    with torch.no_grad():
        accuracy = (model(images).argmax(-1) == labels).float().mean().item()
    assert accuracy == 1.0, f'training accuracy {accuracy} after {step + 1} steps'


@pytest.mark.parametrize('override, error, message', [
    (dict(num_parallel_branches=0), ValueError, r'num_parallel_branches must be a positive int, got 0'),
    (dict(num_parallel_branches=1.5), TypeError, r'num_parallel_branches must be a positive int'),
    (dict(depth=0), ValueError, r'depth must be a positive int'),
    (dict(pool='max'), ValueError, r"pool must be 'cls'"),
])
def test_invalid_configuration(override, error, message):
    with pytest.raises(error, match=message):
        ViT(**tiny_vit_kwargs(**override))


def test_recorder_sees_every_branch():
    from vit_pytorch.recorder import Recorder

    model = ViT(**tiny_vit_kwargs(num_parallel_branches=3)).eval()
    img = torch.randn(2, 3, 16, 24)
    logits, attns = Recorder(model)(img)
    assert attns.shape == (2, 2 * 3, 2, 13, 13)               # layers x branches maps
    torch.testing.assert_close(logits, model(img), atol=1e-5, rtol=1e-5)
