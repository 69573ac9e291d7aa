"""LeVJEPA (arXiv 2608.27395): the block-causal video transformer (a frame's patches see their own and earlier
frames, the cls token sees all and no patch sees it), its rotary embedding (scores depend on coordinate
differences), token dropping, the views of a clip kept together, and vit-pytorch's weights and loss, from a fixture
it wrote with its failing torch.compile step bypassed."""

import pytest
import torch
from einops import rearrange

from helpers import LeVJEPACls, count, levjepa_official_config, check_levjepa_official_objective, load_fixture
from vit_pytorch.lejepa import sigreg_loss
from vit_pytorch import vit
from vit_pytorch.levjepa import (CONFIGS, RECIPE, LeVJEPA, VideoTransformer, VideoTransformerClassifier,
                                 block_causal_mask, levjepa, video_frequencies, video_transformer)
from vit_pytorch.pretrained import load_vit_pytorch

ENCODER = dict(image_size=16, patch_size=8, frames=3, dim=32, depth=2, heads=2, dim_head=16, mlp_dim=64)


def tiny_encoder(**overrides):
    torch.manual_seed(0)
    return VideoTransformer(**{**ENCODER, **overrides}).eval()


def test_patches_see_only_their_own_and_earlier_frames():
    encoder, video = tiny_encoder(), torch.randn(1, 3, 3, 16, 16)
    changed = video.clone()
    changed[:, :, 2] = torch.randn(1, 3, 16, 16)            # the last frame (a constant shift would be normed away)
    with torch.no_grad():
        before, after = encoder(video), encoder(changed)
    # tokens: cls, then 4 patches per frame
    torch.testing.assert_close(after[:, 1:9], before[:, 1:9], rtol=0, atol=0)
    assert (after[:, 9:] - before[:, 9:]).abs().max() > 0.1
    assert (after[:, 0] - before[:, 0]).abs().max() > 0.01     # the cls token reads every frame


def test_no_patch_attends_to_the_cls_token():
    encoder, video = tiny_encoder(), torch.randn(1, 3, 3, 16, 16)
    with torch.no_grad():
        before = encoder(video)
        encoder.cls_token.add_(1.)
        after = encoder(video)
    torch.testing.assert_close(after[:, 1:], before[:, 1:], rtol=0, atol=0)


def test_without_block_causality_the_first_frame_sees_the_last():
    encoder, video = tiny_encoder(block_causal=False), torch.randn(1, 3, 3, 16, 16)
    changed = video.clone()
    changed[:, :, 2] = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert (encoder(changed)[:, 1:5] - encoder(video)[:, 1:5]).abs().max() > 0.01


def test_rotary_scores_depend_on_the_angle_difference_only():
    # q rotated by a and k by b score as q rotated by a - b against k as it is: R(a)^T R(b) = R(b - a); each sample
    # its own angles (b, 1, n, pairs), shared by the heads
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 5, 16, generator=generator), torch.randn(2, 2, 5, 16, generator=generator)
    a, b = torch.randn(2, 1, 5, 6, generator=generator), torch.randn(2, 1, 5, 6, generator=generator)
    score = lambda x, y: (x * y).sum(-1)
    rotated = score(vit.rotate(q, a), vit.rotate(k, b))
    relative = score(vit.rotate(q, a - b), k)
    torch.testing.assert_close(rotated, relative, rtol=1e-5, atol=1e-5)
    # the 4 channels past the 12 rotated ones pass unchanged
    torch.testing.assert_close(vit.rotate(q, a)[..., 12:], q[..., 12:])


def test_the_rotary_angles_are_coordinates_in_minus_1_1_times_linear_frequencies_times_pi():
    """dim_head 16 over 3 axes: 2 frequencies per axis, 1 and max_freq / 2 = 5, times pi; the angle of axis a's pair
    f is coordinate_a * frequency_f * pi, axes one after the other."""
    rotary = vit.AxialRotaryEmbedding(video_frequencies(16, 10., axes=3))
    coords = torch.tensor([[[0.5, -1., 0.25]]])                                       # (b, n, axes)
    expected = torch.tensor([0.5, 2.5, -1., -5., 0.25, 1.25]) * torch.pi
    torch.testing.assert_close(rotary(coords)[0, 0], expected)


