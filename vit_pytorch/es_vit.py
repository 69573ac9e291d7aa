"""EsViT: DINO with a region-level matching loss, for multi-stage vision transformers.

"Efficient Self-supervised Vision Transformers for Representation Learning", Li et al., arXiv 2106.09785:
a multi-stage transformer (Swin, CvT) trained by DINO's self-distillation (a student matches, on every
other view, the centred and sharpened output distribution of an EMA teacher) learns poor correspondences
between regions, so EsViT adds a region-level task (section 3.2): every region token of the student's view
is paired with the teacher's region token of another view that is most similar to it (the argmax of the
cosine similarity of their backbone features), and the student's distribution of that token is trained to
match the teacher's, through a second projection head with its own centre. The loss is the mean of the
view-level term (DINO's, on the average-pooled tokens) and the region-level term.

    import torch
    from vit_pytorch.cvt import CvT
    from vit_pytorch.es_vit import EsViTTrainer

    model = CvT(num_classes=10, s1_emb_dim=16, s1_depth=1, s2_emb_dim=32, s2_heads=2, s2_depth=1,
                s3_emb_dim=32, s3_heads=2, s3_depth=1)
    learner = EsViTTrainer(model, image_size=32, hidden_layer='layers', projection_hidden_size=64,
                           num_classes_K=256, bottleneck_dim=32)
    opt = torch.optim.AdamW(learner.parameters(), lr=5e-4)
    images = torch.rand(4, 3, 32, 32)                   # pixel values in [0, 1]
    loss = learner(images)                              # (view-level + region-level) / 2
    opt.zero_grad()
    loss.backward()
    opt.step()
    learner.update_moving_average()                     # teacher and both centres follow

The network is used through its public face only: the region tokens are the last entry of
`forward_intermediates` (the last stage's map (b, c, h, w) of a multi-stage model, or a single-resolution
model's tokens less its `num_prefix_tokens`), and the view embedding is their mean (the paper's average
pooling). So EsViT trains CvT, Swin and every other model of the package.

The crops, augmentations, projection heads, centring and EMA are DINO's (`vit_pytorch.dino`): two global
and `num_local_crops` local crops, torch augmentations with the paper's probabilities, heads ending in a
weight-normalised layer on an L2-normalised bottleneck. vit-pytorch's arguments are kept, in its positional
order and with its defaults; `EsViTTrainer.paper(net, image_size)` has the paper's (DINO's: width 2048,
K = 65536, student temperature 0.1, global crops from 40 %, momentum 0.996).
`es_vit(variant, SwinTransformer)` builds it on the paper's Swin backbones as
its code's configurations name them (`CONFIGS`: Swin-T, -S, -B with windows of 7 and 14, Swin-L with 7),
`es_vit('deit_small/16')` on its code's ViTs (`VIT_CONFIGS`); both count the official code's parameters.

Where ours differs from vit-pytorch's, it follows the paper: the student sees the global crops too and
every (teacher view, other student view) pair is a term (vit-pytorch pairs two local crops with two global
ones); region tokens are matched by cosine similarity (vit-pytorch's dot product favours long vectors);
both heads L2-normalise each token's features (vit-pytorch's region head normalises each feature over the
tokens: its `L2Norm` takes dim 1 of (b, n, c)); the heads are DINO's (a bottleneck, a weight-normalised last
layer without bias) and `hidden_layer` names the last stage's output ('layers', -2) instead of hooking a
module; `load_vit_pytorch` refuses vit-pytorch's trainer checkpoints naming these differences. Images come in
[0, 1]; `mean`/`std` normalise every view before the network.
"""

import copy

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn
from torch.autograd.function import once_differentiable

from vit_pytorch import dino, vit


class RegionProjector(nn.Module):
    """A network and its two heads: `forward(img)` is (view logits (b, K), region logits (b, n, K), region
    features (b, n, c)); `regions(img)` the region features alone."""

    def __init__(self, net, view_head, region_head):
        super().__init__()
        self.net, self.view_head, self.region_head = net, view_head, region_head

    def regions(self, img):
        features = self.net.forward_intermediates(img, 1)[-1]
        if features.ndim == 4:
            return rearrange(features, 'b c h w -> b (h w) c')
        return features[:, getattr(self.net, 'num_prefix_tokens', 0):]

    def forward(self, img):
        regions = self.regions(img)
        return self.view_head(regions.mean(dim=1)), self.region_head(regions), regions


