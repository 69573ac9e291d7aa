"""DeiT distillation: the student's distillation token and head, the soft and hard losses, timm parity."""

import os
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import digits_batch
from vit_pytorch import ViT
from vit_pytorch import distill
from vit_pytorch.distill import DistillableViT, DistillWrapper
from vit_pytorch.pretrained import load_timm, read_checkpoint

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures')
TINY = dict(image_size=32, patch_size=8, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, num_classes=5,
            patch_norm=False, qkv_bias=True, norm_eps=1e-6)


def meta_count(build):
    with torch.device('meta'):
        model = build()
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize('build, count', [
    (distill.deit_tiny_distilled_patch16_224, 5_910_800),
    (distill.deit_small_distilled_patch16_224, 22_436_432),
    (distill.deit_base_distilled_patch16_224, 87_338_192),   # timm and HF DeiTForImageClassificationWithTeacher
])
def test_deit_distilled_parameter_counts(build, count):
    assert meta_count(build) == count


def test_distillation_adds_a_token_a_position_and_a_head_to_the_vit():
    plain = meta_count(lambda: ViT(**TINY))
    dim, classes = TINY['dim'], TINY['num_classes']
    assert meta_count(lambda: DistillableViT(**TINY)) == plain + dim + dim + dim * classes + classes


def test_token_and_head_live_in_the_student_state_dict():
    keys = DistillableViT(**TINY).state_dict().keys()
    assert {'distill_token', 'distill_head.weight', 'distill_head.bias'} <= set(keys)
    assert DistillableViT(**TINY).pos_embedding.shape == (2 + 16, 16)


def test_training_returns_both_heads_and_eval_their_average():
    model = DistillableViT(**TINY)
    img = torch.randn(3, 3, 32, 32)
    logits, distill_logits = model.train()(img)
    assert logits.shape == distill_logits.shape == (3, 5)
    assert not torch.allclose(logits, distill_logits)
    model.eval()
    both = model.forward_distill(img)
    torch.testing.assert_close(model(img), (both[0] + both[1]) / 2)


def test_the_distillation_token_changes_only_the_distillation_head_input():
    model = DistillableViT(**TINY).eval()
    img = torch.randn(2, 3, 32, 32)
    tokens = model.forward_features(img)
    torch.testing.assert_close(model.forward_distill(img)[1], model.distill_head(tokens[:, 1]))
    torch.testing.assert_close(model.forward_distill(img)[0], model.mlp_head(tokens[:, 0]))


def test_reset_classifier_zeroes_both_heads():
    model = DistillableViT(**TINY)
    model.reset_classifier(3)
    for head in (model.mlp_head, model.distill_head):
        assert head.out_features == 3 and head.weight.abs().sum() == 0 and head.bias.abs().sum() == 0


def test_headless_student_returns_tokens():
    model = DistillableViT(**{**TINY, 'num_classes': 0}).eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 18, 16)


@pytest.mark.parametrize('bad, match', [(dict(pool='mean'), "pool='cls'"), (dict(pre_logits_dim=8), 'pre_logits_dim')])
def test_student_configuration_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        DistillableViT(**{**TINY, **bad})


# the wrapper's losses, against the DeiT formulas written out


class FixedTeacher(nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, img):
        return self.logits * self.scale


def test_soft_distillation_loss_is_the_deit_formula():
    student = DistillableViT(**TINY)
    img, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    teacher_logits = torch.randn(4, 5)
    t, alpha = 3.0, 0.3
    wrapper = DistillWrapper(teacher=FixedTeacher(teacher_logits), student=student, temperature=t, alpha=alpha)
    logits, distill_logits = student.forward_distill(img)
    p_teacher = torch.softmax(teacher_logits / t, dim=-1)
    kl = (p_teacher * (p_teacher.log() - torch.log_softmax(distill_logits / t, dim=-1))).sum(-1).mean()
    expected = (1 - alpha) * F.cross_entropy(logits, labels) + alpha * t ** 2 * kl
    torch.testing.assert_close(wrapper(img, labels), expected)


def test_hard_distillation_loss_is_the_deit_formula():
    student = DistillableViT(**TINY)
    img, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    teacher_logits = torch.randn(4, 5)
    wrapper = DistillWrapper(teacher=FixedTeacher(teacher_logits), student=student, hard=True)
    logits, distill_logits = student.forward_distill(img)
    expected = 0.5 * F.cross_entropy(logits, labels) + 0.5 * F.cross_entropy(distill_logits, teacher_logits.argmax(-1))
    torch.testing.assert_close(wrapper(img, labels), expected)


