"""Every numeric constructor argument of every registered model and wrapper is checked when it is built.

For each model of `vit_pytorch.models.MODELS` (a new one joins by its registry entry) and each wrapper, each
numeric argument found in the constructor's signature is given NaN, infinity, -1, a string and True in turn;
an int argument (a count, a depth, a width, a size) also 0 (unless ZERO_ALLOWED says why 0 is valid) and 2.5
(unless REAL_NUMBERS says it takes a real number); a rate or share (RATES) also 1.5, and 1.0 where RATES says
why 1 is no valid rate (for a tuple, each of these as its first entry too): every one must be a
ValueError/TypeError at construction that names the argument and shows the value, never a model that computes
NaN or fails later in `forward`. The values the tables exempt must then build, as they do in vit-pytorch.
"""

import functools
import inspect
import math
import re

import pytest
import torch

from helpers import tiny_vit_kwargs
from vit_pytorch import models, train
from vit_pytorch.accept_video_wrapper import AcceptVideoWrapper
from vit_pytorch.dino import Dino
from vit_pytorch.distill import DistillableViT, DistillWrapper
from vit_pytorch.es_vit import EsViTTrainer
from vit_pytorch.lejepa import LeJEPA
from vit_pytorch.levjepa import LeVJEPA, VideoTransformer
from vit_pytorch.levjepa_nd import LeVJEPAND, NDTransformer
from vit_pytorch.mae import MAE
from vit_pytorch.mp3 import MP3
from vit_pytorch.mp3 import ViT as MP3ViT
from vit_pytorch.mpp import MPP
from vit_pytorch.simmim import SimMIM
from vit_pytorch.vaat import AST, VAAT
from vit_pytorch.vat import VAT
from vit_pytorch.vat import ViT as VATViT
from vit_pytorch.vat_siglip import SigLIPVAT
from vit_pytorch.vit import ViT
from vit_pytorch.vit_with_decorr import ViT as ViTWithDecorr

BAD_VALUES = [math.nan, math.inf, -1, 'x', True]

# arguments left None (by default) which take a number (or numbers) when given; any other None default
# must be listed in NOT_NUMBERS, so that a new model's arguments are classified rather than skipped
OPTIONAL_NUMBERS = {
    'pre_logits_dim', 'layer_scale_init', 'qk_scale', 'lg_image_size', 'pretrained_window_sizes',
    'num_distill_classes', 's1_emb_padding', 's2_emb_padding', 's3_emb_padding', 's1_heads', 's2_heads',
    's3_heads', 's4_heads', 'dim_head', 'heads', 'ssa_dim_value', 'iwsa_dim_key', 'iwsa_dim_value',
    'token_dropout_prob', 'frame_padding', 'frame_pooling_padding',
    # the wrappers' (MPP's patch_size, dim and channels must agree with the transformer's)
    'patch_size', 'dim', 'channels', 'mean', 'std', 'local_image_size', 'dim_emb', 'time_seq_len',
    'proj_embed_to_dim',
    'specialize_qkv_depth',     # simple_vit_with_specialized_cls: depth // 3 when None
    'patch_merge_layer',    # the PatchMerger's layer: None merges halfway (depth // 2)
    'block_size',       # simple_vit_attn_residual: branches a Block AttnRes block, None: Full AttnRes
    'value_residual_mix',   # simple_vit_with_value_residual: None learns the mix per token and head
    'residual_lerp_scale_init',     # normalized_vit: alpha's init, None: 1 / depth
    'keel_residual_scale',      # vit_with_keel_post_ln: alpha, None: the number of sub-layers (2 * depth)
    'input_shape', 'image_size',    # looped_vit: the input's size (either one), an int or one a dimension
    'norm_eps',         # vit_5: the RMSNorms' epsilon, None: the dtype's machine epsilon (nn.RMSNorm's default)
    'se_reduction',     # local_vit: the official SE layer's reduction, None: no SE layer
}
NOT_NUMBERS = {
    'transformer',      # T2T-ViT: a custom backbone module
    'augment_fn', 'augment_fn2',        # Dino: callables
    'moss',             # AcceptVideoWrapper: vit-pytorch's MOSS module, refused unless None
    'mask_generator',   # ViTDetPool: a module that maps images to object masks
    'orthog_residual_update_kwargs',    # simple_vit_orthog_residual_update: a dict of options, None: {}
    'attn_layers',      # jet_vit: one attention choice a layer, None: full attention everywhere
    'sigreg_slots', 'interactions',     # wwt: booleans per level (None: no SIGReg), level pairs (None: tokens-slots)
    # lejepa: vit-pytorch's EMA-teacher mode, refused whatever the value (tests/test_lejepa.py), and two flags
    'use_ema', 'moving_average_decay', 'use_sigreg',
    # levjepa, levjepa_nd: callables (None: the paper's augmentations or the identity, a BatchNorm/RMSNorm)
    'norm_fn', 'local_augment_fn', 'global_augment_fn', 'augment_src', 'augment_tgt',
}

