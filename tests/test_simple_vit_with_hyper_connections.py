"""Hyper-connections: the paper's width and depth connections written out, its initialisation, the expansion and the
reduction of the streams, one stream as the plain pre-norm residual; vit-pytorch's weights."""

import re

import pytest
import torch
import torch.nn.functional as F

from helpers import move_off_initialisation, reference_case, tiny_vit_kwargs
from vit_pytorch import simple_vit_with_register_tokens
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.simple_vit_with_hyper_connections import HyperConnection, SimpleViT


def papers_connection(connection, streams, branch):
    """The paper's Eq. 2-5 token by token in matrix form, streams (b, n, e, d): A(H) = s_a tanh(norm(H) W_a) + A
    (e x (e + 1), [A_m A_r]), B(H) = s_b tanh(norm(H) W_b)^T + B (1 x e); the branch reads h_0 = H^T A_m, and
    H' = B^T T(h_0)^T + A_r^T H."""
    out = torch.empty_like(streams)
    for b in range(streams.shape[0]):
        inputs, static = [], []
        for n in range(streams.shape[1]):
            H = streams[b, n]                                                        # (e, d)
            A, B = connection.static_alpha, connection.static_beta[None]
            if connection.dynamic:
                normed = F.layer_norm(H, H.shape[-1:], connection.norm.weight, None, connection.norm.eps)
                A = connection.dynamic_alpha_scale * torch.tanh(normed @ connection.dynamic_alpha_fn) + A
                B = connection.dynamic_beta_scale * torch.tanh(normed @ connection.dynamic_beta_fn[:, None]).T + B
            inputs.append(H.T @ A[:, :1])                                            # h_0 (d, 1)
            static.append((B, A[:, 1:].T @ H))
        outputs = branch(torch.stack([h0[:, 0] for h0 in inputs])[None])[0]          # T over the row's tokens
        for n, (B, remixed) in enumerate(static):
            out[b, n] = B.T @ outputs[n][None] + remixed
    return out


def papers_encoder(model, x):
    """Copy x into every stream (H^0 = (h^0 .. h^0)^T), each branch through its hyper-connection, then the sum of
    the streams (h^L = sum_j h_j) through the final norm."""
    streams = x[:, :, None].expand(-1, -1, model.transformer.num_residual_streams, -1)
    for attn_connection, attn, ff_connection, ff in model.transformer.layers:
        streams = papers_connection(attn_connection, streams, attn)
        streams = papers_connection(ff_connection, streams, ff)
    return model.transformer.norm(streams.sum(dim=2))


@pytest.mark.parametrize('dynamic', [True, False])
def test_the_encoder_follows_the_papers_width_and_depth_connections(dynamic):
    torch.manual_seed(0)
    model = move_off_initialisation(SimpleViT(**tiny_vit_kwargs(depth=2, num_residual_streams=3, dynamic=dynamic)))
    model = model.double().eval()
    tokens = torch.randn(2, 5, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model.transformer(tokens), papers_encoder(model, tokens), rtol=1e-10, atol=1e-10)


def test_each_layer_starts_from_the_papers_initialisation():
    """A_m = e_(k mod n) for layer k, A_r = I, B = 1; the dynamic weights W at zero, their scales at 0.01."""
    model = SimpleViT(**tiny_vit_kwargs(depth=5, num_residual_streams=3))
    for k, (attn_connection, _, ff_connection, _) in enumerate(model.transformer.layers):
        for connection in (attn_connection, ff_connection):
            expected = torch.zeros(3, 4)
            expected[k % 3, 0] = 1.
            expected[:, 1:] = torch.eye(3)
            assert torch.equal(connection.static_alpha.detach(), expected)
            assert torch.equal(connection.static_beta.detach(), torch.ones(3))
            assert not connection.dynamic_alpha_fn.any() and not connection.dynamic_beta_fn.any()
            assert connection.dynamic_alpha_scale.item() == connection.dynamic_beta_scale.item() == pytest.approx(1e-2)


def test_static_connections_have_no_dynamic_parameters_and_the_same_weights_for_every_token():
    connection = HyperConnection(8, 3, layer_index=1, dynamic=False)
    assert {name for name, _ in connection.named_parameters()} == {'static_alpha', 'static_beta'}
    alpha, beta = connection.connections(torch.randn(2, 5, 3, 8))
    assert alpha.shape == (3, 4) and beta.shape == (3,)


