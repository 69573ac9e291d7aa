"""Peak memory of Full and Block AttnRes (`vit_pytorch.simple_vit_attn_residual`) in deep stacks, against plain
SimpleViT of the same size as the floor, next to the count of tensors the paper's formula says the stack keeps.

"Attention Residuals" (arXiv 2603.15031) gives Block AttnRes for memory: Full AttnRes keeps every one of the
2 * depth branch outputs and the patch tokens (2 * depth + 1 tensors (b, n, dim)) for later branches' softmax over
depth; Block AttnRes with blocks of S branches keeps the completed blocks and one partial sum, at most
2 * depth / S + 1 tensors. For each depth (`--depths`) and model (SimpleViT, Full AttnRes, Block AttnRes at each
`--block-sizes` S that divides 2 * depth) it measures, in a fresh process each (`--runs` runs, the models alternating
within a run, as throughput.py's memory children: its `memory_child_env` fixes glibc's mmap threshold so that freed
buffers leave the resident set, and `peak_increase_mib` resets the peak before the measured pass):

  - `infer`: the peak RSS increase over one forward under `torch.no_grad` (eval mode);
  - `train`: the peak RSS increase over one training step, forward, cross-entropy and backward (gradients set to
    None before; no optimiser);
  - `ckpt`: the same step with the stack's gradient checkpointing (`set_grad_checkpointing`: each layer recomputed
    in the backward pass);

each after one untimed pass of the same kind (one-time allocations left out) and with the peak reset
(/proc/self/clear_refs) after it. For `train` the child also counts what autograd saves for the backward pass in one
more forward (distinct storages, parameters left out): all of it in MiB, and how many are (b, n, dim) token tensors
(not for `ckpt`: what a checkpointed layer keeps goes through the checkpoint's own hooks). Printed per depth and kind: the formula's kept tensors and their MiB, the peak increase (median and
min-max over the runs), its excess over SimpleViT's median, and Full AttnRes's median less each model's, measured
and by the formula.

    PYTHONPATH=. nice -n 15 python benchmarks/attn_residual_memory.py --depths 24,48 --block-sizes 2,4,8,16 --runs 3
    PYTHONPATH=. python benchmarks/attn_residual_memory.py --tiny     # a few seconds (the tests' run)
"""
import argparse
import datetime
import json
import os
import shlex
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import throughput  # noqa: E402  (the memory children's machinery: run_memory_child, peak_increase_mib, summary)

from vit_pytorch.simple_vit import SimpleViT  # noqa: E402
from vit_pytorch.simple_vit_attn_residual import SimpleViTAttnResidual  # noqa: E402

KINDS = ('infer', 'train', 'ckpt')
NUM_CLASSES = 10
MiB = 2 ** 20


def model_names(depth, block_sizes):
    """SimpleViT, Full AttnRes, then Block AttnRes at every size in `block_sizes` that divides 2 * depth."""
    return ['simple_vit', 'full'] + [f'S={s}' for s in block_sizes if (2 * depth) % s == 0]


def kept_tensors(name, depth):
    """The paper's count of (b, n, dim) tensors the stack keeps for the mix over depth: Full AttnRes every branch
    output and the patch tokens, 2 * depth + 1; Block AttnRes the completed blocks b_0 .. b_N (N = 2 * depth / S)
    and at most one partial sum, 2 * depth / S + 1 (at the end of the stack, b_0 .. b_N; before that, at most
    N - 1 completed blocks beside b_0 and one partial sum); SimpleViT none beyond its running x, 0."""
    if name == 'simple_vit':
        return 0
    if name == 'full':
        return 2 * depth + 1
    return 2 * depth // int(name.split('=')[1]) + 1


def build(name, config):
    kwargs = dict(image_size=config['image_size'], patch_size=config['patch_size'], num_classes=NUM_CLASSES,
                  dim=config['dim'], depth=config['depth'], heads=config['heads'], dim_head=config['dim_head'],
                  mlp_dim=config['mlp_dim'])
    if name == 'simple_vit':
        return SimpleViT(**kwargs)
    return SimpleViTAttnResidual(**kwargs, block_size=None if name == 'full' else int(name.split('=')[1]))


