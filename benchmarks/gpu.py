"""What a GPU would tell us, in one run of under five minutes: ViT-B/16 training throughput and MFU in bf16,
the torch.compile speed-up of a training step, and the largest training batch that fits.

    python benchmarks/gpu.py --json gpu.json          # CUDA when there is one, else the CPU
    python benchmarks/gpu.py --device cpu --tiny      # the CPU path in seconds (what the tests run)

The model is our `ViT` at ViT-B/16 (224 px, 1000 classes, the paper's configuration: `patch_norm=False`,
`qkv_bias=True`, `norm_eps=1e-6`). A training step is forward, cross-entropy, backward and AdamW (fused on
CUDA) under bf16 autocast, the weights in fp32; attention goes through `scaled_dot_product_attention`, which on
CUDA picks its fused kernels (the report names the backends torch has enabled). Speeds are images/s over timed
steps after warm-up, the device synchronised around each timing, as the median (and min-max) of `--rounds`
rounds; eager and compiled steps are timed in alternating rounds.

MFU is the model FLOPs of a training step (counted by `torch.utils.flop_counter` with explicit attention,
one multiply-add = two FLOPs: `vit_pytorch.flops.training_flops`) times images/s over a peak: the chip's
bf16 dense peak from its datasheet where the device name is in `DATASHEET_PEAKS`, and always the bf16 matmul
peak measured here on large products (on a CPU that is the figure to read). Goals (issue 29): MFU at least
50% of the chip's peak, compile speed-up at least 1.2x.

The largest batch: doubling from `--batch` until a step runs out of memory, then bisecting between the last
batch that fit and the first that did not, to within 8; each try is one full training step, with the
allocator emptied between tries. A CPU has no such wall, so there the search stops at `--max-batch`.
`--budget-s` bounds the whole run: a section that would start after it is reported as skipped.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from vit_pytorch import ViT
from vit_pytorch.flops import training_flops

B16 = dict(image_size=224, patch_size=16, num_classes=1000, dim=768, depth=12, heads=12, mlp_dim=3072,
           patch_norm=False, qkv_bias=True, norm_eps=1e-6)
TINY = dict(image_size=32, patch_size=8, num_classes=10, dim=64, depth=2, heads=2, mlp_dim=128,
            patch_norm=False, qkv_bias=True, norm_eps=1e-6)
# bf16 dense tensor-core peaks (without sparsity), TFLOP/s, from NVIDIA's datasheets; matched on the device name
DATASHEET_PEAKS = {'H200': 989.4, 'H100 SXM': 989.4, 'H100 80GB HBM3': 989.4, 'H100 PCIe': 756.0,
                   'H100 NVL': 835.0, 'A100': 312.0, 'L40S': 362.1, 'L4': 121.0, 'A10G': 70.0}
SECTIONS = ('throughput', 'compile', 'batch')


def datasheet_peak(device_name):
    """The bf16 dense peak (FLOP/s) of the chip named `device_name`, or None when it is not in the table; the
    longest matching name wins ('H100 PCIe' before 'H100')."""
    matches = [name for name in DATASHEET_PEAKS if name.lower() in device_name.lower()]
    return DATASHEET_PEAKS[max(matches, key=len)] * 1e12 if matches else None


def synchronize(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def matmul_peak(device, size, repeats=5):
    """The best bf16 FLOP/s of (size x size) @ (size x size) products on `device`."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    torch.mm(a, b)
    best = math.inf
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best


