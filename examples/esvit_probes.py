"""Why do EsViT and DINO collapse on the digits at DINO's recipe? Short runs with one change each, measured every epoch.

    python examples/esvit_probes.py --out runs/esvit_probes                   # EsViT on the trainer's small ViT
    python examples/esvit_probes.py --method dino --probes command teacher-temp-0.04 --out runs/esvit_probes
    python examples/esvit_probes.py --model swin --probes command --out runs/esvit_probes   # the trainer's small Swin

Each probe pre-trains the trainer's default small ViT with `python -m vit_pytorch.pretrain --method esvit` (or
`--method dino`) as examples/label_efficiency.py does for its table (DINO's recipe: 15 epochs at the peak learning
rate 1.25e-4, the command's other defaults, seed 0) plus the probe's options. The command's log gives, per epoch
(averaged over its steps): the loss, the view-level teacher's mean entropy per image and the entropy of its mean
output (both near ln K: every output uniform; the first near 0 with the second small: every image sent to the same
few outputs), and EsViT's region-level teacher's the same two. After every epoch the script measures the saved network (the teacher's, which the table evaluates)
on the digits without augmentation: the mean cosine similarity of its embeddings of two different test digits
(1: every digit the same embedding), and the 5-NN test accuracy of its frozen embedding with all 1,347 training
labels and with 5 % and 10 % of them, on the table's subsets (seeds 0, 1, 2: their mean), as in
examples/label_efficiency.py; and the teacher's view-level head (`measure_head`): how alike its bottleneck vectors
of two test digits are, how alike two rows of its last layer are (their mean cosines) and the rows' mean norm.

Four probes change what no flag reaches (`EDITS`, applied to the learner the command builds, before its optimizer):
the centres' momentum (0.9, the paper's code's, otherwise), the heads' biases held at zero, and BatchNorm in the
heads (the paper's code's `--use_bn_in_head true`). The run and its per-epoch measurement are
examples/probing.py's (`run_probe`), shared with examples/lejepa_probes.py.

Writes <out>/<method>-<probe>/ (the run), <out>/<method>-<probe>.jsonl (one line per epoch: the log's record and
the measurements) and <out>/<method>-table.md (the probes given, their last epoch), and prints every epoch's values,
the untrained learner's first (its teacher's entropies on the training digits without augmentation, centred by their
mean); the student's network is measured the same way (`student_` before the names).
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from label_efficiency import embeddings, knn_accuracy  # noqa: E402
from probing import run_probe, untrained_learner  # noqa: E402

from vit_pytorch import train  # noqa: E402
from vit_pytorch.dino import collapse_entropies  # noqa: E402
from vit_pytorch.evaluate import load_digits  # noqa: E402

RECIPE = '--lr 1.25e-4'                               # examples/label_efficiency.py's DINO recipe (15 epochs)
PROBES = {
    'command': '',
    'teacher-temp-0.04': '--final-teacher-temp 0.04',                   # the paper's code's default: held at 0.04
    'teacher-temp-0.02': '--teacher-temp 0.02 --final-teacher-temp 0.02',
    'k-256': '--num-classes-k 256',
    'k-4096': '--num-classes-k 4096',
    'center-0.99': '',
    'center-0.5': '',
    'no-freeze': '--freeze-last-layer 0',
    'freeze-throughout': '--freeze-last-layer 15',
    'learned-last-norm': '--norm-last-layer false',                      # EsViT's README and DINO's for ViT-S
    'paper-head': '--projection-hidden-size 2048 --bottleneck-dim 256',  # the paper's head widths
    'head-bias-off': '',
    'head-batchnorm': '',
    'lr-5e-4': '--lr 5e-4',
    'lr-1e-3': '--lr 1e-3',
    'warmup-1.5': '--warmup-epochs 1.5',
    'ema-0.99': '--momentum-teacher 0.99',
    'ema-0.9': '--momentum-teacher 0.9',
    'no-local-crops': '--num-local-crops 0',
    'batch-32': '--batch-size 32',
    'batch-256': '--batch-size 256',
}


def head_bias_off(learner):
    """The heads' MLP biases held at zero (they start there): the common part of every image's bottleneck vector
    then comes from the network's embedding alone."""
    heads = [child for name, child in learner.student.named_children() if name != 'net']
    for module in (module for head in heads for module in head.modules()):
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.requires_grad_(False)


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm over the last dimension of (..., c) features (a region head's (b, n, c) too)."""

    def forward(self, x):
        return super().forward(x.reshape(-1, x.shape[-1])).reshape(x.shape)


def head_batchnorm(learner):
    """The paper's code's `--use_bn_in_head true`: BatchNorm after each hidden linear layer of the heads' MLPs
    (before its GELU), in the student and the teacher (which keeps the student's running statistics, in eval mode)."""
    for projector in (learner.student, learner.teacher):
        for name, head in projector.named_children():
            if name == 'net':
                continue
            layers = list(head.mlp)
            linears = [index for index, layer in enumerate(layers) if isinstance(layer, nn.Linear)]
            for index in reversed(linears[:-1]):
                layers.insert(index + 1, TokenBatchNorm(layers[index].out_features))
            head.mlp = nn.Sequential(*layers)
    learner.teacher.load_state_dict(learner.student.state_dict())
    learner.teacher.requires_grad_(False)


EDITS = {
    'center-0.99': lambda learner: setattr(learner, 'center_moving_average_decay', 0.99),
    'center-0.5': lambda learner: setattr(learner, 'center_moving_average_decay', 0.5),
    'head-bias-off': head_bias_off,
    'head-batchnorm': head_batchnorm,
}
EDIT_NOTES = {'center-0.99': 'centre momentum 0.99', 'center-0.5': 'centre momentum 0.5',
              'head-bias-off': "the heads' biases held at 0", 'head-batchnorm': 'BatchNorm in the heads'}
FRACTIONS, SEEDS = (0.05, 0.1), (0, 1, 2)


def mean_cosine(features):
    """The mean cosine similarity of two different rows of L2-normalised features (n, d)."""
    similarity = features @ features.T
    return ((similarity.sum() - similarity.diagonal().sum()) / (len(features) * (len(features) - 1))).item()


@torch.no_grad()
def measure(network, config, train_set, test_set, subsets):
    """The network's embeddings' mean cosine on the test digits and its 5-NN accuracies (the mean over the
    subsets of each fraction, and each subset's)."""
    network.eval()
    train_features = embeddings(network, train_set.floats(), config)
    test_features = embeddings(network, test_set.floats(), config)
    record = dict(mean_cosine=mean_cosine(test_features),
                  knn_all=knn_accuracy(train_features, train_set.labels, test_features, test_set.labels, 5))
    for fraction, chosen in subsets.items():
        accuracies = [knn_accuracy(train_features[subset], train_set.labels[subset], test_features,
                                   test_set.labels, 5) for subset in chosen]
        record[f'knn_{fraction:g}'] = statistics.mean(accuracies)
        record[f'knn_{fraction:g}_seeds'] = accuracies
    return record


@torch.no_grad()
def measure_head(learner, test_set):
    """The teacher's view-level head on the test digits: the mean cosine of two different images' bottleneck
    vectors (the L2-normalised MLP output the last layer reads; 1: every image the same vector), the mean cosine of
    two different rows of its last layer (1: every output the same logit, whatever the input) and its rows' mean norm
    (the learned gain where the norm is learned, else 1)."""
    teacher = learner.teacher
    views = learner.normalise(test_set.floats())
    if hasattr(teacher, 'view_head'):                                   # EsViT: the mean of the region tokens
        head, embedding = teacher.view_head, teacher.regions(views).mean(dim=1)
    else:
        head, embedding = teacher.head, teacher.embed(views)
    bottleneck = F.normalize(head.mlp(embedding), dim=-1)
    rows = F.normalize(head.last_layer.weight, dim=-1)
    gain = getattr(head.last_layer, 'gain', None)
    return dict(bottleneck_cosine=mean_cosine(bottleneck), rows_cosine=mean_cosine(rows),
                rows_norm=1.0 if gain is None else gain.abs().mean().item())


def both(learner, config, data):
    """The teacher's network's measurements and its head's, and the student's network's with `student_` before
    their names."""
    learner.eval()
    student = measure(learner.student.net, config, *data)
    return {**measure(learner.teacher.net, config, *data), **measure_head(learner, data[1]),
            **{f'student_{k}': v for k, v in student.items()}}


@torch.no_grad()
def untrained(method, train_set, data, model=None):
    """The learner the runs start from (the command's, seed 0, no step): its network's measurements (the table's
    random network) and its head's, and its view-level teacher's entropies on the training digits without
    augmentation at the first teacher temperature, centred by their mean (where the centre goes in the first steps)."""
    args, learner, mean, std = untrained_learner(['--method', method, *RECIPE.split(),
                                                  *['--model', model] * bool(model)], train_set)
    learner.eval()
    pixels = train_set.floats()
    logits = learner.teacher(learner.normalise(pixels))[0]
    entropies = collapse_entropies(((logits - logits.mean(dim=0)) / args.teacher_temp).softmax(dim=-1))
    return dict(epoch=0, loss=float('nan'), teacher_entropy=entropies[0], teacher_mean_entropy=entropies[1],
                **measure_head(learner, data[1]), **measure(learner.teacher.net, dict(data=dict(mean=mean, std=std)),
                                                           *data))


def line(name, record):
    region = (f" {record['region_teacher_entropy']:6.2f} {record['region_teacher_mean_entropy']:6.2f}"
              if 'region_teacher_entropy' in record else '')
    head = (f"  head {record['bottleneck_cosine']:6.3f} {record['rows_cosine']:6.3f} {record['rows_norm']:5.2f}"
            if 'rows_cosine' in record else '')
    return (f"{name:26s} {record['epoch']:3d} {record['loss']:7.3f} {record['teacher_entropy']:6.2f} "
            f"{record['teacher_mean_entropy']:6.2f}{region}{head} {record['mean_cosine']:7.3f} "
            f"{100 * record['knn_all']:5.1f} "
            f"{100 * record['knn_0.05']:5.1f} {100 * record['knn_0.1']:5.1f}"
            + (f"  student {record['student_mean_cosine']:6.3f} {100 * record['student_knn_all']:5.1f} "
               f"{100 * record['student_knn_0.05']:5.1f} {100 * record['student_knn_0.1']:5.1f}"
               if 'student_knn_all' in record else ''))


def table(results, untrained_record):
    """A markdown table of every probe's last epoch (and its first epoch's loss), the untrained network first."""
    number = lambda record, key, scale=1, digits=2: (f"{scale * record[key]:.{digits}f}" if key in record else '-')
    pair = lambda record, first, second, scale=1, digits=2: (
        f"{number(record, first, scale, digits)}, {number(record, second, scale, digits)}")
    lines = ['| probe | options (beside `--lr 1.25e-4 --epochs 15`) | loss, epoch 1 to last | view-level teacher '
             'entropy, of its mean | region-level | head: bottleneck cosine | teacher 5-NN, 5 %, 10 % | '
             'student 5-NN, 5 %, 10 % | CPU-s |', '|---' * 9 + '|',
             f"| untrained (entropies: no augmentation, centred by the mean) | | | "
             f"{pair(untrained_record, 'teacher_entropy', 'teacher_mean_entropy')} | | "
             f"{number(untrained_record, 'bottleneck_cosine', digits=3)} | "
             f"{pair(untrained_record, 'knn_0.05', 'knn_0.1', 100, 1)} | | |"]
    for name, records in results.items():
        first, last = records[0], records[-1]
        options = ' and '.join(([f"`{PROBES[name]}`"] if PROBES[name] else [])
                               + ([f"{EDIT_NOTES[name]} (an edit)"] if name in EDITS else []))
        lines.append(
            f"| {name} | {options} | {first['loss']:.2f} to {last['loss']:.2f} | "
            f"{pair(last, 'teacher_entropy', 'teacher_mean_entropy')} | "
            f"{pair(last, 'region_teacher_entropy', 'region_teacher_mean_entropy')} | "
            f"{number(last, 'bottleneck_cosine', digits=3)} | {pair(last, 'knn_0.05', 'knn_0.1', 100, 1)} | "
            f"{pair(last, 'student_knn_0.05', 'student_knn_0.1', 100, 1)} | "
            f"{number(last, 'probe_cpu_seconds', digits=0)} |")
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='runs/esvit_probes')
    parser.add_argument('--method', default='esvit', choices=('esvit', 'dino'))
    parser.add_argument('--epochs', type=int, default=15)
    parser.add_argument('--probes', nargs='+', default=[name for name in PROBES if name != 'paper-head'],
                        choices=PROBES, help="default: all but paper-head (run for DINO only, whose one head is cheaper)")
    parser.add_argument('--seed', type=int, default=0, help='the pre-training seed (the k-NN subsets stay the table\'s)')
    parser.add_argument('--model', default=None, help="the commands' network, e.g. swin (default: their small ViT)")
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train_set, test_set = load_digits('train', image_size=16), load_digits('test', image_size=16)
    subsets = {fraction: [train.label_subset(train_set.labels, fraction, seed=seed) for seed in SEEDS]
               for fraction in FRACTIONS}
    data = (train_set, test_set, subsets)
    print(f"{'probe':26s} epoch loss entropy of-mean [region-level entropy of-mean] [head: bottleneck cosine, rows "
          f"cosine, rows norm] cosine 5-NN 5-NN-5% 5-NN-10% (the teacher's network; then the student's)", flush=True)
    start = untrained(args.method, train_set, data, args.model)
    print(line('untrained', start), flush=True)
    results = {}
    for name in args.probes:
        options = (f"{RECIPE} {PROBES[name]}" + (f" --seed {args.seed}" if args.seed else '')
                   + (f" --model {args.model}" if args.model else ''))
        label = (f"{args.method}-{name}" + (f"-seed{args.seed}" if args.seed else '')
                 + (f"-{args.model}" if args.model else ''))
        records = run_probe(args.method, label, options, out, args.epochs, args.threads,
                            lambda learner, config: both(learner, config, data), EDITS.get(name))
        for record in records:
            print(line(label, record), flush=True)
        results[name] = records
    text = table(results, start)
    (out / f"{args.method}{'-' + args.model if args.model else ''}-table.md").write_text(text + '\n')
    print(text, flush=True)


if __name__ == '__main__':
    main()
