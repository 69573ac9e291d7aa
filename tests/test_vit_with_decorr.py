"""The decorrelation loss: its formula, its zero, its gradient; the ViT that returns it; vit-pytorch's weights."""

import pytest
import torch

from helpers import check_trainer_adds_auxiliary_loss, load_fixture, refused_training_error, tiny_vit_kwargs
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.vit_with_decorr import DecorrelationLoss, ViT


def explicit_loss(tokens, *, mean_center=False):
    """For each (layer, sample): C = X^T X / n of its (n, d) tokens X (X centred first if asked); the mean of C_de^2
    over the d (d - 1) pairs d != e; summed over the layers, averaged over the samples. Written out entry by entry."""
    tokens = tokens.double()
    layers, batch, n, d = tokens.shape
    total = torch.zeros((), dtype=torch.float64)
    for b in range(batch):
        for layer in range(layers):
            x = tokens[layer, b]
            if mean_center:
                x = x - x.mean(dim=0)
            for i in range(d):
                for j in range(d):
                    if i != j:
                        total += (x[:, i] @ x[:, j] / n) ** 2 / (d * (d - 1))
    return total / batch


def correlated(*shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=generator)
    return x + x[..., :1] * torch.linspace(0.5, 1.5, shape[-1])       # every feature shares the first


def test_loss_is_the_mean_squared_off_diagonal_second_moment_summed_over_layers():
    tokens = correlated(3, 2, 10, 5)
    torch.testing.assert_close(DecorrelationLoss()(tokens).double(), explicit_loss(tokens), rtol=1e-5, atol=0)


def test_mean_centering_makes_it_the_off_diagonal_covariance():
    tokens = correlated(2, 2, 10, 5) + 3.
    torch.testing.assert_close(DecorrelationLoss(mean_center=True)(tokens).double(),
                               explicit_loss(tokens, mean_center=True), rtol=1e-5, atol=0)
    # the offset of 3 alone correlates the uncentred features: the two losses differ
    assert DecorrelationLoss()(tokens) > 2 * DecorrelationLoss(mean_center=True)(tokens)


def test_decorrelated_tokens_give_zero_loss():
    """Tokens whose features are orthogonal columns (X^T X diagonal) of any scales: nothing to decorrelate."""
    basis, _ = torch.linalg.qr(torch.randn(16, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    tokens = (basis * torch.tensor([1., 2., 3., 0.5, 4., 1.5], dtype=torch.float64))[None, None]
    assert DecorrelationLoss()(tokens).item() < 1e-28
    assert DecorrelationLoss()(correlated(1, 1, 16, 6)).item() > 1e-2


def test_a_gradient_step_on_the_loss_decorrelates_the_tokens():
    tokens = correlated(1, 1, 64, 4).requires_grad_()
    before = torch.corrcoef(tokens[0, 0].detach().T)
    DecorrelationLoss()(tokens).backward()
    with torch.no_grad():
        after = torch.corrcoef((tokens - 0.5 * tokens.grad)[0, 0].T)
    off_diagonal = ~torch.eye(4, dtype=torch.bool)
    assert (after[off_diagonal].abs() < before[off_diagonal].abs()).all()


def test_subspaces_decorrelate_the_tokens_projected_on_each_basis():
    loss = DecorrelationLoss(use_subspace=True, dim=8, dim_subspace=3, num_subspaces=2)
    for basis in loss.proj:
        torch.testing.assert_close(basis.T @ basis, torch.eye(3), rtol=0, atol=1e-6)   # orthonormal
    tokens = correlated(2, 2, 10, 8)
    expected = sum(explicit_loss(tokens @ basis) for basis in loss.proj)
    torch.testing.assert_close(loss(tokens).double(), expected, rtol=1e-5, atol=0)


def test_sampling_reads_a_subset_of_the_tokens_without_rescaling():
    """With every token the same, any subset has the full set's second moments: the sampled loss is the full one."""
    tokens = correlated(1, 2, 1, 5).expand(1, 2, 12, 5)
    torch.testing.assert_close(DecorrelationLoss(0.25)(tokens), DecorrelationLoss()(tokens), rtol=1e-6, atol=0)
    varied = correlated(1, 2, 12, 5)
    torch.manual_seed(0)
    assert not torch.allclose(DecorrelationLoss(0.25)(varied), DecorrelationLoss()(varied))


def test_too_few_sampled_tokens_are_refused_unless_soft():
    with pytest.raises(ValueError, match=r'sample_frac 0\.1 of 12 tokens keeps 1'):
        DecorrelationLoss(0.1)(torch.randn(2, 12, 4))
    assert DecorrelationLoss(0.1, soft_validate_num_sampled=True)(torch.randn(2, 12, 4)).item() == 0


# the ViT


def tiny(**overrides):
    return ViT(**tiny_vit_kwargs(**overrides))


def test_the_model_decorrelates_the_normed_input_of_every_block():
    model = tiny().train()
    seen = []
    hooks = [module.register_forward_hook(lambda _m, _a, out: seen.append(out))
             for layer in model.transformer.layers for module in (layer[0].norm, layer[1].net[0])]
    logits, loss = model(torch.randn(2, 3, 16, 24))
    for hook in hooks:
        hook.remove()
    assert logits.shape == (2, 5) and len(seen) == 4
    torch.testing.assert_close(loss.double(), explicit_loss(torch.stack(seen)), rtol=1e-5, atol=0)


def test_the_loss_is_returned_in_training_and_zero_in_eval_unless_asked():
    model = tiny()
    img = torch.randn(2, 3, 16, 24)
    assert model.train()(img)[1] > 0
    assert model.train()(img, return_decorr_aux_loss=False)[1] == 0
    assert model.eval()(img)[1] == 0
    assert model.eval()(img, return_decorr_aux_loss=True)[1] > 0
    assert tiny(decorr_sample_frac=0.).train()(img)[1] == 0
    torch.testing.assert_close(model.eval()(img)[0], model(img, return_decorr_aux_loss=True)[0], rtol=0, atol=0)


def test_training_on_the_loss_alone_lowers_it():
    torch.manual_seed(0)
    model = tiny(decorr_mean_center=True).train()
    img = torch.randn(8, 3, 16, 24)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(20):
        loss = model(img)[1]
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < 0.5 * losses[0]


# vit-pytorch 1.26.14's module (tests/fixtures/make_relpos_decorr_mp3_fixtures.py)


@pytest.mark.parametrize('variant', ['', '_subspace', '_across_depth'])
def test_vit_pytorchs_checkpoint_loads_and_gives_its_logits_and_loss(variant):
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_vit_with_decorr' + variant)
    model = load_vit_pytorch(ViT(**dict(metadata['config'], image_size=tuple(metadata['config']['image_size']))),
                             state_dict).train()
    with torch.no_grad():
        logits, loss = model(tensors['input'])
    torch.testing.assert_close(logits, tensors['output'], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss, tensors['decorr_aux_loss'], rtol=1e-4, atol=1e-7)


def test_a_vit_pytorch_checkpoint_into_mean_pooling_is_refused_naming_the_cls_token():
    metadata, state_dict, _ = load_fixture('vit_pytorch_1.26.14_vit_with_decorr')
    config = dict(metadata['config'], image_size=tuple(metadata['config']['image_size']), pool='mean')
    with pytest.raises(CheckpointError, match="keeps its cls token under pool='mean'"):
        load_vit_pytorch(ViT(**config), state_dict)


# clear errors


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(sample_frac=1.5), ValueError, 'sample_frac'),
    (dict(use_subspace=True), ValueError, 'dim'),
    (dict(use_subspace=True, dim=8, dim_subspace=8), ValueError, 'dim_subspace'),
    (dict(mean_center=1), TypeError, 'mean_center'),
])
def test_bad_loss_arguments_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        DecorrelationLoss(**kwargs)


