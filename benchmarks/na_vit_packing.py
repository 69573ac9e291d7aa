"""NaViT on a mix of image sizes: packing, variable-length attention and padding, measured.

One NaViT (by default ViT-S/16's width and heads, 6 layers, images up to 224 px), one fixed
mix of images whose sides are random multiples of the patch between `--min-size` and 224
pixels, and ways to run them that give the same logits (checked before timing):

  varlen          packing='varlen': every image attends within its own tokens, images of
                  one length batched into one attention call; nothing padded
  packed@N        packing='mask', group_images=True, group_max_seq_len=N: the paper's packing,
                  a block-diagonal mask in the fused attention (one row per sequence, padded
                  to the longest)
  padded          packing='mask', one image per sequence, padded to the largest image's
                  token count (a key-padding mask): padding every image to the largest size

and, for scale, `resized`: every image zero-padded to the largest image's pixels and run as one
(b, c, H, W) batch (other logits: the padding becomes tokens).

Reported: images/s of inference (eval, `torch.inference_mode`) and of a training step
(forward, cross-entropy, backward, AdamW), the median over interleaved rounds (every way once
per round, the order rotated), and the tokens each way computes on (padding included). A
second section times the attention alone on the same tokens (q, k, v of one layer): the
packed mask, the variable-length runs, and a nested (jagged) tensor through
`scaled_dot_product_attention`. CPU, one thread and this process's CPU time by default.

    python benchmarks/na_vit_packing.py
    python benchmarks/na_vit_packing.py --images 32 --depth 12 --rounds 5 --json packing.json
"""

import argparse
import json
import platform
import random
import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from einops import rearrange

from vit_pytorch.na_vit import NaViT
from vit_pytorch.vit import attend_segments


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--images', type=int, default=24, help='images in the mix')
    parser.add_argument('--min-size', type=int, default=32, help='smallest image side, pixels')
    parser.add_argument('--image-size', type=int, default=224, help='largest image side, pixels')
    parser.add_argument('--patch-size', type=int, default=16)
    parser.add_argument('--dim', type=int, default=384)
    parser.add_argument('--depth', type=int, default=6)
    parser.add_argument('--heads', type=int, default=6)
    parser.add_argument('--mlp-dim', type=int, default=1536)
    parser.add_argument('--group-max-seq-lens', default='256,1024', help='packed@N ways, comma-separated')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--clock', choices=('cpu', 'wall'), default='cpu',
                        help="'cpu': this process's CPU time (steady on a shared machine); 'wall': wall clock")
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--json', help='write the results here')
    return parser.parse_args(argv)


