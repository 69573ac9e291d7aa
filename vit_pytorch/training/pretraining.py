"""Self-supervised pre-training, the machinery of `python -m vit_pytorch.pretrain`: the methods, their options,
the run (data, wrapper, optimizer, resume, the epochs through `loop.train_epoch`, the files written) and the
pictures.

A method is a `Method` in `METHODS`. To add one (say `--method lejepa`):

1. write its wrapper as a model module (tier 2, beside `mae.py`): a module whose `forward(images, **options)`
   returns the batch's mean loss, its encoder kept as an attribute;
2. subclass `Method` here: `build` makes the wrapper from the command's arguments and the encoder, `network`
   names the pre-trained network inside it (saved as checkpoint/, which `python -m vit_pytorch.train --init`
   fine-tunes), `options` declares its command-line options (flag, argparse keywords) under its `group` title;
   override the hooks it needs (`forward_options`, `after_backward`, `after_step`, `sums`, `record`, `line`,
   `pictures`; the defaults do nothing) and set `masked` (the loop shifts, flips and normalises its images)
   and `betas` (its paper's AdamW); a method for clips sets `inputs = 'clips'` (with the data and model it
   takes when none is given, `default_data` and `default_model`), and its `build` gets the clips' (frames, h, w)
   as `image_size`;
3. add `'lejepa': LeJEPAMethod()` to `METHODS`.

The command then offers `--method lejepa` with its options, and the run, resume, divergence checks, logs and
checkpoints are the ones every method has; `tests/test_pretrain.py` runs every entry of `METHODS`.
"""

import json
import math
import time
from pathlib import Path

import torch
from torch import nn

from vit_pytorch import analysis, plots
from vit_pytorch.recorder import Recorder
from vit_pytorch.training import registry, run_folder
from vit_pytorch.training.checkpoints import (CheckpointError, load_config, load_training_state, load_weights,
                                              save_checkpoint)
from vit_pytorch.training.data import data_source, normalise
from vit_pytorch.training.loop import (augment, autocast, check_batches, check_weights, epoch_seed, least_batch,
                                       parameter_groups, pick_examples, progress, require_extras, restore_arguments,
                                       run_name, run_steps, share, start_log, train_epoch, write)
from vit_pytorch.training.registry import model_config

# what a run writes to --out (see run_folder): a new run over any of them is refused unless --overwrite
RUN_FILES = ('checkpoint', 'checkpoint.old', 'pretrainer', 'pretrainer.old', 'log.jsonl', 'curves.png',
             'reconstructions.png', 'attention.png')
COMMAND = 'python -m vit_pytorch.pretrain'


class Method:
    """A self-supervised method: its wrapper, its options and what it adds to the shared loop."""

    # sees shifted (and flipped) normalised images; a method that makes its own views takes the pixels
    masked = True
    betas = (0.9, 0.95)                                        # MAE's AdamW
    inputs = 'images'                                          # or 'clips' (b, c, frames, h, w)
    default_data = default_model = None                        # a clip method's, when --data, --model not given
    group = None                                               # the title of its options in --help
    options = ()                                               # (flag, argparse keyword arguments)

    def build(self, args, encoder, *, image_size, mean, std):
        """The wrapper around `encoder`, with the options of `args`."""
        raise NotImplementedError

    def network(self, learner):
        """The network the run pre-trains, saved as checkpoint/."""
        return learner.encoder

    def forward_options(self, args, global_step, steps, total_steps):
        """Keyword arguments of the wrapper's forward at this step (a schedule)."""
        return {}

    def after_backward(self, learner, args, epoch):
        """Runs before the gradients are clipped and applied."""

    def after_step(self, learner, args, global_step, steps, total_steps):
        """Runs after the optimizer's step."""

    def sums(self, learner, count):
        """What the method sums over an epoch's images besides the loss, after a step of `count` images."""
        return []

    def record(self, args, sums, global_step, steps, total_steps):
        """What the epoch's log line adds, from the epoch's `sums` per image."""
        return {}

    def line(self, record):
        """What the epoch's printed line adds."""
        return ''

    def pictures(self, learner, images, *, mean, std, out, figure):
        """The method's pictures of the test `images` (pixels in [0, 1]); the paths written."""
        return []


class MaskedImageModelling(Method):
    """MAE and SimMIM: the picture is the test images, masked, and reconstructed (MAE's figure 2)."""

    title = None

    def pictures(self, learner, images, *, mean, std, out, figure):
        masked, reconstruction, hidden = reconstructions(learner, self, normalise(images, mean, std))
        masked = torch.where(hidden, 0.5, unnormalise(masked, mean, std))           # hidden patches mid-gray
        return [save_reconstructions([images, masked, unnormalise(reconstruction, mean, std)],
                                     out / 'reconstructions.png', figure=figure,
                                     title=f'{self.title}: {learner.masking_ratio:.0%} of the patches hidden')]


MASKED_OPTIONS = 'MAE, SimMIM, MPP, MP3'
MASKING_RATIO = ('--masking-ratio', dict(type=float, default=None,
                                         help='MAE, SimMIM, MP3: the fraction of patches hidden (default: MAE 0.75, '
                                              'SimMIM 0.5, MP3 0.75)'))


