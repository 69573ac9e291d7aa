"""Does ATS keep the accuracy with fewer tokens, trained and plugged in untrained? The ATS runs of docs/tokens.md.

    python examples/ats_tokens.py --seeds 0 1 2 3 4 --epochs 30 --out runs/ats_tokens

"ATS: Adaptive Token Sampling For Efficient Vision Transformers" (Fayyaz et al., arXiv 2111.15667) claims fewer
tokens, so fewer FLOPs, at nearly the accuracy, and that the sampler, having no parameters, can be added to a
trained ViT without retraining. On scikit-learn's digits at 16 pixels (the training command's data and split:
1,347 training and 450 test images), each seed trains the trainer's small `ats_vit` (patch 4, so 16 patch tokens;
width 64, depth 4, 4 heads of 16, MLP 128) with the training command's recipe and epoch loop
(`vit_pytorch.training.trials.fit`):

  plain      max_tokens_per_depth (16, 16, 16, 16): no layer samples, a plain ViT (vit-pytorch's ATS layout)
  ATS        (16, 8, 8, 4) and the harsher (16, 8, 4, 2), trained with the sampler; and the paper's own setting,
             (None, 16, 16, 16) with always_sample=True: the first layer plain, the others sampling at the full
             budget (16 points over 16 patches, duplicates dropped), so the tokens kept adapt to each image, as the
             official DeiT-S configuration (layers 0-2 plain, 197 tokens in layers 3-11)
  plug-in    the plain ViT's trained weights in an ATS model of each of these, the sampler switched on, no training

and tests each on the 450 test digits. The table gives the test accuracy (mean +- sample std over the seeds), the
paired difference to the plain ViT of the same seed, the forward FLOPs per image counted by
`vit_pytorch.flops.training_flops` (torch.utils.flop_counter; the formula `forward_flops` below gives the same
count), and the mean number of patch tokens each layer keeps on the test digits (a layer keeps at most its K,
fewer where the sample repeats a token; the FLOPs are those of the K slots, which a batch computes either way: an
empty slot is masked, not skipped, so at the full budget the count is the plain ViT's plus the sampler's cls rows).
A further column gives the forward FLOPs of the kept tokens' work alone, as if the empty slots were dropped (each
layer reading only the tokens the one before kept), `skipped_flops`: exact for each test image from its kept counts,
by the same formula, then averaged over the test images; no model here computes it (not counted by the flop
counter, not timed). The official code's `drop_tokens` drops them (at a batch of one image, all of them), though
its next layer then caps its points at the fewer tokens it reads, where ours takes min(K, slots): it may keep other
tokens.

Written to --out: results.json (one record per run, saved as each ends: the same command run again skips the
runs recorded, and refuses other settings in the same --out) and table.md.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from vit_pytorch import train
from vit_pytorch.experiments import RECIPE         # the training command's recipe options
from vit_pytorch.flops import training_flops
from vit_pytorch.training import loop, registry
from vit_pytorch.training.data import normalise
from vit_pytorch.training.trials import Results, fit, load_data

PLAIN = (16, 16, 16, 16)
BUDGETS = ((16, 8, 8, 4), (16, 8, 4, 2))
OFFICIAL = (None, 16, 16, 16)                # with always_sample=True: the paper's rule at the full budget
# the ATS models: (max_tokens_per_depth, always_sample)
SETTINGS = (*((budget, False) for budget in BUDGETS), (OFFICIAL, True))


def samples(k, slots, always_sample):
    """Whether a layer of budget `k` (None: a plain layer) samples from `slots` patch slots."""
    return k is not None and (always_sample or slots > k)


def forward_flops(*, image_size, patch_size, channels, num_classes, dim, heads, dim_head, mlp_dim,
                  max_tokens_per_depth, always_sample=False, **_):
    """Multiply-adds x 2 of one image's forward pass through vit_pytorch.ats_vit.ViT (square images).

    A layer reads n tokens (the cls token first) and, where it samples (n - 1 > K, or with `always_sample` wherever
    K is set; None: never), computes the cls token's row of attention scores for the sampler and then only the
    1 + k sampled slots' queries, attention outputs and MLP, k = min(K, n - 1); the next layer reads those 1 + k
    slots. Norms, softmax and elementwise work are not counted (nor does the counter).
    """
    patches = (image_size // patch_size) ** 2
    inner = heads * dim_head
    flops = 2 * patches * (channels * patch_size ** 2) * dim                 # patch projection
    n = 1 + patches
    for k in max_tokens_per_depth:
        flops += 2 * n * dim * 3 * inner                                      # q, k, v of every token
        kept = n
        if samples(k, n - 1, always_sample):
            flops += 2 * heads * n * dim_head                                 # the cls row, for the sampler
            kept = 1 + min(k, n - 1)
        flops += 2 * 2 * heads * kept * n * dim_head                          # q k^T and attention @ v
        flops += 2 * kept * inner * dim + 2 * 2 * kept * dim * mlp_dim        # output projection, MLP
        n = kept
    return flops + 2 * dim * num_classes                                      # the head


def skipped_flops(config, max_tokens_per_depth, always_sample, kept):
    """The forward FLOPs of one image whose layers keep `kept` patch tokens (one count per layer, as `kept_tokens`
    gives) if the empty slots were skipped: each layer reads only the tokens the one before kept (the cls token and
    `kept[i - 1]`, all the patches for the first), and a sampling layer (where the model samples, decided by its
    slots as in the model) computes its kept tokens' queries only: the formula of a model whose sampling layers
    have budgets `kept`, always sampling, and whose other layers are plain."""
    patches = (config['image_size'] // config['patch_size']) ** 2
    budgets, slots = [], patches
    for k, count in zip(max_tokens_per_depth, kept, strict=True):
        if samples(k, slots, always_sample):
            budgets.append(count)
            slots = min(k, slots)
        else:
            budgets.append(None)
    return forward_flops(**config, max_tokens_per_depth=tuple(budgets), always_sample=True)


@torch.no_grad()
def kept_tokens(model, images):
    """The patch tokens each layer of an ATS `model` keeps, per image: a (layers, b) tensor of counts."""
    counts = []

    def count(attention, inputs, output):
        tokens, mask, _ = output                          # mask: which slots hold a kept token (None: all)
        counts.append(torch.full((len(images),), tokens.shape[1] - 1) if mask is None else mask[:, 1:].sum(dim=1))

    hooks = [layer[0].register_forward_hook(count) for layer in model.transformer.layers]
    try:
        model.eval()(images)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(counts)


def build(config, max_tokens_per_depth, seed=0, always_sample=False):
    torch.manual_seed(seed)
    return registry.build_model('ats_vit', **{**config, 'max_tokens_per_depth': max_tokens_per_depth,
                                              'always_sample': always_sample})


def name_of(budget, always_sample=False):
    """'16,8,8,4'; 'None,16,16,16 always_sample' with always_sample."""
    return ','.join(map(str, budget)) + (' always_sample' if always_sample else '')


def label_of(budget, always_sample=False):
    return f"({', '.join(map(str, budget))})" + (', always_sample' if always_sample else '')


def tested(model, data, device):
    """Test accuracy, the mean tokens each layer keeps on the test images, and how many test images keep each
    combination of counts ('16,9,7,5': images)."""
    result = loop.evaluate(model, data.test, mean=data.mean, std=data.std, device=device)
    images = normalise(data.test.floats().to(device), data.mean, data.std)
    counts = kept_tokens(model, images)
    combinations = {}
    for image in counts.t().tolist():
        combinations[name_of(image)] = combinations.get(name_of(image), 0) + 1
    return dict(test_accuracy=result['accuracy'],
                kept_tokens=[round(value, 3) for value in counts.float().mean(dim=1).tolist()],
                kept_counts=dict(sorted(combinations.items())))


def mean_skipped_flops(config, budget, always_sample, kept_counts):
    """`skipped_flops` averaged over the images of a record's `kept_counts`."""
    total = sum(kept_counts.values())
    return sum(images * skipped_flops(config, budget, always_sample, tuple(map(int, name.split(','))))
               for name, images in kept_counts.items()) / total


