"""vit-pytorch 1.26.14's names at its import paths, with its signatures, for the research long tail (issues 26-28).

tests/fixtures/vit_pytorch_1.26.14_signatures.json (tests/fixtures/make_vit_pytorch_signature_fixtures.py, run in a
vit-pytorch 1.26.14 environment) holds every public class and function of each of vit-pytorch's modules with its
parameters (a class's: its constructor's). For the 37 modules of LONG_TAIL this checks:

- every name of vit-pytorch's module is importable from ours at the same path, unless it is one of vit-pytorch's
  one-line utilities (UTILITIES), a layer of its model (LAYERS), or named in NOT_PROVIDED with the reason;
- the drop-in rule for every name ours has there: ours takes vit-pytorch's parameters with the same names, in the
  same order, with the same defaults (compared as repr); each positional parameter of vit-pytorch's is positional
  here at the same place (one keyword-only there may be positional here: every call of vit-pytorch's still
  works); ours may add parameters only after vit-pytorch's last one, and only keyword-only ones (or a trailing
  **kwargs). A name that differs is in SIGNATURE_DIFFERS with the reason (where vit-pytorch contradicts the paper
  or its layer is built otherwise here);
- the names the long-tail audit found missing give vit-pytorch's outputs (the fixture's `calls`).

Exception: vit-pytorch's vaat imports torchaudio, and its dino, es_vit, lejepa and levjepa import torchvision, which
its environment lacks; the fixture script read those modules with empty stand-ins for the two packages (they are used
only inside functions), so their names and signatures are vit-pytorch's own, but vaat's code was not run (no `calls`
of it). Of vit-pytorch's other 47 modules the fixture covers, the main class of each of the 38 that
vit_pytorch_1.26.14_default_keys.json builds (the model at that path) is checked by the same rule (OTHER_MAIN_DIFFERS
names the exceptions); their other names are not checked here.
"""

import importlib
import json
import math
import sys

import pytest
import torch

from helpers import FIXTURES

sys.path.insert(0, str(FIXTURES))
from make_vit_pytorch_signature_fixtures import inputs, parameters  # noqa: E402  (the script's own reading)

FIXTURE = json.loads((FIXTURES / 'vit_pytorch_1.26.14_signatures.json').read_text())
MAIN_CLASSES = {module: entry['class'] for module, entry in
                json.loads((FIXTURES / 'vit_pytorch_1.26.14_default_keys.json').read_text())['models'].items()}

LONG_TAIL = (
    'ats_vit', 'vit_with_patch_merger', 'look_vit', 'jumbo_vit', 'vit_detpool', 'simple_vit_with_specialized_cls',
    'simple_vit_with_fft', 'simple_vit_with_relative_proj_pos_bias', 'vit_with_decorr', 'mp3', 'vit_5',
    'normalized_vit', 'rvt', 'local_vit', 'vit_with_keel_post_ln', 'simple_vit_with_value_residual',
    'simple_vit_with_hyper_connections', 'simple_vit_orthog_residual_update', 'simple_vit_attn_residual',
    'attn_residual_with_dca_simple_vit', 'simple_vit_with_sparse_gating', 'simple_uvit', 'jet_vit', 'looped_vit',
    'es_vit', 'lejepa', 'levjepa', 'levjepa_nd', 'vit_nd', 'vit_nd_rotary', 'vit_nd_pope', 'vit_nd_masking',
    'vivit_with_moss', 'vat', 'vaat', 'vat_siglip', 'wwt')

# vit-pytorch's one-line utilities, written again in each of its files (`exists(v)`: v is not None, `default(v, d)`,
# `pair(t)`, `divisible_by(n, d)`, ...): ours keeps one copy in vit.py. One that ours has at the path is checked.
UTILITIES = {'exists', 'default', 'pair', 'divisible_by', 'log', 'l2norm', 'l1norm', 'ensure_tuple', 'join', 'last',
             'is_odd', 'is_empty', 'cast_tuple', 'singleton', 'pack_with_inverse'}

# the layers of vit-pytorch's models: ours builds each model from vit.py's shared blocks (vit.Attention,
# vit.FeedForward, vit.Stack, nn.LayerNorm ...), and `load_vit_pytorch` maps its keys onto them. One that ours has
# at the path (a layer of its own) is checked.
LAYERS = {'Attention', 'FeedForward', 'Transformer', 'LayerNorm', 'MLP', 'Residual', 'ExcludeCLS', 'DepthWiseConv2d',
          'GEGLU', 'FiLM', 'L2Norm', 'Sequential', 'AttentionResidual'}

