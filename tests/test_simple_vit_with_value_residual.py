"""Value residuals: every later layer's values reach back to the first layer's, mixed by the explicit formula;
vit-pytorch's weights."""

import pytest
import torch

from helpers import load_fixture, move_off_initialisation, reference_case, tiny_vit_kwargs
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.simple_vit_with_value_residual import SimpleViT


def attended_values(model, tokens):
    """Each layer's attention input (b, n, dim) and attended values before the output projection (b, n, heads *
    dim_head), in one run of the encoder on `tokens`."""
    seen = []
    hooks = [layer[0].to_out.register_forward_hook(lambda module, args, output: seen.append(args[0]))
             for layer in model.transformer.layers]
    hooks += [layer[0].register_forward_hook(lambda module, args, output: seen.append(args[0]))
              for layer in model.transformer.layers]
    try:
        model.transformer(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return list(zip(seen[1::2], seen[0::2]))


def explicit_encoder(model, x):
    """The encoder written out in float64: layer 1 attends over its values V_1; layer n > 1 over
    lambda V_n + (1 - lambda) V_1, lambda = sigmoid(W LN(x) + b) per token and head (or the fixed mix)."""
    first = None
    for attn, ff in model.transformer.layers:
        normed = torch.nn.functional.layer_norm(x, x.shape[-1:], attn.norm.weight, attn.norm.bias, attn.norm.eps)
        q, k, v = (normed @ attn.to_qkv.weight.T).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (attn.heads, -1)).transpose(1, 2) for t in (q, k, v))   # (b, h, n, d)
        if first is None:
            first = v
        else:
            if hasattr(attn, 'to_residual_mix'):
                linear = attn.to_residual_mix[0]
                mix = torch.sigmoid(normed @ linear.weight.T + linear.bias).transpose(1, 2)[..., None]  # (b, h, n, 1)
            else:
                mix = attn.value_residual_mix
            v = mix * v + (1 - mix) * first
        weights = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        x = (weights @ v).transpose(1, 2).flatten(2) @ attn.to_out.weight.T + x
        x = ff(x) + x
    return model.transformer.norm(x)


@pytest.mark.parametrize('mix', [None, 0.5, 0.2])
def test_the_encoder_mixes_each_later_layers_values_with_the_first_layers_by_the_formula(mix):
    torch.manual_seed(0)
    model = move_off_initialisation(SimpleViT(**tiny_vit_kwargs(depth=3, value_residual_mix=mix))).double().eval()
    tokens = torch.randn(2, 12, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model.transformer(tokens), explicit_encoder(model, tokens), rtol=1e-10, atol=1e-10)


def test_perturbing_only_the_first_layers_value_projection_changes_every_later_layers_attention_output():
    """With every attention's output projection zeroed, no values reach the stream: every layer reads the same
    input, and only the value residual can carry a change of the first layer's values into later attentions."""
    torch.manual_seed(0)
    model = move_off_initialisation(SimpleViT(**tiny_vit_kwargs(depth=4))).double().eval()
    tokens = torch.randn(2, 12, 32, dtype=torch.float64)
    first = model.transformer.layers[0][0].to_qkv.weight
    inner = first.shape[0] // 3
    with torch.no_grad():
        for layer in model.transformer.layers:
            layer[0].to_out.weight.zero_()
        before = attended_values(model, tokens)
        first[2 * inner:] += torch.randn(inner, first.shape[1], dtype=torch.float64)    # rows of V only
        after = attended_values(model, tokens)
    for layer, ((input_before, output_before), (input_after, output_after)) in enumerate(zip(before, after)):
        torch.testing.assert_close(input_after, input_before, rtol=0, atol=0)
        assert (output_after - output_before).abs().max() > 1e-2, f'layer {layer} did not see the first values'


def test_a_mix_of_one_leaves_the_first_layers_values_out():
    """lambda = 1 is the plain SimpleViT: the layers attend over their own values only."""
    torch.manual_seed(0)
    model = move_off_initialisation(SimpleViT(**tiny_vit_kwargs(depth=3, value_residual_mix=1.0))).double().eval()
    tokens = torch.randn(2, 12, 32, dtype=torch.float64)
    with torch.no_grad():
        mixed = model.transformer(tokens)
        plain = tokens
        for attn, ff in model.transformer.layers:
            plain = attn(plain)[0] + plain
            plain = ff(plain) + plain
    torch.testing.assert_close(mixed, model.transformer.norm(plain), rtol=1e-12, atol=1e-12)


