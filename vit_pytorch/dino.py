"""DINO: self-distillation with no labels.

"Emerging Properties in Self-Supervised Vision Transformers", Caron et al., arXiv 2104.14294: a
student network learns to match, on every other view of an image, the output distribution a
teacher gives for each of two large ("global") crops; the student also sees several small
("local") crops, so it learns to infer the whole from a part. The teacher has no gradient: its
weights follow the student's by an exponential moving average (`update_moving_average()` after
each optimiser step). The teacher's outputs are centred (a running mean of them subtracted) and
sharpened (a low temperature), which together keep the training from collapsing to one output.
Both networks end in a projection head: a 3-layer MLP to a 256-wide bottleneck, L2-normalised,
then a weight-normalised linear layer to K outputs (4 linear layers: `projection_layers=4`).

    import torch
    from vit_pytorch import ViT
    from vit_pytorch.dino import Dino

    model = ViT(image_size=32, patch_size=4, num_classes=10, dim=64, depth=4, heads=4, mlp_dim=128)
    learner = Dino.paper(model, image_size=32, projection_hidden_size=256, num_classes_K=1024, num_local_crops=4)
    opt = torch.optim.AdamW(learner.parameters(), lr=5e-4)
    images = torch.rand(8, 3, 32, 32)                   # pixel values in [0, 1]
    loss = learner(images)                              # 2 global + 4 local crops of each image
    opt.zero_grad()
    loss.backward()
    opt.step()
    learner.update_moving_average()                     # teacher and centre follow
    embedding = learner.teacher.embed(images)           # (8, 64): the teacher's pre-logits features

The network is used only through the face every model of the package has: `forward_features`,
`forward_head(tokens, pre_logits=True)` (the embedding) and `channels` (or timm's `in_chans`, as
Swin has); so DINO trains `ViT`, `SimpleViT` and every variant (CaiT, Swin, ...). Crops smaller than `image_size`
(`local_image_size`, the paper's 96 pixels for 224) need a model that takes other sizes
(`SimpleViT`, `ViT(dynamic_image_size=True)`); by default every crop has the size of the model, and
there are 2 local crops (the paper's multi-crop: `num_local_crops=6, local_image_size=96` at 224).

The augmentations are written with torch operations on (b, c, h, w) batches in [0, 1], one draw
per image (`MultiCrop`): random resized crops with horizontal flips (through one `grid_sample`),
colour jitter (brightness, contrast, saturation, hue), grayscale, Gaussian blur and solarisation,
with the paper's probabilities per view. Differences from the paper's (torchvision) pipeline:
jitter runs in a fixed order; hue turns colours about the gray axis; an unreachable crop shape is
clipped to the image instead of drawn again; crops are resampled bilinearly without antialiasing;
blur sigmas are the paper's (0.1, 2.0) pixels scaled to the crop size (out of 224).

vit-pytorch's arguments are kept (`net`, `image_size`, `hidden_layer`, `projection_hidden_size`,
`num_classes_K`, `projection_layers`, `student_temp`, `teacher_temp`, `local_upper_crop_scale`,
`global_lower_crop_scale`, `moving_average_decay`, `center_moving_average_decay`, `augment_fn`,
`augment_fn2`) in vit-pytorch's positional order and with its defaults (hidden width 256, K =
65336, student temperature 0.9, global crops from 50 %, decays 0.9); `Dino.paper(net, image_size,
...)` has the paper's (`DINO_PAPER`: width 2048, K = 65536, 0.1, 40 %, 0.996). `projection_layers`
counts the head's linear layers as vit-pytorch does, the last one included (4: the paper's 3-layer
MLP). `hidden_layer` names where the embedding is read: -2 (or 'to_latent'), the pooled
pre-logits embedding, is the only choice, as the network is not hooked. The head is the paper's
where vit-pytorch's differs: no GELU on the bottleneck, which has its own width (`bottleneck_dim`,
256, vit-pytorch's is `projection_hidden_size`), and a weight-normalised last layer without bias (unit rows;
`norm_last_layer=False` learns the rows' norms from 1, the paper's code's `--norm_last_layer false`). Unlike vit-pytorch
(which shows the student two local crops and the teacher two global ones), the student also
sees the global crops, as in the paper; `augment_fn`/`augment_fn2` replace the photometric
augmentation of the first/second global crop (and `augment_fn` that of the local crops).
Images come in [0, 1], as the augmentations expect; `mean` and `std` (one value per channel)
normalise every view (and `return_embedding`'s input) before the network, for a network trained
on normalised images.
"""

