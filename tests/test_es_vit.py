"""EsViT (arXiv 2106.09785): the region-level loss against its formula, cosine matching, the view-level term is
DINO's, the step's loss is the mean of both over every pair of views, the teacher and both centres follow their
EMAs, vit-pytorch's losses reproduced, multi-stage models and vit-pytorch's README example."""

import functools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import count, tiny_vit_kwargs
from vit_pytorch import ViT
from vit_pytorch.cvt import CvT
from vit_pytorch.dino import Dino, batch_center
from vit_pytorch.es_vit import CONFIGS, VIT_CONFIGS, EsViTTrainer, es_vit, region_loss_fn, view_loss_fn
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.swin import SwinTransformer

FIXTURES = Path(__file__).parent / 'fixtures'
TINY_CVT = dict(num_classes=5, s1_emb_dim=8, s1_depth=1, s1_mlp_mult=2, s2_emb_dim=16, s2_heads=2, s2_depth=1,
                s2_mlp_mult=2, s3_emb_dim=24, s3_heads=3, s3_depth=1, s3_mlp_mult=2)
HEAD = dict(projection_hidden_size=32, num_classes_K=64, bottleneck_dim=16)


def tiny_esvit(net=None, image_size=32, **overrides):
    return EsViTTrainer(net or CvT(**TINY_CVT), image_size, **{'hidden_layer': 'layers', **HEAD, **overrides})


def read(name):
    from safetensors.torch import load_file
    return load_file(FIXTURES / f'vit_pytorch_1.26.14_es_vit_{name}.safetensors')


def region_loss_written_out(teacher_logits, student_logits, teacher_latent, student_latent, teacher_temp,
                            student_temp, centers):
    """Eq. 4, one image and one student region at a time."""
    total, count = 0., 0
    for b in range(len(student_logits)):
        for i in range(student_logits.shape[1]):
            cosines = [F.cosine_similarity(student_latent[b, i], teacher_latent[b, j], dim=0).item()
                       for j in range(teacher_logits.shape[1])]
            best = max(range(len(cosines)), key=cosines.__getitem__)
            target = ((teacher_logits[b, best] - centers) / teacher_temp).softmax(dim=-1)
            total += -(target * (student_logits[b, i] / student_temp).log_softmax(dim=-1)).sum()
            count += 1
    return total / count


# the region-level loss


def test_region_loss_is_the_cross_entropy_to_the_most_cosine_similar_teacher_region():
    generator = torch.Generator().manual_seed(0)
    teacher_logits, student_logits = torch.randn(2, 4, 6, generator=generator), torch.randn(2, 3, 6, generator=generator)
    teacher_latent, student_latent = torch.randn(2, 4, 5, generator=generator), torch.randn(2, 3, 5, generator=generator)
    centers = torch.randn(6, generator=generator)
    expected = region_loss_written_out(teacher_logits, student_logits, teacher_latent, student_latent, 0.07, 0.1,
                                       centers)
    loss = region_loss_fn(teacher_logits, student_logits, teacher_latent, student_latent, 0.07, 0.1, centers)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


def test_region_matching_is_by_cosine_not_by_dot_product():
    # teacher region 0 is long and 45 degrees off, region 1 short and aligned: the cosine picks region 1
    teacher_latent = torch.tensor([[[10., 10.], [0.1, 0.]]])
    student_latent = torch.tensor([[[1., 0.]]])
    teacher_logits = torch.tensor([[[5., 0., 0.], [0., 5., 0.]]])
    student_logits = torch.tensor([[[3., 0., -3.]]])
    loss = region_loss_fn(teacher_logits, student_logits, teacher_latent, student_latent, 1., 1., torch.zeros(3))
    cross_entropy = lambda j: -(teacher_logits[0, j].softmax(dim=-1) * student_logits[0, 0].log_softmax(dim=-1)).sum()
    torch.testing.assert_close(loss, cross_entropy(1))
    assert not torch.isclose(cross_entropy(0), cross_entropy(1))


def test_region_loss_gives_no_gradient_to_the_teacher():
    teacher_logits = torch.randn(2, 4, 6, requires_grad=True)
    student_logits = torch.randn(2, 3, 6, requires_grad=True)
    region_loss_fn(teacher_logits, student_logits, torch.randn(2, 4, 5), torch.randn(2, 3, 5), 0.04, 0.1,
                   torch.zeros(6)).backward()
    assert teacher_logits.grad is None and student_logits.grad.abs().sum() > 0



