"""Does self-supervised pre-training pay off with few labels? The table of docs/pretraining.md, on the digits.

    python examples/label_efficiency.py --out runs/label_efficiency

1. Pre-train the trainer's default small ViT on the 1,347 training digits without their labels, once
   per method (`python -m vit_pytorch.pretrain --method mae|simmim|mpp|dino|mp3|lejepa|esvit`, seed 0).
2. Fine-tune each pre-trained network, and the same ViT from a random initialisation, on 5 % and
   10 % of the training labels (`python -m vit_pytorch.train --init ... --label-fraction ...`), seeds
   0, 1, 2 (the seed draws the labelled subset, the head and the order), with one recipe for all;
   the table gives the test accuracy (450 held-out digits) after the last epoch, mean and spread.
3. k-NN on the frozen networks: each test digit takes the majority label of its k nearest labelled
   training digits (cosine similarity of the networks' pooled embeddings, forward_head(...,
   pre_logits=True)), with the same labelled subsets; the reference is the networks' random
   starting point (the same seed, untrained).

Every run goes through the commands' main(argv), in this process, one at a time; a run whose log is
complete is not run again, so an interrupted table continues where it stopped.

`--model NAME` runs the same protocol on another network of the commands (the trainer's small size of it), e.g.

    python examples/label_efficiency.py --model swin --methods esvit dino --out runs/label_efficiency-swin

`--model` reaches the pre-training and the from-scratch fine-tuning; a fine-tuning from a checkpoint takes its
network from there, and the k-NN's random network is built from the pre-trained checkpoints' configuration.
"""

import argparse
import json
import shlex
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vit_pytorch import pretrain, train
from vit_pytorch.checkpoint import load_model
from vit_pytorch.evaluate import load_digits, normalise
from vit_pytorch.models import build_model

METHODS = ('mae', 'simmim', 'mpp', 'dino', 'mp3', 'lejepa', 'esvit')
# the methods of DINO's recipe (its epochs, learning rate and options)
DINO_RECIPE = ('dino', 'esvit')


def log_of(folder):
    path = Path(folder) / 'log.jsonl'
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_once(command, folder, epochs, argv):
    """Run `command.main(argv + --out folder)` unless its log already has `epochs` epochs; the log."""
    if len(log_of(folder)) < epochs:
        print(f"  {folder.name}: {epochs} epochs", flush=True)
        started = time.process_time()
        # an interrupted run continues from its checkpoint; one killed before its first save starts afresh
        state = Path(folder) / ('pretrainer' if command is pretrain else 'checkpoint')
        again = ['--resume'] if state.exists() else ['--overwrite'] if log_of(folder) else []
        code = command.main([str(arg) for arg in argv] + ['--out', str(folder)] + again)
        if code != 0:
            raise SystemExit(f"{command.__name__} {' '.join(map(str, argv))} failed ({code})")
        print(f"  {folder.name}: {time.process_time() - started:.0f} CPU-s", flush=True)
    return log_of(folder)


@torch.no_grad()
def embeddings(model, images, config):
    data = config['data']
    x = normalise(images, data['mean'], data['std'])
    return F.normalize(model.forward_head(model.forward_features(x), pre_logits=True), dim=-1)


def knn_accuracy(train_features, train_labels, test_features, test_labels, k):
    """Each test row takes the majority label of its k labelled rows of highest dot product (cosine similarity for
    L2-normalised features; ties: the nearest decides); the test accuracy."""
    similarity = test_features @ train_features.T                                  # (test, labelled)
    nearest = similarity.topk(min(k, len(train_labels)), dim=1).indices
    classes = int(max(train_labels.max(), test_labels.max())) + 1
    votes = F.one_hot(train_labels[nearest], classes).sum(dim=1).float()
    votes += 1e-3 * F.one_hot(train_labels[nearest[:, 0]], classes)                 # ties: the nearest decides
    return (votes.argmax(dim=1) == test_labels).float().mean().item()


