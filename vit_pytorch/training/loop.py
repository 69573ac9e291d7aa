"""The training machinery the commands share (train, pretrain, experiments): parameter groups and the
learning-rate schedule, augmentation and batching, the one epoch loop (`train_epoch`) every command trains
with, the distributed set-up, the evaluation loop and autocast, the divergence checks, label subsets, progress
lines, a resumed run's arguments and the exit codes of a run.
"""

import argparse
import ast
import difflib
import importlib
import importlib.util
import json
import math
import os
import random
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import pack, rearrange, unpack
from torch import nn

from vit_pytorch.training.checkpoints import CheckpointError, load_config, load_state
from vit_pytorch.training.data import data_source, normalise
from vit_pytorch.training.extras import MissingExtra, require
from vit_pytorch.training.run_folder import warn


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, once: the value, or the help's own '(default: ...)'."""

    def _get_help_string(self, action):
        text = action.help or ''
        if '(default' in text or action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
            return text
        return f'{text} (default: %(default)s)'.lstrip()


def _value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_model_kwargs(tokens):
    """['--dim', '192', '--pool', 'mean', '--qkv-bias'] -> dict(dim=192, pool='mean', qkv_bias=True)."""
    kwargs, index = {}, 0
    while index < len(tokens):
        token = tokens[index]
        match = re.fullmatch(r'--([A-Za-z_][\w-]*)(?:=(.*))?', token)
        if match is None:
            raise ValueError(f"unrecognised argument {token!r}: model arguments look like --name value")
        name = match[1].replace('-', '_')
        if match[2] is not None:
            kwargs[name], index = _value(match[2]), index + 1
        elif index + 1 < len(tokens) and not tokens[index + 1].startswith('--'):
            kwargs[name], index = _value(tokens[index + 1]), index + 2
        else:
            kwargs[name], index = True, index + 1
    return kwargs


def command_flags(parser):
    """The long options of a command's `parser`, for `did_you_mean`."""
    return [flag for action in parser._actions for flag in action.option_strings if flag.startswith('--')]


def did_you_mean(flag, flags):
    """'did you mean --dim?' (or '--a, --b or --c') for the spellings in `flags` closest to the mistyped `flag`;
    None where none is close."""
    close = difflib.get_close_matches(flag, flags)
    if not close:
        return None
    return f"did you mean {' or '.join(close) if len(close) < 3 else ', '.join(close[:-1]) + ' or ' + close[-1]}?"


def parameter_groups(model, weight_decay):
    """AdamW groups: decay on weight matrices and kernels only; none on norms, biases, embeddings and tokens."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        # position tables and tokens are parameters themselves ('pos_embedding', 'cls_token'), not a Linear's weight
        is_embedding = re.search(r'token|embed|pos', name.rsplit('.', 1)[-1]) is not None
        (decay if parameter.ndim >= 2 and not is_embedding else no_decay).append(parameter)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]


def learning_rate(step, *, peak, warmup_steps, total_steps):
    """Linear warm-up from peak / warmup_steps to peak, then cosine decay to zero at total_steps."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def translate(images, shifts, pad):
    """Shift each image by its own (dy, dx) in [-pad, pad] pixels, filling the uncovered border with 0."""
    if pad == 0:
        return images
    batch, _, height, width = images.shape
    padded = F.pad(images, (pad, pad, pad, pad))
    rows = torch.arange(height)[None, :] + pad - shifts[:, :1]       # (b, h)
    cols = torch.arange(width)[None, :] + pad - shifts[:, 1:]        # (b, w)
    batch_index = torch.arange(batch)[:, None, None]
    padded = rearrange(padded, 'b c h w -> b h w c')
    return rearrange(padded[batch_index, rows[:, :, None], cols[:, None, :]], 'b h w c -> b c h w')


