"""Orthogonal residual updates: what a branch adds to the stream is orthogonal to it (per token, or per image with
orthogonal_method='global'), by the explicit projection; the stream's norm never shrinks; the official code's update;
vit-pytorch's weights."""

import pytest
import torch
from torch import nn

from helpers import count, load_fixture, move_off_initialisation, official_counts, reference_case, tiny_vit_kwargs
from vit_pytorch.pretrained import load_vit_pytorch
from vit_pytorch.simple_vit_orthog_residual_update import CONFIGS, OrthogonalResidualUpdate, SimpleViT, ortho_vit


def model_of(dtype=torch.float64, **kwargs):
    torch.manual_seed(0)
    return move_off_initialisation(SimpleViT(**tiny_vit_kwargs(depth=3), **kwargs)).to(dtype).eval()


def streams_and_updates(model, tokens):
    """(stream before the branch, what the branch returned) for every branch in order, and the last stream."""
    seen = []
    hooks = [branch.register_forward_hook(lambda module, args, output: seen.append((args[0], output)))
             for layer in model.transformer.layers for branch in layer]
    try:
        with torch.no_grad():
            model.transformer(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def test_the_update_added_to_the_stream_is_orthogonal_to_the_stream_per_token():
    model = model_of()
    seen = streams_and_updates(model, torch.randn(2, 12, 32, dtype=torch.float64))
    for (stream, update), (next_stream, _) in zip(seen, seen[1:]):
        torch.testing.assert_close(next_stream - stream, update, rtol=0, atol=1e-12)     # the stack adds it
    for index, (stream, update) in enumerate(seen):
        cosine = (stream * update).sum(-1) / (stream.norm(dim=-1) * update.norm(dim=-1))   # (b, n)
        assert cosine.abs().max() < 1e-12, f'branch {index}'
        assert update.norm(dim=-1).min() > 1e-3, f'branch {index} added nothing'


def test_in_float32_the_projection_in_double_precision_is_orthogonal_to_float32_rounding():
    """Rounding an exactly orthogonal float64 update to float32 moves each entry by at most 2^-24 of itself, so the
    cosine with the (float32) stream stays below 2^-24 * |u| |x| / (|u| |x|) = 6e-8."""
    branch = model_of(torch.float32).transformer.layers[1][0]
    stream = torch.randn(2, 12, 32) * 10 + 3
    with torch.no_grad():
        update = branch(stream)
    cosine = (stream.double() * update.double()).sum(-1) / (stream.double().norm(dim=-1) * update.double().norm(dim=-1))
    assert cosine.abs().max() < 1e-7


def test_the_update_equals_the_explicit_projection():
    """u = f(x) - (<f(x), x> / <x, x>) x, per token."""
    branch = model_of().transformer.layers[0][1]
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    with torch.no_grad():
        f = branch.block(x)
        expected = f - (f * x).sum(-1, keepdim=True) / (x * x).sum(-1, keepdim=True) * x
        torch.testing.assert_close(branch(x), expected, rtol=1e-12, atol=1e-12)


def test_the_learned_update_scales_the_parallel_and_orthogonal_parts_by_sigmoids_of_the_branch_output():
    """u = sigmoid(a(f)) p + sigmoid(b(f)) (f - p), p = (<f, x> / <x, x>) x, (a, b) = Linear(f)."""
    branch = model_of(orthog_residual_update_kwargs=dict(learned=True)).transformer.layers[1][0]
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    with torch.no_grad():
        f = branch.block(x)
        parallel = (f * x).sum(-1, keepdim=True) / (x * x).sum(-1, keepdim=True) * x
        gates = torch.sigmoid(f @ branch.to_modulation.weight.T + branch.to_modulation.bias)   # (b, n, 2)
        expected = gates[..., :1] * parallel + gates[..., 1:] * (f - parallel)
        torch.testing.assert_close(branch(x), expected, rtol=1e-12, atol=1e-12)


def test_a_tokens_stream_never_shrinks():
    """|x + u|^2 = |x|^2 + |u|^2 for u orthogonal to x: each token's norm grows through every branch."""
    seen = streams_and_updates(model_of(), torch.randn(2, 12, 32, dtype=torch.float64))
    norms = torch.stack([stream.norm(dim=-1) for stream, _ in seen] + [(seen[-1][0] + seen[-1][1]).norm(dim=-1)])
    assert (norms[1:] >= norms[:-1] * (1 - 1e-12)).all()
    assert (norms[-1] > norms[0] * 1.01).all()


def test_a_zero_stream_token_takes_the_whole_branch_output():
    branch = model_of().transformer.layers[0][1]
    x = torch.zeros(1, 3, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(branch(x), branch.block(x), rtol=0, atol=0)


GLOBAL = dict(orthog_residual_update_kwargs=dict(orthogonal_method='global'))


def image_cosine(a, b):
    """The cosine of each image's (n, d) entries in `a` with those in `b`, as vectors of n d numbers: (b,)."""
    return (a * b).sum(dim=(1, 2)) / (a.norm(dim=(1, 2)) * b.norm(dim=(1, 2)))


def test_the_global_update_is_orthogonal_to_the_images_whole_stream_but_not_per_token():
    seen = streams_and_updates(model_of(**GLOBAL), torch.randn(2, 12, 32, dtype=torch.float64))
    for (stream, update), (next_stream, _) in zip(seen, seen[1:]):
        torch.testing.assert_close(next_stream - stream, update, rtol=0, atol=1e-12)     # the stack adds it
    for index, (stream, update) in enumerate(seen):
        assert image_cosine(stream, update).abs().max() < 1e-12, f'branch {index}'
        token_cosine = (stream * update).sum(-1) / (stream.norm(dim=-1) * update.norm(dim=-1))   # (b, n)
        assert token_cosine.abs().max() > 1e-2, f'branch {index} is orthogonal per token'


def test_the_global_update_equals_the_explicit_projection_over_the_image():
    """u = f - (<f, x> / <x, x>) x, the inner products over all n d entries of each image."""
    branch = model_of(**GLOBAL).transformer.layers[0][1]
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    with torch.no_grad():
        f = branch.block(x)
        expected = f - (f * x).sum(dim=(1, 2), keepdim=True) / (x * x).sum(dim=(1, 2), keepdim=True) * x
        torch.testing.assert_close(branch(x), expected, rtol=1e-12, atol=1e-12)


def test_the_learned_global_update_scales_the_images_parallel_and_orthogonal_parts_by_sigmoids_per_token():
    """u = sigmoid(a(f)) p + sigmoid(b(f)) (f - p), p = (<f, x> / <x, x>) x over the image, (a, b) = Linear(f)."""
    options = dict(orthogonal_method='global', learned=True)
    branch = model_of(orthog_residual_update_kwargs=options).transformer.layers[1][0]
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    with torch.no_grad():
        f = branch.block(x)
        parallel = (f * x).sum(dim=(1, 2), keepdim=True) / (x * x).sum(dim=(1, 2), keepdim=True) * x
        gates = torch.sigmoid(f @ branch.to_modulation.weight.T + branch.to_modulation.bias)   # (b, n, 2)
        expected = gates[..., :1] * parallel + gates[..., 1:] * (f - parallel)
        torch.testing.assert_close(branch(x), expected, rtol=1e-12, atol=1e-12)


def test_an_images_stream_never_shrinks_under_the_global_update_though_a_token_may():
    """|x + u|^2 = |x|^2 + |u|^2 over the image's n d entries; a token's own norm is not held."""
    seen = streams_and_updates(model_of(**GLOBAL), torch.randn(2, 12, 32, dtype=torch.float64))
    streams = [stream for stream, _ in seen] + [seen[-1][0] + seen[-1][1]]
    norms = torch.stack([stream.norm(dim=(1, 2)) for stream in streams])                 # (branches + 1, b)
    assert (norms[1:] >= norms[:-1] * (1 - 1e-12)).all()
    assert (norms[-1] > norms[0] * 1.01).all()
    token_norms = torch.stack([stream.norm(dim=-1) for stream in streams])               # (branches + 1, b, n)
    assert (token_norms[1:] < token_norms[:-1] * (1 - 1e-3)).any()


def test_in_float32_the_global_projection_in_double_precision_is_orthogonal_to_float32_rounding():
    """As per token: rounding the exact update moves each entry by at most 2^-24 of itself, so its cosine with the
    image's stream stays below 6e-8, even for a branch output nearly parallel to the stream (3 x plus noise of
    1e-3, on entries of about 10), whose small orthogonal part a float32 projection loses to cancellation (a cosine
    of 1e-3 here)."""
    generator = torch.Generator().manual_seed(0)
    stream = torch.randn(2, 12, 32, generator=generator) * 10 + 3
    branch_out = 3 * stream + 1e-3 * torch.randn(2, 12, 32, generator=generator)
    with torch.no_grad():
        update = OrthogonalResidualUpdate(Fixed(branch_out), orthogonal_method='global')(stream)
    assert update.dtype == torch.float32
    assert image_cosine(stream.double(), update.double()).abs().max() < 1e-7


def test_a_zero_image_stream_takes_the_whole_branch_output_under_the_global_update():
    branch = model_of(**GLOBAL).transformer.layers[0][1]
    x = torch.zeros(1, 3, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(branch(x), branch.block(x), rtol=0, atol=0)


# the paper's official code (BootsofLagrangian/ortho-residual @ 4f663d3, src/ortho_residual/vit/residual.py
# `connect(x, f_x, method='orthogonal', orthogonal_method='feature')`, what its OrthoViT does after each branch;
# fixture written by tests/fixtures/make_simple_vit_orthog_residual_update_official_fixtures.py, run outside this
# repository). The official update is x + f - <f, x> / (|x|^2 + eps) x with eps = 1e-6; ours (vit-pytorch's
# F.normalize) has no eps: <f, x> / |x|^2 x, a zero token's norm clamped at 1e-12. Its 'global' option, one
# projection per image over all tokens and channels when its `dim` is 1, is ours with orthogonal_method='global';
# at the dim its ViTs pass (-1) the official 'global' is the per-token update.


class Fixed(nn.Module):
    """A branch that returns `output` whatever its input."""

    def __init__(self, output):
        super().__init__()
        self.output = output

    def forward(self, x):
        return self.output


def updated(stream, branch, orthogonal_method='feature'):
    """The stream after our orthogonal update of the branch output `branch`: x + u."""
    with torch.no_grad():
        return stream + OrthogonalResidualUpdate(Fixed(branch), orthogonal_method=orthogonal_method)(stream)


def test_the_update_is_the_official_codes_with_its_epsilon_set_to_zero():
    """On tokens of norms 1e-4 to about 30 (float64 throughout: only the order of the sums differs, so rounding of
    the outputs' magnitude, below 1e-12)."""
    _, _, tensors = load_fixture('simple_vit_orthog_residual_update_official')
    torch.testing.assert_close(updated(tensors['stream'], tensors['branch']), tensors['feature_eps0'],
                               rtol=1e-12, atol=1e-12)


def test_the_official_epsilon_moves_the_update_by_at_most_eps_f_over_x_squared():
    """The official eps removes <f, x> eps / (|x|^2 (|x|^2 + eps)) x less of each token's parallel part, at most
    eps |f| / |x|^2 in norm (Cauchy-Schwarz): within that bound of ours where |x|^2 >> eps; where |x|^2 is below
    eps (the first token, |x| = 1e-4) the official update keeps most of the parallel part, ours none of it."""
    _, _, tensors = load_fixture('simple_vit_orthog_residual_update_official')
    stream, branch = tensors['stream'], tensors['branch']
    difference = (updated(stream, branch) - tensors['feature']).norm(dim=-1)
    bound = 1e-6 * branch.norm(dim=-1) / stream.norm(dim=-1) ** 2
    assert (difference[0, 1:] <= bound[0, 1:] + 1e-12).all() and (difference[1] <= bound[1] + 1e-12).all()
    x, f = stream[0, 0], branch[0, 0]
    parallel = (f @ x) / (x @ x) * x
    assert difference[0, 0] > 0.9 * parallel.norm()


def test_a_zero_stream_token_takes_the_whole_branch_output_as_in_the_official_code():
    _, _, tensors = load_fixture('simple_vit_orthog_residual_update_official')
    torch.testing.assert_close(updated(tensors['zero_stream'], tensors['zero_branch']), tensors['zero_feature'],
                               rtol=0, atol=0)


def test_the_global_update_is_the_official_global_with_its_epsilon_set_to_zero():
    """The official connect(orthogonal_method='global', dim=1): one projection over each image's 6 x 16 entries."""
    _, _, tensors = load_fixture('simple_vit_orthog_residual_update_official')
    torch.testing.assert_close(updated(tensors['stream'], tensors['branch'], 'global'), tensors['global_eps0'],
                               rtol=1e-12, atol=1e-12)


def test_the_official_epsilon_moves_the_global_update_by_at_most_eps_f_over_x_squared_of_the_image():
    """As per token, with the norms over the image: within eps |f| / |x|^2 of ours where |x|^2 >> eps; an image of
    norm 1e-4 (|x|^2 below eps) keeps most of its parallel part in the official update, none of it in ours."""
    _, _, tensors = load_fixture('simple_vit_orthog_residual_update_official')
    stream, branch = tensors['stream'], tensors['branch']
    difference = (updated(stream, branch, 'global') - tensors['global']).norm(dim=(1, 2))
    assert (difference <= 1e-6 * branch.norm(dim=(1, 2)) / stream.norm(dim=(1, 2)) ** 2 + 1e-12).all()
    x, f = tensors['small_stream'], tensors['small_branch']
    parallel = (f * x).sum() / (x * x).sum() * x
    assert (updated(x, f, 'global') - tensors['small_global']).norm() > 0.9 * parallel.norm()


def test_a_zero_image_stream_takes_the_whole_branch_output_as_in_the_official_global():
    _, _, tensors = load_fixture('simple_vit_orthog_residual_update_official')
    torch.testing.assert_close(updated(tensors['zero_stream'], tensors['zero_branch'], 'global'),
                               tensors['zero_global'], rtol=0, atol=0)


def test_the_official_global_at_the_axis_its_vits_pass_is_our_per_token_update():
    """Its OrthoViTs call connect with dim=-1, where 'global' flattens nothing: the 'feature' update."""
    _, _, tensors = load_fixture('simple_vit_orthog_residual_update_official')
    torch.testing.assert_close(updated(tensors['stream'], tensors['branch']), tensors['global_last_axis_eps0'],
                               rtol=1e-12, atol=1e-12)


# vit-pytorch 1.26.14's module (tests/fixtures/make_value_orthog_fixtures.py)


@pytest.mark.parametrize('fixture', ['simple_vit_orthog_residual_update', 'simple_vit_orthog_residual_update_learned'])
def test_vit_pytorchs_checkpoint_loads_strictly_and_gives_its_output(fixture):
    config, state_dict, img, expected = reference_case(f'vit_pytorch_1.26.14_{fixture}', 'image_size')
    model = load_vit_pytorch(SimpleViT(**config), state_dict).eval()
    assert model.state_dict().keys() == state_dict.keys()
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-4, atol=1e-5)


# clear errors


@pytest.mark.parametrize('value, error, match', [
    ([('learned', True)], TypeError, 'must be a dict or None'),
    (dict(learnt=True), ValueError,
     r"takes 'double_precision', 'learned' and 'orthogonal_method', got \['learnt'\]"),
    (dict(dim=16), ValueError, r"got \['dim'\]"),
    (dict(learned=1), TypeError, r"orthog_residual_update_kwargs\['learned'\] must be True or False"),
    (dict(orthogonal_method='token'), ValueError,
     r"orthog_residual_update_kwargs\['orthogonal_method'\] must be one of \('feature', 'global'\), got 'token'"),
    (dict(orthogonal_method=None), ValueError, r"\['orthogonal_method'\] must be one of .*, got None"),
    (dict(orthogonal_method=['global']), ValueError, r"\['orthogonal_method'\] must be one of .*, got \['global'\]"),
])
def test_bad_update_options_are_refused_by_name(value, error, match):
    with pytest.raises(error, match=match):
        SimpleViT(**tiny_vit_kwargs(orthog_residual_update_kwargs=value))


def test_a_learned_update_without_dim_is_refused():
    with pytest.raises(ValueError, match='dim must be given'):
        OrthogonalResidualUpdate(torch.nn.Identity(), learned=True)


@pytest.mark.parametrize('value', ['Global', 'channel', None, 1])
def test_an_unknown_orthogonal_method_is_refused_by_name(value):
    with pytest.raises(ValueError, match=rf"orthogonal_method must be one of \('feature', 'global'\), got {value!r}"):
        OrthogonalResidualUpdate(torch.nn.Identity(), orthogonal_method=value)


def test_the_orthogonal_method_is_keyword_only():
    """vit-pytorch's positional arguments (block, dim, double_precision, learned) keep their places."""
    with pytest.raises(TypeError):
        OrthogonalResidualUpdate(torch.nn.Identity(), 8, True, False, 'global')


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                 # vit-pytorch's own sizes: seconds on 2 cores
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block: 256 pixels, patches of 16, width 512, depth 2, the learned modulation."""
    model = SimpleViT(image_size=256, patch_size=16, num_classes=10, dim=512, depth=2, heads=4, mlp_dim=2048,
                      orthog_residual_update_kwargs=dict(learned=True))
    with torch.no_grad():
        assert model(torch.randn(2, 3, 256, 256)).shape == (2, 10)


# the paper's ViT-S and ViT-B against the official code's, on its four datasets (CIFAR-10/100, Tiny-ImageNet,
# ImageNet-1k), built and counted part by part by
# tests/fixtures/make_simple_vit_orthog_residual_update_official_counts.py, run outside this repository

OFFICIAL_COUNTS = official_counts('simple_vit_orthog_residual_update_official_counts')


def test_the_table_holds_the_official_sizes_and_patch_sizes():
    assert {entry['variant'].split('/')[0] for entry in OFFICIAL_COUNTS.values()} == set(CONFIGS)
    assert {entry['variant'] for entry in OFFICIAL_COUNTS.values()} == {'S/4', 'S/8', 'S/16', 'B/4', 'B/8', 'B/16'}


@pytest.mark.parametrize('name', sorted(OFFICIAL_COUNTS))
def test_a_paper_model_takes_the_official_arguments(name):
    entry = OFFICIAL_COUNTS[name]
    official = entry['arguments']
    with torch.device('meta'):
        model = ortho_vit(entry['variant'], num_classes=official['num_classes'])
    attention, feedforward = model.transformer.layers[0]
    assert (model.image_size, model.patch_size) == ((official['img_size'],) * 2, (official['patch_size'],) * 2)
    assert (model.embed_dim, len(model.transformer.layers), attention.block.heads) == (
        official['dim'], official['num_layers'], official['num_heads'])
    assert attention.block.to_qkv.out_features == 3 * official['dim']           # heads of dim / heads channels
    assert feedforward.block.net[1].out_features == 4 * official['dim']
    assert (model.channels, model.linear_head.out_features) == (official['in_chans'], official['num_classes'])


@pytest.mark.parametrize('name', sorted(OFFICIAL_COUNTS))
def test_a_paper_model_has_the_official_parameters_but_for_the_cls_token_positions_and_patch_norms(name):
    """The official ViT has a cls token (dim) and a learned table of n = (image / patch)^2 positions (n dim) that
    ours (vit-pytorch's SimpleViT: fixed 2D sin-cos positions, mean pooling) has not; ours has the Dual PatchNorm,
    LayerNorms of the patch_dim = 3 p^2 pixels and of the dim channels around the patch projection (2 patch_dim + 2
    dim), that the official convolution has not. In each layer, the official attention's qkv and projection biases
    (4 dim) are as many as ours' two pre-LayerNorms (the official blocks' LayerNorms have no parameters and ours'
    projections no biases); the patch projection, attention and MLP weights, the final norm and head are the same."""
    entry = OFFICIAL_COUNTS[name]
    official, arguments = entry['counts'], entry['arguments']
    with torch.device('meta'):
        model = ortho_vit(entry['variant'], num_classes=arguments['num_classes'])
    dim, patch_dim = arguments['dim'], 3 * arguments['patch_size'] ** 2
    positions = (arguments['img_size'] // arguments['patch_size']) ** 2
    assert (official['cls_token'], official['pos_embed'], official['norms']) == (dim, positions * dim, 0)
    assert count(model.to_patch_embedding) == official['patchify'] + 2 * patch_dim + 2 * dim
    layers = model.transformer.layers
    assert sum(count(attention) for attention, _ in layers) == official['attention'] - len(layers) * (4 * dim - 2 * dim)
    assert sum(count(feedforward) for _, feedforward in layers) == official['mlp'] + len(layers) * 2 * dim
    assert count(model.transformer.norm) + count(model.linear_head) == official['classifier']
    assert count(model) == official['total'] - dim - positions * dim + 2 * patch_dim + 2 * dim


@pytest.mark.parametrize('variant', ['S', 'S/32', 'L/16', 'B/2.5', 4])
def test_an_unknown_variant_is_refused_by_name(variant):
    with pytest.raises(ValueError, match='variant must be one of'):
        ortho_vit(variant)