@pytest.mark.parametrize('dynamic', [True, False])
def test_one_stream_at_the_papers_initialisation_is_simple_vits_pre_norm_residual(dynamic):
    """n = 1: A_m = A_r = B = 1 and zero dynamic weights give x + T(x) around every branch, so the model is the
    register-token SimpleViT with the same weights."""
    torch.manual_seed(0)
    kwargs = tiny_vit_kwargs(depth=3, num_register_tokens=2)
    plain = move_off_initialisation(simple_vit_with_register_tokens.SimpleViT(**kwargs)).double().eval()
    model = SimpleViT(**kwargs, num_residual_streams=1, dynamic=dynamic).double().eval()
    # its layer i's attention and MLP (layers.i.0, layers.i.1) are our layer i's branches (layers.i.1, layers.i.3)
    renamed = {re.sub(r'^transformer\.layers\.(\d+)\.([01])\.',
                      lambda m: f'transformer.layers.{m[1]}.{2 * int(m[2]) + 1}.', key): value
               for key, value in plain.state_dict().items()}
    missing, unexpected = model.load_state_dict(renamed, strict=False)
    assert not unexpected and all(re.match(r'transformer\.layers\.\d+\.[02]\.', key) for key in missing)
    img = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model(img), plain(img), rtol=1e-12, atol=1e-12)


def test_the_streams_start_as_copies_of_the_input_and_end_summed_before_the_norm(monkeypatch):
    torch.manual_seed(0)
    model = move_off_initialisation(SimpleViT(**tiny_vit_kwargs(depth=2, num_residual_streams=4))).eval()
    first = model.transformer.layers[0][0]
    seen = []
    width_connection = first.width_connection
    monkeypatch.setattr(first, 'width_connection', lambda streams: seen.append(streams) or width_connection(streams))
    tokens = torch.randn(2, 5, 32)
    with torch.no_grad():
        out, state = model.transformer(tokens, return_state=True)
    assert seen[0].shape == (2, 5, 4, 32)
    for stream in seen[0].unbind(dim=2):
        torch.testing.assert_close(stream, tokens, rtol=0, atol=0)
    assert state['streams'].shape == (2, 5, 4, 32)
    torch.testing.assert_close(out, model.transformer.norm(state['streams'].sum(dim=2)), rtol=1e-6, atol=1e-6)


def test_the_streams_differ_once_the_connections_move_off_their_initialisation():
    """At initialisation every stream of layer 0 takes the branch output alike; off it the streams carry different
    mixtures (else n streams would be one)."""
    torch.manual_seed(0)
    model = move_off_initialisation(SimpleViT(**tiny_vit_kwargs(depth=2, num_residual_streams=3))).eval()
    with torch.no_grad():
        _, state = model.transformer(torch.randn(2, 5, 32), return_state=True)
    streams = state['streams']
    assert (streams[:, :, 0] - streams[:, :, 1]).abs().max() > 1e-2


# vit-pytorch 1.26.14's module (tests/fixtures/make_stream_fixtures.py)


def test_vit_pytorchs_checkpoint_loads_strictly_and_gives_its_output():
    config, state_dict, img, expected = reference_case('vit_pytorch_1.26.14_simple_vit_with_hyper_connections',
                                                       'image_size')
    model = load_vit_pytorch(SimpleViT(**config), state_dict).eval()
    assert model.state_dict().keys() == state_dict.keys()
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-4, atol=1e-5)


def test_a_static_model_refuses_vit_pytorchs_checkpoint_naming_the_dynamic_connections():
    config, state_dict, _, _ = reference_case('vit_pytorch_1.26.14_simple_vit_with_hyper_connections', 'image_size')
    with pytest.raises(CheckpointError, match=r'dynamic.*dynamic=False'):
        load_vit_pytorch(SimpleViT(**config, dynamic=False), state_dict)


# clear errors


@pytest.mark.parametrize('name, value, error', [('num_residual_streams', 0, ValueError),
                                                ('num_residual_streams', 2.0, TypeError),
                                                ('dynamic', 'yes', TypeError)])
def test_a_bad_argument_is_refused_by_name(name, value, error):
    kwargs = dict(tiny_vit_kwargs(num_residual_streams=2), **{name: value})
    with pytest.raises(error, match=name):
        SimpleViT(**kwargs)


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block: 256 pixels, patches of 8 (1024 tokens), width 1024, depth 12, 8 streams."""
    model = SimpleViT(num_classes=1000, image_size=256, patch_size=8, dim=1024, depth=12, heads=8, mlp_dim=2048,
                      num_residual_streams=8)
    with torch.no_grad():
        assert model(torch.randn(3, 3, 256, 256)).shape == (3, 1000)
