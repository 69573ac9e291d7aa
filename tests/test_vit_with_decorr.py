"""The decorrelation loss: its formula, its zero, its gradient; the ViT that returns it; vit-pytorch's weights.
The paper's decorrelation matrices (`decorr_matrices=True`): their rule written out and against the official code,
what repeated steps do, that the task's gradient passes them untouched, that the training loop steps them, and that
the default model is the one without them."""

import pytest
import torch
import torch.nn.functional as F

from helpers import check_trainer_adds_auxiliary_loss, load_fixture, refused_training_error, tiny_vit_kwargs
from vit_pytorch import vit
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.training import loop
from vit_pytorch.vit_with_decorr import Decorrelation, DecorrelatedLinear, DecorrelationLoss, ViT


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


# the paper's method: decorrelation matrices that move by their own rule (decorr_matrices=True)


def explicit_step(weight, rows, *, lr, kappa, method='standard'):
    """decorbp's rules, entry by entry in float64, for the (N, d) rows z = R x of a forward:
    X_ij = sum_r z_ri z_rj / N, C_ij = X_ij for i != j (0 on the diagonal), v_j = X_jj - 1;
    'standard': R_ij <- R_ij - lr ((1 - kappa) sum_k C_ik R_kj + kappa R_ij v_j),
                loss ((1 - kappa) sum C^2 + kappa sum v^2) / d^2;
    'normalized': R_ij <- R_ij - lr ((1 - kappa) / (d - 1) sum_k C_ik R_kj + 2 kappa R_ij v_j),
                loss ((1 - kappa) / (d - 1) sum C^2 + kappa sum v^2) / d.
    Returns (new R, loss)."""
    weight, rows = weight.double().tolist(), rows.double().tolist()
    n, d = len(rows), len(weight)
    second = [[sum(row[i] * row[j] for row in rows) / n for j in range(d)] for i in range(d)]
    off = [[second[i][j] if i != j else 0. for j in range(d)] for i in range(d)]
    gap = [second[j][j] - 1. for j in range(d)]
    if method == 'standard':
        a, b, loss_a, loss_b, size = 1 - kappa, kappa, 1 - kappa, kappa, d ** 2
    else:
        a, b, loss_a, loss_b, size = (1 - kappa) / (d - 1), 2 * kappa, (1 - kappa) / (d - 1), kappa, d
    new = [[weight[i][j] - lr * (a * sum(off[i][k] * weight[k][j] for k in range(d))
                                 + b * weight[i][j] * gap[j]) for j in range(d)] for i in range(d)]
    loss = (loss_a * sum(c * c for line in off for c in line) + loss_b * sum(g * g for g in gap)) / size
    return torch.tensor(new, dtype=torch.float64), torch.tensor(loss, dtype=torch.float64)


def off_identity(d, seed=0):
    """I + 0.1 randn: a matrix R for which R diag(v) and diag(v) R differ."""
    return torch.eye(d, dtype=torch.float64) + 0.1 * torch.randn(d, d, generator=torch.Generator().manual_seed(seed),
                                                                 dtype=torch.float64)


@pytest.mark.parametrize('method', ['standard', 'normalized'])
@pytest.mark.parametrize('kappa', [0.0, 0.3])
def test_a_step_of_the_matrix_is_the_rule_written_out(kappa, method):
    module = Decorrelation(6, lr=0.05, kappa=kappa, method=method).double().train()
    module.weight.copy_(off_identity(6))
    x = correlated(2, 5, 6).double()
    z = module(x)
    torch.testing.assert_close(z, torch.einsum('ij,bnj->bni', off_identity(6), x), rtol=1e-12, atol=1e-12)
    loss = module.update()
    expected_weight, expected_loss = explicit_step(off_identity(6), z.reshape(10, 6), lr=0.05, kappa=kappa,
                                                   method=method)
    torch.testing.assert_close(module.weight, expected_weight, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-12, atol=1e-14)
    assert module.update() is None                      # no training forward since: nothing to step on


@pytest.mark.parametrize('case', ['decorrelate', 'whiten', 'normalized_decorrelate', 'normalized_whiten'])
def test_a_step_of_the_matrix_is_the_official_codes(case):
    """decorbp's own `Decorrelation.update()` (tests/fixtures/make_decorbp_official_fixtures.py), from a matrix off
    the identity, by its 'standard' and its 'normalized' rule, without (kappa 0) and with the variance term (kappa
    0.3)."""
    metadata, _, tensors = load_fixture('decorbp_official')
    options = metadata['cases'][case]
    module = Decorrelation(6, lr=options['decor_lr'], kappa=options['kappa'], method=options['method'])
    module = module.double().train()
    module.weight.copy_(tensors[f'{case}.weight_before'])
    torch.testing.assert_close(module(tensors[f'{case}.input']), tensors[f'{case}.output'], rtol=1e-12, atol=1e-12)
    loss = module.update()
    torch.testing.assert_close(module.weight, tensors[f'{case}.weight_after'], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, tensors[f'{case}.loss'], rtol=1e-12, atol=1e-14)


