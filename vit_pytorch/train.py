"""Train and evaluate a Vision Transformer in one command.

    python -m vit_pytorch.train                       # small ViT on scikit-learn's digits
    python -m vit_pytorch.train --data ~/pets --image-size 64 --epochs 100
    python -m vit_pytorch.train --model vit --dim 192 --depth 6 --heads 3 --patch-size 8
    python -m vit_pytorch.train --model S/16 --data ~/pets --image-size 224
    python -m vit_pytorch.train --resume              # continue the run in --out
    python -m vit_pytorch.train --resume --epochs 80  # extend a finished run
    python -m vit_pytorch.train --init runs/digits-vit-mae/checkpoint --label-fraction 0.1   # fine-tune
    python -m vit_pytorch.train --init runs/digits-vit-dino/checkpoint --linear-probe       # frozen features
    python -m vit_pytorch.train --model na_vit --image-size 32 --random-size 8 32   # NaViT, mixed sizes
    torchrun --standalone --nproc_per_node=2 -m vit_pytorch.train   # DDP: gloo on CPU, nccl on GPU

With no arguments it trains a 4-layer ViT of width 64 on the 1,347 training digits and tests
it on the held-out 450 (see `vit_pytorch.evaluate`). Options the trainer does not know are the
model's own keyword arguments (`--dim 192`, `--pool mean`, `--qkv-bias`), given to
`vit_pytorch.models.build_model`; unless set, a small default size (patch 4, width 64, depth 4,
4 heads of 16, MLP 128) fills in whatever the model accepts.

The recipe, each part for small data sets: AdamW (weight decay only on weight matrices, not on
norms, biases, position embeddings or tokens), linear warm-up then cosine decay to zero, label
smoothing, gradient-norm clipping, random translation by up to `--translate` pixels, optional
horizontal flips and mixup, optional bf16 mixed precision. Every epoch is seeded from (seed,
epoch), so the same seed gives the same run, and a run resumed from a checkpoint continues
exactly as if it had never stopped.

Every epoch uses every training image once: the epoch's shuffled order is cut into batches of
--batch-size, and the last batch holds what is left (1,347 digits at 64: 21 batches of 64 and
one of 3). Under torchrun each process takes a contiguous part of every batch; an uneven last
batch is split as evenly as it goes (67 images on 2 processes: 33 and 34, 1 image: 0 and 1).
Each process sums its images' losses, divides by the whole batch's size and multiplies by the
number of processes; DDP averages the processes' gradients, so that gives the gradient of the
whole batch's mean loss, and 2 processes follow the path of 1. A model with BatchNorm (LeViT,
MobileViT, CvT, ...) cannot train on one image per process (a channel of one value has no
variance): there a last batch of fewer than 2 images per process joins the one before (70 images
at 3: 22 batches of 3 and one of 4), as the first lines of the run say.

A resumed run takes its recipe, data and model from the checkpoint. `--epochs` may grow (the
cosine schedule is then stretched to the new end) and `--lr` may change (the new peak applies
to the remaining steps); the run options (--out, --device, --threads, --quiet, --no-plots,
--eval-batch-size) are free; any other option given with a value unlike the run's is refused
with both values.

`--init CHECKPOINT` starts from a checkpoint's network (one `python -m vit_pytorch.pretrain` wrote,
or this command): the model, its arguments and weights come from it, with a new zero-initialised
head for this data's classes; `--linear-probe` then trains only that head, the rest frozen (and
in eval mode). `--label-fraction F` trains on a random stratified share of the training images
(round(F * n) of each class of n, at least one; drawn from --seed), the normalisation still
measured on them all, as a label-efficiency experiment needs.

Written to --out: log.jsonl (one JSON line per epoch), checkpoint/ (safetensors + JSON, replaced
every epoch), curves.png, attention.png (rollout on test images of every class),
attention_distance.png and position_similarity.png. One run at a time holds --out (its run.lock,
see `vit_pytorch.run_folder`); a new run where --out holds another run's files is refused unless
--resume continues that run or --overwrite moves its files to <out>/previous-<n>/.
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vit_pytorch import analysis, plots
from vit_pytorch.recorder import Recorder
from vit_pytorch.training import registry, run_folder
# the model defaults, at the path they had when this module held them
from vit_pytorch.training.registry import SMALL_MODEL, model_config  # noqa: F401
from vit_pytorch.training.checkpoints import (CheckpointError, load_config, load_training_state, load_weights,
                                              save_checkpoint)
from vit_pytorch.training.data import data_source, normalise
from vit_pytorch.training.loop import (CONTINUABLE_ARGUMENTS, RUNTIME_ARGUMENTS, HelpFormatter,  # noqa: F401
                                       TrainingDiverged, augment, autocast, check_batches, check_random_size,
                                       check_step, check_weights, command_flags, did_you_mean, epoch_batches,
                                       epoch_seed, epoch_time, evaluate, format_seconds, label_subset, learning_rate,
                                       least_batch, option_flag, parameter_groups, parse_model_kwargs, pick_examples,
                                       predicted_logits, progress, random_sizes, require_extras, restore_arguments,
                                       run_command, run_name, run_steps, same_setting, setup_distributed, share,
                                       start_log, train_epoch, translate, warn, write)

# fewer patches than this and attention has next to nothing to relate (one token: none at all)
MIN_PATCHES = 4
# what a run writes to --out (see run_folder): a new run over any of them is refused unless --overwrite
RUN_FILES = ('checkpoint', 'checkpoint.old', 'log.jsonl', 'curves.png', 'attention.png', 'attention_distance.png',
             'position_similarity.png')
# what `--data NAME:ARG` gives (evaluate.SOURCES): signals (n, c, length) or clips (n, c, frames, h, w); else images
DATA_INPUTS = dict(ucr='signals', clips='clips')
# the model trained on each kind of input when --model is not given
DEFAULT_MODELS = dict(images=('vit', 'the ViT for images'), signals=('vit_1d', 'the ViT for signals'),
                      clips=('vit_3d', 'the ViT for clips'))
# the models that take a batch as a list of images of their own sizes, as --random-size passes it
MIXED_SIZES = ('na_vit', 'na_vit_nested_tensor')


def build_parser():
    parser = argparse.ArgumentParser(prog='python -m vit_pytorch.train', description=__doc__.split('\n\n')[0],
                                     epilog='Any other --name value is a keyword argument of the model.',
                                     formatter_class=HelpFormatter)
    data = parser.add_argument_group('data')
    data.add_argument('--data', default='digits',
                      help="'digits', a folder with train/<class>/ and val/<class>/, ucr:NAME (a UCR set of signals, "
                           "e.g. ucr:GunPoint) or clips:TASK (moving digits, clips:digit or clips:direction)")
    data.add_argument('--image-size', type=int, default=None,
                      help="side in pixels, a signal's length or a clip frame's side (default: the data's, 16 for "
                           "the digits, 32 for a folder)")
    data.add_argument('--channels', type=int, default=None,
                      help='1 gray or 3 RGB (default: 1 for the digits, 3 for a folder)')
    model = parser.add_argument_group('model')
    model.add_argument('--model', default='vit', help=f"one of {', '.join(registry.known_names())} (default: vit; "
                       "vit_1d for signals, vit_3d for clips)")
    recipe = parser.add_argument_group('recipe')
    recipe.add_argument('--epochs', type=int, default=50,
                        help='passes over the training images; with --resume, more than before extends the run')
    recipe.add_argument('--batch-size', type=int, default=64,
                        help="images per step over all processes together; an epoch's last batch takes what is left")
    recipe.add_argument('--lr', type=float, default=3e-3,
                        help='peak learning rate; with --resume, the peak for the remaining steps')
    recipe.add_argument('--weight-decay', type=float, default=0.05, help='AdamW decay of the weight matrices')
    recipe.add_argument('--warmup-epochs', type=float, default=3, help='linear warm-up before the cosine decay')
    recipe.add_argument('--label-smoothing', type=float, default=0.1, help='of the training targets')
    recipe.add_argument('--clip-grad', type=float, default=1.0, help='max gradient norm (0: off)')
    recipe.add_argument('--translate', type=int, default=2,
                        help='random shift by up to this many pixels (samples of a signal)')
    recipe.add_argument('--hflip', action='store_true', help='random horizontal flips (default: off)')
    recipe.add_argument('--mixup', type=float, default=0.0, help='mixup Beta(a, a) parameter a (0: off)')
    recipe.add_argument('--random-size', type=int, nargs=2, metavar=('MIN', 'MAX'), default=None,
                        help="resize each training image to its own random height and width in [MIN, MAX], "
                             "multiples of the model's patch size, and pass the batch as a list of images: a model "
                             f"that takes images of mixed sizes ({', '.join(MIXED_SIZES)}) (default: off)")
    recipe.add_argument('--amp', action='store_true', help='bf16 autocast, mixed precision (default: off)')
    recipe.add_argument('--decorr-aux-loss-weight', type=float, default=0.1,
                        help="vit_with_decorr: the weight of its decorrelation loss in the training loss, "
                             "cross-entropy + weight x loss (default: 0.1, the module example's; 0: off)")
    recipe.add_argument('--sparsity-aux-loss-weight', type=float, default=0.1,
                        help="simple_vit_with_sparse_gating: the weight of its gate sparsity loss in the training "
                             "loss, cross-entropy + weight x loss (default: 0.1, our choice; no source gives one: "
                             "vit-pytorch 1.26.14's example backpropagates the loss alone, and the paper, arXiv "
                             "2505.06708, names none in the passages we read (abstract, introduction); 0: off)")
    recipe.add_argument('--sigreg-loss-weight', type=float, default=0.02,
                        help="wwt with --sigreg-slots: the weight of its slots' SIGReg in the training loss, "
                             "cross-entropy + weight x loss (default: 0.02, the LeJEPA paper's lambda of its minimal "
                             "example, as --lejepa-lambda of python -m vit_pytorch.pretrain; vit-pytorch 1.26.14's "
                             "module and the WWT paper's abstract give none; 0: off)")
    recipe.add_argument('--deep-supervision', action='store_true',
                        help="looped_vit: train on every loop's logits, the loops' cross-entropies weighted by the "
                             "model's --deep-supervision-weighting (final_mean, vit-pytorch's: the last loop 1, the "
                             "earlier ones sharing 1; exponential; final) (default: off, the last loop's "
                             "cross-entropy)")
    recipe.add_argument('--exit-gate-loss-weight', type=float, default=1.0,
                        help="looped_vit with --adaptive-loop True and --deep-supervision: the weight of the exit "
                             "gate's loss, the mean squared error of its predicted gains to adaptive_exit_targets of "
                             "every loop's logits, added to the deep supervision loss (default: 1.0, vit-pytorch "
                             "1.26.14's example adds the error unweighted; 0: the gate is not trained)")
    recipe.add_argument('--seed', type=int, default=0,
                        help="seeds the initialisation and each epoch's order and augmentation")
    start = parser.add_argument_group('starting point')
    start.add_argument('--init', default=None, metavar='CHECKPOINT',
                       help='start from the network of this checkpoint folder (a pre-trained one: python -m '
                            'vit_pytorch.pretrain), with a new head (default: a random initialisation)')
    start.add_argument('--linear-probe', action='store_true',
                       help='train only a new head on the frozen network (default: train everything)')
    start.add_argument('--label-fraction', type=float, default=1.0,
                       help='train on this stratified random share of the labelled training images')
    run = parser.add_argument_group('run')
    run.add_argument('--out', default=None, help='output folder (default: runs/<data>-<model>)')
    run.add_argument('--resume', nargs='?', const='auto', default=None,
                     help='continue from the checkpoint in --out, or the checkpoint folder given '
                          '(default: start a new run)')
    run.add_argument('--overwrite', action='store_true',
                     help='start a new run in an --out that holds another, moving its files to '
                          '<out>/previous-<n>/ (default: refuse)')
    run.add_argument('--device', default=None, help='cpu, cuda, cuda:1, ... (default: cuda when available)')
    run.add_argument('--threads', type=int, default=None,
                     help="CPU threads per process (default: 1 for the digits on CPU, else torch's)")
    run.add_argument('--eval-batch-size', type=int, default=256, help='images per step when testing')
    run.add_argument('--no-plots', dest='plots', action='store_false',
                     help='skip the PNG pictures (default: draw them)')
    run.add_argument('--quiet', action='store_true', help='no progress bars, only the final result (default: off)')
    return parser


def parse_args(argv=None, parser=None):
    """(training arguments, model keyword arguments) from the command line; `args.given` names the
    options the command line set (a resumed run compares them with the run's own). `parser`: another
    command's (the pre-training command's), parsed the same way."""
    parser = parser or build_parser()
    unset = object()
    defaults = vars(parser.parse_known_args([])[0])
    args, rest = parser.parse_known_args(argv, namespace=argparse.Namespace(**dict.fromkeys(defaults, unset)))
    args.given = tuple(sorted(name for name in defaults if getattr(args, name) is not unset))
    for name, value in defaults.items():
        if getattr(args, name) is unset:
            setattr(args, name, value)
    try:
        model_kwargs = parse_model_kwargs(rest)
    except ValueError as error:
        parser.error(str(error))
    return args, model_kwargs


def inputs_of(name):
    """What model `name` takes: 'images', 'signals' or 'clips'."""
    return registry.INPUTS.get(name, 'images').split()[0]


def data_inputs(data):
    """What `--data` gives: 'images', 'signals' or 'clips'."""
    return DATA_INPUTS.get(str(data).partition(':')[0], 'images')


def check_command_line(args, model_kwargs, parser):
    """Checks of the command line that need no data and no model, so that a misfit is one line before anything
    is built: the model fits the data's kind (the kind's own model when --model is not given), --random-size has a
    model that takes mixed sizes, and every model option is one the model takes. Returns the notes to print (the
    model chosen); a ValueError otherwise. A resumed run, or one started from --init, takes its model from a
    checkpoint, so it is left to the checks that read it."""
    if args.resume is not None or getattr(args, 'init', None) is not None:
        return []
    kind = data_inputs(args.data)
    notes = []
    if 'model' not in args.given:
        args.model, what = DEFAULT_MODELS[kind]
        if kind != 'images':
            notes.append(f"no --model given: using {args.model}, {what}")
    if args.model not in registry.MODELS and not registry.is_named_config(args.model):
        return notes                                               # the unknown name is refused when it is built
    if inputs_of(args.model) != kind:
        fitting = ', '.join(name for name in registry.MODELS if inputs_of(name) == kind)
        raise ValueError(f"--model {args.model} takes {inputs_of(args.model)}, but --data {args.data} gives {kind}: "
                         f"use a model for {kind} ({fitting})")
    if getattr(args, 'random_size', None) and args.model not in MIXED_SIZES:
        raise ValueError(f"--random-size passes each batch as a list of images of mixed sizes, which --model "
                         f"{args.model} does not take; the models that do: {', '.join(MIXED_SIZES)}")
    check_model_options(model_kwargs, args.model, parser)
    for name in registry.OWN_LOSS_OPTIONS.get(args.model, ()):
        switch = registry.OWN_LOSSES[args.model][1]
        if name in model_kwargs and not getattr(args, switch):
            raise ValueError(f"{option_flag(name)} shapes the loss of {option_flag(switch)}, which is not given: "
                             f"without it --model {args.model} trains on its last logits' cross-entropy alone")
    return notes


def check_model_options(model_kwargs, model, parser):
    """A ValueError for the first of `model_kwargs` that `model` does not take (an option that is neither the
    command's, which `parser` holds, nor the model's), with the closest spellings of both."""
    accepted = registry.parameters(model)
    if accepted is None:
        return
    flags = command_flags(parser) + ['--' + key.replace('_', '-') for key in sorted(accepted)]
    for name in model_kwargs:
        if name in accepted:
            continue
        flag = '--' + name.replace('_', '-')
        hint = (did_you_mean(flag, flags)
                or f"{model} takes {', '.join('--' + key.replace('_', '-') for key in sorted(accepted))}")
        raise ValueError(f"unrecognised option {flag}: neither an option of {parser.prog} nor an argument of "
                         f"{model}; {hint}")


# augmentation: drawn for the whole global batch, so every process (and a single process) sees the same


# processes


# divergence: a NaN or infinite loss stops the run before it can be saved over the last good checkpoint


# the run


def train(args, model_kwargs):
    """Train as the arguments say; returns the last epoch's record (with 'out', 'checkpoint' and 'pictures')."""
    rank, world_size, device = setup_distributed(args.device)
    threads = torch.get_num_threads()
    try:
        with contextlib.ExitStack() as run:                         # holds --out from _train's claim to the end
            record = _train(args, model_kwargs, rank, world_size, device, run)
            if world_size > 1:
                # the first process writes the last checkpoint and the pictures after the last collective; the
                # others wait for it here, so that no process closes its connections while a peer still uses it
                torch.distributed.barrier()
        return record
    finally:
        torch.set_num_threads(threads)
        if world_size > 1:
            # frees the group and joins its threads now, while the interpreter is whole (see setup_distributed)
            torch.distributed.destroy_process_group()


