"""vit-pytorch 1.26.14's calls at its import paths mean what they mean there (issue 25): argument names, positional
order, defaults and the small public helpers its users import; where we follow the paper instead, the difference
is named."""

import importlib
import inspect
import json

import pytest
import torch

from helpers import FIXTURES, load_fixture, tiny_vit_kwargs
from vit_pytorch import ViT

# vit-pytorch 1.26.14's signatures, written out from its source (name, default; REQUIRED where it has none)
REQUIRED = inspect.Parameter.empty


def parameters(callable_):
    return [(name, p.default) for name, p in inspect.signature(callable_).parameters.items()]


# item A: the calls and names vit-pytorch users import


def test_recorder_takes_vit_pytorchs_device_as_second_argument():
    from vit_pytorch.recorder import Recorder

    model = ViT(**tiny_vit_kwargs()).eval()
    logits, attns = Recorder(model, "meta")(torch.randn(2, 3, 16, 24))
    assert attns.device.type == 'meta' and logits.device.type == 'cpu'
    assert attns.shape[:3] == (2, tiny_vit_kwargs()['depth'], tiny_vit_kwargs()['heads'])


def test_recorder_takes_vit_pytorchs_keyword_vit():
    from vit_pytorch.recorder import Recorder

    model = ViT(**tiny_vit_kwargs()).eval()
    img = torch.randn(2, 3, 16, 24)
    _, by_keyword = Recorder(vit=model, device='cpu')(img)
    _, by_position = Recorder(model)(img)
    assert torch.equal(by_keyword, by_position)
    with pytest.raises(TypeError, match='vit='):
        Recorder(model, model=model)


def test_cct_3d_takes_vit_pytorchs_positional_order():
    from vit_pytorch.cct_3d import CCT

    # img_size, num_frames, embedding_dim, n_input_channels, n_conv_layers, frame_stride, frame_kernel_size,
    # frame_padding, frame_pooling_kernel_size, frame_pooling_stride, frame_pooling_padding, kernel_size, stride,
    # padding, pooling_kernel_size, pooling_stride, pooling_padding
    torch.manual_seed(0)
    positional = CCT(16, 4, 32, 1, 1, 1, 3, None, 1, 1, None, 3, 1, 1, 3, 2, 1, num_layers=1, num_heads=2,
                     mlp_ratio=1., num_classes=10).eval()
    torch.manual_seed(0)
    keyword = CCT(img_size=16, num_frames=4, embedding_dim=32, n_input_channels=1, n_conv_layers=1, frame_stride=1,
                  frame_kernel_size=3, frame_padding=None, frame_pooling_kernel_size=1, frame_pooling_stride=1,
                  frame_pooling_padding=None, kernel_size=3, stride=1, padding=1, pooling_kernel_size=3,
                  pooling_stride=2, pooling_padding=1, num_layers=1, num_heads=2, mlp_ratio=1., num_classes=10).eval()
    video = torch.randn(2, 1, 4, 16, 16)
    with torch.no_grad():
        assert torch.equal(positional(video), keyword(video))
    # vit-pytorch hands an 18th positional argument to TransformerClassifier beside its keywords: a TypeError
    with pytest.raises(TypeError):
        CCT(16, 4, 32, 1, 1, 1, 3, None, 1, 1, None, 3, 1, 1, 3, 2, 1, 2)


# names public code imports from vit-pytorch's modules (issue 25 item 5)


def test_vivit_vit_is_vivit_under_its_earlier_name():
    from vit_pytorch.vivit import ViT, ViViT

    assert ViT is ViViT


def test_dino_loss_fn_is_the_cross_entropy_of_the_student_against_the_centred_sharpened_teacher():
    from vit_pytorch.dino import loss_fn

    torch.manual_seed(0)
    teacher, student, centers = torch.randn(3, 7), torch.randn(3, 7, requires_grad=True), torch.randn(7)
    loss = loss_fn(teacher, student, 0.04, 0.1, centers)
    teacher_probs = torch.softmax((teacher - centers) / 0.04, dim=-1)
    expected = -(teacher_probs * torch.log_softmax(student / 0.1, dim=-1)).sum(dim=-1).mean()
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert student.grad is not None