# arguments whose refusal need not show the value: MPP's and DINO's mean and std are refused first for coming
# without their partner (test_a_normalisation_must_be_finite_with_a_positive_std checks their values)
VALUE_NOT_SHOWN = {'mean', 'std'}

# (owner, argument, value) a constructor may accept, with the reason
ALLOWED = {
    # a position in the wrapped model's outputs: -1 is the last, as in Python indexing
    ('accept_video_wrapper', 'output_pos_add_pos_emb', -1),
}

# int-valued arguments that take a real number: 2.5 is not tried (0 still is)
REAL_NUMBERS = {
    'temperature',      # attn_residual_with_dca_simple_vit: the rotary base (10000), distill: a softmax temperature
    # width multipliers that vit-pytorch (or timm, for PVT v2) applies as int(width * factor): 2.5 builds there
    'mlp_factor', 'highres_mlp_factor',     # look_vit
    'jumbo_ff_mult',                        # jumbo_vit
    'expansion',                            # mobile_vit's inverted residual blocks
    'mbconv_expansion_rate',                # max_vit's MBConv
    'mlp_ratios',                           # pvt_v2 (timm's name and rule)
    'ff_mult',                              # sep_vit
}
# arguments left None by default that take an int when given (the others of OPTIONAL_NUMBERS take floats)
OPTIONAL_INTS = {
    'pre_logits_dim', 'lg_image_size', 'pretrained_window_sizes', 'num_distill_classes', 's1_emb_padding',
    's2_emb_padding', 's3_emb_padding', 's1_heads', 's2_heads', 's3_heads', 's4_heads', 'dim_head', 'heads',
    'ssa_dim_value', 'iwsa_dim_key', 'iwsa_dim_value', 'frame_padding', 'frame_pooling_padding', 'patch_size',
    'dim', 'channels', 'local_image_size', 'dim_emb', 'time_seq_len', 'proj_embed_to_dim', 'specialize_qkv_depth',
    'patch_merge_layer', 'input_shape', 'image_size', 'block_size',
}
# int arguments for which 0 is a valid value, with the reason (every other int argument must refuse 0)
ZERO_ALLOWED = {
    'num_classes': 'no head: the model returns its features',
    'padding': 'no padding', 'pooling_padding': 'no padding', 'frame_padding': 'no padding',
    'frame_pooling_padding': 'no padding', 's1_emb_padding': 'no padding', 's2_emb_padding': 'no padding',
    's3_emb_padding': 'no padding',
    'num_register_tokens': 'no registers: the plain model', 'num_registers': 'no registers: the plain model',
    'num_register_slots': 'no registers: the plain model',
    'specialize_qkv_depth': 'no layer with a cls-specific projection (what depth // 3 gives below depth 3)',
    'pre_loop_depth': 'no layer before the loop', 'post_loop_depth': 'no layer after the loop',
    'causal_dims': 'an index: the first axis', 'output_pos_add_pos_emb': 'an index: the first output',
    'num_local_crops': "DINO's two global crops alone",
    'num_advantage_bins': 'no advantage conditioning (the default of VAT, VAAT and SigLIPVAT)',
    'vit_layer_indices': 'an index of the tower trajectory: its first entry is the embedded tokens',
    'ast_layer_indices': 'an index of the tower trajectory: its first entry is the embedded tokens',
}
# rates and shares: name -> (whether 1.0 is refused, why); 1.5 is refused by every one: no probability, share or
# decay exceeds 1
DROPOUT = (True, "torch's Dropout takes p=1 but then zeroes every activation in training: the branch passes "
                 "nothing and no weight before it is trained; the shared vit.probability is [0, 1)")
