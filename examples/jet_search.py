"""JetViT's post-training attention search, short, on the digits (arXiv 2605.26636; docs/blocks.md, JetViT).

    OMP_NUM_THREADS=1 nice -n 15 python examples/jet_search.py --seeds 0 1 2 3 4 --epochs 10 --supernet-epochs 5 \\
        --out runs/jet_search
    OMP_NUM_THREADS=1 nice -n 15 python examples/jet_search.py --seeds 0 1 2 3 4 --epochs 30 --supernet-epochs 15 \\
        --out runs/jet_search30

On scikit-learn's digits at 16 pixels with the training command's recipe and epoch loop (examples/digits_claims.py's
data, model size and helpers), each seed:

  1. trains JetViT with full attention ('FA') in every layer (the trainer's small model: patch 4, so a 4 x 4 grid of
     tokens; width 64, depth 4, 4 heads of 16, MLP 128; `window_size=2`) for --epochs on the training digits less a
     held-out fifth (the same 270 for every seed, drawn with seed 0);
  2. copies each layer's full-attention weights into its window and linear attentions (the paper inherits the base
     model's attention weights; the window attention's output projection has no bias, so the full one's is dropped;
     the linear attention's dynamic convolution and the window's position bias keep their initialisation), and
     trains that model with every layer drawing one of 'WA', 'LA', 'FA' at every forward (the supernet) for
     --supernet-epochs, from a fresh optimizer under the same recipe;
  3. evaluates every per-layer pattern (3 ** depth) of the supernet on the held-out digits, and counts each pattern's
     forward FLOPs per image (`vit_pytorch.flops.training_flops`, torch.utils.flop_counter);
  4. picks the cheapest pattern whose held-out accuracy is at most --tolerance below the base model's (step 1; ties
     in FLOPs go to the higher held-out accuracy) and fixes it with `set_attn_layers`; where no pattern is (the
     supernet's all-FA included), the search keeps the base model (marked 'base kept');
  5. tests on the 450 test digits: the base model, the supernet with the chosen pattern, the supernet with full
     attention everywhere, and (unless --no-scratch) the chosen pattern trained from scratch on the same digits for
     --epochs + --supernet-epochs.

Written to --out: results.json (one record a seed, saved as each ends; the same command again skips the seeds
recorded and refuses other settings in the same --out) and table.md.
"""

import argparse
import copy
import itertools
import sys
from pathlib import Path

import torch

from vit_pytorch.flops import training_flops
from vit_pytorch.jet_vit import KINDS
from vit_pytorch.training import loop, registry
from vit_pytorch.training.data import ImageSet
from vit_pytorch.training.trials import Results, fit, with_statistics


sys.path.insert(0, str(Path(__file__).parent))
import digits_claims  # noqa: E402

ats_tokens = digits_claims.ats_tokens        # the data and recipe (`digits_plan`), `spread`, `load_average`

HELD_OUT = 0.2            # the fraction of the training digits held out for the search
SPLIT_SEED = 0
WINDOW_SIZE = 2           # 2 x 2 windows on the 4 x 4 grid (docs/blocks.md's short run)
INHERITED = ('norm.weight', 'norm.bias', 'to_qkv.weight', 'to_out.0.weight', 'to_out.0.bias')


def held_out_split(data, fraction=HELD_OUT, seed=SPLIT_SEED):
    """Data whose `train` is the training digits less a held-out `fraction` (drawn with `seed`) and whose `test` is
    that held-out part, with the statistics of the rest."""
    order = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(seed))
    count = round(fraction * len(data.train))
    held, rest = order[:count].sort().values, order[count:].sort().values
    part = lambda index: ImageSet(data.train.images[index], data.train.labels[index], data.train.classes)
    return with_statistics(part(rest), part(held))


def patterns(depth):
    """Every per-layer choice of one kind: 3 ** depth tuples."""
    return list(itertools.product(KINDS, repeat=depth))


def inherit_attention(model):
    """Copy every layer's full-attention weights (its pre-norm, qkv and output projection) into its window and
    linear attentions where they have the same parameter; the rest keep theirs."""
    with torch.no_grad():
        for layer in model.transformer.layers:
            options = layer[0].options
            full = dict(options['FA'].named_parameters())
            for kind in ('WA', 'LA'):
                for name, parameter in options[kind].named_parameters():
                    if name in INHERITED and name in full:
                        parameter.copy_(full[name])
    return model


