"""The machinery of `python -m vit_pytorch.experiments`: the data of a grid of runs (its training images'
statistics, class subsets), one run trained and tested (`fit`, through the training command's epoch loop),
results.json of the runs finished so far (`Results`, so an interrupted grid continues), the spread over seeds
and the summary's lines for the terminal.
"""

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange

from vit_pytorch.training import loop
from vit_pytorch.training.data import ImageSet, data_source, normalise
from vit_pytorch.training.extras import require


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


def fit(model, data, plan, *, seed, device, title='', decay_positions=False, aux_loss=None, after_epoch=None):
    """Train `model` on data.train with the recipe `plan` (the training command's options, with `epochs` and
    `quiet`) and test it on data.test: the last epoch's numbers.

    Single-process, through the training command's epoch loop (`loop.train_epoch`): every epoch seeded from
    (seed, epoch), the shuffled order cut into batches with the last taking what is left. `decay_positions`
    puts the position table under weight decay as well. `aux_loss=(keyword, weight)`: the model is called with
    `keyword=True`, returns (logits, loss), and the training loss is the cross-entropy plus `weight` times that
    loss, as the training command does for registry.AUX_LOSSES. `after_epoch(epoch, model)` is called after each
    epoch (epoch counted from 1; the model left in training mode after it).
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

    def step_loss(index, generator, rng, global_step):
        images, targets = loop.augment(data.train.floats(index), data.train.labels[index], plan, generator, rng,
                                       data.num_classes)
        images, targets = normalise(images.to(device), data.mean, data.std), targets.to(device)
        if aux_loss is None:
            loss = F.cross_entropy(model(images).float(), targets, label_smoothing=plan.label_smoothing)
        else:
            keyword, weight = aux_loss
            logits, aux = model(images, **{keyword: True})
            loss = F.cross_entropy(logits.float(), targets, label_smoothing=plan.label_smoothing) + weight * aux
        return loss, loss.item(), torch.tensor([loss.item()], dtype=torch.float64)

    started = time.perf_counter()
    for epoch in range(plan.epochs):
        model.train()
        bar = loop.progress(steps_per_epoch, epoch, plan, True)
        if bar is not None:
            bar.set_description_str(f'{title} epoch {epoch + 1}/{plan.epochs}')
        loop.train_epoch(model, optimizer, step_loss, epoch=epoch, seed=loop.epoch_seed(seed, epoch),
                         images=len(data.train), batch_size=batch_size, steps=steps_per_epoch, peak=plan.lr,
                         warmup_steps=warmup_steps, total_steps=total_steps, clip_grad=plan.clip_grad, bar=bar,
                         postfix=lambda totals, step, index, sums: f'loss {sums[0].item():.3f}')
        if after_epoch is not None:
            after_epoch(epoch + 1, model)
    tested = loop.evaluate(model, data.test, mean=data.mean, std=data.std, device=device)
    return dict(test_accuracy=tested['accuracy'], test_loss=tested['loss'],
                train_seconds=round(time.perf_counter() - started, 2))


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


# a setting's spread over seeds (see `spread`), and the figures of a run that are not settings
STATISTICS = ('mean', 'std', 'min', 'max', 'n', 'seeds')
FIGURES = ('test_accuracy', 'structure', 'grid', 'parameters', 'forward_flops', 'train_flops')


def shown(value):
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
            setting = (*label, *(f'{key} {shown(value)}' for key, value in point.items()
                                 if key not in STATISTICS + FIGURES))
            if {'mean', 'std', 'n'} <= set(point):
                lines += summary_lines(point, setting)
            else:
                figures = [f"{key} {100 * value:.2f}%" if key.endswith('accuracy') else f"{key} {shown(value)}"
                           for key, value in point.items() if key in FIGURES]
                lines.append(f"{' '.join(setting)}: {', '.join(figures)}")
        return lines
    return [f"{name}: {shown(summary)}"]