# the paper's configuration (section 4: DINO's, with the last stage's map as the region tokens)
ESVIT_PAPER = {**dino.DINO_PAPER, 'hidden_layer': 'layers'}


class EsViTTrainer(dino.SelfDistillation):
    """`forward(images)` returns the loss of one EsViT step; call `update_moving_average()` after each optimiser
    step. `student` and `teacher` are `RegionProjector`s; the teacher is a copy that never gets a gradient."""

    def __init__(self, net, image_size, hidden_layer=-2, projection_hidden_size=256, num_classes_K=65336,
                 projection_layers=4, student_temp=0.9, teacher_temp=0.04, local_upper_crop_scale=0.4,
                 global_lower_crop_scale=0.5, moving_average_decay=0.9, center_moving_average_decay=0.9,
                 augment_fn=None, augment_fn2=None, *, bottleneck_dim=256, num_local_crops=2, local_image_size=None,
                 mean=None, std=None, norm_last_layer=True):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        image_size = vit.pair(image_size)
        local_image_size = image_size if local_image_size is None else vit.pair(local_image_size)
        self.student_temp, self.teacher_temp = student_temp, teacher_temp
        self.last_entropies = None          # the last loss's view-level collapse_entropies, for monitoring
        self.last_region_entropies = None   # and its region-level ones (over every region of every global view)
        self.moving_average_decay, self.center_moving_average_decay = moving_average_decay, center_moving_average_decay
        self.crops = dino.MultiCrop(image_size=image_size, local_image_size=local_image_size,
                                    global_scale=(global_lower_crop_scale, 1.),
                                    local_scale=(0.05, local_upper_crop_scale), num_local_crops=num_local_crops,
                                    augment_fn=augment_fn, augment_fn2=augment_fn2)
        heads = [dino.ProjectionHead(region_width(net, image_size), num_classes_K, projection_hidden_size,
                                     bottleneck_dim, projection_layers - 1, norm_last_layer) for _ in range(2)]
        self.student = RegionProjector(net, *heads)
        self.teacher = copy.deepcopy(self.student).requires_grad_(False).eval()
        for name in ('teacher_view_centers', 'last_teacher_view_centers', 'teacher_region_centers',
                     'last_teacher_region_centers'):
            self.register_buffer(name, torch.zeros(num_classes_K))
        self.keep_normalisation(mean, std)

    @classmethod
    def paper(cls, net, image_size, **overrides):
        """EsViT with the paper's heads, temperatures, crops and teacher momentum (`ESVIT_PAPER`)."""
        return cls(net, image_size, **{**ESVIT_PAPER, **overrides})

    def pairs(self, num_student_views):
        """(teacher view, student view) of every term: each of the 2 global views against every other view."""
        return [(i, j) for i in range(2) for j in range(num_student_views) if j != i]

    def view_loss(self, teacher_logits, student_logits, *, teacher_temp=None, student_temp=None):
        """DINO's loss: H(teacher, student) averaged over every pair of a teacher view i and a student view j != i.
        teacher_logits (2, b, K) of the global crops; student_logits (views, b, K), the global crops first."""
        teacher_temp, student_temp = self.temperatures(teacher_temp, student_temp)
        self.last_entropies = dino.collapse_entropies(
            ((teacher_logits - self.teacher_view_centers) / teacher_temp).softmax(dim=-1).detach())
        terms = [view_loss_fn(teacher_logits[i], student_logits[j], teacher_temp, student_temp,
                              self.teacher_view_centers) for i, j in self.pairs(len(student_logits))]
        return sum(terms) / len(terms)

    def region_loss(self, teacher_logits, student_logits, teacher_regions, student_regions, *, teacher_temp=None,
                    student_temp=None):
        """The region-level term over the same pairs: lists (per view) of region logits (b, n, K) and region
        features (b, n, c); views of one size may have another number of regions than the teacher's. The mean of
        `region_loss_fn` over the pairs (`forward` sums the same terms view by view)."""
        teacher_temp, student_temp = self.temperatures(teacher_temp, student_temp)
        teacher_probs = teacher_distribution(torch.stack(list(teacher_logits)), self.teacher_region_centers,
                                             teacher_temp)
        log_probs = [student_log_probs(logits, student_temp) for logits in student_logits]
        total = self.region_terms(teacher_probs, torch.stack(list(teacher_regions)), log_probs, student_regions)
        return total / len(self.pairs(len(student_logits)))

    def region_terms(self, teacher_probs, teacher_regions, log_probs, student_regions, first=0):
        """The sum of the region losses of every pair (i, j) for the student views j given (numbered from
        `first`): teacher_probs (2, b, n, K) and teacher_regions (2, b, n, c) of the global views; per student view
        its log-probabilities (b, n, K) and region features (b, n, c). The cross-entropy is linear in its target,
        so each student view is one term (one gather and product, not one a pair), against the sum of its matched
        teacher distributions (`MatchedCrossEntropy`, which keeps no target for the backward)."""
        total = 0.
        for j, (log_probs_j, regions_j) in enumerate(zip(log_probs, student_regions), first):
            rows = matched_rows(teacher_regions, regions_j, [i for i in range(len(teacher_probs)) if i != j])
            total = total + MatchedCrossEntropy.apply(log_probs_j, teacher_probs, rows)
        return total

    def temperatures(self, teacher_temp, student_temp):
        return (self.teacher_temp if teacher_temp is None else teacher_temp,
                self.student_temp if student_temp is None else student_temp)

    def forward(self, x, return_embedding=False, return_projection=True, student_temp=None, teacher_temp=None):
        """The step's loss; with `return_embedding` the student's (view logits, region logits, region features) of
        `x`, or without `return_projection` (embedding (b, c), region features (b, n, c)): vit-pytorch's outputs,
        except that its region features are a map (b, c, h, w)."""
        if return_embedding:
            if return_projection:
                return self.student(self.normalise(x))
            regions = self.student.regions(self.normalise(x))
            return regions.mean(dim=1), regions
        global_views, local_views = self.crops(x)
        batches = [torch.cat([self.normalise(view) for view in views]) for views in (global_views, local_views)
                   if views]
        teacher_temp, student_temp = self.temperatures(teacher_temp, student_temp)
        # the teacher first, so that its region logits are replaced by its distributions before the student's graph
        # grows; then each student batch's region logits are dropped once their log-softmax is taken. Autograd then
        # keeps, of (b, n, K) tensors, one a student view and the two teacher distributions
        with torch.no_grad():
            teacher_view, teacher_region, teacher_regions = self.teacher(batches[0])     # both global views (2 b, ...)
            self.last_teacher_view_centers.copy_(dino.batch_center(teacher_view))
            self.last_teacher_region_centers.copy_(dino.batch_center(teacher_region))
            teacher_probs = teacher_distribution(teacher_region, self.teacher_region_centers, teacher_temp)
            self.last_region_entropies = dino.collapse_entropies(teacher_probs)
            del teacher_region
        teacher_probs, teacher_regions = teacher_probs.unflatten(0, (2, -1)), teacher_regions.unflatten(0, (2, -1))
        student_view, region, first = [], 0., 0
        for batch in batches:
            view_logits, region_logits, student_regions = self.student(batch)
            views = len(batch) // len(x)
            log_probs = [student_log_probs(logits, student_temp) for logits in region_logits.chunk(views)]
            del region_logits
            region = region + self.region_terms(teacher_probs, teacher_regions, log_probs,
                                                student_regions.chunk(views), first)
            student_view.extend(view_logits.chunk(views))
            first += views
        view = self.view_loss(teacher_view.unflatten(0, (2, -1)), torch.stack(student_view),
                              teacher_temp=teacher_temp, student_temp=student_temp)
        return (view + region / len(self.pairs(first))) / 2

    def cancel_last_layer_gradients(self):
        """Drop the gradients of the last layers of the student's two heads (DINO's first-epoch freeze)."""
        for head in (self.student.view_head, self.student.region_head):
            for parameter in head.last_layer.parameters():
                parameter.grad = None

    @torch.no_grad()
    def update_moving_average(self, decay=None):
        """teacher <- m teacher + (1 - m) student (m = `decay`, default `moving_average_decay`), and each
        centre <- m_c centre + (1 - m_c) the last batch's mean teacher output (view-level and region-level)."""
        m = self.moving_average_decay if decay is None else decay
        for teacher, student in zip(self.teacher.parameters(), self.student.parameters()):
            teacher.mul_(m).add_(student.detach(), alpha=1 - m)
        for teacher, student in zip(self.teacher.buffers(), self.student.buffers()):
            teacher.copy_(student)
        c = self.center_moving_average_decay
        self.teacher_view_centers.mul_(c).add_(self.last_teacher_view_centers, alpha=1 - c)
        self.teacher_region_centers.mul_(c).add_(self.last_teacher_region_centers, alpha=1 - c)


