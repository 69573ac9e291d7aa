"""LocalViT: the patch tokens' feed-forward is 1x1 conv, depthwise 3x3, 1x1 conv on the token grid (against the
convolutions computed explicitly), so it mixes only 3x3 neighbourhoods; the cls token bypasses it; the official
code's feed-forward and block give ours' outputs with its weights; vit-pytorch's checkpoints, which compute another
function, are refused naming the difference."""

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from helpers import count, load_fixture, move_off_initialisation, official_counts, reference_case, tiny_vit_kwargs
from vit_pytorch.local_vit import CONFIGS, LocalViT, local_vit
from vit_pytorch.pretrained import load_vit_pytorch


def model_of():
    torch.manual_seed(0)
    return move_off_initialisation(LocalViT(**tiny_vit_kwargs())).double().eval()


def test_the_patch_tokens_feed_forward_is_1x1_conv_depthwise_3x3_1x1_conv_on_the_token_grid():
    """On the 4x3 grid (rows of 3 tokens): LN per token, conv 1x1 (dim -> hidden), h-swish, depthwise 3x3 (zero
    padding 1), h-swish, conv 1x1 (hidden -> dim), each by F.conv2d with the weights as kernels."""
    ff = model_of().transformer.layers[1][1]
    tokens = torch.randn(2, 12, 32, dtype=torch.float64)
    hidden = ff.expand.out_features
    with torch.no_grad():
        normed = F.layer_norm(tokens, (32,), ff.norm.weight, ff.norm.bias)
        grid = normed.transpose(1, 2).reshape(2, 32, 4, 3)                      # token 3 i + j at row i, column j
        y = F.hardswish(F.conv2d(grid, ff.expand.weight[:, :, None, None], ff.expand.bias))
        y = F.hardswish(F.conv2d(y, ff.depthwise.weight, ff.depthwise.bias, padding=1, groups=hidden))
        y = F.conv2d(y, ff.reduce.weight[:, :, None, None], ff.reduce.bias)
        expected = y.reshape(2, 32, 12).transpose(1, 2)
        torch.testing.assert_close(ff(tokens, (4, 3)), expected, rtol=1e-12, atol=1e-12)


def test_the_feed_forward_of_a_token_reads_only_its_3x3_neighbourhood():
    ff = model_of().transformer.layers[0][1]
    tokens = torch.randn(1, 12, 32, dtype=torch.float64)
    moved = tokens.clone()
    moved[0, 3 * 3 + 2] += torch.randn(32, dtype=torch.float64)                # row 3, column 2
    with torch.no_grad():
        changed = (ff(moved, (4, 3)) - ff(tokens, (4, 3))).abs().amax(-1)[0].reshape(4, 3)
    assert (changed[2:, 1:] > 1e-3).all()                                      # the 3x3 around (3, 2), in the grid
    changed[2:, 1:] = 0
    assert changed.max() < 1e-12


def test_the_cls_token_bypasses_the_feed_forward():
    """After a layer the cls token is the attention's residual alone: x_cls + attention(x)_cls."""
    model = model_of()
    attn, ff = model.transformer.layers[0]
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    with torch.no_grad():
        out = model.transformer.layer(model.transformer.layers[0], x, grid=(4, 3))
        torch.testing.assert_close(out[:, 0], (attn(x) + x)[:, 0], rtol=0, atol=0)
        for parameter in ff.parameters():
            parameter.add_(1.)
        torch.testing.assert_close(model.transformer.layer(model.transformer.layers[0], x, grid=(4, 3))[:, 0],
                                   out[:, 0], rtol=0, atol=0)


def test_images_smaller_than_image_size_lay_their_tokens_on_their_own_grid():
    model = model_of()
    with torch.no_grad():
        tokens = model.forward_features(torch.randn(2, 3, 8, 16, dtype=torch.float64))
    assert tokens.shape == (2, 1 + 2 * 2, 32)


# vit-pytorch 1.26.14's module (tests/fixtures/make_norm_keel_local_fixtures.py)


def test_vit_pytorchs_checkpoint_is_refused_naming_its_width_axis_norm_and_extra_convolution():
    """Its fixture comes from the one kind of configuration where vit-pytorch's LocalViT runs: a grid as wide as dim
    (8x8 images, patches of 2, dim 4)."""
    config, state_dict, _, _ = reference_case('vit_pytorch_1.26.14_local_vit')
    with pytest.raises(ValueError, match=r"over the width axis .* second 1x1 convolution"):
        load_vit_pytorch(LocalViT(**config), state_dict)


