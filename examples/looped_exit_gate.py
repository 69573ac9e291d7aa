"""Does the trainer's exit-gate loss give LoopedViT a gate that exits early? The looped_vit runs of docs/blocks.md.

    python examples/looped_exit_gate.py --out runs/looped_exit_gate --threads 1

Trains the trainer's small looped_vit on the digits with deep supervision and the exit gate
(`python -m vit_pytorch.train --model looped_vit --deep-supervision --adaptive-loop True`), once with
`--exit-gate-loss-weight 1` and once with 0 (the gate built, not trained), then on the 450 test digits prints
each checkpoint's gate error (the mean squared error of its predictions to `adaptive_exit_targets`), every loop's
accuracy, and at a few thresholds the accuracy and mean loop count of the adaptive exit taken image by image (each
image stops after its first loop whose predicted gain is at most the threshold, as `adaptive_exit=True` does for a
batch of one).
"""

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from vit_pytorch import train
from vit_pytorch.evaluate import load_digits
from vit_pytorch.looped_vit import adaptive_exit_targets
from vit_pytorch.training.checkpoints import load_model
from vit_pytorch.training.data import normalise


def gate_report(checkpoint, thresholds=(0.0, 0.05, 0.2)):
    model, config = load_model(checkpoint)
    data = config['data']
    test = load_digits(data['test_split'], image_size=data['image_size'])
    x, y = normalise(test.floats(torch.arange(len(test))), data['mean'], data['std']), test.labels
    with torch.no_grad():
        logits, benefits = model(x, return_all_logits=True, return_exit_benefits=True)
        error = F.mse_loss(benefits, adaptive_exit_targets(logits, y)).item()
    lines = [f"gate MSE {error:.4f}; accuracy after each loop "
             + ' '.join(f"{(loop.argmax(-1) == y).float().mean().item():.4f}" for loop in logits)]
    for threshold in thresholds:
        below = torch.cat((benefits <= threshold, torch.ones(1, len(y), dtype=torch.bool)))   # the last loop ends
        stop = below.float().argmax(dim=0)                                                   # first loop at or below
        correct = (logits[stop, torch.arange(len(y))].argmax(-1) == y).float().mean().item()
        lines.append(f"threshold {threshold}: accuracy {correct:.4f}, mean loops {(stop + 1).float().mean():.2f}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', type=Path, default=Path('runs/looped_exit_gate'))
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    for weight in (1, 0):
        out = args.out / f'weight_{weight}'
        if not (out / 'checkpoint').exists():
            train.main([str(option) for option in (
                '--data', 'digits', '--model', 'looped_vit', '--deep-supervision', '--adaptive-loop', 'True',
                '--exit-gate-loss-weight', weight, '--epochs', args.epochs, '--seed', args.seed,
                '--threads', args.threads, '--no-plots', '--quiet', '--out', out)])
        print(f"--exit-gate-loss-weight {weight}:", *gate_report(out / 'checkpoint'), sep='\n  ')


if __name__ == '__main__':
    main()