view_loss_fn = dino.loss_fn


def region_loss_fn(teacher_logits, student_logits, teacher_latent, student_latent, teacher_temp, student_temp,
                   centers, eps=1e-20):
    """The region-level loss of one (teacher view, student view) pair (paper, eq. 4): each student region i is
    matched to the teacher region j* = argmax_j cos(student_latent_i, teacher_latent_j), and the loss is the
    cross-entropy of the student's softmax at `student_temp` against the teacher's centred softmax at
    `teacher_temp` of region j*, averaged over regions and images. Logits (b, n, K), latents (b, n, c); the teacher
    is detached; `eps` is in vit-pytorch's signature and unused."""
    probs = teacher_distribution(teacher_logits, centers, teacher_temp)[None]
    return MatchedCrossEntropy.apply(student_log_probs(student_logits, student_temp), probs,
                                     matched_rows(teacher_latent[None], student_latent, [0]))


def teacher_distribution(teacher_logits, centers, teacher_temp):
    """The teacher's centred, sharpened softmax, detached: (..., K)."""
    return ((teacher_logits.detach() - centers) / teacher_temp).softmax(dim=-1)


def student_log_probs(student_logits, student_temp):
    return (student_logits / student_temp).log_softmax(dim=-1)


def matched_rows(teacher_regions, student_regions, teachers):
    """For each student region (b, n_s, c) and each teacher view i in `teachers`, the teacher region of view i
    whose features are the most cosine-similar to its own, as a row of teacher_regions (views, b, n_t, c) flattened
    to (views b n_t): (len(teachers), b, n_s)."""
    _, batch, regions = teacher_regions.shape[:3]
    student = F.normalize(student_regions.detach(), dim=-1)
    offsets = torch.arange(batch, device=student.device)[:, None] * regions                  # (b, 1)
    rows = []
    for i in teachers:
        similarity = torch.einsum('b i c, b j c -> b i j', student,
                                  F.normalize(teacher_regions[i].detach(), dim=-1))
        rows.append(similarity.argmax(dim=-1) + offsets + i * batch * regions)             # (b, n_s)
    return torch.stack(rows)


