"""vit-pytorch 1.26.14's calls at its import paths mean what they mean there (issue 25): argument names, positional
order, defaults and the small public helpers its users import; where we follow the paper instead, the difference
is named."""

import inspect

import pytest
import torch

from helpers import load_fixture, tiny_vit_kwargs
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
