"""LookupViT (arXiv 2407.12753): what the paper adds. The face, gradients and export are checked by
tests/test_conformance.py over the registry."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from helpers import move_off_initialisation, reference_case
from vit_pytorch.look_vit import LookViT
from vit_pytorch.pretrained import load_vit_pytorch

SMALL = dict(image_size=(16, 24), patch_size=8, highres_patch_size=4, num_classes=5, dim=16, depth=2, heads=2,
             dim_head=8, cross_attn_heads=2, cross_attn_dim_head=8, patch_conv_kernel_size=3, dropout=0.)


def small(**overrides):
    return move_off_initialisation(LookViT(**{**SMALL, **overrides})).double().eval()


def images(shape=(2, 3, 16, 24)):
    return torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def flops_by_module(model, img):
    with FlopCounterMode(display=False) as counter:
        model(img)
    return {name.removeprefix('LookViT.'): sum(counts.values()) for name, counts in counter.get_flop_counts().items()}


def test_the_heavy_layers_cost_the_same_whatever_the_number_of_lookup_tokens():
    # 6 compressed tokens either way; 24 or 96 lookup tokens: only the lookup side's cost grows
    few, many = (flops_by_module(small(highres_patch_size=size), images()) for size in (4, 2))
    for i in range(2):
        for heavy in ('attn', 'ff'):
            name = f'transformer.layers.{i}.{heavy}'
            assert few[name] == many[name] > 0
        for light in ('lookup_attn', 'reverse_attn', 'highres_ff'):
            name = f'transformer.layers.{i}.{light}'
            assert many[name] > few[name]


def test_the_heavy_layers_see_the_compressed_tokens_only():
    model = small()
    seen = []
    for layer in model.transformer.layers:
        for block in (layer.attn, layer.ff):
            block.register_forward_hook(lambda module, args, output: seen.append(args[0].shape[1]))
    model(images())
    assert seen == [model.num_prefix_tokens] * 4 and model.num_prefix_tokens == 2 * 3


def test_lookup_tokens_change_only_through_the_reverse_attention_and_their_light_mlp():
    # with those two branches silenced, a layer leaves the lookup tokens as they came (after the stream's norm),
    # however much the compressed tokens change
    model = small()
    with torch.no_grad():
        for layer in model.transformer.layers:
            layer.reverse_attn.to_out[0].weight.zero_()
            layer.highres_ff.net[4].weight.zero_()
            layer.highres_ff.net[4].bias.zero_()
        x = model.embed(images())
        _, outputs = model.transformer(x, compressed=6, return_layers=True)
    for layer, before, after in zip(model.transformer.layers, [x] + outputs, outputs):
        torch.testing.assert_close(after[:, 6:], layer.highres_norm(before[:, 6:]), atol=1e-12, rtol=0)
        assert (after[:, :6] - before[:, :6]).abs().max() > 0.1


def test_the_reverse_attention_is_the_lookup_attentions_similarities_transposed():
    # one (m, n) similarity matrix S = q k^T / sqrt(d): the compressed tokens attend with softmax(S) over the
    # lookup tokens, the lookup tokens with softmax(S^T) over the compressed tokens
    model = small()
    layer = model.transformer.layers[0]
    maps = {}
    for name in ('lookup_attn', 'reverse_attn'):
        block = getattr(layer, name)
        block.fused = False
        block.attention_probs.register_forward_hook(lambda module, args, output, name=name: maps.update({name: output}))
    x = model.embed(images())
    model.transformer(x, compressed=6)
    z, lookup = x[:, :6], x[:, 6:]
    attn = layer.lookup_attn
    q = attn.to_q(attn.norm(z)).unflatten(-1, (2, 8)).transpose(1, 2)                 # (b, h, m, d)
    k = attn.to_kv(attn.norm_context(lookup))[..., :16].unflatten(-1, (2, 8)).transpose(1, 2)  # (b, h, n, d)
    similarities = q @ k.transpose(-1, -2) / 8 ** 0.5                               # (b, h, m, n)
    torch.testing.assert_close(maps['lookup_attn'], similarities.softmax(dim=-1), atol=1e-12, rtol=0)
    torch.testing.assert_close(maps['reverse_attn'], similarities.transpose(-1, -2).softmax(dim=-1),
                               atol=1e-12, rtol=0)


def test_one_similarity_product_serves_both_directions():
    # the paper's bidirectional cross-attention shares the (m, n) logits: counted by hand, the lookup attention's
    # products are its projections, q k^T and the weights times the values; the reverse attention's only its value
    # and output projections and its weights times the values (recomputing k q^T would add 2 b h n m d)
    b, m, n, dim, heads, d = 2, 6, 24, 16, 2, 8
    inner = heads * d
    counts = flops_by_module(small(), images())
    lookup = 2 * b * (m * dim * inner + 2 * n * dim * inner + heads * m * n * d + heads * m * n * d + m * inner * dim)
    reverse = 2 * b * (m * dim * inner + heads * n * m * d + n * inner * dim)
    for i in range(2):
        assert counts[f'transformer.layers.{i}.lookup_attn'] == lookup
        assert counts[f'transformer.layers.{i}.reverse_attn'] == reverse


def test_the_two_streams_are_joined_once_not_after_every_layer():
    # the layers pass the compressed and lookup tokens apart; a join after each layer (and a split in the next) is a
    # copy of every token a layer, forward and backward: about 1% of a training step (docs/performance.md)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Joins(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Joins.count += func is torch.ops.aten.cat.default
            return func(*args, **(kwargs or {}))

    model = small(depth=3)
    x = model.embed(images())
    with Joins():
        model.transformer(x, compressed=model.num_prefix_tokens)
    assert Joins.count == 1


def test_the_reverse_attention_has_no_query_or_key_projection_of_its_own():
    reverse = small().transformer.layers[0].reverse_attn
    assert sorted(name for name, _ in reverse.named_parameters()) == [
        'norm_context.bias', 'norm_context.weight', 'to_out.0.weight', 'to_v.weight']


def test_the_compressed_tokens_start_as_the_bilinear_resize_of_the_lookup_map():
    model = small()
    x = model.embed(images())
    lookup = x[:, 6:].transpose(1, 2).unflatten(-1, (4, 6))                          # (b, d, 4, 6)
    expected = F.interpolate(lookup, size=(2, 3), mode='bilinear').flatten(2).transpose(1, 2)
    torch.testing.assert_close(x[:, :6], expected, atol=1e-12, rtol=0)


def test_the_recorder_sees_three_maps_a_layer():
    from vit_pytorch.recorder import Recorder

    model = LookViT(**SMALL).eval()
    _, maps = Recorder(model)(torch.randn(2, 3, 16, 24))
    assert [tuple(attn.shape) for attn in maps] == [(2, 2, 6, 24), (2, 2, 6, 6), (2, 2, 24, 6)] * 2


# vit-pytorch 1.26.14 (fixture written by tests/fixtures/make_look_jumbo_fixtures.py)


def test_vit_pytorch_checkpoint_loads_and_gives_its_outputs():
    config, state, img, expected = reference_case('vit_pytorch_1.26.14_look_vit')
    model = load_vit_pytorch(LookViT(**config).eval(), state)
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('override, message', [
    (dict(patch_size=4), r'patch_size \(4, 4\).*larger than highres_patch_size \(4, 4\)'),
    (dict(highres_patch_size=(4, 5)), r'image_size \(16, 24\) must be divisible by highres_patch_size \(4, 5\)'),
    (dict(patch_conv_kernel_size=4), r'patch_conv_kernel_size must be odd.*got 4'),
    (dict(dim=18), r'dim must be a multiple of 4.*got 18'),
    (dict(highres_mlp_factor=0.01), r'highres_mlp_factor \* dim must be at least 1'),
])
def test_invalid_configuration_names_the_argument(override, message):
    with pytest.raises(ValueError, match=message):
        LookViT(**{**SMALL, **override})


def test_an_image_of_another_size_is_refused():
    with pytest.raises(ValueError, match=r"img must be 16x24.*the model's image_size"):
        LookViT(**SMALL)(torch.randn(1, 3, 16, 16))


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                 # vit-pytorch's own sizes: seconds on 2 cores
def test_vit_pytorch_main_block_runs():
    # vit-pytorch's look_vit.py __main__, less .cuda()
    v = LookViT(image_size=256, num_classes=1000, dim=512, depth=2, heads=8, dim_head=64, patch_size=32,
                highres_patch_size=8, highres_mlp_factor=2, cross_attn_heads=8, cross_attn_dim_head=64, dropout=0.1)
    img = torch.randn(2, 3, 256, 256)
    pred = v(img)
    assert pred.shape == (2, 1000)