def test_deepvit_transformer_has_vit_pytorchs_keys_and_shapes():
    from vit_pytorch.deepvit import Transformer

    entry = KEYS['models']['deepvit']                     # vit-pytorch's DeepViT(dim=64, depth=2, heads=4, ...)
    theirs = {key.removeprefix('transformer.'): tuple(shape) for key, shape in entry['keys'].items()
              if key.startswith('transformer.')}
    config = entry['config']
    transformer = Transformer(config['dim'], config['depth'], config['heads'], 64, config['mlp_dim'])
    assert {key: tuple(value.shape) for key, value in transformer.state_dict().items()} == theirs
    assert transformer(torch.randn(2, 5, config['dim'])).shape == (2, 5, config['dim'])


def test_cct_takes_vit_pytorchs_positional_order():
    from vit_pytorch.cct import CCT

    # img_size, embedding_dim, n_input_channels, n_conv_layers, kernel_size, stride, padding, pooling_kernel_size,
    # pooling_stride, pooling_padding, dropout_rate, attention_dropout, stochastic_depth_rate
    positional = CCT(32, 64, 1, 2, 3, 1, 1, 3, 2, 1, 0., 0., 0., num_layers=2, num_heads=2, mlp_ratio=1.,
                     num_classes=10)
    keyword = CCT(img_size=32, embedding_dim=64, n_input_channels=1, n_conv_layers=2, kernel_size=3, stride=1,
                  padding=1, pooling_kernel_size=3, pooling_stride=2, pooling_padding=1, dropout_rate=0.,
                  attention_dropout=0., stochastic_depth_rate=0., num_layers=2, num_heads=2, mlp_ratio=1.,
                  num_classes=10)
    assert {k: v.shape for k, v in positional.state_dict().items()} == \
        {k: v.shape for k, v in keyword.state_dict().items()}
    assert positional(torch.randn(1, 1, 32, 32)).shape == (1, 10)


def test_cct_keeps_the_transformers_arguments_keyword_only_as_vit_pytorch_does():
    from vit_pytorch.cct import CCT

    # vit-pytorch passes a 14th positional argument on to TransformerClassifier's seq_pool, given also by keyword
    with pytest.raises(TypeError):
        CCT(32, 64, 3, 1, 3, 1, 1, 3, 2, 1, 0., 0.1, 0.1, 2)


def test_mpp_takes_vit_pytorchs_positional_order():
    from vit_pytorch.mpp import MPP

    model = ViT(**tiny_vit_kwargs(image_size=32, patch_size=8))
    mpp = MPP(model, 8, tiny_vit_kwargs()['dim'], 2, 3, 255., 0.25, 0.6, 0.3)
    assert (mpp.output_channel_bits, mpp.max_pixel_val) == (2, 255.)
    assert (mpp.mask_prob, mpp.replace_prob, mpp.random_patch_prob) == (0.25, 0.6, 0.3)


def test_mpploss_has_vit_pytorchs_signature_and_loss():
    from vit_pytorch.mpp import MPPLoss

    assert parameters(MPPLoss) == [(name, REQUIRED) for name in
                                   ('patch_size', 'channels', 'output_channel_bits', 'max_pixel_val', 'mean', 'std')]
    _, _, reference = load_fixture('vit_pytorch_1.26.14_mpp_loss')      # vit-pytorch's loss at patch 8, 3 bits
    loss = MPPLoss(8, 3, 3, 1.0, None, None)(reference['predictions'], reference['input'], reference['mask'].bool())
    torch.testing.assert_close(loss, reference['loss'])