import copy
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from vit_pytorch import vit


class ProjectionHead(nn.Module):
    """MLP (GELU) to a bottleneck, L2-normalised, then a linear layer with unit-norm rows (weight norm, g = 1); with
    `norm_last_layer=False` the rows' norms g are learned, from 1 (the paper's code's `--norm_last_layer false`: its
    `weight_g`, filled with 1 and trained), as `last_layer.gain` (K,)."""

    def __init__(self, dim, num_classes_K, hidden_dim, bottleneck_dim, num_layers, norm_last_layer=True):
        super().__init__()
        widths = [dim] + [hidden_dim] * (num_layers - 1) + [bottleneck_dim]
        layers = []
        for index, (width_in, width_out) in enumerate(zip(widths[:-1], widths[1:])):
            layers.append(nn.Linear(width_in, width_out))
            if index < num_layers - 1:
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers)
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                nn.init.trunc_normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)
        self.last_layer = nn.Linear(bottleneck_dim, num_classes_K, bias=False)
        if not norm_last_layer:         # on the last layer, so that its freeze (`cancel_last_layer_gradients`) holds it
            self.last_layer.register_parameter('gain', nn.Parameter(torch.ones(num_classes_K)))

    def forward(self, x):
        logits = self.unit_rows(x)
        gain = getattr(self.last_layer, 'gain', None)
        return logits if gain is None else logits * gain

    def unit_rows(self, x):
        x = F.normalize(self.mlp(x), dim=-1)
        # x times the unit rows of the weight. With fewer rows than the bottleneck's width (DINO's images): the
        # product divided by the rows' norms; at K = 65336, normalising the (K, bottleneck) weight and its backward
        # took 0.48 s a call (16 rows, one core), this 0.21 s. The norms come after the product, so the backward
        # adds the product's gradient (a transposed view) into the norm's in place, not out of place (31 ms a
        # head). With more rows (EsViT's regions: 4,096 a student batch of 8 images at 256 px), the weight is
        # normalised: the division would keep the (rows, K) product for its backward. Where autograd records
        # nothing (inference, the teacher) the product is divided in place: the same quotient without a second
        # (rows, K) tensor (EsViT's region head at 64 px, 128 rows, K = 65336: 8.2 ms a call out of place, 2.8 ms in
        # place; torch.profiler, one thread, one profile each, load average 0.5-0.8 and 2.4)
        weight = self.last_layer.weight
        if x[..., 0].numel() > weight.shape[1]:
            return F.linear(x, weight / weight.norm(dim=-1, keepdim=True).clamp(min=1e-12))
        product, norms = F.linear(x, weight), weight.norm(dim=-1).clamp(min=1e-12)
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return product / norms
        return product.div_(norms)


class Projector(nn.Module):
    """A network and its projection head: `embed(img)` the pooled pre-logits features, `forward` (logits, embedding)."""

    def __init__(self, net, head):
        super().__init__()
        self.net, self.head = net, head

    def embed(self, img):
        return self.net.forward_head(self.net.forward_features(img), pre_logits=True)

    def forward(self, img):
        embedding = self.embed(img)
        return self.head(embedding), embedding


