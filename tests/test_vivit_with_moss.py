"""MOSS: the space-time self-similarity written out by hand, its higher orders, its causal windows and streaming;
ViViT with MOSS; vit-pytorch's weights."""

import itertools

import pytest
import torch
from einops import reduce

from helpers import load_fixture, move_off_initialisation, reference_case
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.vivit_with_moss import MOSS, ViViT

BLOCK = dict(dim=6, local_time=3, local_height=3, local_width=5, hidden_dim=4, orders=2)
TINY = dict(image_size=(16, 24), image_patch_size=(4, 8), frames=8, frame_patch_size=2, num_classes=5, dim=16,
            spatial_depth=2, temporal_depth=2, heads=2, dim_head=8, mlp_dim=32, moss_hidden_dim=8)


def explicit_stss(x, local_time, local_height, local_width, causal):
    """sim[b, t, i, j, l, u, v] = cos(x[b, t, i, j], x[b, t + l - a, i + u - lh // 2, j + v - lw // 2]), 0 where
    the neighbour lies outside the clip; a = local_time - 1 for causal windows (the past only), else
    local_time // 2. Loops over every entry, in float64."""
    b, t, h, w, _ = x.shape
    back = local_time - 1 if causal else local_time // 2
    sim = torch.zeros(b, t, h, w, local_time, local_height, local_width, dtype=torch.float64)
    for n, f, i, j, l, u, v in itertools.product(range(b), range(t), range(h), range(w), range(local_time),
                                                 range(local_height), range(local_width)):
        g, r, c = f + l - back, i + u - local_height // 2, j + v - local_width // 2
        if 0 <= g < t and 0 <= r < h and 0 <= c < w:
            sim[n, f, i, j, l, u, v] = torch.nn.functional.cosine_similarity(x[n, f, i, j], x[n, g, r, c], dim=0,
                                                                             eps=0)
    return sim


def block(**changes):
    torch.manual_seed(0)
    return move_off_initialisation(MOSS(**{**BLOCK, **changes})).double().eval()


