"""LeJEPA (arXiv 2511.08544): SIGReg is the Epps-Pulley statistic over random 1-D projections, ~0 (per sample)
for Gaussian embeddings and large for a collapsed one; the prediction loss pulls every view to the global views'
centre with no stop-gradient; vit-pytorch's LeJEPA loads and gives its projections and its SIGReg."""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import count, load_fixture
from vit_pytorch import ViT
from vit_pytorch.lejepa import CONFIGS, LeJEPA, lejepa, random_projections, sigreg, sigreg_loss
from vit_pytorch.pretrained import load_vit_pytorch

TINY = dict(image_size=16, patch_size=4, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32)


def tiny_lejepa(**overrides):
    torch.manual_seed(0)
    return LeJEPA(ViT(**TINY), 16, projection_hidden_size=16, num_classes_K=8,
                  sigreg_loss_kwargs=dict(num_slices=32), **overrides)


def epps_pulley_by_quadrature(samples, low, high, knots):
    """N * integral_low^high |ecf(t) - phi(t)|^2 phi(t) dt of 1-D `samples` (float64), the complex ecf written out
    and the trapezoidal rule summed knot by knot."""
    t = [low + (high - low) * k / (knots - 1) for k in range(knots)]
    values = []
    for tk in t:
        ecf = sum(complex(math.cos(tk * x), math.sin(tk * x)) for x in samples) / len(samples)
        phi = math.exp(-tk * tk / 2)
        values.append(abs(ecf - phi) ** 2 * phi)
    step = (high - low) / (knots - 1)
    return len(samples) * step * (sum(values) - (values[0] + values[-1]) / 2)


def test_sigreg_is_the_epps_pulley_integral_of_each_projection():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, generator=generator, dtype=torch.float64) * 1.5 + 0.3
    directions = random_projections(3, 4, dtype=torch.float64, generator=generator)
    statistics = sigreg(x, directions, domain=(-2.5, 4.0), num_knots=9)
    for m in range(4):
        expected = epps_pulley_by_quadrature((x @ directions[:, m]).tolist(), -2.5, 4.0, 9)
        assert statistics[m].item() == pytest.approx(expected, rel=1e-12)


def test_random_projections_are_unit_directions():
    directions = random_projections(5, 100, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(directions.norm(dim=0), torch.ones(100))


def test_sigreg_is_invariant_to_the_sign_of_the_projections():
    # |ecf(-t) - phi| = |conj(ecf(t)) - phi|: phi is real, so a direction and its opposite test the same
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 6, generator=generator)
    directions = random_projections(6, 8, generator=generator)
    torch.testing.assert_close(sigreg(x, -directions), sigreg(x, directions), rtol=1e-6, atol=0)


def test_sigreg_of_gaussian_samples_is_its_null_expectation():
    # For N(0, I) samples, E N |ecf(t) - phi(t)|^2 = 1 - phi(t)^2 (the variance of exp(itX)), so E T is the
    # quadrature of (1 - e^{-t^2}) e^{-t^2/2}: a constant, whatever N; per sample it is ~0 (T / N -> 0).
    t = torch.linspace(-5, 5, 17, dtype=torch.float64)
    expected = torch.trapezoid((1 - (-t.square()).exp()) * (-t.square() / 2).exp(), t).item()
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(400, 64, 32, generator=generator, dtype=torch.float64)      # 400 draws of N = 64 samples
    draws = sigreg(x, random_projections(32, 16, dtype=torch.float64, generator=generator))
    # 6400 nearly independent statistics of variance < 1.3: the mean's standard error is under 0.015
    assert draws.mean().item() == pytest.approx(expected, abs=0.1)
    assert (draws / 64).mean().item() < 0.03


def test_sigreg_of_a_collapsed_embedding_is_large():
    # every sample at one point c: ecf = exp(itc), so T = N * integral |exp(itc) - phi|^2 phi, at c = 0 the
    # closed form N * integral (1 - phi)^2 phi = 0.409 N: at N = 256, 104.7, against ~1.06 for Gaussian samples
    collapsed = torch.zeros(256, 32, dtype=torch.float64)
    t = torch.linspace(-5, 5, 17, dtype=torch.float64)
    phi = (-t.square() / 2).exp()
    closed_form = 256 * torch.trapezoid((1 - phi).square() * phi, t).item()
    statistic = sigreg_loss(collapsed, num_slices=16)
    assert statistic.item() == pytest.approx(closed_form, rel=1e-12)
    gaussian = sigreg_loss(torch.randn(256, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64),
                           num_slices=16)
    assert statistic > 20 * gaussian


