"""Self-supervised pre-training in one command: MAE, SimMIM, masked patch prediction or DINO, without labels.

    python -m vit_pytorch.pretrain --method mae             # small ViT on the 1,347 training digits
    python -m vit_pytorch.pretrain --method dino --epochs 100
    python -m vit_pytorch.pretrain --method mae --data ~/pets --image-size 64 --epochs 400
    python -m vit_pytorch.pretrain --method mae --out runs/digits-vit-mae --resume --epochs 200
    torchrun --standalone --nproc_per_node=2 -m vit_pytorch.pretrain --method simmim
    python -m vit_pytorch.train --init runs/digits-vit-mae/checkpoint            # then fine-tune it

The command follows the training command's conventions (`vit_pytorch.train`): the same data
(`--data digits`, a folder with train/<class>/, or a registered NAME:ARG source of images; the
labels are never read), the same model options (`--model` and any other `--name value` as a
keyword argument of the model, the trainer's small default size filling in), the same
normalisation (the training images' mean and standard deviation), AdamW with weight decay on
weight matrices only, linear warm-up then cosine decay, random shifts by up to `--translate`
pixels (and flips with `--hflip`) for the masked methods (DINO makes its own crops), every epoch
seeded from (seed, epoch) so that `--resume` continues exactly as if the run had never stopped,
and DistributedDataParallel under torchrun: each process takes its part of every batch and its
loss is weighted so that the gradient is that of the whole batch's mean loss (the masks and crops
each process draws are its own, so 2 processes do not retrace the path of 1 exactly).

The wrappers are `vit_pytorch.mae.MAE`, `vit_pytorch.simmim.SimMIM`, `vit_pytorch.mpp.MPP` and
`vit_pytorch.dino.Dino`; their options have flags here (`--masking-ratio`, `--decoder-dim`,
`--norm-pix-loss`, `--mask-prob`, `--num-local-crops`, `--teacher-temp`, ...). MAE, SimMIM and MPP
take `ViT`, `SimpleViT` and the variants with their public face (see each wrapper); DINO takes
every image model of the package. DINO's teacher temperature rises linearly from `--teacher-temp`
to `--final-teacher-temp` over `--warmup-teacher-temp-epochs`, and its EMA decay from
`--momentum-teacher` to 1 along a cosine, and its head's last layer is not updated during the first
`--freeze-last-layer` epochs, as in the paper's code (its weight-decay schedule is left out).

A resumed run takes its data, model, method and recipe from pretrainer/; `--epochs` may grow and
`--lr` may change (the new peak for the remaining steps); any other option given with a value
unlike the run's is refused with both values.

Written to --out (default runs/<data>-<model>-<method>):
  log.jsonl     one JSON line per epoch: loss, learning rate, seconds, images/s; DINO adds its
                teacher temperature and decay, and the signs of collapse (`dino.collapse_entropies`):
                the teacher's mean entropy per image and the entropy of its mean output (per batch), beside
                ln K (both near ln K: collapsed to uniform outputs; the first near 0 with the second
                small: collapsed to one output)
  checkpoint/   the pre-trained network in the training command's format (model.safetensors +
                config.json, its classifier head as built and never trained): `python -m
                vit_pytorch.train --init <out>/checkpoint` fine-tunes it (or `--linear-probe`
                trains only a new head on its frozen features), `vit_pytorch.checkpoint.load_model`
                loads it. For DINO it is the teacher's network, which the paper evaluates.
  pretrainer/   the whole wrapper (decoder, heads, DINO's student and teacher) with the optimizer
                and the run's state, for --resume
  curves.png    the loss per epoch
  reconstructions.png  (MAE, SimMIM) test images, masked, and reconstructed, as MAE's figure 2
  attention.png (DINO, a model with a cls token) the last layer's cls attention per head on test images

As in the training command, one run at a time holds --out, a new run over another's files is
refused unless --resume or --overwrite (which moves them to <out>/previous-<n>/) is given, and a
model with BatchNorm trains on no last batch of fewer than 2 images per process.
"""

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