def image_mix(args):
    rng = random.Random(args.seed)
    sides = range(args.min_size // args.patch_size, args.image_size // args.patch_size + 1)
    generator = torch.Generator().manual_seed(args.seed)
    return [torch.randn(3, rng.choice(sides) * args.patch_size, rng.choice(sides) * args.patch_size,
                        generator=generator) for _ in range(args.images)]


def zero_padded(images):
    height, width = max(i.shape[1] for i in images), max(i.shape[2] for i in images)
    return torch.stack([F.pad(i, (0, width - i.shape[2], 0, height - i.shape[1])) for i in images])


def ways(args, images):
    """name -> (packing, how to call the model on the images, tokens computed on per layer)."""
    lengths = token_counts(images, args.patch_size)
    found = {'varlen': ('varlen', lambda model: model(images), sum(lengths))}
    for max_len in (int(n) for n in args.group_max_seq_lens.split(',')):
        def packed(model, max_len=max_len):
            return model(images, group_images=True, group_max_seq_len=max_len)
        rows = greedy_rows(lengths, max_len)
        found[f'packed@{max_len}'] = ('mask', packed, len(rows) * max(sum(lengths[i] for i in row) for row in rows))
    found['padded'] = ('mask', lambda model: model([[image] for image in images]), len(images) * max(lengths))
    batch = zero_padded(images)
    found['resized'] = ('varlen', lambda model: model(batch), len(images) * token_counts(batch[:1], args.patch_size)[0])
    return found


def token_counts(images, patch_size):
    return [(image.shape[-2] // patch_size) * (image.shape[-1] // patch_size) for image in images]


def greedy_rows(lengths, max_len):
    """Indices of the images in each sequence of greedy packing (what group_images=True does)."""
    rows, row, length = [], [], 0
    for index, tokens in enumerate(lengths):
        if row and length + tokens > max_len:
            rows.append(row)
            row, length = [], 0
        row.append(index)
        length += tokens
    return rows + [row]


def clock(args):
    return time.process_time if args.clock == 'cpu' else time.perf_counter


def timed(tick, fn):
    start = tick()
    fn()
    return tick() - start


def bench_model(args, images, log=print):
    torch.manual_seed(args.seed)
    kwargs = dict(image_size=args.image_size, patch_size=args.patch_size, num_classes=1000, dim=args.dim,
                  depth=args.depth, heads=args.heads, mlp_dim=args.mlp_dim, dim_head=args.dim // args.heads)
    source = NaViT(**kwargs)
    models = {packing: NaViT(**kwargs, packing=packing) for packing in ('varlen', 'mask')}
    for model in models.values():
        model.load_state_dict(source.state_dict())
    labels = torch.randint(0, 1000, (len(images),), generator=torch.Generator().manual_seed(1))
    optimizers = {packing: torch.optim.AdamW(model.parameters(), lr=1e-6) for packing, model in models.items()}
    found = ways(args, images)

    with torch.inference_mode():
        reference = models['varlen'].eval()(images)
        for name, (packing, run, _) in found.items():
            if name != 'resized':
                torch.testing.assert_close(run(models[packing].eval()), reference, atol=1e-4, rtol=1e-4)
    log(f'logits agree across {", ".join(name for name in found if name != "resized")}')

    def infer(packing, run):
        models[packing].eval()
        with torch.inference_mode():
            run(models[packing])

    def train(packing, run):
        models[packing].train()
        optimizers[packing].zero_grad(set_to_none=True)
        F.cross_entropy(run(models[packing]), labels).backward()
        optimizers[packing].step()

    tick, names = clock(args), list(found)
    speeds = {task: {name: [] for name in names} for task in ('infer', 'train')}
    for name in names:                      # warm-up: allocations, kernel choices
        infer(found[name][0], found[name][1])
        train(found[name][0], found[name][1])
    for round_index in range(args.rounds):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for task, step in (('infer', infer), ('train', train)):
            for name in order:
                packing, run, _ = found[name]
                speeds[task][name].append(len(images) / timed(tick, lambda: step(packing, run)))
        log(f'round {round_index + 1}/{args.rounds}: ' + ', '.join(
            f'{name} {speeds["infer"][name][-1]:.1f}/{speeds["train"][name][-1]:.1f}' for name in names))
    return {name: dict(tokens=found[name][2], **{task: statistics.median(speeds[task][name]) for task in speeds},
                       rounds={task: speeds[task][name] for task in speeds}) for name in names}


def bench_attention(args, images, log=print):
    """One attention layer's q, k, v for the mix: masked packed rows, varlen runs and a jagged nested tensor."""
    heads, dim_head = args.heads, args.dim // args.heads
    lengths = token_counts(images, args.patch_size)
    starts = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    generator = torch.Generator().manual_seed(args.seed)
    qkv = torch.randn(3, 1, heads, starts[-1], dim_head, generator=generator)      # tokens in input order

    # varlen: the model sorts the tokens by image length once per forward, outside the layers
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    by_length = qkv[:, :, :, torch.cat([torch.arange(starts[i], starts[i + 1]) for i in order])]
    runs = {}
    for i in order:
        runs[lengths[i]] = runs.get(lengths[i], 0) + 1
    segments = tuple((count, length, length) for length, count in runs.items())

    class Plain:
        @staticmethod
        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

    def masked(rows):
        width = max(starts[row[-1] + 1] - starts[row[0]] for row in rows)
        ids = torch.full((len(rows), width), -1)
        padded = torch.zeros(3, len(rows), heads, width, dim_head)
        for r, row in enumerate(rows):
            begin, end = starts[row[0]], starts[row[-1] + 1]
            padded[:, r, :, :end - begin] = qkv[:, 0, :, begin:end]
            for i in row:
                ids[r, starts[i] - begin:starts[i + 1] - begin] = i
        mask = rearrange(ids, 'b i -> b 1 i 1') == rearrange(ids, 'b j -> b 1 1 j')
        return lambda: F.scaled_dot_product_attention(*padded, attn_mask=mask)

    nested = [torch.nested.nested_tensor(list(rearrange(t[0], 'h n d -> n h d').split(lengths)),
                                         layout=torch.jagged).transpose(1, 2) for t in qkv]
    candidates = {'varlen': lambda: attend_segments(Plain, *by_length, segments),
                  'nested (jagged)': lambda: F.scaled_dot_product_attention(*nested)}
    for max_len in (int(n) for n in args.group_max_seq_lens.split(',')):
        candidates[f'packed@{max_len}'] = masked(greedy_rows(lengths, max_len))
    candidates['padded'] = masked([[i] for i in range(len(lengths))])

    # the nested tensor's result, per image, is the varlen runs' result
    per_image = candidates['nested (jagged)']().transpose(1, 2).unbind()
    varlen = rearrange(candidates['varlen'](), '1 h n d -> n h d').split([lengths[i] for i in order])
    for position, i in enumerate(order):
        torch.testing.assert_close(per_image[i], varlen[position], atol=1e-5, rtol=1e-5)

    tick = clock(args)
    times = {name: [] for name in candidates}
    for fn in candidates.values():
        fn()
    for _ in range(args.rounds):
        for name, fn in candidates.items():
            times[name].append(timed(tick, fn))
    result = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    log('attention alone (ms): ' + ', '.join(f'{name} {ms:.1f}' for name, ms in result.items()))
    return result


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    images = image_mix(args)
    sizes = [tuple(i.shape[1:]) for i in images]
    print(f'{len(images)} images, sides {args.min_size}-{args.image_size} px, '
          f'{sum(token_counts(images, args.patch_size))} tokens; torch {torch.__version__}, '
          f'{args.threads} thread(s), {args.clock} clock, {platform.processor() or platform.machine()}')
    model = bench_model(args, images)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')             # nested tensors are a prototype
        attention = bench_attention(args, images)
    print(f'\n| way | tokens per layer | inference images/s | training images/s |\n|---|---|---|---|')
    for name, row in model.items():
        print(f"| {name} | {row['tokens']} | {row['infer']:.2f} | {row['train']:.2f} |")
    print(f'\n| attention alone (one layer) | ms |\n|---|---|')
    for name, ms in attention.items():
        print(f'| {name} | {ms:.1f} |')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(args=vars(args), sizes=sizes, model=model, attention_ms=attention), f, indent=1)


if __name__ == '__main__':
    main()
