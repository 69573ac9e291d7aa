"""Attention residuals: every branch reads the paper's softmax over depth of all earlier outputs, written out by hand;
a zero query is the mean over depth; an earlier run's history joins the mix; vit-pytorch's other function refused."""

import functools

import pytest
import torch

from helpers import move_off_initialisation, reference_case, tiny_vit_kwargs
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.simple_vit_attn_residual import SimpleViTAttnResidual


def branch_inputs_and_outputs(model, img, **kwargs):
    """Every branch's input and output in order (attention, MLP, attention, ...), and the model's return."""
    seen = []
    hooks = []
    for _, attn, _, ff in model.transformer.layers:
        for branch in (attn, ff):
            hooks.append(branch.register_forward_hook(lambda module, args, output: seen.append((args[0], output))))
    try:
        returned = model(img, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen, returned


def papers_mix(mix, values):
    """h = sum_i alpha_i v_i, alpha_i = softmax_i(q . RMSNorm(v_i)), RMSNorm(v) = v / sqrt(mean(v^2) + eps) * g; q the
    pseudo-query, or the token's latest output; per token, in a Python loop over depth."""
    keys = [v / torch.sqrt(v.pow(2).mean(dim=-1, keepdim=True) + mix.norm.eps) * mix.norm.weight for v in values]
    query = values[-1] if mix.query is None else mix.query
    logits = torch.stack([(k * query).sum(dim=-1) for k in keys])                 # (depth, b, n)
    alpha = logits.exp() / logits.exp().sum(dim=0)
    return sum(a[..., None] * v for a, v in zip(alpha, values))


@pytest.mark.parametrize('learned_query, block_size', [(True, None), (False, None), (True, 2), (True, 3), (True, 6)])
def test_each_branch_reads_the_softmax_over_its_sources(learned_query, block_size):
    """Full AttnRes (no block_size): every earlier output. Block AttnRes at depth 3 (6 branches; blocks of one
    layer, of 3 branches (a boundary before the second MLP), one block): the completed blocks and the partial sum."""
    torch.manual_seed(0)
    model = SimpleViTAttnResidual(**tiny_vit_kwargs(depth=3, learned_query=learned_query, block_size=block_size))
    model = move_off_initialisation(model, scale=0.5).double().eval()
    img = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    sources_of = (lambda values, index: values) if block_size is None else functools.partial(
        block_sources, block_size=block_size)
    with torch.no_grad():
        seen, (_, history) = branch_inputs_and_outputs(model, img, return_history=True)
        values = [model.embed(img)]
        mixes = [mix for attn_mix, _, ff_mix, _ in model.transformer.layers for mix in (attn_mix, ff_mix)]
        for index, (mix, (branch_input, branch_output)) in enumerate(zip(mixes, seen), start=1):
            sources = sources_of(values, index=index)
            expected = sources[0] if mix is None else papers_mix(mix, sources)
            torch.testing.assert_close(branch_input, expected, rtol=1e-10, atol=1e-10)
            values.append(branch_output)
        stack = sources_of(values, index=len(values))        # as the next branch would: every output, or b_0 .. b_N
        assert len(history) == len(stack) == (1 + 2 * 3 if block_size is None else 6 // block_size + 1)
        exact = 0 if block_size is None else 1e-12            # Full AttnRes returns the outputs themselves
        for returned, value in zip(history, stack):
            torch.testing.assert_close(returned, value, rtol=exact, atol=exact)
        features = model.transformer.final_norm(papers_mix(model.transformer.final_pool, stack))
        torch.testing.assert_close(model.forward_features(img), features, rtol=1e-10, atol=1e-10)


def test_the_mix_gives_weight_to_more_than_the_latest_output():
    """Off its initialisation the mix is no plain residual: the first MLP's input is neither the attention's output
    nor the patch tokens, nor their sum."""
    torch.manual_seed(0)
    model = move_off_initialisation(SimpleViTAttnResidual(**tiny_vit_kwargs(depth=2)), scale=0.5).eval()
    img = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        seen, _ = branch_inputs_and_outputs(model, img)
        tokens, attention_output, ff_input = model.embed(img), seen[0][1], seen[1][0]
    weights = model.transformer.layers[0][2].weights([tokens, attention_output])
    assert weights.min() > 1e-3 and weights.max() < 1 - 1e-3
    for other in (tokens, attention_output, tokens + attention_output):
        assert (ff_input - other).abs().max() > 1e-2


def test_a_zero_pseudo_query_reads_the_mean_of_the_earlier_outputs():
    """The paper starts every w_l at zero: a uniform softmax, h_l = mean of v_0 .. v_(l-1)."""
    torch.manual_seed(0)
    model = SimpleViTAttnResidual(**tiny_vit_kwargs(depth=2)).double().eval()
    img = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    with torch.no_grad():
        seen, _ = branch_inputs_and_outputs(model, img)
        values = [model.embed(img)] + [output for _, output in seen]
    for index in (1, 2, 3):
        torch.testing.assert_close(seen[index][0], torch.stack(values[:index + 1]).mean(dim=0), rtol=1e-12,
                                   atol=1e-12)


def test_an_earlier_runs_history_comes_first_in_the_mix():
    torch.manual_seed(0)
    model = move_off_initialisation(SimpleViTAttnResidual(**tiny_vit_kwargs(depth=2)), scale=0.5).double().eval()
    img = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    with torch.no_grad():
        _, earlier = model(img.flip(-1), return_history=True)
        seen, (_, history) = branch_inputs_and_outputs(model, img, history=earlier, return_history=True)
        alone = model(img)
        again = model(img, history=earlier)
    assert len(history) == len(earlier) + 1 + 2 * 2
    for returned, given in zip(history, earlier):
        assert returned is given
    mix = model.transformer.layers[0][2]
    values = [*earlier, model.embed(img), seen[0][1]]
    torch.testing.assert_close(seen[1][0], papers_mix(mix, values), rtol=1e-10, atol=1e-10)
    assert (again - alone).abs().max() > 1e-3


# Block AttnRes (arXiv 2603.15031, Eq. 5-6 and the official README's `block_attn_res`): blocks of branches


def block_sources(values, block_size, index):
    """What branch `index` (1-based: v_index is its output) reads in Block AttnRes, from the patch tokens v_0 and
    the outputs v_1 .. v_(index-1) (`values`): b_0 = v_0, each completed block's sum b_m = v_((m-1)S+1) + .. +
    v_(mS), then, past a block's first branch, the partial sum of the block's earlier outputs."""
    completed = (index - 1) // block_size
    blocks = [values[0]] + [sum(values[(m - 1) * block_size + 1:m * block_size + 1]) for m in range(1, completed + 1)]
    partial = values[completed * block_size + 1:index]
    return blocks + ([sum(partial)] if partial else [])


def test_blocks_of_one_branch_are_full_attnres():
    """N = L: every block one output, no partial sum: the same weights give Full AttnRes's every branch input,
    history and logits."""
    torch.manual_seed(0)
    full = move_off_initialisation(SimpleViTAttnResidual(**tiny_vit_kwargs(depth=3)), scale=0.5).double().eval()
    block = SimpleViTAttnResidual(**tiny_vit_kwargs(depth=3, block_size=1)).double().eval()
    block.load_state_dict(full.state_dict())
    img = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    with torch.no_grad():
        seen_full, (logits_full, history_full) = branch_inputs_and_outputs(full, img, return_history=True)
        seen_block, (logits_block, history_block) = branch_inputs_and_outputs(block, img, return_history=True)
    for (input_full, _), (input_block, _) in zip(seen_full, seen_block, strict=True):
        torch.testing.assert_close(input_block, input_full, rtol=1e-12, atol=1e-12)
    assert len(history_block) == len(history_full) == 1 + 2 * 3
    torch.testing.assert_close(logits_block, logits_full, rtol=1e-12, atol=1e-12)


def test_one_block_reads_a_sigmoid_gate_between_the_tokens_and_the_sum_of_the_outputs():
    """N = 1: past the first branch, every branch reads a softmax over two sources, the patch tokens and the sum
    of all earlier outputs: a * v_0 + (1 - a) * (v_1 + .. + v_(l-1)), a = sigmoid(w . (RMSNorm(v_0) - RMSNorm(s)))."""
    torch.manual_seed(0)
    model = SimpleViTAttnResidual(**tiny_vit_kwargs(depth=2, block_size=4))
    model = move_off_initialisation(model, scale=0.5).double().eval()
    img = torch.randn(2, 3, 16, 24, dtype=torch.float64)

    def rms_normed(v, norm):
        return v / torch.sqrt(v.pow(2).mean(dim=-1, keepdim=True) + norm.eps) * norm.weight

    with torch.no_grad():
        seen, _ = branch_inputs_and_outputs(model, img)
        tokens = model.embed(img)
        mixes = [mix for attn_mix, _, ff_mix, _ in model.transformer.layers for mix in (attn_mix, ff_mix)]
        torch.testing.assert_close(seen[0][0], tokens, rtol=0, atol=0)
        for index in (1, 2, 3):
            mix, total = mixes[index], sum(output for _, output in seen[:index])
            gate = torch.sigmoid(((rms_normed(tokens, mix.norm) - rms_normed(total, mix.norm)) * mix.query).sum(-1))
            expected = gate[..., None] * tokens + (1 - gate[..., None]) * total
            torch.testing.assert_close(seen[index][0], expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('block_size, kept', [(1, 9), (2, 5), (4, 3), (8, 2)])
def test_the_stack_keeps_one_tensor_a_block(block_size, kept):
    """Depth 4 (8 branches): after every layer the state holds the completed blocks and at most one partial sum,
    never more than 8 / block_size + 1 tensors; the run returns the 8 / block_size + 1 block representations."""
    model = SimpleViTAttnResidual(**tiny_vit_kwargs(depth=4, block_size=block_size)).eval()
    transformer, held = model.transformer, []
    step = transformer.step

    def counting_step(entry, x, state, **kwargs):
        out, entries = step(entry, x, state, **kwargs)
        held.append(len(entries['history']) + (entries['partial'] is not None))
        return out, entries

    transformer.step = counting_step
    with torch.no_grad():
        _, history = model(torch.randn(2, 3, 16, 24), return_history=True)
    assert len(history) == kept
    assert len(held) == 4 and max(held) <= kept and held[-1] == kept


@pytest.mark.parametrize('block_size', [1, 2, 4])
def test_every_parameter_gets_a_gradient_with_blocks(block_size):
    torch.manual_seed(0)
    model = move_off_initialisation(SimpleViTAttnResidual(**tiny_vit_kwargs(depth=2, block_size=block_size)))
    model(torch.randn(2, 3, 16, 24)).square().sum().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().max() > 0]
    assert not missing


def test_blocks_add_no_parameters():
    """Block AttnRes reads the same pseudo-queries and RMSNorms: the same state_dict keys and shapes."""
    full = SimpleViTAttnResidual(**tiny_vit_kwargs(depth=2)).state_dict()
    block = SimpleViTAttnResidual(**tiny_vit_kwargs(depth=2, block_size=2)).state_dict()
    assert {k: v.shape for k, v in block.items()} == {k: v.shape for k, v in full.items()}


def test_an_earlier_runs_blocks_come_first_with_blocks():
    """With `block_size`, `return_history` gives the block representations, and `history` puts them before b_0."""
    torch.manual_seed(0)
    model = SimpleViTAttnResidual(**tiny_vit_kwargs(depth=2, block_size=2))
    model = move_off_initialisation(model, scale=0.5).double().eval()
    img = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    with torch.no_grad():
        _, earlier = model(img.flip(-1), return_history=True)
        seen, (_, history) = branch_inputs_and_outputs(model, img, history=earlier, return_history=True)
    assert len(earlier) == 3 and len(history) == 3 + 3
    for returned, given in zip(history, earlier):
        assert returned is given
    tokens, first = model.embed(img), seen[0][1]
    torch.testing.assert_close(seen[0][0], tokens, rtol=0, atol=0)
    first_block = first + seen[1][1]
    torch.testing.assert_close(seen[1][0], papers_mix(model.transformer.layers[0][2], [*earlier, tokens, first]),
                               rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(seen[2][0], papers_mix(model.transformer.layers[1][0], [*earlier, tokens, first_block]),
                               rtol=1e-10, atol=1e-10)


# vit-pytorch 1.26.14's module (tests/fixtures/make_stream_fixtures.py) computes another function


@pytest.mark.parametrize('name', ['simple_vit_attn_residual', 'simple_vit_attn_residual_token_query'])
def test_vit_pytorchs_checkpoint_is_refused_naming_its_cross_attention_over_depth(name):
    config, state_dict, _, _ = reference_case(f'vit_pytorch_1.26.14_{name}', 'image_size')
    with pytest.raises(CheckpointError, match=r'cross-attention .*convex combination'):
        load_vit_pytorch(SimpleViTAttnResidual(**config), state_dict)


# clear errors


def test_a_history_that_is_not_a_list_of_tensors_is_refused_by_name():
    model = SimpleViTAttnResidual(**tiny_vit_kwargs())
    with pytest.raises(TypeError, match='history must be a list of tensors'):
        model(torch.randn(2, 3, 16, 24), history=torch.randn(2, 12, 32))


def test_a_history_of_another_shape_is_refused_naming_the_entry():
    model = SimpleViTAttnResidual(**tiny_vit_kwargs())
    with pytest.raises(ValueError, match=r'history\[1\] must have the shape .*\(2, 12, 32\), got \(2, 11, 32\)'):
        model(torch.randn(2, 3, 16, 24), history=[torch.randn(2, 12, 32), torch.randn(2, 11, 32)])


@pytest.mark.parametrize('block_size, error, message', [
    (3, ValueError, r'block_size must divide 2 \* depth = 4 .*got 3'),
    (0, ValueError, r'block_size must be a positive int, got 0'),
    (2.0, TypeError, r'block_size must be a positive int, got 2\.0'),
])
def test_a_bad_block_size_is_refused_by_name(block_size, error, message):
    with pytest.raises(error, match=message):
        SimpleViTAttnResidual(**tiny_vit_kwargs(depth=2, block_size=block_size))


def test_blocks_with_a_token_query_are_refused():
    with pytest.raises(ValueError, match=r'block_size .*needs learned_query=True'):
        SimpleViTAttnResidual(**tiny_vit_kwargs(block_size=2, learned_query=False))


def test_a_bad_learned_query_is_refused_by_name():
    with pytest.raises(TypeError, match='learned_query'):
        SimpleViTAttnResidual(**tiny_vit_kwargs(learned_query='yes'))


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block: 256 pixels, patches of 32, width 1024, depth 6; a second run given the first's
    history, with either query."""
    for learned_query in (True, False):
        model = SimpleViTAttnResidual(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16,
                                      mlp_dim=2048, learned_query=learned_query)
        img = torch.randn(2, 3, 256, 256)
        with torch.no_grad():
            preds, history = model(img, return_history=True)
            assert preds.shape == (2, 1000)
            preds, _ = model(img, history=history, return_history=True)
        assert preds.shape == (2, 1000)
