"""Distillation: vit-pytorch's calls (the token and head in DistillWrapper; fixtures written by vit-pytorch
1.26.14), the paper's DeiT (the token and head in the student; timm parity), the soft and hard losses."""

import os
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import as_tuples, digits_batch, load_fixture
from vit_pytorch import ViT
from vit_pytorch import distill
from vit_pytorch import efficient
from vit_pytorch.distill import DeiT, DistillableEfficientViT, DistillableT2TViT, DistillableViT, DistillWrapper
from vit_pytorch.pretrained import CheckpointError, load_timm, load_vit_pytorch, read_checkpoint
from vit_pytorch.t2t import T2TViT

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
    assert meta_count(lambda: DeiT(**TINY)) == plain + dim + dim + dim * classes + classes


def test_token_and_head_live_in_the_student_state_dict():
    keys = DeiT(**TINY).state_dict().keys()
    assert {'distill_token', 'distill_head.weight', 'distill_head.bias'} <= set(keys)
    assert DeiT(**TINY).pos_embedding.shape == (2 + 16, 16)


def test_training_returns_both_heads_and_eval_their_average():
    model = DeiT(**TINY)
    img = torch.randn(3, 3, 32, 32)
    logits, distill_logits = model.train()(img)
    assert not torch.allclose(logits, distill_logits)
    model.eval()
    both = model.forward_distill(img)
    torch.testing.assert_close(model(img), (both[0] + both[1]) / 2)


def test_the_distillation_token_changes_only_the_distillation_head_input():
    model = DeiT(**TINY).eval()
    img = torch.randn(2, 3, 32, 32)
    tokens = model.forward_features(img)
    torch.testing.assert_close(model.forward_distill(img)[1], model.distill_head(tokens[:, 1]))
    torch.testing.assert_close(model.forward_distill(img)[0], model.mlp_head(tokens[:, 0]))


@pytest.mark.parametrize('bad, match', [(dict(pool='mean'), "pool='cls'"), (dict(pre_logits_dim=8), 'pre_logits_dim')])
def test_student_configuration_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        DeiT(**{**TINY, **bad})


# the wrapper's losses, against the DeiT formulas written out


class FixedTeacher(nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, img):
        return self.logits * self.scale


def test_soft_distillation_loss_is_the_deit_formula():
    student = DeiT(**TINY)
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
    student = DeiT(**TINY)
    img, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    teacher_logits = torch.randn(4, 5)
    wrapper = DistillWrapper(teacher=FixedTeacher(teacher_logits), student=student, hard=True)
    logits, distill_logits = student.forward_distill(img)
    expected = 0.5 * F.cross_entropy(logits, labels) + 0.5 * F.cross_entropy(distill_logits, teacher_logits.argmax(-1))
    torch.testing.assert_close(wrapper(img, labels), expected)


def test_teacher_stays_in_eval_mode():
    teacher = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(3 * 32 * 32, 5))
    wrapper = DistillWrapper(teacher=teacher, student=DeiT(**TINY)).train()
    assert wrapper.student.training and not teacher.training


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(student='not a model'), TypeError, 'student must be a DistillableViT, DistillableT2TViT, '
                                             'DistillableEfficientViT or DeiT'),
    (dict(teacher=lambda x: x), TypeError, 'teacher must be an nn.Module'),
    (dict(temperature=0), ValueError, 'temperature'),
    (dict(hard='yes'), TypeError, 'hard'),
])
def test_wrapper_argument_errors(kwargs, error, match):
    arguments = {**dict(teacher=nn.Identity(), student=DeiT(**TINY)), **kwargs}
    with pytest.raises(error, match=match):
        DistillWrapper(**arguments)