def test_region_loss_gradient_is_the_written_out_formulas():
    # the backward is written by hand (MatchedCrossEntropy gathers the target again instead of keeping it)
    generator = torch.Generator().manual_seed(1)
    teacher_logits = torch.randn(2, 4, 6, generator=generator)
    teacher_latent = torch.randn(2, 4, 5, generator=generator)
    student_latent, centers = torch.randn(2, 3, 5, generator=generator), torch.randn(6, generator=generator)
    student_logits = torch.randn(2, 3, 6, generator=generator, dtype=torch.float64).requires_grad_()
    args = (teacher_logits.double(), student_logits, teacher_latent.double(), student_latent.double(), 0.07, 0.1,
            centers.double())
    expected, = torch.autograd.grad(region_loss_written_out(*args), student_logits)
    gradient, = torch.autograd.grad(region_loss_fn(*args), student_logits)
    torch.testing.assert_close(gradient, expected, rtol=1e-12, atol=1e-15)


# the view-level term and the step's loss


def test_the_view_level_term_is_dinos_loss():
    learner = tiny_esvit()
    dino = Dino(ViT(**tiny_vit_kwargs()), image_size=(16, 24), **HEAD)
    centers = torch.randn(64)
    learner.teacher_view_centers.copy_(centers)
    dino.teacher_centers.copy_(centers)
    teacher, student = torch.randn(2, 3, 64), torch.randn(4, 3, 64)
    torch.testing.assert_close(learner.view_loss(teacher, student, teacher_temp=0.05, student_temp=0.2),
                               dino.loss(teacher, student, teacher_temp=0.05, student_temp=0.2))


def test_the_loss_is_the_mean_of_both_terms_over_every_teacher_view_and_other_student_view(monkeypatch):
    torch.manual_seed(0)
    learner = tiny_esvit(num_local_crops=1, local_image_size=16).eval()     # CvT's BatchNorms: no batch statistics
    learner.teacher_view_centers.normal_()
    learner.teacher_region_centers.normal_()
    views = [torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)], [torch.rand(2, 3, 16, 16)]
    monkeypatch.setattr(learner.crops, 'forward', lambda images: views)
    loss = learner(torch.zeros(2, 3, 32, 32))

    student = [learner.student(view) for view in views[0] + views[1]]
    teacher = [learner.teacher(view) for view in views[0]]
    pairs = [(0, 1), (0, 2), (1, 0), (1, 2)]
    temps = dict(teacher_temp=learner.teacher_temp, student_temp=learner.student_temp)
    view = sum(view_loss_fn(teacher[i][0], student[j][0], centers=learner.teacher_view_centers, **temps)
               for i, j in pairs) / 4
    region = sum(region_loss_fn(teacher[i][1], student[j][1], teacher[i][2], student[j][2],
                                centers=learner.teacher_region_centers, **temps) for i, j in pairs) / 4
    torch.testing.assert_close(loss, (view + region) / 2, rtol=1e-5, atol=1e-5)
    # and so are the gradients: forward sums the pairs per student view, keeping only what the backward needs
    parameters = [p for p in learner.student.parameters()]
    for got, expected in zip(torch.autograd.grad(loss, parameters, allow_unused=True),
                             torch.autograd.grad((view + region) / 2, parameters, allow_unused=True)):
        assert (got is None) == (expected is None)
        if got is not None:
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    # the local view's one region (16 / 16) is matched among the global views' 2x2
    assert student[2][1].shape == (2, 1, 64) and teacher[0][1].shape == (2, 4, 64)



def test_a_step_keeps_one_region_tensor_a_student_view_and_the_teachers_distributions():
    # what the backward needs of the (b, n, K) region tensors: each student view's log-probabilities, and the two
    # teacher distributions its targets are gathered from; not a target, product or logits a (teacher, student)
    # pair (at vit-pytorch's README size, 8 x 256 x 65336 floats, 535 MB, each)
    torch.manual_seed(0)
    learner = tiny_esvit()                    # 2 global and 2 local views of 32 px: 2 x 2 regions each, K = 64
    b, n, K = 3, 4, 64
    storages = {}

    def pack(t):
        if t.ndim >= 3 and t.shape[-2:] == (n, K):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = learner(torch.rand(b, 3, 32, 32))
    assert sum(storages.values()) == (4 + 2) * b * n * K * 4
    loss.backward()


# the teacher and the centres