def correlated_gaussian(n=2000, d=8, seed=0):
    """(n, d) rows of a fixed correlated Gaussian (covariance 0.5 I + 0.5 (1 1^T) + a random part), centred exactly,
    so that their second moment is their covariance."""
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(d, d, generator=generator, dtype=torch.float64) / d ** 0.5
    covariance = 0.5 * torch.eye(d, dtype=torch.float64) + 0.5 + mixing @ mixing.T
    rows = torch.randn(n, d, generator=generator, dtype=torch.float64) @ torch.linalg.cholesky(covariance).T
    return rows - rows.mean(dim=0)


def repeated_steps(kappa, steps=400):
    rows = correlated_gaussian()
    module = Decorrelation(8, lr=0.05, kappa=kappa).double().train()
    for _ in range(steps):
        module(rows)
        module.update()
    with torch.no_grad():
        after = module.eval()(rows)
    return rows.T @ rows / len(rows), after.T @ after / len(after)      # covariances (the rows are centred)


def off_diagonal(matrix):
    return matrix[~torch.eye(len(matrix), dtype=torch.bool)]


def test_repeated_steps_decorrelate_a_fixed_correlated_input():
    before, after = repeated_steps(kappa=0.)
    assert off_diagonal(before).abs().max() > 1.
    assert off_diagonal(after).abs().max() < 1e-6 * off_diagonal(before).abs().max()
    assert (after.diagonal() - 1).abs().max() > 0.1          # without the variance term nothing sets the variances


def test_repeated_steps_with_the_variance_term_whiten_a_fixed_correlated_input():
    before, after = repeated_steps(kappa=0.5)
    assert off_diagonal(after).abs().max() < 1e-6 * off_diagonal(before).abs().max()
    torch.testing.assert_close(after.diagonal(), torch.ones(8, dtype=torch.float64), rtol=0, atol=1e-6)


