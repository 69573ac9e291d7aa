"""Does PoPE extrapolate to longer clips than RoPE? vit_nd_pope against vit_nd_rotary (issue 28, docs/video.md).

    python examples/pope_extrapolation.py --out runs/pope_extrapolation --seeds 0 1 2

Both models are the trainer's small N-D size (dim 64, depth 4, 4 heads of 16, MLP 128; tubelets of 2 x 8 x 8) and
differ only in their positions: N-D RoPE (`vit_nd_rotary`) or N-D PoPE (`vit_nd_pope`), each with vit-pytorch's
default frequencies (1 to 10,000 radians a step) and PoPE's offset starting at 0. The task is the direction of the
moving digits (`vit_pytorch.clips`, 8 classes): a 16-pixel digit moving 1 pixel a frame in a 32 x 32 frame (16
frames at most). Time is not causal here, so the order of the frames reaches the model through its positions alone
(a causal mask would tell it too). Each model trains for `--epochs` (6) epochs on clips of `--train-frames` (8)
frames (one clip per training digit, 1,347) with the trainer's recipe (AdamW at 3e-3 with 3 warm-up epochs and a
cosine decay, weight decay 0.05 on the weight matrices as `parameter_groups` chooses them, PoPE's (heads, dim_head)
offset among them, label smoothing 0.1, gradient clipping at 1, batches of 64), then is tested on the 450 test
digits' clips of each of `--test-frames` frames (8 and 16): the same digits and directions at every length
(`moving_digits` draws the direction first), only the paths longer.

Both models take clips of any length (of whole tubelets), reading the grid from the input as vit-pytorch's do, so
the trained model runs on the longer clips as it is: the positions along time are the integer indices 0 .. slices - 1
(the trained ones, continued), the frequencies and PoPE's offset the trained ones; the outputs are those of the model
built for the longer clips with the trained weights (tests/test_pope_extrapolation.py) and, without causal
dimensions, vit-pytorch 1.26.14's (tests/test_vit_nd_any_grid.py).

Each run writes its accuracies to `<out>/<model>_train<frames>_epochs<epochs>_seed<seed>.json` (`result_name`) and
a later call reuses them; the last lines are the mean ± sd over the seeds and the paired differences (PoPE minus
RoPE, seed by seed). `--models` trains one of the two only (two processes can share the seeds' work).
"""

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vit_pytorch.clips import moving_digits
from vit_pytorch.training.loop import learning_rate, parameter_groups
from vit_pytorch.vit_nd_pope import ViTND as PoPEViTND
from vit_pytorch.vit_nd_rotary import ViTND as RotaryViTND

MODELS = {'vit_nd_rotary': RotaryViTND, 'vit_nd_pope': PoPEViTND}
# the trainer's small size for both (vit_pytorch/training/registry.py), time not causal
SIZE = dict(ndim=3, patch_size=(2, 8, 8), num_classes=8, channels=1, dim=64, depth=4, heads=4, dim_head=16,
            mlp_dim=128)
CLIPS = dict(size=32, digit_size=16, speed=1, task='direction')
RECIPE = dict(lr=3e-3, weight_decay=0.05, warmup_epochs=3, label_smoothing=0.1, clip_grad=1.0, batch_size=64)


def build(name, frames, size=CLIPS['size'], **overrides):
    """The `name` model (a key of MODELS) for clips of `frames` frames of size x size pixels."""
    return MODELS[name](**{**SIZE, **overrides}, input_shape=(frames, size, size))


def clips(split, frames, count=None):
    """(videos (n, 1, frames, 32, 32) in [0, 1], direction labels (n,)) of the split's digits."""
    data = moving_digits(split, count=count, frames=frames, **CLIPS)
    return data.floats(), data.labels