# the paper's official code (ofsoundof/LocalViT @ f497260, models/localvit.py; fixture written by
# tests/fixtures/make_local_vit_official_fixtures.py, run outside this repository). Its LocalityFeedForward is
# 1x1 conv, BatchNorm, h-swish, depthwise 3x3, BatchNorm, h-swish, 1x1 conv, BatchNorm (act='hs'; the official
# models use 'hs+se', an SE layer after the depthwise convolution: ours with se_reduction) on the raw stream,
# convolutions without biases. In eval mode a BatchNorm after a bias-free convolution is that convolution with
# its weights scaled and a bias, which is how ours (biased 1x1 and depthwise convolutions) takes the official
# weights. Ours also norms the feed-forward's input per token (vit-pytorch's pre-LN) where the official block feeds
# it the raw stream: the fixture's official block has that one LayerNorm put in front of its convolutions.


def folded(state, conv, batchnorm, eps=1e-5):
    """(weight, bias) of the official bias-free convolution `conv` followed by the eval-mode BatchNorm
    `batchnorm`: gamma (W x - mean) / sqrt(var + eps) + beta = (s W) x + (beta - s mean), s = gamma / sqrt(var + eps)."""
    weight = state[f'{conv}.weight'].double()
    scale = state[f'{batchnorm}.weight'].double() / (state[f'{batchnorm}.running_var'].double() + eps).sqrt()
    bias = state[f'{batchnorm}.bias'].double() - scale * state[f'{batchnorm}.running_mean'].double()
    return scale.view(-1, *[1] * (weight.dim() - 1)) * weight, bias


def official_layer(fixture='local_vit_official'):
    """A one-layer LocalViT on a 3x3 grid loaded with the fixture's official block, and the fixture's tensors: the
    block of act='hs' (local_vit_official) or of act='hs+se' (local_vit_official_se: ours with se_reduction)."""
    metadata, state, tensors = load_fixture(fixture)
    config = metadata['config']
    assert config['act'] in ('hs', 'hs+se') and not config['qkv_bias']
    se = config['act'] == 'hs+se'
    dim, heads = config['dim'], config['num_heads']
    model = LocalViT(image_size=12, patch_size=4, num_classes=5, dim=dim, depth=1, heads=heads, dim_head=dim // heads,
                     mlp_dim=int(dim * config['mlp_ratio']),
                     se_reduction=config['reduction'] if se else None).double().eval()
    attn, ff = model.transformer.layers[0]
    reduce = 7 if se else 6                                                    # the SE layer is conv.conv.6
    with torch.no_grad():
        attn.norm.weight.copy_(state['norm1.weight']), attn.norm.bias.copy_(state['norm1.bias'])
        attn.to_qkv.weight.copy_(state['attn.qkv.weight'])                 # both lay out (qkv, head, channel)
        attn.to_out[0].weight.copy_(state['attn.proj.weight']), attn.to_out[0].bias.copy_(state['attn.proj.bias'])
        ff.norm.weight.copy_(tensors['norm.weight']), ff.norm.bias.copy_(tensors['norm.bias'])
        for ours, conv, batchnorm in ((ff.expand, 'conv.conv.0', 'conv.conv.1'),
                                      (ff.depthwise, 'conv.conv.3', 'conv.conv.4'),
                                      (ff.reduce, f'conv.conv.{reduce}', f'conv.conv.{reduce + 1}')):
            weight, bias = folded(state, conv, batchnorm)
            ours.weight.copy_(weight.view(ours.weight.shape)), ours.bias.copy_(bias)
        if se:
            for ours, theirs in ((ff.se.squeeze, 'conv.conv.6.fc.0'), (ff.se.excite, 'conv.conv.6.fc.2')):
                ours.weight.copy_(state[f'{theirs}.weight']), ours.bias.copy_(state[f'{theirs}.bias'])
    return model, tensors


# The weights are float32 values and both sides run in float64; what differs is the order of float64 sums, the
# BatchNorm folded into the convolution (one rounding of s W instead of two steps) and F.hardswish against the
# official x * relu6(x + 3) / 6: a few ulps of outputs of order 1, so 1e-12 holds with a wide margin.


@pytest.mark.parametrize('fixture', ['local_vit_official', 'local_vit_official_se'])
def test_the_official_locality_feed_forward_gives_ours_output_on_a_non_square_grid(fixture):
    """act='hs', and act='hs+se' against ours with se_reduction (the SE gate averages the 3x4 map's 12 positions)."""
    model, tensors = official_layer(fixture)
    ff = model.transformer.layers[0][1]
    tokens = rearrange(tensors['ff_input'], 'b c h w -> b (h w) c')          # a 3x4 grid
    with torch.no_grad():
        out = ff(tokens, (3, 4))
    torch.testing.assert_close(out, rearrange(tensors['ff_output'], 'b c h w -> b (h w) c'), rtol=0, atol=1e-12)