class MultiCrop(nn.Module):
    """The paper's views of a batch in [0, 1]: two global crops and `num_local_crops` local ones, one draw per image.

    Each view is a random resized crop (area fraction in `scale`, aspect ratio 3/4 to 4/3, flipped with
    probability 0.5), then colour jitter (p 0.8: brightness 0.4, contrast 0.4, saturation 0.2, hue 0.1),
    grayscale (p 0.2), Gaussian blur (p 1.0, 0.1 and 0.5 for the first global, second global and local
    crops) and solarisation (p 0.2, second global crop only). `augment_fn`, `augment_fn2`: callables that
    replace these photometric steps for the first global (and local) and the second global crops.
    """

    def __init__(self, *, image_size, local_image_size, global_scale, local_scale, num_local_crops,
                 augment_fn=None, augment_fn2=None):
        super().__init__()
        self.image_size, self.local_image_size = image_size, local_image_size
        self.global_scale, self.local_scale = global_scale, local_scale
        self.num_local_crops = num_local_crops
        self.augment_fn, self.augment_fn2 = augment_fn, augment_fn2

    def forward(self, images):
        """(global crops, local crops): lists of (b, c, size, size) batches."""
        global_views = [
            self.photometric(random_resized_crop(images, self.image_size, self.global_scale), blur=blur,
                             solarize=solarize, custom=custom)
            for blur, solarize, custom in [(1.0, 0.0, self.augment_fn), (0.1, 0.2, self.augment_fn2)]
        ]
        local_views = [self.photometric(random_resized_crop(images, self.local_image_size, self.local_scale),
                                        blur=0.5, solarize=0.0, custom=self.augment_fn)
                       for _ in range(self.num_local_crops)]
        return global_views, local_views

    @staticmethod
    def photometric(x, *, blur, solarize, custom=None):
        if custom is not None:
            return custom(x)
        x = color_jitter(x, p=0.8, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)
        x = random_grayscale(x, p=0.2)
        x = gaussian_blur(x, p=blur, sigma=(0.1 * x.shape[-1] / 224, 2.0 * x.shape[-1] / 224))
        return random_solarize(x, p=solarize)


# the paper's configuration (section 3.1 and appendix): a 2048-wide 3-layer MLP head (projection_layers counts
# its last layer too) to K = 65536, student temperature 0.1, global crops from 40 % of the image, momentum 0.996
DINO_PAPER = dict(hidden_layer='to_latent', projection_hidden_size=2048, num_classes_K=65536, projection_layers=4,
                  student_temp=0.1, global_lower_crop_scale=0.4, moving_average_decay=0.996)


class SelfDistillation(nn.Module):
    """What DINO and EsViT share: a `student` (network + heads, `.net` the network), a `teacher` that is its copy
    without gradients, kept in eval mode (no dropout or batch statistics), and the views' optional normalisation."""

    def keep_normalisation(self, mean, std):
        if mean is None:
            self.mean = self.std = None
        else:
            self.register_buffer('mean', torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1), persistent=False)
            self.register_buffer('std', torch.tensor(std, dtype=torch.float32).view(-1, 1, 1), persistent=False)

    @property
    def net(self):
        return self.student.net

    def train(self, mode=True):
        super().train(mode)
        self.teacher.eval()
        return self

    def normalise(self, views):
        return views if self.mean is None else (views - self.mean) / self.std


