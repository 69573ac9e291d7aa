import pytest
import torch

from helpers import count, tiny_vit_kwargs
from vit_pytorch import vit
from vit_pytorch.parallel_vit import (Parallel, ViT, parallel_vit, vit_base_6x2, vit_base_18x2, vit_large_12x2,
                                      vit_small_6x2, vit_small_18x2)


@pytest.mark.parametrize('branches', [1, 2, 3])
def test_every_layer_has_the_requested_branches(branches):
    model = ViT(**tiny_vit_kwargs(num_parallel_branches=branches))
    for attns, ffs in model.transformer.layers:
        assert [type(fn) for fn in attns.fns] == [vit.Attention] * branches
        assert [type(fn) for fn in ffs.fns] == [vit.FeedForward] * branches


def test_layer_adds_every_branch_to_the_same_input():
    model = ViT(**tiny_vit_kwargs(num_parallel_branches=3)).eval()
    attns, ffs = model.transformer.layers[0]
    x = torch.randn(2, 13, 32)
    y = x + sum(attn(x) for attn in attns.fns)
    expected = y + sum(ff(y) for ff in ffs.fns)
    torch.testing.assert_close(model.transformer.layer(model.transformer.layers[0], x), expected)


def test_branches_are_independent_modules():
    parallel = Parallel(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    assert parallel.fns[0].weight.data_ptr() != parallel.fns[1].weight.data_ptr()
    x = torch.randn(3, 4)
    torch.testing.assert_close(parallel(x), parallel.fns[0](x) + parallel.fns[1](x))


def test_one_branch_is_the_core_vit():
    model = ViT(**tiny_vit_kwargs(num_parallel_branches=1)).eval()
    core = vit.ViT(**tiny_vit_kwargs(patch_norm=False)).eval()     # both with a bare Linear patch projection
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
                             mlp_dim=1536, patch_norm=False)
    assert count(parallel) == count(sequential)


@pytest.mark.parametrize('override, error, message', [
    (dict(num_parallel_branches=1.5), TypeError, r'num_parallel_branches must be a positive int'),
    (dict(pool='max'), ValueError, r"pool must be 'cls'"),
])
def test_invalid_configuration(override, error, message):
    with pytest.raises(error, match=message):
        ViT(**tiny_vit_kwargs(**override))


def test_recorder_sees_every_branch():
    from vit_pytorch.recorder import Recorder

    model = ViT(**tiny_vit_kwargs(num_parallel_branches=3)).eval()
    _, attns = Recorder(model)(torch.randn(2, 3, 16, 24))
    assert attns.shape == (2, 2 * 3, 2, 13, 13)               # layers x branches maps


# the paper's models, counted on the meta device (nothing allocated)


def sequential_vit_formula_count(dim, blocks, patch=16, image=224, num_classes=1000):
    """A qkv-biased pre-norm ViT of `blocks` blocks (MLP ratio 4) from its definition."""
    patch_embed = 3 * patch * patch * dim + dim
    tokens = (image // patch) ** 2 + 1
    attention = 2 * dim + (dim * 3 * dim + 3 * dim) + (dim * dim + dim)
    mlp = 2 * dim + (dim * 4 * dim + 4 * dim) + (4 * dim * dim + dim)
    head = 2 * dim + dim * num_classes + num_classes
    return patch_embed + dim + tokens * dim + blocks * (attention + mlp) + head


PAPER_MODELS = [(vit_small_6x2, 384, 6, 2), (vit_small_18x2, 384, 18, 2), (vit_base_6x2, 768, 6, 2),
                (vit_base_18x2, 768, 18, 2), (vit_large_12x2, 1024, 12, 2)]


@pytest.mark.parametrize('build, dim, depth, branches', PAPER_MODELS)
def test_named_configuration_has_the_parameters_of_the_sequential_vit(build, dim, depth, branches):
    with torch.device('meta'):
        model = build()
    assert model.pos_embedding.is_meta
    assert len(model.transformer.layers) == depth
    assert all(len(attns.fns) == len(ffs.fns) == branches for attns, ffs in model.transformer.layers)
    assert count(model) == sequential_vit_formula_count(dim, depth * branches)


@pytest.mark.parametrize('build, published_millions', [(vit_small_6x2, 22), (vit_base_6x2, 86)])
def test_twelve_block_models_round_to_deits_published_figures(build, published_millions):
    # DeiT (arXiv 2012.12877) Table 1: DeiT-S 22M, DeiT-B 86M, the sequential 12x1 models; DeiT's table
    # truncates to whole millions (DeiT-Ti's 5.7M is printed 5M)
    with torch.device('meta'):
        model = build()
    assert count(model) // 10 ** 6 == published_millions


@pytest.mark.parametrize('build, timm_count, layer_scale', [
    (vit_small_18x2, 64_665_448, 18 * 2 * 2 * 384),
    (vit_base_18x2, 256_731_880, 18 * 2 * 2 * 768),
])
def test_18x2_models_are_the_released_ones_without_layer_scale(build, timm_count, layer_scale):
    # timm 1.x vit_{small,base}_patch16_18x2_224 (the paper's released checkpoints), counted on the meta
    # device: they add a LayerScale vector to each of the 2 x 2 branches of the 18 blocks
    with torch.device('meta'):
        model = build()
    assert count(model) + layer_scale == timm_count


def test_named_configuration_overrides_and_validation():
    with torch.device('meta'):
        model = parallel_vit('small', 8, 3, num_classes=10)
    assert len(model.transformer.layers[0][0].fns) == 3 and model.mlp_head.out_features == 10
    with pytest.raises(ValueError, match=r"width must be one of \['base', 'large', 'small'\], got 'huge'"):
        parallel_vit('huge', 16)
