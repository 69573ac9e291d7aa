"""DeiT: a ViT with a distillation token and a second head, the paper's student.

"Training data-efficient image transformers & distillation through attention", Touvron et al.,
arXiv 2012.12877: besides the cls token, the student carries a second learned token that goes
through the same Transformer, attending with the patch tokens; a second head on its output learns
from a teacher while the cls head learns the true labels (the loss: `vit_pytorch.distill.DistillWrapper`).
At test time the paper averages both heads' predictions.

`DeiT` is timm's `VisionTransformerDistilled` and Hugging Face's `DeiTForImageClassificationWithTeacher`:
the token and its head live in the model, which returns both heads' logits in training and their
average in eval mode. The named constructors `deit_*_distilled_*` build the paper's configurations
(Table 1); timm's and Hugging Face's distilled checkpoints load into it with `load_timm` / `load_hf`.
vit-pytorch has no such model: its `DistillableViT` is a plain ViT whose wrapper holds the token
(`vit_pytorch.distill`, which also re-exports the names of this module, so
`from vit_pytorch.distill import DeiT` keeps working).

    import torch
    from vit_pytorch.deit import DeiT

    model = DeiT(image_size=32, patch_size=8, num_classes=10, dim=64, depth=2, heads=4, mlp_dim=128)
    img = torch.randn(4, 3, 32, 32)
    logits, distill_logits = model.train()(img)    # (4, 10) each: the cls head and the distillation head
    averaged = model.eval()(img)                    # (4, 10): their average

This file needs only torch, einops and `vit_pytorch.vit` (its loaders also `vit_pytorch.pretrained`).
"""

import torch
from einops import repeat
from torch import nn

from vit_pytorch.vit import ViT, init_tokens, zero_linear

# the DeiT configurations (Touvron et al., Table 1); the paper's ViT numerics of `vit_pytorch.pretrained`
_PAPER_VIT = dict(patch_size=16, dim_head=64, patch_norm=False, qkv_bias=True, norm_eps=1e-6)
_DEIT = {
    'tiny': dict(dim=192, depth=12, heads=3, mlp_dim=768),
    'small': dict(dim=384, depth=12, heads=6, mlp_dim=1536),
    'base': dict(dim=768, depth=12, heads=12, mlp_dim=3072),
}

__all__ = [
    'DeiT', 'deit_tiny_distilled_patch16_224', 'deit_small_distilled_patch16_224',
    'deit_base_distilled_patch16_224', 'deit_base_distilled_patch16_384',
]


class DeiT(ViT):
    """DeiT's distilled ViT: a distillation token after the cls token and a second head on it.

    Takes the keyword arguments of `ViT` (only `pool='cls'`, and no pre-logits layer).
    Token order `[cls, distill, patches]`, with a position embedding for each,
    as in DeiT and timm's `VisionTransformerDistilled`.

    In training mode `forward` returns `(logits, distill_logits)`, the cls head and the
    distillation head separately; in eval mode their average. `forward_distill` returns
    the pair in either mode. `num_classes=0` returns the tokens, like `ViT`.

    `forward_features` returns [cls, distill, patches] after the final norm, (b, 2 + h * w, dim).
    """

    extra_tokens = 1

    def __init__(self, *, pool='cls', pre_logits_dim=None, **kwargs):
        if pool != 'cls':
            raise ValueError(f"DeiT needs pool='cls' (it reads the cls and distillation tokens), got {pool!r}")
        if pre_logits_dim is not None:
            raise ValueError(f"DeiT has no pre-logits layer (the paper has none), got pre_logits_dim={pre_logits_dim!r}")
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
            raise ValueError("this DeiT has no heads (num_classes=0); call reset_classifier(num_classes) first")
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


# named DeiT configurations (timm's names); keyword arguments override, e.g. num_classes=10


def deit_tiny_distilled_patch16_224(**kwargs):
    return DeiT(**{**_PAPER_VIT, **_DEIT['tiny'], 'image_size': 224, 'num_classes': 1000, **kwargs})


def deit_small_distilled_patch16_224(**kwargs):
    return DeiT(**{**_PAPER_VIT, **_DEIT['small'], 'image_size': 224, 'num_classes': 1000, **kwargs})


def deit_base_distilled_patch16_224(**kwargs):
    return DeiT(**{**_PAPER_VIT, **_DEIT['base'], 'image_size': 224, 'num_classes': 1000, **kwargs})


def deit_base_distilled_patch16_384(**kwargs):
    return DeiT(**{**_PAPER_VIT, **_DEIT['base'], 'image_size': 384, 'num_classes': 1000, **kwargs})


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
    """timm's `VisionTransformerDistilled` (`deit_*_distilled_*`, and DeiT's own `.pth` files) -> DeiT."""
    from vit_pytorch import pretrained
    return _with_distillation(pretrained.timm_plan(model, keys), model, token='dist_token', head='head_dist')


def hf_plan(model, keys):
    """Hugging Face `DeiTForImageClassificationWithTeacher` (or `DeiTModel`, with load_head=False) -> DeiT."""
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


def jax_plan(model, keys):
    """The paper's JAX checkpoints are plain ViTs: they hold no DeiT."""
    from vit_pytorch import pretrained
    raise TypeError(f"no {pretrained.FORMATS['jax']} checkpoints exist for {type(model).__name__}: they hold no DeiT")


def vit_pytorch_plan(model, keys):
    """vit-pytorch has no DeiT: refused, saying where its distillation token lives."""
    raise ValueError(
        "vit-pytorch has no DeiT: its DistillableViT is a plain ViT, and the distillation token (which joins "
        "after the patches, without a position embedding) and its head live in its DistillWrapper. Load a "
        "DistillableViT's state_dict into vit_pytorch.distill.DistillableViT (or ViT), a DistillWrapper's into "
        "DistillWrapper(teacher=..., student=DistillableViT(...)), with the same arguments")
