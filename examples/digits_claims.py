"""Three papers' training claims checked on the digits: the short runs of docs/tokens.md and docs/blocks.md.

    python examples/digits_claims.py patch_merger --seeds 0 1 2 3 4 --epochs 30 --out runs/claims_patch_merger
    python examples/digits_claims.py decorr --seeds 0 1 2 3 4 --epochs 10 --out runs/claims_decorr
    python examples/digits_claims.py residuals --seeds 0 1 2 3 4 --epochs 30 --out runs/claims_residuals

On scikit-learn's digits at 16 pixels (the training command's data and split, 1,347 training and 450 test images),
with the training command's recipe and epoch loop (`vit_pytorch.training.trials.fit`, the setup of
examples/ats_tokens.py), each seed trains every model of the claim from the same seed and tests it on the 450 test
digits after every epoch. The models are the trainer's small ones (patch 4, so 16 patch tokens; width 64, depth 4,
4 heads of 16, MLP 128):

  patch_merger  "Learning to Merge Tokens in Vision Transformers" (arXiv 2202.12015): fewer tokens at nearly the
                accuracy. A ViT with mean pooling and no cls token (`vit`, pool='mean', patch_norm=True: the layout of
                vit-pytorch's `vit_with_patch_merger`) against the same ViT merging its 16 tokens into K = 8 and
                K = 4 after layer 2 of 4 (halfway, as the paper).
  decorr        "Decorrelation Speeds Up Vision Transformers" (arXiv 2510.14657): faster convergence. vit-pytorch's
                `vit_with_decorr` (the decorrelation objective as an auxiliary loss, no decorrelation matrix) at
                weight 0 and 0.1 (the training command's default, vit-pytorch's example's), and the paper's method
                (`decorr_matrices=True`: a decorrelation matrix before every Linear of the encoder, stepped by its
                own rule after every optimizer step; no auxiliary loss) at the rule's learning rate 1e-4 (decorbp's
                default) and 1e-2, over a short budget.
  residuals     value residuals ("Value Residual Learning", arXiv 2410.17897) and hyper-connections
                ("Hyper-Connections", arXiv 2409.19606): better or faster training at about the same compute.
                `simple_vit` against `simple_vit_with_value_residual` (learned mix, vit-pytorch's default) and
                `simple_vit_with_hyper_connections` (4 streams, no registers, so that only the residuals differ).

The table gives the test accuracy after given epochs (mean +- sample std over the seeds), the paired difference to
the first model of the same seed, the forward FLOPs per image counted by `vit_pytorch.flops.training_flops`
(torch.utils.flop_counter; for the patch merger also the formula `merger_flops`) and the parameters; for decorr
also the test digits' decorrelation loss (the model's auxiliary loss, of its blocks' normed inputs) and
`linear_input_correlation` (of what every Linear of the encoder multiplies, after its matrix where it has one).

Written to --out: results.json (one record per run, saved as each ends: the same command run again skips the runs
recorded, and refuses other settings in the same --out) and table.md.
"""

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

from vit_pytorch.flops import training_flops
from vit_pytorch.training import loop, registry
from vit_pytorch.training.data import normalise
from vit_pytorch.training.trials import Results, fit
from vit_pytorch.vit_with_decorr import DecorrelatedLinear, Decorrelation