def test_the_task_gradient_passes_the_matrix_and_leaves_it_unchanged():
    """The Linear after R learns on the decorrelated input z = R x (its gradient is g^T z); x gets R^T W^T g;
    R is no parameter, gets no gradient, and the optimizer's step leaves it as it was."""
    layer = DecorrelatedLinear(6, 3).double()
    with torch.no_grad():
        layer.decorrelation.weight.copy_(off_identity(6))
    x = correlated(4, 6).double().requires_grad_()
    upstream = torch.randn(4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    layer(x).backward(upstream)
    matrix, weight = off_identity(6), layer.weight.detach()
    torch.testing.assert_close(layer.weight.grad, upstream.T @ (x.detach() @ matrix.T), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, upstream @ weight @ matrix, rtol=1e-12, atol=1e-12)

    model = tiny(decorr_matrices=True).train()
    matrices = {name: buffer for name, buffer in model.named_buffers() if name.endswith('decorrelation.weight')}
    assert len(matrices) == 1 + 4 * 2                    # the patch projection; per layer qkv, out, 2 feed-forward
    assert not any('decorrelation' in name for name, _ in model.named_parameters())
    with torch.no_grad():
        for index, matrix in enumerate(matrices.values()):
            matrix.add_(0.05 * torch.randn(matrix.shape, generator=torch.Generator().manual_seed(index)))
    before = {name: matrix.clone() for name, matrix in matrices.items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=1.)
    logits, _ = model(torch.randn(4, 3, 16, 24), return_decorr_aux_loss=False)
    F.cross_entropy(logits, torch.tensor([0, 1, 2, 3])).backward()
    qkv_before = model.transformer.layers[0][0].to_qkv.weight.detach().clone()
    optimizer.step()
    assert all(matrix.grad is None and not matrix.requires_grad for matrix in matrices.values())
    assert all(torch.equal(matrices[name], before[name]) for name in matrices)
    assert not torch.equal(model.transformer.layers[0][0].to_qkv.weight, qkv_before)


def test_the_training_loop_steps_the_matrices_after_each_optimizer_step():
    torch.manual_seed(0)
    model = tiny(decorr_matrices=True, decorr_matrices_lr=0.01)
    events = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer_step, update = optimizer.step, model.update_decorrelation_
    optimizer.step = lambda *a, **k: (events.append('optimizer step'), optimizer_step(*a, **k))[1]
    model.update_decorrelation_ = lambda: (events.append('matrices step'), update())[1]
    images, labels = torch.randn(8, 3, 16, 24), torch.arange(8) % 5

    def step_loss(index, generator, rng, global_step):
        loss = F.cross_entropy(model(images[index], return_decorr_aux_loss=False)[0], labels[index])
        return loss, loss.item(), torch.tensor([loss.item()], dtype=torch.float64)

    model.train()
    loop.train_epoch(model, optimizer, step_loss, epoch=0, seed=0, images=8, batch_size=4, steps=2, peak=0.1,
                     warmup_steps=0, total_steps=2, clip_grad=0)
    assert events == ['optimizer step', 'matrices step'] * 2
    assert all(not torch.equal(buffer, torch.eye(len(buffer))) for name, buffer in model.named_buffers()
               if name.endswith('decorrelation.weight'))


def test_the_models_matrices_take_the_rule_it_is_given():
    model = tiny(decorr_matrices=True, decorr_matrices_method='normalized', decorr_matrices_lr=0.5,
                 decorr_matrices_kappa=0.2)
    matrices = [module for module in model.modules() if isinstance(module, Decorrelation)]
    assert len(matrices) == 9 and all(module.method == 'normalized' and module.lr == 0.5 and module.kappa == 0.2
                                      for module in matrices)
    assert all(module.method == 'standard' for module in tiny(decorr_matrices=True).modules()
               if isinstance(module, Decorrelation))


def test_the_update_reads_a_share_of_the_rows_drawn_with_replacement_and_only_in_training():
    module = Decorrelation(4, sample_frac=0.25)
    x = torch.randn(2, 10, 4)
    module.eval()(x)
    assert module.rows is None and module.update() is None
    torch.manual_seed(0)
    z = module.train()(x).reshape(20, 4)
    assert module.rows.shape == (5, 4)                   # int(20 * 0.25)
    assert all((z == row).all(dim=1).any() for row in module.rows)


def test_the_default_model_is_vit_pytorchs_plain_vit_with_the_loss():
    """Without decorr_matrices the model has the core ViT's keys and weights (same seed) and its logits bit for bit,
    and the matrices' step does nothing."""
    torch.manual_seed(0)
    ours = tiny().eval()
    torch.manual_seed(0)
    plain = vit.ViT(**tiny_vit_kwargs()).eval()
    assert list(ours.state_dict()) == list(plain.state_dict())
    assert all(torch.equal(ours.state_dict()[key], tensor) for key, tensor in plain.state_dict().items())
    img = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        assert torch.equal(ours(img)[0], plain(img))
    assert ours.train().update_decorrelation_() is None


def test_fresh_matrices_are_the_identity_and_change_no_output():
    torch.manual_seed(0)
    plain = tiny().eval()
    torch.manual_seed(0)
    decorrelated = tiny(decorr_matrices=True).eval()
    state = decorrelated.state_dict()
    added = [key for key in state if key not in plain.state_dict()]
    assert all(key.endswith('decorrelation.weight') and torch.equal(state[key], torch.eye(len(state[key])))
               for key in added) and len(added) == 9
    assert all(torch.equal(state[key], tensor) for key, tensor in plain.state_dict().items())
    img = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        assert torch.equal(decorrelated(img)[0], plain(img)[0])


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


def test_vit_pytorchs_checkpoint_loads_into_a_model_with_matrices_that_start_at_the_identity():
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_vit_with_decorr')
    config = dict(metadata['config'], image_size=tuple(metadata['config']['image_size']), decorr_matrices=True)
    model = load_vit_pytorch(ViT(**config), state_dict).train()
    matrices = [buffer for name, buffer in model.named_buffers() if name.endswith('decorrelation.weight')]
    assert matrices and all(torch.equal(matrix, torch.eye(len(matrix))) for matrix in matrices)
    with torch.no_grad():
        logits, _ = model(tensors['input'])
    torch.testing.assert_close(logits, tensors['output'], rtol=1e-4, atol=1e-5)


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
                                                ('decorr_dim_subspace', 64, ValueError),
                                                ('decorr_matrices', 1, TypeError),
                                                ('decorr_matrices_lr', 0., ValueError),
                                                ('decorr_matrices_kappa', 1.5, ValueError),
                                                ('decorr_matrices_sample_frac', 0., ValueError),
                                                ('decorr_matrices_method', 'whitened', ValueError)])
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


def test_key_index_is_refused_where_the_qkv_linear_decorrelates_its_input():
    # key_index projects with to_qkv's rows directly (F.linear): on a DecorrelatedLinear that would skip R
    attention = vit.Attention(16, heads=2, dim_head=8, linear=DecorrelatedLinear)
    assert isinstance(attention.to_qkv, DecorrelatedLinear) and isinstance(attention.to_out[0], DecorrelatedLinear)
    with pytest.raises(TypeError, match="key_index projects .* DecorrelatedLinear"):
        attention(torch.randn(2, 5, 16), key_index=torch.tensor([[0, 2], [1, 3]]))