class Dino(SelfDistillation):
    """`forward(images)` returns the loss of one DINO step; call `update_moving_average()` after each optimiser step.

    `student` and `teacher` are `Projector`s (network + head); the teacher is a copy that never gets a gradient.
    `learner.net` is the student's network (the model passed in, trained in place).
    """

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
        self.last_entropies = None          # the last loss's collapse_entropies, for monitoring
        self.moving_average_decay, self.center_moving_average_decay = moving_average_decay, center_moving_average_decay
        self.crops = MultiCrop(image_size=image_size, local_image_size=local_image_size,
                               global_scale=(global_lower_crop_scale, 1.), local_scale=(0.05, local_upper_crop_scale),
                               num_local_crops=num_local_crops, augment_fn=augment_fn, augment_fn2=augment_fn2)

        head = ProjectionHead(embedding_width(net, image_size), num_classes_K, projection_hidden_size,
                              bottleneck_dim, projection_layers - 1, norm_last_layer)
        self.student = Projector(net, head)
        self.teacher = copy.deepcopy(self.student).requires_grad_(False).eval()
        self.register_buffer('teacher_centers', torch.zeros(num_classes_K))
        self.register_buffer('last_teacher_centers', torch.zeros(num_classes_K))
        self.keep_normalisation(mean, std)

    @classmethod
    def paper(cls, net, image_size, **overrides):
        """DINO with the paper's head, temperatures, crops and teacher momentum (`DINO_PAPER`); other
        arguments as for `Dino`."""
        return cls(net, image_size, **{**DINO_PAPER, **overrides})

    def loss(self, teacher_logits, student_logits, *, teacher_temp=None, student_temp=None):
        """Cross-entropy H(teacher, student) averaged over every pair of a teacher view i and a student view j != i.

        teacher_logits (2, b, K) of the two global crops; student_logits (views, b, K), the global crops first.
        The teacher's are centred by `teacher_centers` and sharpened by `teacher_temp`.
        """
        teacher_temp = self.teacher_temp if teacher_temp is None else teacher_temp
        student_temp = self.student_temp if student_temp is None else student_temp
        self.last_entropies = collapse_entropies(
            ((teacher_logits - self.teacher_centers) / teacher_temp).softmax(dim=-1).detach())
        terms = [loss_fn(teacher_logits[i], student_logits[j], teacher_temp, student_temp, self.teacher_centers)
                 for i in range(len(teacher_logits)) for j in range(len(student_logits)) if j != i]
        return sum(terms) / len(terms)

    def forward(self, x, return_embedding=False, return_projection=True, student_temp=None, teacher_temp=None):
        if return_embedding:
            return self.student(self.normalise(x)) if return_projection else self.student.embed(self.normalise(x))
        global_views, local_views = self.crops(x)
        global_views = [self.normalise(view) for view in global_views]
        local_views = [self.normalise(view) for view in local_views]
        batch_size = x.shape[0]
        student_logits = [self.student(torch.cat(global_views))[0]]
        if local_views:
            student_logits.append(self.student(torch.cat(local_views))[0])
        student_logits = torch.cat(student_logits).unflatten(0, (-1, batch_size))           # (views, b, K)
        with torch.no_grad():
            teacher_logits = self.teacher(torch.cat(global_views))[0].unflatten(0, (2, batch_size))
            self.last_teacher_centers.copy_(batch_center(teacher_logits))
        return self.loss(teacher_logits, student_logits, teacher_temp=teacher_temp, student_temp=student_temp)

    def cancel_last_layer_gradients(self):
        """Drop the gradients of the student head's last layer, so that the next optimiser step leaves it as it is
        (the paper's code does this for its first epoch, `--freeze_last_layer 1`, to steady the start)."""
        for parameter in self.student.head.last_layer.parameters():
            parameter.grad = None

    @torch.no_grad()
    def update_moving_average(self, decay=None):
        """teacher <- m teacher + (1 - m) student (m = `decay`, default `moving_average_decay`), and
        centre <- m_c centre + (1 - m_c) the last batch's mean teacher output."""
        m = self.moving_average_decay if decay is None else decay
        for teacher, student in zip(self.teacher.parameters(), self.student.parameters()):
            teacher.mul_(m).add_(student.detach(), alpha=1 - m)
        for teacher, student in zip(self.teacher.buffers(), self.student.buffers()):
            teacher.copy_(student)
        c = self.center_moving_average_decay
        self.teacher_centers.mul_(c).add_(self.last_teacher_centers, alpha=1 - c)