def _train(args, model_kwargs, rank, world_size, device, run):
    main_process = rank == 0
    checkpoint = None
    if args.resume is not None:
        if args.resume == 'auto':
            if args.out is None:
                args.out = str(Path('runs') / run_name(args))
            checkpoint = Path(args.out) / 'checkpoint'
        else:
            checkpoint = Path(args.resume)
            args.out = args.out or str(checkpoint.parent)
        load_config(checkpoint)                                   # a clear error before anything else
        args, model_kwargs = restore_arguments(args, model_kwargs, checkpoint, parser=build_parser())
    source = data_source(args.data)
    require_extras('python -m vit_pytorch.train', args, source)
    out = Path(args.out or Path('runs') / run_name(args))
    args.out = str(out)
    run.enter_context(run_folder.claimed(
        out, command='python -m vit_pytorch.train', names=RUN_FILES, checkpoints=('checkpoint',),
        continuing=checkpoint is not None and checkpoint.resolve().parent == out.resolve(), overwrite=args.overwrite,
        how_to_continue='--resume (with more --epochs to extend a finished run)', rank=rank, world_size=world_size))
    threads = args.threads
    if threads is None and source.tiny and torch.device(device).type == 'cpu':
        # a model this small gains less from intra-op threads than it loses to their synchronisation,
        # by far on a busy machine (measured: 2 threads ran 7-30x slower than 1 on a shared 2-core box)
        threads = 1
    if threads:
        torch.set_num_threads(threads)

    # data
    image_size = args.image_size or source.image_size
    channels = args.channels or source.channels
    train_set = source.load('train', image_size=image_size, channels=channels)
    labelled = label_subset(train_set.labels, args.label_fraction, seed=args.seed)
    test_split = source.test_split
    test_set = source.load(test_split, image_size=image_size, channels=channels, classes=train_set.classes)
    num_classes = len(train_set.classes)
    pixels = train_set.floats()
    image_size = image_size or tuple(pixels.shape[2:])             # a source's own size, when it has one
    channels = channels or pixels.shape[1]
    per_channel = [dim for dim in range(pixels.ndim) if dim != 1]
    mean = pixels.mean(dim=per_channel).tolist()
    std = pixels.std(dim=per_channel).clamp_min(1e-6).tolist()
    train_set = type(train_set)(train_set.images[labelled], train_set.labels[labelled], train_set.classes)

    # model and optimizer
    initial = None
    if args.init is not None and checkpoint is None:             # a resumed run has its own weights
        initial = load_config(args.init)
        _check_init(initial, args, image_size=image_size, channels=channels)
        args.model, model_kwargs = initial['model'], {**initial['model_kwargs'], **model_kwargs}
    kwargs = model_config(args.model, model_kwargs, image_size=image_size, channels=channels,
                          num_classes=num_classes)
    torch.manual_seed(args.seed)
    try:
        model = registry.build_model(args.model, **kwargs).to(device)
    except TypeError as error:
        if checkpoint is not None:                                # the kwargs came from the checkpoint's config
            raise CheckpointError(f"cannot build model {args.model!r} from the configuration in {checkpoint} "
                                  f"({kwargs}): {error}") from error
        raise ValueError(f"cannot build model {args.model!r} with {kwargs}: {error}") from error
    if initial is not None:
        load_weights(model, args.init, config=initial)
    if args.init is not None or args.linear_probe:
        head = new_head(model, num_classes, name=args.model)
        kwargs.update((key, num_classes) for key in ('num_classes',) if key in kwargs)   # as the run saves it
        if args.linear_probe:
            model.requires_grad_(False)
            for parameter in head:
                parameter.requires_grad_(True)
    config = dict(model=args.model, model_kwargs=kwargs,
                  data=dict(source=source.name,
                            test_split=test_split, image_size=image_size, channels=channels,
                            classes=train_set.classes, mean=mean, std=std))
    optimizer = torch.optim.AdamW(parameter_groups(model, args.weight_decay), lr=args.lr)
    history, elapsed, start_epoch = [], 0.0, 0
    if checkpoint is not None:
        load_weights(model, checkpoint, config=load_config(checkpoint))
        state = load_training_state(checkpoint, optimizer)
        history, elapsed, start_epoch = state['history'], state['elapsed'], state['epoch']
    if args.epochs <= start_epoch:
        raise ValueError(f"nothing to train: --epochs {args.epochs}" + (
            f" and the run in {checkpoint} has done {start_epoch}; give more epochs to extend it" if checkpoint else ''))
    if main_process:
        _warn_few_patches(model, args.model, sample=train_set.floats(slice(0, 1)).to(device))
    network = nn.parallel.DistributedDataParallel(model) if world_size > 1 else model
    if args.random_size:
        patch = getattr(model, 'patch_size', 1)
        patch = tuple(patch) if isinstance(patch, (tuple, list)) else (patch, patch)
        check_random_size(args.random_size, patch, train_set.images)

    batch_size = min(args.batch_size, len(train_set))
    if batch_size % world_size:
        raise ValueError(f"--batch-size {batch_size} must divide by the number of processes ({world_size})")
    least = 1 if args.linear_probe else least_batch(model, world_size)   # a probed network is in eval mode
    merged = check_batches(least, batch_size, images=len(train_set), world_size=world_size, name=args.model)
    steps_per_epoch, total_steps, warmup_steps = run_steps(len(train_set), batch_size, least, epochs=args.epochs,
                                                           warmup_epochs=args.warmup_epochs)

    if main_process:
        start_log(out, history)
        if not args.quiet:
            count = sum(p.numel() for p in model.parameters())
            print(f"{args.model} ({count:,} parameters) on {args.data}: {len(train_set)} training and "
                  f"{len(test_set)} {test_split} images, {num_classes} classes, {image_size}px; "
                  f"{world_size} process(es) on {device}; writing to {out}"
                  + (f"; resumed after epoch {start_epoch}" if start_epoch else ''), flush=True)
        if merged and not args.quiet:
            print(f"note: {merged}", flush=True)

    aux_loss = registry.AUX_LOSSES.get(args.model) or built_aux_loss(model, args.model)  # (forward keyword or
    # None: the model returns the loss unasked, weight option) or None
    aux_weight = check_aux_weight(args, aux_loss)
    own_loss = check_own_loss(args)                             # (forward keyword, switch) when switched on
    own_term = check_own_loss_term(args, model, own_loss)       # registry.OWN_LOSS_TERMS's entry when it is on

    def step_loss(index, generator, rng, global_step):
        images, targets = augment(train_set.floats(index), train_set.labels[index], args, generator, rng,
                                  num_classes)
        mine = share(len(index), rank, world_size)
        images = normalise(images[mine].to(device), mean, std)
        targets, labels = targets[mine].to(device), train_set.labels[index][mine].to(device)
        if args.random_size:
            images = random_sizes(images, args.random_size, multiple=patch, generator=generator)
        with autocast(device, args.amp):
            if own_loss is not None:
                keywords = {own_loss[0]: True, **({} if own_term is None else {own_term['keyword']: True})}
                outputs, aux = network(images, **keywords), None
            elif aux_loss is None:
                outputs, aux = network(images), None
            else:
                *outputs, aux = network(images, **({} if aux_loss[0] is None else {aux_loss[0]: True}))
                if len(outputs) == 1 and isinstance(outputs[0], tuple):
                    outputs = outputs[0]                            # two heads' logits (wwt's return_tokens)
        if own_loss is not None:
            # the model's own loss of all its outputs is a mean over this process's images, summed as the others
            term = {}
            if own_term is not None:
                outputs, term_outputs = outputs
                term = {own_term['output']: term_outputs.float(), own_term['weight']: getattr(args, own_term['weight'])}
            loss_sum = model.training_loss(outputs.float(), targets, label_smoothing=args.label_smoothing, **term) * \
                len(labels)
            outputs = (outputs[-1],)
        else:
            # a model with two heads (DeiT's distillation token) trains both on the labels
            outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
            loss_sum = sum(F.cross_entropy(output.float(), targets, label_smoothing=args.label_smoothing,
                                           reduction='sum') for output in outputs) / len(outputs)
        # the auxiliary loss is a mean over this process's images: weighted by their count, as the sums are
        aux_sum = loss_sum.new_zeros(()) if aux is None else aux.float() * len(labels)
        logits = predicted_logits(outputs).detach().float()               # scored as the evaluation scores it
        sums = torch.tensor([loss_sum.item(), (logits.argmax(-1) == labels).sum().item(), len(labels),
                             aux_sum.item()], dtype=torch.float64)
        total = loss_sum + aux_weight * aux_sum
        # DDP averages the processes' gradients: this makes them the gradient of the whole batch's mean loss
        return total * (world_size / len(index)), total.item(), sums

    record = None
    for epoch in range(start_epoch, args.epochs):
        started = time.perf_counter()

        def postfix(totals, step, index, sums):
            done = time.perf_counter() - started
            rate = (step * batch_size + len(index)) / done
            left = (steps_per_epoch - step - 1) * done / (step + 1) + \
                (args.epochs - epoch - 1) * epoch_time(history, done * steps_per_epoch / (step + 1))
            return (f"loss {totals[0] / totals[2]:.3f} acc {totals[1] / totals[2]:.3f} "
                    f"{rate:.0f} img/s, {format_seconds(left)} left")

        network.train(not args.linear_probe)                        # a probed network stays in eval mode
        totals, lr = train_epoch(
            network, optimizer, step_loss, epoch=epoch, seed=epoch_seed(args.seed, epoch), images=len(train_set),
            batch_size=batch_size, least=least, steps=steps_per_epoch, peak=args.lr, warmup_steps=warmup_steps,
            total_steps=total_steps, clip_grad=args.clip_grad, clipped=model,
            divergence=dict(args=args, kept=out / 'checkpoint', world_size=world_size, device=device),
            bar=progress(steps_per_epoch, epoch, args, main_process), postfix=postfix)
        if world_size > 1:
            torch.distributed.all_reduce(totals)
        tested = evaluate(model, test_set, mean=mean, std=std, batch_size=args.eval_batch_size, device=device,
                          amp=args.amp, rank=rank, world_size=world_size)
        seconds = time.perf_counter() - started
        elapsed += seconds
        record = dict(epoch=epoch + 1, lr=lr, train_loss=totals[0].item() / totals[2].item(),
                      train_accuracy=totals[1].item() / totals[2].item(), train_images=int(totals[2].item()),
                      **({} if aux_loss is None else {'train_aux_loss': totals[3].item() / totals[2].item()}),
                      test_loss=tested['loss'], test_accuracy=tested['accuracy'], epoch_seconds=seconds,
                      images_per_second=len(train_set) / seconds, elapsed_seconds=elapsed)
        check_weights(model, epoch=epoch, args=args, kept=out / 'checkpoint', test_loss=tested['loss'])
        history.append(record)
        if main_process:
            with open(out / 'log.jsonl', 'a') as log:
                log.write(json.dumps(record) + '\n')
            save_checkpoint(out / 'checkpoint', model=model, config=config, optimizer=optimizer,
                            state=dict(epoch=epoch + 1, elapsed=elapsed, history=history,
                                       args={k: v for k, v in vars(args).items() if k != 'given'}))
            if not args.quiet:
                write(f"epoch {epoch + 1}/{args.epochs}: train loss {record['train_loss']:.4f} "
                       f"acc {record['train_accuracy']:.4f}, {test_split} loss {record['test_loss']:.4f} "
                       f"acc {record['test_accuracy']:.4f}, {record['images_per_second']:.0f} img/s, "
                       f"{seconds:.1f} s")

    pictures = []
    if main_process and args.plots:
        pictures.append(plots.save_training_curves(
            history, out / 'curves.png', split=test_split,
            train_loss_floor=smoothed_loss_floor(args.label_smoothing, num_classes),
            note=_curves_note(args, test_split)))
        pictures += draw_inside(model, test_set, mean=mean, std=std, device=device, out=out)
    return dict(record, out=str(out), checkpoint=str(out / 'checkpoint'), test_split=test_split,
                pictures=[str(path) for path in pictures])