def test_rearrange_image_puts_a_square_token_grid_back_as_an_image():
    from vit_pytorch.t2t import RearrangeImage

    with pytest.raises(ValueError, match='square'):
        RearrangeImage()(torch.randn(2, 12, 5))                       # a 3 x 4 grid
    tokens = torch.randn(2, 16, 5)
    image = RearrangeImage()(tokens)
    assert image.shape == (2, 5, 4, 4)
    assert torch.equal(image[1, :, 2, 3], tokens[1, 2 * 4 + 3])      # row-major: token h * w_side + w


def test_transformer_classifier_has_vit_pytorchs_signature():
    from vit_pytorch.cct import TransformerClassifier

    assert parameters(TransformerClassifier) == [
        ('seq_pool', True), ('embedding_dim', 768), ('num_layers', 12), ('num_heads', 12), ('mlp_ratio', 4.0),
        ('num_classes', 1000), ('dropout_rate', 0.1), ('attention_dropout', 0.1), ('stochastic_depth_rate', 0.1),
        ('positional_embedding', 'sine'), ('sequence_length', None)]


def test_transformer_classifier_is_ccts_transformer_over_given_tokens():
    from vit_pytorch.cct import CCT, TransformerClassifier

    cct = CCT(img_size=16, embedding_dim=32, kernel_size=3, stride=1, padding=1, num_layers=2, num_heads=2,
              mlp_ratio=2., num_classes=5, positional_embedding='learnable', attention_dropout=0.,
              stochastic_depth_rate=0.).eval()
    n = cct.grid_size[0] * cct.grid_size[1]
    classifier = TransformerClassifier(embedding_dim=32, num_layers=2, num_heads=2, mlp_ratio=2., num_classes=5,
                                       dropout_rate=0., positional_embedding='learnable', sequence_length=n).eval()
    body = {k: v for k, v in cct.state_dict().items() if not k.startswith('tokenizer.')}
    classifier.load_state_dict(body)                                  # the same parameters under the same names
    img = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(classifier(cct.tokenizer(img)), cct(img))


def test_transformer_classifier_without_sequence_pooling_reads_a_class_token():
    from vit_pytorch.cct import TransformerClassifier

    classifier = TransformerClassifier(seq_pool=False, embedding_dim=16, num_layers=1, num_heads=2, num_classes=3,
                                       sequence_length=9, positional_embedding='learnable').eval()
    assert classifier.class_emb.shape == (1, 16) and classifier.positional_emb.shape == (10, 16)
    assert classifier(torch.randn(2, 9, 16)).shape == (2, 3)


def test_transformer_classifier_with_a_position_table_needs_its_length():
    from vit_pytorch.cct import TransformerClassifier

    with pytest.raises(ValueError, match='sequence_length'):
        TransformerClassifier(embedding_dim=16, num_heads=2)


def test_get_module_device_is_the_device_of_the_parameters():
    from vit_pytorch.dino import get_module_device

    assert get_module_device(torch.nn.Linear(2, 2)) == torch.device('cpu')
    assert get_module_device(torch.nn.Linear(2, 2, device='meta')) == torch.device('meta')
    with pytest.raises(ValueError, match='no parameters'):
        get_module_device(torch.nn.ReLU())


# item B: a default vit-pytorch has is the default at its class; the papers' values are named constructors


def test_mpp_defaults_are_vit_pytorchs_and_mpp_paper_has_the_papers():
    from vit_pytorch.mpp import MPP

    assert parameters(MPP) == [
        ('transformer', REQUIRED), ('patch_size', None), ('dim', None), ('output_channel_bits', 3),
        ('channels', None), ('max_pixel_val', 1.0), ('mask_prob', 0.15), ('replace_prob', 0.5),
        ('random_patch_prob', 0.5), ('mean', None), ('std', None)]
    paper = MPP.paper(ViT(**tiny_vit_kwargs()))
    assert (paper.mask_prob, paper.replace_prob, paper.random_patch_prob) == (0.5, 0.8, 0.1)   # appendix B.1.2


