import itertools
import math
import random

import pytest
import torch
import torch.nn.functional as F

from helpers import count, digits_batch, fit_fixed_batch, load_fixture
from helpers import move_off_initialisation, parameters_without_gradient
from vit_pytorch.na_vit import NaViT, group_images_by_max_seq_len
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.vit import grid_positions
from vit_pytorch.recorder import Extractor, Recorder

PACKINGS = ('varlen', 'mask')
packings = pytest.mark.parametrize('packing', PACKINGS)


def tiny_navit(**overrides):
    kwargs = dict(image_size=(32, 48), patch_size=8, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32)
    kwargs.update(overrides)
    torch.manual_seed(0)
    return NaViT(**kwargs)


SIZES = [(32, 48), (8, 16), (24, 8), (16, 16), (8, 48), (32, 32), (16, 24), (8, 8)]


def mixed_images(sizes=SIZES, channels=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(channels, *size, generator=generator) for size in sizes]


def one_at_a_time(model, images):
    with torch.no_grad():
        return torch.cat([model([image]) for image in images])


# shapes and gradients (the conformance rows 'na_vit' and 'na_vit[list]' take the default packing, 'varlen', without
# grouping or token dropping; the packed outputs' shapes follow from the packed == alone test below)


@packings
def test_a_tensor_batch_gives_logits_and_a_headless_model_the_pooled_embeddings(packing):
    assert tiny_navit(packing=packing)(torch.randn(4, 3, 16, 24)).shape == (4, 5)
    assert tiny_navit(num_classes=0, packing=packing)(mixed_images()).shape == (8, 16)


@packings
def test_every_parameter_gets_a_gradient_with_token_dropout(packing):
    # token dropout keeps a fixed count of each image's tokens (half, at least one: the 32x48 image keeps 12), so
    # every attention over a packed sequence has several keys whichever tokens are kept; no dropout, so nothing
    # else is left to chance (test_conformance's rule)
    model = move_off_initialisation(tiny_navit(packing=packing, token_dropout_prob=0.5).train())
    assert parameters_without_gradient(model, model(mixed_images(), group_images=True, group_max_seq_len=20)) == []


def test_readme_configuration_has_the_parameters_of_vit_pytorchs():
    metadata, _, _ = load_fixture('vit_pytorch_1.26.14_na_vit')
    with torch.device('meta'):
        model = NaViT(**metadata['readme_config'])
    assert count(model) == int(metadata['readme_count']) == 58_766_336


# packing: what proves it correct


@packings
@pytest.mark.parametrize('seed', range(3))
def test_each_images_logits_in_a_packed_batch_equal_its_logits_alone(packing, seed):
    model = tiny_navit(packing=packing).eval()
    rng = random.Random(seed)
    sizes = rng.sample(SIZES, k=len(SIZES)) + [rng.choice(SIZES) for _ in range(4)]   # a random packing order
    images = mixed_images(sizes, seed=seed)
    alone = one_at_a_time(model, images)
    cut = rng.randrange(1, len(images))
    with torch.no_grad():
        for packed in (model(images),                                                  # one sequence
                       model(images, group_images=True, group_max_seq_len=rng.choice([24, 30, 40, 64])),
                       model([images[:cut], images[cut:]])):                            # packed by hand
            torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)


@packings
def test_packing_order_does_not_change_an_images_logits(packing):
    model = tiny_navit(packing=packing).eval()
    images = mixed_images(SIZES[:5])
    with torch.no_grad():
        reference = model(images)
        for order in itertools.islice(itertools.permutations(range(5)), 0, 120, 17):
            logits = model([images[i] for i in order])
            torch.testing.assert_close(logits, reference[list(order)], atol=1e-5, rtol=0)


def test_both_packings_and_the_tensor_batch_compute_the_same_function():
    varlen, masked = tiny_navit(packing='varlen').eval(), tiny_navit(packing='mask').eval()
    images = mixed_images()
    batch = torch.randn(3, 3, 24, 40)
    with torch.no_grad():
        torch.testing.assert_close(varlen(images), masked(images), atol=1e-5, rtol=0)
        torch.testing.assert_close(varlen(batch), masked(list(batch)), atol=1e-5, rtol=0)


