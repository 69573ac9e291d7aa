"""DeiT distillation: a ViT student with a distillation token, taught by any teacher.

"Training data-efficient image transformers & distillation through attention",
Touvron et al., arXiv 2012.12877: besides the cls token, the student carries a
second learned token that goes through the same Transformer; its output feeds a
second head trained to match the teacher (soft: KL to the teacher's softened
distribution; hard: cross-entropy to the teacher's argmax), while the cls head
learns the true labels. At inference the two heads are averaged.

The token and its head live in the student (`DistillableViT`), so `.to(device)`,
`state_dict()` and timm's `deit_*_distilled_*` checkpoints just work;
`DistillWrapper` only holds the teacher and computes the loss.

    import torch
    from torch import nn
    from vit_pytorch.distill import DistillableViT, DistillWrapper

    student = DistillableViT(image_size=32, patch_size=8, num_classes=10, dim=64,
                             depth=2, heads=4, mlp_dim=128)
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))   # any nn.Module
    wrapper = DistillWrapper(teacher=teacher, student=student, temperature=3.0, alpha=0.5)

    img, labels = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    loss = wrapper(img, labels)
    loss.backward()

    student.eval()
    logits = student(img)          # (4, 10): the average of both heads

This file needs only torch, einops and `vit_pytorch.vit`.
"""

import torch
import torch.nn.functional as F
from einops import repeat
from torch import nn

from vit_pytorch import vit
from vit_pytorch.vit import ViT, init_tokens, zero_linear

# the DeiT configurations (Touvron et al., Table 1); the paper's ViT numerics of `vit_pytorch.pretrained`
_PAPER_VIT = dict(patch_size=16, dim_head=64, patch_norm=False, qkv_bias=True, norm_eps=1e-6)
_DEIT = {
    'tiny': dict(dim=192, depth=12, heads=3, mlp_dim=768),
    'small': dict(dim=384, depth=12, heads=6, mlp_dim=1536),
    'base': dict(dim=768, depth=12, heads=12, mlp_dim=3072),
}

__all__ = [
    'DistillableViT', 'DistillWrapper',
    'deit_tiny_distilled_patch16_224', 'deit_small_distilled_patch16_224',
    'deit_base_distilled_patch16_224', 'deit_base_distilled_patch16_384',
]


class DistillableViT(ViT):
    """A ViT with a distillation token after the cls token and a second head on it.

    Takes the keyword arguments of `ViT` (only `pool='cls'`, and no pre-logits layer).
    Token order `[cls, distill, patches]`, with a position embedding for each,
    as in DeiT and timm's `VisionTransformerDistilled`.

    In training mode `forward` returns `(logits, distill_logits)`, the cls head and the
    distillation head separately; in eval mode their average. `forward_distill` returns
    the pair in either mode. `num_classes=0` returns the tokens, like `ViT`.
    """

    extra_tokens = 1

    def __init__(self, *, pool='cls', pre_logits_dim=None, **kwargs):
        if pool != 'cls':
            raise ValueError(f"DistillableViT needs pool='cls' (DeiT reads the cls and distillation tokens), got {pool!r}")
        if pre_logits_dim is not None:
            raise ValueError(f"DistillableViT has no pre-logits layer (DeiT has none), got pre_logits_dim={pre_logits_dim!r}")
        super().__init__(pool=pool, **kwargs)
        dim = self.pos_embedding.shape[-1]
        self.distill_token = nn.Parameter(torch.zeros(1, dim))
        init_tokens(self.distill_token, patch_norm=kwargs.get('patch_norm', True))
        self.distill_head = nn.Linear(dim, self.num_classes) if self.num_classes > 0 else None

    def reset_classifier(self, num_classes):
        """New zero-initialised cls and distillation heads for `num_classes` (0 removes both)."""
        super().reset_classifier(num_classes)
        self.distill_head = zero_linear(self.pos_embedding.shape[-1], num_classes, like=self.pos_embedding) \
            if num_classes > 0 else None

    def prefix_tokens(self, batch_size):
        """The cls and distillation tokens, before positions: (b, 2, dim)."""
        return repeat(torch.cat((self.cls_token, self.distill_token)), 'n d -> b n d', b=batch_size)

    def _heads(self, tokens):
        if self.mlp_head is None:
            raise ValueError("this DistillableViT has no heads (num_classes=0); call reset_classifier(num_classes) first")
        return self.mlp_head(tokens[:, 0]), self.distill_head(tokens[:, 1])

    def forward_head(self, tokens, pre_logits=False):
        """The averaged embedding of both tokens (`pre_logits=True`), the logits pair
        in training, or the average of both heads' logits in eval mode."""
        if pre_logits or self.mlp_head is None:
            return (tokens[:, 0] + tokens[:, 1]) / 2
        logits, distill_logits = self._heads(tokens)
        if self.training:
            return logits, distill_logits
        return (logits + distill_logits) / 2

    def forward_distill(self, img):
        """`(logits, distill_logits)` from the cls and distillation heads, in any mode."""
        return self._heads(self.forward_features(img))


