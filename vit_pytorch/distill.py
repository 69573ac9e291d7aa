"""DeiT distillation: a student learns from labels and from a teacher through a distillation token.

"Training data-efficient image transformers & distillation through attention", Touvron et al.,
arXiv 2012.12877: besides the cls token, the student carries a second learned token that goes
through the same Transformer, attending with the patch tokens; a second head on its output is
trained to match the teacher (soft: KL to the teacher's softened distribution; hard:
cross-entropy to the teacher's argmax) while the cls head learns the true labels.

Two homes for that token, the same function:
  vit-pytorch's classes (`DistillableViT`, `DistillableT2TViT`, `DistillableEfficientViT`, its calls
    and state_dict keys): the student is a plain ViT, T2T-ViT or efficient ViT; `DistillWrapper` holds
    the distillation token and its head (`distillation_token`, `distill_mlp`) and passes the token
    into the student's Transformer
    (`student(img, distill_token=...)`). `student(img)` returns the cls head's logits in any mode,
    and `student.to_vit()` gives the plain model with the same weights and outputs. vit-pytorch
    1.26.14's checkpoints of both load with `load_vit_pytorch` and give its outputs.
  `DeiT` (`vit_pytorch.deit`, re-exported here with its named constructors; the paper, timm's
    `VisionTransformerDistilled`, Hugging Face's `DeiTForImageClassificationWithTeacher`): the token and its head live in the student, which
    returns both heads' logits in training and their average in eval mode, as the paper predicts
    at test time. The named constructors `deit_*_distilled_*` build it; timm's and Hugging
    Face's distilled checkpoints load into it. `DistillWrapper` takes it as a student too.

Where the two differ, and which is DeiT's: vit-pytorch's token joins after the patches without a
position embedding, DeiT's after the cls token with one. Attention does not see the order, and a
learned token plus its learned position is one learned vector, so both compute the same function;
the keys differ, and a vit-pytorch wrapper's `distill_mlp` may carry a LayerNorm
(`mlp_layernorm=True`) that DeiT's head has not. vit-pytorch's student alone answers with the cls
head only; DeiT averages both heads at inference.

What differs from vit-pytorch 1.26.14, and why:
  - The teacher is kept in eval mode and frozen (DeiT's teacher is a fixed pretrained network);
    vit-pytorch's follows the wrapper's train(), so a teacher's BatchNorm statistics drift with
    the student's batches and its dropout perturbs the targets.
  - `DistillableT2TViT` is our T2T-ViT (the paper's; see `vit_pytorch.t2t`). vit-pytorch 1.26.14's
    `DistillableT2TViT` and `DistillableEfficientViT` fail in every forward call (their cls token
    has three dimensions where the distillation code repeats two); ours run.
  - Bad arguments are ValueError / TypeError naming the value, not an assert.

    import torch
    from torch import nn
    from vit_pytorch.distill import DeiT, DistillableViT, DistillWrapper

    student = DistillableViT(image_size=32, patch_size=8, num_classes=10, dim=64,
                             depth=2, heads=4, mlp_dim=128)
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))   # any nn.Module
    wrapper = DistillWrapper(teacher=teacher, student=student, temperature=3.0, alpha=0.5)

    img, labels = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    loss = wrapper(img, labels)                    # per call: wrapper(img, labels, temperature=2.0, alpha=0.3)
    loss.backward()

    vit = student.to_vit()                         # a plain vit_pytorch.ViT with the trained weights
    logits = vit.eval()(img)                       # (4, 10)

    deit = DeiT(image_size=32, patch_size=8, num_classes=10, dim=64, depth=2, heads=4, mlp_dim=128)
    loss = DistillWrapper(teacher=teacher, student=deit, temperature=3.0)(img, labels)

This file needs only torch, einops, `vit_pytorch.vit`, `vit_pytorch.deit`, `vit_pytorch.t2t` and
`vit_pytorch.efficient` (its loaders also `vit_pytorch.pretrained`).
"""

import copy

import torch
import torch.nn.functional as F
from einops import repeat
from torch import nn