STOCHASTIC_DEPTH = (True, 'a branch dropped with probability 1 never runs in training, and the kept branch is '
                          'scaled by 1 / (1 - p)')
RATES = {
    **dict.fromkeys(('dropout', 'emb_dropout', 'attention_dropout', 'attn_dropout', 'attn_drop_rate', 'drop_rate',
                     'proj_drop_rate', 'ff_dropout', 'dropout_rate'), DROPOUT),
    **dict.fromkeys(('drop_path_rate', 'stochastic_depth_rate', 'layer_dropout'), STOCHASTIC_DEPTH),
    'patch_dropout': (True, 'keeps no patch'),
    'token_dropout_prob': (True, 'keeps no token'),
    'masking_ratio': (True, 'leaves no visible patch (vit-pytorch asserts masking_ratio < 1)'),
    'rope_p_zero_freqs': (True, 'leaves no rotating frequency'),
    'pope_p_zero_freqs': (True, 'leaves no rotating frequency'),
    'mask_prob': (True, 'corrupts every patch: no patch is left at its own position to predict from'),
    'random_patch_prob': (False, 'every masked patch replaced by a random one'),
    'replace_prob': (False, 'every masked patch replaced by the mask token'),
    'alpha': (False, 'the distillation loss alone'),
    'moving_average_decay': (False, 'a frozen teacher'),
    'center_moving_average_decay': (False, 'a frozen centre'),
    'global_lower_crop_scale': (False, 'a crop of the whole image'),
    'local_upper_crop_scale': (False, 'a crop of the whole image'),
    'decorr_sample_frac': (False, 'every token sampled (the default)'),
    'decorr_matrices_kappa': (False, "the decorrelation matrices' variance term alone"),
    'decorr_matrices_sample_frac': (False, "every row read by the decorrelation matrices' step (the default)"),
    'sparsity_threshold': (False, 'a gate score of 1 is the top of its range'),
    'value_residual_mix': (False, "each layer's own values alone"),
    'drop_ratio': (True, 'drops every patch: the LeVJEPA encoder sees its cls token alone'),
}

IMAGE_SIZE, CHANNELS, NUM_CLASSES = 32, 3, 10


def model_kwargs(name):
    """The trainer's small configuration of `name` for 32-pixel, 3-channel images and 10 classes."""
    return train.model_config(name, {}, image_size=IMAGE_SIZE, channels=CHANNELS, num_classes=NUM_CLASSES)


def vit():
    return ViT(**tiny_vit_kwargs())


# a small action policy of VAT, VAAT and SigLIPVAT: two layers, reading tower trajectory states 0 and 1
VAT_POLICY = dict(dim=16, depth=2, heads=2, dim_head=8, dim_action=2, mlp_dim=32, num_views=1, num_tasks=2,
                  dim_extra_token=3, num_register_tokens=1, action_chunk_len=2, time_seq_len=2, self_attn_heads=2,
                  self_attn_dim_head=8, vit_layer_indices=(0, 1), num_advantage_bins=2)


# the networks of LeJEPA, EsViT, VAT and VAAT, built once: a wrapper only reads its network when it is built (the
# sweep builds a wrapper a case)
shared_vit = functools.cache(vit)


@functools.cache
def vat_tower():
    return VATViT(**tiny_vit_kwargs(depth=2))


@functools.cache
def ast_tower():
    return AST(dim=16, depth=2, mlp_dim=32, patch_size=8, dim_head=8, heads=2)


