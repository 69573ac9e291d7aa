"""Why does DINO collapse on the digits? Short DINO runs with one change each, and what each left behind.

    python examples/dino_probes.py --out runs/dino_probes

Each probe pre-trains the trainer's default small ViT with `python -m vit_pytorch.pretrain --method dino` for
`--epochs` epochs (22 steps each) at the command's defaults (peak learning rate 1e-3) plus the probe's options,
seed 0. The table gives, at the last epoch: the loss, the teacher's mean entropy per image and the entropy of its
mean output (the command's log; both near ln K = ln 1024 = 6.93: every output uniform), and the 5-NN test
accuracy of the saved network (the teacher's) with all 1,347 training labels and with 10 % of them (seed 0's
subset), as in examples/label_efficiency.py; the first row is the untrained network, and the last line how
alike its embeddings of different digits are (their mean cosine).
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from label_efficiency import embeddings, knn_accuracy, log_of  # noqa: E402

from vit_pytorch import pretrain, train  # noqa: E402
from vit_pytorch.checkpoint import load_model  # noqa: E402
from vit_pytorch.evaluate import load_digits  # noqa: E402
from vit_pytorch.models import build_model  # noqa: E402

CONSTANT_TEMPERATURE = '--teacher-temp 0.04 --final-teacher-temp 0.04'
PROBES = {
    "the paper's recipe (EMA 0.996, temperature 0.04 to 0.07)": '',
    'temperature held at 0.04': CONSTANT_TEMPERATURE,
    'temperature held at 0.01': '--teacher-temp 0.01 --final-teacher-temp 0.01',
    'no local crops': f'{CONSTANT_TEMPERATURE} --num-local-crops 0',
    'last layer frozen throughout': f'{CONSTANT_TEMPERATURE} --freeze-last-layer 1000',
    'EMA 0.99': f'{CONSTANT_TEMPERATURE} --momentum-teacher 0.99',
    'EMA 0.95': f'{CONSTANT_TEMPERATURE} --momentum-teacher 0.95',
    'EMA 0.95, last layer frozen throughout': f'{CONSTANT_TEMPERATURE} --momentum-teacher 0.95 '
                                              f'--freeze-last-layer 1000',
}


def knn(model, config, train_set, test_set, subset):
    model.eval()
    train_features = embeddings(model, train_set.floats(), config)
    test_features = embeddings(model, test_set.floats(), config)
    every = knn_accuracy(train_features, train_set.labels, test_features, test_set.labels, 5)
    tenth = knn_accuracy(train_features[subset], train_set.labels[subset], test_features, test_set.labels, 5)
    return every, tenth


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='runs/dino_probes')
    parser.add_argument('--epochs', type=int, default=8)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--quiet', action='store_true', help="no runs' progress bars and epoch lines")
    args = parser.parse_args(argv)
    out = Path(args.out)
    train_set, test_set = load_digits('train', image_size=16), load_digits('test', image_size=16)
    subset = train.label_subset(train_set.labels, 0.1, seed=0)
    rows = []
    for index, (name, options) in enumerate(PROBES.items()):
        folder = out / f'probe{index}'
        if len(log_of(folder)) < args.epochs:
            print(f"probe {index + 1}/{len(PROBES)}: {name}, {train.epoch_count(args.epochs)}", flush=True)
            argv = ['--method', 'dino', '--epochs', str(args.epochs), '--seed', '0', '--threads', str(args.threads),
                    *(['--quiet'] if args.quiet else []), '--no-plots', '--out', str(folder), *shlex.split(options)]
            # an interrupted run continues from its checkpoint; one killed before its first save starts afresh
            argv += ['--resume'] if (folder / 'pretrainer').exists() else ['--overwrite'] if log_of(folder) else []
            if pretrain.main(argv) != 0:
                raise SystemExit(f"pretrain {' '.join(argv)} failed")
        last = log_of(folder)[-1]
        model, config = load_model(folder / 'checkpoint')
        if index == 0:
            torch.manual_seed(0)                  # the networks' starting point: the same seed, no training
            untrained = build_model(config['model'], **config['model_kwargs'])
            rows.append(('untrained network', None, *knn(untrained, config, train_set, test_set, subset)))
            features = embeddings(untrained.eval(), train_set.floats(), config)          # unit vectors
            similarity = features @ features.T
            pairs = len(features) * (len(features) - 1)
            sameness = ((similarity.sum() - similarity.diagonal().sum()) / pairs).item()
        rows.append((f"{name} (`{options}`)" if options else name, last,
                     *knn(model, config, train_set, test_set, subset)))
        print(f"  {name}: done", flush=True)
    lines = ['| probe | loss | teacher entropy | of its mean output | 5-NN, all labels | 5-NN, 10 % |',
             '|---|---|---|---|---|---|']
    for name, last, every, tenth in rows:
        logged = ('', '', '') if last is None else (f"{last['loss']:.2f}", f"{last['teacher_entropy']:.2f}",
                                                    f"{last['teacher_mean_entropy']:.2f}")
        lines.append(f"| {name} | {' | '.join(logged)} | {100 * every:.1f} | {100 * tenth:.1f} |")
    lines.append(f"\nThe untrained network's embeddings of two different training digits: mean cosine {sameness:.3f}.")
    table = '\n'.join(lines)
    (out / 'table.md').write_text(table + '\n')
    (out / 'results.json').write_text(json.dumps([dict(probe=name, last=last, knn_all=every, knn_tenth=tenth)
                                                  for name, last, every, tenth in rows], indent=1) + '\n')
    print(table)


if __name__ == '__main__':
    main()
