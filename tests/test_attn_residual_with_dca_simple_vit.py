"""Multi-way attention residuals: each block's query, key and value inputs (and each MLP head's input) are their own
softmax over depth of every earlier output, written out by hand; the value mix is the residual; zero pseudo-queries
read the mean over depth; vit-pytorch's weights."""

import pytest
import torch

from helpers import move_off_initialisation, reference_case
from vit_pytorch.attn_residual_with_dca_simple_vit import DepthMix, SimpleViT
from vit_pytorch.pretrained import load_vit_pytorch

TINY = dict(image_size=(16, 24), patch_size=4, num_classes=5, dim=16, depth=3, heads=4, dim_head=8, mlp_dim=32)


def run_recording(model, img):
    """Per block: (its attention's inputs (xq, xk, xv), the attention's output, its MLP's input and output, the
    block's output); and the depth outputs it starts from (the patch tokens, the initial MLP's output)."""
    records, hooks = [], []
    for block in model.transformer.layers:
        record = {}
        records.append(record)
        hooks += [
            block.attn.register_forward_hook(lambda m, args, out, r=record: r.update(qkv=args, attn=out)),
            block.ff.register_forward_hook(lambda m, args, out, r=record: r.update(ff_in=args[0], ff=out)),
            block.register_forward_hook(lambda m, args, out, r=record: r.update(out=out)),
        ]
    try:
        model(img)
    finally:
        for hook in hooks:
            hook.remove()
    tokens = model.embed(img)
    return records, [tokens, model.initial_ff(tokens)]


def papers_mix(mix, values, stream, group):
    """sum_i softmax_i(w . RMSNorm(v_i)) v_i with w the pseudo-query of `stream` and `group`, RMSNorm(v) =
    v / sqrt(mean(v^2) + eps) * g, over the outputs `values` (each (b, n, dim)), in a loop over depth."""
    query = mix.pseudo_queries[stream, group]
    logits = torch.stack([(v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + mix.norm.eps) * mix.norm.weight * query)
                          .sum(-1) for v in values])
    alpha = logits.exp() / logits.exp().sum(dim=0)
    return sum(a[..., None] * v for a, v in zip(alpha, values))


@pytest.mark.parametrize('head_groups, ffn_heads', [(1, 1), (2, 2), (4, 1)])
def test_each_blocks_query_key_value_and_mlp_inputs_are_their_own_softmax_over_every_earlier_output(head_groups,
                                                                                                     ffn_heads):
    torch.manual_seed(0)
    model = SimpleViT(**TINY, head_groups=head_groups, ffn_heads=ffn_heads)
    model = move_off_initialisation(model, scale=0.5).double().eval()
    img = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    with torch.no_grad():
        records, history = run_recording(model, img)
        for block, record in zip(model.transformer.layers, records):
            for stream, given in enumerate(record['qkv']):
                expected = torch.stack([papers_mix(block.attn_res, history, stream, g) for g in range(head_groups)])
                torch.testing.assert_close(given, expected[0] if head_groups == 1 else expected, rtol=1e-10,
                                           atol=1e-10)
            if ffn_heads > 1:
                mid = record['out'] - record['ff']
                expected = torch.stack([papers_mix(block.ffn_res, [*history, mid], 0, g) for g in range(ffn_heads)])
                torch.testing.assert_close(record['ff_in'], expected, rtol=1e-10, atol=1e-10)
            history.append(record['out'])


@pytest.mark.parametrize('head_groups', [1, 2])
def test_the_value_mix_is_the_attentions_residual(head_groups):
    """A block's output is Attention(xq, xk, xv) + xv + MLP(...): the value mix (its mean over head groups) takes the
    place of the stream."""
    torch.manual_seed(0)
    model = move_off_initialisation(SimpleViT(**TINY, head_groups=head_groups), scale=0.5).double().eval()
    with torch.no_grad():
        records, _ = run_recording(model, torch.randn(2, 3, 16, 24, dtype=torch.float64))
    for record in records:
        xv = record['qkv'][2]
        residual = xv if head_groups == 1 else xv.mean(dim=0)
        torch.testing.assert_close(record['out'], record['attn'] + residual + record['ff'], rtol=1e-12, atol=1e-12)
        assert (record['ff_in'] - (record['attn'] + residual)).abs().max() == 0


@pytest.mark.parametrize('groups, merge_groups', [(1, True), (2, False)])
def test_the_depth_mix_is_the_same_with_and_without_gradients(groups, merge_groups):
    """Without gradients the mix runs as one einsum over the stacked outputs, with them as a sum over the outputs
    (nothing stacked kept for the backward pass): the same numbers."""
    torch.manual_seed(0)
    mix = move_off_initialisation(DepthMix(16, streams=3, groups=groups, merge_groups=merge_groups), scale=0.5).double()
    history = [torch.randn(2, 5, 16, dtype=torch.float64) for _ in range(4)]
    with torch.no_grad():
        stacked = mix(history)
    summed = mix(history)
    for a, b in zip(stacked, summed, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


def test_zero_pseudo_queries_give_every_input_the_mean_of_the_earlier_outputs():
    torch.manual_seed(0)
    model = SimpleViT(**TINY).double().eval()
    with torch.no_grad():
        records, history = run_recording(model, torch.randn(2, 3, 16, 24, dtype=torch.float64))
    for record in records:
        for given in record['qkv']:
            torch.testing.assert_close(given, torch.stack(history).mean(dim=0), rtol=1e-12, atol=1e-12)
        history.append(record['out'])


# vit-pytorch 1.26.14's module (tests/fixtures/make_stream_fixtures.py)


@pytest.mark.parametrize('name', ['attn_residual_with_dca_simple_vit', 'attn_residual_with_dca_simple_vit_groups'])
def test_vit_pytorchs_checkpoint_loads_strictly_and_gives_its_output(name):
    config, state_dict, img, expected = reference_case(f'vit_pytorch_1.26.14_{name}', 'image_size')
    model = load_vit_pytorch(SimpleViT(**config), state_dict).eval()
    assert model.state_dict().keys() == state_dict.keys()
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-4, atol=1e-5)


# clear errors


@pytest.mark.parametrize('kwargs, message', [(dict(head_groups=3), r'head_groups must divide heads=4, got 3'),
                                             (dict(ffn_heads=3), r'ffn_heads must divide mlp_dim=32, got 3'),
                                             (dict(eps=0.), 'eps'),
                                             (dict(gate=1), 'gate')])
def test_a_bad_argument_is_refused_by_name(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        SimpleViT(**dict(TINY, **kwargs))


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                 # vit-pytorch's own sizes: seconds on 2 cores
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block: 32 pixels, patches of 8, width 32, depth 2; shared, 2 and 4 head groups with 4 and 2
    MLP heads; every pseudo-query and the gate get a gradient."""
    for head_groups, ffn_heads in ((1, 1), (2, 4), (4, 2)):
        model = SimpleViT(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=4, dim_head=8,
                          mlp_dim=64, head_groups=head_groups, ffn_heads=ffn_heads)
        logits = model(torch.randn(2, 3, 32, 32))
        assert logits.shape == (2, 10)
        logits.sum().backward()
        block = model.transformer.layers[-1]
        assert block.attn_res.pseudo_queries.grad is not None
        assert block.ffn_res is None or block.ffn_res.pseudo_queries.grad is not None
        assert block.attn.to_gate[0].weight.grad is not None