# wrapper -> (its class, the keyword arguments of a small valid one)
WRAPPERS = {
    'mae': (MAE, lambda: dict(encoder=vit(), decoder_dim=32, decoder_depth=1, decoder_heads=2, decoder_dim_head=16)),
    'simmim': (SimMIM, lambda: dict(encoder=vit())),
    'mpp': (MPP, lambda: dict(transformer=vit())),
    'dino': (Dino, lambda: dict(net=vit(), image_size=(16, 24), projection_hidden_size=32, num_classes_K=64,
                                bottleneck_dim=16, num_local_crops=1)),
    'distill_wrapper': (DistillWrapper, lambda: dict(teacher=vit(), student=DistillableViT(**tiny_vit_kwargs()))),
    'accept_video_wrapper': (AcceptVideoWrapper, lambda: dict(image_net=vit())),
    'vit_with_decorr': (ViTWithDecorr, lambda: tiny_vit_kwargs(decorr_sample_frac=0.5)),
    'mp3': (MP3, lambda: dict(vit=MP3ViT(**tiny_vit_kwargs()), masking_ratio=0.5)),
    'mp3_vit': (MP3ViT, lambda: tiny_vit_kwargs(dropout=0.1)),
    'lejepa': (LeJEPA, lambda: dict(net=shared_vit(), image_size=(16, 24), projection_hidden_size=32,
                                    num_classes_K=16, sigreg_loss_kwargs=dict(num_slices=32), num_local_crops=1)),
    'levjepa': (LeVJEPA, lambda: dict(
        encoder=VideoTransformer(image_size=(16, 24), patch_size=8, frames=2, dim=16, depth=1, heads=2, dim_head=8,
                                 mlp_dim=32),
        image_size=(16, 24), local_size=(8, 16), num_local_views=2, num_classes_K=8, projection_hidden=16,
        drop_ratio=0.5, sigreg_loss_kwargs=dict(num_proj=16))),
    'levjepa_nd': (LeVJEPAND, lambda: dict(
        encoder=NDTransformer(ndim=2, input_shape=(8, 12), patch_size=(2, 4), dim=16, depth=1, heads=2, dim_head=8,
                              mlp_dim=32, channels=2),
        input_shape=(8, 12), num_classes_K=8, projection_hidden=16, drop_ratio=0.5,
        sigreg_loss_kwargs=dict(num_proj=16))),
    'es_vit': (EsViTTrainer, lambda: dict(net=shared_vit(), image_size=(16, 24), projection_hidden_size=32,
                                          num_classes_K=64, bottleneck_dim=16, num_local_crops=1)),
    'vat': (VAT, lambda: dict(vit=vat_tower(), **VAT_POLICY)),
    'vaat': (VAAT, lambda: dict(vit=vat_tower(), ast=ast_tower(),
                                **{('num_image_views' if key == 'num_views' else key): value
                                   for key, value in VAT_POLICY.items()},
                                num_audio_views=1, ast_layer_indices=(0, 1))),
    'vat_siglip': (SigLIPVAT, lambda: dict(**VAT_POLICY, siglip_image_size=16, siglip_patch_size=8, siglip_dim=16,
                                           siglip_depth=2, siglip_heads=2, siglip_mlp_dim=32)),
}


def signature(cls):
    """name -> default of every keyword argument of `cls(...)`, following **kwargs into base classes."""
    found = {}
    for klass in cls.__mro__:
        if '__init__' not in vars(klass) or klass is object:
            continue
        parameters = inspect.signature(klass.__init__).parameters.values()
        for parameter in parameters:
            if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD) and parameter.name != 'self':
                found.setdefault(parameter.name, parameter.default)
        if not any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
            break
    return found


def is_number(value):
    return isinstance(value, (int, float, tuple, list)) and not isinstance(value, bool)


def numeric_arguments(cls, kwargs):
    """name -> the value `kwargs` or the default gives, for every argument of `cls` that takes numbers."""
    numeric = {}
    for name, default in signature(cls).items():
        value = kwargs.get(name, default)
        if is_number(value) or (value is None and name in OPTIONAL_NUMBERS):
            numeric[name] = value
    return numeric


def first_entry_replaced(value, bad):
    """`value` with its first (innermost) entry replaced by `bad`; None when there is no entry."""
    if not isinstance(value, (tuple, list)):
        return bad
    if not value:
        return None
    inner = first_entry_replaced(value[0], bad)
    return None if inner is None else type(value)((inner, *value[1:]))


