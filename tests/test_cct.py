import math

import pytest
import torch
import torch.nn.functional as F

from helpers import count, reference_case
from vit_pytorch import cct
from vit_pytorch.cct import CCT, sinusoidal_embedding


def tiny_cct_kwargs(**overrides):
    kwargs = dict(img_size=(16, 24), embedding_dim=32, n_conv_layers=1, kernel_size=3, stride=1, padding=1,
                  num_layers=2, num_heads=2, mlp_ratio=2, num_classes=5, positional_embedding='learnable')
    kwargs.update(overrides)
    return kwargs


def test_there_is_no_cls_token():
    model = CCT(**tiny_cct_kwargs())
    tokens = model.forward_features(torch.randn(1, 3, 16, 24))
    assert tokens.shape[1] == model.grid_size[0] * model.grid_size[1]
    assert not any('cls' in name for name, _ in model.named_parameters())


# named configurations against the reference implementation's published counts (SHI-Labs README)

@pytest.mark.parametrize('name, kernel, convs, size, classes, positions, exact, published', [
    ('cct_2', 3, 2, 32, 10, 'learnable', 283_723, '0.284M'),
    ('cct_4', 3, 2, 32, 10, 'learnable', 482_123, '0.482M'),
    ('cct_6', 3, 2, 32, 10, 'learnable', 3_326_923, '3.327M'),
    ('cct_7', 3, 2, 32, 10, 'learnable', 3_853_259, '3.853M'),
    ('cct_7', 3, 1, 32, 10, 'learnable', 3_760_139, '3.760M'),     # CCT-7/3x1, the paper's 3.76M
    ('cct_6', 3, 1, 32, 10, 'sine', 3_168_267, '3.168M'),
    ('cct_14', 7, 2, 224, 1000, 'sine', 22_292_009, '22.29M'),
    ('cct_16', 7, 2, 224, 1000, 'learnable', 25_323_305, '25.32M'),
])
def test_named_configuration_parameter_counts(name, kernel, convs, size, classes, positions, exact, published):
    with torch.device('meta'):
        model = getattr(cct, name)(img_size=size, kernel_size=kernel, n_conv_layers=convs, num_classes=classes,
                                   positional_embedding=positions)
    assert next(model.parameters()).is_meta
    # `exact` is the count of vit-pytorch 1.26.14's port of the reference code (trainable parameters)
    assert count(model) == exact
    digits = len(published.split('.')[1]) - 1
    assert f'{count(model) / 1e6:.{digits}f}M' == published


def test_named_constructors_derive_stride_and_padding_from_the_kernel():
    model = cct.cct_7(img_size=224, kernel_size=7, n_conv_layers=2, positional_embedding='none')
    conv = model.tokenizer.conv_layers[0][0]
    assert (conv.kernel_size, conv.stride, conv.padding) == ((7, 7), (2, 2), (3, 3))
    assert model.grid_size == (14, 14)
    conv = cct.cct_2(img_size=32).tokenizer.conv_layers[0][0]
    assert (conv.kernel_size, conv.stride, conv.padding) == ((3, 3), (1, 1), (1, 1))


@pytest.mark.parametrize('size, layers, kernel, stride, padding', [
    ((32, 32), 1, 3, 1, 1), ((224, 224), 2, 7, 2, 3), ((30, 45), 2, 5, 2, 1), ((17, 9), 1, 3, 1, 0),
])
def test_token_grid_formula_matches_the_convolutions(size, layers, kernel, stride, padding):
    model = CCT(**tiny_cct_kwargs(img_size=size, n_conv_layers=layers, kernel_size=kernel, stride=stride,
                                  padding=padding, positional_embedding='none'))
    tokens = model.tokenizer(torch.randn(1, 3, *size))
    assert tokens.shape[1] == model.grid_size[0] * model.grid_size[1]


# what makes CCT different: convolutional tokenizer and sequence pooling


def test_tokenizer_is_conv_relu_maxpool():
    model = CCT(**tiny_cct_kwargs())
    conv = model.tokenizer.conv_layers[0][0]
    img = torch.randn(2, 3, 16, 24)
    expected = F.max_pool2d(F.relu(F.conv2d(img, conv.weight, stride=1, padding=1)), 3, 2, 1)
    torch.testing.assert_close(model.tokenizer(img), expected.flatten(2).transpose(1, 2))
    assert conv.bias is None


def test_sequence_pooling_weights_sum_to_one_and_average_the_tokens():
    model = CCT(**tiny_cct_kwargs()).eval()
    recorded = []
    model.pool.pool_weights.register_forward_hook(lambda _m, _i, out: recorded.append(out))
    img = torch.randn(3, 3, 16, 24)
    tokens = model.forward_features(img)
    pooled = model.forward_head(tokens, pre_logits=True)
    (weights,) = recorded
    assert weights.shape == (3, 96)
    assert (weights > 0).all()
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(3))
    torch.testing.assert_close(pooled, (weights[..., None] * tokens).sum(dim=1))
    torch.testing.assert_close(model(img), model.fc(pooled))


def test_sequence_pooling_with_a_constant_score_is_mean_pooling():
    model = CCT(**tiny_cct_kwargs()).eval()
    with torch.no_grad():
        model.pool.attention_pool.weight.zero_()
    tokens = torch.randn(2, 7, 32)
    torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), tokens.mean(dim=1))


def test_sequence_pooling_weights_follow_the_scores():
    model = CCT(**tiny_cct_kwargs()).eval()
    tokens = torch.randn(1, 4, 32)
    scores = model.pool.attention_pool(tokens)[0, :, 0]
    recorded = []
    model.pool.pool_weights.register_forward_hook(lambda _m, _i, out: recorded.append(out))
    model.forward_head(tokens, pre_logits=True)
    torch.testing.assert_close(recorded[0][0], scores.softmax(dim=0))