def test_the_teacher_and_both_centres_follow_their_moving_averages():
    learner = tiny_esvit(moving_average_decay=0.7, center_moving_average_decay=0.6)
    with torch.no_grad():
        for p in learner.student.parameters():
            p.add_(torch.randn_like(p))
    teacher_before = [p.clone() for p in learner.teacher.parameters()]
    learner(torch.rand(2, 3, 32, 32))
    centers_before = learner.teacher_view_centers.clone(), learner.teacher_region_centers.clone()
    last = learner.last_teacher_view_centers.clone(), learner.last_teacher_region_centers.clone()
    learner.update_moving_average()
    for before, teacher, student in zip(teacher_before, learner.teacher.parameters(), learner.student.parameters()):
        torch.testing.assert_close(teacher, 0.7 * before + 0.3 * student)
    for before, batch, after in zip(centers_before, last, (learner.teacher_view_centers,
                                                           learner.teacher_region_centers)):
        torch.testing.assert_close(after, 0.6 * before + 0.4 * batch)


def test_the_region_centre_is_the_mean_teacher_region_output_over_images_and_regions(monkeypatch):
    learner = tiny_esvit()
    views = [torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)], []
    monkeypatch.setattr(learner.crops, 'forward', lambda images: views)
    learner(torch.zeros(2, 3, 32, 32))
    with torch.no_grad():
        regions = torch.cat([learner.teacher(view)[1] for view in views[0]])          # (2 b, n, K)
    torch.testing.assert_close(learner.last_teacher_region_centers, regions.mean(dim=(0, 1)))


def test_the_region_level_collapse_entropies_are_those_of_the_centred_sharpened_teacher_regions(monkeypatch):
    learner = tiny_esvit()
    learner.teacher_region_centers.normal_(std=0.05)                               # a centre that matters
    views = [torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)], []
    monkeypatch.setattr(learner.crops, 'forward', lambda images: views)
    learner(torch.zeros(2, 3, 32, 32), teacher_temp=0.05)
    with torch.no_grad():
        regions = torch.cat([learner.teacher(view)[1] for view in views[0]])          # (2 b, n, K)
    probs = ((regions - learner.teacher_region_centers) / 0.05).softmax(dim=-1).flatten(0, 1)   # every region
    entropy = lambda p: -torch.special.xlogy(p, p).sum(dim=-1)                     # 0 log 0 = 0
    assert learner.last_region_entropies == pytest.approx((entropy(probs).mean().item(),
                                                           entropy(probs.mean(dim=0)).item()), rel=1e-5)


# vit-pytorch's functions and trainer