@pytest.mark.parametrize('fixture', ['local_vit_official', 'local_vit_official_se'])
def test_the_official_block_gives_ours_layers_output(fixture):
    """The official block (pre-LN attention over every token, the cls token split off, the patch tokens' locality
    feed-forward with its residual on the grid) against ours' layer, on a cls token and a 3x3 grid."""
    model, tensors = official_layer(fixture)
    with torch.no_grad():
        out = model.transformer.layer(model.transformer.layers[0], tensors['block_input'], grid=(3, 3))
    torch.testing.assert_close(out, tensors['block_output'], rtol=0, atol=1e-12)


# the paper's models against the official code's (LocalViT-T, -T-SE4, -S as its README names them), built and
# counted part by part by tests/fixtures/make_local_vit_official_counts.py, run outside this repository

OFFICIAL_COUNTS = official_counts('local_vit_official_counts')


def test_the_table_holds_the_official_readmes_three_models():
    assert set(CONFIGS) == set(OFFICIAL_COUNTS) == {'T', 'T-SE4', 'S'}


@pytest.mark.parametrize('variant', sorted(CONFIGS))
def test_a_paper_model_takes_the_official_functions_arguments(variant):
    official = OFFICIAL_COUNTS[variant]['arguments']
    with torch.device('meta'):
        model = local_vit(variant)
    attn, ff = model.transformer.layers[0]
    assert official['act'] == 'hs+se'
    assert (model.embed_dim, len(model.transformer.layers), attn.heads, model.patch_size, model.image_size) == (
        official['embed_dim'], official['depth'], official['num_heads'], (official['patch_size'],) * 2,
        (official['img_size'],) * 2)
    assert attn.to_qkv.out_features == 3 * official['embed_dim'] and attn.to_qkv.bias is not None
    assert ff.expand.out_features == official['mlp_ratio'] * official['embed_dim']
    assert ff.se.squeeze.out_features == ff.expand.out_features // official['reduction']
    assert model.transformer.norm.eps == attn.norm.eps == official['norm_eps']
    assert model.mlp_head.out_features == official['num_classes']


@pytest.mark.parametrize('variant', sorted(CONFIGS))
def test_a_paper_model_has_the_official_parameters_but_for_the_feed_forwards_norms(variant):
    """Per layer, the official feed-forward's three bias-free convolutions are each followed by a BatchNorm, 2
    parameters a channel on hidden + hidden + dim channels; ours has a bias on each of those channels instead and a
    LayerNorm (2 dim) in front: ours has 2 (2 hidden + dim) - (2 hidden + dim) - 2 dim = 2 hidden - dim fewer. All
    else is the same size (the patch convolution with its bias as ours' Linear without the Dual PatchNorm, the cls
    token, a position table with a row for it, the attention with its qkv bias, the SE layer, the norm, the head)."""
    official = OFFICIAL_COUNTS[variant]['counts']
    with torch.device('meta'):
        model = local_vit(variant)
    depth, dim, hidden = len(model.transformer.layers), model.embed_dim, model.transformer.layers[0][1].expand.out_features
    batchnorm = 2 * (2 * hidden + dim)
    assert official['batchnorm'] == depth * batchnorm
    ours_instead = (2 * hidden + dim) + 2 * dim
    layers = model.transformer.layers
    assert sum(count(ff) for _, ff in layers) == official['feed_forward'] - depth * (batchnorm - ours_instead)
    assert sum(count(ff.se) for _, ff in layers) == official['se']
    assert sum(count(attn) for attn, _ in layers) == official['attention']
    assert count(model.to_patch_embedding) == official['patch_embed']
    assert (model.cls_token.numel(), model.pos_embedding.numel()) == (official['cls_token'], official['pos_embed'])
    assert (count(model.transformer.norm), count(model.mlp_head)) == (official['norm'], official['head'])
    assert count(model) == official['total'] - depth * (2 * hidden - dim)


def test_an_unknown_variant_is_refused_by_name():
    with pytest.raises(ValueError, match=r"variant must be one of \['S', 'T', 'T-SE4'\], got 'B'"):
        local_vit('B')


@pytest.mark.parametrize('value, error, message', [
    (0, ValueError, r'se_reduction must be a positive int, got 0'),
    (2.5, TypeError, r'se_reduction must be a positive int, got 2.5'),
    (65, ValueError, r'se_reduction must be at most mlp_dim \(64\).*got 65'),
])
def test_a_bad_se_reduction_is_refused_by_name(value, error, message):
    with pytest.raises(error, match=message):
        LocalViT(**tiny_vit_kwargs(), se_reduction=value)