def matched_target(teacher_probs, rows):
    """The sum over the matched teacher views of their distributions at `rows` (m, b, n_s): (b, n_s, K)."""
    flat = teacher_probs.flatten(0, -2)                                                   # (views b n_t, K)
    target = flat[rows[0]]
    for view_rows in rows[1:]:
        target += flat[view_rows]
    return target


class MatchedCrossEntropy(torch.autograd.Function):
    """-(target * log_probs).sum(-1).mean(), target = `matched_target(teacher_probs, rows)`: the cross-entropy of
    the student's log-probabilities (b, n, K) against the sum of its matched teacher distributions (teacher_probs
    (views, b, n_t, K), without gradient). Its gradient is -target / (b n), and the target is gathered again for the
    backward: autograd keeps the teacher's distributions, shared by every student view, and the rows, not a (b, n, K)
    target a student view (which is what `-(target * log_probs)` written with autograd would keep)."""

    @staticmethod
    def forward(ctx, log_probs, teacher_probs, rows):
        ctx.save_for_backward(teacher_probs, rows)
        return -(matched_target(teacher_probs, rows) * log_probs).sum(dim=-1).mean()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        teacher_probs, rows = ctx.saved_tensors
        target = matched_target(teacher_probs, rows)
        return target.mul_(-grad / target[..., 0].numel()), None, None


# the network's input channels: `channels`, or timm's `in_chans` (Swin's)
input_channels = dino.input_channels


def region_width(net, image_size):
    """The width of `net`'s region tokens, from one image (in eval mode, without gradients)."""
    parameter = next(net.parameters(), None)
    probe = torch.zeros(1, input_channels(net), *image_size, device=None if parameter is None else parameter.device,
                        dtype=None if parameter is None else parameter.dtype)
    modes = {module: module.training for module in net.modules()}
    net.eval()
    try:
        with torch.no_grad():
            return RegionProjector(net, None, None).regions(probe).shape[-1]
    finally:
        for module, training in modes.items():
            module.training = training