from vit_pytorch import deit, efficient, t2t, vit
from vit_pytorch.deit import (DeiT, deit_base_distilled_patch16_224, deit_base_distilled_patch16_384,
                              deit_small_distilled_patch16_224, deit_tiny_distilled_patch16_224)
from vit_pytorch.vit import ViT

__all__ = [
    'DistillMixin', 'DistillableViT', 'DistillableT2TViT', 'DistillableEfficientViT', 'DistillWrapper', 'DeiT',
    'deit_tiny_distilled_patch16_224', 'deit_small_distilled_patch16_224',
    'deit_base_distilled_patch16_224', 'deit_base_distilled_patch16_384',
]


# vit-pytorch's students: plain models that take a distillation token into their Transformer


class DistillMixin:
    """`forward(img, distill_token=None)` for a ViT-like model with `embed_tokens_of`, `transformer`,
    `dropout` and `forward_head`: without a token, the model's own forward; with one (1, dim), the pair
    (the model's output on the other tokens, the token after the Transformer (b, dim))."""

    def forward(self, img, distill_token=None):
        if distill_token is None:
            return super().forward(img)
        tokens = self.embed_tokens_of(img)
        dim = tokens.shape[-1]
        if not isinstance(distill_token, torch.Tensor) or distill_token.shape != (1, dim):
            shape = tuple(distill_token.shape) if isinstance(distill_token, torch.Tensor) \
                else type(distill_token).__name__
            raise ValueError(f"distill_token must be a tensor of shape (1, {dim}), got {shape}")
        # appended after the position embeddings: it has none (a learned token needs none); the embedding
        # dropout acts elementwise, so dropping it apart from the others is the same distribution
        distill_tokens = self.dropout(repeat(distill_token, 'n d -> b n d', b=tokens.shape[0]))
        x = self.transformer(torch.cat((tokens, distill_tokens), dim=1))
        x, distilled = x[:, :-1], x[:, -1]
        return (x if self.mlp_head is None else self.forward_head(x)), distilled

    def to_vit(self):
        """The plain model (`plain_class`) with this one's arguments and weights, on its device, in its mode."""
        model = self.plain_class(**copy.deepcopy(self.kwargs))
        model.load_state_dict(self.state_dict())
        reference = self.cls_token
        return model.to(device=reference.device, dtype=reference.dtype).train(self.training)


class DistillableViT(DistillMixin, ViT):
    """vit-pytorch's `DistillableViT`: `ViT` (the same arguments and state_dict) whose forward also takes
    `distill_token`, which `DistillWrapper` passes. `to_vit()` returns the `ViT`."""

    plain_class = ViT

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.kwargs = kwargs
        self.dim = kwargs['dim']

    def embed_tokens_of(self, img):
        return self.embed(img)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if f'{prefix}distill_token' in state_dict:
            raise ValueError(f"the state_dict has {prefix}distill_token: it is a DeiT's (this package's DistillableViT "
                             f"before it took vit-pytorch's meaning, issue 25); load it into vit_pytorch.deit.DeiT")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class DistillableT2TViT(DistillMixin, t2t.T2TViT):
    """vit-pytorch's `DistillableT2TViT`: our `T2TViT` (the paper's; the same arguments) whose forward also
    takes `distill_token`. `to_vit()` returns the `T2TViT`."""

    plain_class = t2t.T2TViT

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.kwargs = kwargs
        self.dim = kwargs['dim']

    def embed_tokens_of(self, img):
        return self.dropout(self.embed_without_dropout(img))

    def embed_without_dropout(self, img):
        vit.check_images(img, channels=self.channels, patch_size=(1, 1), image_size=self.image_size,
                         dtype=self.cls_token.dtype)
        x = self.to_patch_embedding(img)
        x = torch.cat((repeat(self.cls_token, 'n d -> b n d', b=x.shape[0]), x), dim=1)
        return x + self.pos_embedding