def collapse_entropies(teacher_probs):
    """(mean entropy of the teacher's distributions, entropy of their mean), in nats, as floats: the two ways DINO
    collapses (paper, section 5.3). Both near ln K: every output uniform (centring won); the first near 0 and the
    second small: every image sent to the same few outputs (sharpening won). Healthy: the first well below ln K, the
    second near it (confident, and different for different images)."""
    entropy = lambda p: -(p * p.clamp_min(1e-30).log()).sum(dim=-1)
    probs = teacher_probs.flatten(0, -2)
    return entropy(probs).mean().item(), entropy(probs.mean(dim=0)).item()


def batch_center(teacher_logits):
    """The mean teacher output over the batch (all processes together under torch.distributed): (K,)."""
    center = teacher_logits.flatten(0, -2).mean(dim=0)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(center)
        center /= dist.get_world_size()
    return center


def loss_fn(teacher_logits, student_logits, teacher_temp, student_temp, centers, eps=1e-20):
    """vit-pytorch's DINO loss of one (teacher view, student view) pair, (b, K) logits each: the cross-entropy of
    the student's softmax at `student_temp` against the teacher's centred (`centers`, (K,)) softmax at
    `teacher_temp`, averaged over the batch, the teacher detached; `eps` is in vit-pytorch's signature and unused
    there too."""
    teacher_probs = ((teacher_logits.detach() - centers) / teacher_temp).softmax(dim=-1)
    return -(teacher_probs * (student_logits / student_temp).log_softmax(dim=-1)).sum(dim=-1).mean()


def get_module_device(module):
    """The device of `module`'s first parameter (vit-pytorch's helper of this name)."""
    parameter = next(module.parameters(), None)
    if parameter is None:
        raise ValueError(f"{type(module).__name__} has no parameters, so no device to read")
    return parameter.device


def input_channels(net):
    """The network's input channels: `channels`, or timm's `in_chans` (Swin's); None if it has neither."""
    return getattr(net, 'channels', getattr(net, 'in_chans', None))


def embedding_width(net, image_size):
    """The width of `net`'s pre-logits embedding, from one image (in eval mode, without gradients)."""
    parameter = next(net.parameters(), None)
    probe = torch.zeros(1, input_channels(net), *image_size, device=None if parameter is None else parameter.device,
                        dtype=None if parameter is None else parameter.dtype)
    modes = {module: module.training for module in net.modules()}
    net.eval()
    try:
        with torch.no_grad():
            return net.forward_head(net.forward_features(probe), pre_logits=True).shape[-1]
    finally:
        for module, training in modes.items():
            module.training = training


# augmentations: (b, c, h, w) in [0, 1], one random draw per image


def per_image(x, p):
    """(b, 1, 1, 1) booleans, True with probability p."""
    return torch.rand(x.shape[0], 1, 1, 1, device=x.device) < p


def uniform(x, low, high):
    return torch.empty(x.shape[0], 1, 1, 1, device=x.device).uniform_(low, high)


def random_resized_crop(images, size, scale, ratio=(3 / 4, 4 / 3), flip_p=0.5):
    """A crop of each image covering a random fraction `scale` of its area, aspect ratio in `ratio`, resized to
    `size` (h, w) bilinearly and flipped left-right with probability `flip_p`."""
    batch_size, device = images.shape[0], images.device
    height, width = images.shape[-2:]
    area = torch.empty(batch_size, device=device).uniform_(*scale)
    aspect = torch.empty(batch_size, device=device).uniform_(math.log(ratio[0]), math.log(ratio[1])).exp()
    # the crop's width and height as fractions of the image's, clipped to the image
    crop_w = (area * aspect * height / width).sqrt().clamp(max=1.)
    crop_h = (area / aspect * width / height).sqrt().clamp(max=1.)
    center_x = (torch.rand(batch_size, device=device) * 2 - 1) * (1 - crop_w)
    center_y = (torch.rand(batch_size, device=device) * 2 - 1) * (1 - crop_h)
    flip = torch.where(torch.rand(batch_size, device=device) < flip_p, -1., 1.)
    zero = torch.zeros_like(crop_w)
    theta = torch.stack([torch.stack([crop_w * flip, zero, center_x], -1),
                         torch.stack([zero, crop_h, center_y], -1)], 1).to(images.dtype)   # (b, 2, 3)
    grid = F.affine_grid(theta, [batch_size, images.shape[1], *size], align_corners=False)
    return F.grid_sample(images, grid, mode='bilinear', padding_mode='reflection', align_corners=False)