SINCOS = 'posemb_sincos_2d: one copy, vit_pytorch.simple_vit.posemb_sincos_2d'
ROTATE = 'rotate_every_two: one copy, vit.rotate (turns channel pairs by angles)'
DINO_MACHINERY = ("vit-pytorch's DINO training machinery, written again in each self-distillation file: ours is "
                  "vit_pytorch.dino's (SelfDistillation's EMA and centring, ProjectionHead, MultiCrop), shared")

# module -> {name vit-pytorch has there that ours does not: why}
NOT_PROVIDED = {
    'ats_vit': {'batched_index_select': "its sampler's gather: ours is torch.gather inside AdaptiveTokenSampling",
                'sample_gumbel': "its sampler's noise: ours draws it inside AdaptiveTokenSampling"},
    'attn_residual_with_dca_simple_vit': {'posemb_sincos_2d': SINCOS},
    'es_vit': dict.fromkeys(('EMA', 'NetWrapper', 'RandomApply', 'get_module_device', 'set_requires_grad',
                             'update_moving_average'), DINO_MACHINERY),
    'jet_vit': {'JetViTLinearAttention': 'ours is jet_vit.LinearAttention, chosen per layer by AttentionChoice',
                'RandomLayerSelector': 'ours is jet_vit.AttentionChoice (a fixed choice per layer, attn_layers)',
                'linear_attn': "the linear attention's function: inside jet_vit.LinearAttention"},
    'jumbo_vit': {'posemb_sincos_2d': SINCOS},
    'lejepa': dict.fromkeys(('EMA', 'NetWrapper', 'RandomApply', 'get_module_device', 'set_requires_grad',
                             'update_moving_average'), DINO_MACHINERY),
    'levjepa': {'RandomApply': 'ours: PhotometricAugment applies each jitter with its probability',
                'RandomVideoCrop': 'ours: levjepa.video_crop, one crop per clip, the same for all its frames',
                'VideoRotaryEmbedding': 'ours: vit.AxialRotaryEmbedding with levjepa.video_frequencies',
                'apply_rotary': ROTATE, 'rotate_every_two': ROTATE,
                'augment_video': 'ours: NormalizeVideo / PhotometricAugment take the whole clip',
                'create_block_causal_mask_fn': "flex attention's mask function: ours is the dense "
                                               "levjepa.block_causal_mask (no flex attention here)",
                'create_block_mask_for': 'flex attention: ours has none (levjepa.block_causal_mask)'},
    'levjepa_nd': {'NDRotaryEmbedding': 'ours: vit.AxialRotaryEmbedding over the N axes',
                   'apply_rotary': ROTATE, 'rotate_every_two': ROTATE,
                   'causal_condition': "flex attention's mask function: ours is the dense levjepa_nd.causal_mask",
                   'create_nd_block_causal_mask_fn': "flex attention's mask function: ours is the dense "
                                                     "levjepa_nd.causal_mask",
                   'dense_nd_mask': 'ours: levjepa_nd.causal_mask',
                   'flex_attention_supported': "vit-pytorch's levjepa_nd imports it from vit_nd_masking; a model "
                                               "module here builds on one other alone (levjepa): import it from "
                                               "vit_nd_masking",
                   'nd_attention': "its (q, k, v, block_mask, dense_mask) attention: ours is vit.attend with the "
                                   "dense mask (vit_nd_masking.nd_attention is vit-pytorch's other nd_attention)"},
    'mp3': {'posemb_sincos_2d': SINCOS},
    'rvt': {'rotate_every_two': ROTATE},
    'simple_uvit': {'posemb_sincos_2d': SINCOS},
    'simple_vit_attn_residual': {'posemb_sincos_2d': SINCOS},
    'simple_vit_orthog_residual_update': {'posemb_sincos_2d': SINCOS},
    'simple_vit_with_fft': {'posemb_sincos_2d': SINCOS},
    'simple_vit_with_hyper_connections': {'posemb_sincos_2d': SINCOS},
    'simple_vit_with_relative_proj_pos_bias': {
        'posemb_sincos_2d': SINCOS,
        'embed_small_init': "its initialiser of the bias banks: ours initialises them in RelativeProjPositionalBias"},
    'simple_vit_with_sparse_gating': {'posemb_sincos_2d': SINCOS},
    'simple_vit_with_specialized_cls': {'posemb_sincos_2d': SINCOS},
    'simple_vit_with_value_residual': {'posemb_sincos_2d': SINCOS},
    'vaat': {'posemb_sincos_2d': SINCOS},
    'vat_siglip': {'SigLIP': 'the tower: ours is a vit.ViT built from the siglip_* arguments (SigLIPVAT.vit)'},
    'vit_5': {'AxialRotaryEmbedding': "ours: vit.AxialRotaryEmbedding (ViT.patch_rotary, ViT.register_rotary), "
                                      "its frequencies under vit-pytorch's bases",
              'rotate_every_two': ROTATE},
    'vit_detpool': {'masked_mean': "the pooling's function: inside ViTDetPool's pooling"},
    'vit_nd_pope': {'GoldenGatePoPENd': 'ours: vit_nd_pope.polar with vit_nd direction tables',
                    'apply_polar_pos_emb': 'ours: inside vit_nd_pope.Attention',
                    'make_directions': "ours: the direction tables of vit_nd (the golden-gate directions)"},
    'vit_nd_rotary': {'GoldenGateRoPENd': 'ours: vit.AxialRotaryEmbedding(mixed=True) with vit_nd direction tables',
                      'make_directions': "ours: the direction tables of vit_nd (the golden-gate directions)"},
}