def first_entry(value):
    """The first (innermost) entry of a tuple or list, `value` itself otherwise; None when there is no entry."""
    while isinstance(value, (tuple, list)):
        if not value:
            return None
        value = value[0]
    return value


def is_integer_argument(name, value):
    """Whether `name` takes an int (or ints): its valid value is one, or it is an optional count or size."""
    if name in REAL_NUMBERS:
        return False
    if value is None:
        return name in OPTIONAL_INTS
    entry = first_entry(value)
    return isinstance(entry, int) and not isinstance(entry, bool)


def bad_values(name, value):
    """The values `name` must refuse: BAD_VALUES for every number, 0 and 2.5 for an int, 1.5 (and 1.0 where
    RATES says so) for a rate."""
    bad = list(BAD_VALUES)
    if is_integer_argument(name, value):
        bad += [2.5] if name in ZERO_ALLOWED else [0, 2.5]
    if name in RATES:
        bad += [1.5] + ([1.0] if RATES[name][0] else [])
    return bad


def substitutions(name, value):
    """(label, bad value) pairs for an argument `name` whose valid value is `value`."""
    bad_ones = bad_values(name, value)
    cases = [(repr(bad), bad) for bad in bad_ones]
    if isinstance(value, (tuple, list)):
        cases += [(f'first entry {bad!r}', first_entry_replaced(value, bad)) for bad in bad_ones]
    return [(label, bad) for label, bad in cases if bad is not None]


def unchecked(owner, cls, make_kwargs):
    """Every (argument, substituted value) that `cls` did not refuse by a ValueError/TypeError naming it."""
    failures = []
    for name, value in numeric_arguments(cls, make_kwargs()).items():
        for label, bad in substitutions(name, value):
            if (owner, name, bad) in ALLOWED:
                continue
            try:
                cls(**{**make_kwargs(), name: bad})
            except (ValueError, TypeError) as error:
                if not re.search(rf'\b{re.escape(name)}\b', str(error)):
                    failures.append(f'{name}={label}: {type(error).__name__} not naming it: {error}')
                elif name not in VALUE_NOT_SHOWN and not any(
                        shown in str(error) for value in (bad, first_entry(bad)) for shown in (repr(value), str(value))):
                    failures.append(f'{name}={label}: {type(error).__name__} not showing the value: {error}')
            except Exception as error:      # any other error is a failure to report
                failures.append(f'{name}={label}: {type(error).__name__}: {error}')
            else:
                failures.append(f'{name}={label}: accepted')
    return failures


@pytest.mark.parametrize('name', models.MODELS)
def test_the_base_configuration_builds(name):
    # without a configuration that builds, the model's arguments would go untested: give the model an entry
    # in vit_pytorch.models.SMALL_CONFIGS (or ViT-style arguments)
    model = models.build_model(name, **model_kwargs(name))
    assert isinstance(model, torch.nn.Module)


def unclassified(cls, kwargs):
    """Arguments left None by `kwargs` and the defaults that neither table classifies."""
    return [argument for argument, default in signature(cls).items()
            if kwargs.get(argument, default) is None and argument not in OPTIONAL_NUMBERS | NOT_NUMBERS]


@pytest.mark.parametrize('name', models.MODELS)
def test_every_argument_left_none_is_classified(name):
    unknown = unclassified(models.model_class(name), model_kwargs(name))
    assert not unknown, f'{name}: add {unknown} to OPTIONAL_NUMBERS or NOT_NUMBERS'


@pytest.mark.parametrize('name', models.MODELS)
def test_every_numeric_argument_of_a_model_is_checked_at_construction(name):
    cls = models.model_class(name)
    assert numeric_arguments(cls, model_kwargs(name)), f'{name}: no numeric arguments found'
    failures = unchecked(name, cls, lambda: model_kwargs(name))
    assert not failures, f'{name}:\n' + '\n'.join(failures)


@pytest.mark.parametrize('name', WRAPPERS)
def test_every_argument_of_a_wrapper_left_none_is_classified(name):
    cls, make_kwargs = WRAPPERS[name]
    unknown = unclassified(cls, make_kwargs())
    assert not unknown, f'{name}: add {unknown} to OPTIONAL_NUMBERS or NOT_NUMBERS'