def grayscale(x):
    """ITU-R 601 luma, (b, 1, h, w); a one-channel batch is its own gray."""
    if x.shape[1] == 1:
        return x
    weights = torch.tensor([0.299, 0.587, 0.114], device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x * weights).sum(dim=1, keepdim=True)


def color_jitter(x, *, p, brightness, contrast, saturation, hue):
    """Brightness, contrast, saturation (factors in [1 - a, 1 + a]) and hue (a turn about the gray axis of up
    to `hue` of a full turn), in this order, for a random fraction p of the images; saturation and hue need RGB."""
    jittered = (x * uniform(x, 1 - brightness, 1 + brightness)).clamp(0, 1)
    mean_gray = grayscale(jittered).mean(dim=(-2, -1), keepdim=True)
    jittered = ((jittered - mean_gray) * uniform(x, 1 - contrast, 1 + contrast) + mean_gray).clamp(0, 1)
    if x.shape[1] == 3:
        gray = grayscale(jittered)
        jittered = ((jittered - gray) * uniform(x, 1 - saturation, 1 + saturation) + gray).clamp(0, 1)
        jittered = rotate_hue(jittered, uniform(x, -hue, hue)[:, 0, 0, 0] * 2 * math.pi)
    return torch.where(per_image(x, p), jittered, x)


def rotate_hue(x, angle):
    """Turn each image's colours by `angle` (b,) radians about the gray axis (Rodrigues' rotation)."""
    axis = torch.full((3,), 3 ** -0.5, device=x.device, dtype=x.dtype)
    cos, sin = angle.cos().to(x.dtype)[:, None, None], angle.sin().to(x.dtype)[:, None, None]
    cross = torch.tensor([[0., -1., 1.], [1., 0., -1.], [-1., 1., 0.]], device=x.device, dtype=x.dtype) * 3 ** -0.5
    rotation = cos * torch.eye(3, device=x.device, dtype=x.dtype) + sin * cross + (1 - cos) * torch.outer(axis, axis)
    return torch.einsum('bij,bjhw->bihw', rotation, x).clamp(0, 1)


def random_grayscale(x, p):
    return torch.where(per_image(x, p), grayscale(x).expand_as(x), x)


def gaussian_blur(x, *, p, sigma):
    """A separable Gaussian blur, sigma drawn from `sigma` (pixels) per image, for a random fraction p of the images."""
    if p == 0:
        return x
    sigmas = uniform(x, *sigma)[:, 0, 0, 0]                                    # (b,)
    radius = max(1, math.ceil(3 * sigma[1]))
    offsets = torch.arange(-radius, radius + 1, device=x.device, dtype=x.dtype)
    kernels = (-(offsets ** 2) / (2 * sigmas[:, None] ** 2)).exp()
    kernels = kernels / kernels.sum(dim=-1, keepdim=True)                       # (b, 2r + 1)
    batch_size, channels, height, width = x.shape
    flat = x.reshape(1, batch_size * channels, height, width)
    weights = kernels.repeat_interleave(channels, dim=0)                        # one kernel per image and channel
    pad = dict(pad=(radius, radius, 0, 0), mode='reflect') if width > radius else dict(pad=(radius, radius, 0, 0))
    flat = F.conv2d(F.pad(flat, **pad), weights[:, None, None, :], groups=batch_size * channels)
    pad = dict(pad=(0, 0, radius, radius), mode='reflect') if height > radius else dict(pad=(0, 0, radius, radius))
    flat = F.conv2d(F.pad(flat, **pad), weights[:, None, :, None], groups=batch_size * channels)
    return torch.where(per_image(x, p), flat.reshape_as(x), x)


