"""PatchMerger (Renggli et al., arXiv 2202.12015): what the paper adds to the ViT, and vit-pytorch's checkpoints."""

import pytest
import torch
import torch.nn.functional as F

from helpers import load_fixture, move_off_initialisation, reference_case
from vit_pytorch.pretrained import load_vit_pytorch
from vit_pytorch.recorder import Recorder
from vit_pytorch.vit_with_patch_merger import PatchMerger, ViT

SMALL = dict(image_size=(16, 24), patch_size=4, num_classes=5, dim=16, depth=4, heads=2, dim_head=8, mlp_dim=24,
             patch_merge_layer=2, patch_merge_num_tokens=3)


def merger(seed=0, dim=16, k=4):
    torch.manual_seed(seed)
    return move_off_initialisation(PatchMerger(dim=dim, num_tokens_out=k), seed=seed, scale=0.3).eval()


# the paper's idea


@pytest.mark.parametrize('seed', range(3))
def test_the_merger_output_does_not_depend_on_the_order_of_its_input_tokens(seed):
    tokens = torch.randn(2, 20, 16, generator=torch.Generator().manual_seed(seed))
    permutation = torch.randperm(20, generator=torch.Generator().manual_seed(seed + 10))
    module = merger(seed)
    with torch.no_grad():
        # the same sum in another order: equal up to float32 rounding of a 20-term sum
        torch.testing.assert_close(module(tokens[:, permutation]), module(tokens), rtol=1e-5, atol=1e-6)


def test_each_merged_token_is_a_weighted_average_of_the_normed_tokens():
    """The weights are a softmax over the tokens (they sum to 1): identical tokens merge into that token, normed."""
    token = torch.randn(1, 1, 16, generator=torch.Generator().manual_seed(0))
    module = merger()
    with torch.no_grad():
        merged = module(token.expand(2, 9, 16))
        expected = F.layer_norm(token, (16,), module.norm.weight, module.norm.bias).expand(2, 4, 16)
    torch.testing.assert_close(merged, expected, rtol=1e-5, atol=1e-6)


def test_the_weights_are_the_queries_softmax_over_the_tokens():
    """softmax(queries . LayerNorm(x) / sqrt(dim)) LayerNorm(x), written out."""
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(1))
    module = merger(1)
    with torch.no_grad():
        normed = F.layer_norm(x, (16,), module.norm.weight, module.norm.bias)
        weights = torch.softmax(torch.einsum('kd,bnd->bkn', module.queries, normed) / 16 ** 0.5, dim=-1)
        torch.testing.assert_close(module(x), torch.einsum('bkn,bnd->bkd', weights, normed), rtol=1e-5, atol=1e-6)


def test_the_layers_after_the_merge_see_k_tokens():
    torch.manual_seed(0)
    model = ViT(**SMALL).eval()
    with torch.no_grad():
        shapes = [tuple(out.shape) for out in model.forward_intermediates(torch.randn(2, 3, 16, 24))]
    # layer 2 merges: its block output and every later one have 3 tokens, the earlier ones the 24 patches
    assert shapes == [(2, 24, 16), (2, 3, 16), (2, 3, 16), (2, 3, 16)]


def test_the_merge_is_halfway_by_default():
    torch.manual_seed(0)
    model = ViT(**{**SMALL, 'depth': 6, 'patch_merge_layer': None}).eval()
    with torch.no_grad():
        counts = [out.shape[1] for out in model.forward_intermediates(torch.randn(1, 3, 16, 24))]
    assert counts == [24, 24, 3, 3, 3, 3]


def test_the_recorder_sees_the_merge_weights():
    torch.manual_seed(0)
    model = ViT(**SMALL).eval()
    with torch.no_grad():
        _, maps = Recorder(model)(torch.randn(2, 3, 16, 24))
    # in order: two layers over the 24 patches, the merge's weights, two layers over the 3 merged tokens
    assert [tuple(m.shape) for m in maps] == [(2, 2, 24, 24)] * 2 + [(2, 1, 3, 24)] + [(2, 2, 3, 3)] * 2


# vit-pytorch's checkpoints


def test_loads_vit_pytorchs_checkpoint_and_gives_its_output():
    config, state_dict, x, output = reference_case('vit_pytorch_1.26.14_vit_with_patch_merger', 'image_size')
    torch.manual_seed(1)
    model = load_vit_pytorch(ViT(**config), state_dict).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), output, rtol=1e-5, atol=1e-5)


def test_loads_vit_pytorchs_patch_merger_and_gives_its_output():
    metadata, _, tensors = load_fixture('vit_pytorch_1.26.14_vit_with_patch_merger')
    module = PatchMerger(**metadata['merger_config']).eval()
    module.load_state_dict({key.removeprefix('merger.'): value for key, value in tensors.items()
                            if key.startswith('merger.')}, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(module(tensors['merger_input']), tensors['merger_output'], rtol=1e-5, atol=1e-5)


# clear errors


@pytest.mark.parametrize('changes, words', [
    (dict(patch_merge_layer=5), 'patch_merge_layer must be a layer of the encoder, 1 to depth=4'),
    (dict(depth=1, patch_merge_layer=None), 'pass patch_merge_layer=1'),
])
def test_a_merge_layer_outside_the_encoder_is_refused_by_name(changes, words):
    with pytest.raises(ValueError, match=words):
        ViT(**{**SMALL, **changes})


def test_the_merger_refuses_tokens_of_another_width():
    with pytest.raises(ValueError, match=r'PatchMerger takes tokens \(batch, tokens, 16\), got \(2, 5, 8\)'):
        merger()(torch.randn(2, 5, 8))


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                  # the README's model: 1024 wide, 12 layers (about 5 s)
def test_vit_pytorchs_readme_example_runs():
    v = ViT(image_size=256, patch_size=16, num_classes=1000, dim=1024, depth=12, heads=8, patch_merge_layer=6,
            patch_merge_num_tokens=8, mlp_dim=2048, dropout=0.1, emb_dropout=0.1)
    assert v(torch.randn(4, 3, 256, 256)).shape == (4, 1000)


@pytest.mark.slow                 # vit-pytorch's own sizes: seconds on 2 cores
def test_vit_pytorchs_readme_patch_merger_example_runs():
    merger_module = PatchMerger(dim=1024, num_tokens_out=8)
    assert merger_module(torch.randn(4, 256, 1024)).shape == (4, 8, 1024)