# (module, name) -> why ours takes other parameters than vit-pytorch's
SIGNATURE_DIFFERS = {
    ('jet_vit', 'SqueezeDynamicConv'): "a layer: ours takes the grid as one (h, w) `grid` for vit-pytorch's h_s, w_s",
    ('jet_vit', 'WindowAttention'): "a layer: ours takes the grid as one (h, w) `grid` for vit-pytorch's h_s, w_s",
    ('look_vit', 'posemb_sincos_2d'): "simple_vit's posemb_sincos_2d(h, w, dim), which ours imports to use; "
                                      "vit-pytorch's look_vit has its own of a feature map `t`",
    ('normalized_vit', 'Attention'): "a layer: vit.Attention's (dim, heads, dim_head, dropout) order",
    ('normalized_vit', 'FeedForward'): "a layer: vit.FeedForward's (dim, hidden_dim, dropout)",
    ('rvt', 'Attention'): 'a layer: rotation is the model\'s choice (RvT hands every layer its angles or None), '
                          'the query kernel the constant rvt.CONV_QUERY_KERNEL',
    ('rvt', 'SpatialConv'): 'a layer: the depthwise-separable query convolution, (dim, inner_dim, kernel)',
    ('simple_vit_orthog_residual_update', 'SimpleViT'): 'orthog_residual_update_kwargs=None for no options, not a '
                                                         'mutable {} default: the same call meaning',
    ('simple_vit_orthog_residual_update', 'Transformer'): 'orthog_residual_update_kwargs=None for no options, not '
                                                           'a mutable {} default: the same call meaning',
    ('simple_vit_with_sparse_gating', 'Transformer'): "a layer: the gate's width and the register count are its "
                                                      "attention's (GatedAttention), not the stack's",
}


def parse(listed):
    """(name, 'positional' | 'keyword' | 'var_positional' | 'var_keyword', default or None) of each parameter written
    as the fixture writes them."""
    found, kind = [], 'positional'
    for entry in listed:
        if entry == '/':
            continue
        if entry == '*':
            kind = 'keyword'
        elif entry.startswith('**'):
            found.append((entry[2:], 'var_keyword', None))
        elif entry.startswith('*'):
            found.append((entry[1:], 'var_positional', None))
            kind = 'keyword'
        else:
            name, equals, default = entry.partition('=')
            found.append((name, kind, default if equals else None))
    return found


