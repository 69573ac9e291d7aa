"""LeVJEPA's token dropping in the pre-training command: does dropping tokens make pre-training cheaper at little cost?

    python examples/levjepa_drop_ratio.py --ratios 0 0.75 --seeds 0 --epochs 1     # one short run
    # docs/pretraining.md's table: one process a seed (results.json in each --out), then the table of all three
    python examples/levjepa_drop_ratio.py --ratios 0 0.5 0.75 0.95 --seeds 0 --epochs 4 --out runs/drop-0
    python examples/levjepa_drop_ratio.py --ratios 0 0.5 0.75 0.95 --seeds 1 --epochs 4 --out runs/drop-1
    python examples/levjepa_drop_ratio.py --ratios 0 0.5 0.75 0.95 --seeds 2 --epochs 4 --out runs/drop-2
    python examples/levjepa_drop_ratio.py --summarise runs/drop-0 runs/drop-1 runs/drop-2

LeVJEPA (arXiv 2608.27395) trains its encoder on a random `1 - drop_ratio` of each view's patch tokens (95 % dropped
in its code's recipe) and claims that this makes video pre-training much cheaper. Here the pre-training command
itself runs (`python -m vit_pytorch.pretrain --method levjepa --model levjepa --drop-ratio R`, the default clips:
8 frames of 32 pixels, LeVJEPA's encoder in patches of one frame x 8 x 8 pixels, 128 patch tokens, the trainer's
small size) for each drop ratio and seed, on the 1,347 unlabelled training clips of `--data clips:digit`. Measured:
the CPU-seconds of each epoch (`time.process_time` around the command's epoch loop, one thread) and, after the
last epoch, the frozen network's probes: its pooled embedding (the cls token, every token kept, eval mode) of the
clips as the command normalised them, probed as examples/levjepa_clips.py probes (`--labels` labelled clips of each
class, 5-NN on cosine similarity and a logistic-regression probe, scored on the 450 test clips) for the digit and
the motion's direction. The same seed's model at its initialisation (the command seeds the model's weights with
`--seed`) is probed too, so every difference is paired per seed.

Prints a line per run and the table (mean +- sample std over the seeds); with `--out`, also writes the runs'
numbers to results.json there. Needs scikit-learn.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from vit_pytorch import pretrain
from vit_pytorch.checkpoint import load_model
from vit_pytorch.models import build_model
from vit_pytorch.training import pretraining
from vit_pytorch.training.data import data_source

sys.path.insert(0, str(Path(__file__).parent))
from levjepa_clips import TASKS, labelled_subset, probe_embeddings, spread  # noqa: E402


def timed_epochs(record):
    """The command's epoch loop, `pretraining.train_epoch`, wrapped to append each epoch's CPU-seconds to `record`."""
    epoch = pretraining.train_epoch

    def train_epoch(*args, **kwargs):
        started = time.process_time()
        try:
            return epoch(*args, **kwargs)
        finally:
            record.append(time.process_time() - started)
    return epoch, train_epoch


def pretrain_run(ratio, seed, args, out):
    """Run the command at `ratio` and `seed` into `out`; (the CPU-seconds of each epoch, the last epoch's record)."""
    seconds = []
    original, wrapped = timed_epochs(seconds)
    pretraining.train_epoch = wrapped
    try:
        code = pretrain.main(['--method', 'levjepa', '--model', 'levjepa', '--drop-ratio', str(ratio), '--epochs',
                              str(args.epochs), '--seed', str(seed), '--out', str(out), '--quiet', '--no-plots',
                              '--threads', '1', *args.command])
    finally:
        pretraining.train_epoch = original
    if code != 0:
        raise RuntimeError(f"the pre-training command stopped with exit code {code}")
    return seconds


def probe_data():
    """{split: (clips as the command loads them (n, 1, 8, 32, 32), {task: labels})} of the training and test clips."""
    data = {}
    for split in ('train', 'test'):
        by_task = {task: data_source(f'clips:{task}').load(split, image_size=32, channels=1) for task in TASKS}
        videos = by_task['digit'].floats()
        if not torch.equal(by_task['direction'].floats(), videos):
            raise RuntimeError("the digit and direction tasks gave other clips")
        data[split] = videos, {task: torch.as_tensor(clips.labels) for task, clips in by_task.items()}
    return data


@torch.no_grad()
def embeddings(model, videos, mean, std, batch_size=64):
    """The model's pooled embedding (n, num_features) of clips normalised as the command normalised them, eval mode."""
    model.eval()
    mean, std = torch.tensor(mean).view(-1, 1, 1, 1), torch.tensor(std).view(-1, 1, 1, 1)
    return torch.cat([model.forward_head(model.forward_features((videos[i:i + batch_size] - mean) / std),
                                         pre_logits=True) for i in range(0, len(videos), batch_size)])


def probes(model, config, data, subsets):
    """{(task, probe): test accuracy} of 5-NN and the linear probe on the model's embeddings (levjepa_clips'
    probes)."""
    mean, std = config['data']['mean'], config['data']['std']
    return probe_embeddings(lambda videos: embeddings(model, videos, mean, std), *data['train'], *data['test'],
                            subsets)


def table(results):
    """The markdown table of {drop ratio or 'random init': [(CPU-seconds of each epoch or None, {(task, probe):
    accuracy})]}, mean +- sample std over the runs (seeds)."""
    keys = [(task, probe) for task in TASKS for probe in ('5-NN', 'linear')]
    lines = ['| drop ratio | seeds | CPU-s an epoch | ' + ' | '.join(f'{task} {probe}' for task, probe in keys) + ' |',
             '|---|---|---|' + '---|' * len(keys)]
    for ratio, runs in results.items():
        cpu = spread([statistics.mean(seconds) for seconds, _ in runs], 1) if runs[0][0] is not None else '-'
        lines.append(f'| {ratio} | {len(runs)} | {cpu} | '
                     + ' | '.join(spread([scores[key] for _, scores in runs]) for key in keys) + ' |')
    return '\n'.join(lines)


def save(results, path):
    runs = {str(ratio): [dict(seconds=seconds, scores={' '.join(key): value for key, value in scores.items()})
                         for seconds, scores in entries] for ratio, entries in results.items()}
    Path(path).write_text(json.dumps(runs, indent=1))


def load(paths):
    """The runs of several results.json files (folders), merged: the same form as `table` takes."""
    results = {}
    for path in paths:
        path = Path(path) / 'results.json' if Path(path).is_dir() else Path(path)
        for ratio, entries in json.loads(path.read_text()).items():
            key = ratio if ratio == 'random init' else float(ratio)
            results.setdefault(key, []).extend(
                (entry['seconds'], {tuple(name.split(' ', 1)): value for name, value in entry['scores'].items()})
                for entry in entries)
    return dict(sorted(results.items(), key=lambda item: (isinstance(item[0], str), item[0])))


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--ratios', type=float, nargs='+', default=[0., 0.5, 0.75, 0.95])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--epochs', type=int, default=8, help='pre-training epochs of each run')
    parser.add_argument('--labels', type=int, default=10, help='labelled clips per class (default: %(default)s)')
    parser.add_argument('--out', default=None, help='folder for the runs and results.json (default: a temporary '
                                                    'one, no results.json)')
    parser.add_argument('--summarise', nargs='+', default=None, metavar='FOLDER',
                        help="print the table of the results.json in these folders (no runs)")
    parser.add_argument('command', nargs='*', help='more options for the pre-training command, after --')
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    if args.summarise:
        print(table(load(args.summarise)))
        return
    torch.set_num_threads(1)
    data = probe_data()
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.out or scratch)
        for seed in args.seeds:
            subsets = {task: labelled_subset(data['train'][1][task], args.labels, seed) for task in TASKS}
            for ratio in args.ratios:
                seconds = pretrain_run(ratio, seed, args, root / f'drop-{ratio}-seed-{seed}')
                model, config = load_model(root / f'drop-{ratio}-seed-{seed}' / 'checkpoint')
                scores = probes(model, config, data, subsets)
                results.setdefault(ratio, []).append((seconds, scores))
                print(f"seed {seed}, drop {ratio}: {statistics.mean(seconds):.1f} CPU-s an epoch "
                      f"({', '.join(f'{s:.1f}' for s in seconds)}); "
                      + ', '.join(f"{task} {probe} {100 * value:.1f}" for (task, probe), value in scores.items()),
                      flush=True)
            torch.manual_seed(seed)                          # the command's initialisation of the same seed
            initial = build_model('levjepa', **config['model_kwargs'])
            scores = probes(initial, config, data, subsets)
            results.setdefault('random init', []).append((None, scores))
            print(f"seed {seed}, random init: "
                  + ', '.join(f"{task} {probe} {100 * value:.1f}" for (task, probe), value in scores.items()),
                  flush=True)
            if args.out:
                save(results, root / 'results.json')
    print('\n' + table(results))


if __name__ == '__main__':
    main()