def pattern_flops(model, pattern, image_size, channels, num_classes):
    """Forward FLOPs per image of `model` with `pattern` fixed (counted on a copy)."""
    model = copy.deepcopy(model)
    model.set_attn_layers(list(pattern))
    return training_flops(model, image_size, channels=channels, num_classes=num_classes)[1]


def search(rows, reference, tolerance):
    """The row of the cheapest pattern whose accuracy is at least `reference - tolerance`; among equally cheap ones
    the most accurate, then the first. `rows`: dicts with 'pattern', 'accuracy' and 'flops'. None if none is."""
    within = [row for row in rows if row['accuracy'] >= reference - tolerance - 1e-12]
    if not within:
        return None
    return min(within, key=lambda row: (row['flops'], -row['accuracy']))


def held_out_rows(model, data, depth, flops):
    """Each pattern's held-out accuracy on `model` (its choices restored after), with its FLOPs."""
    kept, rows = model.attn_layers, []
    for pattern in patterns(depth):
        model.set_attn_layers(list(pattern))
        accuracy = loop.evaluate(model, data.test, mean=data.mean, std=data.std)['accuracy']
        rows.append(dict(pattern=list(pattern), accuracy=accuracy, flops=flops[pattern]))
    model.set_attn_layers(kept)
    return rows


def tested(model, search_data, test_set):
    """Test accuracy, with the search data's normalisation (the statistics the model was trained under)."""
    return loop.evaluate(model, test_set, mean=search_data.mean, std=search_data.std)['accuracy']


def run_seed(config, search_data, test_set, plan, supernet_plan, scratch_plan, seed, tolerance, flops, scratch):
    depth = config['depth']
    torch.manual_seed(seed)
    base = registry.build_model('jet_vit', **config, attn_layers=['FA'] * depth)
    base_record = fit(base, search_data, plan, seed=seed, device='cpu', title=f'seed {seed} base FA')
    base_held_out = base_record['test_accuracy']

    supernet = inherit_attention(copy.deepcopy(base))
    supernet.set_attn_layers([KINDS] * depth)
    supernet_record = fit(supernet, search_data, supernet_plan, seed=seed + 1000, device='cpu',
                          title=f'seed {seed} supernet')
    rows = held_out_rows(supernet, search_data, depth, flops)
    chosen = search(rows, base_held_out, tolerance)
    record = dict(base_held_out=base_held_out, base_test=tested(base, search_data, test_set), rows=rows,
                  train_seconds=base_record['train_seconds'] + supernet_record['train_seconds'])
    supernet.set_attn_layers(['FA'] * depth)
    record['supernet_fa_held_out'] = loop.evaluate(supernet, search_data.test, mean=search_data.mean,
                                                   std=search_data.std)['accuracy']
    record['supernet_fa_test'] = tested(supernet, search_data, test_set)
    if chosen is None:
        # no pattern of the supernet is within the tolerance: the search keeps the base model
        chosen, kept = dict(pattern=['FA'] * depth, accuracy=base_held_out, flops=flops[('FA',) * depth]), base
    else:
        supernet.set_attn_layers(chosen['pattern'])
        kept = supernet
    record.update(chosen=chosen['pattern'], chosen_held_out=chosen['accuracy'], chosen_flops=chosen['flops'],
                  base_kept=kept is base)
    record['test_accuracy'] = record['chosen_test'] = tested(kept, search_data, test_set)
    if scratch:
        torch.manual_seed(seed)
        model = registry.build_model('jet_vit', **config, attn_layers=chosen['pattern'])
        scratch_record = fit(model, search_data, scratch_plan, seed=seed, device='cpu',
                             title=f'seed {seed} scratch {"-".join(chosen["pattern"])}')
        record['scratch_held_out'] = scratch_record['test_accuracy']
        record['scratch_test'] = tested(model, search_data, test_set)
        record['train_seconds'] += scratch_record['train_seconds']
    return record


