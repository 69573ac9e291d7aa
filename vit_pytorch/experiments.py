"""The ViT paper's experiments at small scale, one command each, on the digits or a folder of images.

    python -m vit_pytorch.experiments pooling       # cls token vs global average pooling over learning rates
    python -m vit_pytorch.experiments positions     # none / learned 1-D / 2-D / relative / sin-cos, 3 seeds
    python -m vit_pytorch.experiments similarity    # position-embedding similarity by patch size and weight decay
    python -m vit_pytorch.experiments transfer      # which head to fine-tune with, on new classes and few labels
    python -m vit_pytorch.experiments scaling       # accuracy against training FLOPs, model and patch size
    python -m vit_pytorch.experiments positions --data ~/pets --image-size 32 --seeds 5 --epochs 50

"An Image is Worth 16x16 Words", Dosovitskiy et al., arXiv 2010.11929: appendix D.3 (cls token or
global average pooling), D.4 (position embeddings, table 8, and their similarity under other
settings), section 3.2 with appendix B.1.1 (transfer with a zero-initialised head), section 4.2
(model and patch size). Every run trains with the training command's recipe and data
(`vit_pytorch.train`, `vit_pytorch.evaluate`): AdamW without decay on norms, biases, tables and
tokens, warm-up then cosine decay, label smoothing, random shifts; its options have the same names
and defaults, except --epochs, which each experiment sets. The model is the trainer's small ViT
at depth 2 (patch 4, width 64, 4 heads of 16, MLP 128); any other --name value is a keyword
argument of the model, as there (--depth 4 gives the trainer's own). The runs' machinery (one run
trained and tested, results.json, the spread over seeds) is `vit_pytorch.training.trials`'s; this
module holds the command line and the experiments' grids and figures.

Written to --out (default runs/experiments/NAME): results.json (the settings, one record per
training run, and a summary) and NAME.png. Each run's record is written as it ends, and the same
command run again skips the runs already recorded, so an interrupted experiment continues where
it stopped; other settings in the same --out are refused, naming the differences, unless
--overwrite moves the old results to <out>/previous-<n>/ (see `vit_pytorch.run_folder`; one
command at a time holds an --out).
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from vit_pytorch import analysis, plots, train
from vit_pytorch.flops import training_flops
from vit_pytorch.position_embeddings import KINDS
from vit_pytorch.position_embeddings import ViT as PositionViT
from vit_pytorch.training import loop, registry, run_folder
from vit_pytorch.training.checkpoints import CheckpointError, load_model, save_checkpoint
from vit_pytorch.training.data import data_source
from vit_pytorch.training.extras import MissingExtra, require
# the runs' machinery, at the paths it had when this module held it (the experiments call `fit` through here)
from vit_pytorch.training.trials import (Data, Results, fit, load_data, spread, structure, subset,  # noqa: F401
                                         summary_lines, with_statistics)

# the training command's recipe options, taken over with their defaults
RECIPE = ('batch_size', 'lr', 'weight_decay', 'warmup_epochs', 'label_smoothing', 'clip_grad', 'translate',
          'hflip', 'mixup')
# each experiment's defaults, for what the command line leaves out (sized to run in minutes on one CPU core)
EXPERIMENTS = {
    'pooling': dict(epochs=10, seeds=1, lrs=(3e-4, 1e-3, 3e-3, 1e-2)),
    'positions': dict(epochs=20, seeds=3, kinds=KINDS),
    'similarity': dict(epochs=10, seeds=1, patch_sizes=(2, 4), weight_decays=(0.0, 1.0)),
    'transfer': dict(epochs=20, seeds=3, shots=(5, 20), finetune_epochs=30, finetune_lr=1e-3, pre_logits_dim=64),
    'scaling': dict(epochs=8, seeds=1, patch_sizes=(2, 4), widths=(32, 64, 128), fractions=(0.2, 1.0)),
}
# the trainer's small ViT at half its depth, so that a grid of runs takes minutes on a CPU core
MODEL = dict(depth=2)
# the transfer arms: what is kept of the pre-training head, and how the new last layer starts
ARMS = {
    'zero_head': 'drop the whole head (hidden layer too), new zero-initialised linear',
    'random_last': 'keep the hidden layer, randomly re-initialised last layer',
    'zero_last': 'keep the hidden layer, zero-initialised last layer',
}
RUN_OPTIONS = ('out', 'overwrite', 'device', 'threads', 'quiet')


def build_parser():
    trainer = train.build_parser()
    defaults = vars(trainer.parse_known_args([])[0])
    parser = argparse.ArgumentParser(prog='python -m vit_pytorch.experiments', description=__doc__.split('\n\n')[0],
                                     epilog='Any other --name value is a keyword argument of the model.',
                                     formatter_class=loop.HelpFormatter)
    parser.add_argument('experiment', choices=sorted(EXPERIMENTS))
    parser.add_argument('--data', default='digits', help="'digits' or a folder with train/<class>/ and val/<class>/")
    parser.add_argument('--image-size', type=int, default=None,
                        help='side in pixels (default: 16 for the digits, 32 for a folder)')
    parser.add_argument('--channels', type=int, default=None, help='1 gray or 3 RGB (default: the data\'s)')
    parser.add_argument('--epochs', type=int, default=None, help='passes over the training images of every run '
                        '(default: ' + ', '.join(f"{name} {d['epochs']}" for name, d in EXPERIMENTS.items()) + ')')
    parser.add_argument('--seeds', type=int, default=None, help='seeds 0 .. N-1 of every setting (default: ' +
                        ', '.join(f"{name} {d['seeds']}" for name, d in EXPERIMENTS.items()) + ')')
    for name in RECIPE:
        flag = '--' + name.replace('_', '-')
        if isinstance(defaults[name], bool):
            parser.add_argument(flag, action='store_true', help='as in python -m vit_pytorch.train')
        else:
            parser.add_argument(flag, type=type(defaults[name]), default=defaults[name],
                                help='as in python -m vit_pytorch.train')
    grid = parser.add_argument_group('the grids (default: the experiment\'s own, see EXPERIMENTS)')
    grid.add_argument('--lrs', type=float, nargs='+', help='pooling: peak learning rates')
    grid.add_argument('--kinds', nargs='+', choices=KINDS, help='positions: position embeddings')
    grid.add_argument('--patch-sizes', type=int, nargs='+', help='similarity, scaling: patch sizes')
    grid.add_argument('--weight-decays', type=float, nargs='+',
                      help='similarity: AdamW decay, here on the position table too')
    grid.add_argument('--shots', type=int, nargs='+', help='transfer: labelled images per new class')
    grid.add_argument('--finetune-epochs', type=int, help='transfer: passes over the few labelled images')
    grid.add_argument('--finetune-lr', type=float, help='transfer: peak learning rate of fine-tuning')
    grid.add_argument('--pre-logits-dim', type=int, help='transfer: width of the pre-training head\'s hidden layer')
    grid.add_argument('--widths', type=int, nargs='+',
                      help='scaling: model widths (heads of 16 channels, MLP 2 x width, the depth stays)')
    grid.add_argument('--fractions', type=float, nargs='+',
                      help='scaling: parts of the training set, each trained for the same number of steps')
    run = parser.add_argument_group('run')
    run.add_argument('--out', default=None, help='output folder (default: runs/experiments/NAME)')
    run.add_argument('--overwrite', action='store_true',
                     help='start afresh in an --out that holds results of other settings, moving them to '
                          '<out>/previous-<n>/ (default: refuse)')
    run.add_argument('--device', default=None, help='cpu, cuda, ... (default: cuda when available)')
    run.add_argument('--threads', type=int, default=None,
                     help="CPU threads (default: 1 for the digits on CPU, else torch's)")
    run.add_argument('--quiet', action='store_true', help='no progress bars, only the summary (default: off)')
    return parser


def parse_args(argv=None):
    """(arguments with the experiment's defaults filled in, model keyword arguments)."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    for name, value in EXPERIMENTS[args.experiment].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    try:
        model_kwargs = loop.parse_model_kwargs(rest)
        check_args(args)
    except ValueError as error:
        parser.error(str(error))
    return args, model_kwargs


def check_args(args):
    for name in ('epochs', 'seeds', 'finetune_epochs', 'pre_logits_dim'):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    for name in ('patch_sizes', 'shots', 'widths'):
        for value in getattr(args, name, None) or ():
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
    for value in getattr(args, 'widths', None) or ():
        if value % 16:
            raise ValueError(f"--widths must be multiples of 16 (heads of 16 channels), got {value}")
    for value in getattr(args, 'fractions', None) or ():
        if not 0 < value <= 1:
            raise ValueError(f"--fractions must be in (0, 1], got {value}")


# training


def recipe(args, **changes):
    """The training recipe (the trainer's options), with `changes`."""
    settings = {name: getattr(args, name) for name in RECIPE}
    return argparse.Namespace(**{**settings, 'epochs': args.epochs, 'quiet': args.quiet, **changes})


def vit_config(args, model_kwargs, data, **changes):
    """The trainer's small ViT for this data (its defaults, then MODEL's, the command line's, `changes`)."""
    return registry.model_config('vit', {**MODEL, **model_kwargs, **changes}, image_size=data.image_size,
                              channels=data.channels, num_classes=data.num_classes)


def build(config, seed, *, position=None):
    torch.manual_seed(seed)
    if position is None:
        return registry.build_model('vit', **config)
    return PositionViT(position=position, **config)


# the experiments: each returns (summary, picture path)


def pooling(args, model_kwargs, data, results, device):
    """Appendix D.3: a cls token and global average pooling, each over a sweep of peak learning rates."""
    for lr in args.lrs:
        for pool in ('cls', 'mean'):
            for seed in range(args.seeds):
                config = vit_config(args, model_kwargs, data, pool=pool)
                results.run(dict(pool=pool, lr=lr, seed=seed),
                            lambda: fit(build(config, seed), data, recipe(args, lr=lr), seed=seed, device=device,
                                        title=f'{pool} lr {lr:g}'),
                            quiet=args.quiet, label=f'pool {pool}, lr {lr:g}, seed {seed}')
    summary = {pool: [dict(lr=lr, **spread(run['test_accuracy'] for run in results.runs
                                            if run['pool'] == pool and run['lr'] == lr)) for lr in args.lrs]
               for pool in ('cls', 'mean')}
    summary['best_lr'] = {pool: max(summary[pool], key=lambda point: point['mean'])['lr'] for pool in ('cls', 'mean')}
    figure = plots.new_figure(4.6, 3.3)
    axis = figure.add_subplot()
    for pool, label in (('cls', 'class token'), ('mean', 'global average pooling')):
        points = summary[pool]
        lrs = [point['lr'] for point in points]
        axis.plot(lrs, [100 * point['mean'] for point in points], marker='o', label=label)
        if args.seeds > 1:
            axis.fill_between(lrs, [100 * point['min'] for point in points], [100 * point['max'] for point in points],
                              alpha=0.2)
    axis.set_xscale('log')
    axis.set_xlabel('peak learning rate')
    axis.set_ylabel(f'{split_name(args)} accuracy (%)')
    axis.set_title(f'cls token vs GAP ({args.seeds} seed{"s" * (args.seeds > 1)}, {args.epochs} epochs)', fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return summary, plots.save_figure(figure, Path(args.out) / 'pooling.png', 100)


def positions(args, model_kwargs, data, results, device):
    """Appendix D.4, table 8: the kinds of position embedding, over seeds."""
    config = vit_config(args, model_kwargs, data)
    for kind in args.kinds:
        for seed in range(args.seeds):
            results.run(dict(position=kind, seed=seed),
                        lambda: fit(build(config, seed, position=kind), data, recipe(args), seed=seed, device=device,
                                    title=kind),
                        quiet=args.quiet, label=f'position {kind}, seed {seed}')
    summary = {kind: dict(spread(run['test_accuracy'] for run in results.runs if run['position'] == kind),
                          seeds=[run['test_accuracy'] for run in results.runs if run['position'] == kind])
               for kind in args.kinds}
    figure = plots.new_figure(4.8, 3.2)
    axis = figure.add_subplot()
    for place, kind in enumerate(args.kinds):
        axis.bar(place, 100 * summary[kind]['mean'], yerr=100 * summary[kind]['std'], color='C0', alpha=0.6,
                 capsize=3)
        axis.scatter([place] * len(summary[kind]['seeds']), [100 * value for value in summary[kind]['seeds']],
                     color='black', s=10, zorder=3)
    axis.set_xticks(range(len(args.kinds)), [KIND_NAMES[kind] for kind in args.kinds], fontsize=8)
    low = min(min(summary[kind]['seeds']) for kind in args.kinds)
    axis.set_ylim(max(0, 100 * low - 5), 100)
    axis.set_ylabel(f'{split_name(args)} accuracy (%)')
    axis.set_title(f'Position embeddings (mean and sd of {args.seeds} seeds, dots: each seed)', fontsize=9)
    axis.grid(alpha=0.3, axis='y')
    return summary, plots.save_figure(figure, Path(args.out) / 'positions.png', 100)


KIND_NAMES = {'none': 'none', 'learned': 'learned 1-D', '2d': 'learned 2-D', 'relative': 'relative',
              'sincos': 'sin-cos (fixed)'}


def similarity(args, model_kwargs, data, results, device):
    """Appendix D.4 (the figure of tables trained with other settings): the learned 1-D table's similarity."""
    seed = 0
    maps = {}
    for patch_size in args.patch_sizes:
        for weight_decay in args.weight_decays:
            config = vit_config(args, model_kwargs, data, patch_size=patch_size)

            def run():
                model = build(config, seed)
                record = fit(model, data, recipe(args, weight_decay=weight_decay), seed=seed, device=device,
                             title=f'patch {patch_size} decay {weight_decay:g}', decay_positions=True)
                grid = model.grid_size
                table = model.pos_embedding.detach().cpu()
                values = analysis.position_embedding_similarity(table, grid=grid,
                                                                num_prefix_tokens=model.num_prefix_tokens)
                return dict(record, grid=list(grid), structure=structure(values), similarity=values.tolist())

            record = results.run(dict(patch_size=patch_size, weight_decay=weight_decay), run, quiet=args.quiet,
                                 label=f'patch {patch_size}, weight decay {weight_decay:g}')
            maps[patch_size, weight_decay] = torch.tensor(record['similarity'])
    summary = [dict(patch_size=patch_size, weight_decay=weight_decay, **{
        name: value for name, value in results.find(patch_size=patch_size, weight_decay=weight_decay).items()
        if name in ('test_accuracy', 'grid', 'structure')}) for patch_size, weight_decay in maps]
    figure = plots.new_figure(2.6 * len(args.weight_decays) + 0.6, 2.7 * len(args.patch_sizes))
    axes = figure.subplots(len(args.patch_sizes), len(args.weight_decays), squeeze=False)
    for (patch_size, weight_decay), values in maps.items():
        axis = axes[args.patch_sizes.index(patch_size), args.weight_decays.index(weight_decay)]
        shown = axis.imshow(mosaic(values).numpy(), cmap='viridis', vmin=-1, vmax=1, interpolation='nearest')
        plots.axis_off(axis)
        height, width = values.shape[:2]
        score = results.find(patch_size=patch_size, weight_decay=weight_decay)['structure']
        axis.set_title(f'patch {patch_size} ({height}x{width}), decay {weight_decay:g}\nrow/column excess '
                       f'{score:.2f}', fontsize=8)
    figure.colorbar(shown, ax=axes, shrink=0.6, label='cosine similarity')
    figure.suptitle('Learned 1-D position embeddings: tile (i, j) is patch (i, j) against all', fontsize=9)
    return summary, plots.save_figure(figure, Path(args.out) / 'similarity.png', 100)


def mosaic(values):
    """(h, w, h, w) similarities as one (h (h + 1), w (w + 1)) picture of tiles, a blank line between tiles."""
    padded = F.pad(values.float(), (0, 1, 0, 1), value=float('nan'))
    return rearrange(padded, 'h1 w1 h2 w2 -> (h1 h2) (w1 w2)')


def transfer(args, model_kwargs, data, results, device):
    """Section 3.2 and appendix B.1.1: pre-train with a hidden pre-logits layer on the first half of the classes,
    fine-tune on the other half with few labels, with three ways of replacing the head."""
    half = data.num_classes // 2
    if half < 2:
        raise ValueError(f"transfer needs at least 4 classes (two halves of at least 2), got {data.num_classes}")
    old, new = list(range(half)), list(range(half, data.num_classes))
    source = with_statistics(subset(data.train, old), subset(data.test, old))
    for seed in range(args.seeds):
        config = vit_config(args, model_kwargs, source, pre_logits_dim=args.pre_logits_dim)
        checkpoint = Path(args.out) / f'pretrained-seed{seed}'

        def pretrain():
            model = build(config, seed)
            record = fit(model, source, recipe(args), seed=seed, device=device, title=f'pre-train seed {seed}')
            save_checkpoint(checkpoint, model=model, config=dict(model='vit', model_kwargs=config, data=dict(
                source=args.data, classes=source.train.classes, image_size=source.image_size,
                channels=source.channels, mean=source.mean, std=source.std)))
            return record

        results.run(dict(stage='pretrain', seed=seed), pretrain, quiet=args.quiet, label=f'pre-training, seed {seed}')
        for shots in args.shots:
            target = Data(subset(data.train, new, per_class=shots, seed=seed), subset(data.test, new),
                          mean=source.mean, std=source.std, image_size=source.image_size, channels=source.channels)
            for arm in ARMS:
                def finetune():
                    model, _ = load_model(checkpoint, device=device)
                    torch.manual_seed(seed)
                    replace_head(model, arm, len(new))
                    return fit(model, target, recipe(args, epochs=args.finetune_epochs, lr=args.finetune_lr,
                                                     weight_decay=0.0), seed=seed, device=device,
                               title=f'{arm} {shots} shots')

                results.run(dict(stage='finetune', arm=arm, shots=shots, seed=seed), finetune, quiet=args.quiet,
                            label=f'{arm}, {shots} per class, seed {seed}')
    summary = dict(pretrain=spread(run['test_accuracy'] for run in results.runs if run['stage'] == 'pretrain'))
    for shots in args.shots:
        summary[f'{shots}_shots'] = {arm: dict(spread(
            run['test_accuracy'] for run in results.runs if run.get('arm') == arm and run['shots'] == shots),
            seeds=[run['test_accuracy'] for run in results.runs if run.get('arm') == arm and run['shots'] == shots])
            for arm in ARMS}
    figure = plots.new_figure(2.4 * len(args.shots) + 1.2, 3.3)
    axes = figure.subplots(1, len(args.shots), squeeze=False)[0]
    for axis, shots in zip(axes, args.shots):
        arms = summary[f'{shots}_shots']
        for place, arm in enumerate(ARMS):
            axis.errorbar(place, 100 * arms[arm]['mean'], yerr=100 * arms[arm]['std'], fmt='o', capsize=4,
                          color=f'C{place}')
            axis.scatter([place + 0.15] * len(arms[arm]['seeds']), [100 * value for value in arms[arm]['seeds']],
                         s=8, color=f'C{place}', alpha=0.5)
        axis.set_xticks(range(len(ARMS)), ['new zero\nhead', 'hidden +\nrandom last', 'hidden +\nzero last'],
                        fontsize=7)
        axis.set_title(f'{shots} labels per new class', fontsize=9)
        axis.grid(alpha=0.3, axis='y')
    axes[0].set_ylabel(f'{split_name(args)} accuracy on the new classes (%)', fontsize=8)
    figure.suptitle(f'Transfer to new classes (mean and sd of {args.seeds} seeds)', fontsize=9)
    return summary, plots.save_figure(figure, Path(args.out) / 'transfer.png', 100)


def replace_head(model, arm, num_classes):
    """The pre-trained `model` with a new head for `num_classes` as `arm` (one of ARMS) says."""
    if arm == 'zero_head':
        model.to_latent = nn.Identity()
        model.reset_classifier(num_classes)
    elif arm == 'zero_last':
        model.reset_classifier(num_classes)
    elif arm == 'random_last':
        hidden = model.to_latent[0].out_features
        model.mlp_head = nn.Linear(hidden, num_classes, device=model.pos_embedding.device)
        model.num_classes = num_classes
    else:
        raise ValueError(f"arm must be one of {sorted(ARMS)}, got {arm!r}")
    return model


def scaling(args, model_kwargs, data, results, device):
    """Section 4.2 in miniature: widths (as from ViT-Ti to S to B: heads grow with the width, the depth stays)
    and patch sizes, on all of the training images and on a part of them, against the FLOPs of training."""
    for fraction in args.fractions:
        part = data if fraction == 1 else Data(
            subset(data.train, list(range(data.num_classes)), fraction=fraction, seed=0), data.test,
            mean=data.mean, std=data.std, image_size=data.image_size, channels=data.channels)
        epochs = round(args.epochs / fraction)                          # the same number of steps
        plan = recipe(args, epochs=epochs, warmup_epochs=args.warmup_epochs / fraction)   # and the same schedule
        for width in args.widths:
            for patch_size in args.patch_sizes:
                for seed in range(args.seeds):
                    config = vit_config(args, model_kwargs, data, patch_size=patch_size, dim=width,
                                        heads=width // 16, dim_head=16, mlp_dim=2 * width)

                    def run():
                        model = build(config, seed)
                        step, forward = training_flops(model, data.image_size, channels=data.channels,
                                                       num_classes=data.num_classes)
                        record = fit(model, part, plan, seed=seed, device=device,
                                     title=f'width {width} patch {patch_size} data {fraction:g}')
                        return dict(record, parameters=sum(p.numel() for p in model.parameters()),
                                    forward_flops=forward, train_flops=step * epochs * len(part.train),
                                    train_images=len(part.train), epochs=epochs)

                    results.run(dict(fraction=fraction, width=width, patch_size=patch_size, seed=seed), run,
                                quiet=args.quiet, label=f'width {width}, patch {patch_size}, data {fraction:g}, '
                                                        f'seed {seed}')
    summary = []
    for fraction in args.fractions:
        for width in args.widths:
            for patch_size in args.patch_sizes:
                runs = [run for run in results.runs if (run['fraction'], run['width'], run['patch_size']) ==
                        (fraction, width, patch_size)]
                summary.append(dict(fraction=fraction, width=width, patch_size=patch_size,
                                    parameters=runs[0]['parameters'], forward_flops=runs[0]['forward_flops'],
                                    train_flops=runs[0]['train_flops'],
                                    **spread(run['test_accuracy'] for run in runs)))
    figure = plots.new_figure(3.4 * len(args.fractions) + 0.4, 3.3)
    axes = figure.subplots(1, len(args.fractions), squeeze=False, sharey=True)[0]
    for axis, fraction in zip(axes, args.fractions):
        for place, patch_size in enumerate(args.patch_sizes):
            points = [point for point in summary if point['fraction'] == fraction and point['patch_size'] == patch_size]
            axis.plot([point['train_flops'] for point in points], [100 * point['mean'] for point in points],
                      marker='o', color=f'C{place}', label=f'patch {patch_size}')
            for point in points:
                axis.annotate(f"{point['width']}", (point['train_flops'], 100 * point['mean']),
                              fontsize=6, textcoords='offset points', xytext=(3, -8))
        axis.set_xscale('log')
        axis.set_xlabel('training FLOPs')
        count = [point for point in results.runs if point['fraction'] == fraction][0]['train_images']
        axis.set_title(f'{count} training images ({fraction:g})', fontsize=9)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    axes[0].set_ylabel(f'{split_name(args)} accuracy (%)')
    figure.suptitle('Model width (labels) and patch size, the same steps in both panels', fontsize=9)
    return summary, plots.save_figure(figure, Path(args.out) / 'scaling.png', 100)


def split_name(args):
    return data_source(args.data).test_split


RUNNERS = dict(pooling=pooling, positions=positions, similarity=similarity, transfer=transfer, scaling=scaling)


def run_experiment(args, model_kwargs):
    """Run `args.experiment`; returns (summary, path of the picture, path of results.json)."""
    require('safetensors', 'numpy', 'matplotlib', purpose='python -m vit_pytorch.experiments')
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    args.out = str(args.out or Path('runs') / 'experiments' / args.experiment)
    source = data_source(args.data)
    threads = torch.get_num_threads()
    try:
        if args.threads or (source.tiny and torch.device(device).type == 'cpu'):
            # as the trainer: for models this small one thread beats several on a CPU
            torch.set_num_threads(args.threads or 1)
        settings = {name: value for name, value in vars(args).items() if name not in RUN_OPTIONS}
        settings.update(model_kwargs=model_kwargs, data=source.name)
        with run_folder.locked(args.out, command=f'python -m vit_pytorch.experiments {args.experiment}'):
            run_folder.remove_unfinished_saves(args.out, ('pretrained-seed*',))
            differences = Results(args.out, args.experiment, settings).differences
            # --overwrite with the same settings starts afresh too
            run_folder.check_new_run(
                args.out, names=('results.json', '*.png', 'pretrained-seed*'),
                continuing=not differences and not args.overwrite, overwrite=args.overwrite,
                how_to_continue=f"the settings it was run with (this command differs in {'; '.join(differences)})")
            data = load_data(args)
            results = Results(args.out, args.experiment, settings)
            summary, picture = RUNNERS[args.experiment](args, model_kwargs, data, results, device)
            results.save(summary=summary, picture=Path(picture).name)
    finally:
        torch.set_num_threads(threads)
    return summary, picture, results.path


def main(argv=None):
    args, model_kwargs = parse_args(argv)
    try:
        train.check_model_options(model_kwargs, 'vit', build_parser())     # one line, before any run
        summary, picture, path = run_experiment(args, model_kwargs)
    except KeyboardInterrupt:
        print(f"\ninterrupted; the finished runs are in {args.out}/results.json; the same command continues",
              file=sys.stderr)
        return 130
    except (CheckpointError, FileNotFoundError, NotADirectoryError, ValueError, MissingExtra) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print('\n'.join(summary_lines(summary)))
    print(f"all figures in {path}; picture: {picture}", flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