def drop_in_differences(theirs, ours):
    """What keeps a call of vit-pytorch's from meaning the same with ours (see the module docstring); [] if none."""
    theirs, ours = parse(theirs), parse(ours)
    for index, (their, our) in enumerate(zip(theirs, ours)):
        if their[0] != our[0] or their[2] != our[2]:
            return [f'parameter {index}: vit-pytorch {their}, ours {our}']
        if their[1] != our[1] and not (their[1] == 'keyword' and our[1] == 'positional'):
            return [f'parameter {index}: vit-pytorch {their}, ours {our}']
    if len(ours) < len(theirs):
        return [f'ours lacks {theirs[len(ours):]}']
    extra = [our for our in ours[len(theirs):] if our[1] not in ('keyword', 'var_keyword')]
    return [f'ours adds {extra} that are not keyword-only'] if extra else []


def test_the_fixture_is_vit_pytorchs_and_covers_the_long_tail():
    assert FIXTURE['vit_pytorch'] == '1.26.14' and FIXTURE['torch'].startswith('2.13.0')
    assert len(FIXTURE['modules']) == 84 and len(LONG_TAIL) == 37 and set(LONG_TAIL) <= set(FIXTURE['modules'])
    assert FIXTURE['stand_ins'] == ['torchvision', 'torchaudio']
    assert set(NOT_PROVIDED) <= set(LONG_TAIL) and {module for module, _ in SIGNATURE_DIFFERS} <= set(LONG_TAIL)
    assert len(set(MAIN_CLASSES) - set(LONG_TAIL)) == 38 and set(MAIN_CLASSES) <= set(FIXTURE['modules'])


@pytest.mark.parametrize('module', LONG_TAIL)
def test_every_name_of_vit_pytorchs_module_is_importable_here_or_listed(module):
    ours = importlib.import_module(f'vit_pytorch.{module}')
    missing = {name for name in FIXTURE['modules'][module] if not hasattr(ours, name)}
    listed = NOT_PROVIDED.get(module, {})
    assert missing - UTILITIES - LAYERS == set(listed), (
        f'{module}: missing and not listed {sorted(missing - UTILITIES - LAYERS - set(listed))}, '
        f'listed but present {sorted(set(listed) - missing)}')


@pytest.mark.parametrize('module', LONG_TAIL)
def test_every_name_here_takes_vit_pytorchs_parameters(module):
    ours = importlib.import_module(f'vit_pytorch.{module}')
    differing = {}
    for name, (kind, _, theirs) in FIXTURE['modules'][module].items():
        if hasattr(ours, name):
            assert kind == ('class' if isinstance(getattr(ours, name), type) else 'function'), f'{module}.{name}'
            found = drop_in_differences(theirs, parameters(getattr(ours, name)))
            if found:
                differing[name] = found
    listed = {name for listed_module, name in SIGNATURE_DIFFERS if listed_module == module}
    assert set(differing) == listed, (f'{module}: differing and not listed '
                                      f'{ {name: differing[name] for name in set(differing) - listed} }, '
                                      f'listed but the same {sorted(listed - set(differing))}')


# (module, main class) outside the long tail -> why ours takes other parameters than vit-pytorch's
OTHER_MAIN_DIFFERS = {
    ('cct', 'CCT'): "vit-pytorch's *args, **kwargs go on to its TransformerClassifier; ours names those arguments, "
                    "keyword-only (test_vit_pytorch_dropin.py: test_cct_keeps_the_transformers_arguments_keyword_only)",
    ('cct_3d', 'CCT'): "vit-pytorch's *args, **kwargs go on to its TransformerClassifier; ours names those "
                       "arguments, keyword-only",
    ('distill', 'DistillableViT'): "vit-pytorch's *args, **kwargs go on to its ViT, whose arguments are keyword-only; "
                                   "ours takes those of ViT, keyword-only",
    ('nest', 'NesT'): "dim_head=None: vit-pytorch's 64 is unused there (its heads are dim / heads wide); ours refuses "
                      "a dim_head it would not use (test_vit_pytorch_dropin.py: test_an_unused_dim_head_is_refused)",
    ('scalable_vit', 'ScalableViT'): "dim and the arguments vit-pytorch requires default to the paper's ScalableViT-S "
                                     "(the module docstring); every call of vit-pytorch's passes them",
    ('sep_vit', 'SepViT'): "dim, depth and heads, which vit-pytorch requires, default to the paper's SepViT-T "
                           "(CONFIGS 'tiny'); every call of vit-pytorch's passes them",
    ('twins_svt', 'TwinsSVT'): "vit-pytorch's TwinsSVT computes another function (the module docstring): the "
                               "defaults are the paper's Twins-SVT-S, sN_global_k 8, 4, 2, 1 for its 7 in every stage",
}