def test_dino_takes_vit_pytorchs_arguments_in_its_order_with_its_defaults():
    from vit_pytorch.dino import Dino

    vit_pytorchs = [
        ('net', REQUIRED), ('image_size', REQUIRED), ('hidden_layer', -2), ('projection_hidden_size', 256),
        ('num_classes_K', 65336), ('projection_layers', 4), ('student_temp', 0.9), ('teacher_temp', 0.04),
        ('local_upper_crop_scale', 0.4), ('global_lower_crop_scale', 0.5), ('moving_average_decay', 0.9),
        ('center_moving_average_decay', 0.9), ('augment_fn', None), ('augment_fn2', None)]
    signature = inspect.signature(Dino).parameters.values()
    assert parameters(Dino)[:len(vit_pytorchs)] == vit_pytorchs
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(signature)[len(vit_pytorchs):])


def test_dino_projection_layers_counts_every_linear_layer_of_the_head_as_vit_pytorch_does():
    from vit_pytorch.dino import Dino

    # vit-pytorch's MLP(num_layers=4): three Linear + GELU, L2 norm, then a Linear to K
    learner = Dino(ViT(**tiny_vit_kwargs()), (16, 24), -2, 32, 64, 4, bottleneck_dim=16)
    assert sum(isinstance(m, torch.nn.Linear) for m in learner.student.head.modules()) == 4
    with pytest.raises(ValueError, match='projection_layers must be at least 2'):
        Dino(ViT(**tiny_vit_kwargs()), (16, 24), projection_layers=1)


def test_dino_paper_has_the_papers_configuration():
    from vit_pytorch.dino import Dino

    learner = Dino.paper(ViT(**tiny_vit_kwargs()), (16, 24), num_local_crops=0)
    head = learner.student.head
    assert [m.out_features for m in head.modules() if isinstance(m, torch.nn.Linear)] == [2048, 2048, 256, 65536]
    assert (learner.student_temp, learner.teacher_temp, learner.moving_average_decay) == (0.1, 0.04, 0.996)
    assert learner.crops.global_scale == (0.4, 1.)


def test_the_pretrain_command_keeps_the_papers_mpp_and_dino():
    from vit_pytorch import pretrain

    encoder = ViT(**tiny_vit_kwargs())
    args, _ = pretrain.parse_args(['--method', 'mpp'])
    mpp = pretrain.build_learner(args, encoder, image_size=(16, 24), mean=None, std=None)
    assert (mpp.mask_prob, mpp.replace_prob, mpp.random_patch_prob) == (0.5, 0.8, 0.1)
    args, _ = pretrain.parse_args(['--method', 'dino', '--num-classes-k', '64', '--projection-hidden-size', '32',
                                   '--bottleneck-dim', '16'])
    dino = pretrain.build_learner(args, encoder, image_size=(16, 24), mean=None, std=None)
    assert (dino.student_temp, dino.moving_average_decay, dino.crops.global_scale) == (0.1, 0.996, (0.4, 1.))
    assert sum(isinstance(m, torch.nn.Linear) for m in dino.student.head.mlp) == 3    # the paper's 3-layer MLP


def test_regionvit_default_stem_is_vit_pytorchs_single_convolution():
    from vit_pytorch.regionvit import RegionViT

    assert inspect.signature(RegionViT).parameters['tokenize_local_3_conv'].default is False


def test_mobilevit_takes_vit_pytorchs_positional_arguments():
    from vit_pytorch.mobile_vit import MobileViT

    # vit-pytorch's README MobileViT-XS, positionally, at 64 pixels
    model = MobileViT((64, 64), [96, 120, 144], [16, 32, 48, 48, 64, 64, 80, 80, 96, 96, 384], 10).eval()
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 10)


