"""The position embeddings of the ViT paper's ablation (appendix D.4): each kind tested for what defines it."""

import math

import pytest
import torch
from einops import rearrange

from helpers import count, digits_batch, fit_fixed_batch
from vit_pytorch.position_embeddings import KINDS, RelativeAttention, ViT

SMALL = dict(image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, heads=2, dim_head=16, mlp_dim=64,
             channels=1, patch_norm=False)


def small(position, **overrides):
    return ViT(position=position, **{**SMALL, **overrides})


def permute_patches(images, order, grid, patch):
    """`images` (b, c, h, w) with their patches moved: the patch at row-major place order[k] goes to place k."""
    patches = rearrange(images, 'b c (h p1) (w p2) -> b (h w) c p1 p2', p1=patch, p2=patch)
    return rearrange(patches[:, order], 'b (h w) c p1 p2 -> b c (h p1) (w p2)', h=grid[0], w=grid[1])


@pytest.mark.parametrize('pool', ['cls', 'mean'])
def test_none_gives_a_permutation_equivariant_encoder(pool):
    model = small('none', pool=pool).eval()
    images = torch.randn(2, 1, 16, 16)
    order = torch.randperm(16)
    prefix = model.num_prefix_tokens
    with torch.no_grad():
        tokens = model.forward_features(images)
        moved = model.forward_features(permute_patches(images, order, (4, 4), 4))
    torch.testing.assert_close(moved[:, prefix:], tokens[:, prefix:][:, order], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(moved[:, :prefix], tokens[:, :prefix], atol=1e-5, rtol=1e-5)


def test_a_learned_table_breaks_permutation_equivariance():
    # the control: the same check fails as soon as patches know where they are
    model = small('learned').eval()
    images, order = torch.randn(2, 1, 16, 16), torch.randperm(16)
    with torch.no_grad():
        tokens = model.forward_features(images)
        moved = model.forward_features(permute_patches(images, order, (4, 4), 4))
    assert (moved[:, 1:] - tokens[:, 1:][:, order]).abs().max() > 1e-2


def test_the_2d_table_is_a_row_embedding_concatenated_with_a_column_embedding():
    model = small('2d', image_size=(16, 12))                         # a 4x3 grid
    table = model.pos_embedding_for((4, 3))                           # (1 + 12, 32)
    assert table.shape == (13, 32)
    patches = rearrange(table[1:], '(h w) d -> h w d', h=4, w=3)
    for row in range(4):
        for column in range(3):
            expected = torch.cat((model.row_embedding[row], model.column_embedding[column]))
            torch.testing.assert_close(patches[row, column], expected, atol=0, rtol=0)
    # so the first half is the same along a row, the second the same down a column
    assert torch.equal(patches[:, :, :16], patches[:, :1, :16].expand(4, 3, 16))
    assert torch.equal(patches[:, :, 16:], patches[:1, :, 16:].expand(4, 3, 16))


def test_a_smaller_image_gets_the_first_rows_and_columns_of_the_2d_tables():
    model = small('2d', image_size=(16, 12))                         # a 4x3 grid
    table = model.pos_embedding_for((2, 2))                           # an 8x8 image
    patches = rearrange(table[1:], '(h w) d -> h w d', h=2, w=2)
    for row in range(2):
        for column in range(2):
            expected = torch.cat((model.row_embedding[row], model.column_embedding[column]))
            torch.testing.assert_close(patches[row, column], expected, atol=0, rtol=0)
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_relative_positions_take_only_the_full_size():
    # its offsets are counted row-major on the full grid: a smaller grid would give its patches other offsets
    with pytest.raises(ValueError, match=r'img must be 16x16'):
        small('relative')(torch.randn(1, 1, 8, 16))


def test_the_2d_kind_learns_rows_plus_columns_instead_of_a_vector_per_patch():
    learned, factorised = small('learned'), small('2d')
    # learned: (1 + 16) x 32 table; 2d: 4 rows and 4 columns of 16, and the cls token's 32
    assert count(learned) - count(factorised) == 17 * 32 - (4 * 16 + 4 * 16 + 32)
    table = factorised.pos_embedding_for((4, 4))
    table.sum().backward()
    assert factorised.row_embedding.grad is not None and factorised.column_embedding.grad is not None


def test_the_relative_term_depends_only_on_the_query_and_the_offset():
    attention = RelativeAttention(32, 2, 16, num_patches=6, num_prefix_tokens=1)
    q = torch.randn(2, 2, 7, 16)
    bias = attention.relative_logits(q)                               # (2, 2, 7, 7)
    r, scale = attention.relative_embedding.detach(), 16 ** -0.5
    for i in range(6):
        for j in range(6):
            # patch positions are row-major indices 0..5; offset p_q - p_k reads row (i - j) + 5
            expected = q[:, :, 1 + i] @ r[i - j + 5] * scale
            torch.testing.assert_close(bias[:, :, 1 + i, 1 + j], expected)
    assert bias[:, :, 0].abs().max() == 0 and bias[:, :, :, 0].abs().max() == 0   # the cls token has no offset
    # one query everywhere: the term is the same along every diagonal (a function of the offset alone)
    same = attention.relative_logits(q[:, :, :1].expand(2, 2, 7, 16))[:, :, 1:, 1:]
    for offset in range(-5, 6):
        diagonal = torch.diagonal(same, offset=offset, dim1=-2, dim2=-1)
        torch.testing.assert_close(diagonal, diagonal[..., :1].expand_as(diagonal))


def test_the_relative_term_is_added_to_the_logits_before_the_softmax():
    attention = RelativeAttention(32, 2, 16, num_patches=4, num_prefix_tokens=0).eval()
    x = torch.randn(3, 4, 32)
    q, k, v = attention.qkv(x)
    logits = q @ k.transpose(-1, -2) / 4 + attention.relative_logits(q)    # dim_head 16: scale 1/4
    expected = rearrange(logits.softmax(-1) @ v, 'b h n d -> b n (h d)')
    torch.testing.assert_close(attention(x), attention.to_out(expected), atol=1e-5, rtol=1e-5)


def test_relative_attention_has_no_absolute_table_and_one_offset_table_per_layer():
    model = small('relative')
    assert not any(name == 'pos_embedding' for name, _ in model.named_parameters())
    assert model.pos_embedding.abs().max() == 0                      # nothing is added to the tokens
    tables = [name for name, _ in model.named_parameters() if name.endswith('relative_embedding')]
    assert len(tables) == SMALL['depth']
    assert model.transformer.layers[0][0].relative_embedding.shape == (2 * 16 - 1, 16)


def test_sincos_is_the_fixed_2d_formula_and_nothing_is_learned():
    model = small('sincos')
    assert 'pos_embedding' not in dict(model.named_parameters()) and 'pos_embedding' not in model.state_dict()
    table = model.pos_embedding_for((4, 4))[1:]                       # (16, 32): after the cls row
    row, column, quarter = 2, 3, 8                                    # patch (2, 3) is row-major index 11
    omega = 10000 ** -(torch.arange(quarter) / (quarter - 1))
    expected = torch.cat((torch.sin(column * omega), torch.cos(column * omega),
                          torch.sin(row * omega), torch.cos(row * omega)))
    torch.testing.assert_close(table[row * 4 + column], expected)
    assert model.pos_embedding_for((4, 4))[0].abs().max() == 0


@pytest.mark.parametrize('position', KINDS)
def test_every_kind_learns_a_fixed_batch_of_digits(position):
    images, labels = digits_batch(8, size=16)
    torch.manual_seed(0)
    model = small(position, depth=1)
    accuracy, _ = fit_fixed_batch(model, images, labels, max_steps=100)
    assert accuracy == 1.0


@pytest.mark.parametrize('position', ['2d', 'relative'])
@pytest.mark.slow
def test_the_kinds_with_their_own_code_compile_and_take_mean_pooling(position):
    # 'none' and 'sincos' are the core's computation with another table
    model = small(position, pool='mean', depth=1).eval()
    images = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, fullgraph=True)(images), model(images), atol=1e-5, rtol=1e-5)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match='position must be one of'):
        small('rotary')
    with pytest.raises(ValueError, match="dim must be even for position='2d'"):
        small('2d', dim=33)
    with pytest.raises(ValueError, match="multiple of 4 .* position='sincos'"):
        small('sincos', dim=30)
    with pytest.raises(ValueError, match='dynamic_image_size=True needs position'):
        small('relative', dynamic_image_size=True)
    with pytest.raises(ValueError, match='attention cannot be given'):
        small('relative', attention=RelativeAttention)
    with pytest.raises(ValueError, match='image_size'):
        small('relative', image_size=18)


def test_the_docstring_example_runs():
    model = ViT(position='2d', image_size=16, patch_size=4, num_classes=10, dim=64, depth=2, heads=4,
                mlp_dim=128, channels=1)
    assert model(torch.randn(2, 1, 16, 16)).shape == (2, 10)
    assert model.pos_embedding_for((4, 4)).shape == (17, 64)
    assert math.prod(model.grid_size) == 16