def summary(values):
    mean = 100 * statistics.mean(values)
    spread = 100 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.1f} ± {spread:.1f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='runs/label_efficiency', help='folder of every run and the results')
    parser.add_argument('--model', default=None,
                        help="the network of the commands, e.g. swin (default: theirs, the trainer's small ViT)")
    parser.add_argument('--methods', nargs='+', default=list(METHODS), choices=METHODS)
    parser.add_argument('--pretrain-epochs', type=int, default=30, help='MAE, SimMIM, MPP and MP3')
    parser.add_argument('--dino-epochs', type=int, default=15, help='DINO and EsViT (5 views an image, so 5x the cost)')
    parser.add_argument('--dino-lr', type=float, default=1.25e-4,
                        help="DINO's and EsViT's peak learning rate: the paper's 5e-4 x batch / 256")
    parser.add_argument('--dino-args', default='',
                        help="more options of DINO's and EsViT's pre-training, e.g. '--momentum-teacher 0.95'")
    parser.add_argument('--lejepa-args', default='',
                        help="more options of LeJEPA's pre-training, e.g. '--lejepa-projector batchnorm'")
    parser.add_argument('--finetune-epochs', type=int, default=30)
    parser.add_argument('--fractions', nargs='+', type=float, default=[0.05, 0.1])
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    parser.add_argument('--k', type=int, default=5, help='neighbours of the k-NN probe')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--quiet', action='store_true', help="no runs' progress bars and epoch lines")
    args = parser.parse_args(argv)
    out = Path(args.out)
    common = ['--threads', args.threads] + (['--quiet'] if args.quiet else [])
    model = [] if args.model is None else ['--model', args.model]

    checkpoints = {'scratch': None}
    for method in args.methods:
        epochs = args.dino_epochs if method in DINO_RECIPE else args.pretrain_epochs
        folder = out / f'pretrain-{method}'
        print(f"pre-training {method} for {epochs} epochs", flush=True)
        recipe = ['--lr', args.dino_lr, *shlex.split(args.dino_args)] if method in DINO_RECIPE else \
            shlex.split(args.lejepa_args) if method == 'lejepa' else []
        run_once(pretrain, folder, epochs, ['--method', method, *model, '--epochs', epochs, '--seed', 0, *recipe,
                                            *common])
        checkpoints[method] = folder / 'checkpoint'

    results = {}
    for start, checkpoint in checkpoints.items():
        for fraction in args.fractions:
            for seed in args.seeds:
                folder = out / f'finetune-{start}-{fraction:g}-seed{seed}'
                init = model if checkpoint is None else ['--init', checkpoint]
                log = run_once(train, folder, args.finetune_epochs,
                               [*init, '--label-fraction', fraction, '--epochs', args.finetune_epochs,
                                '--batch-size', 32, '--seed', seed, '--no-plots', *common])
                results.setdefault(start, {}).setdefault(f'finetune {fraction:g}', []).append(
                    log[args.finetune_epochs - 1]['test_accuracy'])

    # k-NN on frozen features: the pre-trained networks and a random one (the from-scratch row)
    train_set, test_set = load_digits('train', image_size=16), load_digits('test', image_size=16)
    for start, checkpoint in checkpoints.items():
        if checkpoint is None:                      # the networks' starting point: the same seed, no training
            _, config = load_model(next(path for path in checkpoints.values() if path is not None))
            torch.manual_seed(0)
            model = build_model(config['model'], **config['model_kwargs']).eval()
        else:
            model, config = load_model(checkpoint)
        train_features = embeddings(model, train_set.floats(), config)
        test_features = embeddings(model, test_set.floats(), config)
        for fraction in args.fractions:
            for seed in args.seeds:
                labelled = train.label_subset(train_set.labels, fraction, seed=seed)
                accuracy = knn_accuracy(train_features[labelled], train_set.labels[labelled], test_features,
                                        test_set.labels, args.k)
                results[start].setdefault(f'k-NN {fraction:g}', []).append(accuracy)

    (out / 'results.json').write_text(json.dumps(results, indent=1) + '\n')
    columns = [f'{kind} {fraction:g}' for kind in ('finetune', 'k-NN') for fraction in args.fractions]
    labelled = {fraction: len(train.label_subset(train_set.labels, fraction, seed=0)) for fraction in args.fractions}
    header = ' | '.join(f"{'fine-tune' if kind == 'finetune' else f'{args.k}-NN'}, "
                        f"{labelled[fraction]} labels ({fraction:.0%})"
                        for kind in ('finetune', 'k-NN') for fraction in args.fractions)
    lines = [f"| start | {header} |", '|---' * (len(columns) + 1) + '|']
    for start, values in results.items():
        name = 'from scratch (k-NN: random network)' if start == 'scratch' else start
        lines.append(f"| {name} | " + ' | '.join(summary(values[column]) for column in columns) + ' |')
    table = '\n'.join(lines)
    (out / 'table.md').write_text(table + '\n')
    print(table)


if __name__ == '__main__':
    main()