def check_aux_weight(args, aux_loss):
    """The weight of the model's auxiliary loss (0 without one); a ValueError for a weight that is negative or not
    finite, or given for a model that has no such loss (it would silently do nothing)."""
    for model, (_, option) in [*registry.AUX_LOSSES.items(), *registry.BUILT_AUX_LOSSES.items()]:
        weight = getattr(args, option)
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{option_flag(option)} must be a finite number >= 0, got {weight:g}")
        if option in getattr(args, 'given', ()) and (aux_loss is None or aux_loss[1] != option):
            built = registry.BUILT_AUX_LOSSES.get(model)
            raise ValueError(f"{option_flag(option)} weights the auxiliary loss of --model {model}"
                             + ('' if built is None else f" built with {option_flag(built[0])}")
                             + f"; --model {args.model}" + (' has none' if built is None or model != args.model
                                                           else f" without {option_flag(built[0])} has none"))
    return 0. if aux_loss is None else getattr(args, aux_loss[1])


def built_aux_loss(model, name):
    """(None, the weight option) when `model` (registered as `name`) is one of registry.BUILT_AUX_LOSSES built to
    return its loss, else None."""
    entry = registry.BUILT_AUX_LOSSES.get(name)
    if entry is None:
        return None
    built = getattr(model, entry[0], None)
    on = any(built) if isinstance(built, (tuple, list)) else bool(built)
    return (None, entry[1]) if on else None