def test_spt_defaults_to_three_channels_as_vit_pytorch():
    from vit_pytorch.vit_for_small_dataset import SPT

    tokens = SPT(dim=8, patch_size=4)(torch.randn(2, 3, 8, 8))
    assert tokens.shape == (2, 4, 8)


def test_scalable_vit_defaults_are_vit_pytorchs_and_the_named_model_the_papers():
    from vit_pytorch.scalable_vit import ScalableViT, scalable_vit_small

    defaults = dict(parameters(ScalableViT))
    assert (defaults['window_size'], defaults['ssa_dim_key']) == (None, 32)
    with torch.device('meta'):
        assert sum(p.numel() for p in scalable_vit_small().parameters()) == 32_000_472   # the official code's S


@pytest.mark.parametrize('module, name, width', [('nest', 'NesT', 64), ('sep_vit', 'SepViT', 32)])
def test_an_unused_dim_head_is_refused_not_dropped(module, name, width):
    import importlib

    cls = getattr(importlib.import_module(f'vit_pytorch.{module}'), name)
    assert inspect.signature(cls).parameters['dim_head'].default is None
    config = (dict(image_size=32, patch_size=4, num_classes=10, dim=48, heads=3, num_hierarchies=2, block_repeats=1)
              if name == 'NesT' else dict(num_classes=10, dim=48, heads=(1, 2, 4, 8), depth=(1, 1, 1, 1)))
    with pytest.raises(ValueError, match='dim_head'):
        cls(**config, dim_head=width)           # vit-pytorch's default: the heads here are 48 / heads wide


# item C: the default build at vit-pytorch's path has vit-pytorch's state_dict, unless it computes another function

KEYS = json.loads((FIXTURES / 'vit_pytorch_1.26.14_default_keys.json').read_text())   # make_vit_pytorch_default_keys.py

# vit-pytorch's model computes another function than the paper's, which ours follows: its checkpoints are refused
# naming the difference (the whole reason is each module's docstring and its vit_pytorch_plan)
ANOTHER_FUNCTION = {
    'cait': 'class-attention layers mix the heads',
    'cross_vit': 'normalises each branch at the end of every encoder',
    'crossformer': "vit-pytorch's CrossFormer computes another function",
    'cvt': 'one depthwise convolution feeds both keys and values',
    'levit': 'its stem is four convolutions with biases',
    'max_vit': 'its stem has no BatchNorm or GELU',
    'max_vit_with_registers': 'its stem has no BatchNorm or GELU',
    'mobile_vit': 'its attention has 4 heads of 8 channels whatever the width',
    'nest': 'its position embedding is one learned scalar per token position',
    'pit': 'adds a position embedding to the cls token as well',
    'regionvit': "vit-pytorch's RegionViT",
    'scalable_vit': r'each unit of its depth is an \(SSA, feedforward, IWSA, feedforward\) pair',
    'sep_vit': 'it has no grouped self-attention',
    'simple_vit_with_qk_norm': 'normalises queries and keys by their root mean square',
    't2t': 'its T2T layers keep the full unfolded width',
    'twins_svt': r'its sN_depth counts \(local, global\) attention pairs',
    'vit_for_small_dataset': 'moves the image by one pixel',
    'xcit': 'embeds patches with a Linear between LayerNorms',
}
def as_tuples(value):
    return tuple(as_tuples(v) for v in value) if isinstance(value, list) else value


def ours_at(module):
    import importlib

    entry = KEYS['models'][module]
    config = {name: value if module == 'mobile_vit' else as_tuples(value) for name, value in entry['config'].items()}
    torch.manual_seed(0)
    return getattr(importlib.import_module(f'vit_pytorch.{module}'), entry['class'])(**config), entry


def test_every_module_at_vit_pytorchs_path_is_checked():
    assert len(KEYS['models']) == 38 and KEYS['vit_pytorch'] == '1.26.14'
    assert set(ANOTHER_FUNCTION) < set(KEYS['models'])