class DistillableEfficientViT(DistillMixin, efficient.ViT):
    """vit-pytorch's `DistillableEfficientViT`: `vit_pytorch.efficient.ViT` (any backbone `transformer`; the
    same arguments and state_dict) whose forward also takes `distill_token`. `to_vit()` returns the
    `efficient.ViT`, with a copy of the backbone."""

    plain_class = efficient.ViT

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.kwargs = kwargs
        self.dim = kwargs['dim']
        self.dropout = nn.Identity()      # vit-pytorch's efficient ViT has no embedding dropout

    def embed_tokens_of(self, img):
        return self.embed(img)


VIT_PYTORCH_STUDENTS = (DistillableViT, DistillableT2TViT, DistillableEfficientViT)


# the loss


class DistillWrapper(nn.Module):
    """Loss of a student learning from labels and from a teacher (vit-pytorch's `DistillWrapper`).

    soft (`hard=False`): `(1 - alpha) * CE(logits, labels)
        + alpha * T^2 * KL(softmax(teacher / T) || softmax(distill_logits / T))`, the KL averaged
        over the batch (DeiT eq. 2; `T^2` keeps the gradient scale independent of `T`).
    hard (`hard=True`): `(1 - alpha) * CE(logits, labels) + alpha * CE(distill_logits, argmax teacher)`
        (DeiT eq. 3 with alpha = 1/2; `temperature` is unused).
    `forward(img, labels, temperature=None, alpha=None, **kwargs)`: a per-call temperature or alpha
    replaces the wrapper's for that call; `kwargs` go to the student.

    With a vit-pytorch student (`DistillableViT`, `DistillableT2TViT`, `DistillableEfficientViT`) the wrapper
    holds the distillation token (`distillation_token`, (1, dim), a unit normal) and its head (`distill_mlp`: a
    LayerNorm if `mlp_layernorm`, then a Linear), as vit-pytorch does. With a `DeiT` student the token
    and head are the student's, and `mlp_layernorm` must stay False (DeiT's head is a Linear).

    The teacher can be any `nn.Module` mapping the same images to logits over the same classes.
    It is frozen (requires_grad off) and kept in eval mode, even when the wrapper is put in
    training mode; it runs under `no_grad`.
    """

    def __init__(self, *, teacher, student, temperature=1., alpha=0.5, hard=False, mlp_layernorm=False):
        check_wrapper_arguments(**vit.arguments(locals()))
        super().__init__()
        self.teacher = teacher.eval().requires_grad_(False)
        self.student = student
        self.temperature = check_temperature(temperature)
        self.alpha = check_alpha(alpha)
        self.hard = hard
        if isinstance(student, DeiT):
            self.register_parameter('distillation_token', None)
            self.distill_mlp = None
        else:
            dim, num_classes = student.dim, student.num_classes
            self.distillation_token = nn.Parameter(torch.randn(1, dim))
            self.distill_mlp = nn.Sequential(nn.LayerNorm(dim) if mlp_layernorm else nn.Identity(),
                                             nn.Linear(dim, num_classes))

    def train(self, mode=True):
        super().train(mode)
        self.teacher.eval()
        return self

    def student_logits(self, img, **kwargs):
        """`(logits, distill_logits)`: the student's cls head and the distillation head."""
        if self.distill_mlp is None:
            return self.student.forward_distill(img, **kwargs)
        logits, distilled = self.student(img, distill_token=self.distillation_token, **kwargs)
        return logits, self.distill_mlp(distilled)

    def forward(self, img, labels, temperature=None, alpha=None, **kwargs):
        """The scalar distillation loss for a batch of images and their labels."""
        t = self.temperature if temperature is None else check_temperature(temperature)
        alpha = self.alpha if alpha is None else check_alpha(alpha)
        with torch.no_grad():
            teacher_logits = self.teacher(img)
        logits, distill_logits = self.student_logits(img, **kwargs)
        if teacher_logits.shape != distill_logits.shape:
            raise ValueError(f"teacher logits have shape {tuple(teacher_logits.shape)}, the student's "
                             f"{tuple(distill_logits.shape)}: teacher and student must share the classes")

        label_loss = F.cross_entropy(logits, labels)
        if self.hard:
            distill_loss = F.cross_entropy(distill_logits, teacher_logits.argmax(dim=-1))
        else:
            distill_loss = F.kl_div(F.log_softmax(distill_logits / t, dim=-1), F.log_softmax(teacher_logits / t, dim=-1),
                                    reduction='batchmean', log_target=True) * t ** 2
        return (1 - alpha) * label_loss + alpha * distill_loss