def test_sigreg_averages_the_views():
    generator = torch.Generator().manual_seed(4)
    views = torch.randn(3, 10, 6, generator=generator)
    directions = random_projections(6, 5, generator=generator)
    per_view = torch.stack([sigreg_loss(view, projections=directions) for view in views])
    torch.testing.assert_close(sigreg_loss(views, projections=directions), per_view.mean())


def test_prediction_loss_pulls_every_view_to_the_global_centre():
    learner = tiny_lejepa(target_loss_weight=1., sigreg_loss_weight=0.)
    generator = torch.Generator().manual_seed(5)
    global_projections, local_projections = torch.randn(2, 3, 8, generator=generator), torch.randn(
        3, 3, 8, generator=generator)
    center = global_projections.mean(dim=0)
    expected = sum((view - center).square().sum() for view in [*global_projections, *local_projections]) / (5 * 3 * 8)
    torch.testing.assert_close(learner.loss(global_projections, local_projections), expected)


def test_the_loss_weighs_its_two_terms():
    learner = tiny_lejepa(target_loss_weight=0.75, sigreg_loss_weight=0.25)
    generator = torch.Generator().manual_seed(6)
    global_projections = torch.randn(2, 6, 8, generator=generator)
    directions = random_projections(8, 32, generator=generator)
    loss = learner.loss(global_projections, projections=directions)
    prediction, regulariser = learner.last_losses
    torch.testing.assert_close(regulariser, sigreg_loss(global_projections, projections=directions))
    torch.testing.assert_close(loss, 0.75 * prediction + 0.25 * regulariser)


def test_gradients_flow_through_the_global_views_targets():
    # no stop-gradient: the centre the views are pulled to carries the gradient too. With SIGReg off, the
    # gradient of the prediction loss on a global view is its own pull minus its share of every view's pull
    learner = tiny_lejepa(target_loss_weight=1., sigreg_loss_weight=0.)
    generator = torch.Generator().manual_seed(7)
    global_projections = torch.randn(2, 3, 8, generator=generator, requires_grad=True)
    local_projections = torch.randn(2, 3, 8, generator=generator, requires_grad=True)
    learner.loss(global_projections, local_projections).backward()
    views = torch.cat((global_projections, local_projections)).detach()
    pulls = 2 * (views - global_projections.detach().mean(dim=0)) / views.numel()
    torch.testing.assert_close(local_projections.grad, pulls[2:])
    torch.testing.assert_close(global_projections.grad, pulls[:2] - pulls.sum(dim=0) / 2)
    assert global_projections.grad.abs().sum() > 0


def test_the_prediction_loss_of_the_global_views_alone_trains_the_network():
    # with a stop-gradient on the targets (vit-pytorch's torch.no_grad) this loss would have no gradient at all
    learner = tiny_lejepa(target_loss_weight=1., sigreg_loss_weight=0.).train()
    generator = torch.Generator().manual_seed(8)
    views = [torch.rand(4, 3, 16, 16, generator=generator) for _ in range(2)]
    learner.loss(learner.project(views)).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in learner.net.transformer.parameters())


def test_use_ema_is_refused_naming_the_paper():
    for given in (dict(use_ema=True), dict(moving_average_decay=0.99), dict(use_sigreg=False)):
        with pytest.raises(ValueError, match='LeJEPA has no teacher'):
            tiny_lejepa(**given)


@pytest.mark.parametrize('kwargs, match', [(dict(num_knots=1), 'num_knots'), (dict(domain=(3, -3)), 'domain'),
                                           (dict(num_slice=4), 'sigreg_loss_kwargs'), (dict(num_slices=0), 'num_slices')])