def augment(images, labels, args, generator, rng, num_classes):
    """Augmented inputs and soft targets: random shifts and optional flips of images (a clip's frames move
    alike; a signal is shifted along its length, not flipped), optional mixup."""
    batch = len(images)
    if images.ndim >= 4:
        frames, packing = pack([images], 'b * h w')                     # (b, c [frames], h, w) -> (b, n, h, w)
        shifts = torch.randint(-args.translate, args.translate + 1, (batch, 2), generator=generator)
        frames = translate(frames, shifts, args.translate)
        if args.hflip:
            flip = torch.rand(batch, generator=generator) < 0.5
            frames = torch.where(flip[:, None, None, None], frames.flip(-1), frames)
        images, = unpack(frames, packing, 'b * h w')
    elif images.ndim == 3 and args.translate:                        # signals (b, c, length): shifted in time
        shifts = torch.randint(-args.translate, args.translate + 1, (batch, 1), generator=generator)
        images = translate(images[:, :, None], F.pad(shifts, (1, 0)), args.translate)[:, :, 0]
    targets = F.one_hot(labels, num_classes).float()
    if args.mixup > 0:
        # mix each image with a partner from the batch, weight ~ Beta(a, a) (arXiv 1710.09412)
        lam = rng.betavariate(args.mixup, args.mixup)
        partner = torch.randperm(batch, generator=generator)
        images = lam * images + (1 - lam) * images[partner]
        targets = lam * targets + (1 - lam) * targets[partner]
    return images, targets


