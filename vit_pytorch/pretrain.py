"""Self-supervised pre-training in one command, without labels: MAE, SimMIM, masked patch prediction, DINO,
MP3, LeJEPA, EsViT, and on clips LeVJEPA and LeVJEPAND.

    python -m vit_pytorch.pretrain --method mae             # small ViT on the 1,347 training digits
    python -m vit_pytorch.pretrain --method dino --epochs 100
    python -m vit_pytorch.pretrain --method mae --data ~/pets --image-size 64 --epochs 400
    python -m vit_pytorch.pretrain --method mae --out runs/digits-vit-mae --resume --epochs 200
    torchrun --standalone --nproc_per_node=2 -m vit_pytorch.pretrain --method simmim
    python -m vit_pytorch.train --init runs/digits-vit-mae/checkpoint            # then fine-tune it
    python -m vit_pytorch.pretrain --method levjepa --epochs 4                   # vit_nd on the moving digits
    python -m vit_pytorch.pretrain --method levjepa_nd --data clips:direction --model simple_vit_3d
    python -m vit_pytorch.pretrain --method levjepa --model levjepa --drop-ratio 0.75   # its own encoder, 3/4 dropped

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

The methods, the run and the pictures are `vit_pytorch.training.pretraining`'s (whose docstring says
how a method is added); this module parses the command line and wires them together. The wrappers
are `vit_pytorch.mae.MAE`, `vit_pytorch.simmim.SimMIM`, `vit_pytorch.mpp.MPP`,
`vit_pytorch.dino.Dino` and `vit_pytorch.mp3.MP3` (position prediction); their options have flags
here (`--masking-ratio`, `--decoder-dim`, `--norm-pix-loss`, `--mask-prob`, `--num-local-crops`,
`--teacher-temp`, ...). MAE, SimMIM, MPP and MP3 take `ViT`, `SimpleViT` and the variants with
their public face (see each wrapper); DINO takes every image model of the package. DINO's
teacher temperature rises linearly from `--teacher-temp` to `--final-teacher-temp` over
`--warmup-teacher-temp-epochs`, and its EMA decay from `--momentum-teacher` to 1 along a cosine,
and its head's last layer is not updated during the first `--freeze-last-layer` epochs, as in the
paper's code (its weight-decay schedule is left out).

LeVJEPA and LeVJEPAND (`--method levjepa`, `--method levjepa_nd`) pre-train a clip model on clips (`--data
clips:digit`, their default, or `clips:direction`; `--model vit_nd`, their default, or any model for clips) with
examples/levjepa_clips.py's recipe: `--local-views` views of each clip (`--local-size` their side, for LeVJEPA and a
model that takes smaller clips), SIGReg weighted by `--sigreg-loss-weight`. They read the model's pooled embedding.
`--model levjepa` is LeVJEPA's own block-causal encoder (`--model levjepa_nd` its N-D one, in tubelets), which drops
`--drop-ratio` of each view's patch tokens in training (0.5 by default; every token in evaluation); the other clip
models keep every token and refuse `--drop-ratio`. Image methods refuse clips, and clip methods images, naming the
flags.

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
                loads it. For DINO it is the teacher's network, which the paper evaluates; for MP3
                the ViT, whose position embedding it never used (as initialised); for LeVJEPA and
                LeVJEPAND the clip model (`--init` it with the same --data kind and --image-size).
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
import os
import sys

import torch

from vit_pytorch import plots
from vit_pytorch.train import command_line_fits, data_inputs, epoch_count
from vit_pytorch.train import parse_args as parse_training_args
from vit_pytorch.training import pretraining, registry
from vit_pytorch.training.checkpoints import save_checkpoint
from vit_pytorch.training.loop import HelpFormatter, run_command, setup_distributed
# the methods' machinery, at the paths it had when this module held it
from vit_pytorch.training.pretraining import build_learner, dino_schedule, reconstructions  # noqa: F401

# the methods' names when this module was imported; the parser reads pretraining.METHODS as it is then
METHODS = tuple(pretraining.METHODS)
# makes every figure of a run (tests wrap it to read the pictures)
_figure = plots.new_figure


def build_parser():
    parser = argparse.ArgumentParser(prog='python -m vit_pytorch.pretrain', description=__doc__.split('\n\n')[0],
                                     epilog='Any other --name value is a keyword argument of the model.',
                                     formatter_class=HelpFormatter)
    parser.add_argument('--method', choices=tuple(pretraining.METHODS), default=None,
                        help='the self-supervised objective (required, except with --resume)')
    data = parser.add_argument_group('data')
    data.add_argument('--data', default='digits',
                      help="'digits', a folder with train/<class>/ or NAME:ARG (labels unused); clips:digit or "
                         "clips:direction (moving digits) for --method levjepa, levjepa_nd (default for them: "
                         "clips:digit)")
    data.add_argument('--image-size', type=int, default=None,
                      help="side in pixels, or a clip frame's (default: the data's, 16 for the digits, 32 for a "
                           "folder or clips)")
    data.add_argument('--channels', type=int, default=None,
                      help="1 gray or 3 RGB (default: the data's, 1 for the digits, 3 for a folder)")
    model = parser.add_argument_group('model')
    model.add_argument('--model', default='vit', help=f"one of {', '.join(registry.known_names())} (default: vit; "
                       "vit_nd for --method levjepa, levjepa_nd)")
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
    for title, options in pretraining.option_groups().items():      # each method's own, declared with it
        group = parser.add_argument_group(title)
        for flag, settings in options:
            group.add_argument(flag, **settings)
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
    """(arguments, model keyword arguments); `args.given` names the options the command line set (and the data and
    model a clip method chose, `args.notes` saying so)."""
    parser = build_parser()
    args, model_kwargs = parse_training_args(argv, parser)
    if args.method is None and args.resume is None:
        parser.error(f"--method is required: one of {', '.join(pretraining.METHODS)}")
    args.notes = pretraining.method_defaults(args)
    return args, model_kwargs


def check_inputs(args):
    """A ValueError naming the flags when --data does not give what --method pre-trains on (images or clips)."""
    method = pretraining.METHODS.get(args.method)
    kind = data_inputs(args.data)
    if method is None or kind == method.inputs:
        return
    clip_methods = ', '.join(name for name, entry in pretraining.METHODS.items() if entry.inputs == 'clips')
    hint = ("give --data clips:digit or clips:direction" if method.inputs == 'clips' else
            f"clips take --method {clip_methods}" if kind == 'clips' else "give images")
    raise ValueError(f"--method {args.method} pre-trains on {method.inputs}, but --data {args.data} gives {kind}: "
                     f"{hint}")


def pretrain(args, model_kwargs):
    """Run the pre-training as the arguments say; returns the last epoch's record with the output paths."""
    rank, world_size, device = setup_distributed(args.device)
    threads = torch.get_num_threads()
    try:
        with contextlib.ExitStack() as run:                       # holds --out from the run's claim to the end
            record = pretraining.pretrain(args, model_kwargs, parser=build_parser(), rank=rank,
                                          world_size=world_size, device=device, run=run, save=save_checkpoint,
                                          figure=_figure)
            if world_size > 1:
                torch.distributed.barrier()                       # the first process writes the last files
        return record
    finally:
        torch.set_num_threads(threads)
        if world_size > 1:
            torch.distributed.destroy_process_group()


def main(argv=None):
    args, model_kwargs = parse_args(argv)
    try:
        check_inputs(args)                                         # --method and --data first: the model follows
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.quiet and int(os.environ.get('RANK', '0')) == 0:
        for note in args.notes:
            print(note, flush=True)
    if not command_line_fits(args, model_kwargs, build_parser()):
        return 2
    return run_command(pretrain, args, model_kwargs, command='vit_pytorch.pretrain', summary=lambda result: (
        f"{args.method} loss {result['loss']:.4f} after {epoch_count(result['epoch'])} "
        f"({result['elapsed_seconds']:.1f} s); pre-trained network: {result['checkpoint']}"))


if __name__ == '__main__':
    sys.exit(main())
