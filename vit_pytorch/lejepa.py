"""LeJEPA: a joint-embedding predictive architecture without a teacher or a stop-gradient.

"LeJEPA: Provable and Scalable Self-Supervised Learning Without the Heuristics", Balestriero and LeCun,
arXiv 2511.08544. Several views of each image go through one network and a projector; the loss is
(1) the prediction term: every view's projection is pulled to the centre (mean) of the global views'
projections, with the gradient flowing through both sides, and (2) SIGReg, "sketched isotropic Gaussian
regularisation", which pulls the distribution of the projections to an isotropic Gaussian, the one the paper
proves minimises the downstream risk, and which alone rules out collapse. SIGReg projects the embeddings
on random unit directions and applies the Epps-Pulley test of normality to each 1-D projection: the
statistic T = N * integral |ecf(t) - exp(-t^2 / 2)|^2 exp(-t^2 / 2) dt, ecf the empirical characteristic
function of the N projected samples, computed by the trapezoidal rule on a few knots (`sigreg`).

    import torch
    from vit_pytorch import ViT
    from vit_pytorch.lejepa import LeJEPA

    model = ViT(image_size=32, patch_size=4, num_classes=10, dim=64, depth=4, heads=4, mlp_dim=128)
    learner = LeJEPA(model, image_size=32, projection_hidden_size=128, num_classes_K=16,
                     target_loss_weight=0.98, sigreg_loss_weight=0.02)
    opt = torch.optim.AdamW(learner.parameters(), lr=5e-4)
    images = torch.rand(8, 3, 32, 32)                   # pixel values in [0, 1]
    loss = learner(images)                              # 2 global and 2 local views of each image
    opt.zero_grad()
    loss.backward()
    opt.step()                                          # no moving average to update: there is no teacher
    projection, embedding = learner(images, return_embedding=True)     # (8, 16), (8, 64)

The network is used only through its public face (`forward_features`, `forward_head(tokens,
pre_logits=True)`, `channels`), so LeJEPA trains every model of the package. The views are DINO's multi-crop
(`dino.MultiCrop`: random resized crops with flips, colour jitter, grayscale, blur, solarisation, written in
torch), two global ones (from `global_lower_crop_scale` of the image up) and
`num_local_crops` local ones (5 % to `local_upper_crop_scale`), all at `image_size` unless
`local_image_size` is given (a model that takes other sizes). `mean`/`std` normalise every view.

vit-pytorch's arguments are kept, in its order and with its defaults (projector hidden width 256, 4 layers,
K = 65336 outputs, both loss weights 1, SIGReg over 1024 slices on 17 knots of [-5, 5]), and so is its
projector (`MLP`: GELU layers, an L2 norm, a last linear layer), so its LeJEPA's state_dict loads
(`load_vit_pytorch`; it holds the network twice, as `net` and `encoder.net`, ours once, as `net`, and the
projector as `projector`). `projector='batchnorm'` (keyword-only) takes the official code's projector instead
(`BatchNormMLP`: linear layers with BatchNorm and ReLU): on the digits vit-pytorch's collapsed where it did not
(docs/pretraining.md, measured by examples/lejepa_probes.py). Where vit-pytorch's LeJEPA differs from the paper,
ours follows the paper:
  - vit-pytorch computes its targets, the global views' projections, under `torch.no_grad()` (a
    stop-gradient) and pairs each local view with the other augmentation's global view; ours has no
    stop-gradient and pulls every view (global ones too) to the centre of the global views, the paper's
    prediction loss (its equation for L_pred);
  - vit-pytorch's SIGReg is the integral without the factor N, on the local views pooled into one batch;
    ours is the Epps-Pulley statistic (with N, as in the paper and its official code), per view, averaged
    over the views. So with equal weights SIGReg weighs N times more here: the paper's lambda is
    `sigreg_loss_weight=lambda, target_loss_weight=1 - lambda` (its minimal example: lambda = 0.02);
  - `use_ema=True` (or a `moving_average_decay`), vit-pytorch's EMA teacher without SIGReg, is refused:
    LeJEPA has no teacher, which is the point of the paper (BYOL-style training is `dino.Dino`'s kind).
`lejepa(variant)` builds it on the official code's timm backbones (`CONFIGS`: MINIMAL.md's ViT-S/8 at 128, the
README's ViT-L/14), classifier-free.
"""

