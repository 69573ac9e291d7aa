"""ViT-5 (arXiv 2602.08071): rotary positions on the patches and registers but not the cls token, on top of the
absolute table; the paper's models' sizes; vit-pytorch's weights."""

import pytest
import torch

from helpers import load_fixture, move_off_initialisation, reference_case
from vit_pytorch.pretrained import CheckpointError, load_official, load_vit_pytorch
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


# ViT's arguments, order and defaults against vit-pytorch's (ours adds keyword-only layer_scale_init, rope_layout,
# norm_eps after them): tests/test_vit_pytorch_signatures.py (its fixture)


def test_vit_pytorchs_checkpoint_loads_and_gives_its_output():
    config, state_dict, img, expected = reference_case('vit_pytorch_1.26.14_vit_5')
    model = load_vit_pytorch(ViT(**config), state_dict).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-4, atol=1e-5)


# clear errors


@pytest.mark.parametrize('name, value, error', [('dim_head', 6, ValueError), ('norm_eps', 0., ValueError),
                                                 ('norm_eps', '1e-6', TypeError)])
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


# the official code (wangf3014/ViT-5 @ b7b0796; fixture written by tests/fixtures/make_vit_5_official_fixtures.py,
# run outside this repository)


def official_model(**overrides):
    metadata, state, tensors = load_fixture('vit_5_official')
    config = metadata['config']
    dim = config['embed_dim']
    kwargs = dict(image_size=config['img_size'], patch_size=config['patch_size'], num_classes=config['num_classes'],
                  dim=dim, depth=config['depth'], heads=config['num_heads'], dim_head=dim // config['num_heads'],
                  mlp_dim=int(dim * config['mlp_ratio']), num_registers=config['num_registers'],
                  rope_layout='official', norm_eps=1e-6)
    return ViT(**{**kwargs, **overrides}), state, tensors


def official_outputs(model, tensors):
    with torch.no_grad():
        features = model.forward_features(tensors['input'])
    return features[:, 0], model.forward_head(features)


def float32_rms_norm(self, x):
    """The official code's RMSNorm arithmetic (its formula; models_vit5.py): x / sqrt(mean(x^2) + eps) computed in
    float32 whatever x's dtype, then the gain in x's dtype."""
    h = x.to(torch.float32)
    return self.weight * (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def test_the_official_codes_weights_give_its_outputs_with_its_rope_layout(monkeypatch):
    # Everything but the RMSNorms' float32 arithmetic is the official function: with that arithmetic given to our
    # norms (norm_eps=1e-6, the official epsilon), the float64 outputs from the same float32 weights agree to
    # float64 rounding (1e-12 for outputs of order 1 after two layers; measured 0 on the features, 2.2e-16 on the
    # logits). The rotary layout is what matters: vit-pytorch's, below, changes the outputs by 1e-1.
    model, state, tensors = official_model()
    # the frequencies are buffers the checkpoint carries: ours, built, are the official code's already
    for ours, theirs in (('patch_rotary', 'rope'), ('register_rotary', 'rope_reg')):
        torch.testing.assert_close(model.get_submodule(ours).frequencies,
                                   state[f'blocks.0.attn.{theirs}.freqs'].expand(2, -1), rtol=1e-7, atol=0)
    model = load_official(model, state).double().eval()
    monkeypatch.setattr(torch.nn.RMSNorm, 'forward', float32_rms_norm)
    features, output = official_outputs(model, tensors)
    torch.testing.assert_close(features, tensors['features'], rtol=0, atol=1e-12)
    torch.testing.assert_close(output, tensors['output'], rtol=0, atol=1e-12)


def test_the_official_codes_weights_give_its_outputs_with_its_norms_epsilon_to_their_float32_rounding():
    # Our own norms (float64) with the official epsilon, norm_eps=1e-6: the official norms' float32 rounding
    # (relative 6e-8 a value) is what differs, 2.0e-7 on cls features of size 2.5 and 6.8e-8 on logits of size 1
    # after the two layers (measured). With the dtype's machine epsilon (norm_eps=None) they are 1.1e-4 and 4.6e-5
    # off: the epsilon, not the rounding, was most of the difference
    model, state, tensors = official_model()
    model = load_official(model, state).double().eval()
    features, output = official_outputs(model, tensors)
    torch.testing.assert_close(features, tensors['features'], rtol=0, atol=1e-6)
    torch.testing.assert_close(output, tensors['output'], rtol=0, atol=1e-6)
    model, state, tensors = official_model(norm_eps=None)
    features, _ = official_outputs(load_official(model, state).double().eval(), tensors)
    assert (features - tensors['features']).abs().max() > 1e-5


def test_vit_pytorchs_rope_layout_is_not_the_official_codes_function():
    # the same weights in the default (vit-pytorch's) layout: other patch and register frequencies, other outputs
    official, state, tensors = official_model()
    official = load_official(official, state).double().eval()
    model = ViT(image_size=16, patch_size=4, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32,
                num_registers=4).double().eval()
    ours = {k: v for k, v in official.state_dict().items() if not k.endswith('rotary.frequencies')}
    model.load_state_dict(ours, strict=False)
    with torch.no_grad():
        difference = (model(tensors['input']) - tensors['output']).abs().max()
    assert difference > 1e-2
    with pytest.raises(CheckpointError, match=r"rope_layout='official'"):
        load_official(model, state)
    with pytest.raises(ValueError, match=r"num_registers must be a square number with rope_layout='official'.*3"):
        official_model(num_registers=3)


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow
def test_vit_pytorchs_readme_example_runs():
    """Its README's ViT-5: 256 pixels, patches of 16, width 512, depth 6, 4 registers (13 s on the shared CPU)."""
    model = ViT(image_size=256, patch_size=16, num_classes=1000, dim=512, depth=6, heads=8, mlp_dim=1024,
                dim_head=64, dropout=0.1, emb_dropout=0.1, num_registers=4)
    with torch.no_grad():
        assert model(torch.randn(2, 3, 256, 256)).shape == (2, 1000)