class DistillWrapper(nn.Module):
    """Loss of a `DistillableViT` student learning from labels and from a teacher.

    soft (`hard=False`): `(1 - alpha) * CE(logits, labels)
        + alpha * T^2 * KL(softmax(teacher / T) || softmax(distill_logits / T))`, the KL averaged
        over the batch (DeiT eq. 2; `T^2` keeps the gradient scale independent of `T`).
    hard (`hard=True`): `(1 - alpha) * CE(logits, labels) + alpha * CE(distill_logits, argmax teacher)`
        (DeiT eq. 3 with alpha = 1/2; `temperature` is unused).

    The teacher can be any `nn.Module` mapping the same images to logits over the same classes.
    It is frozen (requires_grad off) and kept in eval mode, even when the wrapper is put in
    training mode; it runs under `no_grad`.
    """

    def __init__(self, *, teacher, student, temperature=1.0, alpha=0.5, hard=False):
        check_wrapper_arguments(**vit.arguments(locals()))
        super().__init__()
        self.teacher = teacher.eval().requires_grad_(False)
        self.student = student
        self.temperature = float(temperature)
        self.alpha = float(alpha)
        self.hard = hard

    def train(self, mode=True):
        super().train(mode)
        self.teacher.eval()
        return self

    def forward(self, img, labels):
        """The scalar distillation loss for a batch of images and their labels."""
        with torch.no_grad():
            teacher_logits = self.teacher(img)
        logits, distill_logits = self.student.forward_distill(img)
        if teacher_logits.shape != distill_logits.shape:
            raise ValueError(f"teacher logits have shape {tuple(teacher_logits.shape)}, the student's "
                             f"{tuple(distill_logits.shape)}: teacher and student must share the classes")

        label_loss = F.cross_entropy(logits, labels)
        if self.hard:
            distill_loss = F.cross_entropy(distill_logits, teacher_logits.argmax(dim=-1))
        else:
            t = self.temperature
            distill_loss = F.kl_div(F.log_softmax(distill_logits / t, dim=-1), F.log_softmax(teacher_logits / t, dim=-1),
                                    reduction='batchmean', log_target=True) * t ** 2
        return (1 - self.alpha) * label_loss + self.alpha * distill_loss


# named DeiT configurations (timm's names); keyword arguments override, e.g. num_classes=10


def deit_tiny_distilled_patch16_224(**kwargs):
    return DistillableViT(**{**_PAPER_VIT, **_DEIT['tiny'], 'image_size': 224, 'num_classes': 1000, **kwargs})


def deit_small_distilled_patch16_224(**kwargs):
    return DistillableViT(**{**_PAPER_VIT, **_DEIT['small'], 'image_size': 224, 'num_classes': 1000, **kwargs})


def deit_base_distilled_patch16_224(**kwargs):
    return DistillableViT(**{**_PAPER_VIT, **_DEIT['base'], 'image_size': 224, 'num_classes': 1000, **kwargs})


def deit_base_distilled_patch16_384(**kwargs):
    return DistillableViT(**{**_PAPER_VIT, **_DEIT['base'], 'image_size': 384, 'num_classes': 1000, **kwargs})


# argument checks


def check_wrapper_arguments(*, teacher, student, temperature, alpha, hard):
    if not isinstance(teacher, nn.Module):
        raise TypeError(f"teacher must be an nn.Module, got {type(teacher).__name__}")
    if not isinstance(student, DistillableViT):
        raise TypeError(f"student must be a DistillableViT (it holds the distillation token and head), "
                        f"got {type(student).__name__}")
    if student.mlp_head is None:
        raise ValueError("student has no heads (num_classes=0); build it with num_classes > 0")
    vit.positive_float('temperature', temperature)
    vit.fraction('alpha', alpha, ' (the weight of the distillation loss)')
    vit.boolean('hard', hard)


# loading checkpoints: the paper ViT's plans (vit_pytorch.pretrained) with the distillation token and head


def _with_distillation(planned, model, *, token, head):
    plan, head_prefixes = planned
    dim = model.pos_embedding.shape[-1]
    plan['distill_token'] = ({token: (1, 1, dim)}, lambda t: t[0])
    if model.distill_head is not None:
        plan['distill_head.weight'] = ({f'{head}.weight': tuple(model.distill_head.weight.shape)}, lambda t: t)
        plan['distill_head.bias'] = ({f'{head}.bias': tuple(model.distill_head.bias.shape)}, lambda t: t)
    return plan, (*head_prefixes, f'{head}.')


def timm_plan(model, keys):
    """timm's `VisionTransformerDistilled` (`deit_*_distilled_*`, and DeiT's own `.pth` files)."""
    from vit_pytorch import pretrained
    return _with_distillation(pretrained.timm_plan(model, keys), model, token='dist_token', head='head_dist')


def hf_plan(model, keys):
    """Hugging Face `DeiTForImageClassificationWithTeacher` (or `DeiTModel`, with load_head=False)."""
    from vit_pytorch import pretrained
    plan, head_prefixes = pretrained.hf_plan(model, keys)
    for kind in ('weight', 'bias'):     # DeiT's cls head is `cls_classifier`, ViT's `classifier`
        if f'mlp_head.{kind}' in plan:
            sources, convert = plan[f'mlp_head.{kind}']
            plan[f'mlp_head.{kind}'] = ({f'cls_classifier.{kind}': shape for shape in sources.values()}, convert)
    head_prefixes = tuple(prefix for prefix in head_prefixes if prefix != 'classifier.') + ('cls_classifier.',)
    encoder = 'deit.' if any(key.startswith('deit.') for key in keys) else ''    # DeiTModel has no prefix
    return _with_distillation((plan, head_prefixes), model, token=f'{encoder}embeddings.distillation_token',
                              head='distillation_classifier')


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's DistillableViT is a plain ViT at inference: its distillation token and head live in its "
        "DistillWrapper, and the token joins after the patches without a position embedding (DeiT, and ours: "
        "after the cls token, with one). Load its state_dict into vit_pytorch.ViT with the same arguments "
        "(the same outputs)")