@pytest.mark.parametrize('module', sorted(set(KEYS['models']) - set(ANOTHER_FUNCTION)))
def test_the_default_build_takes_vit_pytorchs_state_dict(module):
    from vit_pytorch.pretrained import load_vit_pytorch

    model, entry = ours_at(module)
    load_vit_pytorch(model, {key: torch.zeros(shape) for key, shape in entry['keys'].items()})
    untouched = [name for name, p in model.named_parameters() if p.abs().sum() > 0]
    assert untouched == []                           # every parameter of ours came from vit-pytorch's


@pytest.mark.parametrize('module', sorted(ANOTHER_FUNCTION))
def test_a_model_of_another_function_refuses_vit_pytorchs_state_dict_naming_the_difference(module):
    from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch

    model, entry = ours_at(module)
    with pytest.raises(CheckpointError, match=ANOTHER_FUNCTION[module]):
        load_vit_pytorch(model, {key: torch.zeros(shape) for key, shape in entry['keys'].items()})


# item D: LeViT's head is the paper's (BatchNorm, Linear): one image in training mode is refused, and says why


def test_levit_readme_call_on_one_image_in_training_mode_says_to_call_eval():
    from vit_pytorch.levit import LeViT

    model = LeViT(image_size=64, num_classes=10, stages=3, dim=(32, 64, 96), depth=1, heads=(2, 4, 6), mlp_mult=2)
    img = torch.randn(1, 3, 64, 64)
    with pytest.raises(ValueError, match=r'batch of at least 2 images, got 1.*model\.eval\(\)'):
        model(img)
    assert model.eval()(img).shape == (1, 10)


# names that code built on vit-pytorch imports from its modules stay importable there, with its keys


@pytest.mark.parametrize('module, name', [
    ('vit', 'Transformer'), ('vit', 'Attention'), ('vit', 'FeedForward'), ('simple_vit', 'Transformer'),
    ('simple_vit', 'Attention'), ('simple_vit', 'FeedForward'), ('simple_vit', 'posemb_sincos_2d'),
    ('simple_vit', 'pair'), ('cct', 'Tokenizer'), ('mobile_vit', 'MobileViTBlock'), ('mobile_vit', 'FeedForward'),
    ('cross_vit', 'CrossTransformer'), ('dino', 'get_module_device'), ('dino', 'loss_fn'), ('vivit', 'ViT'),
    ('deepvit', 'Transformer'), ('vit_with_patch_dropout', 'PatchDropout')])
def test_a_name_public_code_imports_is_importable_at_vit_pytorchs_path(module, name):
    assert callable(getattr(importlib.import_module(f'vit_pytorch.{module}'), name))


def test_simple_vit_and_mobile_vit_feedforwards_have_vit_pytorchs_keys():
    from vit_pytorch.mobile_vit import FeedForward as MobileFeedForward
    from vit_pytorch.simple_vit import FeedForward

    # vit-pytorch 1.26.14: SimpleViT's is LayerNorm, Linear, GELU, Linear; MobileViT's adds a Dropout after the
    # SiLU and after the last Linear
    assert list(FeedForward(8, 16).state_dict()) == [f'net.{i}.{p}' for i in (0, 1, 3) for p in ('weight', 'bias')]
    assert list(MobileFeedForward(8, 16).state_dict()) == [f'net.{i}.{p}' for i in (0, 1, 4)
                                                           for p in ('weight', 'bias')]
    assert isinstance(MobileFeedForward(8, 16).net[2], torch.nn.SiLU)


def test_vit_with_patch_dropout_patch_dropout_keeps_the_fraction_it_is_given():
    from vit_pytorch.vit_with_patch_dropout import PatchDropout

    tokens = torch.randn(2, 20, 4)
    assert PatchDropout(0.25).train()(tokens).shape == (2, 15, 4)
    assert torch.equal(PatchDropout(0.25).eval()(tokens), tokens)