def _ats_tokens():
    spec = importlib.util.spec_from_file_location('ats_tokens', Path(__file__).resolve().parent / 'ats_tokens.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ats_tokens = _ats_tokens()           # its data and recipe (`digits_plan`), `spread` and `load_average`

DECORR_WEIGHT = 0.1
DECORR_MATRICES = dict(decorr_matrices=True)

# claim -> [(label, registered name, options beyond the trainer's small configuration, training weight of the
# model's auxiliary loss or None)]; the first is the one the others are paired with
CLAIMS = {
    'patch_merger': [
        ('ViT, mean pooling', 'vit', dict(pool='mean', patch_norm=True), None),
        ('PatchMerger 16 -> 8 after layer 2', 'vit_with_patch_merger',
         dict(patch_merge_layer=2, patch_merge_num_tokens=8), None),
        ('PatchMerger 16 -> 4 after layer 2', 'vit_with_patch_merger',
         dict(patch_merge_layer=2, patch_merge_num_tokens=4), None),
    ],
    'decorr': [
        ('decorrelation weight 0', 'vit_with_decorr', {}, 0.0),
        (f'decorrelation weight {DECORR_WEIGHT}', 'vit_with_decorr', {}, DECORR_WEIGHT),
        ('decorrelation matrices, lr 1e-4', 'vit_with_decorr', dict(DECORR_MATRICES, decorr_matrices_lr=1e-4), 0.0),
        ('decorrelation matrices, lr 1e-2', 'vit_with_decorr', dict(DECORR_MATRICES, decorr_matrices_lr=1e-2), 0.0),
    ],
    'residuals': [
        ('SimpleViT', 'simple_vit', {}, None),
        ('value residual (learned mix)', 'simple_vit_with_value_residual', {}, None),
        ('hyper-connections (4 streams)', 'simple_vit_with_hyper_connections', dict(num_register_tokens=0), None),
    ],
}


def merger_flops(*, image_size, patch_size, channels, num_classes, dim, depth, heads, dim_head, mlp_dim,
                 patch_merge_layer=None, patch_merge_num_tokens=None, **_):
    """Multiply-adds x 2 of one image's forward pass through a ViT of mean pooling (square images), merging its
    tokens into `patch_merge_num_tokens` after layer `patch_merge_layer` (None: no merge): the merge is one head
    of width `dim`, K queries over the n normed tokens (scores, then the weighted sum). Norms, softmax, the patch
    norms and the mean are not counted (nor does the counter)."""
    n = (image_size // patch_size) ** 2
    inner = heads * dim_head
    flops = 2 * n * (channels * patch_size ** 2) * dim                       # patch projection
    for layer in range(1, depth + 1):
        flops += 2 * n * dim * 3 * inner + 2 * 2 * heads * n * n * dim_head  # q, k, v; q k^T and attention @ v
        flops += 2 * n * inner * dim + 2 * 2 * n * dim * mlp_dim             # output projection, MLP
        if layer == patch_merge_layer:
            flops += 2 * 2 * patch_merge_num_tokens * n * dim                 # the merge: scores, weighted sum
            n = patch_merge_num_tokens
    return flops + 2 * dim * num_classes                                     # the head


def build(name, config, seed):
    torch.manual_seed(seed)
    return registry.build_model(name, **config)


def configs(claim, data):
    return [registry.model_config(name, options, image_size=data.image_size, channels=data.channels,
                                  num_classes=data.num_classes) for _, name, options, _ in CLAIMS[claim]]


def run(name, config, weight, data, plan, seed, label):
    """Train one model; its record: the last epoch's test accuracy and loss, the test accuracy after every epoch,
    and for the decorrelation model the mean decorrelation loss of the test digits' layer inputs."""
    model = build(name, config, seed)
    curve = []

    def after_epoch(epoch, model):
        curve.append(loop.evaluate(model, data.test, mean=data.mean, std=data.std)['accuracy'])

    aux = None if not weight else (registry.AUX_LOSSES[name][0], weight)
    record = fit(model, data, plan, seed=seed, device='cpu', title=label, aux_loss=aux, after_epoch=after_epoch)
    record['curve'] = curve
    if name == 'vit_with_decorr':
        images = normalise(data.test.floats(), data.mean, data.std)
        with torch.no_grad():
            record['test_decorr_loss'] = model.eval()(images, return_decorr_aux_loss=True)[1].item()
        record['test_linear_input_correlation'] = linear_input_correlation(model, images)
    return record


def linear_input_correlation(model, images):
    """How correlated the inputs of the encoder's Linears are on `images`: for each Linear of the patch projection
    and the layers (not the head), after its decorrelation matrix where it has one, the mean squared off-diagonal
    entry of the second moment Z^T Z / N of its N input rows (what the matrices' rule drives to 0); the mean over
    those Linears. Eval mode, no gradient."""
    seen = []

    def keep(_module, inputs, output):
        rows = (output if isinstance(_module, Decorrelation) else inputs[0]).flatten(0, -2).double()
        second = rows.T @ rows / len(rows)
        seen.append(second[~torch.eye(len(second), dtype=torch.bool)].pow(2).mean().item())

    linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)
               and module is not model.mlp_head]
    hooks = [module.decorrelation.register_forward_hook(keep) if isinstance(module, DecorrelatedLinear) else
             module.register_forward_hook(keep) for module in linears]
    try:
        with torch.no_grad():
            model.eval()(images)
    finally:
        for hook in hooks:
            hook.remove()
    return statistics.mean(seen)