def tokens(shape=(2, 4, 3, 4, 6), seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize('causal', [False, True])
def test_the_first_order_is_each_tokens_cosine_similarity_to_its_neighbourhood(causal):
    moss, x = block(causal=causal), tokens()
    torch.testing.assert_close(moss.stss_transform(x), explicit_stss(x, 3, 3, 5, causal), rtol=1e-12, atol=1e-12)


def test_the_similarities_ignore_each_tokens_scale():
    moss, x = block(), tokens()
    scales = torch.rand(x.shape[:-1] + (1,), generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 0.1
    torch.testing.assert_close(moss.stss_transform(x * scales), moss.stss_transform(x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('causal', [False, True])
def test_each_higher_order_is_the_similarity_of_the_order_below_it(causal):
    """out = to_out(x) + sum_k to_order_out[k](f_k), f_1 = encoder_1(STSS(x)), f_2 = encoder_2(STSS(f_1)),
    f_3 = encoder_3(STSS(f_2)), with STSS written out."""
    moss, x = block(causal=causal, orders=3), tokens()
    expected, features = moss.to_out(x), x
    with torch.no_grad():
        for encoder, to_order_out in zip(moss.encoders, moss.to_order_out):
            features = encoder(explicit_stss(features, 3, 3, 5, causal))
            expected = expected + to_order_out(features)
        torch.testing.assert_close(moss(x), expected, rtol=1e-10, atol=1e-10)


def test_a_causal_moss_never_reads_a_later_frame():
    moss, x = block(causal=True), tokens((2, 5, 3, 4, 6))
    later = x.clone()
    later[:, 3:] += 1
    with torch.no_grad():
        before, after = moss(x), moss(later)
    assert torch.equal(before[:, :3], after[:, :3])
    assert not torch.allclose(before[:, 3:], after[:, 3:])


def test_a_non_causal_moss_reads_the_next_frame():
    moss, x = block(causal=False), tokens((2, 5, 3, 4, 6))
    later = x.clone()
    later[:, 3:] += 1
    with torch.no_grad():
        assert not torch.allclose(moss(x)[:, 2], moss(later)[:, 2])


@pytest.mark.parametrize('chunks', [(2, 4), (1, 1, 3, 1), (5, 1)])
def test_a_causal_moss_fed_in_chunks_with_its_cache_gives_the_whole_streams_features(chunks):
    moss, x = block(causal=True), tokens((2, 6, 3, 4, 6))
    with torch.no_grad():
        whole = moss(x)
        parts, cache, start = [], None, 0
        for size in chunks:
            out, cache = moss(x[:, start:start + size], cache=cache, return_cache=True)
            parts.append(out)
            start += size
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-12, atol=1e-12)


def vivit(**changes):
    torch.manual_seed(0)
    return move_off_initialisation(ViViT(**{**TINY, **changes})).eval()


def videos(seed=2, count=2):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 8, 16, 24, generator=generator) for _ in range(count)]


def test_a_causal_models_slices_never_see_a_later_frame():
    """moss_causal=True: every temporal layer's output at slices 0-2 stays bit for bit when frames 6-7 (slice 3)
    move; the cls token, which reads every slice, does not."""
    model = vivit(moss_causal=True)
    video, = videos(count=1)
    later = video.clone()
    later[:, :, 6:] = torch.randn(later[:, :, 6:].shape, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        before, after = model.forward_intermediates(video), model.forward_intermediates(later)
    for layer_before, layer_after in zip(before, after):
        assert torch.equal(layer_before[:, 1:4], layer_after[:, 1:4])
        assert not torch.allclose(layer_before[:, 0], layer_after[:, 0])


def test_a_causal_cls_models_logits_depend_on_the_video():
    model = vivit(moss_causal=True)
    first, second = videos()
    with torch.no_grad():
        assert not torch.allclose(model(first), model(second))


def test_the_pooled_embedding_adds_the_moss_features_mean_to_each_slices_cls_token():
    """Without MOSS features (to_out and every to_order_out zero) the slices' tokens are their spatial cls tokens
    alone: the model is then our ViViT's factorised encoder with the same weights and a LayerNorm head."""
    from vit_pytorch.vivit import ViViT as PlainViViT

    model = vivit(moss_causal=False)
    with torch.no_grad():
        for linear in [model.moss.to_out, *model.moss.to_order_out]:
            linear.weight.zero_()
            linear.bias.zero_()
    torch.manual_seed(0)
    plain = PlainViViT(**{k: v for k, v in TINY.items() if k != 'moss_hidden_dim'}).eval()
    shared = {k: v for k, v in model.state_dict().items() if not k.startswith(('moss.', 'mlp_head.'))}
    plain.load_state_dict({**shared, **{f'mlp_head.{k}': v for k, v in plain.mlp_head.state_dict().items()}})
    video, = videos(count=1)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(video), plain.forward_features(video), rtol=1e-5, atol=1e-6)


# vit-pytorch 1.26.14's module (tests/fixtures/make_vivit_with_moss_fixtures.py)

TUPLES = ('image_size', 'image_patch_size')


@pytest.mark.parametrize('name', ['vit_pytorch_1.26.14_vivit_with_moss_mean_causal',
                                  'vit_pytorch_1.26.14_vivit_with_moss_cls'])
def test_vit_pytorchs_checkpoint_loads_and_gives_its_output(name):
    config, state_dict, video, expected = reference_case(name, *TUPLES)
    model = load_vit_pytorch(ViViT(**config), state_dict).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(video), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('name', ['vit_pytorch_1.26.14_moss', 'vit_pytorch_1.26.14_moss_causal'])
def test_vit_pytorchs_moss_block_loads_strictly_and_gives_its_output(name):
    config, state_dict, x, expected = reference_case(name)
    model = MOSS(**config).eval()
    model.load_state_dict(state_dict, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)


def test_vit_pytorchs_default_causal_cls_model_gives_the_same_logits_for_every_video():
    """Why its causal cls checkpoints are refused: in its own outputs two random videos get equal logits."""
    _, _, tensors = load_fixture('vit_pytorch_1.26.14_vivit_with_moss_cls_causal')
    assert not torch.allclose(tensors['input'], tensors['input_other'])
    torch.testing.assert_close(tensors['output'], tensors['output_other'], rtol=0, atol=0)


def test_a_causal_cls_model_refuses_vit_pytorchs_checkpoint_naming_why():
    config, state_dict, _, _ = reference_case('vit_pytorch_1.26.14_vivit_with_moss_cls_causal', *TUPLES)
    with pytest.raises(CheckpointError, match=r'attend to itself only.*do not depend on the video'):
        load_vit_pytorch(ViViT(**config), state_dict)


# the official code, KimManjin/CorrelationSideTuning @ 67aaf40 (Recognition/modules/moss.py; fixture written by
# tests/fixtures/make_moss_official_fixtures.py): its MOSSBlock, float64, BatchNorm statistics set


def official_names(key):
    """Our name of an official MOSSBlock parameter: stss_encoders.<k>.{ln_pre, in_proj, stss_extraction.conv0,
    stss_integration.conv0, .conv1, .conv2_fuse (its first entry the rearrangement), out_proj}."""
    key = key.replace('stss_encoders.', 'encoders.', 1)
    key = key.replace('stss_extraction.conv0.', 'extraction.').replace('stss_integration.conv0.', 'integration.0.')
    key = key.replace('stss_integration.conv1.', 'integration.1.')
    if 'stss_integration.conv2_fuse.' in key:
        head, tail = key.split('stss_integration.conv2_fuse.')
        index, rest = tail.split('.', 1)
        key = f'{head}fuse.{int(index) - 1}.{rest}'
    return key


def official_moss(window_name, **changes):
    metadata, _, tensors = load_fixture('moss_official')
    config = metadata['config']
    block, (lt, lh, lw) = config['block'], config['windows'][window_name]
    moss = MOSS(block['d_in'], lt, lh, lw, hidden_dim=block['d_hid'], orders=block['n_encoders'], causal=False,
                **{'layout': 'official', 'official_channels': (*block['ext_chnls'], *block['int_chnls']), **changes})
    prefix = f'{window_name}.state_dict.'
    state = {official_names(key.removeprefix(prefix)): value for key, value in tensors.items()
             if key.startswith(prefix)}
    moss.double()
    if changes.get('layout', 'official') == 'official':
        moss.load_state_dict(state, strict=True)
    return moss, {key.removeprefix(f'{window_name}.'): value for key, value in tensors.items()
                           if key.startswith(f'{window_name}.') and not key.startswith(prefix)}


@pytest.mark.parametrize('window', ['centred', 'one_frame'])
def test_the_official_layout_is_the_official_codes_moss_block(window):
    """The sum of the orders' features, each order's encoder reading the one before's (LayerNorm, a Linear, the STSS,
    BatchNorm'd convolutions over the offsets, the time offsets fused, a Linear back): in eval mode (running
    statistics) and in training mode (the batch's)."""
    moss, tensors = official_moss(window)
    with torch.no_grad():
        torch.testing.assert_close(moss.eval()(tensors['input']), tensors['output'], rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(moss.train()(tensors['input']), tensors['output_train'], rtol=1e-12, atol=1e-13)


def test_the_centred_stss_is_the_official_codes_in_both_layouts_and_one_frame_reads_the_one_before():
    """Centred in time, the official STSSTransformation is our non-causal STSS in either layout; with a window of one
    frame it compares each frame with the one before (the first with itself), which the official layout does and
    vit-pytorch's (each frame with itself) does not."""
    for window in ('centred', 'one_frame'):
        moss, tensors = official_moss(window)
        encoder = moss.encoders[0]
        with torch.no_grad():
            projected = encoder.in_proj(encoder.ln_pre(tensors['input']))
            expected = tensors['stss'][:, :, :, :, 0]
            torch.testing.assert_close(moss.stss_transform(projected), expected, rtol=1e-12, atol=1e-14)
            theirs = official_moss(window, layout='vit_pytorch')[0].stss_transform(projected)
            assert torch.allclose(theirs, expected, rtol=1e-12, atol=1e-14) == (window == 'centred')


def test_the_official_layout_in_vivit_adds_its_features_to_the_patch_tokens_and_refuses_causal_time():
    # pool='mean': the temporal transformer reads each slice's mean over its patches of tokens + MOSS features
    torch.manual_seed(0)
    model = ViViT(**TINY, pool='mean', moss_causal=False, moss_layout='official',
                  moss_official_channels=(4, 3, 5, 7)).eval()
    seen = {}
    model.moss.register_forward_hook(lambda module, args, output: seen.update(tokens=args[0], features=output))
    model.temporal_transformer.register_forward_pre_hook(lambda module, args, kwargs: seen.update(slices=args[0]),
                                                         with_kwargs=True)
    with torch.no_grad():
        assert model(videos(count=1)[0]).shape == (2, 5)
    expected = reduce(seen['tokens'] + seen['features'], 'b f h w d -> b f d', 'mean')
    torch.testing.assert_close(seen['slices'], expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"moss_causal must be False with layout='official'"):
        ViViT(**TINY, moss_causal=True, moss_layout='official')


def test_a_model_in_the_official_layout_refuses_vit_pytorchs_checkpoint_naming_the_option():
    config, state_dict, _, _ = reference_case('vit_pytorch_1.26.14_vivit_with_moss_mean_causal', *TUPLES)
    config = dict(config, moss_causal=False, moss_layout='official')
    with pytest.raises(CheckpointError, match=r"moss_layout='official'.*moss_layout='vit_pytorch'"):
        load_vit_pytorch(ViViT(**config), state_dict)


# clear errors


@pytest.mark.parametrize('changes, error, match', [
    (dict(moss_local_time=2), ValueError, 'moss_local_time must be odd'),
    (dict(moss_causal='yes'), TypeError, 'moss_causal'),
    (dict(moss_layout='paper'), ValueError, "moss_layout must be 'vit_pytorch' or 'official'"),
    (dict(moss_official_channels=(4, 3, 5)), TypeError, 'moss_official_channels'),
])
def test_a_bad_moss_argument_is_refused_by_name(changes, error, match):
    with pytest.raises(error, match=match):
        ViViT(**{**TINY, **changes})


def test_a_mask_is_refused_by_a_causal_model():
    video, = videos(count=1)
    with pytest.raises(ValueError, match='mask cannot be given to a causal model'):
        vivit(moss_causal=True)(video, mask=torch.ones(2, 8, dtype=torch.bool))


def test_a_cache_is_refused_by_a_non_causal_moss():
    with pytest.raises(ValueError, match='cache is for a causal MOSS'):
        block(causal=False)(tokens(), cache=(None, None))


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block: 8 frames of 256 pixels, tubelets of 2 x 32 x 32, width 512; then the MOSS block
    alone on (2, 8, 16, 16, 512) tokens."""
    model = ViViT(dim=512, spatial_depth=2, temporal_depth=2, heads=4, mlp_dim=2048, image_size=256,
                  image_patch_size=32, frames=8, frame_patch_size=2, num_classes=1000, moss_causal=True)
    with torch.no_grad():
        assert model(torch.randn(2, 3, 8, 256, 256), mask=None).shape == (2, 1000)
        moss = MOSS(dim=512, local_time=3, local_height=3, local_width=3, hidden_dim=64, orders=2, causal=True)
        assert moss(torch.randn(2, 8, 16, 16, 512)).shape == (2, 8, 16, 16, 512)