def test_vit_pytorchs_losses_are_reproduced_on_unit_length_latents():
    t = read('losses')
    for index in range(2):
        temps = dict(teacher_temp=t[f'teacher_temp_{index}'].item(), student_temp=t[f'student_temp_{index}'].item(),
                     centers=t['centers'])
        torch.testing.assert_close(view_loss_fn(t['teacher_view'], t['student_view'], **temps),
                                   t[f'view_loss_{index}'], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(region_loss_fn(t['teacher_region'], t['student_region'], t['teacher_latent'],
                                                  t['student_latent'], **temps),
                                   t[f'region_loss_{index}'], rtol=1e-5, atol=1e-6)


def test_vit_pytorchs_step_loss_and_centres_on_fixed_views_are_reproduced():
    t = read('step')
    out = lambda role, view: [t[f'{role}_{view}_{part}'] for part in ('view_proj', 'region_proj', 'latent')]
    temps = dict(teacher_temp=0.04, student_temp=0.9)
    # vit-pytorch's pairing: its student sees the two local crops, its teacher the two global ones
    pairs = [(out('teacher', 'global_0'), out('student', 'local_1')),
             (out('teacher', 'global_1'), out('student', 'local_0'))]
    view = sum(view_loss_fn(teacher[0], student[0], centers=t['view_centers'], **temps)
               for teacher, student in pairs) / 2
    region = sum(region_loss_fn(teacher[1], student[1], teacher[2], student[2], centers=t['region_centers'], **temps)
                 for teacher, student in pairs) / 2
    torch.testing.assert_close((view + region) / 2, t['loss'], rtol=1e-5, atol=1e-6)

    learner = tiny_esvit(num_classes_K=16)
    learner.teacher_view_centers.copy_(t['view_centers'][0])
    learner.teacher_region_centers.copy_(t['region_centers'][0])
    teachers = [out('teacher', 'global_0'), out('teacher', 'global_1')]
    learner.last_teacher_view_centers.copy_(batch_center(torch.stack([o[0] for o in teachers])))
    learner.last_teacher_region_centers.copy_(batch_center(torch.stack([o[1] for o in teachers])))
    learner.update_moving_average()
    torch.testing.assert_close(learner.teacher_view_centers, t['view_centers_after'][0])
    torch.testing.assert_close(learner.teacher_region_centers, t['region_centers_after'][0])


def test_vit_pytorchs_trainer_checkpoint_is_refused_with_what_differs():
    state_dict = {key.removeprefix('state_dict.'): value for key, value in read('step').items()
                  if key.startswith('state_dict.')}
    learner = tiny_esvit(num_classes_K=16)
    before = {key: value.clone() for key, value in learner.state_dict().items()}
    with pytest.raises(CheckpointError, match="vit-pytorch's EsViTTrainer computes another loss than the paper's: "
                                              "its region head L2-normalises each feature across the tokens"):
        load_vit_pytorch(learner, state_dict)
    assert all(torch.equal(value, before[key]) for key, value in learner.state_dict().items())


# networks


@pytest.mark.parametrize('build, image_size, regions', [
    (lambda: CvT(**TINY_CVT), 32, 4),                                                   # the last map 2x2
    (lambda: SwinTransformer(img_size=16, patch_size=2, num_classes=5, embed_dim=8, depths=(2, 2, 2),
                             num_heads=(2, 2, 4), window_size=4), 16, 4),               # 8x8, 4x4, then 2x2
    (lambda: ViT(**tiny_vit_kwargs()), (16, 24), 12),                                   # 4x3 patches, less the cls
])
def test_the_region_tokens_are_the_last_stage_of_each_network(build, image_size, regions):
    learner = tiny_esvit(build(), image_size)
    images = torch.rand(2, 3, *((image_size,) * 2 if isinstance(image_size, int) else image_size))
    view_logits, region_logits, features = learner(images, return_embedding=True)
    assert view_logits.shape == (2, 64) and region_logits.shape == (2, regions, 64)
    assert features.shape[:2] == (2, regions)
    assert torch.isfinite(learner(images))


def test_the_view_embedding_is_the_mean_of_the_last_stage_map():
    learner = tiny_esvit().eval()
    images = torch.rand(2, 3, 32, 32)
    last_map = learner.net.forward_intermediates(images)[-1]                          # (b, c, h, w)
    view_logits, region_logits, features = learner(images, return_embedding=True)
    torch.testing.assert_close(features, last_map.flatten(2).transpose(1, 2))
    torch.testing.assert_close(view_logits, learner.student.view_head(last_map.mean(dim=(2, 3))))
    embedding, regions = learner(images, return_embedding=True, return_projection=False)
    torch.testing.assert_close(embedding, last_map.mean(dim=(2, 3)))
    torch.testing.assert_close(regions, features)


@pytest.mark.slow
def test_vit_pytorchs_readme_example_runs_one_step():
    # as written, at 64 pixels instead of 256 (the region logits at 256 are 8 x 256 x 65336 per view); 30 s on a
    # shared core: four heads of 256 x 65336 and AdamW over them
    cvt = CvT(num_classes=1000, s1_emb_dim=64, s1_emb_kernel=7, s1_emb_stride=4, s1_proj_kernel=3,
              s1_kv_proj_stride=2, s1_heads=1, s1_depth=1, s1_mlp_mult=4, s2_emb_dim=192, s2_emb_kernel=3,
              s2_emb_stride=2, s2_proj_kernel=3, s2_kv_proj_stride=2, s2_heads=3, s2_depth=2, s2_mlp_mult=4,
              s3_emb_dim=384, s3_emb_kernel=3, s3_emb_stride=2, s3_proj_kernel=3, s3_kv_proj_stride=2, s3_heads=4,
              s3_depth=10, s3_mlp_mult=4, dropout=0.)
    learner = EsViTTrainer(cvt, image_size=64, hidden_layer='layers', projection_hidden_size=256,
                           projection_layers=4, num_classes_K=65336, student_temp=0.9, teacher_temp=0.04,
                           local_upper_crop_scale=0.4, global_lower_crop_scale=0.5, moving_average_decay=0.9,
                           center_moving_average_decay=0.9)
    opt = torch.optim.AdamW(learner.parameters(), lr=3e-4)

    def sample_unlabelled_images():
        return torch.randn(8, 3, 64, 64)

    for _ in range(1):
        images = sample_unlabelled_images()
        loss = learner(images)
        opt.zero_grad()
        loss.backward()
        opt.step()
        learner.update_moving_average()
    assert math.isfinite(loss.item())


def test_the_paper_configuration_is_dinos_with_the_last_stage_as_regions():
    learner = EsViTTrainer.paper(CvT(**TINY_CVT), 32)
    assert learner.teacher_view_centers.shape == (65536,) and learner.student_temp == 0.1
    assert learner.moving_average_decay == 0.996 and learner.crops.global_scale == (0.4, 1.)


@pytest.mark.parametrize('overrides, error, match', [
    (dict(hidden_layer='to_latent'), ValueError, "hidden_layer must be 'layers'"),
    (dict(num_classes_K=0), ValueError, 'num_classes_K'),
    (dict(student_temp=0.), ValueError, 'student_temp'),
    (dict(center_moving_average_decay=1.5), ValueError, 'center_moving_average_decay'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny_esvit(**overrides)


def test_a_network_without_the_face_is_refused():
    with pytest.raises(TypeError, match='net must be a model of this package.*forward_intermediates'):
        EsViTTrainer(torch.nn.Linear(2, 2), image_size=16)


# the official code's loss (microsoft/esvit @ 2d6becd, main_esvit.py DDINOLoss; fixture written by
# tests/fixtures/make_es_vit_official_fixtures.py, run outside this repository)


def test_the_step_loss_and_centres_are_the_official_codes_on_fixed_outputs():
    # two global views of 4 regions, two local views of 2, batch 3, K = 8, float64: the same sums in another
    # order (softmaxes, log-softmaxes and means of ~100 terms of order 10), so 1e-12 relative holds with margin
    from helpers import load_fixture

    _, _, t = load_fixture('es_vit_official')
    learner = tiny_esvit(num_classes_K=8, center_moving_average_decay=0.9).double()
    learner.teacher_view_centers.copy_(t['view_center'])
    learner.teacher_region_centers.copy_(t['region_center'])
    temperatures = dict(teacher_temp=t['teacher_temp'].item(), student_temp=t['student_temp'].item())
    student = [[t[f'student_{kind}_{v}'] for v in range(4)] for kind in ('view', 'region', 'feature')]
    teacher = [[t[f'teacher_{kind}_{v}'] for v in range(2)] for kind in ('view', 'region', 'feature')]
    view = learner.view_loss(torch.stack(teacher[0]), torch.stack(student[0]), **temperatures)
    region = learner.region_loss(teacher[1], student[1], teacher[2], student[2], **temperatures)
    torch.testing.assert_close((view + region) / 2, t['loss'], rtol=1e-12, atol=0)
    # the centres' EMA, from the teacher's outputs of the step (as forward records them)
    learner.last_teacher_view_centers.copy_(batch_center(torch.stack(teacher[0])))
    learner.last_teacher_region_centers.copy_(batch_center(torch.stack(teacher[1])))
    learner.update_moving_average()
    torch.testing.assert_close(learner.teacher_view_centers, t['view_center_after'], rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(learner.teacher_region_centers, t['region_center_after'], rtol=1e-12, atol=1e-15)


# the paper's backbones, against the official code (microsoft/esvit @ 2d6becd, experiments/imagenet/swin/*.yaml
# built by models/swin_transformer.py without its classifier; counted by tests/fixtures/count_official_es_vit.py):
# yaml name -> (embed_dim, depths, num_heads, window_size of the yaml's MODEL.SPEC, the backbone's parameters)
OFFICIAL_SWIN = {
    'swin_tiny_patch4_window7_224': (96, (2, 2, 6, 2), (3, 6, 12, 24), 7, 27_519_354),
    'swin_small_patch4_window7_224': (96, (2, 2, 18, 2), (3, 6, 12, 24), 7, 48_837_258),
    'swin_base_patch4_window7_224': (128, (2, 2, 18, 2), (4, 8, 16, 32), 7, 86_743_224),
    'swin_large_patch4_window7_224': (192, (2, 2, 18, 2), (6, 12, 24, 48), 7, 194_995_476),
    'swin_tiny_patch4_window14_224': (96, (2, 2, 6, 2), (3, 6, 12, 24), 14, 27_569_754),
    'swin_small_patch4_window14_224': (96, (2, 2, 18, 2), (3, 6, 12, 24), 14, 48_968_298),
    'swin_base_patch4_window14_224': (128, (2, 2, 18, 2), (4, 8, 16, 32), 14, 86_917_944),
}


@functools.cache
def meta_es_vit(variant):
    """The named learner on the meta device (no memory, no initialisation), built once per variant."""
    with torch.device('meta'):
        return es_vit(variant, SwinTransformer if variant in CONFIGS else None)


@pytest.mark.parametrize('variant', sorted(OFFICIAL_SWIN))
def test_a_named_configuration_takes_the_official_yamls_swin(variant):
    embed_dim, depths, num_heads, window, _ = OFFICIAL_SWIN[variant]
    net = meta_es_vit(variant).student.net
    attentions = [[attention.fn for attention, _ in stage.blocks.layers] for stage in net.stages]
    assert (net.to_patch_embedding[2].out_features, net.img_size, net.mlp_head) == (embed_dim, (224, 224), None)
    assert tuple(map(len, attentions)) == depths
    assert tuple(stage[0].heads for stage in attentions) == num_heads
    # the window, clamped to the stage's map: 56, 28, 14, 7 tokens a side at 224 with patches of 4
    expected = tuple((min(window, side),) * 2 for side in (56, 28, 14, 7))
    assert tuple(stage[0].windows.window_size for stage in attentions) == expected
    assert set(CONFIGS) == set(OFFICIAL_SWIN)


@pytest.mark.parametrize('variant', sorted(OFFICIAL_SWIN))
def test_a_named_configurations_backbone_counts_the_official_codes_parameters(variant):
    learner = meta_es_vit(variant)
    assert count(learner.student.net) == OFFICIAL_SWIN[variant][-1]


def test_a_window_of_14_adds_only_the_larger_relative_position_tables():
    """W = 14 against W = 7: per block of the first three stages a table of (2 * 14 - 1)^2 rows, not 13^2, per head;
    the last stage's 7 x 7 map takes the same window either way."""
    for size in ('tiny', 'small', 'base'):
        _, depths, num_heads, _, w7 = OFFICIAL_SWIN[f'swin_{size}_patch4_window7_224']
        w14 = OFFICIAL_SWIN[f'swin_{size}_patch4_window14_224'][-1]
        rows = sum(depth * heads for depth, heads in zip(depths[:3], num_heads[:3])) * (27 ** 2 - 13 ** 2)
        assert w14 - w7 == rows
        assert count(meta_es_vit(f'swin_{size}_patch4_window14_224').student.net) \
            - count(meta_es_vit(f'swin_{size}_patch4_window7_224').student.net) == rows


def test_a_named_configuration_has_the_papers_recipe():
    learner = meta_es_vit('swin_tiny_patch4_window7_224')
    assert learner.teacher_view_centers.shape == (65536,) and learner.student_temp == 0.1
    assert learner.moving_average_decay == 0.996 and learner.crops.global_scale == (0.4, 1.)


def test_an_unknown_configuration_is_refused_by_name():
    with pytest.raises(ValueError, match="variant must be one of .*'swin_tiny_patch4_window7_224'.*got 'swin_t'"):
        es_vit('swin_t', SwinTransformer)
    with pytest.raises(TypeError, match='builds a Swin: pass swin_transformer'):
        es_vit('swin_tiny_patch4_window7_224')


# the official code's ViTs (models/vision_transformer.py by main_esvit.py's --arch and --patch_size; counted by the
# same script): arch/patch -> (embed_dim, depth, num_heads, the backbone's parameters)
OFFICIAL_VITS = {
    'deit_tiny/16': (192, 12, 3, 5_524_416), 'deit_tiny/8': (192, 12, 3, 5_526_720),
    'deit_small/16': (384, 12, 6, 21_665_664), 'deit_small/8': (384, 12, 6, 21_670_272),
    'vit_base/16': (768, 12, 12, 85_798_656), 'vit_base/8': (768, 12, 12, 85_807_872),
}


@pytest.mark.parametrize('variant', sorted(OFFICIAL_VITS))
def test_a_named_vit_takes_the_official_widths_and_counts_its_parameters(variant):
    dim, depth, heads, official = OFFICIAL_VITS[variant]
    net = meta_es_vit(variant).student.net
    patch = int(variant.split('/')[1])
    assert (net.embed_dim, len(net.transformer.layers), net.transformer.layers[0][0].heads) == (dim, depth, heads)
    assert (net.patch_size, net.image_size, net.num_classes) == ((patch, patch), (224, 224), 0)
    assert count(net) == official
    assert set(VIT_CONFIGS) == set(OFFICIAL_VITS)