def table(results, seeds, flops, depth, tolerance, scratch):
    """The table's markdown lines from the records of `seeds`."""
    runs = {run['seed']: run for run in results.runs}
    full = flops[('FA',) * depth]
    lines = [f'tolerance {100 * tolerance:.2f} points of held-out accuracy below the base model; '
             f'all-FA forward {full / 1e6:.3f} MFLOPs / image', '',
             '| seed | chosen pattern | MFLOPs / image (vs all-FA) | held-out: base FA, chosen | test: base FA | '
             'test: supernet all-FA | test: chosen | test: chosen from scratch |', '|' + '---|' * 8]
    for seed in seeds:
        run = runs[seed]
        lines.append('| ' + ' | '.join([
            str(seed), '-'.join(run['chosen']) + (' (base kept)' if run['base_kept'] else ''),
            f"{run['chosen_flops'] / 1e6:.3f} ({run['chosen_flops'] / full - 1:+.1%})",
            f"{100 * run['base_held_out']:.2f}%, {100 * run['chosen_held_out']:.2f}%",
            f"{100 * run['base_test']:.2f}%", f"{100 * run['supernet_fa_test']:.2f}%",
            f"{100 * run['chosen_test']:.2f}%",
            f"{100 * run['scratch_test']:.2f}%" if scratch else '']) + ' |')
    columns = ['base_test', 'supernet_fa_test', 'chosen_test'] + (['scratch_test'] if scratch else [])
    cells = ['{:.2f} +- {:.2f}%'.format(*ats_tokens.spread([runs[seed][key] for seed in seeds])) for key in columns]
    lines.append('| mean +- std | | | | ' + ' | '.join(cells) + (' |' if scratch else ' | |'))
    differences = ['{:+.2f} +- {:.2f} points'.format(*ats_tokens.spread(
        [runs[seed][key] - runs[seed]['base_test'] for seed in seeds])) for key in columns[1:]]
    lines.append('| paired vs base FA | | | | | ' + ' | '.join(differences) + (' |' if scratch else ' | |'))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1])
    parser.add_argument('--epochs', type=int, default=10, help='the full-attention training')
    parser.add_argument('--supernet-epochs', type=int, default=5)
    parser.add_argument('--tolerance', type=float, default=0.01, help='held-out accuracy (a fraction)')
    parser.add_argument('--no-scratch', action='store_true', help="don't train the chosen pattern from scratch")
    parser.add_argument('--out', type=Path, default=Path('runs/jet_search'))
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--quiet', action='store_true', help="no progress bars")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    scratch = not args.no_scratch

    data, recipe, plan = ats_tokens.digits_plan(args.epochs, args.quiet)
    supernet_plan = argparse.Namespace(**{**vars(plan), 'epochs': args.supernet_epochs})
    scratch_plan = argparse.Namespace(**{**vars(plan), 'epochs': args.epochs + args.supernet_epochs})
    search_data = held_out_split(data)
    config = registry.model_config('jet_vit', dict(window_size=WINDOW_SIZE), image_size=data.image_size,
                                   channels=data.channels, num_classes=data.num_classes)
    settings = dict(epochs=args.epochs, supernet_epochs=args.supernet_epochs, tolerance=args.tolerance,
                    scratch=scratch, recipe=recipe, config=config, held_out=HELD_OUT, split_seed=SPLIT_SEED)
    results = Results(args.out, 'jet_search', settings)
    if results.differences:
        raise SystemExit(f"{args.out} holds runs of other settings: {'; '.join(results.differences)}; "
                         f"use another --out")

    started = ats_tokens.clock()
    probe = registry.build_model('jet_vit', **config)
    flops = {pattern: pattern_flops(probe, pattern, data.image_size, data.channels, data.num_classes)
             for pattern in patterns(config['depth'])}
    for seed in args.seeds:
        results.run(dict(seed=seed), lambda: run_seed(config, search_data, data.test, plan, supernet_plan,
                                                       scratch_plan, seed, args.tolerance, flops, scratch),
                    quiet=args.quiet, label=f'seed {seed} search')
    return ats_tokens.report(table(results, args.seeds, flops, config['depth'], args.tolerance, scratch), args.out,
                             started)


if __name__ == '__main__':
    main()