def test_training_keeps_the_cls_token_and_a_share_of_the_patches():
    encoder, video = tiny_encoder(), torch.randn(2, 3, 3, 16, 16)
    encoder.train()
    tokens = encoder(video, drop_ratio=0.75)
    assert tokens.shape == (2, 1 + 3, 32)                   # int(12 * 0.25) = 3 patches kept
    assert encoder(video, drop_ratio=0.999).shape == (2, 2, 32)      # never fewer than one
    encoder.eval()
    assert encoder(video, drop_ratio=0.75).shape == (2, 13, 32)      # nothing dropped outside training


def test_each_clips_local_views_are_pulled_to_its_own_global_view():
    # local views equal to their clip's global view: nothing to pull. vit-pytorch's reshape pairs rows of other
    # clips (see the fixture test), which would not give zero
    torch.manual_seed(0)
    learner = LeVJEPA(tiny_encoder(), 16, local_size=16, num_local_views=2, num_classes_K=8, projection_hidden=16,
                      drop_ratio=None).train()
    video = torch.randn(3, 3, 3, 16, 16)
    projections = learner.project(video, rearrange(video[:, None].expand(-1, 2, -1, -1, -1, -1),
                                                   'b v c t h w -> (b v) c t h w'))
    invariance, _ = learner.loss(projections)
    assert invariance.item() == pytest.approx(0, abs=1e-10)
    assert not torch.allclose(projections[0, 0], projections[1, 0])


def test_local_views_may_be_smaller_than_the_global_view():
    learner = LeVJEPA(tiny_encoder(), 16, local_size=8, num_local_views=2, num_classes_K=8, projection_hidden=16,
                      drop_ratio=0.5).train()
    loss, (invariance, sigreg) = learner(torch.rand(2, 3, 3, 16, 16), return_loss_breakdown=True)
    assert torch.isfinite(loss) and loss == invariance + sigreg


def test_bad_video_is_refused():
    with pytest.raises(ValueError, match='video must be'):
        tiny_encoder()(torch.randn(1, 3, 3, 15, 16))


# vit-pytorch 1.26.14 (tests/fixtures/make_levjepa_fixtures.py)


def vit_pytorch_levjepa():
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_levjepa')
    config = metadata['config']
    learner = LeVJEPA(VideoTransformer(**config['encoder']), **config['levjepa'])
    return load_vit_pytorch(learner, state_dict), tensors


def test_vit_pytorchs_video_transformer_loads_and_gives_its_tokens():
    learner, tensors = vit_pytorch_levjepa()
    encoder = learner.encoder.eval()
    with torch.no_grad():
        torch.testing.assert_close(encoder(tensors['video']), tensors['tokens'], rtol=1e-4, atol=1e-5)
        encoder.block_causal = False
        torch.testing.assert_close(encoder(tensors['video']), tensors['tokens_full'], rtol=1e-4, atol=1e-5)


def test_the_registered_classifier_holds_vit_pytorchs_encoder_and_pools_its_cls_token():
    """vit-pytorch's VideoTransformer weights, under `encoder.`, make the registered classifier's forward_features its
    tokens (the fixture's) and its pre-logits embedding their cls token."""
    learner, tensors = vit_pytorch_levjepa()
    config = load_fixture('vit_pytorch_1.26.14_levjepa')[0]['config']['encoder']
    model = VideoTransformerClassifier(**config, num_classes=4).eval()
    model.encoder.load_state_dict(learner.encoder.state_dict(), strict=True)
    with torch.no_grad():
        tokens = model.forward_features(tensors['video'])
        torch.testing.assert_close(tokens, tensors['tokens'], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), tensors['tokens'][:, 0], rtol=1e-4,
                                   atol=1e-5)


def test_the_registered_classifier_drops_its_patch_tokens_in_training_only():
    # 8 frames of 32 px in patches of 8: 8 x 4 x 4 = 128 patch tokens; 0.75 dropped keeps 32 of them
    torch.manual_seed(0)
    model = VideoTransformerClassifier(image_size=32, patch_size=8, frames=8, num_classes=3, dim=32, depth=1,
                                       heads=2, dim_head=16, mlp_dim=64)
    video = torch.randn(2, 3, 8, 32, 32)
    assert model.train().forward_features(video, drop_ratio=0.75).shape == (2, 1 + 32, 32)
    assert model.forward_features(video).shape == (2, 1 + 128, 32)
    assert model.eval().forward_features(video, drop_ratio=0.75).shape == (2, 1 + 128, 32)