def test_tokens_of_another_width_than_the_subspace_basis_are_refused():
    with pytest.raises(ValueError, match=r"the loss's dim = 8 features"):
        DecorrelationLoss(use_subspace=True, dim=8, dim_subspace=4)(torch.randn(2, 5, 6))


@pytest.mark.parametrize('name, value, error', [('decorr_sample_frac', -0.1, ValueError),
                                                ('decorr_mean_center', 'yes', TypeError),
                                                ('decorr_dim_subspace', 64, ValueError)])
def test_bad_model_arguments_are_refused_by_name(name, value, error):
    with pytest.raises(error, match=name):
        tiny(**{name: value, 'decorr_use_subspace': name == 'decorr_dim_subspace'})


# the training command: cross-entropy + --decorr-aux-loss-weight x the loss


@pytest.mark.parametrize('weight', [5, 0])
def test_the_trainers_loss_is_the_cross_entropy_plus_the_weighted_decorrelation_loss(weight, monkeypatch, tmp_path):
    check_trainer_adds_auxiliary_loss(monkeypatch, tmp_path, 'vit_with_decorr', '--decorr-aux-loss-weight', weight,
                                      lambda model, images: model(images, return_decorr_aux_loss=True))


@pytest.mark.parametrize('options, message', [
    (['--model', 'vit', '--decorr-aux-loss-weight', 1], '--model vit has none'),
    (['--model', 'vit_with_decorr', '--decorr-aux-loss-weight', -1], 'must be a finite number >= 0, got -1'),
])
def test_a_decorrelation_weight_for_another_model_or_below_zero_is_refused(options, message, tmp_path, capsys):
    assert message in refused_training_error(tmp_path, capsys, *options)


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                 # vit-pytorch's own sizes: seconds on 2 cores
def test_vit_pytorchs_main_block_runs():
    hiddens = torch.randn(6, 2, 512, 256)
    assert DecorrelationLoss(0.1)(hiddens).ndim == 0
    assert DecorrelationLoss(0.1)(hiddens[0]).ndim == 0
    assert DecorrelationLoss(0.0001, soft_validate_num_sampled=True)(hiddens).item() == 0