def check_own_loss(args):
    """The model's entry of registry.OWN_LOSSES when its switch is on, else None; a ValueError for a switch given
    for a model that has no such loss (it would silently do nothing)."""
    for model, (_, option) in registry.OWN_LOSSES.items():
        if getattr(args, option) and model != args.model:
            raise ValueError(f"{option_flag(option)} trains --model {model} on its own loss; --model {args.model} "
                             f"has none")
    own_loss = registry.OWN_LOSSES.get(args.model)
    return own_loss if own_loss is not None and getattr(args, own_loss[1]) else None


def check_own_loss_term(args, model, own_loss):
    """The model's entry of registry.OWN_LOSS_TERMS when its own loss is on and the built model has the part that
    the term trains, else None; a ValueError for a term's weight that is negative or not finite, or given where the
    term is off (it would silently do nothing)."""
    for name, term in registry.OWN_LOSS_TERMS.items():
        option, weight = term['weight'], getattr(args, term['weight'])
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{option_flag(option)} must be a finite number >= 0, got {weight:g}")
        if option not in getattr(args, 'given', ()):
            continue
        if name != args.model:
            raise ValueError(f"{option_flag(option)} weights a term of --model {name}'s own loss; --model "
                             f"{args.model} has none")
        if own_loss is None or getattr(model, term['part'], None) is None:
            raise ValueError(f"{option_flag(option)} weights the loss of --model {name}'s {term['part']}, which "
                             f"trains only with {option_flag(registry.OWN_LOSSES[name][1])} and a model that has one")
    term = registry.OWN_LOSS_TERMS.get(args.model)
    if own_loss is None or term is None or getattr(model, term['part'], None) is None:
        return None
    return term