def image_ids_of(groups, patch_size=8):
    """For each packed sequence, the index (within it) of the image of each token; -1 for padding."""
    lengths = [[(h // patch_size) * (w // patch_size) for h, w in group] for group in groups]
    width = max(sum(group) for group in lengths)
    ids = torch.full((len(groups), width), -1)
    for row, group in enumerate(lengths):
        start = 0
        for image, length in enumerate(group):
            ids[row, start:start + length] = image
            start += length
    return ids


def test_no_token_attends_across_images_in_the_recorded_maps():
    model = tiny_navit(packing='mask').eval()
    groups = [SIZES[:3], SIZES[3:]]
    images = mixed_images(SIZES)
    with Recorder(model) as recorder, torch.no_grad():
        model([images[:3], images[3:]])
    *layers, pooling = recorder.maps
    ids = image_ids_of(groups)                                          # (2, n)
    same_image = ids[:, None, :, None] == ids[:, None, None, :]         # (2, 1, n, n)
    real = (ids >= 0)[:, None, :, None]
    assert len(layers) == 2
    for attn in layers:
        assert attn.shape == (2, 2, ids.shape[1], ids.shape[1])
        assert (attn.masked_fill(same_image, 0) == 0).all()          # exactly zero between images
        own = attn.masked_fill(~same_image, 0).sum(-1, keepdim=True)
        torch.testing.assert_close(own[real.expand_as(own)], torch.ones(int(real.expand_as(own).sum())))
    # the pooling: query q reads image q of its sequence only
    assert pooling.shape == (2, 2, 5, ids.shape[1])
    for row, group in enumerate(groups):
        for query in range(len(group)):
            weights = pooling[row, :, query]
            assert (weights[:, ids[row] != query] == 0).all()
            torch.testing.assert_close(weights.sum(-1), torch.ones(2))


def test_varlen_records_one_map_per_image_length_and_never_spans_images():
    model = tiny_navit(packing='varlen').eval()
    images = mixed_images()
    with Recorder(model) as recorder, torch.no_grad():
        model(images)
    lengths = sorted((h // 8) * (w // 8) for h, w in SIZES)
    runs = sorted(set(lengths))
    expected = [(lengths.count(n), 2, n, n) for n in runs]
    shapes = [tuple(m.shape) for m in recorder.maps]
    assert shapes == expected * 2 + [(lengths.count(n), 2, 1, n) for n in runs]


@packings
def test_fused_attention_equals_the_recorded_explicit_path(packing):
    model = tiny_navit(packing=packing).eval()
    images = mixed_images()
    with torch.no_grad():
        fused = model(images, group_images=True, group_max_seq_len=40)
        with Recorder(model):
            explicit = model(images, group_images=True, group_max_seq_len=40)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)


def test_a_sequence_with_fewer_images_than_others_stays_finite_in_training():
    # in the mask packing the unused pooling queries of the shorter sequence read everything, not nothing
    model = tiny_navit(packing='mask').train()
    images = mixed_images()
    logits = model([images[:1], images[1:]])
    logits.sum().backward()
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


# a broken image stays in its own outputs, whatever it holds

BROKEN_PIXELS = pytest.mark.parametrize('value', [math.nan, -math.inf, 3e38], ids=['nan', '-inf', '3e38'])


def with_broken_image(images, index, value, everywhere):
    """`images` with image `index` holding `value`: in every pixel, or in one pixel of one channel."""
    broken = [image.clone() for image in images]
    if everywhere:
        broken[index].fill_(value)
    else:
        broken[index][1, 5, 3] = value
    return broken


@packings
@BROKEN_PIXELS
@pytest.mark.parametrize('everywhere', [False, True], ids=['one_pixel', 'every_pixel'])
def test_an_image_with_non_finite_or_huge_pixels_leaves_the_images_packed_with_it_as_they_are(packing, value,
                                                                                             everywhere):
    model = tiny_navit(packing=packing).eval()
    images = mixed_images()
    others = [i for i in range(len(images)) if i != 2]
    broken = with_broken_image(images, 2, value, everywhere)
    with torch.no_grad():
        without = model([images[i] for i in others])
        for logits in (model(broken), model(broken, group_images=True, group_max_seq_len=40),
                       model([broken[:4], broken[4:]])):
            assert torch.isfinite(logits[others]).all()
            torch.testing.assert_close(logits[others], without, atol=1e-5, rtol=0)


@packings
def test_a_nan_image_gets_nan_logits_rather_than_a_made_up_answer(packing):
    model = tiny_navit(packing=packing).eval()
    broken = with_broken_image(mixed_images(), 2, math.nan, everywhere=False)
    with torch.no_grad():
        assert torch.isnan(model(broken)[2]).all()


# factorised positions, token dropping, grouping


def test_each_patch_gets_the_row_and_column_embedding_of_where_it_was_cut():
    model = tiny_navit(channels=1).eval()
    rows, columns = torch.meshgrid(torch.arange(3), torch.arange(5), indexing='ij')
    image = (rows * 10 + columns).float().repeat_interleave(8, 0).repeat_interleave(8, 1)[None]   # (1, 24, 40)
    patches, positions = model.patches(image)
    assert torch.equal(patches[:, 0], (positions[:, 0] * 10 + positions[:, 1]).float())
    assert torch.equal(patches.amin(1), patches.amax(1))               # each patch is one cell
    with torch.no_grad():
        tokens = model.embed(patches, positions)
        expected = model.to_patch_embedding(patches) + model.pos_embed_height[positions[:, 0]] + \
            model.pos_embed_width[positions[:, 1]]
    torch.testing.assert_close(tokens, expected)


def test_grid_positions_are_row_major():
    assert grid_positions(2, 3).tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]


def test_token_dropping_keeps_a_random_share_of_each_image_in_training_only():
    model = tiny_navit(token_dropout_prob=0.5)
    image = torch.randn(3, 32, 48)                                      # 24 tokens
    model.train()
    kept = [model.patches(image)[1] for _ in range(5)]
    assert all(len(positions) == 12 for positions in kept)
    assert all(len({tuple(p) for p in positions.tolist()}) == 12 for positions in kept)   # no repeats
    assert len({tuple(map(tuple, positions.tolist())) for positions in kept}) > 1       # random
    assert len(model.patches(torch.randn(3, 8, 8))[1]) == 1             # at least one token
    model.eval()
    assert len(model.patches(image)[1]) == 24


def test_token_dropout_prob_may_depend_on_the_image_size():
    seen = []

    def drop(height, width):
        seen.append((height, width))
        return 0.75 if height * width > 256 else 0.

    model = tiny_navit(token_dropout_prob=drop).train()
    assert len(model.patches(torch.randn(3, 32, 48))[1]) == 6
    assert len(model.patches(torch.randn(3, 16, 16))[1]) == 4
    assert seen == [(32, 48), (16, 16)]


def test_grouping_counts_the_tokens_that_token_dropping_keeps():
    images = [torch.randn(3, 32, 32)] * 4                               # 16 tokens each
    assert [len(g) for g in group_images_by_max_seq_len(images, patch_size=(8, 8), max_seq_len=32)] == [2, 2]
    groups = group_images_by_max_seq_len(images, patch_size=(8, 8), max_seq_len=32, token_dropout=lambda h, w: 0.5)
    assert [len(g) for g in groups] == [4]
    model = tiny_navit(token_dropout_prob=0.5, packing='mask').train()
    features = model.forward_features(images, group_images=True, group_max_seq_len=32)
    assert features.tokens.shape[:2] == (1, 32)


# the face every model has (for the default packing: tests/test_conformance.py, rows 'na_vit' and 'na_vit[list]')


def test_under_the_mask_packing_forward_is_forward_head_of_forward_features():
    model = tiny_navit(packing='mask').eval()
    images = mixed_images()
    with torch.no_grad():
        features = model.forward_features(images)
        torch.testing.assert_close(model.forward_head(features), model(images))
        embedding = model.forward_head(features, pre_logits=True)
    assert embedding.shape == (8, 16)
    torch.testing.assert_close(model.mlp_head[1](embedding), model(images))


def test_extractor_captures_the_packed_tokens():
    model = tiny_navit().eval()
    logits, features = Extractor(model)(mixed_images())
    assert logits.shape == (8, 5)
    assert features.tokens.shape == (1, sum((h // 8) * (w // 8) for h, w in SIZES), 16)


def test_recorder_lays_a_tensor_batch_on_its_grid():
    model = tiny_navit().eval()
    with Recorder(model) as recorder:
        model(torch.randn(2, 3, 16, 24))
    assert [tuple(m.shape) for m in recorder.maps] == [(2, 2, 6, 6)] * 2 + [(2, 2, 1, 6)]
    assert recorder.grid == (2, 3) and recorder.num_prefix_tokens == 0


@pytest.mark.slow
def test_mask_packing_compiles_without_graph_breaks():
    model = tiny_navit(packing='mask', depth=1).eval()
    images = mixed_images(SIZES[:3])
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend='eager')
    with torch.no_grad():
        torch.testing.assert_close(compiled(images, group_images=True, group_max_seq_len=30), model(images),
                                   atol=1e-5, rtol=0)


@pytest.mark.slow
def test_varlen_training_step_with_token_dropout_compiles_without_graph_breaks():
    model = tiny_navit(token_dropout_prob=0.5, depth=1).train()
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend='eager')
    compiled(mixed_images([(32, 48), (8, 16), (16, 8)])).sum().backward()     # two lengths: 24 and 2 tokens
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


# the reference: vit-pytorch's NaViT, tiny, noisy weights (tests/fixtures/make_na_vit_fixtures.py)


def vit_pytorch_case():
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_na_vit')
    config = {key: tuple(value) if isinstance(value, list) else value for key, value in metadata['config'].items()}
    images = [tensors[f'image.{i}'] for i in range(sum(len(group) for group in metadata['groups']))]
    return config, metadata, state_dict, images, tensors


@packings
def test_vit_pytorch_checkpoint_loads_and_gives_its_logits(packing):
    config, metadata, state_dict, images, tensors = vit_pytorch_case()
    model = load_vit_pytorch(NaViT(**config, packing=packing).eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(model([[images[i] for i in group] for group in metadata['groups']]),
                                   tensors['output'], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(images, group_images=True, group_max_seq_len=metadata['group_max_seq_len']),
                                   tensors['output_grouped'], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(tensors['input_tensor']), tensors['output_tensor'], atol=1e-5, rtol=1e-5)


def test_vit_pytorch_checkpoint_with_a_nonzero_layernorm_beta_is_refused():
    config, _, state_dict, _, _ = vit_pytorch_case()
    state_dict['transformer.norm.beta'] = state_dict['transformer.norm.beta'] + 1
    with pytest.raises(ValueError, match='transformer.norm.beta'):
        load_vit_pytorch(NaViT(**config), state_dict)


def test_vit_pytorch_checkpoint_of_another_size_is_refused_before_anything_is_copied():
    config, _, state_dict, _, _ = vit_pytorch_case()
    model = NaViT(**dict(config, image_size=(16, 16)))
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match='pos_embed_width'):
        load_vit_pytorch(model, state_dict)
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())


# real data


def test_learns_a_fixed_batch_of_real_digits_at_mixed_sizes():
    images, labels = digits_batch(24)
    sizes = [8, 12, 16]
    mixed = [F.interpolate(image[None], size=(sizes[i % 3], sizes[(i // 3) % 3]), mode='bilinear')[0]
             for i, image in enumerate(images)]
    model = tiny_navit(image_size=16, patch_size=4, channels=1, num_classes=10, dim=32, depth=2, mlp_dim=64)
    accuracy, steps = fit_fixed_batch(model, mixed, labels, lr=3e-3, max_steps=300)
    assert accuracy == 1.0, f'{accuracy:.2f} after {steps} steps'


# clear errors


@pytest.mark.parametrize('name, value', [
    ('token_dropout_prob', 1.0), ('packing', 'nested'), ('dim', 0),
    ('image_size', (30, 48)), ('dropout', 2.0)])
def test_bad_arguments_are_named(name, value):
    with pytest.raises((ValueError, TypeError), match=name):
        tiny_navit(**{name: value})


@pytest.mark.parametrize('batched_images, match', [
    (None, 'batched_images must be a list'),
    ([], 'batched_images must be a list'),
    ([torch.randn(3, 16, 16), 'image'], r'batched_images\[1\] must be an img tensor'),
    ([torch.randn(16, 16)], r'batched_images\[0\] must be an img tensor \(c, h, w\)'),
    ([torch.randn(1, 16, 16)], 'img with 3 channels'),
    ([torch.randn(3, 16, 12)], 'multiples of patch_size'),
    ([torch.randn(3, 40, 16)], 'larger than image_size'),
    ([torch.randn(3, 16, 16).double()], 'img has dtype torch.float64'),
    ([torch.zeros(3, 16, 16, dtype=torch.long)], 'floating point img'),
    ([[torch.randn(3, 16, 16)], []], r'batched_images\[1\] is an empty group'),
    (torch.randn(3, 16, 16), r'img must have shape \(b, c, h, w\)'),
    (torch.randn(2, 3, 16, 56), 'larger than image_size'),
])
def test_bad_images_are_refused_by_name(batched_images, match):
    with pytest.raises((ValueError, TypeError), match=match):
        tiny_navit()(batched_images)


def test_grouping_errors_name_the_argument():
    model = tiny_navit()
    images = mixed_images()
    with pytest.raises(ValueError, match=r'group_max_seq_len=10 is too short for img batched_images\[0\]'):
        model(images, group_images=True, group_max_seq_len=10)
    with pytest.raises(ValueError, match='group_max_seq_len'):
        model(images, group_images=True, group_max_seq_len=0)
    with pytest.raises(ValueError, match='already grouped'):
        model([images[:2], images[2:]], group_images=True)
    with pytest.raises(TypeError, match='group_images'):
        model(images, group_images='yes')


def test_token_dropout_function_returning_a_bad_value_is_named():
    model = tiny_navit(token_dropout_prob=lambda height, width: 1.5).train()
    with pytest.raises(ValueError, match=r'token_dropout_prob\(32, 48\) must return a probability'):
        model(mixed_images()[:1])
