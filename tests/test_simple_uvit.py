"""U-ViT's long skips: the i-th shallow block's output reaches the mirroring deep block (by perturbing it), joined
by a Linear on [x, skip]; which blocks are shallow, middle and deep; vit-pytorch's other function refused; the
paper's models counted against the official code's."""

import pytest
import torch

from helpers import count, move_off_initialisation, official_counts, reference_case, tiny_vit_kwargs
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.simple_uvit import CONFIGS, SimpleUViT, uvit


def skip_inputs(model, tokens, perturb=None):
    """Each deep block's skip Linear input [x, skip] (b, n, 2 dim) by block number, and every block's output; with
    `perturb` (block number, delta) that block's output moved by delta (through its MLP's output)."""
    seen, hooks = {}, []
    for index, (combine_skip, _, ff) in enumerate(model.transformer.layers):
        if combine_skip is not None:
            hooks.append(combine_skip.register_forward_hook(
                lambda module, args, output, index=index: seen.__setitem__(index, args[0])))
        if perturb is not None and perturb[0] == index:
            hooks.append(ff.register_forward_hook(lambda module, args, output: output + perturb[1]))
    try:
        _, outputs = model.transformer(tokens, return_layers=True)
    finally:
        for hook in hooks:
            hook.remove()
    return seen, outputs