from vit_pytorch import analysis
from vit_pytorch.recorder import Recorder
from vit_pytorch.train import command_line_fits, epoch_count, pick_examples
from vit_pytorch.train import parse_args as parse_training_args
from vit_pytorch.training import registry, run_folder
from vit_pytorch.training.registry import model_config
from vit_pytorch.training.checkpoints import (CheckpointError, load_config, load_training_state, load_weights,
                                              save_checkpoint)
from vit_pytorch.training.data import data_source, normalise
from vit_pytorch.training.loop import (HelpFormatter, autocast, check_batches, check_step, check_weights,
                                       epoch_batches, epoch_seed, learning_rate, least_batch, parameter_groups,
                                       progress, require_extras, restore_arguments, run_command, run_name,
                                       setup_distributed, share, translate, write)

METHODS = ('mae', 'simmim', 'mpp', 'dino')
# the methods that predict hidden patches and see shifted (and flipped) images; DINO makes its own crops
MASKED = ('mae', 'simmim', 'mpp')
# what a run writes to --out (see run_folder): a new run over any of them is refused unless --overwrite
RUN_FILES = ('checkpoint', 'checkpoint.old', 'pretrainer', 'pretrainer.old', 'log.jsonl', 'curves.png',
             'reconstructions.png', 'attention.png')