def test_vit_pytorchs_loss_is_ours_on_its_mixed_up_pairing_of_the_views():
    # vit-pytorch concatenates [every global view, every local view] and reads the rows back as (clip, view),
    # so a clip's "global" view and its local views come from other clips; on its arrangement of our
    # projections, our loss is its loss (SIGReg: its 5 knots on [0, 3] doubled are our 9 on [-3, 3])
    learner, tensors = vit_pytorch_levjepa()
    learner.train()
    with torch.no_grad():
        tokens = learner.encoder(torch.cat((tensors['global_view'], tensors['local_views'])))[:, 0]
        theirs = rearrange(learner.projector(tokens), '(b v) d -> b v d', v=4)
        invariance, sigreg = learner.loss(theirs, projections_directions=tensors['directions'])
    torch.testing.assert_close(invariance, tensors['invariance_loss'], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(sigreg, tensors['sigreg_loss'], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(invariance + sigreg, tensors['loss'], rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        ours = learner.loss(learner.project(tensors['global_view'], tensors['local_views']),
                            projections_directions=tensors['directions'])[0]
    assert not torch.isclose(ours, invariance)               # the views of each clip kept together


def test_vit_pytorchs_sigreg_quadrature_is_ours_on_the_symmetric_grid():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 10, 8, generator=generator, dtype=torch.float64)
    directions = torch.randn(8, 16, generator=generator, dtype=torch.float64)
    directions = directions / directions.norm(dim=0)
    t = torch.linspace(0, 3, 17, dtype=torch.float64)        # vit-pytorch's levjepa.sigreg_loss, written out
    xt = (x @ directions)[..., None] * t
    err = (xt.cos().mean(-3) - (-t.square() / 2).exp()).square() + xt.sin().mean(-3).square()
    half = torch.trapezoid(err * (-t.square() / 2).exp(), t, dim=-1).mean() * 10 * 2
    ours = sigreg_loss(x, projections=directions, domain=(-3, 3), num_knots=33)
    torch.testing.assert_close(ours, half, rtol=1e-12, atol=0)


@pytest.mark.slow                     # vit-pytorch's sizes: 8 frames of 96 pixels, width 256 (7.6 s on the shared CPU)
def test_vit_pytorchs_main_block_runs_on_ours():
    # vit-pytorch's own example, which stops in vit-pytorch at create_block_mask (see the module docstring)
    encoder = VideoTransformer(image_size=96, patch_size=16, frames=8, dim=256, depth=3, heads=8, mlp_dim=512)
    learner = LeVJEPA(encoder, image_size=96)
    video = torch.randn(2, 3, 8, 96, 96)
    loss = learner(video)
    loss.backward()
    embed = learner(video, return_embedding=True)
    assert embed.shape == (2, 256) and torch.isfinite(loss)


# the official code, MLO-lab/LeVJEPA @ 481a99b (tests/fixtures/make_levjepa_official_fixtures.py): a RECONSTRUCTED
# reference, weaker than a checkout. No snapshot of the repository could be fetched, so its SIGReg, Projector,
# build_block_causal_mask and multiview_forward were copied verbatim from the search index's text at that commit into
# a folder outside this repository and run there; a slip in that copy would not show here. Its encoder (V-JEPA's)
# is not vit-pytorch's, which ours keeps: the objective and the mask are what is compared.


def test_the_objective_is_the_official_codes_loss_and_gradient():
    """Each clip's local views pulled to its own global view (mean squared distance over every view, the global
    one's zero included, no stop-gradient), SIGReg per view with the factor N (its 17 knots on [0, 3] doubled: our
    33 on [-3, 3]) weighted 0.02, the projector's BatchNorm over all views at once."""
    config, kwargs = levjepa_official_config()
    learner = LeVJEPA(LeVJEPACls(config['dim']), 1, local_size=1, num_local_views=config['local_views'], **kwargs)
    check_levjepa_official_objective(learner, lambda global_cls, local_cls: learner.project(global_cls, local_cls))


def test_the_block_causal_mask_is_the_official_codes():
    # the frame of each kept patch (its grid index // patches per frame), the cls token's -1, in the kept order
    metadata, _, tensors = load_fixture('levjepa_official')
    m = metadata['config']['mask']
    per_frame = m['H_patches'] * m['W_patches']
    for token_ids, expected in ((tensors['token_ids'], tensors['mask']),
                                (torch.arange(m['T'] * per_frame)[None], tensors['mask_all'])):
        frame = torch.cat((token_ids.new_full((token_ids.shape[0], 1), -1), token_ids // per_frame), dim=1)
        assert torch.equal(block_causal_mask(frame), expected)


# the paper's named encoders and recipe, from its code (MLO-lab/LeVJEPA @ 481a99b): module.py's vit_tiny, vit_small,
# vit_base, vit_large (embed_dim, depth, num_heads; patch_size 16, mlp_ratio 4, head_dim embed_dim // num_heads) and
# conf/config.yaml (img_size 224, num_frames 16, tubelet_size 1, use_rope: no position table)
OFFICIAL_ENCODERS = {'tiny': (192, 12, 3), 'small': (384, 12, 6), 'base': (768, 12, 12), 'large': (1024, 24, 16)}


def official_encoder_count(dim, depth, channels=3, patch=16):
    """The official VisionTransformer's parameters, from module.py's layers: PatchEmbed3D's Conv3d (tubelet 1, with
    bias), the cls token, per Block two LayerNorms (weight and bias), qkv (bias) and proj (bias) Linears and the MLP's
    fc1 and fc2 (bias), the final LayerNorm; with use_rope there is no pos_embed."""
    hidden = 4 * dim
    block = 2 * 2 * dim + (dim * 3 * dim + 3 * dim) + (dim * dim + dim) + (dim * hidden + hidden) + (hidden * dim + dim)
    return (channels * patch * patch * dim + dim) + dim + depth * block + 2 * dim


def test_the_official_large_encoder_count_is_the_released_checkpoints_303m():
    # README: LeVJEPA-VideoMix-Large, "the ViT-L/16 ... 303M parameters"
    assert official_encoder_count(1024, 24) == 303_099_904
    assert round(official_encoder_count(1024, 24) / 1e6) == 303


@pytest.mark.parametrize('variant', sorted(OFFICIAL_ENCODERS))
def test_named_encoders_take_the_official_widths(variant):
    dim, depth, heads = OFFICIAL_ENCODERS[variant]
    with torch.device('meta'):
        encoder = video_transformer(variant)
    layers = encoder.transformer.layers
    attention, feedforward = layers[0]
    assert (encoder.dim, len(layers), attention.heads, encoder.frames) == (dim, depth, heads, 16)
    assert attention.to_qkv.out_features == 3 * dim                      # heads of dim // heads channels
    assert feedforward.net[1].out_features == 4 * dim                     # mlp_ratio 4
    assert (encoder.patch_h, encoder.patch_w) == (16, 16)
    assert encoder.to_patch_embedding[2].in_features == 3 * 16 * 16       # one frame a token (tubelet 1)
    assert set(CONFIGS) == set(OFFICIAL_ENCODERS)


@pytest.mark.parametrize('variant', sorted(OFFICIAL_ENCODERS))
def test_named_encoders_count_the_official_encoders_less_vit_pytorchs_missing_biases(variant):
    """vit-pytorch's layout, which ours keeps, against V-JEPA's: per layer no qkv biases (3 dim), no output bias
    (dim), RMSNorms without the LayerNorms' biases (2 dim); the final norm's bias (dim) likewise; a LayerNorm on
    the flattened patch (3 * 16 * 16) and one after the projection (dim) that the Conv3d does not have."""
    dim, depth, _ = OFFICIAL_ENCODERS[variant]
    with torch.device('meta'):
        encoder = video_transformer(variant)
    expected = official_encoder_count(dim, depth) - depth * (3 * dim + dim + 2 * dim) - dim + 3 * 16 * 16 + dim
    assert count(encoder) == expected


def test_the_recipe_is_the_official_configs():
    # conf/config.yaml: augmentation local_size 96, local_crops_number 10, local/global crops scales, token_drop_rate
    # 0.95, projector hidden_dim 2048 output_dim 256, loss.sigreg weight 0.02, knots 17, num_proj 1024
    with torch.device('meta'):
        learner = levjepa('base')
    assert (learner.image_size, learner.local_size, learner.num_local_views) == ((224, 224), (96, 96), 10)
    assert (learner.local_crop_scale, learner.global_crop_scale, learner.drop_ratio) == ((0.02, 0.4), (0.8, 1.0), 0.95)
    assert learner.sigreg_loss_weight == 0.02 and learner.sigreg_loss_kwargs == dict(num_proj=1024, knots=17)
    # the official Projector(768, 2048, 256): Linear, BatchNorm1d (weight and bias), GELU, Linear
    assert count(learner.projector) == (768 * 2048 + 2048) + 2 * 2048 + (2048 * 256 + 256)
    assert isinstance(learner.projector[1], torch.nn.BatchNorm1d)
    assert RECIPE['num_classes_K'] == 256


def test_an_unknown_variant_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"variant must be one of \['base', 'large', 'small', 'tiny'\], got 'huge'"):
        video_transformer('huge')