def _check_init(config, args, *, image_size, channels):
    """A ValueError when the --init checkpoint's network was made for images of another size or channels."""
    data = config.get('data', {})
    for name, mine in (('image_size', image_size), ('channels', channels)):
        theirs = data.get(name)
        if theirs is not None and mine is not None and not same_setting(name, mine, theirs):
            raise ValueError(f"--init {args.init} holds a network for {option_flag(name)} {theirs}, this data gives "
                             f"{mine}; pass {option_flag(name)} {theirs}")


def new_head(model, num_classes, *, name):
    """Give `model` a new zero-initialised head for `num_classes` (its reset_classifier); the head's parameters."""
    if not hasattr(model, 'reset_classifier'):
        raise ValueError(f"--init and --linear-probe need a new head, and {name} has no reset_classifier")
    before = {id(parameter) for parameter in model.parameters()}
    model.reset_classifier(num_classes)
    return [parameter for parameter in model.parameters() if id(parameter) not in before]


def _warn_few_patches(model, name, *, sample):
    """Warn when an image makes fewer than MIN_PATCHES tokens, as the recorder lays them on the image."""
    if sample.ndim != 4:                                             # signals and clips have no image grid
        return
    try:
        recorder = Recorder(model)
    except ValueError:                                               # no attention maps, no token grid
        return
    model.eval()
    with torch.no_grad():
        recorder(torch.zeros_like(sample))
    model.train()
    if recorder.grid is None:
        return
    rows, columns = recorder.grid
    height, width = sample.shape[-2:]
    if rows * columns < MIN_PATCHES:
        warn(f"a {height}x{width} image is only {rows * columns} patch(es) ({rows}x{columns}) for "
              f"{name}, so attention has next to nothing to relate (fewer than {MIN_PATCHES} patches); "
              f"use a larger --image-size or a smaller --patch-size")