@pytest.mark.parametrize('name', WRAPPERS)
def test_every_numeric_argument_of_a_wrapper_is_checked_at_construction(name):
    cls, make_kwargs = WRAPPERS[name]
    cls(**make_kwargs())
    failures = unchecked(name, cls, make_kwargs)
    assert not failures, f'{name}:\n' + '\n'.join(failures)


# norm_eps=0 is no epsilon: a constant image (zero variance) then gives NaN; every model that takes one refuses it
@pytest.mark.parametrize('name', [name for name in models.MODELS if 'norm_eps' in signature(models.model_class(name))])
def test_a_norm_eps_of_zero_is_refused(name):
    with pytest.raises(ValueError, match=r'\bnorm_eps\b.*0'):
        models.build_model(name, **{**model_kwargs(name), 'norm_eps': 0.0})


@pytest.mark.parametrize('name', [name for name in models.MODELS
                                  if 'layer_scale_init' in signature(models.model_class(name))])
@pytest.mark.parametrize('value', [math.nan, math.inf, 0.0])
def test_a_layer_scale_init_that_is_not_a_positive_finite_number_is_refused(name, value):
    with pytest.raises(ValueError, match=r'\blayer_scale_init\b'):
        models.build_model(name, **{**model_kwargs(name), 'layer_scale_init': value})


# a NaN mean gives NaN images; a std of 0 divides by zero
@pytest.mark.parametrize('name', ['mpp', 'dino'])
@pytest.mark.parametrize('mean, std, argument', [
    ((math.nan, 0.5, 0.5), (0.2, 0.2, 0.2), r'mean\[0\]'),
    ((0.5, 0.5, 0.5), (0.2, 0.0, 0.2), r'std\[1\]'),
    ((0.5, 0.5, 0.5), (0.2, 0.2, math.inf), r'std\[2\]'),
    ((0.5, '0.5', 0.5), (0.2, 0.2, 0.2), r'mean\[1\]'),
])
def test_a_normalisation_must_be_finite_with_a_positive_std(name, mean, std, argument):
    cls, make_kwargs = WRAPPERS[name]
    with pytest.raises((ValueError, TypeError), match=argument):
        cls(**make_kwargs(), mean=mean, std=std)


# the exemptions hold: a width multiplier of 2.5 builds (vit-pytorch takes int(width * factor)), and a share of 1.0
# builds where RATES says 1 is valid
def exempted_values():
    owners = [('model', name, models.model_class(name), lambda name=name: model_kwargs(name)) for name in models.MODELS]
    owners += [('wrapper', name, cls, make_kwargs) for name, (cls, make_kwargs) in WRAPPERS.items()]
    cases = []
    for kind, owner, cls, make_kwargs in owners:
        for name, value in numeric_arguments(cls, make_kwargs()).items():
            if name in REAL_NUMBERS and name != 'temperature':
                multiplier = type(value)(2.5 for _ in value) if isinstance(value, (tuple, list)) else 2.5
                cases.append(pytest.param(kind, owner, name, multiplier, id=f'{kind}-{owner}-{name}'))
            if name in RATES and not RATES[name][0]:
                cases.append(pytest.param(kind, owner, name, 1.0, id=f'{kind}-{owner}-{name}'))
    return cases


# MPP's replace_prob and random_patch_prob share the corrupted patches: 1 for one leaves 0 for the other
SHARE_PARTNERS = {'replace_prob': 'random_patch_prob', 'random_patch_prob': 'replace_prob'}


@pytest.mark.parametrize('kind, owner, name, value', exempted_values())
def test_an_exempted_value_builds(kind, owner, name, value):
    cls, make_kwargs = WRAPPERS[owner] if kind == 'wrapper' else (models.model_class(owner),
                                                                    lambda: model_kwargs(owner))
    kwargs = {**make_kwargs(), name: value}
    if name in SHARE_PARTNERS:
        kwargs[SHARE_PARTNERS[name]] = 0.0
    # building is the check: a width left a float (dim * 2.5) fails in nn.Linear/nn.Conv2d's constructor
    assert isinstance(cls(**kwargs), torch.nn.Module)
