import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from helpers import tiny_vit_kwargs
from vit_pytorch import ViT
from vit_pytorch.analysis import (attention_rollout, cls_attention, mean_attention_distance, patch_embedding_components,
                                  patch_filters, position_embedding_similarity, to_patch_grid)
from vit_pytorch.recorder import Recorder
from vit_pytorch.simple_vit import posemb_sincos_2d


def row_stochastic(*shape):
    return torch.rand(*shape, dtype=torch.float64).softmax(dim=-1)


def uniform_attention(grid, prefix=0, layers=1, heads=1):
    n = prefix + grid[0] * grid[1]
    return torch.full((1, layers, heads, n, n), 1.0 / n, dtype=torch.float64)


@pytest.mark.parametrize('residual', [True, False])
def test_rollout_of_identity_attention_is_identity(residual):
    attns = torch.eye(7, dtype=torch.float64).expand(2, 3, 4, 7, 7)
    torch.testing.assert_close(attention_rollout(attns, residual=residual), torch.eye(7).expand(2, 7, 7).double())


def test_rollout_multiplies_the_head_averaged_layers_with_the_skip_connection():
    attns = row_stochastic(1, 2, 3, 5, 5)
    eye = torch.eye(5, dtype=torch.float64)
    first, second = ((attns[0, layer].mean(dim=0) + eye) / 2 for layer in range(2))
    torch.testing.assert_close(attention_rollout(attns)[0], second @ first)
    torch.testing.assert_close(attention_rollout(attns, residual=False)[0],
                               attns[0, 1].mean(dim=0) @ attns[0, 0].mean(dim=0))


def test_rollout_rows_are_distributions():
    rollout = attention_rollout(row_stochastic(2, 4, 3, 6, 6))
    torch.testing.assert_close(rollout.sum(dim=-1), torch.ones(2, 6, dtype=torch.float64))


def test_rollout_accepts_the_recorders_list():
    attns = row_stochastic(2, 3, 2, 5, 5)
    torch.testing.assert_close(attention_rollout(list(attns.unbind(dim=1))), attention_rollout(attns))


def test_rollout_refuses_maps_of_different_shapes():
    with pytest.raises(ValueError, match='one shape'):
        attention_rollout([row_stochastic(1, 2, 5, 5), row_stochastic(1, 2, 1, 5)])


def test_mean_attention_distance_of_uniform_attention_over_a_2x3_grid():
    # 36 ordered pairs of patches: within a row |dc| sums to 8 per row (16 in all); across rows
    # sqrt(1 + dc^2) with dc = 0 (3 pairs), 1 (4), 2 (2), in both directions: 2 (3 + 4 sqrt 2 + 2 sqrt 5)
    by_hand = (16 + 2 * (3 + 4 * math.sqrt(2) + 2 * math.sqrt(5))) / 36
    distance = mean_attention_distance(uniform_attention((2, 3)), grid=(2, 3))
    torch.testing.assert_close(distance, torch.full((1, 1, 1), by_hand, dtype=torch.float64))


def test_mean_attention_distance_ignores_prefix_tokens_and_scales_with_patch_size():
    by_hand = (16 + 2 * (3 + 4 * math.sqrt(2) + 2 * math.sqrt(5))) / 36
    distance = mean_attention_distance(uniform_attention((2, 3), prefix=1, layers=2, heads=3), grid=(2, 3),
                                       num_prefix_tokens=1, patch_size=16)
    torch.testing.assert_close(distance, torch.full((1, 2, 3), 16 * by_hand, dtype=torch.float64))


def test_mean_attention_distance_measures_rectangular_patches_in_pixels():
    # a 1x2 grid of 4 (h) x 10 (w) patches: each patch gives half its attention to the other, 10 pixels away
    distance = mean_attention_distance(torch.full((1, 1, 1, 2, 2), 0.5), grid=(1, 2), patch_size=(4, 10))
    torch.testing.assert_close(distance, torch.full((1, 1, 1), 5.0))


def test_attention_to_oneself_has_zero_distance():
    attns = torch.eye(12).expand(1, 2, 2, 12, 12)
    torch.testing.assert_close(mean_attention_distance(attns, grid=(3, 4)), torch.zeros(1, 2, 2))


def test_sincos_position_similarity_peaks_on_the_diagonal():
    similarity = position_embedding_similarity(posemb_sincos_2d(8, 8, 64), grid=(8, 8))
    tiles = rearrange(similarity, 'h1 w1 h2 w2 -> (h1 w1) (h2 w2)')
    torch.testing.assert_close(tiles.diagonal(), torch.ones(64))
    off_diagonal = tiles.masked_fill(torch.eye(64, dtype=torch.bool), -2)
    assert (off_diagonal.max(dim=-1).values < 1 - 1e-3).all()