def test_bad_sigreg_kwargs_are_refused(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        LeJEPA(ViT(**TINY), 16, num_classes_K=8, sigreg_loss_kwargs=kwargs)


def batch_norm_by_hand(z, eps=1e-5):
    """(z - batch mean) / sqrt(biased batch variance + eps), per unit of z (n, d)."""
    return (z - z.mean(dim=0)) / (z.var(dim=0, unbiased=False) + eps).sqrt()


def test_the_batchnorm_projector_is_linear_batchnorm_relu_then_linear():
    # the official projector (MINIMAL.md: torchvision's MLP with norm_layer=BatchNorm1d), in training mode: each
    # hidden layer h = relu(gamma * standardise_over_batch(W h + b) + beta), then y = W h + b
    learner = tiny_lejepa(projector='batchnorm', projection_layers=3).train()
    generator = torch.Generator().manual_seed(9)
    for parameter in learner.projector.parameters():           # gamma and beta away from 1 and 0
        parameter.data = torch.randn(parameter.shape, generator=generator)
    x = torch.randn(6, 16, generator=generator)
    linears = [module for module in learner.projector.modules() if isinstance(module, torch.nn.Linear)]
    norms = [module for module in learner.projector.modules() if isinstance(module, torch.nn.BatchNorm1d)]
    assert len(linears) == 3 and len(norms) == 2
    h = x
    for linear, norm in zip(linears[:-1], norms):
        h = (norm.weight * batch_norm_by_hand(h @ linear.weight.T + linear.bias) + norm.bias).clamp_min(0)
    expected = h @ linears[-1].weight.T + linears[-1].bias
    torch.testing.assert_close(learner.projector(x), expected, rtol=1e-5, atol=1e-5)


def test_the_batchnorm_projector_does_not_see_the_embeddings_scale():
    # BatchNorm after the first linear layer: standardise(c W x + b) = standardise(W x) for c > 0 (BatchNorm's
    # eps, 1e-5 added to the variance, made negligible in float64), so the projections' spread does not shrink
    # with the embedding's
    projector = tiny_lejepa(projector='batchnorm').projector.double().train()
    for module in projector.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.eps = 1e-20
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    torch.testing.assert_close(projector(0.001 * x), projector(x), rtol=1e-9, atol=1e-9)


def test_the_default_projector_is_vit_pytorchs_l2_normed_mlp():
    projector = tiny_lejepa().projector
    assert [type(module).__name__ for module in projector.net] == ['Linear', 'GELU'] * 3 + ['L2Norm', 'Linear']


def test_an_unknown_projector_is_refused_by_name():
    with pytest.raises(ValueError, match="projector must be one of 'vit-pytorch', 'batchnorm', got 'bn'"):
        tiny_lejepa(projector='bn')


def test_images_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match=r'takes images \(b, 3, h, w\)'):
        tiny_lejepa()(torch.rand(2, 1, 16, 16))


# vit-pytorch 1.26.14 (tests/fixtures/make_lejepa_fixtures.py)


def vit_pytorch_lejepa():
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_lejepa')
    config = metadata['config']['lejepa']
    config['sigreg_loss_kwargs']['domain'] = tuple(config['sigreg_loss_kwargs']['domain'])
    learner = LeJEPA(ViT(**metadata['config']['vit']), **config)
    return load_vit_pytorch(learner, state_dict).train(), tensors


def test_vit_pytorchs_lejepa_loads_and_gives_its_projections():
    learner, tensors = vit_pytorch_lejepa()
    with torch.no_grad():
        projection, embedding = learner(tensors['input'], return_embedding=True)
    torch.testing.assert_close(embedding, tensors['embedding'], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(projection, tensors['projection'], rtol=1e-5, atol=1e-6)


def test_vit_pytorchs_sigreg_is_ours_without_the_factor_n():
    learner, tensors = vit_pytorch_lejepa()
    with torch.no_grad():
        local = learner.project([tensors['local_one'], tensors['local_two']]).flatten(0, 1)   # its pooled batch
    ours = sigreg_loss(local, projections=tensors['directions'].T)
    torch.testing.assert_close(ours / len(local), tensors['sigreg'], rtol=1e-5, atol=1e-7)


def test_vit_pytorchs_loss_on_fixed_views_is_its_pairing_and_our_sigreg():
    # what vit-pytorch computes: each local view against the other augmentation's global view, plus SIGReg
    # without the factor N; the paper's loss (ours) pulls all four to the centre of the global ones instead
    learner, tensors = vit_pytorch_lejepa()
    with torch.no_grad():
        local_one, local_two, global_one, global_two = learner.project(
            [tensors[name] for name in ('local_one', 'local_two', 'global_one', 'global_two')])
        regulariser = sigreg_loss(torch.cat((local_one, local_two)), projections=tensors['directions'].T) / 8
        theirs = F.mse_loss(local_one, global_two) + F.mse_loss(local_two, global_one) + regulariser
    torch.testing.assert_close(theirs, tensors['loss'], rtol=1e-5, atol=1e-7)


@pytest.mark.slow            # vit-pytorch's sizes: a 6-layer ViT of width 1024 on 256-pixel images, K = 65336
def test_vit_pytorchs_main_block_runs_and_its_ema_mode_is_refused():
    def create_model():
        return ViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=8, mlp_dim=2048)

    learner = LeJEPA(create_model(), image_size=256, hidden_layer='to_latent', projection_hidden_size=256,
                     projection_layers=4, num_classes_K=65336, target_loss_weight=1.0, sigreg_loss_weight=1.0)
    opt = torch.optim.Adam(learner.parameters(), lr=3e-4)
    images = torch.randn(8, 3, 256, 256)
    loss = learner(images)
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match='LeJEPA has no teacher'):
        LeJEPA(create_model(), image_size=256, hidden_layer='to_latent', projection_hidden_size=256,
               projection_layers=4, num_classes_K=65336, use_ema=True, moving_average_decay=0.99)