def saved_for_backward(model, img, labels, token_shape):
    """(MiB, number of (b, n, dim) tensors) autograd saves in one forward and loss: distinct storages, the
    parameters left out (the backward pass is not run; the graph is freed on return)."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages, tokens = {}, set()

    def pack(tensor):
        key = tensor.untyped_storage().data_ptr()
        if key not in parameters:
            storages[key] = tensor.untyped_storage().nbytes()
            if tuple(tensor.shape) == token_shape:
                tokens.add(key)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        F.cross_entropy(model(img), labels)
    return sum(storages.values()) / MiB, len(tokens)


def memory_child(spec):
    """One model, one kind: the peak RSS increase (MiB) over one pass after an untimed one, and for training what
    autograd saves."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config, kind = spec['config'], spec['kind']
    model = build(spec['model'], config)
    model.train(kind != 'infer')
    if kind == 'ckpt':
        model.set_grad_checkpointing(True)
    generator = torch.Generator().manual_seed(1)
    img = torch.randn(config['batch'], 3, config['image_size'], config['image_size'], generator=generator)
    labels = torch.randint(0, NUM_CLASSES, (config['batch'],), generator=generator)

    def step():
        if kind == 'infer':
            with torch.no_grad():
                model(img)
            return
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(img), labels).backward()

    step()
    model.zero_grad(set_to_none=True)
    result = dict(peak_increase_mib=throughput.peak_increase_mib(step))
    if kind == 'train':
        tokens = config['image_size'] // config['patch_size']
        result['saved_mib'], result['saved_token_tensors'] = saved_for_backward(
            model, img, labels, (config['batch'], tokens ** 2, config['dim']))
    return result


def memory_run(name, kind, config):
    return throughput.run_memory_child(__file__, dict(model=name, kind=kind, config=config))