# argument checks


def check_temperature(value):
    vit.positive_float('temperature', value)
    return float(value)


def check_alpha(value):
    vit.fraction('alpha', value, ' (the weight of the distillation loss)')
    return float(value)


def check_wrapper_arguments(*, teacher, student, temperature, alpha, hard, mlp_layernorm):
    if not isinstance(teacher, nn.Module):
        raise TypeError(f"teacher must be an nn.Module, got {type(teacher).__name__}")
    if not isinstance(student, (*VIT_PYTORCH_STUDENTS, DeiT)):
        raise TypeError(f"student must be a DistillableViT, DistillableT2TViT, DistillableEfficientViT or DeiT "
                        f"(a model that takes a distillation token), got {type(student).__name__}")
    if student.mlp_head is None:
        raise ValueError("student has no head (num_classes=0); build it with num_classes > 0")
    check_temperature(temperature)
    check_alpha(alpha)
    vit.boolean('hard', hard)
    vit.boolean('mlp_layernorm', mlp_layernorm)
    if mlp_layernorm and isinstance(student, DeiT):
        raise ValueError("mlp_layernorm=True adds a LayerNorm to the wrapper's distillation head, and a DeiT "
                         "student brings its own head (a Linear, as in the paper): use DistillableViT for it")


# loading checkpoints: a vit-pytorch student loads what its plain model loads (DeiT's plans are in vit_pytorch.deit)


def _plain_plan(fmt, model, keys):
    """A vit-pytorch student's checkpoints are its plain model's."""
    from vit_pytorch import pretrained
    module = pretrained if isinstance(model, DistillableViT) else t2t if isinstance(model, DistillableT2TViT) \
        else efficient
    plan = getattr(module, f'{fmt}_plan', None)
    if plan is None:
        raise TypeError(f"no {pretrained.FORMATS[fmt]} checkpoints exist for {type(model).__name__}")
    return plan(model, keys)


def _not_for_the_wrapper(fmt, model):
    from vit_pytorch import pretrained
    return TypeError(f"no {pretrained.FORMATS[fmt]} checkpoints exist for {type(model).__name__}: "
                     f"load them into its student")


def timm_plan(model, keys):
    """timm's ViTs into a vit-pytorch student (a plain ViT); timm's distilled DeiTs go into `DeiT`."""
    if isinstance(model, DistillWrapper):
        raise _not_for_the_wrapper('timm', model)
    return _plain_plan('timm', model, keys)


def hf_plan(model, keys):
    """Hugging Face ViTs into a vit-pytorch student (a plain ViT); distilled DeiTs go into `DeiT`."""
    if isinstance(model, DistillWrapper):
        raise _not_for_the_wrapper('hf', model)
    return _plain_plan('hf', model, keys)


def jax_plan(model, keys):
    """The paper's JAX ViT checkpoints, into a vit-pytorch `DistillableViT` (a plain ViT)."""
    if isinstance(model, DistillWrapper):
        raise _not_for_the_wrapper('jax', model)
    return _plain_plan('jax', model, keys)


def vit_pytorch_plan(model, keys):
    """vit-pytorch's students have their plain model's keys; its wrapper's are ours (`student.`, `teacher.`,
    `distillation_token`, `distill_mlp.`): both load as their plain model does. A wrapper around a `DeiT` has
    no vit-pytorch checkpoints (`deit.vit_pytorch_plan` says why)."""
    if isinstance(model, DistillWrapper):
        if model.distill_mlp is None:
            return deit.vit_pytorch_plan(model.student, keys)
        prefix = 'student.'
        _plain_plan('vit_pytorch', model.student, [key[len(prefix):] for key in keys if key.startswith(prefix)])
        return None
    return _plain_plan('vit_pytorch', model, keys)