def train(model, videos, labels, *, epochs, seed, **recipe):
    """The trainer's recipe (RECIPE) for `epochs` epochs over (videos, labels), shuffled from `seed`."""
    recipe = {**RECIPE, **recipe}
    optimizer = torch.optim.AdamW(parameter_groups(model, recipe['weight_decay']), lr=recipe['lr'])
    generator = torch.Generator().manual_seed(seed)
    steps_per_epoch = math.ceil(len(labels) / recipe['batch_size'])
    total, warmup = epochs * steps_per_epoch, round(recipe['warmup_epochs'] * steps_per_epoch)
    model.train()
    step = 0
    for _ in range(epochs):
        for batch in torch.randperm(len(labels), generator=generator).split(recipe['batch_size']):
            for group in optimizer.param_groups:
                group['lr'] = learning_rate(step, peak=recipe['lr'], warmup_steps=warmup, total_steps=total)
            loss = F.cross_entropy(model(videos[batch]), labels[batch], label_smoothing=recipe['label_smoothing'])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe['clip_grad'])
            optimizer.step()
            step += 1
    return model.eval()


@torch.no_grad()
def accuracy(model, videos, labels, batch_size=50):
    predictions = torch.cat([model(chunk).argmax(-1) for chunk in videos.split(batch_size)])
    return (predictions == labels).float().mean().item()


def run(name, seed, args):
    """Train `name` at args.train_frames from `seed`; its test accuracy at each of args.test_frames."""
    torch.manual_seed(seed)
    model = build(name, args.train_frames)
    start = time.perf_counter()
    train(model, *clips('train', args.train_frames, args.train), epochs=args.epochs, seed=seed)
    seconds = time.perf_counter() - start
    result = dict(model=name, seed=seed, epochs=args.epochs, train_seconds=round(seconds, 1), accuracy={})
    for frames in args.test_frames:
        result['accuracy'][str(frames)] = accuracy(model, *clips('test', frames, args.test))
    return result


def result_name(name, seed, args):
    """The file of a run's accuracies: the model, the training length, epochs and seed, and the clip counts given."""
    counts = ''.join(f'_{split}{count}' for split, count in (('train', args.train), ('test', args.test)) if count)
    return f'{name}_train{args.train_frames}_epochs{args.epochs}_seed{seed}{counts}.json'


def summary(results, test_frames):
    """Lines: each model's mean ± sd over seeds at each length, then PoPE minus RoPE paired by seed."""
    def mean_sd(values):
        values = [100 * v for v in values]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.2f} ± {sd:.2f}"

    lines = []
    for name in MODELS:
        cells = [f"{frames} frames {mean_sd([r['accuracy'][str(frames)] for r in results[name]])}%"
                 for frames in test_frames]
        lines.append(f"{name}: " + ', '.join(cells))
    paired = []
    for frames in test_frames:
        differences = [p['accuracy'][str(frames)] - r['accuracy'][str(frames)]
                       for p, r in zip(results['vit_nd_pope'], results['vit_nd_rotary'])]
        paired.append(f"{frames} frames {mean_sd(differences)} ("
                      + ', '.join(f"{100 * d:+.2f}" for d in differences) + ')')
    lines.append('PoPE - RoPE, paired: ' + ', '.join(paired))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', type=Path, default=Path('runs/pope_extrapolation'))
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--models', nargs='+', choices=list(MODELS), default=list(MODELS),
                        help='train these only (the summary needs both)')
    parser.add_argument('--epochs', type=int, default=6)
    parser.add_argument('--train-frames', type=int, default=8)
    parser.add_argument('--test-frames', type=int, nargs='+', default=[8, 16])
    parser.add_argument('--train', type=int, default=None, help='training clips (default: one per digit, 1,347)')
    parser.add_argument('--test', type=int, default=None, help='test clips (default: one per digit, 450)')
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {name: [] for name in args.models}
    for seed in args.seeds:
        for name in args.models:
            path = args.out / result_name(name, seed, args)
            if not path.exists() or {str(f) for f in args.test_frames} - set(json.loads(path.read_text())['accuracy']):
                path.write_text(json.dumps(run(name, seed, args), indent=1))
            result = json.loads(path.read_text())
            results[name].append(result)
            print(f"{name} seed {seed}: " + ', '.join(f"{frames} frames {100 * a:.2f}%"
                                                       for frames, a in result['accuracy'].items())
                  + f" ({result['train_seconds']} s of training)", flush=True)
    if len(results) == len(MODELS):
        print(*summary(results, args.test_frames), sep='\n')


if __name__ == '__main__':
    main()
