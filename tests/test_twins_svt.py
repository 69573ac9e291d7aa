import textwrap

import pytest
import torch
from einops import rearrange

from helpers import count, feature_pyramid, load_fixture, move_off_initialisation
from vit_pytorch import twins_svt
from vit_pytorch.pretrained import CheckpointError, load_timm, load_vit_pytorch
from vit_pytorch.multiscale import PositionEncodingGenerator, SpatialReductionAttention
from vit_pytorch.twins_svt import LocallyGroupedAttention, TwinsSVT


def stage_kwargs(dims=(8, 16, 24, 32), heads=(1, 2, 3, 4), mlp=(2, 2, 4, 4), depths=(2, 3, 1, 2), ks=(4, 2, 1, 1),
                 windows=(5, 4, 2, 2), patches=(4, 2, 2, 2)):
    kwargs = {}
    for i in range(4):
        kwargs.update({f's{i + 1}_emb_dim': dims[i], f's{i + 1}_heads': heads[i], f's{i + 1}_mlp_mult': mlp[i],
                       f's{i + 1}_depth': depths[i], f's{i + 1}_global_k': ks[i],
                       f's{i + 1}_local_patch_size': windows[i], f's{i + 1}_patch_size': patches[i]})
    return kwargs


def tiny(**overrides):
    """Four stages on 32x48 images: maps 8x12, 4x6, 2x3, 1x1; LSA windows 5, 4, 2, 2 that do not divide them."""
    return TwinsSVT(**{'num_classes': 5, **stage_kwargs(), **overrides})


# the face and forward_features' declared layout: tests/test_conformance.py


def test_vit_pytorchs_readme_arguments_build_a_model():
    model = TwinsSVT(num_classes=1000, s1_emb_dim=64, s1_patch_size=4, s1_local_patch_size=7, s1_global_k=7,
                     s1_depth=1, s2_emb_dim=128, s2_patch_size=2, s2_local_patch_size=7, s2_global_k=7, s2_depth=1,
                     s3_emb_dim=256, s3_patch_size=2, s3_local_patch_size=7, s3_global_k=7, s3_depth=5,
                     s4_emb_dim=512, s4_patch_size=2, s4_local_patch_size=7, s4_global_k=7, s4_depth=4,
                     peg_kernel_size=3, dropout=0.)
    assert [len([layer for layer in stage.blocks.layers if not isinstance(layer[0], PositionEncodingGenerator)])
            for stage in model.stages] == [1, 1, 5, 4]
    # heads of 32 channels where none are given, as the paper's SVT
    assert [stage.blocks.layers[0][0].fn.heads for stage in model.stages] == [2, 4, 8, 16]


# the paper's models (counts of the reference implementation, timm 1.0.31's twins_*)


@pytest.mark.parametrize('variant, expected', [
    ('svt_small', 24_060_776), ('svt_base', 56_070_952), ('svt_large', 99_271_400),
    ('pcpvt_small', 24_106_216), ('pcpvt_base', 43_828_456), ('pcpvt_large', 60_989_672)])
def test_named_configuration_parameter_counts(variant, expected):
    with torch.device('meta'):
        model = getattr(twins_svt, f'twins_{variant}')()
    assert count(model) == expected


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match='variant'):
        twins_svt.twins('svt_huge')


# what Twins adds: locally grouped and global sub-sampled attention, alternating, and the PEG


def test_blocks_alternate_local_and_global_with_the_peg_after_the_first():
    model = tiny()
    kinds = [[type(layer[0]).__name__ if isinstance(layer[0], PositionEncodingGenerator) else type(layer[0].fn).__name__
              for layer in stage.blocks.layers] for stage in model.stages]
    assert kinds[1] == ['LocallyGroupedAttention', 'PositionEncodingGenerator', 'SpatialReductionAttention',
                        'LocallyGroupedAttention']
    pcpvt = tiny(**{f's{i}_local_patch_size': None for i in range(1, 5)})
    assert all(isinstance(layer[0], (PositionEncodingGenerator, SpatialReductionAttention)) or
               isinstance(layer[0].fn, SpatialReductionAttention) for stage in pcpvt.stages
               for layer in stage.blocks.layers)


def test_locally_grouped_attention_stays_within_its_window():
    attention = move_off_initialisation(LocallyGroupedAttention(4, 2, window_size=3)).eval()
    x = torch.randn(1, 6 * 6, 4)
    moved = x.clone()
    moved[0, 1 * 6 + 4] += torch.randn(4)           # the token at row 1, column 4: window (0, 1)
    with torch.no_grad():
        changed = (attention(moved, (6, 6)) - attention(x, (6, 6))).abs().amax(-1) > 0
    rows, cols = torch.meshgrid(torch.arange(6), torch.arange(6), indexing='ij')
    assert torch.equal(rearrange(changed[0], '(h w) -> h w', h=6), (rows < 3) & (cols >= 3))


def test_global_attention_lets_every_token_see_every_window():
    attention = move_off_initialisation(SpatialReductionAttention(4, 2, sr_ratio=3)).eval()
    x = torch.randn(1, 6 * 6, 4)
    moved = x.clone()
    moved[0, 0] += torch.randn(4)
    with torch.no_grad():
        changed = (attention(moved, (6, 6)) - attention(x, (6, 6))).abs().amax(-1) > 0
    assert changed.all()


