"""Jumbo (arXiv 2502.15021): what the paper adds. The face, gradients and export are checked by
tests/test_conformance.py over the registry."""

import pytest
import torch
import torch.nn.functional as F

from helpers import count, load_fixture, move_off_initialisation
from vit_pytorch import simple_vit
from vit_pytorch.jumbo_vit import CONFIGS, JumboViT, jumbo_vit
from vit_pytorch.pretrained import CheckpointError, load_official, load_vit_pytorch

SMALL = dict(image_size=(16, 24), patch_size=(4, 8), num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32,
             jumbo_cls_k=3, jumbo_ff_mult=2)


def small(**overrides):
    return move_off_initialisation(JumboViT(**{**SMALL, **overrides})).double().eval()


def images(shape=(2, 3, 16, 24)):
    return torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def layer_outputs(model, img):
    x = model.embed(img)
    _, outputs = model.transformer(x, return_layers=True)
    return [x] + outputs


def test_the_jumbo_feedforward_is_k_times_wider_and_apart_from_the_patch_feedforwards():
    model = small()
    first, last = model.transformer.jumbo_ff[0], model.transformer.jumbo_ff[2]
    assert (first.in_features, first.out_features, last.out_features) == (3 * 16, 2 * 3 * 16, 3 * 16)
    jumbo = {id(p) for p in model.transformer.jumbo_ff.parameters()}
    patch = {id(p) for attn, ff, _ in model.transformer.layers for p in ff.parameters()}
    assert jumbo and patch and not jumbo & patch


def test_one_jumbo_mlp_serves_every_layer_each_with_its_own_norm():
    model = small(depth=3)
    widths = []
    model.transformer.jumbo_ff.register_forward_hook(lambda module, args, output: widths.append(args[0].shape))
    model(images())
    assert widths == [(2, 1, 48)] * 3
    norms = [norm for _, _, norm in model.transformer.layers]
    assert len({id(norm.weight) for norm in norms}) == 3 and norms[0].normalized_shape == (48,)


def test_the_parameter_count_is_a_vit_plus_one_jumbo_mlp_and_a_norm_per_layer():
    dim, depth, inner, mlp, k, hidden, classes, patch = 16, 2, 16, 32, 3, 96, 5, 3 * 4 * 8
    embedding = 2 * patch + patch * dim + dim + 2 * dim
    layer = (2 * dim + dim * 3 * inner + inner * dim) + (2 * dim + dim * mlp + mlp + mlp * dim + dim) + 2 * k * dim
    jumbo = k * dim + (k * dim * hidden + hidden + hidden * k * dim + k * dim)
    head = 2 * dim + (k * dim + dim) * classes + classes
    assert count(JumboViT(**SMALL)) == embedding + depth * layer + jumbo + head


def test_the_patch_tokens_path_is_a_plain_vit_layer():
    # SimpleViT's layer, given the same weights, computes the same patch tokens from the same sequence
    model = small()
    plain = simple_vit.Transformer(16, 1, 2, 8, 32).double()
    attn, ff, _ = model.transformer.layers[0]
    plain.layers[0][0].load_state_dict(attn.state_dict())
    plain.layers[0][1].load_state_dict(ff.state_dict())
    x, after, _ = layer_outputs(model, images())
    _, (expected,) = plain(x, return_layers=True)
    torch.testing.assert_close(after[:, 3:], expected[:, 3:], atol=1e-12, rtol=0)


def test_the_jumbo_token_is_split_for_attention_and_joined_for_its_feedforward():
    model = small()
    attn, _, norm = model.transformer.layers[0]
    x, after, _ = layer_outputs(model, images())
    pieces = (attn(x) + x)[:, :3]                                   # (b, k, dim): three tokens in the attention
    joined = torch.cat(pieces.unbind(dim=1), dim=-1)                # (b, k * dim): piece after piece
    joined = joined + model.transformer.jumbo_ff(F.layer_norm(joined, (48,), norm.weight, norm.bias))
    torch.testing.assert_close(after[:, :3], torch.stack(joined.split(16, dim=-1), dim=1), atol=1e-12, rtol=0)


def test_the_first_layer_sees_the_jumbo_token_as_k_tokens_of_the_model_width():
    model = small()
    x = model.embed(images())
    assert x.shape == (2, 3 + 4 * 3, 16)
    torch.testing.assert_close(x[0, :3].flatten(), model.jumbo_cls_token[0], atol=0, rtol=0)


def test_the_head_reads_the_whole_jumbo_token_beside_the_patch_tokens_mean():
    model = small()
    tokens = model.forward_features(images())
    expected = torch.cat((tokens[:, :3].flatten(1), tokens[:, 3:].mean(dim=1)), dim=-1)
    torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), expected, atol=0, rtol=0)
    assert model.num_features == 4 * 16