def build_parser():
    parser = argparse.ArgumentParser(prog='python -m vit_pytorch.pretrain', description=__doc__.split('\n\n')[0],
                                     epilog='Any other --name value is a keyword argument of the model.',
                                     formatter_class=HelpFormatter)
    parser.add_argument('--method', choices=METHODS, default=None,
                        help='the self-supervised objective (required, except with --resume)')
    data = parser.add_argument_group('data')
    data.add_argument('--data', default='digits',
                      help="'digits', a folder with train/<class>/ or NAME:ARG (labels unused)")
    data.add_argument('--image-size', type=int, default=None,
                      help="side in pixels (default: the data's, 16 for the digits, 32 for a folder)")
    data.add_argument('--channels', type=int, default=None,
                      help="1 gray or 3 RGB (default: the data's, 1 for the digits, 3 for a folder)")
    model = parser.add_argument_group('model')
    model.add_argument('--model', default='vit', help=f"one of {', '.join(registry.known_names())}")
    recipe = parser.add_argument_group('recipe')
    recipe.add_argument('--epochs', type=int, default=100,
                        help='passes over the images; with --resume, more than before extends the run')
    recipe.add_argument('--batch-size', type=int, default=64,
                        help="images per step over all processes together; an epoch's last batch takes what is left")
    recipe.add_argument('--lr', type=float, default=1e-3,
                        help='peak learning rate; with --resume, the peak for the remaining steps')
    recipe.add_argument('--weight-decay', type=float, default=0.05, help='AdamW decay of the weight matrices')
    recipe.add_argument('--warmup-epochs', type=float, default=5, help='linear warm-up before the cosine decay')
    recipe.add_argument('--clip-grad', type=float, default=3.0, help='max gradient norm (0: off)')
    recipe.add_argument('--translate', type=int, default=2,
                        help='MAE, SimMIM, MPP: random shift by up to this many pixels')
    recipe.add_argument('--hflip', action='store_true', help='MAE, SimMIM, MPP: random horizontal flips')
    recipe.add_argument('--amp', action='store_true', help='bf16 autocast, mixed precision')
    recipe.add_argument('--seed', type=int, default=0,
                        help="seeds the initialisation and each epoch's order, masks, crops and augmentation")
    masked = parser.add_argument_group('MAE, SimMIM, MPP')
    masked.add_argument('--masking-ratio', type=float, default=None,
                        help='MAE, SimMIM: the fraction of patches hidden (default: MAE 0.75, SimMIM 0.5)')
    masked.add_argument('--decoder-dim', type=int, default=None, help="MAE decoder width (default: the model's)")
    masked.add_argument('--decoder-depth', type=int, default=2, help='MAE decoder layers')
    masked.add_argument('--decoder-heads', type=int, default=4, help='MAE decoder heads')
    masked.add_argument('--norm-pix-loss', action='store_true', help='MAE: targets normalised per patch')
    masked.add_argument('--mask-prob', type=float, default=0.5, help='MPP: the fraction of patches corrupted')
    dino = parser.add_argument_group('DINO')
    dino.add_argument('--num-classes-k', type=int, default=1024, help='outputs of the projection head (K)')
    dino.add_argument('--projection-hidden-size', type=int, default=256, help='width of the head MLP')
    dino.add_argument('--bottleneck-dim', type=int, default=64, help='width of the head bottleneck')
    dino.add_argument('--num-local-crops', type=int, default=2, help='small crops the student sees')
    dino.add_argument('--local-image-size', type=int, default=None,
                      help='side of the local crops (default: the image size; smaller needs a model that takes it)')
    dino.add_argument('--teacher-temp', type=float, default=0.04, help="the teacher's first temperature")
    dino.add_argument('--final-teacher-temp', type=float, default=0.07, help="the teacher's temperature after warm-up")
    dino.add_argument('--warmup-teacher-temp-epochs', type=float, default=None,
                      help='epochs of teacher temperature warm-up (default: 30%% of --epochs)')
    dino.add_argument('--student-temp', type=float, default=0.1, help="the student's temperature")
    dino.add_argument('--momentum-teacher', type=float, default=0.996, help='first EMA decay of the teacher')
    dino.add_argument('--freeze-last-layer', type=float, default=1,
                      help="epochs during which the head's last layer is not updated (the paper's code: 1)")
    run = parser.add_argument_group('run')
    run.add_argument('--out', default=None, help='output folder (default: runs/<data>-<model>-<method>)')
    run.add_argument('--resume', nargs='?', const='auto', default=None,
                     help='continue the run in --out, or the one whose pretrainer/ folder is given '
                          '(default: start a new run)')
    run.add_argument('--overwrite', action='store_true',
                     help='start a new run in an --out that holds another, moving its files to '
                          '<out>/previous-<n>/ (default: refuse)')
    run.add_argument('--device', default=None, help='cpu, cuda, cuda:1, ... (default: cuda when available)')
    run.add_argument('--threads', type=int, default=None,
                     help="CPU threads per process (default: 1 for the digits on CPU, else torch's)")
    run.add_argument('--no-plots', dest='plots', action='store_false', help='skip the PNG pictures (default: draw them)')
    run.add_argument('--quiet', action='store_true', help='no progress bars, only the final result (default: off)')
    return parser


def parse_args(argv=None):
    """(arguments, model keyword arguments); `args.given` names the options the command line set."""
    parser = build_parser()
    args, model_kwargs = parse_training_args(argv, parser)
    if args.method is None and args.resume is None:
        parser.error(f"--method is required: one of {', '.join(METHODS)}")
    return args, model_kwargs