def masking_ratio(args, default):
    """The user's `--masking-ratio`, 0 included (the method's check refuses it by name), else the method's default."""
    return default if args.masking_ratio is None else args.masking_ratio


class MAEMethod(MaskedImageModelling):
    title = 'MAE'
    group = MASKED_OPTIONS
    options = (MASKING_RATIO,
               ('--decoder-dim', dict(type=int, default=None, help="MAE decoder width (default: the model's)")),
               ('--decoder-depth', dict(type=int, default=2, help='MAE decoder layers')),
               ('--decoder-heads', dict(type=int, default=4, help='MAE decoder heads')),
               ('--norm-pix-loss', dict(action='store_true', help='MAE: targets normalised per patch')))

    def build(self, args, encoder, *, image_size, mean, std):
        from vit_pytorch.mae import MAE

        decoder_dim = args.decoder_dim or getattr(encoder, 'embed_dim', 64)   # MAE names a missing face
        return MAE(encoder=encoder, decoder_dim=decoder_dim, masking_ratio=masking_ratio(args, 0.75),
                   decoder_depth=args.decoder_depth, decoder_heads=args.decoder_heads,
                   decoder_dim_head=max(1, decoder_dim // args.decoder_heads), norm_pix_loss=args.norm_pix_loss)

    @staticmethod
    def mask(learner, images, noise):
        _, mask = learner.random_mask(len(images), noise.shape[1], device=images.device, noise=noise)
        return mask, learner.reconstruct(images, noise=noise)


class SimMIMMethod(MaskedImageModelling):
    title = 'SimMIM'
    group = MASKED_OPTIONS
    options = (MASKING_RATIO,)

    def build(self, args, encoder, *, image_size, mean, std):
        from vit_pytorch.simmim import SimMIM

        return SimMIM(encoder=encoder, masking_ratio=masking_ratio(args, 0.5))

    @staticmethod
    def mask(learner, images, noise):
        mask = noise.argsort(dim=1).argsort(dim=1) < int(noise.shape[1] * learner.masking_ratio)
        return mask, learner.reconstruct(images, mask=mask)


class MPPMethod(Method):
    group = MASKED_OPTIONS
    options = (('--mask-prob', dict(type=float, default=0.5, help='MPP: the fraction of patches corrupted')),)

    def build(self, args, encoder, *, image_size, mean, std):
        from vit_pytorch.mpp import MPP

        return MPP(transformer=encoder, mask_prob=args.mask_prob, replace_prob=0.8, random_patch_prob=0.1, mean=mean,
                   std=std)

    def network(self, learner):
        return learner.transformer


class MP3Method(Method):
    """MP3: the positions of the patch tokens, given without any, predicted from a context of the others; it
    pre-trains the ViT it wraps (`learner.vit`), whose position embedding it never uses (fine-tuning learns it)."""

    group = MASKED_OPTIONS
    options = (MASKING_RATIO,)

    def build(self, args, encoder, *, image_size, mean, std):
        from vit_pytorch.mp3 import MP3

        return MP3(vit=encoder, masking_ratio=masking_ratio(args, 0.75))

    def network(self, learner):
        return learner.vit


class DinoMethod(Method):
    """DINO: the teacher's temperature and EMA decay on their schedules (`dino_schedule`), the head's last layer
    frozen for the first epochs, the signs of collapse in the log, the teacher's cls attention as its picture."""

    masked = False                                             # DINO makes its own crops of the pixels
    betas = (0.9, 0.999)
    group = 'DINO'
    options = (
        ('--num-classes-k', dict(type=int, default=1024, help='outputs of the projection head (K)')),
        ('--projection-hidden-size', dict(type=int, default=256, help='width of the head MLP')),
        ('--bottleneck-dim', dict(type=int, default=64, help='width of the head bottleneck')),
        ('--num-local-crops', dict(type=int, default=2, help='small crops the student sees')),
        ('--local-image-size', dict(type=int, default=None, help='side of the local crops (default: the image '
                                                                  'size; smaller needs a model that takes it)')),
        ('--teacher-temp', dict(type=float, default=0.04, help="the teacher's first temperature")),
        ('--final-teacher-temp', dict(type=float, default=0.07, help="the teacher's temperature after warm-up")),
        ('--warmup-teacher-temp-epochs', dict(type=float, default=None,
                                              help='epochs of teacher temperature warm-up (default: 30%% of '
                                                   '--epochs)')),
        ('--student-temp', dict(type=float, default=0.1, help="the student's temperature")),
        ('--momentum-teacher', dict(type=float, default=0.996, help='first EMA decay of the teacher')),
        ('--freeze-last-layer', dict(type=float, default=1, help="epochs during which the head's last layer is "
                                                                 "not updated (the paper's code: 1)")),
        ('--norm-last-layer', dict(choices=('true', 'false'), default='true',
                                   help="true: the head's last layer has unit rows; false: their norms are learned, "
                                        "from 1 (the paper's code's --norm_last_layer)")))

    def build(self, args, encoder, *, image_size, mean, std):
        from vit_pytorch.dino import Dino

        return Dino(encoder, image_size, **self.trainer_options(args, mean=mean, std=std))

    def trainer_options(self, args, *, mean, std):
        """The keyword arguments `Dino` and `EsViTTrainer` take alike, from the options."""
        return dict(projection_hidden_size=args.projection_hidden_size, num_classes_K=args.num_classes_k,
                    bottleneck_dim=args.bottleneck_dim, student_temp=args.student_temp,
                    teacher_temp=args.teacher_temp, moving_average_decay=args.momentum_teacher,
                    global_lower_crop_scale=0.4, num_local_crops=args.num_local_crops,
                    local_image_size=args.local_image_size, mean=mean, std=std,
                    norm_last_layer=args.norm_last_layer == 'true')

    def network(self, learner):
        return learner.teacher.net                             # which the paper evaluates

    def forward_options(self, args, global_step, steps, total_steps):
        temperature, _ = dino_schedule(args, global_step, steps, total_steps)
        return dict(teacher_temp=temperature)

    def after_backward(self, learner, args, epoch):
        if epoch < args.freeze_last_layer:
            learner.cancel_last_layer_gradients()

    def after_step(self, learner, args, global_step, steps, total_steps):
        learner.update_moving_average(decay=dino_schedule(args, global_step, steps, total_steps)[1])

    def sums(self, learner, count):
        return [entropy * count for entropy in learner.last_entropies]   # the teacher's, summed over images

    def record(self, args, sums, global_step, steps, total_steps):
        temperature, decay = dino_schedule(args, global_step, steps, total_steps)
        teacher_entropy, mean_entropy = sums
        return dict(teacher_temp=temperature, teacher_decay=decay, teacher_entropy=teacher_entropy,
                    teacher_mean_entropy=mean_entropy, uniform_entropy=math.log(args.num_classes_k))

    def line(self, record):
        return (f", teacher entropy {record['teacher_entropy']:.2f} (of its mean "
                f"{record['teacher_mean_entropy']:.2f}; uniform: {record['uniform_entropy']:.2f})")

    def pictures(self, learner, images, *, mean, std, out, figure):
        network = learner.teacher.net
        try:
            recorder = Recorder(network)
        except ValueError:                                       # a model without attention maps
            return []
        _, attns = recorder(normalise(images, mean, std))
        if not recorder.num_prefix_tokens or recorder.grid is None or not isinstance(attns, torch.Tensor):
            return []                                            # no cls token whose attention to show
        maps = analysis.cls_attention(attns.float().cpu(), grid=recorder.grid,
                                      num_prefix_tokens=recorder.num_prefix_tokens)
        return [save_attention_per_head(images.cpu(), maps, out / 'attention.png', figure=figure,
                                        title="DINO teacher: the last layer's cls attention, per head")]



class LossTerms(Method):
    """A method whose learner keeps its loss's weighted terms, detached, as `last_losses`: the log gives each,
    `terms` naming them ((record key, label in the line, decimals), in the learner's order)."""

    terms = ()

    def sums(self, learner, count):
        return [term.item() * count for term in learner.last_losses]

    def record(self, args, sums, global_step, steps, total_steps):
        return {key: total for (key, _, _), total in zip(self.terms, sums)}

    def line(self, record):
        return ''.join(f", {label} {record[key]:.{decimals}f}" for key, label, decimals in self.terms)


class LeJEPAMethod(LossTerms):
    """LeJEPA: DINO's crops without a teacher, the prediction loss and SIGReg weighed by lambda (the official
    minimal example's defaults: lambda 0.02, 16 projection outputs, 256 slices, its quadrature on [0, 3] doubled,
    which is [-3, 3] on 33 knots); the two terms in the log, as the paper's figures show them."""

    masked = False                                             # LeJEPA makes its own views of the pixels
    betas = (0.9, 0.999)                                       # the official example's AdamW
    group = 'LeJEPA'
    terms = (('prediction_loss', 'prediction', 4), ('sigreg', 'SIGReg', 3))
    options = (
        ('--lejepa-lambda', dict(type=float, default=0.02, help="the weight of SIGReg, the prediction loss's "
                                                                "being 1 - lambda")),
        ('--projection-dim', dict(type=int, default=16, help='outputs of the projector (SIGReg tests them)')),
        ('--sigreg-slices', dict(type=int, default=256, help='random directions SIGReg tests at each step')),
        ('--projection-hidden-size', dict(type=int, default=256, help='width of the head MLP')),
        ('--num-local-crops', dict(type=int, default=2, help='small crops the student sees')),
        ('--lejepa-projector', dict(choices=('batchnorm', 'vit-pytorch'), default='batchnorm',
                                    help="the official code's projector (linear layers with BatchNorm and ReLU, 3 in "
                                         "all; the default) or vit-pytorch's (GELU layers, an L2 norm, a linear "
                                         "layer), which collapses on the digits (docs/pretraining.md)")))

    def build(self, args, encoder, *, image_size, mean, std):
        from vit_pytorch.lejepa import LeJEPA

        # the official projector has 3 linear layers (MINIMAL.md's torchvision MLP), vit-pytorch's 4
        layers = 3 if args.lejepa_projector == 'batchnorm' else 4

        if not 0 <= args.lejepa_lambda <= 1:
            raise ValueError(f"--lejepa-lambda must be in [0, 1] (the weight of SIGReg; 1 - lambda the prediction "
                             f"loss's), got {args.lejepa_lambda}")
        return LeJEPA(encoder, image_size, projection_hidden_size=args.projection_hidden_size,
                      num_classes_K=args.projection_dim, target_loss_weight=1 - args.lejepa_lambda,
                      sigreg_loss_weight=args.lejepa_lambda,
                      sigreg_loss_kwargs=dict(num_slices=args.sigreg_slices, domain=(-3, 3), num_knots=33),
                      num_local_crops=args.num_local_crops, mean=mean, std=std, projection_layers=layers,
                      projector=args.lejepa_projector)

    def network(self, learner):
        return learner.net


METHODS = dict(mae=MAEMethod(), simmim=SimMIMMethod(), mpp=MPPMethod(), dino=DinoMethod(), mp3=MP3Method(),
               lejepa=LeJEPAMethod())


class PooledEncoder(nn.Module):
    """A registered clip model as the encoder LeVJEPA and LeVJEPAND take: `forward(x, drop_ratio=None)` gives its
    pre-logits embedding (`forward_head(forward_features(x, ...), pre_logits=True)`: its cls token, or the mean of
    its tokens, as the model pools) as the one token (b, 1, dim) they read; `dim` its width, `ndim` the dimensions
    of its input (3 for clips). `drop_keyword` is the keyword of the model's forward_features that drops tokens
    (`registry.TOKEN_DROPPING`; the model drops them in training only): a `drop_ratio` goes to it, and a model
    without one (None: it keeps every token) takes no `drop_ratio`."""

    ndim = 3

    def __init__(self, model, drop_keyword=None):
        super().__init__()
        self.model, self.dim, self.drop_keyword = model, model.num_features, drop_keyword

    def forward(self, x, drop_ratio=None):
        if drop_ratio is None:
            features = self.model.forward_features(x)
        elif self.drop_keyword is None:
            raise ValueError(f"drop_ratio must be None: this model keeps every token, got {drop_ratio}")
        else:
            features = self.model.forward_features(x, **{self.drop_keyword: drop_ratio})
        return self.model.forward_head(features, pre_logits=True)[:, None]


class KeepsLossTerms(nn.Module):
    """`learner` (LeVJEPA, LeVJEPAND) whose forward returns the loss and keeps its two weighted terms, detached
    (`last_losses`: invariance, SIGReg), for the log."""

    def __init__(self, learner):
        super().__init__()
        self.learner, self.last_losses = learner, None

    def forward(self, video):
        loss, terms = self.learner(video, return_loss_breakdown=True)
        self.last_losses = tuple(term.detach() for term in terms)
        return loss


class LeVJEPAMethod(LossTerms):
    """LeVJEPA on clips (`vit_pytorch.levjepa`): a global view of each clip (a crop of 0.8 to 1, normalised) and
    `--local-views` local ones (crops of 0.02 to 0.4 resized to `--local-size`, colour jitter, grayscale, flips),
    every local view's projection pulled to its clip's global one, SIGReg weighted by `--sigreg-loss-weight`;
    examples/levjepa_clips.py's recipe (a BatchNorm projector `--projection-hidden-size` wide to 64, SIGReg on
    `--sigreg-slices` directions and 17 knots) on a registered clip model (`PooledEncoder`: its pooled embedding).
    A model that drops tokens (`registry.TOKEN_DROPPING`: LeVJEPA's own encoders, 'levjepa' and 'levjepa_nd') sees
    `--drop-ratio` of each view's patch tokens dropped in training (`drop_ratio`, 0.5, by default); the others keep
    every token and refuse the flag. Its network is that model; the log gives the two terms."""

    masked = False                                             # LeVJEPA makes its own views of the clips
    betas = (0.9, 0.999)                                       # the example's AdamW (torch's default betas)
    group = 'LeVJEPA, LeVJEPAND (clips)'
    inputs, default_data, default_model = 'clips', 'clips:digit', 'vit_nd'
    terms = (('invariance_loss', 'invariance', 4), ('sigreg', 'SIGReg', 4))
    options = (
        ('--local-views', dict(type=int, default=4, help="LeVJEPA's local views of each clip (LeVJEPAND's target "
                                                         "views)")),
        ('--local-size', dict(type=int, default=None, help="LeVJEPA: the local views' side in pixels, for a "
                                                           "model that takes it (default: the clips'; LeVJEPAND "
                                                           "takes only that)")),
        ('--sigreg-loss-weight', dict(type=float, default=0.02, help="the weight of SIGReg (the invariance "
                                                                     "loss's is 1); the projector is "
                                                                     "--projection-hidden-size wide to 64, SIGReg "
                                                                     "tests --sigreg-slices directions")),
        ('--drop-ratio', dict(type=float, default=None, help="the share of each view's patch tokens the encoder "
                                                             "drops in training (never in evaluation), for a model "
                                                             "that drops tokens (--model levjepa, levjepa_nd; "
                                                             "default: 0.5 there); a model that keeps every token "
                                                             "refuses it")))
    projection_dim = 64                                        # the example's projector output
    # --drop-ratio's default for a model that drops tokens (docs/pretraining.md: measured on the default clips)
    drop_ratio = 0.5

    def build(self, args, encoder, *, image_size, mean, std):
        from vit_pytorch.levjepa import LeVJEPA, NormalizeVideo, PhotometricAugment

        frames, height, width = image_size
        local = (height, width) if args.local_size is None else (args.local_size, args.local_size)
        check_takes_clips(args, encoder, (len(mean), frames, height, width), '--image-size')
        check_takes_clips(args, encoder, (len(mean), frames, *local), '--local-size')
        keyword, drop_ratio = self.token_dropping(args)
        return KeepsLossTerms(LeVJEPA(
            PooledEncoder(encoder, keyword), image_size=(height, width), local_size=local,
            num_local_views=args.local_views, drop_ratio=drop_ratio, **self.learner_options(args),
            global_augment_fn=NormalizeVideo(mean, std), local_augment_fn=PhotometricAugment(mean=mean, std=std)))

    def token_dropping(self, args):
        """(the model's token-dropping keyword or None, the drop ratio the learner passes or None): `--drop-ratio`,
        else `drop_ratio` for a model that drops tokens; a ValueError naming the flag for a model that keeps every
        token, or a ratio outside [0, 1)."""
        keyword = registry.TOKEN_DROPPING.get(args.model)
        if args.drop_ratio is None:
            return keyword, None if keyword is None else self.drop_ratio
        if keyword is None:
            droppers = ', '.join(sorted(registry.TOKEN_DROPPING))
            raise ValueError(f"--drop-ratio {args.drop_ratio} needs a model that drops tokens (--model {droppers}); "
                             f"--model {args.model} keeps every token")
        if isinstance(args.drop_ratio, bool) or not 0 <= args.drop_ratio < 1:
            raise ValueError(f"--drop-ratio must be a share of the patch tokens in [0, 1), got {args.drop_ratio}")
        return keyword, args.drop_ratio

    def learner_options(self, args):
        return dict(num_classes_K=self.projection_dim, projection_hidden=args.projection_hidden_size,
                    sigreg_loss_weight=args.sigreg_loss_weight,
                    sigreg_loss_kwargs=dict(num_proj=args.sigreg_slices, knots=17))

    def network(self, learner):
        return learner.learner.encoder.model



class LeVJEPANDMethod(LeVJEPAMethod):
    """LeVJEPAND (`vit_pytorch.levjepa_nd`) with LeVJEPA's views, as examples/levjepa_clips.py --nd: its source
    view LeVJEPA's global view, its `--local-views` target views LeVJEPA's local views at the clips' size (it
    encodes every view in one batch); the rest as `--method levjepa`."""

    def build(self, args, encoder, *, image_size, mean, std):
        from vit_pytorch.levjepa import ClipView, NormalizeVideo, PhotometricAugment
        from vit_pytorch.levjepa_nd import LeVJEPAND

        frames, height, width = image_size
        if args.local_size is not None and (args.local_size, args.local_size) != (height, width):
            raise ValueError(f"--local-size must be the clips' side, {height}, with --method levjepa_nd (LeVJEPAND "
                             f"encodes every view in one batch), got --local-size {args.local_size}")
        check_takes_clips(args, encoder, (len(mean), frames, height, width), '--image-size')
        source = ClipView((height, width), (0.8, 1.0), NormalizeVideo(mean, std))   # LeVJEPA's crops, its defaults
        target = ClipView((height, width), (0.02, 0.4), PhotometricAugment(mean=mean, std=std))
        keyword, drop_ratio = self.token_dropping(args)
        return KeepsLossTerms(LeVJEPAND(
            PooledEncoder(encoder, keyword), input_shape=image_size, augment_src=source, augment_tgt=target,
            num_target_aug_views=args.local_views, drop_ratio=drop_ratio, **self.learner_options(args)))


def check_takes_clips(args, model, shape, flag):
    """A ValueError naming `flag` when `model` refuses clips of `shape` (c, frames, h, w)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model.forward_features(torch.zeros(1, *shape))
    except ValueError as error:
        raise ValueError(f"--model {args.model} does not take clips of {shape[1]} frames of {shape[2]}x{shape[3]} "
                         f"({flag}): {error}") from error
    finally:
        model.train(was_training)


METHODS.update(levjepa=LeVJEPAMethod(), levjepa_nd=LeVJEPANDMethod())


class EsViTMethod(DinoMethod):
    """EsViT: DINO's options, schedules, freeze and log, with the region-level loss added (`vit_pytorch.es_vit`): its
    region tokens are the model's last `forward_intermediates` entry (a ViT's patch tokens, a multi-stage model's
    last map); both heads' last layers are frozen together; the log adds the region-level teacher's entropies."""

    def build(self, args, encoder, *, image_size, mean, std):
        from vit_pytorch.es_vit import EsViTTrainer

        return EsViTTrainer(encoder, image_size, hidden_layer='layers',
                            **self.trainer_options(args, mean=mean, std=std))

    def sums(self, learner, count):
        return [entropy * count for entropy in (*learner.last_entropies, *learner.last_region_entropies)]

    def record(self, args, sums, global_step, steps, total_steps):
        region_entropy, region_mean_entropy = sums[2:]
        return dict(super().record(args, sums[:2], global_step, steps, total_steps),
                    region_teacher_entropy=region_entropy, region_teacher_mean_entropy=region_mean_entropy)

    def line(self, record):
        return (super().line(record) + f"; region-level {record['region_teacher_entropy']:.2f} (of its mean "
                f"{record['region_teacher_mean_entropy']:.2f})")


METHODS['esvit'] = EsViTMethod()


def option_groups():
    """{group title: [(flag, argparse keyword arguments)]} of the methods' options, each flag once, in order."""
    groups, seen = {}, set()
    for method in METHODS.values():
        for flag, settings in method.options:
            if flag not in seen:
                seen.add(flag)
                groups.setdefault(method.group, []).append((flag, settings))
    return groups


def build_learner(args, encoder, *, image_size, mean, std):
    """The wrapper of `--method` around `encoder`, with the options of `args`."""
    return METHODS[args.method].build(args, encoder, image_size=image_size, mean=mean, std=std)


def pretrained_network(learner, method):
    """The network the run pre-trains: the encoder, or DINO's teacher network (which the paper evaluates)."""
    return METHODS[method].network(learner)


def dino_schedule(args, global_step, steps_per_epoch, total_steps):
    """(teacher temperature, EMA decay) at this step: linear temperature warm-up, cosine rise of the decay to 1."""
    warmup = args.warmup_teacher_temp_epochs
    warmup_steps = (0.3 * args.epochs if warmup is None else warmup) * steps_per_epoch
    progress = min(1.0, global_step / warmup_steps) if warmup_steps > 0 else 1.0
    temperature = args.teacher_temp + (args.final_teacher_temp - args.teacher_temp) * progress
    decay = 1 - (1 - args.momentum_teacher) * (math.cos(math.pi * global_step / total_steps) + 1) / 2
    return temperature, decay


# the run


def pretrain(args, model_kwargs, *, parser, rank, world_size, device, run, save=save_checkpoint,
             figure=plots.new_figure):
    """Pre-train as the arguments say (one process of `world_size`); returns the last epoch's record with the
    output paths. `parser`: the command's (a resumed run compares the options given with the run's); `run`: an
    ExitStack that holds --out until the command ends; `save` writes a checkpoint folder and `figure` makes a
    figure (the command's, so that its tests can interrupt a run or read its pictures)."""
    main_process = rank == 0
    resumed = None
    if args.resume is not None:
        if args.resume == 'auto':
            if args.out is None:
                if args.method is None:
                    raise ValueError("--resume without a folder needs --out (or --method, for the default --out)")
                args.out = str(Path('runs') / f'{run_name(args)}-{args.method}')
            resumed = Path(args.out) / 'pretrainer'
        else:
            resumed = Path(args.resume)
            args.out = args.out or str(resumed.parent)
        load_config(resumed)                                       # a clear error before anything else
        args, model_kwargs = restore_arguments(args, model_kwargs, resumed, parser=parser)
    method = METHODS[args.method]
    source = data_source(args.data)
    require_extras(COMMAND, args, source)
    out = Path(args.out or Path('runs') / f'{run_name(args)}-{args.method}')
    args.out = str(out)
    run.enter_context(run_folder.claimed(
        out, command=COMMAND, names=RUN_FILES, checkpoints=('checkpoint', 'pretrainer'),
        continuing=resumed is not None and resumed.resolve().parent == out.resolve(), overwrite=args.overwrite,
        how_to_continue='--resume (with more --epochs to extend a finished run)', rank=rank, world_size=world_size))
    threads = args.threads
    if threads is None and source.tiny and torch.device(device).type == 'cpu':
        threads = 1                                                # tiny models: one thread beats several
    if threads:
        torch.set_num_threads(threads)

    # data: the training images, never their labels
    image_size = args.image_size or source.image_size
    channels = args.channels or source.channels
    train_set = source.load('train', image_size=image_size, channels=channels)
    pixels = train_set.floats()
    clips = method.inputs == 'clips'
    if pixels.ndim != 4 + clips:
        raise ValueError(f"--data {args.data} gives inputs of shape {tuple(pixels.shape[1:])}; " + (
            f"--method {args.method} pre-trains on clips (c, frames, h, w)" if clips else
            "pre-training takes images (c, h, w)"))
    image_size = image_size or tuple(pixels.shape[2:])
    channels = channels or pixels.shape[1]
    over = (0, *range(2, pixels.ndim))                             # every pixel (and frame) of each channel
    mean = pixels.mean(dim=over).tolist()
    std = pixels.std(dim=over).clamp_min(1e-6).tolist()

    # model, wrapper and optimizer
    kwargs = model_config(args.model, model_kwargs, image_size=image_size, channels=channels,
                          num_classes=len(train_set.classes))
    torch.manual_seed(args.seed)
    try:
        encoder = registry.build_model(args.model, **kwargs)
    except TypeError as error:
        if resumed is not None:                                    # the kwargs came from the checkpoint's config
            raise CheckpointError(f"cannot build model {args.model!r} from the configuration in {resumed} "
                                  f"({kwargs}): {error}") from error
        raise ValueError(f"cannot build model {args.model!r} with {kwargs}: {error}") from error
    try:
        learner = method.build(args, encoder, image_size=tuple(pixels.shape[2:]) if clips else image_size,
                               mean=mean, std=std).to(device)
    except TypeError as error:
        raise ValueError(f"--method {args.method} cannot pre-train --model {args.model}: {error}") from error
    config = dict(model=args.model, model_kwargs=kwargs, pretraining=dict(method=args.method),
                  data=dict(source=source.name, test_split=source.test_split, image_size=image_size,
                            channels=channels, classes=train_set.classes, mean=mean, std=std))
    optimizer = torch.optim.AdamW(parameter_groups(learner, args.weight_decay), lr=args.lr, betas=method.betas)
    history, elapsed, start_epoch = [], 0.0, 0
    if resumed is not None:
        load_weights(learner, resumed, config=load_config(resumed))
        state = load_training_state(resumed, optimizer)
        history, elapsed, start_epoch = state['history'], state['elapsed'], state['epoch']
    if args.epochs <= start_epoch:
        raise ValueError(f"nothing to do: --epochs {args.epochs}" + (
            f" and the run in {resumed} has done {start_epoch}; give more epochs to extend it" if resumed else ''))
    # the model's classifier head takes no part in pre-training
    network = nn.parallel.DistributedDataParallel(learner, find_unused_parameters=True) if world_size > 1 \
        else learner

    batch_size = min(args.batch_size, len(train_set))
    if batch_size % world_size:
        raise ValueError(f"--batch-size {batch_size} must divide by the number of processes ({world_size})")
    # the methods' losses are means over this process's images: an empty share would be a NaN
    least = max(least_batch(learner, world_size), world_size)
    merged = check_batches(least, batch_size, images=len(train_set), world_size=world_size,
                           name=f'--method {args.method} with {args.model}')
    steps_per_epoch, total_steps, warmup_steps = run_steps(len(train_set), batch_size, least, epochs=args.epochs,
                                                           warmup_epochs=args.warmup_epochs)
    if main_process:
        start_log(out, history)
        if not args.quiet:
            count = sum(p.numel() for p in encoder.parameters())
            write(f"{args.method} pre-training of {args.model} ({count:,} parameters) on {len(train_set)} unlabelled "
                  f"{args.data} {method.inputs}, {image_size}px; {world_size} process(es) on {device}; writing to {out}"
                  + (f"; resumed after epoch {start_epoch}" if start_epoch else ''))
            if merged:
                write(f"note: {merged}")
    # the masked methods' shifts and flips, drawn for the whole batch as the trainer draws them (no mixup)
    augmentation = type(args)(translate=args.translate, hflip=args.hflip, mixup=0)

    def step_loss(index, generator, rng, global_step):
        images = train_set.floats(index)
        if method.masked:
            images, _ = augment(images, torch.zeros(len(index), dtype=torch.long), augmentation, generator, rng, 1)
        images = images[share(len(index), rank, world_size)].to(device)
        if method.masked:
            images = normalise(images, mean, std)                  # MPP undoes it for its targets
        with autocast(device, args.amp):
            loss_mean = network(images, **method.forward_options(args, global_step, steps_per_epoch,
                                                                 total_steps)).float()
        # DDP averages the processes' gradients: this makes them the gradient of the whole batch's mean loss
        loss = loss_mean * (len(images) * world_size / len(index))
        sums = [loss_mean.item() * len(images), len(images), *method.sums(learner, len(images))]
        return loss, loss.item(), torch.tensor(sums, dtype=torch.float64)

    record = None
    for epoch in range(start_epoch, args.epochs):
        started = time.perf_counter()
        network.train()
        totals, lr = train_epoch(
            network, optimizer, step_loss, epoch=epoch, seed=epoch_seed(args.seed, epoch), images=len(train_set),
            batch_size=batch_size, least=least, steps=steps_per_epoch, peak=args.lr, warmup_steps=warmup_steps,
            total_steps=total_steps, clip_grad=args.clip_grad, clipped=learner,
            divergence=dict(args=args, kept=out / 'pretrainer', world_size=world_size, device=device,
                            what=f'{args.method} loss'),
            after_backward=lambda: method.after_backward(learner, args, epoch),
            after_step=lambda step: method.after_step(learner, args, step, steps_per_epoch, total_steps),
            bar=progress(steps_per_epoch, epoch, args, main_process),
            postfix=lambda totals, *_: f"loss {totals[0] / max(totals[1], 1):.4f}")
        if world_size > 1:
            torch.distributed.all_reduce(totals)
        seconds = time.perf_counter() - started
        elapsed += seconds
        record = dict(epoch=epoch + 1, lr=lr, loss=(totals[0] / totals[1]).item(), epoch_seconds=seconds,
                      images_per_second=len(train_set) / seconds, elapsed_seconds=elapsed)
        record.update(method.record(args, (totals[2:] / totals[1]).tolist(), (epoch + 1) * steps_per_epoch - 1,
                                    steps_per_epoch, total_steps))
        check_weights(learner, epoch=epoch, args=args, kept=out / 'pretrainer')
        history.append(record)
        if main_process:
            with open(out / 'log.jsonl', 'a') as log:
                log.write(json.dumps(record) + '\n')
            # the network first, the resumable state last: an interruption between them resumes and rewrites both
            save(out / 'checkpoint', model=method.network(learner), config=config)
            save(out / 'pretrainer', model=learner, config=config, optimizer=optimizer,
                 state=dict(epoch=epoch + 1, elapsed=elapsed, history=history,
                            args={k: v for k, v in vars(args).items() if k not in ('given', 'notes')}))
            if not args.quiet:
                write(f"epoch {epoch + 1}/{args.epochs}: {args.method} loss {record['loss']:.4f}"
                      f"{method.line(record)}, {record['images_per_second']:.0f} img/s, {seconds:.1f} s")

    pictures = []
    if main_process and args.plots:
        test_set = source.load(source.test_split, image_size=image_size, channels=channels,
                               classes=train_set.classes)
        pictures.append(save_loss_curve(history, out / 'curves.png', method=args.method, figure=figure))
        pictures += draw(learner, args.method, test_set, mean=mean, std=std, device=device, out=out, figure=figure)
    return dict(record, out=str(out), checkpoint=str(out / 'checkpoint'), pictures=[str(p) for p in pictures])


def method_defaults(args):
    """A clip method's data and model where the command line gave none; the notes that say so. In a new run they
    count as given from then on, so that the training command's check of the command line keeps the model (it
    picks the data's default model for one not given); a resumed run takes its own from its pretrainer/ (these
    only name its default --out)."""
    method = METHODS.get(args.method)
    if method is None or method.default_data is None:
        return []
    notes = []
    for name, value in dict(data=method.default_data, model=method.default_model).items():
        if name not in args.given:
            setattr(args, name, value)
            if args.resume is None:
                args.given = tuple(sorted((*args.given, name)))
                notes.append(f"--method {args.method} on its default --{name} {value}")
    return notes


# pictures


def draw(learner, method, data, *, mean, std, device, out, count=8, figure=plots.new_figure):
    """The method's pictures of `count` test images of every class in turn: reconstructions (MAE, SimMIM),
    DINO's teacher's last-layer cls attention per head (models with a cls token); the paths written."""
    images = data.floats(pick_examples(data.labels, count)).to(device)
    learner.eval()
    with torch.no_grad():
        return METHODS[method].pictures(learner, images, mean=mean, std=std, out=out, figure=figure)


def reconstructions(learner, method, images, seed=1):
    """(masked, reconstruction, hidden) of MAE or SimMIM (`method`: its name or entry) on normalised `images`,
    with a mask drawn from `seed`: hidden (b, c, h, w) True on the pixels of the hidden patches."""
    method = METHODS[method] if isinstance(method, str) else method
    grid = learner.encoder.token_grid(images.shape[-2:])
    noise = torch.rand(len(images), grid[0] * grid[1], generator=torch.Generator().manual_seed(seed))
    mask, (masked, reconstruction) = method.mask(learner, images, noise.to(images.device))
    patch_pixels = learner.patchify(images).shape[-1]
    hidden = learner.unpatchify(mask[..., None].expand(-1, -1, patch_pixels).float(), grid).bool()
    return masked, reconstruction, hidden


def unnormalise(images, mean, std):
    """Pixels in [0, 1] from normalised images (b, c, h, w)."""
    mean = torch.tensor(mean, device=images.device).view(-1, 1, 1)
    return (images * torch.tensor(std, device=images.device).view(-1, 1, 1) + mean).clamp(0, 1)


def show(axis, image):
    """A (c, h, w) image in [0, 1] on `axis`, gray for one channel, without ticks."""
    image = image.detach().float().cpu().clamp(0, 1)
    if image.shape[0] == 1:
        axis.imshow(image[0], cmap='gray', vmin=0, vmax=1, interpolation='nearest')
    else:
        axis.imshow(image.permute(1, 2, 0), interpolation='nearest')
    axis.set_xticks([])
    axis.set_yticks([])


def save_reconstructions(rows, path, *, title=None, dpi=100, figure=plots.new_figure):
    """Three rows of images (original, masked, reconstruction), one column per image, as MAE's figure 2."""
    drawn = figure(1.1 * rows[0].shape[0] + 0.3, 3.6 + (0.3 if title else 0))
    axes = drawn.subplots(3, rows[0].shape[0], squeeze=False)
    for row, (images, label) in enumerate(zip(rows, ('original', 'masked', 'reconstruction'))):
        for column, image in enumerate(images):
            show(axes[row][column], image)
        axes[row][0].set_ylabel(label, fontsize=8)
    if title:
        drawn.suptitle(title, fontsize=9)
    drawn.savefig(path, dpi=dpi)
    return Path(path)


def save_attention_per_head(images, maps, path, *, title=None, dpi=100, figure=plots.new_figure):
    """One row per image: the image, then each head's attention map (b, heads, h, w) on its own colour scale."""
    count, heads = maps.shape[:2]
    drawn = figure(1.1 * (heads + 1) + 0.3, 1.1 * count + (0.5 if title else 0.2))
    axes = drawn.subplots(count, heads + 1, squeeze=False)
    for row in range(count):
        show(axes[row][0], images[row])
        for head in range(heads):
            axis = axes[row][head + 1]
            axis.imshow(maps[row, head], cmap='inferno', interpolation='nearest')
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title(f'head {head + 1}', fontsize=8)
    axes[0][0].set_title('input', fontsize=8)
    if title:
        drawn.suptitle(title, fontsize=9)
    drawn.savefig(path, dpi=dpi)
    return Path(path)


def save_loss_curve(history, path, *, method, dpi=100, figure=plots.new_figure):
    """The pre-training loss per epoch."""
    drawn = figure(5, 3.2)
    axis = drawn.subplots()
    axis.plot([record['epoch'] for record in history], [record['loss'] for record in history])
    axis.set(xlabel='epoch', ylabel='loss', title=f'{method} pre-training loss')
    axis.grid(alpha=0.3)
    axis.xaxis.get_major_locator().set_params(integer=True)       # whole epochs: a record is one
    drawn.savefig(path, dpi=dpi)
    return Path(path)