def shown_epochs(epochs):
    """The epochs the table shows: 1, 2, 5, a quarter, half and all of them (those within the run)."""
    return sorted({epoch for epoch in (1, 2, 5, epochs // 4, epochs // 2, epochs) if 1 <= epoch <= epochs})


def table(claim, results, data, seeds, epochs):
    """The table's markdown lines from the records of `seeds`."""
    models = CLAIMS[claim]
    records = [{run['seed']: run for run in results.runs if run['setting'] == label} for label, *_ in models]
    shown = shown_epochs(epochs)
    header = ['model', *(f'test accuracy, epoch {epoch}' for epoch in shown),
              f'paired difference, epoch {epochs}', 'forward MFLOPs / image', 'parameters']
    if claim == 'decorr':
        header += ['test decorrelation loss', "test correlation of the Linears' inputs"]
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for index, ((label, name, _, _), config, by_seed) in enumerate(zip(models, configs(claim, data), records)):
        cells = [label]
        for epoch in shown:
            cells.append('{:.2f} +- {:.2f}%'.format(*ats_tokens.spread([by_seed[seed]['curve'][epoch - 1]
                                                                        for seed in seeds])))
        differences = [by_seed[seed]['test_accuracy'] - records[0][seed]['test_accuracy'] for seed in seeds]
        cells.append('' if index == 0 else '{:+.2f} +- {:.2f} points'.format(*ats_tokens.spread(differences)))
        model = build(name, config, 0)
        counted = training_flops(model, data.image_size, channels=data.channels, num_classes=data.num_classes)[1]
        flops = f'{counted / 1e6:.2f}'
        if claim == 'patch_merger':
            flops += f' (formula {merger_flops(**config) / 1e6:.2f})'
        cells += [flops, f'{sum(parameter.numel() for parameter in model.parameters()):,}']
        if claim == 'decorr':
            cells += ['{:.4f} +- {:.4f}'.format(*statistics_of([by_seed[seed][key] for seed in seeds]))
                      for key in ('test_decorr_loss', 'test_linear_input_correlation')]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return lines


def statistics_of(values):
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('claim', choices=sorted(CLAIMS))
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--epochs', type=int, default=30)
    parser.add_argument('--out', type=Path, default=None, help='default: runs/claims_<claim>')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--quiet', action='store_true', help="no progress bars")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = args.out or Path(f'runs/claims_{args.claim}')

    data, recipe, plan = ats_tokens.digits_plan(args.epochs, args.quiet)
    settings = dict(epochs=args.epochs, recipe=recipe, models=[[label, name, options, weight] for label, name,
                                                               options, weight in CLAIMS[args.claim]],
                    configs=configs(args.claim, data))
    results = Results(out, f'digits_claims {args.claim}', settings)
    if results.differences:
        raise SystemExit(f"{out} holds runs of other settings: {'; '.join(results.differences)}; use another --out")

    started, cpu, load = time.perf_counter(), time.process_time(), ats_tokens.load_average()
    for seed in args.seeds:
        for (label, name, _, weight), config in zip(CLAIMS[args.claim], configs(args.claim, data)):
            results.run(dict(seed=seed, setting=label),
                        lambda: run(name, config, weight, data, plan, seed, f'seed {seed} {label}'),
                        quiet=args.quiet, label=f'seed {seed} {label}')
    lines = table(args.claim, results, data, args.seeds, args.epochs)
    text = '\n'.join(lines)
    (out / 'table.md').write_text(text + '\n')
    print(text)
    print(f"{time.perf_counter() - started:.0f} s wall-clock, {time.process_time() - cpu:.0f} s of CPU time; load "
          f"average {load} at the start, {ats_tokens.load_average()} at the end", file=sys.stderr)
    return lines


if __name__ == '__main__':
    main()
