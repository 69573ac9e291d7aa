"""The numbers quoted in the captions of the digits pictures (docs/looking-inside.md), from the checkpoint that the
documented command writes:

    python -m vit_pytorch.train --image-size 32 --out runs/digits-32
    python examples/looking_inside.py --checkpoint runs/digits-32/checkpoint --out docs/images
    python examples/picture_numbers.py runs/digits-32/checkpoint
"""

import argparse
import sys
from pathlib import Path

import torch

from vit_pytorch import analysis
from vit_pytorch.recorder import Recorder

sys.path.insert(0, str(Path(__file__).parent))
from looking_inside import load_checkpoint, uniform_distance  # noqa: E402


def main(path):
    model, (images, labels), prepare = load_checkpoint(path)
    with torch.no_grad():
        recorder = Recorder(model)
        logits, attns = recorder(prepare(images))
    layout = dict(grid=recorder.grid, num_prefix_tokens=recorder.num_prefix_tokens)
    print(f"parameters {sum(p.numel() for p in model.parameters()):,}; test accuracy "
          f"{(logits.argmax(-1) == labels).float().mean().item():.4f} on {len(labels)} digits")

    # position embedding similarity: neighbours, by grid distance |row - row'| + |column - column'|
    (h, w), n = layout['grid'], layout['grid'][0] * layout['grid'][1]
    similarity = analysis.position_embedding_similarity(model.pos_embedding, **layout).reshape(n, n)
    rows, columns = torch.arange(n) // w, torch.arange(n) % w
    distance = (rows[:, None] - rows[None]).abs() + (columns[:, None] - columns[None]).abs()
    nearest = similarity.masked_fill(torch.eye(n, dtype=torch.bool), -2).argmax(dim=1)
    print(f"tiles whose most similar other patch is a grid neighbour: "
          f"{(distance[torch.arange(n), nearest] == 1).sum().item()} of {n}")
    border = (rows == 0) | (rows == h - 1) | (columns == 0) | (columns == w - 1)
    print(f"border tiles whose most similar other patch is on the border too: "
          f"{border[nearest][border].sum().item()} of {border.sum().item()}")
    for d in range(1, 5):
        print(f"mean similarity at grid distance {d}: {similarity[distance == d].mean().item():.3f}")

    # mean attention distance per layer and head, averaged over the test digits, as the picture
    per_head = analysis.mean_attention_distance(attns, patch_size=model.patch_size, **layout).mean(dim=0)
    print(f"mean attention distance: {per_head.min().item():.2f} to {per_head.max().item():.2f} pixels; "
          f"uniform attention {uniform_distance(model, **layout):.2f}")

    _, explained = analysis.patch_embedding_components(analysis.patch_filters(model), num_components=14)
    print("variance of the first filter components: " + ", ".join(f"{100 * share:.1f} %" for share in explained[:3]))


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('checkpoint', help='the checkpoint folder the training command wrote, e.g. '
                                           'runs/digits-32/checkpoint')
    main(parser.parse_args().checkpoint)