import torch
import torch.nn.functional as F
from torch import nn

from vit_pytorch import dino, vit
from vit_pytorch import sigreg as sigreg_block

SIGREG = dict(num_slices=1024, domain=(-5, 5), num_knots=17)

# the augmentations are DINO's, one draw per image; LeVJEPA (`levjepa`, built on this module) takes them from here
color_jitter, random_grayscale, gaussian_blur = dino.color_jitter, dino.random_grayscale, dino.gaussian_blur
random_resized_crop = dino.random_resized_crop


class L2Norm(nn.Module):
    def forward(self, x):
        return F.normalize(x, dim=-1, eps=1e-6)


class MLP(nn.Module):
    """vit-pytorch's projector: `num_layers - 1` linear layers each followed by a GELU, an L2 norm, a linear
    layer to `dim_out` (`net`'s indices are vit-pytorch's, so its weights load under the same keys)."""

    def __init__(self, dim, dim_out, num_layers, hidden_size=256):
        super().__init__()
        widths = [dim] + [hidden_size] * (num_layers - 1)
        layers = []
        for width_in, width_out in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(width_in, width_out), nn.GELU()]
        self.net = nn.Sequential(*layers, L2Norm(), nn.Linear(hidden_size, dim_out))

    def forward(self, x):
        return self.net(x)


class BatchNormMLP(nn.Module):
    """The official code's projector (MINIMAL.md: torchvision's `MLP(512, [2048, 2048, proj_dim],
    norm_layer=nn.BatchNorm1d)`): `num_layers - 1` linear layers each followed by a BatchNorm and a ReLU, then a
    linear layer to `dim_out`. Its BatchNorm standardises every hidden unit over the batch (in training), so its
    hidden layers cannot make the last layer's input the same for every image, which vit-pytorch's can."""

    def __init__(self, dim, dim_out, num_layers, hidden_size=256):
        super().__init__()
        widths = [dim] + [hidden_size] * (num_layers - 1)
        layers = []
        for width_in, width_out in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(width_in, width_out), nn.BatchNorm1d(width_out), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(widths[-1], dim_out))

    def forward(self, x):
        return self.net(x)


PROJECTORS = {'vit-pytorch': MLP, 'batchnorm': BatchNormMLP}