def random_solarize(x, p, threshold=0.5):
    return torch.where(per_image(x, p) & (x >= threshold), 1 - x, x)


# argument checks


def check_arguments(*, net, hidden_layer, **settings):
    missing = [name for name in ('forward_features', 'forward_head') if not hasattr(net, name)]
    missing += [] if input_channels(net) is not None else ['channels or in_chans']
    if missing:
        raise TypeError(f"net must be a model of this package (forward_features, forward_head(pre_logits=True), "
                        f"channels or in_chans); {type(net).__name__} has no {', '.join(missing)}")
    if hidden_layer not in ('to_latent', -2):
        raise ValueError(f"hidden_layer must be 'to_latent' (or -2): the embedding is the pooled pre-logits "
                         f"features from forward_head(..., pre_logits=True), got {hidden_layer!r}")
    check_training_arguments(channels=input_channels(net), **settings)


def check_training_arguments(*, image_size, projection_hidden_size, num_classes_K, projection_layers,
                             bottleneck_dim, student_temp, teacher_temp, local_upper_crop_scale,
                             global_lower_crop_scale, moving_average_decay, center_moving_average_decay,
                             num_local_crops, local_image_size, augment_fn, augment_fn2, mean, std, channels,
                             norm_last_layer=True):
    """The checks of every argument but the network's face and `hidden_layer` (EsViT shares them);
    `channels`: the network's input channels."""
    vit.positive_pair('image_size', image_size)
    if local_image_size is not None:
        vit.positive_pair('local_image_size', local_image_size)
    for name, value in dict(projection_hidden_size=projection_hidden_size, num_classes_K=num_classes_K,
                            projection_layers=projection_layers, bottleneck_dim=bottleneck_dim).items():
        vit.positive_int(name, value)
    if projection_layers < 2:
        raise ValueError(f"projection_layers must be at least 2 (the head's linear layers: an MLP of "
                         f"projection_layers - 1, then the last layer), got {projection_layers}")
    vit.non_negative_int('num_local_crops', num_local_crops)
    vit.boolean('norm_last_layer', norm_last_layer)
    vit.positive_float('student_temp', student_temp)
    vit.positive_float('teacher_temp', teacher_temp)
    for name, value in dict(moving_average_decay=moving_average_decay,
                            center_moving_average_decay=center_moving_average_decay).items():
        vit.fraction(name, value, ' (the weight of the old value)')
    expected = 'a float in (0, 1] (the least share of the image a global crop covers)'
    if not 0 < vit.finite_number('global_lower_crop_scale', global_lower_crop_scale, expected) <= 1:
        raise ValueError(f"global_lower_crop_scale must be {expected}, got {global_lower_crop_scale}")
    expected = 'a float in (0.05, 1] (local crops cover 5 % of the image and up)'
    if not 0.05 < vit.finite_number('local_upper_crop_scale', local_upper_crop_scale, expected) <= 1:
        raise ValueError(f"local_upper_crop_scale must be {expected}, got {local_upper_crop_scale}")
    for name, value in dict(augment_fn=augment_fn, augment_fn2=augment_fn2).items():
        if value is not None and not callable(value):
            raise TypeError(f"{name} must be a callable on image batches or None, got {value!r}")
    if (mean is None) != (std is None):
        raise ValueError("mean and std go together: give both (the network's input normalisation) or neither")
    for name, value in dict(mean=mean, std=std).items():
        if value is not None:
            vit.per_channel(name, value, channels, positive=name == 'std')