def test_layer_is_the_reference_post_attention_norm_layer():
    # x + attn(LN(x)); LN of the residual stream; + MLP -- written out from the layer's weights
    model = CCT(**tiny_cct_kwargs(attention_dropout=0., stochastic_depth_rate=0.)).double().eval()
    layer = model.transformer.layers[0]
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    attn = layer.self_attn
    q, k, v = attn.to_qkv(attn.norm(x)).chunk(3, dim=-1)
    q, k, v = (t.reshape(2, 5, 2, 16).transpose(1, 2) for t in (q, k, v))
    out = (torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v).transpose(1, 2).reshape(2, 5, 32)
    y = layer.norm1(x + attn.to_out(out))
    expected = y + layer.mlp(y)
    torch.testing.assert_close(layer(x), expected, atol=1e-12, rtol=0)


def test_sine_table_matches_the_reference_formula():
    table = sinusoidal_embedding(6, 8)
    for p in range(6):
        for i in range(8):
            angle = p / 10000 ** (2 * (i // 2) / 8)
            assert math.isclose(table[p, i].item(), math.sin(angle) if i % 2 == 0 else math.cos(angle),
                                abs_tol=1e-6)


def test_sine_positions_are_a_fixed_unsaved_buffer():
    model = CCT(**tiny_cct_kwargs(positional_embedding='sine'))
    assert 'positional_emb' in dict(model.named_buffers())
    assert 'positional_emb' not in model.state_dict()
    assert model.positional_emb.shape == (96, 32)


def test_stochastic_depth_grows_linearly_and_applies_only_in_training():
    model = CCT(**tiny_cct_kwargs(num_layers=3, stochastic_depth_rate=0.5, attention_dropout=0.))
    assert [layer.drop_path_rate for layer in model.transformer.layers] == [0.0, 0.25, 0.5]
    img = torch.randn(4, 3, 16, 24)
    model.eval()
    assert torch.equal(model(img), model(img))


def test_without_positions_any_input_size_works():
    model = CCT(**tiny_cct_kwargs(positional_embedding='none'))
    assert model(torch.randn(1, 3, 20, 20)).shape == (1, 5)
    with pytest.raises(ValueError, match=r"img must be 16x24.*got 20x20.*positional_embedding='none'"):
        CCT(**tiny_cct_kwargs())(torch.randn(1, 3, 20, 20))


@pytest.mark.parametrize('override, error, message', [
    (dict(embedding_dim=30, num_heads=4), ValueError, r'embedding_dim 30 must be divisible by num_heads 4'),
    (dict(positional_embedding='rope'), ValueError, r"positional_embedding must be one of .*'rope'"),
    (dict(img_size=(2, 2), padding=0), ValueError, r'img_size \(2, 2\) is too small'),
    (dict(pooling_padding=2), ValueError, r'pooling_padding must be at most half'),
    (dict(mlp_ratio=0), ValueError, r'mlp_ratio must give an MLP width of at least 1'),
])
def test_invalid_configuration(override, error, message):
    with pytest.raises(error, match=message):
        CCT(**tiny_cct_kwargs(**override))


@pytest.mark.parametrize('size', [(2, 2), (1, 1), (16, 1)])
def test_an_image_too_small_for_the_tokenizer_is_refused(size):
    model = CCT(**tiny_cct_kwargs(positional_embedding='none', padding=0, pooling_padding=0))
    with pytest.raises(ValueError, match=rf'img of {size[0]}x{size[1]} .*too small for the tokenizer'):
        model(torch.randn(1, 3, *size))


def test_invalid_input_is_refused():
    model = CCT(**tiny_cct_kwargs())
    with pytest.raises(ValueError, match=r'3 channels'):
        model(torch.randn(1, 1, 16, 24))


# parity with the reference code through vit-pytorch 1.26.14's port of it
# (fixtures written by tests/fixtures/make_vit_pytorch_variant_fixtures.py)


@pytest.mark.parametrize('case', ['cct_learnable', 'cct_sine'])
def test_reference_checkpoint_loads_and_gives_its_outputs(case):
    config, state, img, expected = reference_case(f'vit_pytorch_1.26.14_{case}', 'img_size')
    model = CCT(**config).eval()
    model.load_state_dict(cct.convert_reference_state_dict(state))
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, atol=1e-5, rtol=1e-5)


def test_a_learned_table_does_not_load_into_a_sine_model():
    config, state, _, _ = reference_case('vit_pytorch_1.26.14_cct_learnable', 'img_size')
    model = CCT(**dict(config, positional_embedding='sine'))
    with pytest.raises(ValueError, match=r"not this model's fixed sine table.*positional_embedding='learnable'"):
        model.load_state_dict(cct.convert_reference_state_dict(state))


def test_converter_refuses_unknown_keys():
    with pytest.raises(ValueError, match=r"does not know.*classifier.class_emb"):
        cct.convert_reference_state_dict({'classifier.class_emb': torch.zeros(1, 1, 4)})


def test_recorder_sees_every_layer_and_the_token_grid():
    from vit_pytorch.recorder import Recorder

    model = CCT(**tiny_cct_kwargs()).eval()
    img = torch.randn(2, 3, 16, 24)
    with Recorder(model) as recorder:
        model(img)
    # one conv + pool halves each side: 8 x 12 tokens, no cls token (the recording's side effects: test_recorder.py)
    assert recorder.attentions.shape == (2, 2, 2, 96, 96)
    assert recorder.grid == (8, 12) and recorder.num_prefix_tokens == 0
