"""Why does LeJEPA collapse on the digits? Short LeJEPA runs with one change each, measured at every epoch.

    python examples/lejepa_probes.py --out runs/lejepa_probes

Each probe pre-trains the trainer's default small ViT with `python -m vit_pytorch.pretrain --method lejepa` (as
examples/label_efficiency.py does: the command's defaults, seed 0) for `--epochs` epochs (21 steps each) plus the
probe's options. The command's default projector was vit-pytorch's when these probes were run; it is now the official
one (the probes' finding), so the probes of vit-pytorch's projector name it (`--lejepa-projector vit-pytorch`). After every epoch it measures, on the 450 test digits without augmentation (the network and
projector in eval mode): the projections' standard deviation per dimension (the mean over the dimensions; an
isotropic Gaussian, which SIGReg asks for, has 1) and their mean norm; the last projector layer's input, its
standard deviation per unit summed in quadrature (the spread the last layer can scale) and that layer's weight
norm (Frobenius); the embedding's effective rank (exp of the entropy of its normalised singular values, the
embeddings centred; Roy and Vetterli 2007, RankMe's measure); and the 5-NN test accuracy of the frozen embedding
with all 1,347 training labels and with 10 % of them (seed 0's subset), as in examples/label_efficiency.py. The
command's log gives SIGReg and the prediction loss, averaged over the epoch's steps.

Two probes change what no flag reaches (`EDITS`, applied to the learner the command builds, before its optimizer):
vit-pytorch's projector without its L2 norm, and the official projector with 4 linear layers instead of 3. The run
and its per-epoch measurement are examples/probing.py's (`run_probe`), shared with examples/esvit_probes.py.

Writes <out>/<probe>/ (the run) and <out>/<probe>.jsonl (one line per epoch: the log's record and the
measurements), and prints every epoch's values, the untrained learner's first.
"""

import argparse
import shlex
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from label_efficiency import embeddings, knn_accuracy  # noqa: E402
from probing import run_probe, untrained_learner  # noqa: E402

from vit_pytorch import train  # noqa: E402
from vit_pytorch.evaluate import load_digits, normalise  # noqa: E402
from vit_pytorch.lejepa import BatchNormMLP  # noqa: E402

PROBES = {
    'command': '--lejepa-projector vit-pytorch',  # the command as it was, vit-pytorch's projector
    'batchnorm-projector': '--lejepa-projector batchnorm',
    'no-weight-decay': '--lejepa-projector vit-pytorch --weight-decay 0',
    'lambda-0.1': '--lejepa-projector vit-pytorch --lejepa-lambda 0.1',
    'lambda-0.5': '--lejepa-projector vit-pytorch --lejepa-lambda 0.5',
    'lr-2e-3': '--lejepa-projector vit-pytorch --lr 2e-3',
    'lr-1e-4': '--lejepa-projector vit-pytorch --lr 1e-4',
    'no-local-crops': '--lejepa-projector vit-pytorch --num-local-crops 0',
    # the official projector with one more change
    'batchnorm-lambda-0.1': '--lejepa-projector batchnorm --lejepa-lambda 0.1',
    'batchnorm-lr-2e-3': '--lejepa-projector batchnorm --lr 2e-3',
    'batchnorm-no-local-crops': '--lejepa-projector batchnorm --num-local-crops 0',
}
# probes that change the learner the command builds (no flag does it), before its optimizer is made: vit-pytorch's
# projector without its L2 norm, and the official projector with vit-pytorch's 4 linear layers instead of 3
EDITS = {
    'no-l2norm': lambda learner: learner.projector.net.__setitem__(-2, nn.Identity()),
    'batchnorm-4-layers': lambda learner: setattr(learner, 'projector', BatchNormMLP(
        learner.projector.net[0].in_features, learner.projector.net[-1].out_features, 4,
        learner.projector.net[0].out_features)),
}
PROBES.update({name: '--lejepa-projector vit-pytorch' for name in EDITS})   # each edits the learner as measured


def effective_rank(features):
    """exp(entropy) of the normalised singular values of the centred features (n, d)."""
    singular = torch.linalg.svdvals(features - features.mean(dim=0))
    p = singular / singular.sum()
    return torch.exp(-(p * p.clamp_min(1e-12).log()).sum()).item()


@torch.no_grad()
def measure(learner, config, train_set, test_set, subset):
    """The projections' and the embedding's measurements on the test digits, and the 5-NN accuracies."""
    learner.eval()
    last = learner.projector.net[-1]
    seen = {}
    handle = last.register_forward_hook(lambda module, inputs, output: seen.update(input=inputs[0]))
    data = config['data']
    projection, embedding = learner(normalise(test_set.floats(), data['mean'], data['std']), return_embedding=True)
    handle.remove()
    train_features = embeddings(learner.net, train_set.floats(), config)
    test_features = embeddings(learner.net, test_set.floats(), config)
    return dict(
        projection_std=projection.std(dim=0).mean().item(), projection_norm=projection.norm(dim=-1).mean().item(),
        last_input_spread=seen['input'].std(dim=0).square().sum().sqrt().item(),
        last_weight_norm=last.weight.norm().item(), embedding_rank=effective_rank(embedding),
        knn_all=knn_accuracy(train_features, train_set.labels, test_features, test_set.labels, 5),
        knn_tenth=knn_accuracy(train_features[subset], train_set.labels[subset], test_features, test_set.labels, 5))


def untrained(data, options=''):
    """The measurements of the learner as the command builds it, before any step (seed 0)."""
    _, learner, mean, std = untrained_learner(['--method', 'lejepa', *shlex.split(options)], data[0])
    return dict(epoch=0, prediction_loss=float('nan'), sigreg=float('nan'),
                **measure(learner, dict(data=dict(mean=mean, std=std)), *data))


def probe(name, options, out, epochs, threads, data):
    """Pre-train one probe, measuring after every epoch; its records."""
    return run_probe('lejepa', name, options, out, epochs, threads,
                     lambda learner, config: measure(learner, config, *data), EDITS.get(name))


def line(name, record):
    return (f"{name:20s} {record['epoch']:3d} {record['prediction_loss']:8.4f} {record['sigreg']:7.2f} "
            f"{record['projection_std']:7.3f} {record['projection_norm']:7.3f} {record['last_input_spread']:7.3f} "
            f"{record['last_weight_norm']:7.2f} {record['embedding_rank']:6.2f} {100 * record['knn_all']:5.1f} "
            f"{100 * record['knn_tenth']:5.1f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='runs/lejepa_probes')
    parser.add_argument('--epochs', type=int, default=30)
    parser.add_argument('--probes', nargs='+', default=list(PROBES), choices=PROBES)
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train_set, test_set = load_digits('train', image_size=16), load_digits('test', image_size=16)
    subset = train.label_subset(train_set.labels, 0.1, seed=0)
    print(f"{'probe':20s} epoch prediction SIGReg proj-std proj-norm last-in last-W rank 5-NN 5-NN-10%", flush=True)
    data = (train_set, test_set, subset)
    print(line('untrained', untrained(data, PROBES['command'])), flush=True)
    print(line('untrained-batchnorm', untrained(data, PROBES['batchnorm-projector'])), flush=True)
    for name in args.probes:
        records = probe(name, PROBES[name], out, args.epochs, args.threads, data)
        for record in records:
            print(line(name, record), flush=True)


if __name__ == '__main__':
    main()
