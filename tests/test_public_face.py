"""The small public methods a wrapper (MAE, SimMIM, DINO) composes, the same for ViT and SimpleViT.

`patch_tokens(img)` -> patch tokens before positions; `embed_tokens(patches, grid, indices)` ->
prefix tokens and the given patches with their positions; `transformer(tokens)` -> the encoder
with its final norm; `embed_dim`, the tokens' width. Composed over every patch they are
`forward_features`; over a subset they give exactly the rows of the full embedding that the
subset selects.
"""

import pytest
import torch
from einops import repeat

from helpers import tiny_vit_kwargs
from vit_pytorch import SimpleViT, ViT
from vit_pytorch.distill import DeiT
from vit_pytorch.simple_vit_with_register_tokens import SimpleViT as RegisterViT

MODELS = {
    'vit': lambda: ViT(**tiny_vit_kwargs()),
    'vit_mean': lambda: ViT(**tiny_vit_kwargs(pool='mean')),
    'distillable_vit': lambda: DeiT(**tiny_vit_kwargs()),
    'simple_vit': lambda: SimpleViT(**tiny_vit_kwargs()),
    'simple_vit_with_registers': lambda: RegisterViT(**tiny_vit_kwargs(num_register_tokens=3)),
}


@pytest.mark.parametrize('name', MODELS)
def test_the_pieces_composed_are_forward_features(name):
    model = MODELS[name]().eval()
    img = torch.randn(2, 3, 16, 24)
    grid = model.token_grid(img.shape[-2:])
    tokens = model.transformer(model.embed_tokens(model.patch_tokens(img), grid))
    torch.testing.assert_close(tokens, model.forward_features(img))
    assert tokens.shape[-1] == model.embed_dim == 32


@pytest.mark.parametrize('name', MODELS)
def test_embedding_a_subset_of_patches_gives_the_rows_of_the_full_embedding(name):
    model = MODELS[name]().eval()
    img = torch.randn(2, 3, 16, 24)
    grid, prefix = model.token_grid(img.shape[-2:]), model.num_prefix_tokens
    full = model.embed(img)                                           # (b, prefix + 12, dim)
    keep = torch.stack([torch.randperm(12)[:5] for _ in range(2)])      # a different subset per image
    patches = model.patch_tokens(img)
    visible = patches.gather(1, repeat(keep, 'b k -> b k d', d=patches.shape[-1]))
    subset = model.embed_tokens(visible, grid, indices=keep)
    assert subset.shape == (2, prefix + 5, full.shape[-1])
    torch.testing.assert_close(subset[:, :prefix], full[:, :prefix])
    expected = full[:, prefix:].gather(1, repeat(keep, 'b k -> b k d', d=full.shape[-1]))
    torch.testing.assert_close(subset[:, prefix:], expected)


def test_patch_tokens_carry_no_position():
    # two images whose patches are the same set in another order give the same patch tokens, permuted
    model = ViT(**tiny_vit_kwargs(image_size=(8, 16), patch_size=(8, 8))).eval()
    left, right = torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8)
    tokens = model.patch_tokens(torch.cat((left, right), dim=-1))
    swapped = model.patch_tokens(torch.cat((right, left), dim=-1))
    torch.testing.assert_close(tokens.flip(1), swapped)
    assert not torch.allclose(model.embed(torch.cat((left, right), dim=-1))[:, 1:].flip(1),
                              model.embed(torch.cat((right, left), dim=-1))[:, 1:])