def test_teacher_with_other_classes_is_refused():
    wrapper = DistillWrapper(teacher=FixedTeacher(torch.randn(2, 7)), student=DeiT(**TINY))
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

    student = DeiT(image_size=8, patch_size=2, channels=1, num_classes=10, dim=32, depth=1, heads=2,
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
    model = load_timm(DeiT(**TINY).eval(), os.path.join(FIXTURES, 'timm_deit_distilled.safetensors'))
    torch.testing.assert_close(model(reference['input']), reference['logits'], atol=1e-4, rtol=0)
    logits, distill_logits = model.train()(reference['input'])
    torch.testing.assert_close(logits, reference['logits_cls'], atol=1e-4, rtol=0)
    torch.testing.assert_close(distill_logits, reference['logits_dist'], atol=1e-4, rtol=0)


def test_timm_distilled_deit_resampled_on_load_to_another_resolution():
    reference = read_checkpoint(os.path.join(FIXTURES, 'timm_deit_distilled_reference.safetensors'))
    model = DeiT(**{**TINY, 'image_size': 40}).eval()
    load_timm(model, os.path.join(FIXTURES, 'timm_deit_distilled.safetensors'))   # both prefix rows kept
    torch.testing.assert_close(model(reference['input_40']), reference['logits_40'], atol=1e-4, rtol=0)


def test_plain_vit_checkpoint_into_a_student_names_what_is_missing():
    with pytest.raises(ValueError, match=r'missing keys \(3\): dist_token, head_dist\.weight, head_dist\.bias'):
        load_timm(DeiT(**TINY), os.path.join(FIXTURES, 'timm_vit.safetensors'))


def test_live_timm_distilled_deit():
    timm = pytest.importorskip('timm')
    reference_model = timm.models.deit.VisionTransformerDistilled(
        img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5).eval()
    model = load_timm(DeiT(**TINY).eval(), reference_model.state_dict())
    img = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(img), reference_model(img), atol=1e-4, rtol=0)


def test_module_docstring_example_runs():
    example = distill.__doc__.split('    import torch', 1)[1].split('\nThis file', 1)[0]
    namespace = {}
    exec(textwrap.dedent('    import torch' + example), namespace)
    assert namespace['logits'].shape == (4, 10) and type(namespace['vit']) is ViT
    assert namespace['loss'].ndim == 0 and torch.isfinite(namespace['loss'])


# vit-pytorch's calls: a plain student, the distillation token and its head in DistillWrapper
# (the fixture: tests/fixtures/make_vit_pytorch_distill_fixtures.py, run with vit-pytorch 1.26.14)

VP_TINY = dict(image_size=16, patch_size=4, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=24)


def vit_pytorch_wrapper():
    """Our DistillWrapper loaded with vit-pytorch's checkpoint, in eval mode, and the fixture's tensors."""
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_distill_wrapper')
    student = DistillableViT(**as_tuples(metadata['student'], 'image_size', 'patch_size'))
    teacher = ViT(**as_tuples(metadata['teacher'], 'image_size', 'patch_size'))
    wrapper = DistillWrapper(teacher=teacher, student=student, **metadata['wrapper'])
    return load_vit_pytorch(wrapper, state_dict).eval(), metadata, state_dict, tensors


def test_vit_pytorch_readme_distillation_calls_run_unchanged():
    # the calls of vit-pytorch's README: keyword students with dropout, any teacher, loss, to_vit
    teacher = nn.Sequential(nn.Conv2d(3, 8, 8, stride=8), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    v = DistillableViT(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=4, mlp_dim=64,
                       dropout=0.1, emb_dropout=0.1)
    distiller = DistillWrapper(student=v, teacher=teacher, temperature=3, alpha=0.5, hard=False)
    img, labels = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    loss = distiller(img, labels)
    loss.backward()
    assert loss.ndim == 0 and v.to_patch_embedding[2].weight.grad is not None
    assert distiller.distillation_token.grad is not None
    assert v(img).shape == (2, 10)                      # the logits, in training mode too
    v = v.to_vit()
    assert type(v) is ViT


def test_student_alone_returns_the_logits_in_training_mode():
    student = DistillableViT(**VP_TINY).train()
    out = student(torch.randn(2, 3, 16, 16))
    assert isinstance(out, torch.Tensor) and out.shape == (2, 5)


def test_student_state_dict_is_the_plain_vits_and_the_wrapper_holds_the_token_and_head():
    _, _, state_dict, _ = vit_pytorch_wrapper()
    ours = DistillWrapper(teacher=ViT(**{**VP_TINY, 'patch_size': 8, 'dim': 8, 'depth': 1, 'dim_head': 4,
                                         'mlp_dim': 16, 'pool': 'mean'}),
                          student=DistillableViT(**VP_TINY), mlp_layernorm=True).state_dict()
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in state_dict.items()}
    assert set(DistillableViT(**VP_TINY).state_dict()) == set(ViT(**VP_TINY).state_dict())


def test_vit_pytorch_student_checkpoint_gives_its_logits():
    _, _, state_dict, tensors = vit_pytorch_wrapper()
    student_state = {k.removeprefix('student.'): v for k, v in state_dict.items() if k.startswith('student.')}
    student = load_vit_pytorch(DistillableViT(**VP_TINY).eval(), student_state)
    with torch.no_grad():
        torch.testing.assert_close(student(tensors['input']), tensors['logits'], atol=1e-5, rtol=1e-5)