def measure(args, log):
    """{depth: {kind: {model: row}}}: every model of a depth once per run and kind, in turn."""
    results = {}
    for depth in args.depths:
        config = dict(image_size=args.image_size, patch_size=args.patch_size, dim=args.dim, depth=depth,
                      heads=args.heads, dim_head=args.dim_head, mlp_dim=args.mlp_dim, batch=args.batch)
        tensor_mib = args.batch * (args.image_size // args.patch_size) ** 2 * args.dim * 4 / MiB
        names = model_names(depth, args.block_sizes)
        results[depth] = {}
        for kind in args.kinds:
            runs = {name: [] for name in names}
            for run in range(args.runs):
                for name in names:
                    runs[name].append(memory_run(name, kind, config))
                    log(f"depth {depth} {kind} run {run + 1}/{args.runs} {name}: {runs[name][-1]}")
            rows = {}
            for name in names:
                kept = kept_tensors(name, depth)
                row = dict(kept_tensors=kept, kept_mib=kept * tensor_mib,
                           peak_increase_mib=throughput.summary([r['peak_increase_mib'] for r in runs[name]]))
                if kind == 'train':       # deterministic: the first run's
                    row.update(saved_mib=runs[name][0]['saved_mib'],
                               saved_token_tensors=runs[name][0]['saved_token_tensors'])
                rows[name] = row
            floor, full = rows['simple_vit']['peak_increase_mib']['median'], rows['full']['peak_increase_mib']['median']
            for row in rows.values():
                row['over_simple_vit_mib'] = row['peak_increase_mib']['median'] - floor
                row['below_full_mib'] = full - row['peak_increase_mib']['median']
                row['below_full_by_formula_mib'] = rows['full']['kept_mib'] - row['kept_mib']
            results[depth][kind] = rows
        results[depth]['tensor_mib'] = tensor_mib
    return results


def markdown(results, kinds):
    lines = []
    for depth, by_kind in results.items():
        lines.append(f"\ndepth {depth} ({2 * depth} branches), one (b, n, dim) tensor = "
                     f"{by_kind['tensor_mib']:.2f} MiB")
        for kind in kinds:
            saved = kind == 'train'
            header = ['model', 'kept (formula)', 'kept MiB', 'peak increase MiB, median (min-max)',
                      'over SimpleViT', 'Full less this', 'Full less this (formula)']
            if saved:
                header += ['autograd saves MiB', 'saved (b, n, dim) tensors']
            lines += [f'\n{kind}:\n', '| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
            for name, row in by_kind[kind].items():
                cells = [name, row['kept_tensors'], f"{row['kept_mib']:.0f}",
                         throughput.spread(row['peak_increase_mib'], '{:.0f}'), f"{row['over_simple_vit_mib']:+.0f}",
                         f"{row['below_full_mib']:+.0f}", f"{row['below_full_by_formula_mib']:+.0f}"]
                if saved:
                    cells += [f"{row['saved_mib']:.0f}", row['saved_token_tensors']]
                lines.append('| ' + ' | '.join(str(c) for c in cells) + ' |')
    return '\n'.join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(',') if x]
    parser.add_argument('--depths', type=ints, default=[24, 48])
    parser.add_argument('--block-sizes', type=ints, default=[2, 4, 8, 16],
                        help='Block AttnRes sizes S (those that divide 2 * depth are run)')
    parser.add_argument('--kinds', default='infer,train', help=f'comma-separated, of {KINDS}')
    parser.add_argument('--runs', type=int, default=3, help='fresh-process runs of each model and kind')
    parser.add_argument('--batch', type=int, default=8)
    parser.add_argument('--image-size', type=int, default=64)
    parser.add_argument('--patch-size', type=int, default=4)
    parser.add_argument('--dim', type=int, default=128)
    parser.add_argument('--heads', type=int, default=4)
    parser.add_argument('--dim-head', type=int, default=32)
    parser.add_argument('--mlp-dim', type=int, default=512)
    parser.add_argument('--tiny', action='store_true', help='depth 4, S = 2, 4, 8, width 32 at 16 px, one run')
    parser.add_argument('--json', help='write the results to this file')
    parser.add_argument('--memory-child', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(',') if k]
    for kind in args.kinds:
        if kind not in KINDS:
            parser.error(f'--kinds: expected some of {KINDS}, got {kind!r}')
    if args.tiny:
        args.depths, args.block_sizes, args.runs = [4], [2, 4, 8], 1
        args.batch, args.image_size, args.patch_size, args.dim, args.heads, args.dim_head, args.mlp_dim = \
            2, 16, 4, 32, 2, 16, 64
    for name in ('depths', 'block_sizes'):
        if not getattr(args, name) or min(getattr(args, name)) < 1:
            parser.error(f'--{name.replace("_", "-")}: expected positive ints, got {getattr(args, name)}')
    if args.runs < 1:
        parser.error(f'--runs: expected a positive int, got {args.runs}')
    return args


def main(argv=None, log=None):
    args = parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(json.loads(args.memory_child))))
        return None
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    results = dict(command=shlex.join(['python', 'benchmarks/attn_residual_memory.py'] +
                                      (sys.argv[1:] if argv is None else list(argv))),
                   date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                   machine=throughput.machine(1, 'wall'), load_average=dict(start=os.getloadavg()),
                   config={k: getattr(args, k) for k in ('batch', 'image_size', 'patch_size', 'dim', 'heads',
                                                         'dim_head', 'mlp_dim', 'runs')})
    results['depths'] = measure(args, log)
    results['load_average']['end'] = os.getloadavg()
    m, c = results['machine'], results['config']
    print(f"{results['date']}; {m['cpu']}, 1 thread, torch {m['torch']}, CPU capability {m['cpu_capability']}; "
          f"load average (1 min) {results['load_average']['start'][0]:.2f} -> {results['load_average']['end'][0]:.2f}; "
          f"{c['image_size']} px / {c['patch_size']} ({(c['image_size'] // c['patch_size']) ** 2} tokens), width "
          f"{c['dim']}, {c['heads']} heads of {c['dim_head']}, MLP {c['mlp_dim']}, batch {c['batch']}, fp32; "
          f"{c['runs']} fresh-process run(s) each")
    print(markdown(results['depths'], args.kinds))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == '__main__':
    main()