def random_sizes(images, size_range, *, multiple, generator):
    """Each image of `images` (b, c, h, w) resized (bilinear, antialiased) to its own random height and width,
    each a multiple of `multiple` (h, w) within `size_range` (MIN, MAX): a list of b images (c, h', w')."""
    low, high = size_range
    choices = [torch.arange(-(-low // step), high // step + 1) * step for step in multiple]   # sides allowed
    resized = []
    for image in images:
        side = [int(sides[torch.randint(len(sides), (1,), generator=generator)]) for sides in choices]
        resized.append(F.interpolate(image[None], size=side, mode='bilinear', antialias=True)[0])
    return resized


def check_random_size(size_range, multiple, inputs):
    """A ValueError unless --random-size MIN MAX holds a multiple of the patch (h, w) and the inputs are images."""
    low, high = size_range
    if not 1 <= low <= high:
        raise ValueError(f"--random-size MIN MAX needs 1 <= MIN <= MAX, got {low} {high}")
    if any(-(-low // step) * step > high for step in multiple):
        raise ValueError(f"--random-size {low} {high} holds no multiple of the model's patch size {tuple(multiple)}")
    if inputs.ndim != 4:
        raise ValueError(f"--random-size resizes images (b, c, h, w); this data's inputs are {tuple(inputs.shape)}")


def epoch_batches(order, batch_size, least=1):
    """The epoch's global batches: `order` cut into runs of `batch_size`, the last holding what is left; a last
    batch of fewer than `least` images joins the one before it."""
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    if len(batches) > 1 and len(batches[-1]) < least:
        batches[-2:] = [torch.cat(batches[-2:])]
    return batches


def train_epoch(network, optimizer, step_loss, *, epoch, seed, images, batch_size, least=1, steps, peak,
                warmup_steps, total_steps, clip_grad, clipped=None, divergence=None, after_backward=None,
                after_step=None, bar=None, postfix=None):
    """One epoch of training, as every command trains: seeded from `seed` (torch's global generator too, for
    dropout, masks and crops), the shuffled order of `images` cut into batches (`epoch_batches`), the learning
    rate of each step from `learning_rate`, the gradient norm of `clipped` (default: `network`) measured and
    clipped to `clip_grad` (0: measured only), then the optimizer's step, then `norm_weights_()` of every module
    of `network` that has one (nViT's weights back on the unit sphere) and `update_decorrelation_()` of every
    module that has one (decorrelated backpropagation's matrices, `vit_with_decorr` with `decorr_matrices=True`,
    which move by their own rule, not by the optimizer). Returns (totals, last learning rate).

    `step_loss(index, generator, rng, global_step)` -> (loss, checked, sums): the loss to back-propagate for the
    global batch `index` (drawing its augmentation from `generator` and `rng`, in that order every run), the
    number `check_step` checks with the gradient norm when `divergence` (its keyword arguments besides epoch,
    step, steps and lr) is given, and a float64 tensor of this step's sums; `totals` is their sum over the epoch.
    `after_backward()` runs before the gradients are clipped (DINO cancels its last layer's), `after_step(
    global_step)` after the optimizer's step (DINO's teacher follows the student); `bar` (from `progress`) shows
    `postfix(totals, step, index, sums)` after every step.
    """
    torch.manual_seed(seed)                                          # dropout, masks, anything drawn globally
    generator, rng = torch.Generator().manual_seed(seed), random.Random(seed)
    order = torch.randperm(images, generator=generator)
    clipped = network if clipped is None else clipped
    # a model whose weights live on the unit sphere (nViT, nGPT) puts them back there after every step
    renormalise = [module.norm_weights_ for module in network.modules()
                   if callable(getattr(module, 'norm_weights_', None))]
    # decorrelation matrices (vit_with_decorr) take their own step from the rows of the batch just trained on
    decorrelate = [module.update_decorrelation_ for module in network.modules()
                   if callable(getattr(module, 'update_decorrelation_', None))]
    totals = lr = None
    for step, index in enumerate(epoch_batches(order, batch_size, least)):
        global_step = epoch * steps + step
        lr = learning_rate(global_step, peak=peak, warmup_steps=warmup_steps, total_steps=total_steps)
        for group in optimizer.param_groups:
            group['lr'] = lr
        loss, checked, sums = step_loss(index, generator, rng, global_step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if after_backward is not None:
            after_backward()
        # the norm is measured anyway (inf: no clipping); a NaN or infinite one would poison every weight
        grad_norm = nn.utils.clip_grad_norm_(clipped.parameters(), clip_grad if clip_grad > 0 else math.inf)
        if divergence is not None:
            check_step(checked, grad_norm.item(), epoch=epoch, step=step, steps=steps, lr=lr, **divergence)
        optimizer.step()
        for norm_weights_ in renormalise:
            norm_weights_()
        for update_decorrelation_ in decorrelate:
            update_decorrelation_()
        if after_step is not None:
            after_step(global_step)
        totals = sums if totals is None else totals + sums
        if bar is not None:
            bar.set_postfix_str(postfix(totals, step, index, sums), refresh=False)
            bar.update()
    if bar is not None:
        bar.close()
    return totals, lr


def run_steps(images, batch_size, least, *, epochs, warmup_epochs):
    """(steps per epoch, total steps, warm-up steps) of a run over `images` training images, its epochs cut into
    batches as `epoch_batches` cuts them."""
    steps = len(epoch_batches(torch.arange(images), batch_size, least))
    return steps, steps * epochs, round(warmup_epochs * steps)


def start_log(out, history):
    """Create `out` and write its log.jsonl afresh from `history` (a resumed run drops the epochs it lost)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / 'log.jsonl', 'w') as log:
        log.writelines(json.dumps(record) + '\n' for record in history)


def least_batch(model, world_size):
    """The fewest images a global training batch of `model` may hold: 2 per process where it has BatchNorm
    (in training it normalises each channel by the batch's own statistics: one value per channel has no
    variance, and PyTorch refuses it), else 1."""
    norms = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
    return 2 * world_size if any(isinstance(module, norms) for module in model.modules()) else 1


def check_batches(least, batch_size, *, images, world_size, name):
    """A ValueError when a batch of `batch_size` from `images` training images is too small for `least`
    (see least_batch); the note to show when the epoch's last batch joins the one before, else None."""
    if batch_size < least:
        fix = (f"there are only {images} training image(s): train on more" if images < least
               else f"use --batch-size {least} or more")
        raise ValueError(f"{name} has BatchNorm layers, which in training need at least 2 images per process in "
                         f"every batch, and a batch here holds {batch_size // world_size} per process of "
                         f"{world_size}; {fix}")
    left = images % batch_size
    if 0 < left < least:
        why = (f"{name}'s BatchNorm layers need at least 2 images per process in training" if least > world_size
               else f"each of the {world_size} processes needs at least one image")
        return f"the last batch of each epoch ({left} image(s)) joins the one before: {why}"
    return None


def share(count, rank, world_size):
    """This process's contiguous part of a global batch of `count` images; the parts' sizes differ by at most one."""
    return slice(rank * count // world_size, (rank + 1) * count // world_size)


def setup_distributed(device):
    """(rank, world_size, device): one process, or one of torchrun's, with its process group started."""
    world_size = int(os.environ.get('WORLD_SIZE', '1'))
    rank, local_rank = int(os.environ.get('RANK', '0')), int(os.environ.get('LOCAL_RANK', '0'))
    if device is None:
        device = f'cuda:{local_rank}' if torch.cuda.is_available() and world_size > 1 else \
            'cuda' if torch.cuda.is_available() else 'cpu'
    if world_size > 1:
        backend = 'nccl' if torch.device(device).type == 'cuda' else 'gloo'
        if torch.device(device).type == 'cuda':
            torch.cuda.set_device(torch.device(device))
        # DDP's constructor imports torch._dynamo, which imports torch.distributed.nn.functional, whose functions
        # take `group=group.WORLD` as a default argument. Imported after init_process_group, those defaults hold
        # the process group for good: destroy_process_group cannot free it, and its gloo threads live on into
        # interpreter shutdown, where freeing it can abort the process ('terminate called without an active
        # exception'). Imported before, the defaults are None.
        importlib.import_module('torch._dynamo')
        torch.distributed.init_process_group(backend)
    return rank, world_size, device


def epoch_seed(seed, epoch):
    return seed * 1_000_003 + epoch


def run_name(args):
    source = data_source(args.data)
    data = Path(source.name).name if source.name == str(Path(args.data).expanduser().resolve()) else source.run_name
    return f"{data}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', args.model)}"


def given_options(args, parser):
    """The options the command line set: `args.given` from the command's parse_args, else those unlike the
    defaults of its `parser`."""
    if hasattr(args, 'given'):
        return set(args.given)
    defaults = vars(parser.parse_known_args([])[0])
    return {name for name, value in defaults.items() if getattr(args, name, value) != value}


def option_flag(name):
    return '--' + name.replace('_', '-')


def same_setting(name, mine, theirs):
    if name == 'data':
        return data_source(mine).name == data_source(theirs).name
    return json.loads(json.dumps(mine)) == json.loads(json.dumps(theirs))   # tuples were saved as lists


def restore_arguments(args, model_kwargs, checkpoint, *, parser):
    """The run's arguments and model kwargs from the checkpoint, with the command line's run options,
    --epochs and --lr; a ValueError names every other option given with a value unlike the run's."""
    saved = load_state(checkpoint)['args']
    config = load_config(checkpoint)
    _check_saved_arguments(args, saved, config, checkpoint)
    given, conflicts = given_options(args, parser), []
    for name, value in saved.items():
        if name in RUNTIME_ARGUMENTS or (name in given and name in CONTINUABLE_ARGUMENTS):
            continue                                                # the command line's value holds
        if name in given:
            # a size left to its default was saved as None; the checkpoint's data says what it was
            used = config.get('data', {}).get(name) if value is None and name in ('image_size', 'channels') else value
            if not same_setting(name, getattr(args, name), used):
                conflicts.append(f"{option_flag(name)} {getattr(args, name)} (the run has {used})")
        setattr(args, name, value)
    saved_kwargs = config['model_kwargs']
    for name, value in model_kwargs.items():
        if name not in saved_kwargs:
            conflicts.append(f"{option_flag(name)} {value} (the run's {args.model} was built without it)")
        elif not same_setting(name, value, saved_kwargs[name]):
            conflicts.append(f"{option_flag(name)} {value} (the run has {saved_kwargs[name]})")
    if conflicts:
        raise ValueError(
            f"cannot resume the run in {checkpoint} with {'; '.join(conflicts)}: a resumed run keeps its data, "
            f"model and recipe, and only --epochs (to extend it), --lr (for the remaining steps) and the run "
            f"options may change; leave these out, or start a new run with another --out")
    return args, saved_kwargs


def _check_saved_arguments(args, saved, config, checkpoint):
    """A CheckpointError naming state.json when a saved argument is not of the kind its option takes (a flag, a
    number, a string), or when the checkpoint's weights were saved for another model than the run's."""
    state_file = Path(checkpoint) / 'state.json'
    for name, value in saved.items():
        default = getattr(args, name, None)
        if default is not None and value is not None and _json_kind(value) != _json_kind(default):
            raise CheckpointError(f"{state_file}: the run's argument {name!r} is {value!r}, expected a "
                                  f"{_json_kind(default)} like {default!r} (corrupt, or edited by hand?)")
    if 'model' in saved and config['model'] != saved['model']:
        raise CheckpointError(
            f"the weights in {checkpoint} were saved for model {config['model']!r}, and its state.json is of a "
            f"run of {saved['model']!r}: the files' keys do not fit the model being built; were files from two "
            f"runs mixed?")


def _json_kind(value):
    """'flag', 'number', 'string' or 'list': an option that takes floats may have an integer default."""
    if isinstance(value, bool):
        return 'flag'
    if isinstance(value, (int, float)):
        return 'number'
    return 'string' if isinstance(value, str) else 'list' if isinstance(value, (list, tuple)) else 'object'


def require_extras(command, args, source):
    """Stop before anything else when a package the command needs for `args` is missing, naming all of them
    at once where they come from one extra (the data source's own extra, if another, is named after)."""
    needs = ['safetensors', 'numpy', *(['matplotlib'] if args.plots else [])]
    missing_plots = args.plots and importlib.util.find_spec('matplotlib') is None
    pictures = ' (matplotlib draws the pictures; --no-plots skips them)' if missing_plots else ''
    if source.extra == 'train':
        require(*needs, *source.requires, purpose=f'{command} --data {args.data}{pictures}')
    else:
        require(*needs, purpose=f'{command}{pictures}')
        require(*source.requires, purpose=f'{command} --data {args.data}', extra=source.extra)


def format_seconds(seconds):
    seconds = int(round(seconds))
    return f'{seconds // 60}:{seconds % 60:02d}'


class TrainingDiverged(ValueError):
    """The loss, the gradients or the weights became NaN or infinite: the run stops, nothing more is saved."""


def check_step(loss, grad_norm, *, epoch, step, steps, lr, args, kept, world_size, device, what='training loss'):
    """Raise TrainingDiverged, before the optimizer steps, when this step's loss or gradient norm is not finite
    on any process. `kept`: the checkpoint folder the run saved last (its previous epoch's)."""
    bad = not (math.isfinite(loss) and math.isfinite(grad_norm))
    if world_size > 1:                          # every process stops at the same step, or the others wait forever
        flag = torch.tensor([float(bad)], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        bad = flag.item() > 0
    if bad:
        raise TrainingDiverged(
            f"the {what} became {loss:g} (gradient norm {grad_norm:g}) at epoch {epoch + 1}, step {step + 1}/"
            f"{steps}, learning rate {lr:.3g}: {_divergence_advice(args, epoch, kept)}")


def check_weights(model, *, epoch, args, kept, test_loss=None):
    """Raise TrainingDiverged when, after an epoch, a weight (or the test loss) is NaN or infinite."""
    broken = [name for name, tensor in model.state_dict().items()
              if tensor.is_floating_point() and not torch.isfinite(tensor).all()]
    if broken:
        shown = ', '.join(broken[:3]) + (f' and {len(broken) - 3} more' if len(broken) > 3 else '')
        raise TrainingDiverged(f"after epoch {epoch + 1} the weights hold NaN or infinite values ({shown}): "
                               f"{_divergence_advice(args, epoch, kept)}")
    if test_loss is not None and not math.isfinite(test_loss):
        raise TrainingDiverged(f"after epoch {epoch + 1} the test loss is {test_loss:g}: "
                               f"{_divergence_advice(args, epoch, kept)}")


def _divergence_advice(args, epoch, kept):
    saved = f"the checkpoint of epoch {epoch} in {kept} is kept" if epoch else "no checkpoint was written"
    return (f"the run diverged, most likely because the learning rate is too high (--lr {args.lr:g}); "
            f"nothing of epoch {epoch + 1} was saved and {saved}; try a lower --lr")


def label_subset(labels, fraction, *, seed):
    """Sorted indices of a stratified random share of `labels`: round(fraction * n) of each class of n images,
    at least one, drawn with `seed`; every index for fraction 1."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"--label-fraction must be in (0, 1], got {fraction!r}")
    if fraction == 1:
        return torch.arange(len(labels))
    generator = torch.Generator().manual_seed(seed)
    chosen = []
    for label in sorted(set(labels.tolist())):
        members = torch.nonzero(labels == label).flatten()
        keep = max(1, round(fraction * len(members)))
        chosen.append(members[torch.randperm(len(members), generator=generator)[:keep]])
    return torch.cat(chosen).sort().values


def pick_examples(labels, count):
    """Indices of up to `count` images, taking the classes in turn: the first of each class, then the second, ..."""
    members = [torch.nonzero(labels == label).flatten().tolist() for label in sorted(set(labels.tolist()))]
    turns = []
    for position in range(max(map(len, members), default=0)):
        turns += [indices[position] for indices in members if position < len(indices)]
    return torch.tensor(turns[:count], dtype=torch.long)


def epoch_time(history, current):
    """Seconds an epoch takes: the mean of the logged ones, or this one's estimate."""
    recent = [record['epoch_seconds'] for record in history[-5:]]
    return sum(recent) / len(recent) if recent else current


def progress(steps, epoch, args, main_process):
    if not main_process or args.quiet:
        return None
    try:
        from tqdm import tqdm
    except ImportError:                                              # progress bars are optional
        return None
    return tqdm(total=steps, desc=f'epoch {epoch + 1}/{args.epochs}', leave=False, dynamic_ncols=True,
                mininterval=0.5)


def write(line):
    try:
        from tqdm import tqdm
        tqdm.write(line)
    except ImportError:
        print(line, flush=True)


def run_command(run, args, model_kwargs, *, command, summary):
    """A command's run (training or pre-training): an interruption or a known error becomes an exit code
    with one line on stderr; on rank 0 the last line is `summary(result)` and the pictures written."""
    try:
        result = run(args, model_kwargs)
    except KeyboardInterrupt:
        if args.out:
            print(f"\ninterrupted; continue with: python -m {command} --out {args.out} --resume", file=sys.stderr)
        return 130
    except (CheckpointError, FileNotFoundError, NotADirectoryError, ValueError, MissingExtra) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if int(os.environ.get('RANK', '0')) == 0:
        pictures = ', '.join(Path(path).name for path in result['pictures'])
        print(summary(result) + (f"; pictures in {result['out']}: {pictures}" if pictures else ''), flush=True)
    return 0


# arguments that may differ in a resumed run without changing what it computes
RUNTIME_ARGUMENTS = ('resume', 'overwrite', 'out', 'quiet', 'device', 'plots', 'eval_batch_size', 'threads')


# arguments a resumed run takes from the command line: more epochs extend it, a new peak lr sets the remaining steps
CONTINUABLE_ARGUMENTS = ('epochs', 'lr')


# evaluation


def autocast(device, enabled):
    """bf16 autocast for `--amp` (CPU and GPU alike; bf16 needs no loss scaling)."""
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=enabled)


def predicted_logits(outputs):
    """The logits to score (accuracy, test loss) from whatever a registered model's forward returns, in training
    or in eval mode alike: a tensor is the logits. A tuple whose members are all tensors of one shape is several
    heads' logits for the same images, scored by their mean: the What-Where Transformer built with `return_tokens`
    returns `WWTReturn(slot_logits, token_logits)`, as vit-pytorch 1.26.14's `wwt.WWT` does: the slot head's
    logits (the mean over the levels of the mean over the slots, its classification) and a second head's on the
    patch tokens (the mean over the patches), two predictions of the class that vit-pytorch returns side by side
    and does not combine; the trainer trains both on the labels. Any other tuple leads with the prediction and
    carries what the model adds unasked after it (wwt with `sigreg_slots`: (logits or WWTReturn, SIGReg loss),
    registry.BUILT_AUX_LOSSES; task heads' maps), whose prediction is scored as above."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if not isinstance(outputs, (tuple, list)) or not outputs:
        raise TypeError(f"a model's output must be its logits (a tensor) or a tuple leading with them, got "
                        f"{type(outputs).__name__}")
    if all(isinstance(head, torch.Tensor) and head.shape == outputs[0].shape for head in outputs):
        return outputs[0] if len(outputs) == 1 else torch.stack(tuple(outputs)).mean(dim=0)
    return predicted_logits(outputs[0])


@torch.no_grad()
def evaluate(model, data, *, mean, std, batch_size=256, device='cpu', amp=False, rank=0, world_size=1):
    """dict(loss, accuracy, correct, count) of `model` on `data`; with several processes each takes a shard."""
    was_training = model.training
    model.eval()
    shard = torch.arange(rank, len(data), world_size)
    totals = torch.zeros(3, dtype=torch.float64, device=device)       # loss sum, correct, count
    for start in range(0, len(shard), batch_size):
        index = shard[start:start + batch_size]
        images = normalise(data.floats(index).to(device), mean, std)
        labels = data.labels[index].to(device)
        with autocast(device, amp):
            logits = predicted_logits(model(images))
        totals += torch.stack([F.cross_entropy(logits.float(), labels, reduction='sum').double(),
                               (logits.argmax(dim=-1) == labels).sum().double(),
                               torch.tensor(len(index), dtype=torch.float64, device=device)])
    if world_size > 1:
        torch.distributed.all_reduce(totals)
    model.train(was_training)
    loss, correct, count = totals.tolist()
    return dict(loss=loss / max(count, 1), accuracy=correct / max(count, 1), correct=int(correct), count=int(count))