def test_sincos_position_similarity_falls_off_with_distance():
    similarity = position_embedding_similarity(posemb_sincos_2d(8, 8, 64), grid=(8, 8))
    for row in range(8):
        for column in range(8):
            for step in (1, -1):
                along_row = [similarity[row, column, row, column + step * d] for d in range(4)
                             if 0 <= column + step * d < 8]
                along_column = [similarity[row, column, row + step * d, column] for d in range(4)
                                if 0 <= row + step * d < 8]
                for values in (along_row, along_column):
                    assert all(near > far for near, far in zip(values, values[1:]))


def test_position_similarity_is_cosine_of_the_table_rows_after_the_prefix():
    table = torch.randn(1 + 6, 16)
    similarity = position_embedding_similarity(table[None], grid=(2, 3), num_prefix_tokens=1)
    torch.testing.assert_close(similarity[1, 2, 0, 1], F.cosine_similarity(table[1 + 5], table[1 + 1], dim=0))


def test_layout_mismatch_is_refused_with_the_arithmetic():
    with pytest.raises(ValueError, match=r'7 tokens do not match grid \(2, 2\) with 1 prefix tokens'):
        position_embedding_similarity(torch.randn(7, 8), grid=(2, 2), num_prefix_tokens=1)


def test_cls_attention_lays_the_cls_row_on_the_grid():
    attns = torch.zeros(1, 2, 3, 13, 13)
    attns[0, -1, 1, 0, 1 + 2 * 3 + 1] = 1.0                # last layer, head 1: cls looks at patch (2, 1)
    maps = cls_attention(attns, grid=(4, 3), num_prefix_tokens=1)
    assert maps.shape == (1, 3, 4, 3)
    assert maps[0, 1, 2, 1] == 1 and maps.sum() == 1


def test_to_patch_grid_keeps_leading_axes():
    weights = torch.arange(2 * 13.).view(2, 13)
    grid = to_patch_grid(weights, grid=(4, 3), num_prefix_tokens=1)
    torch.testing.assert_close(grid[1, 3, 2], weights[1, 12])


def test_analyses_run_on_a_recorded_model():
    model = ViT(**tiny_vit_kwargs()).eval()
    recorder = Recorder(model)
    _, attns = recorder(torch.randn(2, 3, 16, 24))
    layout = dict(grid=recorder.grid, num_prefix_tokens=recorder.num_prefix_tokens)
    assert mean_attention_distance(attns, patch_size=model.patch_size, **layout).shape == (2, 2, 2)
    assert position_embedding_similarity(model.pos_embedding, **layout).shape == (4, 3, 4, 3)
    assert to_patch_grid(attention_rollout(attns)[:, 0], **layout).shape == (2, 4, 3)


def test_patch_filters_are_the_convolution_the_embedding_computes():
    model = ViT(**tiny_vit_kwargs(patch_norm=False))
    img = torch.randn(2, 3, 16, 24)
    linear = model.to_patch_embedding[2]
    conv = F.conv2d(img, patch_filters(model), linear.bias, stride=model.patch_size)
    torch.testing.assert_close(rearrange(conv, 'b d h w -> b (h w) d'), model.to_patch_embedding(img),
                               atol=1e-5, rtol=1e-5)


def test_patch_filters_fold_in_the_scale_of_the_patch_norm():
    model = ViT(**tiny_vit_kwargs())
    plain = patch_filters(model)
    with torch.no_grad():
        model.to_patch_embedding[1].weight.fill_(3.0)
    torch.testing.assert_close(patch_filters(model), 3 * plain)


def test_principal_components_match_scikit_learn():
    decomposition = pytest.importorskip('sklearn.decomposition')
    # 48 filters of 3 x 4 x 4 = 48 numbers, each with its own variance so the components are well separated
    samples = torch.randn(48, 48, dtype=torch.float64) * torch.linspace(0.5, 3, 48, dtype=torch.float64)
    filters = samples.view(48, 3, 4, 4)
    components, explained = patch_embedding_components(filters, num_components=10)
    pca = decomposition.PCA(n_components=10).fit(filters.flatten(1).numpy())
    reference = torch.from_numpy(pca.components_)
    flat = components.flatten(1)
    signs = (flat * reference).sum(dim=1).sign()
    torch.testing.assert_close(flat, reference * signs[:, None], atol=1e-8, rtol=0)
    torch.testing.assert_close(explained, torch.from_numpy(pca.explained_variance_ratio_), atol=1e-10, rtol=0)
    assert components.shape == (10, 3, 4, 4)


def test_principal_components_are_capped_by_the_filter_size():
    components, explained = patch_embedding_components(torch.randn(64, 1, 2, 2))
    assert components.shape == (4, 1, 2, 2)
    torch.testing.assert_close(explained.sum(), torch.tensor(1.0))
