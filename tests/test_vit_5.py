"""ViT-5 (arXiv 2602.08071): rotary positions on the patches and registers but not the cls token, on top of the
absolute table; the paper's models' sizes; vit-pytorch's weights."""

import inspect

import pytest
import torch

from helpers import move_off_initialisation, reference_case
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.recorder import Recorder
from vit_pytorch.vit_5 import CONFIGS, ViT, vit_5

TINY = dict(image_size=16, patch_size=4, num_classes=5, dim=16, depth=1, heads=2, dim_head=8, mlp_dim=32)


def test_the_cls_token_is_not_turned_the_registers_by_their_own_sequence_the_patches_by_row_and_column():
    """Angles of pair p of a head of 8 channels (4 pairs): register i at i * 100^(-2p / 8) over all 4 pairs; the
    patch in row r, column c at r * 100000^(-2p / 4) on pairs 0, 1 and c * 100000^(-2p / 4) on pairs 2, 3 (the
    frequencies of vit-pytorch; the official code's are in the module's docstring)."""
    model = ViT(**TINY, num_registers=3).double()
    angles = model.rotary_angles((2, 3))                     # 1 + 3 + 6 tokens, 4 pairs
    register = torch.tensor([100 ** (-2 * p / 8) for p in range(4)], dtype=torch.float64)
    patch = torch.tensor([100000 ** (-2 * p / 4) for p in range(2)], dtype=torch.float64)
    expected = torch.stack([torch.zeros(4, dtype=torch.float64)]
                           + [i * register for i in range(3)]
                           + [torch.cat((r * patch, c * patch)) for r in range(2) for c in range(3)])
    torch.testing.assert_close(angles, expected, rtol=1e-6, atol=1e-6)     # the frequencies are float32 buffers


def test_the_registers_angles_do_not_depend_on_the_image_size():
    model = ViT(**TINY, num_registers=3)
    torch.testing.assert_close(model.rotary_angles((4, 4))[:4], model.rotary_angles((2, 3))[:4], rtol=0, atol=0)


def test_attention_between_equal_patches_depends_only_on_their_offset():
    """With the absolute table at 0 and a constant image, every patch token enters the first layer alike: the
    logit between patches i and j minus patch i's with itself, log p_ij - log p_ii, is a function of (r_i - r_j,
    c_i - c_j) alone (RoPE's relative positions), whatever the rows and columns themselves."""
    torch.manual_seed(0)
    model = move_off_initialisation(ViT(**TINY, num_registers=2)).double().eval()
    with torch.no_grad():
        model.pos_embedding.zero_()
    recorder = Recorder(model)
    with torch.no_grad():
        recorder(torch.ones(1, 3, 16, 16, dtype=torch.float64))
    logits = recorder.maps[0][0, :, 3:, 3:].log()                  # (heads, 16, 16): patch queries and keys
    relative = logits - logits.diagonal(dim1=-2, dim2=-1)[..., None]
    by_offset = {}
    for i in range(16):
        for j in range(16):
            by_offset.setdefault((i // 4 - j // 4, i % 4 - j % 4), []).append(relative[:, i, j])
    assert len(by_offset) == 49
    for offset, values in by_offset.items():
        for value in values[1:]:
            torch.testing.assert_close(value, values[0], rtol=1e-9, atol=1e-9, msg=str(offset))
    assert not torch.allclose(by_offset[(0, 1)][0], by_offset[(1, 0)][0])


def test_the_layer_scales_start_at_the_papers_1e_4():
    model = ViT(**TINY)
    scales = [branch.scale for layer in model.transformer.layers for branch in layer]
    assert all(torch.equal(scale, torch.full((16,), 1e-4)) for scale in scales)


# the paper's models, against the official code (tests/fixtures/count_official_vit_5.py)

OFFICIAL_COUNTS = {'S': 22_039_144, 'B': 86_543_080, 'L': 304_258_024, 'XL': 448_505_128}


@pytest.mark.parametrize('variant', sorted(CONFIGS))
def test_a_paper_model_has_the_official_codes_parameters_and_vit_pytorchs_position_rows_of_cls_and_registers(
        variant):
    with torch.device('meta'):
        model = vit_5(variant)
    extra_rows = (1 + 4) * model.embed_dim            # vit-pytorch's table covers the cls token and 4 registers too
    assert sum(p.numel() for p in model.parameters()) == OFFICIAL_COUNTS[variant] + extra_rows


# vit-pytorch 1.26.14's module (tests/fixtures/make_rope_fixtures.py)


def test_it_takes_vit_pytorchs_arguments_and_defaults_and_one_more_keyword():
    """vit-pytorch 1.26.14's `vit_5.ViT.__init__`, written out from its source; `layer_scale_init` is ours."""
    required = inspect.Parameter.empty
    theirs = [('image_size', required), ('patch_size', required), ('num_classes', required), ('dim', required),
              ('depth', required), ('heads', required), ('mlp_dim', required), ('channels', 3), ('dim_head', 64),
              ('dropout', 0.), ('emb_dropout', 0.), ('num_registers', 4)]
    ours = [(name, p.default) for name, p in inspect.signature(ViT.__init__).parameters.items()][1:]
    assert ours == theirs + [('layer_scale_init', 1e-4)]


def test_vit_pytorchs_checkpoint_loads_and_gives_its_output():
    config, state_dict, img, expected = reference_case('vit_pytorch_1.26.14_vit_5')
    model = load_vit_pytorch(ViT(**config), state_dict).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-4, atol=1e-5)


# clear errors


@pytest.mark.parametrize('name, value, error', [('dim_head', 6, ValueError)])
def test_a_bad_argument_is_refused_by_name(name, value, error):
    with pytest.raises(error, match=name):
        ViT(**{**TINY, name: value})


def test_an_unknown_variant_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"variant must be one of \['B', 'L', 'S', 'XL'\], got 'M'"):
        vit_5('M')


def test_a_checkpoint_of_a_deeper_model_is_refused_naming_the_keys_no_layer_takes():
    config, state_dict, _, _ = reference_case('vit_pytorch_1.26.14_vit_5')
    refusal = r"no part of this ViT-5 takes transformer\.layers\.1\..*build it with the checkpoint's depth"
    with pytest.raises(CheckpointError, match=refusal):
        load_vit_pytorch(ViT(**{**config, 'depth': 1}), state_dict)


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow
def test_vit_pytorchs_readme_example_runs():
    """Its README's ViT-5: 256 pixels, patches of 16, width 512, depth 6, 4 registers (13 s on the shared CPU)."""
    model = ViT(image_size=256, patch_size=16, num_classes=1000, dim=512, depth=6, heads=8, mlp_dim=1024,
                dim_head=64, dropout=0.1, emb_dropout=0.1, num_registers=4)
    with torch.no_grad():
        assert model(torch.randn(2, 3, 256, 256)).shape == (2, 1000)