def run_seed(config, data, plan, seed, device):
    """[(setting, run)] of `seed`: the plain run (which also tests its plug-in models), then the trained ATS runs;
    each run() trains and tests, returning its record."""
    def plain():
        model = build(config, PLAIN, seed)
        record = fit(model, data, plan, seed=seed, device=device, title=f'seed {seed} plain')
        record.update(tested(model, data, device))
        for budget, always_sample in SETTINGS:
            plugged = build(config, budget, always_sample=always_sample).to(device)
            plugged.load_state_dict(model.state_dict())                       # the same weights, the sampler on
            record[f'plug-in {name_of(budget, always_sample)}'] = tested(plugged, data, device)
        return record

    def ats(budget, always_sample):
        name = name_of(budget, always_sample)

        def run():
            model = build(config, budget, seed, always_sample)
            record = fit(model, data, plan, seed=seed, device=device, title=f'seed {seed} ATS {name}')
            return {**record, **tested(model, data, device)}
        return run

    return [('plain', plain), *((f'ATS {name_of(*setting)}', ats(*setting)) for setting in SETTINGS)]


def spread(values):
    values = [100 * value for value in values]
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def table(results, config, seeds):
    """The table's markdown lines from the records of `seeds`."""
    plain = {run['seed']: run for run in results.runs if run['setting'] == 'plain'}
    rows = [(f'plain ViT {label_of(PLAIN)}', None, False, {seed: plain[seed] for seed in seeds})]
    for budget, always_sample in SETTINGS:
        setting = f'ATS {name_of(budget, always_sample)}'
        trained = {run['seed']: run for run in results.runs if run['setting'] == setting}
        rows.append((f'ATS trained {label_of(budget, always_sample)}', budget, always_sample,
                     {seed: trained[seed] for seed in seeds}))
    for budget, always_sample in SETTINGS:
        rows.append((f'ATS plug-in, untrained {label_of(budget, always_sample)}', budget, always_sample,
                     {seed: plain[seed][f'plug-in {name_of(budget, always_sample)}'] for seed in seeds}))
    lines = ['| model | test accuracy | paired difference to plain | forward MFLOPs / image (counter, formula) | '
             'MFLOPs / image if the empty slots were skipped (formula, test mean) | '
             'patch tokens kept per layer (test mean) |', '|---|---|---|---|---|---|']
    for label, budget, always_sample, records in rows:
        mean, std = spread([records[seed]['test_accuracy'] for seed in seeds])
        differences = [records[seed]['test_accuracy'] - plain[seed]['test_accuracy'] for seed in seeds]
        difference = '' if budget is None else '{:+.2f} +- {:.2f} points'.format(*spread(differences))
        budget = budget or PLAIN
        model = build(config, budget, always_sample=always_sample)
        counted = training_flops(model, config['image_size'], channels=config['channels'],
                                 num_classes=config['num_classes'])[1]
        formula = forward_flops(**config, max_tokens_per_depth=budget, always_sample=always_sample)
        skipped = statistics.mean(mean_skipped_flops(config, budget, always_sample, records[seed]['kept_counts'])
                                  for seed in seeds)
        kept = [statistics.mean(records[seed]['kept_tokens'][layer] for seed in seeds)
                for layer in range(len(budget))]
        lines.append(f"| {label} | {mean:.2f} +- {std:.2f}% | {difference} | {counted / 1e6:.3f}, "
                     f"{formula / 1e6:.3f} | {skipped / 1e6:.3f} | {' / '.join(f'{value:.2f}' for value in kept)} |")
    return lines