# The paper's backbones, as its code's experiments/imagenet/swin/*.yaml name them (microsoft/esvit @ 2d6becd), in
# timm's Swin arguments (which vit_pytorch.swin.SwinTransformer takes): name -> (embed_dim, depths, num_heads,
# window_size); patches of 4, MLP ratio 4, query/key/value biases, no absolute positions, at 224 (a window of 14
# covers the last stage's 7 x 7 map whole and unshifted, as the code's blocks clamp it). Its README reports Swin-T,
# -S and -B at W = 7 and 14 (28M, 49M, 87M); the large yaml has no result there. main_esvit.py puts DINO's heads in
# place of the classifier, as EsViTTrainer does, so the backbones are classifier-free; they count the official
# code's parameters (tests/test_es_vit.py). The code's LayerNorms take epsilon 1e-6, timm's and ours 1e-5.
SWIN_TINY, SWIN_SMALL = (96, (2, 2, 6, 2), (3, 6, 12, 24)), (96, (2, 2, 18, 2), (3, 6, 12, 24))
SWIN_BASE, SWIN_LARGE = (128, (2, 2, 18, 2), (4, 8, 16, 32)), (192, (2, 2, 18, 2), (6, 12, 24, 48))
CONFIGS = {
    'swin_tiny_patch4_window7_224': (*SWIN_TINY, 7),
    'swin_small_patch4_window7_224': (*SWIN_SMALL, 7),
    'swin_base_patch4_window7_224': (*SWIN_BASE, 7),
    'swin_large_patch4_window7_224': (*SWIN_LARGE, 7),
    'swin_tiny_patch4_window14_224': (*SWIN_TINY, 14),
    'swin_small_patch4_window14_224': (*SWIN_SMALL, 14),
    'swin_base_patch4_window14_224': (*SWIN_BASE, 14),
}


# The ViTs main_esvit.py builds by --arch (models/vision_transformer.py, DINO's: qkv biases, LayerNorms of epsilon
# 1e-6, no classifier) at --patch_size 16 (its default) or 8: name/patch -> a variant of `pretrained.vit`, whose
# timm-layout ViT counts the same parameters.
VIT_CONFIGS = {f'{arch}/{patch}': f'{size}/{patch}' for arch, size in (('deit_tiny', 'Ti'), ('deit_small', 'S'),
                                                                      ('vit_base', 'B')) for patch in (16, 8)}


def es_vit(variant, swin_transformer=None, **overrides):
    """EsViT on the paper's backbone `variant` at 224 with the paper's recipe (`EsViTTrainer.paper`; keyword
    arguments override the recipe): a Swin of CONFIGS, built by `swin_transformer` (a class taking timm's Swin
    arguments, as vit_pytorch.swin.SwinTransformer; passed in so that this module builds on DINO's alone,
    tests/test_layout.py), or a ViT of VIT_CONFIGS ('deit_small/16')."""
    from vit_pytorch import pretrained      # here, as deit's constructors: the model's copy set stays without it

    if variant in VIT_CONFIGS:
        return EsViTTrainer.paper(pretrained.vit(VIT_CONFIGS[variant], image_size=224, num_classes=0), 224,
                                  **overrides)
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS) + sorted(VIT_CONFIGS)}, got {variant!r}")
    if swin_transformer is None:
        raise TypeError(f'es_vit({variant!r}) builds a Swin: pass swin_transformer, as '
                        f'vit_pytorch.swin.SwinTransformer')
    embed_dim, depths, num_heads, window_size = CONFIGS[variant]
    net = swin_transformer(img_size=224, patch_size=4, num_classes=0, embed_dim=embed_dim, depths=depths,
                           num_heads=num_heads, window_size=window_size)
    return EsViTTrainer.paper(net, 224, **overrides)


# argument checks


def check_arguments(*, net, hidden_layer, **settings):
    if not hasattr(net, 'forward_intermediates') or input_channels(net) is None:
        raise TypeError(f"net must be a model of this package (forward_intermediates, channels or in_chans); "
                        f"{type(net).__name__} has not both")
    if hidden_layer not in ('layers', -2):
        raise ValueError(f"hidden_layer must be 'layers' (or -2): the region tokens are the last stage's output, "
                         f"the last entry of forward_intermediates, got {hidden_layer!r}")
    dino.check_training_arguments(channels=input_channels(net), **settings)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's EsViTTrainer computes another loss than the paper's: its region head "
        "L2-normalises each feature across the tokens (dim 1 of (b, n, c)), not each token's features; it matches "
        "regions by dot product, not cosine similarity; its heads have no bottleneck and no weight-normalised last "
        "layer; and its student sees only the local crops. Load the network alone into the model "
        "(load_vit_pytorch(net, ...) where the model's vit-pytorch checkpoints load)")