def test_student_gets_every_gradient_and_the_teacher_none():
    student = DistillableViT(**TINY)
    teacher = FixedTeacher(torch.randn(2, 5))
    wrapper = DistillWrapper(teacher=teacher, student=student, temperature=2.0)
    wrapper(torch.randn(2, 3, 32, 32), torch.tensor([1, 4])).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    assert teacher.scale.grad is None and not teacher.scale.requires_grad


def test_teacher_stays_in_eval_mode():
    teacher = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(3 * 32 * 32, 5))
    wrapper = DistillWrapper(teacher=teacher, student=DistillableViT(**TINY)).train()
    assert wrapper.student.training and not teacher.training


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(student='not a model'), TypeError, 'student must be a DistillableViT'),
    (dict(teacher=lambda x: x), TypeError, 'teacher must be an nn.Module'),
    (dict(temperature=0), ValueError, 'temperature'),
    (dict(alpha=1.5), ValueError, 'alpha'),
    (dict(hard='yes'), TypeError, 'hard'),
])
def test_wrapper_argument_errors(kwargs, error, match):
    arguments = {**dict(teacher=nn.Identity(), student=DistillableViT(**TINY)), **kwargs}
    with pytest.raises(error, match=match):
        DistillWrapper(**arguments)


def test_teacher_with_other_classes_is_refused():
    wrapper = DistillWrapper(teacher=FixedTeacher(torch.randn(2, 7)), student=DistillableViT(**TINY))
    with pytest.raises(ValueError, match='share the classes'):
        wrapper(torch.randn(2, 3, 32, 32), torch.tensor([0, 1]))


def test_hard_distillation_learns_real_digits():
    images, labels = digits_batch(32)
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(teacher.parameters(), lr=0.1)
    for _ in range(30):
        optimizer.zero_grad()
        F.cross_entropy(teacher(images), labels).backward()
        optimizer.step()
    assert (teacher(images).argmax(-1) == labels).all()

    student = DistillableViT(image_size=8, patch_size=2, channels=1, num_classes=10, dim=32, depth=1, heads=2,
                             dim_head=16, mlp_dim=64)
    wrapper = DistillWrapper(teacher=teacher, student=student, hard=True)
    optimizer = torch.optim.Adam(student.parameters(), lr=3e-3)
    for _ in range(80):
        optimizer.zero_grad()
        wrapper(images, labels).backward()
        optimizer.step()
    student.eval()
    with torch.no_grad():
        assert (student(images).argmax(-1) == labels).float().mean() == 1
        assert (student.forward_distill(images)[1].argmax(-1) == teacher(images).argmax(-1)).all()


# timm's deit_*_distilled_* checkpoints


def test_timm_distilled_deit_fixture_logits():
    reference = read_checkpoint(os.path.join(FIXTURES, 'timm_deit_distilled_reference.safetensors'))
    model = load_timm(DistillableViT(**TINY).eval(), os.path.join(FIXTURES, 'timm_deit_distilled.safetensors'))
    torch.testing.assert_close(model(reference['input']), reference['logits'], atol=1e-4, rtol=0)
    logits, distill_logits = model.train()(reference['input'])
    torch.testing.assert_close(logits, reference['logits_cls'], atol=1e-4, rtol=0)
    torch.testing.assert_close(distill_logits, reference['logits_dist'], atol=1e-4, rtol=0)


def test_timm_distilled_deit_resampled_on_load_to_another_resolution():
    reference = read_checkpoint(os.path.join(FIXTURES, 'timm_deit_distilled_reference.safetensors'))
    model = DistillableViT(**{**TINY, 'image_size': 40}).eval()
    load_timm(model, os.path.join(FIXTURES, 'timm_deit_distilled.safetensors'))   # both prefix rows kept
    torch.testing.assert_close(model(reference['input_40']), reference['logits_40'], atol=1e-4, rtol=0)


def test_plain_vit_checkpoint_into_a_student_names_what_is_missing():
    with pytest.raises(ValueError, match=r'missing keys \(3\): dist_token, head_dist\.weight, head_dist\.bias'):
        load_timm(DistillableViT(**TINY), os.path.join(FIXTURES, 'timm_vit.safetensors'))


def test_live_timm_distilled_deit():
    timm = pytest.importorskip('timm')
    reference_model = timm.models.deit.VisionTransformerDistilled(
        img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5).eval()
    model = load_timm(DistillableViT(**TINY).eval(), reference_model.state_dict())
    img = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(img), reference_model(img), atol=1e-4, rtol=0)


def test_module_docstring_example_runs():
    example = distill.__doc__.split('    import torch', 1)[1].split('\nThis file', 1)[0]
    namespace = {}
    exec(textwrap.dedent('    import torch' + example), namespace)
    assert namespace['logits'].shape == (4, 10)
    assert namespace['loss'].ndim == 0 and torch.isfinite(namespace['loss'])
