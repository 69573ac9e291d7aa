"""One LeJEPA training step, vit-pytorch 1.26.14's LeJEPA against ours, on the same network (our ViT at
vit-pytorch's `__main__` shape scaled to this machine: 64 tokens as its 256 px / 32, width 256, depth 6, 8 heads,
MLP 512), vit-pytorch's projector (hidden 256, 4 layers, K = 65336), batch 8, AdamW, one thread.

    cd /tmp && /work/ref/refvenv/bin/python /path/to/benchmarks/lejepa_step.py --rounds 5 --memory 3

Modes (each its own copy of the same initial weights):
  theirs   vit-pytorch's LeJEPA: 2 local views with gradient, 2 global views under no_grad (its stop-gradient);
  ours     the paper's step: 2 global + 2 local views, all 4 with gradient (twice theirs' backward);
  ours2    ours with num_local_crops=0: the 2 global views with gradient, no others;
  ours_eq  theirs' work done by our code: our 4 views, 2 of them with gradient (our loss on the 2 global ones)
           and the 2 local ones projected under no_grad (ours has no stop-gradient option: this is not a LeJEPA
           step, only the same amount of work as theirs).
Speed: CPU time of a step, the modes interleaved (every mode once per round, the order rotating), after one
warm-up step each; ratios are paired within a round (theirs / mode: above 1, the mode is faster). Memory: the peak
RSS increase over two steps, from a state with learner, optimizer and batch built, each in a fresh process
(`--memory` runs per mode). Needs vit-pytorch 1.26.14 (and its torchvision) installed beside torch, or
$VIT_PYTORCH_SOURCE (its wheel or unpacked folder).
"""
import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import time
import types
import zipfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from vit_pytorch import ViT  # noqa: E402  (ours, from this checkout)

MODES = ('theirs', 'ours', 'ours2', 'ours_eq')
NET = dict(image_size=64, patch_size=8, num_classes=1000, dim=256, depth=6, heads=8, mlp_dim=512)
LEARNER = dict(image_size=64, projection_hidden_size=256, projection_layers=4, num_classes_K=65336)
IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))   # theirs normalises in its augmentation


def reference_lejepa():
    """vit-pytorch 1.26.14's lejepa module (it imports torch, torchvision and einops, nothing of its package): from
    $VIT_PYTORCH_SOURCE (its wheel or unpacked folder) or the installed vit-pytorch, under another name than ours."""
    source = os.environ.get('VIT_PYTORCH_SOURCE')
    module = types.ModuleType('reference_lejepa')
    if source and source.endswith('.whl'):
        with zipfile.ZipFile(source) as wheel:
            code = wheel.read('vit_pytorch/lejepa.py').decode()
    else:
        path = os.path.join(source, 'lejepa.py') if source else \
            importlib.metadata.distribution('vit-pytorch').locate_file('vit_pytorch/lejepa.py')
        with open(path) as file:
            code = file.read()
    exec(compile(code, 'vit-pytorch 1.26.14 lejepa.py', 'exec'), module.__dict__)
    return module


def learner_of(mode, net=NET, learner=LEARNER, reference=None):
    """(learner, loss function of a batch) of a mode, its network from the same initial weights (seed 0);
    `reference`: vit-pytorch's lejepa module for 'theirs' (else `reference_lejepa()`)."""
    torch.manual_seed(0)
    network = ViT(**net)
    if mode == 'theirs':
        model = (reference or reference_lejepa()).LeJEPA(network, hidden_layer='to_latent', **learner)
    else:
        from vit_pytorch.lejepa import LeJEPA
        model = LeJEPA(network, **learner, **IMAGENET, num_local_crops=0 if mode == 'ours2' else 2)

    def loss_of(images):
        if mode != 'ours_eq':
            return model(images)
        global_views, local_views = model.views(images)
        with torch.no_grad():
            model.project(local_views)
        return model.loss(model.project(global_views))
    return model, loss_of


def build(mode):
    """(step function, learner) of a mode, its network from the same initial weights."""
    learner, loss_of = learner_of(mode)
    optimizer = torch.optim.AdamW(learner.parameters(), lr=3e-4)

    def step(images):
        optimizer.zero_grad(set_to_none=True)
        loss_of(images).backward()
        optimizer.step()
    return step, learner


def rss_mib(field):
    with open('/proc/self/status') as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith(field + ':'))


def memory_child(mode, batch):
    torch.set_num_threads(1)
    step, _ = build(mode)
    images = torch.rand(batch, 3, NET['image_size'], NET['image_size'])
    before = rss_mib('VmRSS')
    for _ in range(2):
        step(images)
    return rss_mib('VmHWM') - before


def summary(values):
    return statistics.median(values), min(values), max(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--batch', type=int, default=8)
    parser.add_argument('--memory', type=int, default=1, help='fresh-process memory runs per mode (0: none)')
    parser.add_argument('--modes', default=','.join(MODES))
    parser.add_argument('--memory-child', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(dict(peak_increase_mib=memory_child(args.memory_child, args.batch))))
        return
    torch.set_num_threads(1)
    modes = args.modes.split(',')
    steps = {mode: build(mode)[0] for mode in modes}
    images = torch.rand(args.batch, 3, NET['image_size'], NET['image_size'])
    for mode in modes:                                # warm-up
        steps[mode](images)
    times = {mode: [] for mode in modes}
    for r in range(args.rounds):
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
            start = time.process_time()
            steps[mode](images)
            times[mode].append(time.process_time() - start)
        print(f'round {r + 1}/{args.rounds} done', file=sys.stderr)
    memory = {}
    for mode in modes:
        runs = []
        for _ in range(args.memory):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), '--memory-child', mode,
                                  '--batch', str(args.batch)], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1])['peak_increase_mib'])
        memory[mode] = runs
    print(f'torch {torch.__version__}, 1 thread, CPU time, batch {args.batch}, {args.rounds} rounds; '
          f'median (min-max)')
    for mode in modes:
        line = '{:8s} step {:.3f} s ({:.3f}-{:.3f})'.format(mode, *summary(times[mode]))
        if mode != 'theirs' and 'theirs' in times:
            line += '  speed vs theirs {:.2f} ({:.2f}-{:.2f})'.format(
                *summary([t / o for t, o in zip(times['theirs'], times[mode])]))
        if memory[mode]:
            line += '  train MiB {:.0f} ({:.0f}-{:.0f})'.format(*summary(memory[mode]))
            if mode != 'theirs' and memory.get('theirs'):
                line += '  memory vs theirs {:.2f}'.format(statistics.median(memory[mode]) /
                                                           statistics.median(memory['theirs']))
        print(line)


if __name__ == '__main__':
    main()