def digits_plan(epochs, quiet):
    """(data, recipe, plan): the 16-pixel digits and the training command's recipe options (its defaults), with
    `epochs` and `quiet` added for `fit`."""
    data = load_data(argparse.Namespace(data='digits', image_size=16, channels=1))
    defaults = vars(train.build_parser().parse_known_args([])[0])
    recipe = {name: defaults[name] for name in RECIPE}
    return data, recipe, argparse.Namespace(**recipe, epochs=epochs, quiet=quiet)


def load_average():
    """The 1-minute load average, or '?' where /proc/loadavg is missing."""
    path = Path('/proc/loadavg')
    return path.read_text().split()[0] if path.exists() else '?'


def clock():
    """(wall-clock, CPU time, load average) now, for `report` at the end."""
    return time.perf_counter(), time.process_time(), load_average()


def report(lines, out, started):
    """The table's `lines` written to <out>/table.md and printed; the wall-clock and CPU time since `started` (a
    `clock()`) and the load averages on stderr. Returns `lines`."""
    text = '\n'.join(lines)
    (Path(out) / 'table.md').write_text(text + '\n')
    print(text)
    wall, cpu, load = started
    print(f"{time.perf_counter() - wall:.0f} s wall-clock, {time.process_time() - cpu:.0f} s of CPU time; load "
          f"average {load} at the start, {load_average()} at the end", file=sys.stderr)
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2, 3, 4])
    parser.add_argument('--epochs', type=int, default=30)
    parser.add_argument('--out', type=Path, default=Path('runs/ats_tokens'))
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--quiet', action='store_true', help="no progress bars")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = 'cpu'

    data, recipe, plan = digits_plan(args.epochs, args.quiet)
    config = registry.model_config('ats_vit', {}, image_size=data.image_size, channels=data.channels,
                                   num_classes=data.num_classes)
    config.pop('max_tokens_per_depth')
    settings = dict(epochs=args.epochs, recipe=recipe, config=config,
                    budgets=[[PLAIN, False], *([budget, always_sample] for budget, always_sample in SETTINGS)])
    results = Results(args.out, 'ats_tokens', settings)
    if results.differences:
        raise SystemExit(f"{args.out} holds runs of other settings: {'; '.join(results.differences)}; "
                         f"use another --out")

    started = clock()
    for seed in args.seeds:
        for setting, train_run in run_seed(config, data, plan, seed, device):
            results.run(dict(seed=seed, setting=setting), train_run, quiet=args.quiet, label=f'seed {seed} {setting}')
    return report(table(results, config, args.seeds), args.out, started)


if __name__ == '__main__':
    main()