def test_vit_pytorch_wrapper_checkpoint_gives_its_tokens_logits_and_losses():
    wrapper, metadata, _, tensors = vit_pytorch_wrapper()
    img, labels = tensors['input'], tensors['labels']
    with torch.no_grad():
        pair_logits, distill_tokens = wrapper.student(img, distill_token=wrapper.distillation_token)
        got = dict(teacher_logits=wrapper.teacher(img), pair_logits=pair_logits, distill_tokens=distill_tokens,
                   distill_logits=wrapper.distill_mlp(distill_tokens), loss=wrapper(img, labels),
                   loss_call=wrapper(img, labels, **metadata['call']))
        wrapper.hard = True
        got.update(loss_hard=wrapper(img, labels), loss_hard_call=wrapper(img, labels, alpha=metadata['call']['alpha']))
    for key, value in got.items():
        torch.testing.assert_close(value, tensors[key], atol=1e-5, rtol=1e-5, msg=key)


def test_to_vit_is_a_plain_vit_with_equal_outputs():
    wrapper, _, _, tensors = vit_pytorch_wrapper()
    vit = wrapper.student.to_vit()
    assert type(vit) is ViT and not vit.training
    with torch.no_grad():
        torch.testing.assert_close(vit(tensors['input']), tensors['vit_logits'], atol=1e-5, rtol=1e-5)


def test_to_vit_copies_the_weights_rather_than_sharing_them():
    student = DistillableViT(**VP_TINY)
    vit = student.to_vit()
    with torch.no_grad():
        vit.mlp_head.bias.add_(1.0)
    assert not torch.equal(vit.mlp_head.bias, student.mlp_head.bias)


@pytest.mark.parametrize('hard', [False, True])
def test_per_call_temperature_and_alpha_are_the_formulas(hard):
    wrapper, _, _, tensors = vit_pytorch_wrapper()
    wrapper.hard = hard
    img, labels = tensors['input'], tensors['labels']
    t, alpha = 5.0, 0.8                                # neither is the wrapper's (3.0, 0.4)
    with torch.no_grad():
        logits, distilled = wrapper.student(img, distill_token=wrapper.distillation_token)
        distill_logits = wrapper.distill_mlp(distilled)
        teacher_logits = wrapper.teacher(img)
        if hard:
            distill_loss = F.cross_entropy(distill_logits, teacher_logits.argmax(-1))
        else:
            p_teacher = torch.softmax(teacher_logits / t, dim=-1)
            kl = (p_teacher * (p_teacher.log() - torch.log_softmax(distill_logits / t, dim=-1))).sum(-1).mean()
            distill_loss = t ** 2 * kl
        expected = (1 - alpha) * F.cross_entropy(logits, labels) + alpha * distill_loss
        torch.testing.assert_close(wrapper(img, labels, temperature=t, alpha=alpha), expected)
        assert not torch.allclose(wrapper(img, labels), expected)


@pytest.mark.parametrize('kwargs, match', [(dict(temperature=-1.0), 'temperature'), (dict(alpha=2), 'alpha')])
def test_per_call_arguments_are_checked(kwargs, match):
    wrapper = DistillWrapper(teacher=FixedTeacher(torch.randn(2, 5)), student=DistillableViT(**VP_TINY))
    with pytest.raises(ValueError, match=match):
        wrapper(torch.randn(2, 3, 16, 16), torch.tensor([0, 1]), **kwargs)


def test_mlp_layernorm_puts_a_layernorm_before_the_distillation_head():
    wrapper = DistillWrapper(teacher=nn.Identity(), student=DistillableViT(**VP_TINY), mlp_layernorm=True)
    assert isinstance(wrapper.distill_mlp[0], nn.LayerNorm) and isinstance(wrapper.distill_mlp[1], nn.Linear)
    plain = DistillWrapper(teacher=nn.Identity(), student=DistillableViT(**VP_TINY))
    assert isinstance(plain.distill_mlp[0], nn.Identity)


def test_mlp_layernorm_with_a_deit_student_is_refused():
    with pytest.raises(ValueError, match='mlp_layernorm=True'):
        DistillWrapper(teacher=nn.Identity(), student=DeiT(**TINY), mlp_layernorm=True)