class TrainStep:
    """One bf16-autocast training step of `model` on a fixed batch of random images."""

    def __init__(self, model, config, batch, device):
        self.model, self.device, self.batch = model, device, batch
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == 'cuda')
        self.images = torch.randn(batch, 3, config['image_size'], config['image_size'], device=device)
        self.labels = torch.randint(0, config['num_classes'], (batch,), device=device)

    def __call__(self):
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(self.model(self.images), self.labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def images_per_s(self, steps):
        synchronize(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            self()
        synchronize(self.device)
        return self.batch * steps / (time.perf_counter() - start)


def summary(values):
    return dict(median=statistics.median(values), min=min(values), max=max(values), rounds=list(values))


def build(config, device, seed=0):
    torch.manual_seed(seed)
    return ViT(**config).to(device).train()


def bench_throughput(args, config, device, peaks, flops_per_image):
    step = TrainStep(build(config, device), config, args.batch, device)
    for _ in range(args.warmup):
        step()
    speeds = [step.images_per_s(args.steps) for _ in range(args.rounds)]
    result = dict(batch=args.batch, images_per_s=summary(speeds))
    result['mfu'] = {name: flops_per_image * result['images_per_s']['median'] / peak
                     for name, peak in peaks.items() if peak}
    if device.type == 'cuda':
        result['peak_memory_mib'] = torch.cuda.max_memory_allocated(device) / 2 ** 20
    return result


def bench_compile(args, config, device):
    eager = TrainStep(build(config, device), config, args.batch, device)
    compiled_model = torch.compile(build(config, device))
    compiled = TrainStep(compiled_model, config, args.batch, device)
    start = time.perf_counter()
    compiled()
    synchronize(device)
    compile_s = time.perf_counter() - start
    for _ in range(args.warmup):
        eager()
        compiled()
    speeds = {'eager': [], 'compiled': []}
    for round_ in range(args.rounds):
        # alternate which goes first, so that a drift in the device's clock falls on both
        order = ('eager', 'compiled') if round_ % 2 == 0 else ('compiled', 'eager')
        for name in order:
            speeds[name].append((eager if name == 'eager' else compiled).images_per_s(args.steps))
    ratios = [c / e for c, e in zip(speeds['compiled'], speeds['eager'])]
    return dict(batch=args.batch, compile_s=compile_s, eager=summary(speeds['eager']),
                compiled=summary(speeds['compiled']), speedup=summary(ratios))


def largest_batch(fits, start, limit, multiple=8):
    """The largest batch b <= limit with fits(b), to within `multiple`: doubling from `start`, then bisecting
    in steps of `multiple`, so that b fits and b + multiple does not (or b is the limit). Assumes that a batch
    fits when a larger one does. Returns (that batch, or 0 when not even `start` fits; the batches tried)."""
    tried = []

    def attempt(batch):
        tried.append(batch)
        return fits(batch)

    if not attempt(start):
        return 0, tried
    good, bad = start, None
    while bad is None and good < limit:
        candidate = min(good * 2, limit)
        if attempt(candidate):
            good = candidate
        else:
            bad = candidate
    while bad is not None and bad - good > multiple:
        middle = good + max(multiple, (bad - good) // 2 // multiple * multiple)
        if attempt(middle):
            good = middle
        else:
            bad = middle
    return good, tried


def bench_batch(args, config, device):
    model = build(config, device)

    def fits(batch):
        try:
            TrainStep(model, config, batch, device)()
            synchronize(device)
            return True
        except torch.OutOfMemoryError:
            return False
        finally:
            model.zero_grad(set_to_none=True)
            if device.type == 'cuda':
                torch.cuda.empty_cache()

    best, tried = largest_batch(fits, args.batch, args.max_batch)
    return dict(largest=best, tried=tried, limit=args.max_batch,
                stopped_by='the limit (--max-batch)' if best == args.max_batch else 'memory')


def fused_attention_backends(device):
    if device.type != 'cuda':
        return {}
    return dict(flash=torch.backends.cuda.flash_sdp_enabled(),
                memory_efficient=torch.backends.cuda.mem_efficient_sdp_enabled(),
                cudnn=torch.backends.cuda.cudnn_sdp_enabled(), math=torch.backends.cuda.math_sdp_enabled())


def run(args, log):
    device = torch.device(args.device or ('cuda' if torch.cuda.is_available() else 'cpu'))
    if args.threads:
        torch.set_num_threads(args.threads)
    config = TINY if args.tiny else B16
    started = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'
    flops_per_image, _ = training_flops(ViT(**config), config['image_size'], num_classes=config['num_classes'])
    peaks = {'datasheet': datasheet_peak(name) if device.type == 'cuda' else None,
             'measured matmul': matmul_peak(device, 256 if args.tiny else 8192)}
    result = dict(device=name, torch=torch.__version__, config='tiny' if args.tiny else 'B/16',
                  config_arguments=config, training_flops_per_image=flops_per_image, peaks=peaks,
                  fused_attention=fused_attention_backends(device), skipped=[])
    for section in args.sections:
        if time.perf_counter() - started > args.budget_s:
            result['skipped'].append(section)
            log(f'{section}: skipped, the budget of {args.budget_s:.0f} s is spent')
            continue
        log(f'{section} ...')
        if section == 'throughput':
            result['throughput'] = bench_throughput(args, config, device, peaks, flops_per_image)
        elif section == 'compile':
            result['compile'] = bench_compile(args, config, device)
        else:
            result['batch'] = bench_batch(args, config, device)
    result['seconds'] = time.perf_counter() - started
    return result


def report(result):
    out = [f"{result['config']} on {result['device']} (torch {result['torch']}), bf16 autocast, "
           f"{result['training_flops_per_image'] / 1e9:.2f} GFLOP per training image"]
    for name, peak in result['peaks'].items():
        out.append(f'  peak ({name}): ' + (f'{peak / 1e12:.1f} TFLOP/s' if peak else 'not known for this device'))
    if result['fused_attention']:
        out.append('  scaled_dot_product_attention backends enabled: '
                   + ', '.join(k for k, v in result['fused_attention'].items() if v))
    if 'throughput' in result:
        t = result['throughput']
        s = t['images_per_s']
        out.append(f"training, batch {t['batch']}: {s['median']:.1f} images/s ({s['min']:.1f}-{s['max']:.1f})")
        for name, mfu in t['mfu'].items():
            out.append(f'  MFU against the {name} peak: {100 * mfu:.1f}% (goal: 50% of the chip\'s peak)')
    if 'compile' in result:
        c = result['compile']
        out.append(f"torch.compile, batch {c['batch']}: compiled in {c['compile_s']:.0f} s, speed-up "
                   f"{c['speedup']['median']:.2f}x ({c['speedup']['min']:.2f}-{c['speedup']['max']:.2f}; goal 1.2x)")
    if 'batch' in result:
        b = result['batch']
        out.append(f"largest training batch that fits: {b['largest']} (tried {b['tried']}; stopped by "
                   f"{b['stopped_by']})")
    for section in result['skipped']:
        out.append(f'{section}: skipped (over the time budget)')
    out.append(f"took {result['seconds']:.0f} s")
    return '\n'.join(out)


def sections(text):
    names = [name for name in text.split(',') if name]
    unknown = [name for name in names if name not in SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f'sections are a comma-separated choice of {", ".join(SECTIONS)}; '
                                         f'got {text!r}')
    return names


def positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f'expected a positive number, got {text!r}')
        return value
    return parse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--device', choices=('cuda', 'cpu'), default=None,
                        help='default: cuda when torch sees one, else cpu')
    parser.add_argument('--tiny', action='store_true', help='a 2-layer 32-pixel ViT instead of ViT-B/16 (tests)')
    parser.add_argument('--sections', type=sections, default=list(SECTIONS), help=', '.join(SECTIONS))
    parser.add_argument('--batch', type=positive(int), default=128, help='training batch (default 128)')
    parser.add_argument('--max-batch', type=positive(int), default=4096,
                        help='the largest batch the search tries (default 4096)')
    parser.add_argument('--steps', type=positive(int), default=10, help='timed steps per round')
    parser.add_argument('--warmup', type=positive(int), default=3)
    parser.add_argument('--rounds', type=positive(int), default=5)
    parser.add_argument('--threads', type=positive(int), default=None)
    parser.add_argument('--budget-s', type=positive(float), default=270.,
                        help='no section starts after this many seconds (default 270: the run fits in 5 minutes)')
    parser.add_argument('--json', default=None, help='write the results here')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    result = run(args, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(report(result))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == '__main__':
    main()