# pictures


def smoothed_loss_floor(label_smoothing, num_classes):
    """The least cross-entropy against label-smoothed targets: their entropy (0 without smoothing)."""
    if label_smoothing <= 0:
        return 0.0
    low = label_smoothing / num_classes                            # every wrong class's target
    high = 1 - label_smoothing + low                               # the right class's target
    return -(high * math.log(high) + (num_classes - 1) * low * math.log(low))


def _curves_note(args, split):
    """Why the two loss curves differ, for the foot of curves.png (None when they are computed alike)."""
    kind = data_inputs(args.data)
    shifts = 'shifts in time' if kind == 'signals' else 'shifts'
    augmentation = [name for name, used in ((shifts, args.translate > 0), ('flips', args.hflip),
                                            ('mixup', args.mixup > 0)) if used]
    train = ([f'{", ".join(augmentation)} on the {kind}'] if augmentation else []) + \
        ([f'label smoothing {args.label_smoothing:g} on the targets'] if args.label_smoothing > 0 else [])
    if not train:
        return None
    return (f"train loss: {' and '.join(train)}, so it cannot fall below the dotted line and may stay above the "
            f"{split} loss;\n{split} loss: plain cross-entropy on the {split} {kind} as they are")


def uniform_attention_distance(grid, patch_size):
    """The mean attention distance of attention spread evenly over the patches: the 'global' reference line."""
    patches = grid[0] * grid[1]
    even = torch.full((1, 1, 1, patches, patches), 1.0 / patches)
    return analysis.mean_attention_distance(even, grid=grid, patch_size=patch_size).item()