# the official code's SIGReg (rbalestr-lab/lejepa @ eddffdd, lejepa/univariate/epps_pulley.py and
# lejepa/multivariate/slicing.py; fixture written by tests/fixtures/make_sigreg_official_fixtures.py, run outside
# this repository). The official code integrates [0, t_max] on n knots and doubles (|ecf - phi|^2 is even in t):
# the trapezoidal rule over [-t_max, t_max] on 2 n - 1 knots, which is ours.

def official_tolerance(tensors, name, t_max, n_points):
    # the official knot tables phi(t) and w(t) phi(t) were computed in float32 (each entry within 2^-23 relative
    # of its float64 value; the knots t themselves are exact): with |ecf - phi| <= 2 each knot's term
    # N w phi |ecf - phi|^2 moves by at most N w phi (2^-23 |ecf - phi|^2 + 2 * 2 * 2^-24 phi), so the statistic
    # by at most 2^-23 T + N * 2^-22 * sum_k w_k phi_k^2 (float64 sums add ~1e-16: negligible)
    n = tensors['x'].shape[-2]
    t = torch.linspace(-t_max, t_max, 2 * n_points - 1, dtype=torch.float64)
    bound = n * 2 ** -22 * torch.trapezoid((-t.square()).exp(), t)
    return dict(rtol=2 ** -23, atol=bound.item())


@pytest.mark.parametrize('name, t_max, n_points', [('ep3_17', 3, 17), ('ep5_9', 5, 9)])
def test_sigreg_is_the_official_epps_pulley_statistic(name, t_max, n_points):
    _, _, tensors = load_fixture('sigreg_official')
    ours = sigreg(tensors['x'], tensors['directions'], domain=(-t_max, t_max), num_knots=2 * n_points - 1)
    # statistics from near the Gaussian expectation (~1) to far above it: no term vanishes
    assert ours.shape == tensors[name].shape == (2, 16) and tensors[name].min() > 0.05 and tensors[name].max() > 5
    torch.testing.assert_close(ours, tensors[name], **official_tolerance(tensors, name, t_max, n_points))


def test_sigreg_loss_is_the_official_sliced_test_given_its_directions():
    # the official SlicingUnivariateTest draws its directions as torch.randn((d, m)) from a CPU generator seeded with
    # its step (0 at first), normalised: random_projections draws them alike from that generator. Both run in
    # float32 on float32 samples: the statistic (~4) agrees to float32 rounding of its ~20 operations a term
    _, _, tensors = load_fixture('sigreg_official')
    projections = random_projections(8, 16, generator=torch.Generator().manual_seed(0))
    ours = sigreg_loss(tensors['x32'], projections=projections, domain=(-3, 3), num_knots=33)
    torch.testing.assert_close(ours, tensors['sliced'], rtol=1e-5, atol=0)


# the official code's backbones (rbalestr-lab/lejepa @ eddffdd: MINIMAL.md's ViTEncoder, the README's ViT-L of
# scripts/launch_*_ablation.md), timm models counted by tests/fixtures/count_official_lejepa.py: name -> (dim, depth,
# heads, patch, image size, the timm model's parameters with its 512-way embedding head)
OFFICIAL_BACKBONES = {'vit_small_patch8_224': (384, 12, 6, 8, 128, 21_664_640),
                      'vit_large_patch14_224': (1024, 24, 16, 14, 224, 303_703_552)}


def meta_lejepa(variant):
    with torch.device('meta'):
        return lejepa(variant)


@pytest.mark.parametrize('variant', sorted(OFFICIAL_BACKBONES))
def test_a_named_backbone_takes_the_official_timm_models_widths(variant):
    dim, depth, heads, patch, image_size, _ = OFFICIAL_BACKBONES[variant]
    net = meta_lejepa(variant).net
    assert (net.embed_dim, len(net.transformer.layers), net.image_size, net.patch_size) == \
        (dim, depth, (image_size,) * 2, (patch,) * 2)
    assert net.transformer.layers[0][0].heads == heads
    assert set(CONFIGS) == set(OFFICIAL_BACKBONES)


@pytest.mark.parametrize('variant', sorted(OFFICIAL_BACKBONES))
def test_a_named_backbone_counts_the_official_model_less_its_512_way_embedding_head(variant):
    """The official embedding is the timm model's Linear(dim, 512) output; ours is the pooled tokens."""
    dim, *_, official = OFFICIAL_BACKBONES[variant]
    assert count(meta_lejepa(variant).net) == official - (dim * 512 + 512)


def test_an_unknown_backbone_is_refused_by_name():
    with pytest.raises(ValueError, match="variant must be one of .*'vit_small_patch8_224'.*got 'vit_h'"):
        lejepa('vit_h')