def build_learner(args, encoder, *, image_size, mean, std):
    """The method's wrapper around `encoder`, with the options of `args`."""
    from vit_pytorch.dino import Dino
    from vit_pytorch.mae import MAE
    from vit_pytorch.mpp import MPP
    from vit_pytorch.simmim import SimMIM

    if args.method == 'mae':
        decoder_dim = args.decoder_dim or getattr(encoder, 'embed_dim', 64)   # MAE names a missing face
        return MAE(encoder=encoder, decoder_dim=decoder_dim, masking_ratio=args.masking_ratio or 0.75,
                   decoder_depth=args.decoder_depth, decoder_heads=args.decoder_heads,
                   decoder_dim_head=max(1, decoder_dim // args.decoder_heads), norm_pix_loss=args.norm_pix_loss)
    if args.method == 'simmim':
        return SimMIM(encoder=encoder, masking_ratio=args.masking_ratio or 0.5)
    if args.method == 'mpp':
        return MPP(transformer=encoder, mask_prob=args.mask_prob, replace_prob=0.8, random_patch_prob=0.1, mean=mean,
                   std=std)
    return Dino(encoder, image_size, projection_hidden_size=args.projection_hidden_size,
                num_classes_K=args.num_classes_k, bottleneck_dim=args.bottleneck_dim,
                student_temp=args.student_temp, teacher_temp=args.teacher_temp,
                moving_average_decay=args.momentum_teacher, global_lower_crop_scale=0.4,
                num_local_crops=args.num_local_crops,
                local_image_size=args.local_image_size, mean=mean, std=std)


def pretrained_network(learner, method):
    """The network the run pre-trains: the encoder, or DINO's teacher network (which the paper evaluates)."""
    if method == 'dino':
        return learner.teacher.net
    return learner.transformer if method == 'mpp' else learner.encoder


def dino_schedule(args, global_step, steps_per_epoch, total_steps):
    """(teacher temperature, EMA decay) at this step: linear temperature warm-up, cosine rise of the decay to 1."""
    warmup = args.warmup_teacher_temp_epochs
    warmup_steps = (0.3 * args.epochs if warmup is None else warmup) * steps_per_epoch
    progress = min(1.0, global_step / warmup_steps) if warmup_steps > 0 else 1.0
    temperature = args.teacher_temp + (args.final_teacher_temp - args.teacher_temp) * progress
    decay = 1 - (1 - args.momentum_teacher) * (math.cos(math.pi * global_step / total_steps) + 1) / 2
    return temperature, decay


def pretrain(args, model_kwargs):
    """Run the pre-training as the arguments say; returns the last epoch's record with the output paths."""
    rank, world_size, device = setup_distributed(args.device)
    threads = torch.get_num_threads()
    try:
        with contextlib.ExitStack() as run:                       # holds --out from _pretrain's claim to the end
            record = _pretrain(args, model_kwargs, rank, world_size, device, run)
            if world_size > 1:
                torch.distributed.barrier()                       # the first process writes the last files
        return record
    finally:
        torch.set_num_threads(threads)
        if world_size > 1:
            torch.distributed.destroy_process_group()


def _pretrain(args, model_kwargs, rank, world_size, device, run):
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
        args, model_kwargs = restore_arguments(args, model_kwargs, resumed, parser=build_parser())
    source = data_source(args.data)
    require_extras('python -m vit_pytorch.pretrain', args, source)
    out = Path(args.out or Path('runs') / f'{run_name(args)}-{args.method}')
    args.out = str(out)
    run.enter_context(run_folder.claimed(
        out, command='python -m vit_pytorch.pretrain', names=RUN_FILES, checkpoints=('checkpoint', 'pretrainer'),
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
    if pixels.ndim != 4:
        raise ValueError(f"--data {args.data} gives inputs of shape {tuple(pixels.shape[1:])}; pre-training takes "
                         f"images (c, h, w)")
    image_size = image_size or tuple(pixels.shape[2:])
    channels = channels or pixels.shape[1]
    mean = pixels.mean(dim=(0, 2, 3)).tolist()
    std = pixels.std(dim=(0, 2, 3)).clamp_min(1e-6).tolist()

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
        learner = build_learner(args, encoder, image_size=image_size, mean=mean, std=std).to(device)
    except TypeError as error:
        raise ValueError(f"--method {args.method} cannot pre-train --model {args.model}: {error}") from error
    config = dict(model=args.model, model_kwargs=kwargs, pretraining=dict(method=args.method),
                  data=dict(source=source.name, test_split=source.test_split, image_size=image_size,
                            channels=channels, classes=train_set.classes, mean=mean, std=std))
    betas = (0.9, 0.999) if args.method == 'dino' else (0.9, 0.95)   # each paper's AdamW
    optimizer = torch.optim.AdamW(parameter_groups(learner, args.weight_decay), lr=args.lr, betas=betas)
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
    steps_per_epoch = len(epoch_batches(torch.arange(len(train_set)), batch_size, least))
    total_steps = steps_per_epoch * args.epochs
    warmup_steps = round(args.warmup_epochs * steps_per_epoch)
    if main_process:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / 'log.jsonl', 'w') as log:                    # rewritten: a resumed run drops lost epochs
            log.writelines(json.dumps(record) + '\n' for record in history)
        if not args.quiet:
            count = sum(p.numel() for p in encoder.parameters())
            print(f"{args.method} pre-training of {args.model} ({count:,} parameters) on {len(train_set)} unlabelled "
                  f"{args.data} images, {image_size}px; {world_size} process(es) on {device}; writing to {out}"
                  + (f"; resumed after epoch {start_epoch}" if start_epoch else ''), flush=True)
            if merged:
                print(f"note: {merged}", flush=True)

    record = None
    for epoch in range(start_epoch, args.epochs):
        started = time.perf_counter()
        seed = epoch_seed(args.seed, epoch)
        torch.manual_seed(seed)                                      # masks, crops, anything drawn globally
        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(train_set), generator=generator)
        totals = torch.zeros(2, dtype=torch.float64)                 # loss sum, count (this process)
        entropies = torch.zeros(2, dtype=torch.float64)              # DINO: the teacher's, summed over images
        network.train()
        bar = progress(steps_per_epoch, epoch, args, main_process)
        for step, index in enumerate(epoch_batches(order, batch_size, least)):
            images = train_set.floats(index)
            if args.method in MASKED:                                # drawn for the whole batch, as the trainer
                shifts = torch.randint(-args.translate, args.translate + 1, (len(index), 2), generator=generator)
                images = translate(images, shifts, args.translate)
                if args.hflip:
                    flip = torch.rand(len(index), generator=generator) < 0.5
                    images = torch.where(flip[:, None, None, None], images.flip(-1), images)
            images = images[share(len(index), rank, world_size)].to(device)
            if args.method in ('mae', 'simmim', 'mpp'):
                images = normalise(images, mean, std)                # MPP undoes it for its targets; DINO crops pixels
            global_step = epoch * steps_per_epoch + step
            lr = learning_rate(global_step, peak=args.lr, warmup_steps=warmup_steps, total_steps=total_steps)
            for group in optimizer.param_groups:
                group['lr'] = lr
            options = {}
            if args.method == 'dino':
                temperature, decay = dino_schedule(args, global_step, steps_per_epoch, total_steps)
                options = dict(teacher_temp=temperature)
            with autocast(device, args.amp):
                loss_mean = network(images, **options).float()
            # DDP averages the processes' gradients: this makes them the gradient of the whole batch's mean loss
            loss = loss_mean * (len(images) * world_size / len(index))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if args.method == 'dino' and epoch < args.freeze_last_layer:
                learner.cancel_last_layer_gradients()
            # the norm is measured anyway (inf: no clipping); a NaN or infinite one would poison every weight
            grad_norm = nn.utils.clip_grad_norm_(learner.parameters(),
                                                 args.clip_grad if args.clip_grad > 0 else math.inf)
            check_step(loss.item(), grad_norm.item(), epoch=epoch, step=step, steps=steps_per_epoch, lr=lr, args=args,
                       kept=out / 'pretrainer', world_size=world_size, device=device, what=f'{args.method} loss')
            optimizer.step()
            if args.method == 'dino':
                learner.update_moving_average(decay=decay)
            totals += torch.tensor([loss_mean.item() * len(images), len(images)], dtype=torch.float64)
            if args.method == 'dino':
                entropies += torch.tensor(learner.last_entropies, dtype=torch.float64) * len(images)
            if bar is not None:
                bar.set_postfix_str(f"loss {totals[0] / max(totals[1], 1):.4f}", refresh=False)
                bar.update()
        if bar is not None:
            bar.close()
        if world_size > 1:
            torch.distributed.all_reduce(totals)
            torch.distributed.all_reduce(entropies)
        seconds = time.perf_counter() - started
        elapsed += seconds
        record = dict(epoch=epoch + 1, lr=lr, loss=(totals[0] / totals[1]).item(), epoch_seconds=seconds,
                      images_per_second=len(train_set) / seconds, elapsed_seconds=elapsed)
        if args.method == 'dino':
            teacher_entropy, mean_entropy = (entropies / totals[1]).tolist()
            record.update(teacher_temp=temperature, teacher_decay=decay, teacher_entropy=teacher_entropy,
                          teacher_mean_entropy=mean_entropy, uniform_entropy=math.log(args.num_classes_k))
        check_weights(learner, epoch=epoch, args=args, kept=out / 'pretrainer')
        history.append(record)
        if main_process:
            with open(out / 'log.jsonl', 'a') as log:
                log.write(json.dumps(record) + '\n')
            # the network first, the resumable state last: an interruption between them resumes and rewrites both
            save_checkpoint(out / 'checkpoint', model=pretrained_network(learner, args.method), config=config)
            save_checkpoint(out / 'pretrainer', model=learner, config=config, optimizer=optimizer,
                            state=dict(epoch=epoch + 1, elapsed=elapsed, history=history,
                                       args={k: v for k, v in vars(args).items() if k != 'given'}))
            if not args.quiet:
                collapse = (f", teacher entropy {record['teacher_entropy']:.2f} (of its mean "
                            f"{record['teacher_mean_entropy']:.2f}; uniform: {record['uniform_entropy']:.2f})"
                            if args.method == 'dino' else '')
                write(f"epoch {epoch + 1}/{args.epochs}: {args.method} loss {record['loss']:.4f}{collapse}, "
                       f"{record['images_per_second']:.0f} img/s, {seconds:.1f} s")

    pictures = []
    if main_process and args.plots:
        test_set = source.load(source.test_split, image_size=image_size, channels=channels,
                               classes=train_set.classes)
        pictures.append(save_loss_curve(history, out / 'curves.png', method=args.method))
        pictures += draw(learner, args.method, test_set, mean=mean, std=std, device=device, out=out)
    return dict(record, out=str(out), checkpoint=str(out / 'checkpoint'), pictures=[str(p) for p in pictures])


# pictures


def draw(learner, method, data, *, mean, std, device, out, count=8):
    """The method's pictures of `count` test images of every class in turn: reconstructions (MAE, SimMIM),
    DINO's teacher's last-layer cls attention per head (models with a cls token); the paths written."""
    images = data.floats(pick_examples(data.labels, count)).to(device)
    learner.eval()
    with torch.no_grad():
        if method in ('mae', 'simmim'):
            masked, reconstruction, hidden = reconstructions(learner, method, normalise(images, mean, std))
            masked = torch.where(hidden, 0.5, unnormalise(masked, mean, std))       # hidden patches mid-gray
            return [save_reconstructions([images, masked, unnormalise(reconstruction, mean, std)],
                                         out / 'reconstructions.png',
                                         title=f'{method.upper() if method == "mae" else "SimMIM"}: '
                                               f'{learner.masking_ratio:.0%} of the patches hidden')]
        if method == 'dino':
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
            return [save_attention_per_head(images.cpu(), maps, out / 'attention.png',
                                            title="DINO teacher: the last layer's cls attention, per head")]
    return []


def reconstructions(learner, method, images, seed=1):
    """(masked, reconstruction, hidden) of MAE or SimMIM on normalised `images`, with a mask drawn from `seed`:
    hidden (b, c, h, w) True on the pixels of the hidden patches."""
    encoder = learner.encoder
    grid = encoder.token_grid(images.shape[-2:])
    noise = torch.rand(len(images), grid[0] * grid[1], generator=torch.Generator().manual_seed(seed))
    noise = noise.to(images.device)
    if method == 'mae':
        _, mask = learner.random_mask(len(images), noise.shape[1], device=images.device, noise=noise)
        masked, reconstruction = learner.reconstruct(images, noise=noise)
    else:
        mask = noise.argsort(dim=1).argsort(dim=1) < int(noise.shape[1] * learner.masking_ratio)
        masked, reconstruction = learner.reconstruct(images, mask=mask)
    patch_pixels = learner.patchify(images).shape[-1]
    hidden = learner.unpatchify(mask[..., None].expand(-1, -1, patch_pixels).float(), grid).bool()
    return masked, reconstruction, hidden


def unnormalise(images, mean, std):
    """Pixels in [0, 1] from normalised images (b, c, h, w)."""
    mean = torch.tensor(mean, device=images.device).view(-1, 1, 1)
    return (images * torch.tensor(std, device=images.device).view(-1, 1, 1) + mean).clamp(0, 1)


def _show(axis, image):
    image = image.detach().float().cpu().clamp(0, 1)
    if image.shape[0] == 1:
        axis.imshow(image[0], cmap='gray', vmin=0, vmax=1, interpolation='nearest')
    else:
        axis.imshow(image.permute(1, 2, 0), interpolation='nearest')
    axis.set_xticks([])
    axis.set_yticks([])


def save_reconstructions(rows, path, *, title=None, dpi=100):
    """Three rows of images (original, masked, reconstruction), one column per image, as MAE's figure 2."""
    figure = _figure(1.1 * rows[0].shape[0] + 0.3, 3.6 + (0.3 if title else 0))
    axes = figure.subplots(3, rows[0].shape[0], squeeze=False)
    for row, (images, label) in enumerate(zip(rows, ('original', 'masked', 'reconstruction'))):
        for column, image in enumerate(images):
            _show(axes[row][column], image)
        axes[row][0].set_ylabel(label, fontsize=8)
    if title:
        figure.suptitle(title, fontsize=9)
    figure.savefig(path, dpi=dpi)
    return Path(path)


def save_attention_per_head(images, maps, path, *, title=None, dpi=100):
    """One row per image: the image, then each head's attention map (b, heads, h, w) on its own colour scale."""
    count, heads = maps.shape[:2]
    figure = _figure(1.1 * (heads + 1) + 0.3, 1.1 * count + (0.5 if title else 0.2))
    axes = figure.subplots(count, heads + 1, squeeze=False)
    for row in range(count):
        _show(axes[row][0], images[row])
        for head in range(heads):
            axis = axes[row][head + 1]
            axis.imshow(maps[row, head], cmap='inferno', interpolation='nearest')
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title(f'head {head + 1}', fontsize=8)
    axes[0][0].set_title('input', fontsize=8)
    if title:
        figure.suptitle(title, fontsize=9)
    figure.savefig(path, dpi=dpi)
    return Path(path)


def save_loss_curve(history, path, *, method, dpi=100):
    """The pre-training loss per epoch."""
    figure = _figure(5, 3.2)
    axis = figure.subplots()
    axis.plot([record['epoch'] for record in history], [record['loss'] for record in history])
    axis.set(xlabel='epoch', ylabel='loss', title=f'{method} pre-training loss')
    axis.grid(alpha=0.3)
    axis.xaxis.get_major_locator().set_params(integer=True)       # whole epochs: a record is one
    figure.savefig(path, dpi=dpi)
    return Path(path)


def _figure(width, height):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout='constrained')
    FigureCanvasAgg(figure)
    return figure


def main(argv=None):
    args, model_kwargs = parse_args(argv)
    if not command_line_fits(args, model_kwargs, build_parser()):
        return 2
    return run_command(pretrain, args, model_kwargs, command='vit_pytorch.pretrain', summary=lambda result: (
        f"{args.method} loss {result['loss']:.4f} after {epoch_count(result['epoch'])} "
        f"({result['elapsed_seconds']:.1f} s); pre-trained network: {result['checkpoint']}"))


if __name__ == '__main__':
    sys.exit(main())