def test_several_jumbo_tokens_give_k_pieces_each():
    model = small(num_jumbo_cls=2)
    assert model.num_prefix_tokens == 6 and model.forward_features(images()).shape == (2, 6 + 12, 16)


# vit-pytorch 1.26.14 (fixture written by tests/fixtures/make_look_jumbo_fixtures.py)


def test_vit_pytorch_checkpoint_is_refused_naming_what_differs():
    metadata, state, _ = load_fixture('vit_pytorch_1.26.14_jumbo_vit')
    config = metadata['config']
    model = JumboViT(**config)
    with pytest.raises(CheckpointError, match=r'shared by all layers.*the MLP alone shared.*mean of the jumbo token'):
        load_vit_pytorch(model, state)


@pytest.mark.parametrize('variant, dim, k', [('pico', 96, 6), ('tiny', 192, 6), ('base', 768, 3)])
def test_named_configurations_take_the_papers_widths(variant, dim, k):
    with torch.device('meta'):
        model = jumbo_vit(variant)
    assert (model.embed_dim, model.jumbo_cls_k, len(model.transformer.layers)) == (dim, k, 12)
    assert model.transformer.jumbo_ff[0].out_features == 4 * k * dim
    assert set(CONFIGS) == {'pico', 'nano', 'tiny', 'small', 'base'}


@pytest.mark.parametrize('override, error, message', [
    (dict(num_jumbo_cls=1.5), TypeError, r'num_jumbo_cls must be a positive int, got 1.5'),
    (dict(jumbo_ff_mult=0.001), ValueError, r'jumbo_ff_mult \* jumbo_cls_k \* dim must be at least 1'),
    (dict(dim=18), ValueError, r'dim must be a multiple of 4.*got 18'),
])
def test_invalid_configuration_names_the_argument(override, error, message):
    with pytest.raises(error, match=message):
        JumboViT(**{**SMALL, **override})


# the paper's official code (antofuller/jumbo @ 4c73fc2; fixture written by
# tests/fixtures/make_jumbo_vit_official_fixtures.py, run outside this repository)


def official_model(fixture):
    metadata, state, tensors = load_fixture(fixture)
    config = metadata['config']
    dim = config['embed_dim']
    model = JumboViT(image_size=tuple(config['img_size']), patch_size=config['patch_size'],
                     num_classes=config['num_classes'], dim=dim, depth=config['depth'], heads=config['num_heads'],
                     dim_head=dim // config['num_heads'], mlp_dim=int(dim * config['mlp_ratio']),
                     jumbo_cls_k=config['J'], jumbo_ff_mult=4, channels=config['in_chans'], patch_side='paper')
    return load_official(model, state).double().eval(), tensors


def test_the_official_codes_weights_give_its_outputs():
    # the fixture's weights are float32 values and both sides run in float64: only the order of float64 sums
    # differs (a few ulps of outputs of order 1 through two layers), so 1e-12 holds with a wide margin
    model, tensors = official_model('jumbo_vit_official')
    with torch.no_grad():
        features = model.forward_features(tensors['input'])
        torch.testing.assert_close(features, tensors['features'], atol=1e-12, rtol=0)
        torch.testing.assert_close(model.forward_head(features), tensors['output'], atol=1e-12, rtol=0)


def test_the_paper_patch_sides_counts_are_the_official_codes():
    # the official model also keeps a ViT cls token (dim) that it never reads; ours has none
    metadata, _, _ = load_fixture('jumbo_vit_official')
    for variant, official in metadata['counts'].items():
        with torch.device('meta'):
            model = jumbo_vit(variant, patch_side='paper')
        assert count(model) + model.embed_dim == official, variant


def test_the_official_checkpoint_needs_the_paper_patch_side():
    _, state, _ = load_fixture('jumbo_vit_official')
    model = JumboViT(image_size=(8, 12), patch_size=4, num_classes=5, dim=8, depth=2, heads=2, dim_head=4,
                     mlp_dim=32, jumbo_cls_k=3, jumbo_ff_mult=4)
    with pytest.raises(CheckpointError, match=r"patch_side='paper'"):
        load_official(model, state)
    with pytest.raises(ValueError, match=r"patch_side must be 'simple' or 'paper', got 'timm'"):
        JumboViT(**{**SMALL, 'patch_side': 'timm'})


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                 # vit-pytorch's own sizes: seconds on 2 cores
def test_vit_pytorch_main_block_runs():
    # vit-pytorch's jumbo_vit.py __main__
    v = JumboViT(num_classes=1000, image_size=64, patch_size=8, dim=16, depth=2, heads=2, mlp_dim=32, jumbo_cls_k=3,
                 jumbo_ff_mult=2)
    images = torch.randn(1, 3, 64, 64)
    logits = v(images)
    assert logits.shape == (1, 1000)