def draw_inside(model, data, *, mean, std, device, out, count=8):
    """Attention rollout on `count` test images drawn from every class, the mean attention distance per head
    and the learned position embeddings' similarity; returns the paths written (none for a model without
    attention maps, or one whose image is a single patch)."""
    if data.images.ndim != 4:                                        # the pictures are of images
        return []
    try:
        recorder = Recorder(model)
    except ValueError:                                               # a model without attention maps
        return []
    index = pick_examples(data.labels, count)
    pictures = data.floats(index)
    model.eval()
    with torch.no_grad():
        outputs, attns = recorder(normalise(pictures.to(device), mean, std))
    logits = predicted_logits(outputs)
    grid, prefix = recorder.grid, recorder.num_prefix_tokens
    if grid is None or not isinstance(attns, torch.Tensor):         # maps of several shapes (CaiT, CrossViT)
        return []
    if grid[0] * grid[1] == 1:
        # every map would be one flat value: a black 'input x attention' row and a distance of 0 in every layer
        warn(f"no attention pictures: a {pictures.shape[-2]}x{pictures.shape[-1]} image is one patch for this "
              f"model, and attention over a single patch has nothing to show")
        return []
    attns = attns.float().cpu()
    rollout = analysis.attention_rollout(attns)
    weights = rollout[:, 0] if prefix else rollout.mean(dim=1)       # cls row, or the mean over patches
    maps = analysis.to_patch_grid(weights, grid=grid, num_prefix_tokens=prefix)
    titles = [f"label {data.classes[label]}\npredicted {data.classes[guess]}"
              for label, guess in zip(data.labels[index].tolist(), logits.argmax(-1).tolist())]
    written = [plots.save_attention_overlay(pictures, maps, out / 'attention.png', titles=titles)]
    token_pixels = (pictures.shape[-2] // grid[0], pictures.shape[-1] // grid[1])   # one patch's side
    distance = analysis.mean_attention_distance(attns, grid=grid, num_prefix_tokens=prefix,
                                                patch_size=token_pixels)
    written.append(plots.save_mean_attention_distance(
        distance, out / 'attention_distance.png', uniform=uniform_attention_distance(grid, token_pixels),
        title=f'Mean attention distance ({len(index)} images)'))
    table = getattr(model, 'pos_embedding', None)
    if isinstance(table, nn.Parameter) and table.shape[-2] - grid[0] * grid[1] in (0, prefix):
        similarity = analysis.position_embedding_similarity(
            table.detach().cpu(), grid=grid, num_prefix_tokens=table.shape[-2] - grid[0] * grid[1])
        written.append(plots.save_position_embedding_similarity(similarity, out / 'position_similarity.png'))
    return written


def command_line_fits(args, model_kwargs, parser):
    """`check_command_line` for a command's `main`: prints its notes (rank 0, unless --quiet) and returns True, or
    prints its one error line and returns False."""
    try:
        notes = check_command_line(args, model_kwargs, parser)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return False
    if int(os.environ.get('RANK', '0')) == 0 and not args.quiet:
        for note in notes:
            print(note, flush=True)
    return True


def epoch_count(count):
    """'1 epoch', '2 epochs'."""
    return f"{count} epoch" + ('' if count == 1 else 's')


def main(argv=None):
    parser = build_parser()
    args, model_kwargs = parse_args(argv, parser)
    if not command_line_fits(args, model_kwargs, parser):
        return 2
    return run_command(train, args, model_kwargs, command='vit_pytorch.train', summary=lambda result: (
        f"{result['test_split']} accuracy {100 * result['test_accuracy']:.2f}% after {epoch_count(result['epoch'])} "
        f"({result['elapsed_seconds']:.1f} s of training); checkpoint: {result['checkpoint']}"))


if __name__ == '__main__':
    sys.exit(main())