def constructor_parameters(cls):
    """The parameters of `cls(...)`, read at the first class of its MRO whose constructor names them (DeepViT's
    passes **kwargs on to vit.ViT's)."""
    for klass in cls.__mro__:
        if '__init__' in vars(klass):
            found = parameters(klass.__init__)[1:]
            if not all(entry.startswith('*') and entry != '*' for entry in found):
                return found
    raise AssertionError(f'{cls.__name__} names no parameter')


@pytest.mark.parametrize('module', sorted(set(MAIN_CLASSES) - set(LONG_TAIL)))
def test_the_main_class_of_every_other_module_takes_vit_pytorchs_parameters(module):
    name = MAIN_CLASSES[module]
    ours = getattr(importlib.import_module(f'vit_pytorch.{module}'), name)
    found = drop_in_differences(FIXTURE['modules'][module][name][2], constructor_parameters(ours))
    assert bool(found) == ((module, name) in OTHER_MAIN_DIFFERS), f'{module}.{name}: {found}'


def test_the_rule_accepts_keyword_only_additions_and_refuses_the_rest():
    theirs = ['dim', 'heads=8', '*', 'dropout=0.0']
    assert drop_in_differences(theirs, ['dim', 'heads=8', 'dropout=0.0', '*', 'eps=1e-05', '**kwargs']) == []
    for ours in (['dim', 'heads=4', '*', 'dropout=0.0'],                           # another default
                 ['dim', 'dropout=0.0', '*', 'heads=8'],                           # another order
                 ['dim', '*', 'heads=8', 'dropout=0.0'],                           # positional made keyword-only
                 ['dim', 'heads=8']):                                              # a parameter less
        assert drop_in_differences(theirs, ours), ours
    assert drop_in_differences(['dim', 'heads=8'], ['dim', 'heads=8', 'eps=1e-05'])      # a positional addition


# the names the audit found missing, called as vit-pytorch's (the fixture's `calls`: its outputs on the same input)
CALLS = FIXTURE['calls']


@pytest.mark.parametrize('module', ['levjepa', 'levjepa_nd'])
def test_sigreg_loss_is_vit_pytorchs(module):
    sigreg_loss = importlib.import_module(f'vit_pytorch.{module}').sigreg_loss
    torch.manual_seed(0)                        # the directions are drawn as vit-pytorch's: randn(dim, num_proj)
    value = sigreg_loss(inputs(2, 16, 8), num_proj=32, knots=5)
    assert math.isclose(value.item(), CALLS[f'{module}.sigreg_loss'][0], rel_tol=1e-5)


def test_rvt_axial_rotary_embedding_is_vit_pytorchs():
    from vit_pytorch.rvt import AxialRotaryEmbedding

    shape, sin, cos = CALLS['rvt.AxialRotaryEmbedding']
    ours = AxialRotaryEmbedding(10, max_freq=7)(inputs(1, 16, 10))
    for got, expected in zip(ours, (sin, cos)):
        assert list(got.shape) == shape
        torch.testing.assert_close(got.flatten(), torch.tensor(expected), rtol=0, atol=1e-6)


def test_rvt_axial_rotary_embedding_refuses_a_token_count_that_is_not_a_square():
    from vit_pytorch.rvt import AxialRotaryEmbedding

    with pytest.raises(ValueError, match='square grid'):
        AxialRotaryEmbedding(8)(torch.zeros(1, 12, 8))


def test_vit_5_rmsnorm_is_vit_pytorchs():
    from vit_pytorch.vit_5 import RMSNorm

    norm = RMSNorm(4)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([0.5, 1.0, 1.5, 2.0]))      # vit-pytorch's `g`, set alike
        torch.testing.assert_close(norm(inputs(2, 4)).flatten(), torch.tensor(CALLS['vit_5.RMSNorm']),
                                   rtol=1e-5, atol=1e-6)


def test_flex_attention_supported_answers_as_vit_pytorchs(monkeypatch):
    from vit_pytorch.vit_nd_masking import flex_attention_supported

    monkeypatch.setenv('ATEN_CPU_CAPABILITY', 'default')       # as the fixture script asked it
    assert [flex_attention_supported(device) for device in ('cuda', 'meta', 'cpu')] == \
        CALLS['vit_nd_masking.flex_attention_supported']