@pytest.mark.parametrize('depth', [5, 7, 6])
def test_the_i_th_shallow_blocks_output_reaches_block_depth_minus_1_minus_i_through_its_skip_alone(depth):
    """Moving shallow block i's output by delta moves the skip half of block depth - 1 - i's join by exactly delta,
    and leaves the skips from the shallower blocks (i' < i) as they were."""
    torch.manual_seed(0)
    model = move_off_initialisation(SimpleUViT(**tiny_vit_kwargs(depth=depth, num_register_tokens=2))).double().eval()
    tokens = torch.randn(2, 14, 32, dtype=torch.float64)
    delta = torch.randn(2, 14, 32, dtype=torch.float64)
    dim = 32
    with torch.no_grad():
        before, _ = skip_inputs(model, tokens)
        for shallow in range(depth // 2):
            after, _ = skip_inputs(model, tokens, perturb=(shallow, delta))
            for other in range(depth // 2):
                moved = after[depth - 1 - other][..., dim:] - before[depth - 1 - other][..., dim:]
                if other == shallow:
                    torch.testing.assert_close(moved, delta, rtol=1e-10, atol=1e-10)
                elif other < shallow:
                    assert moved.abs().max() == 0


@pytest.mark.parametrize('depth', [5, 6])
def test_a_deep_block_joins_the_stream_and_the_skip_by_a_linear_on_their_concatenation(depth):
    """Block j's join is W [x; skip] + b with x the previous block's output and skip the output of block
    depth - 1 - j."""
    torch.manual_seed(0)
    model = move_off_initialisation(SimpleUViT(**tiny_vit_kwargs(depth=depth))).double().eval()
    tokens = torch.randn(2, 16, 32, dtype=torch.float64)
    with torch.no_grad():
        seen, outputs = skip_inputs(model, tokens)
    assert sorted(seen) == list(range(depth - depth // 2, depth))
    for block, joined in seen.items():
        torch.testing.assert_close(joined[..., :32], outputs[block - 1], rtol=0, atol=0)
        torch.testing.assert_close(joined[..., 32:], outputs[depth - 1 - block], rtol=0, atol=0)
    linear = model.transformer.layers[depth - 1][0]
    block = depth - 1
    x = outputs[block - 1]
    expected = x @ linear.weight[:, :32].T + outputs[0] @ linear.weight[:, 32:].T + linear.bias
    attn, ff = model.transformer.layers[block][1:]
    with torch.no_grad():
        joined = expected
        joined = attn(joined) + joined
        torch.testing.assert_close(ff(joined) + joined, outputs[block], rtol=1e-10, atol=1e-10)


def test_an_odd_depth_has_one_middle_block_without_a_skip_and_leaving_none():
    model = SimpleUViT(**tiny_vit_kwargs(depth=7))
    assert [layer[0] is not None for layer in model.transformer.layers] == [False] * 4 + [True] * 3
    with torch.no_grad():
        _, state = model.transformer(torch.randn(2, 16, 32), return_state=True)
    assert state['skips'] == ()


# vit-pytorch 1.26.14's module (tests/fixtures/make_stream_fixtures.py) computes another function


def test_vit_pytorchs_checkpoint_is_refused_naming_the_skips_of_the_shallow_blocks_inputs():
    config, state_dict, _, _ = reference_case('vit_pytorch_1.26.14_simple_uvit', 'image_size')
    with pytest.raises(CheckpointError, match=r"shallow block's input .*output"):
        load_vit_pytorch(SimpleUViT(**config), state_dict)


def test_vit_pytorchs_keys_are_ours():
    """Only the function differs: the same parameters under the same names."""
    config, state_dict, _, _ = reference_case('vit_pytorch_1.26.14_simple_uvit', 'image_size')
    model = SimpleUViT(**config)
    assert {key: tuple(value.shape) for key, value in model.state_dict().items()} == \
        {key: tuple(value.shape) for key, value in state_dict.items()}


# clear errors


@pytest.mark.parametrize('value, error', [(2.0, TypeError)])
def test_a_bad_number_of_registers_is_refused_by_name(value, error):
    with pytest.raises(error, match='num_register_tokens'):
        SimpleUViT(**tiny_vit_kwargs(num_register_tokens=value))


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block less .cuda(): 256 pixels, patches of 32, width 1024, depth 7."""
    model = SimpleUViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=7, heads=16, mlp_dim=2048)
    with torch.no_grad():
        assert model(torch.randn(2, 3, 256, 256)).shape == (2, 1000)


# the official U-ViT code (baofff/U-ViT @ ce55170, libs/uvit.py; fixture written by
# tests/fixtures/make_simple_uvit_official_fixtures.py, run outside this repository). Its blocks are ours but for
# a bias on the attention's output projection (zero in the fixture); its stack of depth 4 is 2 in-blocks, a
# mid-block and 2 out-blocks: our depth 5.


def official_stack_to_ours(state, depth):
    """The official UViT's block keys -> our simple_uvit.Transformer's (the layout written out for this proof)."""
    blocks = [f'in_blocks.{i}.' for i in range(depth // 2)] + ['mid_block.'] + \
        [f'out_blocks.{i}.' for i in range(depth // 2)]
    ours = {'norm.weight': state['norm.weight'], 'norm.bias': state['norm.bias']}
    for index, block in enumerate(blocks):
        names = {'1.norm.': 'norm1.', '1.to_qkv.': 'attn.qkv.', '1.to_out.': 'attn.proj.', '2.0.': 'norm2.',
                 '2.1.': 'mlp.fc1.', '2.3.': 'mlp.fc2.', '0.': 'skip_linear.'}
        for key, value in state.items():
            for mine, theirs in names.items():
                if key.startswith(block + theirs) and key != block + 'attn.proj.bias':
                    ours[f'layers.{index}.{mine}{key[len(block + theirs):]}'] = value
        assert not state[block + 'attn.proj.bias'].any()        # ours has none: the fixture zeroed it
    return ours


def test_the_long_skips_join_as_in_the_official_code():
    # the same float32 weights and tokens in float64: only the order of float64 sums differs (1e-12 for outputs
    # of order 1 after five blocks holds with a wide margin)
    from helpers import load_fixture
    from vit_pytorch.simple_uvit import Transformer

    metadata, state, tensors = load_fixture('simple_uvit_official')
    config = metadata['config']
    dim, heads = config['embed_dim'], config['num_heads']
    stack = Transformer(dim, config['depth'] + 1, heads, dim // heads, int(dim * config['mlp_ratio'])).double()
    stack.load_state_dict(official_stack_to_ours(state, config['depth']), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(stack(tensors['tokens']), tensors['stack_output'], rtol=0, atol=1e-12)


# the paper's models against the official code's (baofff/U-ViT @ ce55170: its nine configs/*.py and the paper's
# U-ViT-S/2 (Deep), built and counted part by part by tests/fixtures/make_simple_uvit_official_counts.py, run outside
# this repository)

OFFICIAL = official_counts('simple_uvit_official_counts')
# the paper's table of configurations, #Params (millions)
PAPER_MILLIONS = {'S': 44, 'S-Deep': 58, 'M': 131, 'L': 287, 'H': 501}


def official_model_as_ours(entry):
    """Ours for an official model: its variant at its image size and input channels, without a head."""
    nnet = entry['nnet']
    with torch.device('meta'):
        return uvit(entry['variant'], image_size=nnet['img_size'], channels=nnet['in_chans'], num_classes=0)


@pytest.mark.parametrize('name', sorted(OFFICIAL))
def test_a_paper_models_blocks_and_patch_projection_count_the_official_codes(name):
    """The blocks with their long skips and the final norm: the official ones less each attention output
    projection's bias (SimpleViT's has none); the patch projection: the official strided convolution's count; the
    whole model: those, two LayerNorms around the projection and the registers."""
    entry = OFFICIAL[name]
    official, nnet = entry['counts'], entry['nnet']
    model = official_model_as_ours(entry)
    dim, patch_dim = nnet['embed_dim'], nnet['in_chans'] * nnet['patch_size'] ** 2
    stack = official['in_blocks'] + official['mid_block'] + official['out_blocks'] + official['norm']
    assert count(model.transformer) == stack - official['attn.proj.bias']
    assert sum(count(layer[0]) for layer in model.transformer.layers if layer[0] is not None) == official['skip_linear']
    assert count(model.to_patch_embedding[2]) == official['patch_embed']
    registers = model.num_register_tokens * dim
    assert count(model) == official['patch_embed'] + stack - official['attn.proj.bias'] + 2 * (patch_dim + dim) \
        + registers


@pytest.mark.parametrize('name', sorted(OFFICIAL))
def test_a_paper_models_layout_is_the_official_codes(name):
    """depth // 2 shallow blocks, one middle block, depth // 2 deep blocks with a skip each; the heads, each of
    embed_dim // num_heads channels (the official Attention's head_dim)."""
    entry = OFFICIAL[name]
    nnet = entry['nnet']
    model = official_model_as_ours(entry)
    half = nnet['depth'] // 2
    assert [layer[0] is not None for layer in model.transformer.layers] == [False] * (half + 1) + [True] * half
    attention = model.transformer.layers[0][1]
    head_dim = nnet['embed_dim'] // nnet['num_heads']
    assert (attention.heads, attention.scale) == (nnet['num_heads'], head_dim ** -0.5)
    assert attention.to_qkv.out_features == 3 * nnet['num_heads'] * head_dim


def test_the_official_counts_are_the_papers_table():
    """Each official model's whole count rounds to its size's #Params in the paper's table (the text-to-image S/2 to
    45M, as the paper gives it for MS-COCO); every size of the table is in CONFIGS and among the official models."""
    sizes = {entry['variant'].split('/')[0] for entry in OFFICIAL.values()}
    assert set(CONFIGS) == set(PAPER_MILLIONS) == sizes
    for name, entry in OFFICIAL.items():
        expected = 45 if name == 'mscoco_uvit_small' else PAPER_MILLIONS[entry['variant'].split('/')[0]]
        assert round(entry['counts']['total'] / 1e6) == expected, name


@pytest.mark.parametrize('variant', ['S', 'B/2', 'H/0', 'H/2.5', 'S-deep/2', 2])
def test_an_unknown_variant_is_refused_by_name(variant):
    with pytest.raises(ValueError, match='variant must be one of'):
        uvit(variant)


def test_a_named_model_defaults_to_the_papers_16_by_16_patches():
    with torch.device('meta'):
        model = uvit('M/4')
    assert (model.image_size, model.patch_size, model.grid_size) == ((64, 64), (4, 4), (16, 16))
