"""vit-pytorch's building blocks keep their names, signatures and weights here, and the stack the variants compose
their encoders from hands state from layer to layer.

The fixtures were written by vit-pytorch 1.26.14 itself with tests/fixtures/make_vit_pytorch_block_fixtures.py (its
docstring has the command).
"""

import weakref

import pytest
import torch
from einops import rearrange
from helpers import load_fixture

from vit_pytorch import simple_vit, vit

BLOCK_CASES = ['vit_pytorch_1.26.14_transformer', 'vit_pytorch_1.26.14_transformer_one_head',
               'vit_pytorch_1.26.14_simple_vit_transformer']


def test_the_names_code_built_on_vit_pytorch_imports_are_there():
    from vit_pytorch.simple_vit import Rearrange, pair as simple_pair
    from vit_pytorch.vit import pair, repeat

    assert pair(3) == simple_pair(3) == (3, 3)
    assert callable(vit.Transformer) and callable(simple_vit.Transformer) and callable(simple_vit.posemb_sincos_2d)
    assert repeat(torch.ones(2), 'd -> b d', b=3).shape == (3, 2)
    assert Rearrange('b n d -> b d n')(torch.zeros(1, 2, 3)).shape == (1, 3, 2)


def test_vit_attention_and_feedforward_take_vit_pytorchs_positional_arguments():
    attention = vit.Attention(16, 2, 8, 0.1)
    feedforward = vit.FeedForward(16, 24, 0.1)
    assert (attention.heads, attention.scale, attention.dropout) == (2, 8 ** -0.5, 0.1)
    assert attention.to_qkv.weight.shape == (3 * 2 * 8, 16)
    assert feedforward.net[1].weight.shape == (24, 16) and feedforward.net[3].p == 0.1


@pytest.mark.parametrize('name', BLOCK_CASES)
def test_vit_pytorchs_transformer_weights_load_strictly_and_give_its_output(name):
    metadata, state_dict, tensors = load_fixture(name)
    module_name, class_name = metadata['class'].split('.')
    cls = getattr({'vit': vit, 'simple_vit': simple_vit}[module_name], class_name)
    model = cls(*metadata['args']).eval()            # vit-pytorch's positional arguments
    model.load_state_dict(state_dict, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], atol=1e-5, rtol=1e-5)


def test_posemb_sincos_2d_takes_vit_pytorchs_arguments_and_gives_its_table():
    metadata, _, tensors = load_fixture('vit_pytorch_1.26.14_simple_vit_transformer')
    for i, (h, w, dim, temperature) in enumerate(metadata['posemb_args']):
        table = simple_vit.posemb_sincos_2d(h=h, w=w, dim=dim, temperature=temperature, dtype=torch.float32)
        torch.testing.assert_close(table, tensors[f'posemb.{i}'], atol=1e-6, rtol=0)


# Stack state: value residual learning (ResFormer, arXiv 2410.17897): every later layer attends over the mean of
# its own values and the first layer's


class ValueResidualStack(vit.Stack):
    @staticmethod
    def step(branches, x, state):
        attn, ff = branches
        q, k, v = attn.qkv(x)
        first = state.get('values', v)
        out = attn.attend(q, k, (v + first) / 2)
        x = attn.to_out(rearrange(out, 'b h n d -> b n (h d)')) + x
        return ff(x) + x, {'values': first}


def value_residual_stack(depth=3, dim=16):
    torch.manual_seed(0)
    return ValueResidualStack([(vit.Attention(dim, 2, 8), vit.FeedForward(dim, 32)) for _ in range(depth)])


def test_later_stack_layers_attend_over_the_values_the_first_layer_left():
    stack = value_residual_stack()
    own, attended = [], []                  # per layer: the values it projects, the values it attends over

    def recording(attn):
        qkv, attend = attn.qkv, attn.attend

        def recorded_qkv(x):
            q, k, v = qkv(x)
            own.append(v)
            return q, k, v

        def recorded_attend(q, k, v, **kwargs):
            attended.append(v)
            return attend(q, k, v, **kwargs)
        attn.qkv, attn.attend = recorded_qkv, recorded_attend

    for attn, _ in stack.layers:
        recording(attn)
    with torch.no_grad():
        stack(torch.randn(2, 5, 16))
    torch.testing.assert_close(attended[0], own[0])
    for later in (1, 2):
        assert not torch.allclose(own[later], own[0])
        torch.testing.assert_close(attended[later], (own[later] + own[0]) / 2)


def test_a_stack_layer_cannot_change_the_state_in_place():
    class Mutating(vit.Stack):
        @staticmethod
        def step(branches, x, state):
            state['seen'] = x
            return x, {}

    with pytest.raises(TypeError):
        Mutating([(vit.Attention(16, 2, 8),)])(torch.randn(1, 3, 16))


def test_state_passing_under_grad_checkpointing_gives_the_same_output_and_gradients():
    results = []
    for checkpointed in (False, True):
        stack = value_residual_stack()
        stack.grad_checkpointing = checkpointed
        calls = []
        for attn, _ in stack.layers:
            attn.norm.register_forward_hook(lambda *_: calls.append(1))
        x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
        out = stack(x)
        out.square().sum().backward()
        assert len(calls) == 3 * (2 if checkpointed else 1)        # checkpointing re-ran every layer
        with torch.no_grad():
            plain = x
            for entry in stack.layers:
                plain = stack.layer(entry, plain)
        assert not torch.allclose(out, plain)                       # the state reached the later layers
        results.append((out.detach(), x.grad, [p.grad for p in stack.parameters()]))
    (out, x_grad, grads), (out_c, x_grad_c, grads_c) = results
    torch.testing.assert_close(out_c, out)
    torch.testing.assert_close(x_grad_c, x_grad)
    for grad_c, grad in zip(grads_c, grads):
        torch.testing.assert_close(grad_c, grad)


@pytest.mark.parametrize('return_layers', [False, True])
def test_a_stack_keeps_earlier_layer_outputs_only_when_they_are_returned(return_layers):
    """Without return_layers a layer's output is freed once the next layer has read it (a list of them held depth
    tensors to the end of the stack: SimpleViT's inference at depth 48 peaked 57 MiB over its start against 11 MiB
    without; docs/blocks.md); with it, every output stays and is returned."""
    torch.manual_seed(0)
    stack = vit.Stack([(vit.Attention(16, 2, 8), vit.FeedForward(16, 32)) for _ in range(5)])
    produced, alive_at_each_layer = [], []
    step = stack.step

    def watching_step(entry, x, state, **kwargs):
        alive_at_each_layer.append(sum(ref() is not None for ref in produced))
        out, entries = step(entry, x, state, **kwargs)
        produced.append(weakref.ref(out))
        return out, entries

    stack.step = watching_step
    with torch.no_grad():
        returned = stack(torch.randn(2, 5, 16), return_layers=return_layers)
    if return_layers:
        assert alive_at_each_layer == [0, 1, 2, 3, 4] and len(returned[1]) == 5
    else:
        assert alive_at_each_layer == [0, 1, 1, 1, 1]      # only the input of the layer about to run