def test_the_peg_gives_positions_from_the_zero_padding():
    # on a constant map the PEG's output differs only where the 3x3 kernel reaches the border
    peg = move_off_initialisation(PositionEncodingGenerator(4, 3)).eval()
    with torch.no_grad():
        out = rearrange(peg(torch.ones(1, 5 * 5, 4), (5, 5)), '1 (h w) d -> h w d', h=5)
    assert torch.allclose(out[1:4, 1:4], out[2, 2].expand(3, 3, 4))
    assert not torch.allclose(out[0, 2], out[2, 2])


# the reference: timm's Twins, tiny, noisy weights (tests/fixtures/make_twins_svt_fixtures.py)


def timm_case(name):
    metadata, state_dict, tensors = load_fixture(name)
    config = metadata['config']
    model = TwinsSVT(num_classes=config['num_classes'], **stage_kwargs(
        dims=config['embed_dims'], heads=config['num_heads'], mlp=config['mlp_ratios'], depths=config['depths'],
        ks=config['sr_ratios'], windows=config.get('wss') or (None,) * 4, patches=(config['patch_size'], 2, 2, 2)))
    return model, metadata, state_dict, tensors


@pytest.mark.parametrize('name', ['timm_twins_svt', 'timm_twins_pcpvt'])
def test_logits_and_feature_maps_equal_timms(name):
    model, _, state_dict, tensors = timm_case(name)
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['logits'], atol=1e-4, rtol=1e-4)
        maps = model.forward_intermediates(tensors['input'])
    assert len(maps) == 4
    for i, found in enumerate(maps):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


def test_feature_pyramid_from_forward_intermediates_has_timms_strides_and_channels():
    model, metadata, _, tensors = timm_case('timm_twins_svt')
    assert [(info['num_chs'], info['reduction']) for info in model.feature_info] == \
        [(info['num_chs'], info['reduction']) for info in metadata['feature_info']]
    img = tensors['input']
    maps = model.forward_intermediates(img)
    width = 8
    pyramid = feature_pyramid(maps, model.feature_info, width)
    for level, info in zip(pyramid, model.feature_info):
        assert level.shape[:2] == (2, width)
        assert all(side == image_side // info['reduction'] for side, image_side in zip(level.shape[-2:], img.shape[-2:]))


def test_forward_intermediates_returns_the_listed_stages():
    # indices None and an int n: tests/test_conformance.py; a list with a negative number: here
    model, _, state_dict, tensors = timm_case('timm_twins_svt')
    model = load_timm(model.eval(), state_dict)
    with torch.no_grad():
        maps = model.forward_intermediates(tensors['input'], indices=[0, -2])
    for found, i in zip(maps, [0, 2], strict=True):
        torch.testing.assert_close(found, tensors[f'feature.{i}'], atol=1e-4, rtol=1e-4)


def test_an_svt_checkpoint_in_a_pcpvt_model_says_what_to_build():
    _, _, state_dict, _ = timm_case('timm_twins_svt')
    model = tiny(**{f's{i}_local_patch_size': None for i in range(1, 5)}, num_classes=7)
    with pytest.raises(CheckpointError, match='s1_local_patch_size set'):
        load_timm(model, state_dict)


# vit-pytorch 1.26.14's TwinsSVT computes another function (tests/fixtures/make_twins_svt_fixtures.py)


def test_vit_pytorch_checkpoint_is_refused_with_what_differs():
    metadata, _, _ = load_fixture('vit_pytorch_1.26.14_twins_svt')
    model = TwinsSVT(**metadata['config'])
    state_dict = {key: torch.zeros(shape) for key, shape in metadata['shapes'].items()}
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"vit-pytorch's TwinsSVT computes another function: its sN_depth counts"):
        load_vit_pytorch(model, state_dict)
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


# errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(s3_heads=5), ValueError, 's3_heads 5 must divide s3_emb_dim 24'),
    (dict(s1_global_k=None), TypeError, 's1_global_k'),
    (dict(peg_kernel_size=2), ValueError, 'peg_kernel_size must be odd'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny(**overrides)


def test_an_image_too_small_for_a_stage_is_refused_with_the_size_that_works():
    with pytest.raises(ValueError, match=r'leaves stage 1 a 3x3 map, smaller than 4 .*at least 16 pixels'):
        tiny()(torch.randn(1, 3, 12, 12))
    with pytest.raises(ValueError, match=r'leaves stage 4 a 0x0 map'):
        tiny()(torch.randn(1, 3, 16, 16))


# the module's example


def test_module_docstring_example_runs_and_says_what_it_gives():
    example = twins_svt.__doc__.split('    import torch', 1)[1].split('\nThe keyword', 1)[0]
    namespace = {}
    exec(textwrap.dedent('    import torch' + example), namespace)
    assert namespace['logits'].shape == (2, 10)
    assert [tuple(m.shape[-2:]) for m in namespace['maps']] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    assert count(namespace['paper_model']) == 24_060_776