def test_the_first_layer_has_no_mix_and_every_later_layer_learns_one_by_default():
    model = SimpleViT(**tiny_vit_kwargs(depth=3))
    assert [hasattr(layer[0], 'to_residual_mix') for layer in model.transformer.layers] == [False, True, True]
    assert not any(hasattr(layer[0], 'to_residual_mix')
                   for layer in SimpleViT(**tiny_vit_kwargs(depth=3, value_residual_mix=0.5)).transformer.layers)


# the official code (Zcchill/Value-Residual-Learning @ 95652f6, ResFormer's Llama attention; fixture written by
# tests/fixtures/make_llm_attention_official_fixtures.py value_residual, run outside this repository)


def official_stack():
    """(our encoder holding the official attention layers, with every MLP zeroed and no final norm, the fixture's
    tensors): each layer then adds its attention of the LayerNormed stream, as the fixture's stream does. Its q, k
    and v projections are our to_qkv, its o_proj our to_out; the mix is the paper's fixed 0.5."""
    metadata, state, tensors = load_fixture('value_residual_official')
    config = metadata['config']
    dim, heads, depth = config['hidden_size'], config['num_attention_heads'], config['num_hidden_layers']
    model = SimpleViT(image_size=8, patch_size=4, num_classes=3, dim=dim, depth=depth, heads=heads,
                      dim_head=config['head_dim'], mlp_dim=32, value_residual_mix=0.5).double().eval()
    with torch.no_grad():
        for i, (attn, ff) in enumerate(model.transformer.layers):
            attn.to_qkv.weight.copy_(torch.cat([state[f'layers.{i}.{x}_proj.weight'] for x in 'qkv']))
            attn.to_out.weight.copy_(state[f'layers.{i}.o_proj.weight'])
            ff[-1].weight.zero_()
            ff[-1].bias.zero_()
    model.transformer.norm = torch.nn.Identity()
    return model.transformer, tensors


def test_the_official_codes_attention_layers_mix_their_values_with_the_first_layers_as_ours():
    # float64 from float32 weights; the official softmax runs in float32 whatever the input: measured 5.3e-8 on a
    # stream of size 3.1 after three layers (0.0 with that softmax's arithmetic given to ours, on the machine's
    # AVX kernels; its float32 exp rounds otherwise under ATEN_CPU_CAPABILITY=default: 4e-8). Mixing with the
    # previous layer's values instead of the first's moves the stream by 0.23, a mix of 0.6 instead of 0.5 by 0.12
    transformer, tensors = official_stack()
    with torch.no_grad():
        stream = transformer(tensors['tokens'])
    torch.testing.assert_close(stream, tensors['stream'], rtol=0, atol=1e-6)


# vit-pytorch 1.26.14's module (tests/fixtures/make_value_orthog_fixtures.py)


def test_vit_pytorchs_checkpoint_loads_strictly_and_gives_its_output():
    config, state_dict, img, expected = reference_case('vit_pytorch_1.26.14_simple_vit_with_value_residual',
                                                       'image_size')
    model = load_vit_pytorch(SimpleViT(**config), state_dict).eval()
    assert model.state_dict().keys() == state_dict.keys()
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-4, atol=1e-5)


def test_a_fixed_mix_model_refuses_vit_pytorchs_checkpoint_naming_the_learned_mix():
    config, state_dict, _, _ = reference_case('vit_pytorch_1.26.14_simple_vit_with_value_residual', 'image_size')
    with pytest.raises(CheckpointError, match=r'learns the mix .*value_residual_mix=0.5'):
        load_vit_pytorch(SimpleViT(**config, value_residual_mix=0.5), state_dict)


# clear errors


@pytest.mark.parametrize('value, error', [(1.5, ValueError)])
def test_a_bad_mix_is_refused_by_name(value, error):
    with pytest.raises(error, match='value_residual_mix'):
        SimpleViT(**tiny_vit_kwargs(value_residual_mix=value))


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block: 256 pixels, patches of 8 (1024 tokens), width 1024, depth 6."""
    model = SimpleViT(num_classes=1000, image_size=256, patch_size=8, dim=1024, depth=6, heads=8, mlp_dim=2048)
    with torch.no_grad():
        assert model(torch.randn(2, 3, 256, 256)).shape == (2, 1000)