def test_vit_pytorchs_token_is_deits_function_with_other_keys():
    # the wrapper's token, given a zero position after the cls token, and its Linear head make a DeiT
    # with the same two heads' logits: attention does not see the order of the tokens
    student = DistillableViT(**{**VP_TINY, 'patch_norm': False})
    wrapper = DistillWrapper(teacher=nn.Identity(), student=student)
    deit = DeiT(**{**VP_TINY, 'patch_norm': False})
    state = dict(student.state_dict())
    table = state['pos_embedding']
    state['pos_embedding'] = torch.cat((table[:1], torch.zeros_like(table[:1]), table[1:]))
    state.update(distill_token=wrapper.distillation_token.detach(),
                 **{f'distill_head.{k}': v for k, v in wrapper.distill_mlp[1].state_dict().items()})
    deit.load_state_dict(state)
    img = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        expected = wrapper.eval().student_logits(img)
        for ours, theirs in zip(deit.eval().forward_distill(img), expected):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_a_vit_pytorch_checkpoint_into_deit_is_refused_naming_where_the_token_lives():
    _, _, state_dict, _ = vit_pytorch_wrapper()
    with pytest.raises(CheckpointError, match=r"vit-pytorch has no DeiT: its DistillableViT is a plain ViT.*"
                                              r"live in its DistillWrapper"):
        load_vit_pytorch(DeiT(**VP_TINY), state_dict)


def test_distillable_t2t_vit_trains_in_the_wrapper_and_turns_into_a_t2t_vit():
    config = dict(image_size=16, num_classes=5, dim=16, depth=1, heads=2, dim_head=8, mlp_dim=24,
                  t2t_layers=((3, 2), (3, 2)))
    student = DistillableT2TViT(**config)
    wrapper = DistillWrapper(teacher=FixedTeacher(torch.randn(2, 5)), student=student, temperature=2.0)
    img = torch.randn(2, 3, 16, 16)
    wrapper(img, torch.tensor([0, 3])).backward()
    assert wrapper.distillation_token.grad.abs().sum() > 0 and student.cls_token.grad is not None
    t2t = student.to_vit()
    assert type(t2t) is T2TViT
    with torch.no_grad():
        torch.testing.assert_close(t2t.eval()(img), student.eval()(img))


def test_distill_token_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r'distill_token must be a tensor of shape \(1, 16\), got \(2, 16\)'):
        DistillableViT(**VP_TINY)(torch.randn(1, 3, 16, 16), distill_token=torch.randn(2, 16))


def efficient_backbone():
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))


def test_vit_pytorch_efficient_checkpoint_loads_into_the_distillable_efficient_vit():
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_efficient')
    student = DistillableEfficientViT(**metadata['config'], transformer=efficient_backbone())
    load_vit_pytorch(student.eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(student(tensors['input']), tensors['output'], atol=1e-5, rtol=1e-5)
        plain = student.to_vit()
        assert type(plain) is efficient.ViT and plain.transformer is not student.transformer
        torch.testing.assert_close(plain(tensors['input']), tensors['output'], atol=1e-5, rtol=1e-5)


def test_distillable_efficient_vit_trains_in_the_wrapper():
    student = DistillableEfficientViT(image_size=16, patch_size=4, num_classes=5, dim=16,
                                      transformer=efficient_backbone())
    wrapper = DistillWrapper(teacher=FixedTeacher(torch.randn(2, 5)), student=student, mlp_layernorm=True)
    wrapper(torch.randn(2, 3, 16, 16), torch.tensor([1, 2])).backward()
    assert wrapper.distillation_token.grad.abs().sum() > 0 and student.cls_token.grad.abs().sum() > 0


TINY_COMPAT = dict(image_size=(16, 24), patch_size=(4, 8), num_classes=5, dim=16, depth=2, heads=2, dim_head=8,
                   mlp_dim=32)


def test_a_state_dict_of_our_old_distillable_vit_is_told_to_load_into_deit():
    # compat_distill: this package's DistillableViT (the DeiT student, before issue 25), as saved then
    tensors = read_checkpoint(os.path.join(FIXTURES, 'compat_distill.safetensors'))
    img, expected = tensors.pop('compat:input'), tensors.pop('compat:output')
    with pytest.raises(ValueError, match=r'has distill_token: it is a DeiT.*load it into vit_pytorch\.deit\.DeiT'):
        DistillableViT(**TINY_COMPAT).load_state_dict(tensors)
    model = DeiT(**TINY_COMPAT).eval()
    model.load_state_dict(tensors)
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-4, atol=1e-5)


def test_distill_re_exports_the_papers_deit_and_its_constructors_as_the_same_objects():
    from vit_pytorch import deit
    assert distill.DeiT is deit.DeiT
    for name in ('deit_tiny_distilled_patch16_224', 'deit_small_distilled_patch16_224',
                 'deit_base_distilled_patch16_224', 'deit_base_distilled_patch16_384'):
        assert getattr(distill, name) is getattr(deit, name), name
