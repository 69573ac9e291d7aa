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
argument of the model, as there (--depth 4 gives the trainer's own).

Written to --out (default runs/experiments/NAME): results.json (the settings, one record per
training run, and a summary) and NAME.png. Each run's record is written as it ends, and the same
command run again skips the runs already recorded, so an interrupted experiment continues where
it stopped; other settings in the same --out are refused, naming the differences, unless
--overwrite moves the old results to <out>/previous-<n>/ (see `vit_pytorch.run_folder`; one
command at a time holds an --out).
"""

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass
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
from vit_pytorch.training.data import ImageSet, data_source, normalise
from vit_pytorch.training.extras import MissingExtra, require
from vit_pytorch.training.loop import evaluate

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


# data


@dataclass
class Data:
    """The training and test images of `--data`, with the training images' per-channel statistics."""
    train: ImageSet
    test: ImageSet
    mean: list
    std: list
    image_size: int
    channels: int

    @property
    def num_classes(self):
        return len(self.train.classes)


def load_data(args):
    source = data_source(args.data)
    require(*source.requires, purpose=f'python -m vit_pytorch.experiments --data {args.data}', extra=source.extra)
    image_size, channels = args.image_size or source.image_size, args.channels or source.channels
    train_set = source.load('train', image_size=image_size, channels=channels)
    test_set = source.load(source.test_split, image_size=image_size, channels=channels, classes=train_set.classes)
    if train_set.images.ndim != 4:
        raise ValueError(f"the experiments take images (n, c, h, w); --data {args.data} holds inputs of shape "
                         f"{tuple(train_set.images.shape)}")
    return with_statistics(train_set, test_set)


def with_statistics(train_set, test_set):
    pixels = train_set.floats()
    return Data(train_set, test_set, mean=pixels.mean(dim=(0, 2, 3)).tolist(),
                std=pixels.std(dim=(0, 2, 3)).clamp_min(1e-6).tolist(), image_size=pixels.shape[-1],
                channels=pixels.shape[1])


def subset(data, classes, *, per_class=None, fraction=None, seed=0):
    """The images of `classes` (label numbers), relabelled 0..k-1, optionally only `per_class` of each class
    or a `fraction` of each, drawn with `seed`."""
    generator = torch.Generator().manual_seed(seed)
    chosen, labels = [], []
    for new_label, label in enumerate(classes):
        members = torch.nonzero(data.labels == label).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        count = len(members) if per_class is None and fraction is None else \
            min(len(members), per_class) if per_class is not None else max(1, round(fraction * len(members)))
        chosen.append(members[:count].sort().values)
        labels.append(torch.full((count,), new_label))
    index = torch.cat(chosen)
    return ImageSet(data.images[index], torch.cat(labels), [data.classes[label] for label in classes])


# training


def recipe(args, **changes):
    """The training recipe (the trainer's options), with `changes`."""
    settings = {name: getattr(args, name) for name in RECIPE}
    return argparse.Namespace(**{**settings, 'epochs': args.epochs, 'quiet': args.quiet, **changes})


def fit(model, data, plan, *, seed, device, title='', decay_positions=False):
    """Train `model` on data.train with the recipe `plan` and test it on data.test: the last epoch's numbers.

    Single-process, as `python -m vit_pytorch.train` trains: every epoch seeded from (seed, epoch), the
    shuffled order cut into batches with the last taking what is left. `decay_positions` puts the
    position table under weight decay as well.
    """
    model.to(device)
    groups = loop.parameter_groups(model, plan.weight_decay)
    if decay_positions:
        table = model.pos_embedding
        groups[1]['params'] = [parameter for parameter in groups[1]['params'] if parameter is not table]
        groups[0]['params'].append(table)
    optimizer = torch.optim.AdamW(groups, lr=plan.lr)
    batch_size = min(plan.batch_size, len(data.train))
    steps_per_epoch = math.ceil(len(data.train) / batch_size)
    total_steps, warmup_steps = steps_per_epoch * plan.epochs, round(plan.warmup_epochs * steps_per_epoch)
    started = time.perf_counter()
    for epoch in range(plan.epochs):
        seed_of_epoch = loop.epoch_seed(seed, epoch)
        torch.manual_seed(seed_of_epoch)
        generator, rng = torch.Generator().manual_seed(seed_of_epoch), random.Random(seed_of_epoch)
        order = torch.randperm(len(data.train), generator=generator)
        model.train()
        bar = loop.progress(steps_per_epoch, epoch, plan, True)
        if bar is not None:
            bar.set_description_str(f'{title} epoch {epoch + 1}/{plan.epochs}')
        for step, index in enumerate(loop.epoch_batches(order, batch_size)):
            images, targets = loop.augment(data.train.floats(index), data.train.labels[index], plan, generator, rng,
                                            data.num_classes)
            images, targets = normalise(images.to(device), data.mean, data.std), targets.to(device)
            lr = loop.learning_rate(epoch * steps_per_epoch + step, peak=plan.lr, warmup_steps=warmup_steps,
                                     total_steps=total_steps)
            for group in optimizer.param_groups:
                group['lr'] = lr
            loss = F.cross_entropy(model(images).float(), targets, label_smoothing=plan.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if plan.clip_grad > 0:
                nn.utils.clip_grad_norm_(model.parameters(), plan.clip_grad)
            optimizer.step()
            if bar is not None:
                bar.set_postfix_str(f'loss {loss.item():.3f}', refresh=False)
                bar.update()
        if bar is not None:
            bar.close()
    tested = evaluate(model, data.test, mean=data.mean, std=data.std, device=device)
    return dict(test_accuracy=tested['accuracy'], test_loss=tested['loss'],
                train_seconds=round(time.perf_counter() - started, 2))


def vit_config(args, model_kwargs, data, **changes):
    """The trainer's small ViT for this data (its defaults, then MODEL's, the command line's, `changes`)."""
    return registry.model_config('vit', {**MODEL, **model_kwargs, **changes}, image_size=data.image_size,
                              channels=data.channels, num_classes=data.num_classes)


def build(config, seed, *, position=None):
    torch.manual_seed(seed)
    if position is None:
        return registry.build_model('vit', **config)
    return PositionViT(position=position, **config)


# results


class Results:
    """results.json of an experiment: its settings and one record per finished run, saved as each ends."""

    def __init__(self, out, experiment, settings):
        self.path = Path(out) / 'results.json'
        self.head = dict(experiment=experiment, settings=json.loads(json.dumps(settings)))
        saved = json.loads(self.path.read_text()) if self.path.exists() else {}
        recorded = saved.get('settings', {}) if saved else self.head['settings']
        # the settings unlike those the recorded runs were trained with
        self.differences = [f"{name} {value!r} (recorded: {recorded.get(name)!r})"
                            for name, value in self.head['settings'].items() if recorded.get(name) != value]
        self.runs = [] if self.differences else saved.get('runs', [])

    def find(self, **key):
        return next((run for run in self.runs if all(run.get(name) == value for name, value in key.items())), None)

    def run(self, key, train_run, *, quiet, label):
        """The record of the run `key`: the saved one, or `train_run()`'s, saved now."""
        record = self.find(**key)
        if record is None:
            record = {**key, **train_run()}
            self.runs.append(record)
            self.save()
            if not quiet:
                loop.write(f"{label}: test accuracy {100 * record['test_accuracy']:.2f}% "
                             f"({record['train_seconds']:.0f} s)")
        return record

    def save(self, **extra):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({**self.head, 'runs': self.runs, **extra}, indent=1) + '\n')


def spread(values):
    """dict(mean, std, min, max, n) of `values` (std: the sample standard deviation, 0 for one value)."""
    values = [float(value) for value in values]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((value - mean) ** 2 for value in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return dict(mean=mean, std=std, min=min(values), max=max(values), n=len(values))


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


def structure(similarity):
    """How 2-D a similarity map (h, w, h, w) is: the mean similarity of distinct patches in one row or column
    minus that of patches sharing neither (0: no row/column structure)."""
    height, width = similarity.shape[:2]
    rows = torch.arange(height)[:, None].expand(height, width).flatten()
    columns = torch.arange(width)[None, :].expand(height, width).flatten()
    values = rearrange(similarity, 'h1 w1 h2 w2 -> (h1 w1) (h2 w2)').double()
    same_row, same_column = rows[:, None] == rows[None, :], columns[:, None] == columns[None, :]
    line = (same_row ^ same_column)                                       # one row or one column, not itself
    return (values[line].mean() - values[~same_row & ~same_column].mean()).item()


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


# a setting's spread over seeds (see `spread`), and the figures of a run that are not settings
STATISTICS = ('mean', 'std', 'min', 'max', 'n', 'seeds')
FIGURES = ('test_accuracy', 'structure', 'grid', 'parameters', 'forward_flops', 'train_flops')


def _shown(value):
    return f'{value:g}' if isinstance(value, float) else str(value)


def summary_lines(summary, label=()):
    """The summary for the terminal, one line per setting: its accuracy (mean +- std over n seeds), or its
    other figures; results.json keeps everything."""
    name = ' '.join(label)
    if isinstance(summary, dict) and {'mean', 'std', 'n'} <= set(summary):   # a spread, not pooling's 'mean' pool
        return [f"{name}: {100 * summary['mean']:.2f}% +- {100 * summary['std']:.2f} (n={summary['n']})"]
    if isinstance(summary, dict):
        return [line for key, value in summary.items() for line in summary_lines(value, (*label, str(key)))]
    if isinstance(summary, list) and summary and all(isinstance(point, dict) for point in summary):
        lines = []
        for point in summary:
            setting = (*label, *(f'{key} {_shown(value)}' for key, value in point.items()
                                 if key not in STATISTICS + FIGURES))
            if {'mean', 'std', 'n'} <= set(point):
                lines += summary_lines(point, setting)
            else:
                figures = [f"{key} {100 * value:.2f}%" if key.endswith('accuracy') else f"{key} {_shown(value)}"
                           for key, value in point.items() if key in FIGURES]
                lines.append(f"{' '.join(setting)}: {', '.join(figures)}")
        return lines
    return [f"{name}: {_shown(summary)}"]


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
