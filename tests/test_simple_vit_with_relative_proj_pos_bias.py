"""The projected relative position bias: the explicit formula, what it depends on, its range; vit-pytorch's weights."""

import itertools

import pytest
import torch

from helpers import load_fixture, reference_case, tiny_vit_kwargs
from vit_pytorch import simple_vit
from vit_pytorch.pretrained import load_vit_pytorch
from vit_pytorch.simple_vit_with_relative_proj_pos_bias import RelativeProjPositionalBias, SimpleViT


def moved(module, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=generator))
    return module


def explicit_bias(module, x):
    """b[n, h, i, j] = sum over axes a of sum_k w[a, h, k](x_i) bank[a, k, (pos_i - pos_j)[a] + max_dist - 1],
    0 where an offset reaches max_dist; written out cell by cell."""
    batch, *grid, _ = x.shape
    cells = list(itertools.product(*(range(side) for side in grid)))
    linear, axes, heads = module.to_distance_weights[0], module.dim_pos, module.heads
    bias = torch.zeros(batch, heads, len(cells), len(cells), dtype=torch.float64)
    for n in range(batch):
        for i, pos_i in enumerate(cells):
            weights = linear(x[(n, *pos_i)]).double().reshape(axes, heads, module.num_distance_basis)
            for j, pos_j in enumerate(cells):
                offsets = [a - b for a, b in zip(pos_i, pos_j)]
                if any(abs(offset) >= module.max_dist for offset in offsets):
                    continue
                for axis, offset in enumerate(offsets):
                    curve = module.distance_banks[axis, :, offset + module.max_dist - 1].double()
                    bias[n, :, i, j] += weights[axis] @ curve
    return bias


@pytest.mark.parametrize('grid', [(7,), (3, 4), (2, 3, 2)], ids=['1d', '2d', '3d'])
def test_bias_is_the_sum_over_axes_of_the_query_weighted_curves_at_each_offset(grid):
    module = moved(RelativeProjPositionalBias(8, heads=2, dim_pos=len(grid), num_distance_basis=3, max_dist=3))
    x = torch.randn(2, *grid, 8)
    with torch.no_grad():
        torch.testing.assert_close(module(x).double(), explicit_bias(module, x), rtol=1e-5, atol=1e-5)


def test_with_the_same_token_everywhere_the_bias_depends_only_on_the_relative_position():
    module = moved(RelativeProjPositionalBias(8, heads=2, num_distance_basis=3, max_dist=4))
    x = torch.randn(1, 1, 1, 8).expand(1, 4, 5, 8)
    with torch.no_grad():
        bias = module(x)[0]                                          # (heads, 20, 20)
    cells = list(itertools.product(range(4), range(5)))
    by_offset = {}
    for (i, pos_i), (j, pos_j) in itertools.product(enumerate(cells), repeat=2):
        offset = (pos_i[0] - pos_j[0], pos_i[1] - pos_j[1])
        by_offset.setdefault(offset, []).append(bias[:, i, j])
    assert len(by_offset) == 7 * 9
    for offset, values in by_offset.items():
        for value in values[1:]:
            torch.testing.assert_close(value, values[0], rtol=0, atol=1e-6, msg=str(offset))
    assert not torch.allclose(by_offset[(1, 0)][0], by_offset[(0, 1)][0])


def test_a_row_of_the_bias_reads_only_its_query_token():
    module = moved(RelativeProjPositionalBias(8, heads=2, num_distance_basis=3, max_dist=4))
    x = torch.randn(1, 3, 4, 8)
    changed = x.clone()
    changed[0, 1, 2] += torch.randn(8)                             # cell 6 of the row-major grid
    with torch.no_grad():
        before, after = module(x)[0], module(changed)[0]
    rows = [i for i in range(12) if i != 6]
    torch.testing.assert_close(after[:, rows], before[:, rows], rtol=0, atol=0)
    assert not torch.allclose(after[:, 6], before[:, 6])


def test_offsets_of_max_dist_or_more_on_any_axis_get_no_bias():
    module = moved(RelativeProjPositionalBias(8, heads=2, num_distance_basis=3, max_dist=2))
    with torch.no_grad():
        bias = module(torch.randn(1, 3, 3, 8))[0]
    cells = list(itertools.product(range(3), range(3)))
    for (i, (yi, xi)), (j, (yj, xj)) in itertools.product(enumerate(cells), repeat=2):
        far = abs(yi - yj) >= 2 or abs(xi - xj) >= 2
        assert (bias[:, i, j] == 0).all() == far, (cells[i], cells[j])


def test_with_empty_banks_the_model_is_simple_vit_and_the_bias_is_all_it_adds():
    model = moved(SimpleViT(**tiny_vit_kwargs()), seed=1).eval()
    plain = simple_vit.SimpleViT(**tiny_vit_kwargs()).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if 'rel_pos_bias' not in k})
    img = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        assert not torch.allclose(model(img), plain(img), atol=1e-3)
        for layer in model.transformer.layers:
            layer[0].rel_pos_bias.distance_banks.zero_()
        torch.testing.assert_close(model(img), plain(img), rtol=1e-5, atol=1e-6)


# vit-pytorch 1.26.14's module (tests/fixtures/make_relpos_decorr_mp3_fixtures.py)


def test_vit_pytorchs_checkpoint_loads_strictly_and_gives_its_output():
    config, state_dict, img, expected = reference_case('vit_pytorch_1.26.14_simple_vit_with_relative_proj_pos_bias',
                                                       'image_size')
    model = load_vit_pytorch(SimpleViT(**config), state_dict).eval()
    assert model.state_dict().keys() == state_dict.keys()
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-4, atol=1e-5)


# clear errors


def test_a_grid_of_another_number_of_axes_is_refused_by_name():
    with pytest.raises(ValueError, match=r'x must have 2 grid axes .* got shape \(2, 16, 64\)'):
        RelativeProjPositionalBias(dim=64, heads=4)(torch.randn(2, 16, 64))


@pytest.mark.parametrize('name, value, error', [('num_distance_basis', 0, ValueError), ('max_dist', 2.5, TypeError)])
def test_bad_bias_arguments_are_refused_by_name(name, value, error):
    with pytest.raises(error, match=name):
        SimpleViT(**tiny_vit_kwargs(**{name: value}))


def test_the_fixture_holds_offsets_beyond_the_banks():
    """The fixture's 4x6 grid with max_dist=3: offsets of 3 to 5 columns exist, so the zeroing is compared too."""
    metadata, _, _ = load_fixture('vit_pytorch_1.26.14_simple_vit_with_relative_proj_pos_bias')
    grid = [side // metadata['config']['patch_size'] for side in metadata['config']['image_size']]
    assert max(grid) > metadata['config']['max_dist']


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                 # vit-pytorch's own sizes: seconds on 2 cores
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block: the SimpleViT at 256 pixels, patches of 32, a backward pass; 1-D and 3-D biases."""
    model = SimpleViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=2, heads=8, mlp_dim=2048)
    out = model(torch.randn(2, 3, 256, 256))
    assert out.shape == (2, 1000)
    out.sum().backward()
    assert RelativeProjPositionalBias(dim=64, heads=4, dim_pos=1)(torch.randn(2, 16, 64)).shape == (2, 4, 16, 16)
    assert RelativeProjPositionalBias(dim=64, heads=4, dim_pos=3)(torch.randn(2, 4, 4, 4, 64)).shape == (2, 4, 64, 64)