class LeJEPA(nn.Module):
    """`forward(images)` returns the loss of one LeJEPA step: `target_loss_weight` times the prediction loss
    plus `sigreg_loss_weight` times SIGReg (`last_losses` keeps the two terms, detached).

    `net` is the network (trained in place), `projector` its projector: vit-pytorch's (`MLP`, the default) or,
    with `projector='batchnorm'`, the official code's (`BatchNormMLP`; `projection_layers=3` and
    `projection_hidden_size=2048` are MINIMAL.md's). `sigreg_loss_kwargs`:
    `num_slices` random directions, drawn anew at every step, and the trapezoidal rule's `num_knots` knots on
    `domain`.
    """

    def __init__(self, net, image_size, hidden_layer=-2, projection_hidden_size=256, num_classes_K=65336,
                 projection_layers=4, local_upper_crop_scale=0.4, global_lower_crop_scale=0.5, use_ema=None,
                 moving_average_decay=None, use_sigreg=None, target_loss_weight=1., sigreg_loss_weight=1.,
                 sigreg_loss_kwargs=SIGREG, augment_fn=None, augment_fn2=None, *, num_local_crops=2,
                 local_image_size=None, mean=None, std=None, projector='vit-pytorch'):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        image_size = vit.pair(image_size)
        self.net = net
        self.crops = dino.MultiCrop(image_size=image_size, local_image_size=vit.pair(local_image_size or image_size),
                                    global_scale=(global_lower_crop_scale, 1.),
                                    local_scale=(0.05, local_upper_crop_scale), num_local_crops=num_local_crops,
                                    augment_fn=augment_fn, augment_fn2=augment_fn2)
        width = dino.embedding_width(net, image_size)
        self.projector = PROJECTORS[projector](width, num_classes_K, projection_layers, projection_hidden_size)
        self.target_loss_weight, self.sigreg_loss_weight = target_loss_weight, sigreg_loss_weight
        self.sigreg_loss_kwargs = {**SIGREG, **sigreg_loss_kwargs}
        self.last_losses = None
        if mean is None:
            self.mean = self.std = None
        else:
            self.register_buffer('mean', torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1), persistent=False)
            self.register_buffer('std', torch.tensor(std, dtype=torch.float32).view(-1, 1, 1), persistent=False)

    def embed(self, img):
        """The pooled pre-logits features of (normalised) images: (b, num_features)."""
        return self.net.forward_head(self.net.forward_features(img), pre_logits=True)

    def encoder(self, img, return_projection=True):
        """(projection, embedding) of (normalised) images, or the embedding alone (vit-pytorch's `encoder`)."""
        embedding = self.embed(img)
        if not return_projection:
            return embedding
        return self.projector(embedding), embedding

    def normalise(self, views):
        return views if self.mean is None else (views - self.mean) / self.std

    def views(self, images):
        """(global views, local views) of a batch in [0, 1]: lists of (b, c, h, w) batches, normalised."""
        global_views, local_views = self.crops(images)
        return [self.normalise(view) for view in global_views], [self.normalise(view) for view in local_views]

    def project(self, views):
        """The projections (views, b, K) of a list of equally shaped batches (b, c, h, w)."""
        return self.encoder(torch.cat(views))[0].unflatten(0, (len(views), -1))

    def loss(self, global_projections, local_projections=None, *, projections=None):
        """The loss of projections (views, b, K): the global views' and the local views' (or None).

        `projections`: SIGReg's directions (K, num_slices), unit columns; drawn anew when None."""
        views = global_projections if local_projections is None else torch.cat((global_projections,
                                                                              local_projections))
        prediction = prediction_loss(global_projections, local_projections)
        regulariser = sigreg_loss(views, **self.sigreg_loss_kwargs, projections=projections)
        self.last_losses = (prediction.detach(), regulariser.detach())
        return self.target_loss_weight * prediction + self.sigreg_loss_weight * regulariser

    def forward(self, x, return_embedding=False, return_projection=True, *, projections=None):
        if return_embedding:
            return self.encoder(self.normalise(x), return_projection=return_projection)
        if not isinstance(x, torch.Tensor) or x.ndim != 4 or x.shape[1] != self.net.channels:
            raise ValueError(f"LeJEPA takes images (b, {self.net.channels}, h, w) in [0, 1], got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        global_views, local_views = self.views(x)
        local = None
        if local_views:
            # local views may have their own size: they go through the network as their own batch
            local = self.project(local_views)
        return self.loss(self.project(global_views), local, projections=projections)


def prediction_loss(global_projections, local_projections=None):
    """The paper's prediction loss of projections (views, b, K): the mean squared distance of every view, global
    and local, to the centre of the global views, with the gradient through the centre too (no stop-gradient)."""
    views = global_projections if local_projections is None else torch.cat((global_projections, local_projections))
    return (views - global_projections.mean(dim=0)).square().mean()


# SIGReg is a block of its own (vit_pytorch.sigreg), which the What-Where Transformer's slots share; its names
# stay here as well
random_projections, sigreg, sigreg_loss = sigreg_block.random_projections, sigreg_block.sigreg, sigreg_block.sigreg_loss


# The official code's backbones (rbalestr-lab/lejepa @ eddffdd), timm models named there: name -> (our ViT
# variant, image size). MINIMAL.md's encoder is timm's vit_small_patch8_224 at 128; the README's "LeJEPA ViT-L"
# (304M) is the vit_large_patch14_224 of scripts/launch_*_ablation.md at 224. Both take the embedding as the timm
# model's 512-way head output (MINIMAL.md; the launch scripts' embedding_dim=512); ours take the pooled tokens
# (`forward_head(pre_logits=True)`), so they are built classifier-free and count the official models less that
# Linear (tests/test_lejepa.py).
CONFIGS = {'vit_small_patch8_224': ('S/8', 128), 'vit_large_patch14_224': ('L/14', 224)}


def lejepa(variant, **overrides):
    """LeJEPA on the official code's backbone `variant` (a key of CONFIGS; `pretrained.vit`'s timm-layout ViT at
    the image size there, without classifier); keyword arguments of LeJEPA override its defaults."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    name, image_size = CONFIGS[variant]
    from vit_pytorch import pretrained      # here, as deit's constructors: the model's copy set stays without it

    return LeJEPA(pretrained.vit(name, image_size=image_size, num_classes=0), image_size, **overrides)


# argument checks


def check_arguments(*, net, image_size, hidden_layer, projection_hidden_size, num_classes_K, projection_layers,
                    local_upper_crop_scale, global_lower_crop_scale, use_ema, moving_average_decay, use_sigreg,
                    target_loss_weight, sigreg_loss_weight, sigreg_loss_kwargs, augment_fn, augment_fn2,
                    num_local_crops, local_image_size, mean, std, projector):
    if not isinstance(projector, str) or projector not in PROJECTORS:
        raise ValueError(f"projector must be one of {', '.join(map(repr, PROJECTORS))}, got {projector!r}")
    if use_ema or moving_average_decay is not None or use_sigreg is False:
        raise ValueError(f"LeJEPA has no teacher: SIGReg alone keeps it from collapsing (the paper's point), so "
                         f"vit-pytorch's EMA mode is not offered; got use_ema={use_ema!r}, moving_average_decay="
                         f"{moving_average_decay!r}, use_sigreg={use_sigreg!r} (leave them unset; an EMA teacher "
                         f"is vit_pytorch.dino.Dino's kind)")
    dino.check_arguments(net=net, image_size=image_size, hidden_layer=hidden_layer,
                         projection_hidden_size=projection_hidden_size, num_classes_K=num_classes_K,
                         projection_layers=projection_layers, bottleneck_dim=1, student_temp=1., teacher_temp=1.,
                         local_upper_crop_scale=local_upper_crop_scale,
                         global_lower_crop_scale=global_lower_crop_scale, moving_average_decay=0.,
                         center_moving_average_decay=0., num_local_crops=num_local_crops,
                         local_image_size=local_image_size, augment_fn=augment_fn, augment_fn2=augment_fn2,
                         mean=mean, std=std)
    for name, value in dict(target_loss_weight=target_loss_weight, sigreg_loss_weight=sigreg_loss_weight).items():
        if vit.finite_number(name, value, 'a finite float >= 0') < 0:
            raise ValueError(f"{name} must be a finite float >= 0, got {value}")
    check_sigreg_kwargs(sigreg_loss_kwargs)


def check_sigreg_kwargs(kwargs):
    if not isinstance(kwargs, dict) or set(kwargs) - set(SIGREG):
        raise TypeError(f"sigreg_loss_kwargs must be a dict of {', '.join(SIGREG)}, got {kwargs!r}")
    kwargs = {**SIGREG, **kwargs}
    vit.positive_int('sigreg_loss_kwargs num_slices', kwargs['num_slices'])
    vit.positive_int('sigreg_loss_kwargs num_knots', kwargs['num_knots'])
    if kwargs['num_knots'] < 2:
        raise ValueError(f"sigreg_loss_kwargs num_knots must be at least 2 (the trapezoidal rule's knots), got "
                         f"{kwargs['num_knots']}")
    domain = kwargs['domain']
    if not isinstance(domain, (tuple, list)) or len(domain) != 2:
        raise ValueError(f"sigreg_loss_kwargs domain must be a (low, high) pair, got {domain!r}")
    low, high = (vit.finite_number('sigreg_loss_kwargs domain', value) for value in domain)
    if not low < high:
        raise ValueError(f"sigreg_loss_kwargs domain must have low < high, got {domain!r}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's LeJEPA holds its network twice, as `net.*` and `encoder.net.*` (one tensor under two
    names), and its projector as `encoder.projector.*`: ours holds them once, as `net.*` and `projector.*`. It
    loads where the network's keys agree with vit-pytorch's."""
    if not isinstance(model, LeJEPA):
        return None
    plan = {}
    for key, tensor in model.state_dict().items():
        shape = tuple(tensor.shape)
        if key.startswith('net.'):
            plan[key] = ({key: shape, f'encoder.{key}': shape}, lambda net, same: net)
        else:
            plan[key] = ({f'encoder.{key}': shape}, lambda t: t)
    return plan, ()
