"""DINO (arXiv 2104.14294): the teacher has no gradient and follows the EMA formula, centring and sharpening,
the loss over views, the multi-crop augmentations, every model of the package, vit-pytorch's README example."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import digits_batch, tiny_vit_kwargs
from vit_pytorch import SimpleViT, ViT
from vit_pytorch.cait import CaiT
from vit_pytorch.swin import SwinTransformer
from vit_pytorch.dino import (Dino, MultiCrop, collapse_entropies, color_jitter, gaussian_blur, random_grayscale,
                              random_resized_crop, random_solarize, rotate_hue)


def tiny_dino(net=None, **overrides):
    kwargs = dict(image_size=(16, 24), projection_hidden_size=32, num_classes_K=64, bottleneck_dim=16)
    return Dino(net or ViT(**tiny_vit_kwargs()), **{**kwargs, **overrides})


def step(learner, images, optimizer):
    loss = learner(images)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    learner.update_moving_average()
    return loss


# the teacher


def test_the_teacher_follows_the_students_exponential_moving_average_exactly():
    learner = tiny_dino(moving_average_decay=0.9)
    optimizer = torch.optim.AdamW(learner.parameters(), lr=1e-2)
    teacher_before = [p.clone() for p in learner.teacher.parameters()]
    step(learner, torch.rand(4, 3, 16, 24), optimizer)
    for old, new, student in zip(teacher_before, learner.teacher.parameters(), learner.student.parameters()):
        torch.testing.assert_close(new, 0.9 * old + 0.1 * student.detach(), atol=1e-9, rtol=1e-6)
    # another decay for one call (the paper raises it to 1 over training)
    before = [p.clone() for p in learner.teacher.parameters()]
    learner.update_moving_average(decay=0.5)
    for old, new, student in zip(before, learner.teacher.parameters(), learner.student.parameters()):
        torch.testing.assert_close(new, 0.5 * old + 0.5 * student, atol=1e-9, rtol=1e-6)


def test_cancelled_last_layer_gradients_leave_only_that_layer_unchanged_by_a_step():
    learner = tiny_dino()
    optimizer = torch.optim.AdamW(learner.parameters(), lr=1e-2, weight_decay=0.1)
    before = {name: p.clone() for name, p in learner.student.named_parameters()}
    loss = learner(torch.rand(4, 3, 16, 24))
    optimizer.zero_grad()
    loss.backward()
    learner.cancel_last_layer_gradients()
    optimizer.step()
    changed = {name for name, p in learner.student.named_parameters() if not torch.equal(p, before[name])}
    assert 'head.last_layer.weight' not in changed          # not even weight decay moved it
    assert {'head.mlp.0.weight', 'net.cls_token'} <= changed


def test_collapse_entropies_tell_uniform_from_one_output_from_healthy():
    k = 8
    uniform = torch.full((2, 4, k), 1 / k)
    assert collapse_entropies(uniform) == pytest.approx((math.log(k), math.log(k)))
    same_one = torch.zeros(2, 4, k)
    same_one[..., 3] = 1
    assert collapse_entropies(same_one) == pytest.approx((0, 0), abs=1e-6)
    healthy = torch.eye(k).expand(2, k, k)              # confident, and each image its own output
    assert collapse_entropies(healthy) == pytest.approx((0, math.log(k)), abs=1e-6)


def test_each_loss_records_the_entropies_of_its_centred_sharpened_teacher():
    learner = tiny_dino(teacher_temp=0.05)
    learner.teacher_centers.normal_()
    teacher, student = torch.randn(2, 3, 64), torch.randn(4, 3, 64)
    learner.loss(teacher, student)
    probs = ((teacher - learner.teacher_centers) / 0.05).softmax(-1).flatten(0, 1)
    entropy = lambda p: -torch.special.xlogy(p, p).sum(-1)
    assert learner.last_entropies == pytest.approx((entropy(probs).mean().item(), entropy(probs.mean(0)).item()),
                                                   rel=1e-5)


def test_the_teacher_starts_as_a_copy_of_the_student_and_stays_in_eval_mode():
    learner = tiny_dino().train()
    assert all(torch.equal(t, s) for t, s in zip(learner.teacher.parameters(), learner.student.parameters()))
    assert not learner.teacher.training and learner.student.training
    assert learner.net is learner.student.net


# centring and sharpening


def explicit_loss(teacher, student, center, teacher_temp, student_temp):
    total, count = 0., 0
    for i in range(teacher.shape[0]):
        p = torch.exp((teacher[i] - center) / teacher_temp)
        p = p / p.sum(-1, keepdim=True)
        for j in range(student.shape[0]):
            if i != j:
                log_q = student[j] / student_temp - torch.logsumexp(student[j] / student_temp, -1, keepdim=True)
                total, count = total - (p * log_q).sum(-1).mean(), count + 1
    return total / count


def test_the_loss_is_the_cross_entropy_over_every_pair_of_different_views():
    learner = tiny_dino(student_temp=0.1)
    learner.teacher_centers.copy_(0.1 * torch.randn(64))
    teacher, student = torch.rand(2, 5, 64) * 2 - 1, torch.rand(4, 5, 64) * 2 - 1    # cosines, as the head gives
    torch.testing.assert_close(learner.loss(teacher, student),
                               explicit_loss(teacher, student, learner.teacher_centers, 0.04, 0.1))
    torch.testing.assert_close(learner.loss(teacher, student, teacher_temp=0.07, student_temp=0.2),
                               explicit_loss(teacher, student, learner.teacher_centers, 0.07, 0.2))


def test_centring_removes_what_every_teacher_output_shares():
    learner = tiny_dino()
    teacher, student = torch.randn(2, 5, 64), torch.randn(4, 5, 64)
    shared = 5 * torch.randn(64)
    learner.teacher_centers.copy_(shared)
    centred = learner.loss(teacher + shared, student)
    learner.teacher_centers.zero_()
    torch.testing.assert_close(centred, learner.loss(teacher, student))
    assert not torch.allclose(learner.loss(teacher + shared, student), centred)


def test_sharpening_lowers_the_entropy_of_the_teachers_distribution():
    teacher = torch.rand(2, 5, 64) * 2 - 1

    def entropy(temp):
        return torch.special.entr((teacher / temp).softmax(-1)).sum(-1).mean()

    learner = tiny_dino()
    student = torch.zeros(4, 5, 64)       # uniform student: the loss is the teacher's total mass x log K
    torch.testing.assert_close(learner.loss(teacher, student), torch.tensor(math.log(64)))
    assert entropy(0.04) < entropy(0.1) < entropy(1.0)


def test_the_centre_follows_the_mean_teacher_output():
    learner = tiny_dino(center_moving_average_decay=0.8)
    learner.teacher_centers.copy_(torch.randn(64))
    old_center = learner.teacher_centers.clone()
    images = torch.rand(4, 3, 16, 24)
    torch.manual_seed(3)
    learner(images)
    torch.manual_seed(3)
    global_views, _ = learner.crops(images)
    with torch.no_grad():
        batch_mean = learner.teacher(torch.cat(global_views))[0].mean(0)
    torch.testing.assert_close(learner.last_teacher_centers, batch_mean)
    learner.update_moving_average()
    torch.testing.assert_close(learner.teacher_centers, 0.8 * old_center + 0.2 * batch_mean)


def test_the_projection_head_ends_in_a_weight_normalised_layer_on_unit_vectors():
    learner = tiny_dino()
    head = learner.student.head
    with torch.no_grad():
        head.last_layer.weight.mul_(torch.rand(64, 1) * 10)                 # row norms do not matter
        logits = head(torch.randn(5, 32))
    assert logits.abs().max() <= 1 + 1e-6                                    # cosines of unit vectors
    assert sum(isinstance(m, torch.nn.Linear) for m in head.mlp) == 3        # the paper's 3-layer MLP



def test_a_learned_last_layer_norm_scales_each_unit_row_by_its_gain_from_one():
    # the paper's code's --norm_last_layer false: W = g v / |v| per row, g starting at 1 and learned
    learner = tiny_dino(norm_last_layer=False)
    head = learner.student.head
    x = torch.randn(5, 32)
    with torch.no_grad():
        bottleneck = F.normalize(head.mlp(x), dim=-1)
        unit_rows = head.last_layer.weight / head.last_layer.weight.norm(dim=-1, keepdim=True)
        torch.testing.assert_close(head(x), bottleneck @ unit_rows.T)              # g = 1 at the start
        gain = torch.linspace(0.5, 20, 64)
        head.last_layer.gain.copy_(gain)
        torch.testing.assert_close(head(x), bottleneck @ unit_rows.T * gain)
    assert head(x).abs().max() > 1                        # no longer cosines: the logits may outgrow [-1, 1]
    # the freeze of the first epochs holds the gain too (the paper's code cancels every last_layer parameter)
    learner(torch.rand(4, 3, 16, 24)).backward()
    assert head.last_layer.gain.grad is not None
    learner.cancel_last_layer_gradients()
    assert head.last_layer.gain.grad is None
    # by default the rows stay unit (vit-pytorch's head has no gain): the same parameters as before the option
    assert 'head.last_layer.gain' not in dict(tiny_dino().student.named_parameters())


def test_the_head_keeps_no_rows_by_outputs_product_for_many_rows_and_computes_the_same_function():
    # EsViT's region head sees b x n rows: the (rows, K) product divided by the weight's row norms would be kept for
    # the division's backward, so with more rows than the bottleneck's width the weight is normalised instead
    from vit_pytorch.dino import ProjectionHead

    torch.manual_seed(0)
    head = ProjectionHead(8, 64, 16, 4, 2)
    with torch.no_grad():
        head.last_layer.weight.mul_(torch.rand(64, 1) * 10)
    x = torch.randn(3, 40, 8)                                                # 120 rows > 4
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        many = head(x)
    assert not [shape for shape in saved if shape.numel() >= 120 * 64], saved
    unit = F.normalize(head.last_layer.weight, dim=-1)
    torch.testing.assert_close(many, F.normalize(head.mlp(x), dim=-1) @ unit.T)
    torch.testing.assert_close(torch.cat([head(x[b, :2]) for b in range(3)]), many[:, :2].flatten(0, 1))


def test_the_head_without_autograd_gives_the_same_logits_to_the_bit():
    # without a graph (inference, the teacher) the product is divided by the row norms in place: the same quotient
    from vit_pytorch.dino import ProjectionHead

    torch.manual_seed(0)
    head = ProjectionHead(8, 64, 16, 4, 2)
    with torch.no_grad():
        head.last_layer.weight.mul_(torch.rand(64, 1) * 10)
    x = torch.randn(2, 2, 8)                                                 # 4 rows <= 4: the division
    expected = F.normalize(head.mlp(x), dim=-1) @ head.last_layer.weight.T / head.last_layer.weight.norm(dim=-1)
    recorded = head(x)
    assert recorded.grad_fn is not None
    with torch.no_grad():
        plain = head(x)
    with torch.inference_mode():
        inference = head(x)
    frozen = copy.deepcopy(head).requires_grad_(False)
    for logits in (plain, inference, frozen(x)):
        torch.testing.assert_close(logits, recorded, atol=0, rtol=0)
    torch.testing.assert_close(recorded, expected)


# views


def test_every_view_is_seen_by_the_student_and_the_global_ones_by_the_teacher():
    learner = tiny_dino(SimpleViT(**tiny_vit_kwargs()), num_local_crops=3, local_image_size=(8, 8))
    sizes = {'student': [], 'teacher': []}
    learner.student.register_forward_pre_hook(lambda m, args: sizes['student'].append(tuple(args[0].shape)))
    learner.teacher.register_forward_pre_hook(lambda m, args: sizes['teacher'].append(tuple(args[0].shape)))
    learner(torch.rand(4, 3, 16, 24))
    assert sizes == {'student': [(8, 3, 16, 24), (12, 3, 8, 8)], 'teacher': [(8, 3, 16, 24)]}


def test_a_crop_of_the_whole_image_without_flip_is_the_image():
    images = torch.rand(3, 3, 16, 24)
    same = random_resized_crop(images, (16, 24), scale=(1., 1.), ratio=(1.5, 1.5), flip_p=0.)
    torch.testing.assert_close(same, images)
    flipped = random_resized_crop(images, (16, 24), scale=(1., 1.), ratio=(1.5, 1.5), flip_p=1.)
    torch.testing.assert_close(flipped, images.flip(-1))


def test_a_crop_covers_the_drawn_fraction_of_the_image():
    # a ramp from 0 to 1 across the width: a square crop of a quarter of a square image spans half of the ramp
    ramp = torch.linspace(0, 1, 64).expand(200, 1, 64, 64)
    crops = random_resized_crop(ramp, (32, 32), scale=(0.25, 0.25), ratio=(1., 1.), flip_p=0.)
    span = crops[..., -1].mean((-1, -2)) - crops[..., 0].mean((-1, -2))
    # the outer output columns sample 31 input pixels apart (half of 62), 1/63 of the ramp each
    torch.testing.assert_close(span, torch.full((200,), 31 / 63), atol=1e-4, rtol=0)
    assert crops[:, 0, 0, 0].std() > 0.1                                     # at random places


def test_hue_rotation_turns_colours_about_the_gray_axis():
    img = torch.rand(2, 3, 4, 4)
    third = torch.full((2,), 2 * math.pi / 3)
    torch.testing.assert_close(rotate_hue(img, third), img.roll(1, dims=1), atol=1e-5, rtol=0)   # R->G->B->R
    gray = torch.full((2, 3, 4, 4), 0.4)
    torch.testing.assert_close(rotate_hue(gray, torch.tensor([0.3, 1.0])), gray)


def test_photometric_augmentations():
    img = torch.rand(64, 3, 16, 16)
    assert torch.equal(color_jitter(img, p=0., brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1), img)
    jittered = color_jitter(img, p=1., brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)
    assert jittered.min() >= 0 and jittered.max() <= 1 and not torch.allclose(jittered, img)
    gray = random_grayscale(img, p=1.)
    assert torch.equal(gray[:, 0], gray[:, 1]) and torch.equal(gray[:, 1], gray[:, 2])
    torch.testing.assert_close(gray[:, 0], 0.299 * img[:, 0] + 0.587 * img[:, 1] + 0.114 * img[:, 2])
    solarized = random_solarize(img, p=1.)
    torch.testing.assert_close(solarized, torch.where(img >= 0.5, 1 - img, img))
    blurred = gaussian_blur(img, p=1., sigma=(1., 1.))
    assert blurred.var() < 0.5 * img.var()
    torch.testing.assert_close(blurred.mean(), img.mean(), atol=0.01, rtol=0)
    assert torch.equal(gaussian_blur(img, p=0., sigma=(1., 1.)), img)


def test_multi_crop_views_and_the_custom_augmentations():
    crops = MultiCrop(image_size=(16, 24), local_image_size=(8, 8), global_scale=(0.4, 1.), local_scale=(0.05, 0.4),
                      num_local_crops=3, augment_fn=lambda x: x * 0, augment_fn2=lambda x: x * 0 + 1)
    global_views, local_views = crops(torch.rand(4, 1, 32, 32))
    assert [v.shape for v in global_views] == [(4, 1, 16, 24)] * 2
    assert [v.shape for v in local_views] == [(4, 1, 8, 8)] * 3
    assert global_views[0].abs().max() == 0 and global_views[1].min() == 1 and local_views[0].abs().max() == 0


# every model


@pytest.mark.parametrize('build', [
    lambda: ViT(**tiny_vit_kwargs()),
    lambda: ViT(**tiny_vit_kwargs(pre_logits_dim=24)),
    lambda: SimpleViT(**tiny_vit_kwargs()),
    lambda: CaiT(**tiny_vit_kwargs(cls_depth=1)),
], ids=['vit', 'vit_pre_logits', 'simple_vit', 'cait'])
def test_trains_every_model_of_the_package(build):
    learner = tiny_dino(build())
    step(learner, torch.rand(2, 3, 16, 24), torch.optim.AdamW(learner.parameters(), lr=1e-3))
    embedding = learner(torch.rand(2, 3, 16, 24), return_embedding=True, return_projection=False)
    assert embedding.shape == (2, learner.student.head.mlp[0].in_features)


def test_trains_swin_which_names_its_channels_in_chans():
    """Swin (timm's face) has `in_chans`, not `channels`: DINO reads it, probes with that many channels, trains."""
    net = SwinTransformer(img_size=16, patch_size=2, in_chans=1, num_classes=10, embed_dim=16, depths=(1, 1),
                          num_heads=(2, 4), window_size=4)
    assert not hasattr(net, 'channels')
    learner = tiny_dino(net, image_size=16)
    step(learner, torch.rand(2, 1, 16, 16), torch.optim.AdamW(learner.parameters(), lr=1e-3))
    embedding = learner(torch.rand(2, 1, 16, 16), return_embedding=True, return_projection=False)
    assert embedding.shape == (2, 32) == (2, learner.student.head.mlp[0].in_features)   # 16 doubled by 1 merge


def test_the_student_learns_to_match_a_fixed_teacher_on_digits():
    images, _ = digits_batch(64, size=16)
    net = ViT(image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, heads=2, dim_head=16, mlp_dim=64,
              channels=1, patch_norm=False)
    # decays of 1 keep the teacher and the centre fixed: the student distils a fixed target
    learner = tiny_dino(net, image_size=16, moving_average_decay=1., center_moving_average_decay=1.)
    optimizer = torch.optim.AdamW(learner.parameters(), lr=3e-3)
    torch.manual_seed(5)
    with torch.no_grad():
        before = learner(images).item()
    for _ in range(25):
        step(learner, images, optimizer)
    torch.manual_seed(5)
    with torch.no_grad():
        assert learner(images).item() < before - 0.5


def test_vit_pytorchs_readme_example_runs_one_step():
    # as written, at 64 pixels instead of 256 (one step at 256 takes 20-30 s on two cores)
    from vit_pytorch import Dino, ViT

    model = ViT(image_size=64, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=8, mlp_dim=2048)
    learner = Dino(model, image_size=64, hidden_layer='to_latent', projection_hidden_size=256, projection_layers=4,
                   num_classes_K=65536, student_temp=0.9, teacher_temp=0.04, local_upper_crop_scale=0.4,
                   global_lower_crop_scale=0.5, moving_average_decay=0.9, center_moving_average_decay=0.9)
    opt = torch.optim.Adam(learner.parameters(), lr=3e-4)

    def sample_unlabelled_images():
        return torch.randn(20, 3, 64, 64)

    for _ in range(1):
        images = sample_unlabelled_images()
        loss = learner(images)
        opt.zero_grad()
        loss.backward()
        opt.step()
        learner.update_moving_average()
    assert torch.isfinite(loss)


@pytest.mark.parametrize('overrides, error, match', [
    (dict(hidden_layer='transformer'), ValueError, 'hidden_layer'),
    (dict(student_temp=0.), ValueError, 'student_temp'),
    (dict(local_upper_crop_scale=0.01), ValueError, 'local_upper_crop_scale'),
    (dict(global_lower_crop_scale=0.), ValueError, 'global_lower_crop_scale'),
    (dict(augment_fn=3), TypeError, 'augment_fn'),
    (dict(norm_last_layer='false'), TypeError, 'norm_last_layer'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny_dino(**overrides)


def test_a_network_without_the_face_is_refused():
    with pytest.raises(TypeError, match='net must be a model of this package.*forward_features'):
        Dino(torch.nn.Linear(2, 2), image_size=16)
