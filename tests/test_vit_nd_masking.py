"""The N-D causal masks, against masks built explicitly from each token's grid coordinates."""

import itertools

import pytest
import torch

from vit_pytorch.vit_nd_masking import create_nd_block_mask, get_nd_causal_mask_fn, nd_attention, nd_causal_mask_fn


def explicit_mask(grid, causal_dims, *, has_cls, patches_attend_cls=True):
    """mask[q, k] by the definition: a key is allowed when it is no later than the query along every causal
    dimension; the cls token (index 0) attends to all and is attended to by all (or by none)."""
    coordinates = list(itertools.product(*map(range, grid)))          # row-major, dimension 0 outermost
    offset = 1 if has_cls else 0
    n = offset + len(coordinates)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for q, q_at in enumerate(coordinates):
        for k, k_at in enumerate(coordinates):
            mask[offset + q, offset + k] = all(q_at[d] >= k_at[d] for d in causal_dims)
    if has_cls:
        mask[0, :] = True
        mask[:, 0] = patches_attend_cls
        mask[0, 0] = True
    return mask


def dense(grid, causal_dims, **kwargs):
    mask_fn = get_nd_causal_mask_fn(grid, causal_dims, ndim=len(grid), **kwargs)
    return create_nd_block_mask(mask_fn, 2, (1 if kwargs.get('has_cls') else 0) + len(
        list(itertools.product(*map(range, grid)))), device='cpu')


@pytest.mark.parametrize('grid, causal_dims', [((5,), (0,)), ((3, 4), (0,)), ((3, 4), (1,)), ((2, 3, 4), (0, 2)),
                                               ((2, 2, 3, 2), (1, 2, 3)), ((3, 4), ())])
@pytest.mark.parametrize('has_cls', [False, True])
def test_the_mask_allows_exactly_the_keys_no_later_along_any_causal_dimension(grid, causal_dims, has_cls):
    assert torch.equal(dense(grid, causal_dims, has_cls=has_cls), explicit_mask(grid, causal_dims, has_cls=has_cls))


def test_patches_attend_cls_false_keeps_the_cls_token_a_readout():
    ours = dense((3, 4), (0,), has_cls=True, patches_attend_cls=False)
    assert torch.equal(ours, explicit_mask((3, 4), (0,), has_cls=True, patches_attend_cls=False))
    assert ours[0].all() and not ours[1:, 0].any()


def test_an_int_causal_dim_is_that_one_dimension():
    assert torch.equal(dense((3, 4), 1), dense((3, 4), (1,)))


def test_no_causal_dims_gives_no_mask_function():
    assert get_nd_causal_mask_fn((3, 4), None) is None


def test_the_mask_function_takes_scalar_indices_as_flex_attention_passes_them():
    mask_fn = nd_causal_mask_fn((3, 4), (0,), has_cls=True)
    # token 1 + 4 = patch (1, 0); token 1 + 9 = patch (2, 1)
    assert bool(mask_fn(0, 0, torch.tensor(10), torch.tensor(5)))
    assert not bool(mask_fn(0, 0, torch.tensor(5), torch.tensor(10)))


@pytest.mark.parametrize('by', ['block_mask', 'mask_fn'])
def test_nd_attention_is_the_masked_softmax_written_out(by):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 13, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    mask_fn = nd_causal_mask_fn((3, 4), (0, 1), has_cls=True)
    mask = explicit_mask((3, 4), (0, 1), has_cls=True)
    scores = (q @ k.transpose(-1, -2) * 0.3).masked_fill(~mask, float('-inf'))
    expected = scores.softmax(dim=-1) @ v
    out = nd_attention(q, k, v, **({'block_mask': create_nd_block_mask(mask_fn, 3, 13, 'cpu')} if by == 'block_mask'
                                   else {'mask_fn': mask_fn}), scale=0.3)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_nd_attention_without_a_mask_is_full_attention_at_the_default_scale():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    expected = (q @ k.transpose(-1, -2) * 8 ** -0.5).softmax(dim=-1) @ v
    torch.testing.assert_close(nd_attention(q, k, v), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('causal_dims, error', [(2, ValueError), ((0, -1), ValueError), ((0, 0), ValueError),
                                                (0.5, TypeError), ((True,), TypeError)])
def test_a_bad_causal_dim_is_refused_by_name(causal_dims, error):
    with pytest.raises(error, match='causal_dims'):
        get_nd_causal_mask_fn((3, 4), causal_dims, ndim=2)


def test_the_masks_are_vit_pytorchs_on_its_fixture():
    """vit-pytorch 1.26.14's `get_nd_causal_mask_fn` evaluated on every (query, key) pair of grids of 1 to 4
    dimensions, one, several or every dimension causal, with and without cls
    (tests/fixtures/make_vit_nd_masking_fixtures.py); ours, through the same calls, gives the same masks."""
    from helpers import load_fixture
    metadata, _, masks = load_fixture('vit_pytorch_1.26.14_vit_nd_masking')
    assert len(masks) == len(metadata['cases']) == 7
    for name, (grid, causal_dims, has_cls) in metadata['cases'].items():
        causal_dims = causal_dims if isinstance(causal_dims, int) else tuple(causal_dims)
        expected = masks[name].bool()
        assert 0 < expected.sum() < expected.numel(), name          # a mask that allows some pairs and not others
        assert torch.equal(dense(tuple(grid), causal_dims, has_cls=has_cls), expected), name
