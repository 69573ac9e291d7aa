"""Draw a few moving-digits clips (vit_pytorch.clips), one row per clip, one column per frame.

    python examples/moving_digits.py                        # writes runs/moving_digits/moving_digits.png
    python examples/moving_digits.py --out docs/images/moving_digits.png   # the picture in docs/video.md
    python examples/moving_digits.py --out clips.png --count 6

Needs matplotlib and scikit-learn (the 'train' extra).
"""

import argparse
from pathlib import Path

from vit_pytorch.clips import DIRECTIONS, moving_digits


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # under runs/ (of the working folder), so that drawing some clips never replaces the documentation's picture
    parser.add_argument('--out', default=str(Path('runs') / 'moving_digits' / 'moving_digits.png'),
                        help='the PNG to write (default: %(default)s)')
    parser.add_argument('--count', type=int, default=4, help='clips to draw')
    parser.add_argument('--split', default='test')
    args = parser.parse_args(argv)

    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    digits = moving_digits(args.split, count=args.count, task='digit')
    directions = moving_digits(args.split, count=args.count, task='direction')   # the same clips, other labels
    frames = digits.videos.shape[2]
    figure, axes = plt.subplots(args.count, frames, figsize=(1.1 * frames, 1.25 * args.count), squeeze=False)
    for row in range(args.count):
        for frame in range(frames):
            axis = axes[row, frame]
            axis.imshow(digits.videos[row, 0, frame], cmap='gray', vmin=0, vmax=255)
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title(f'frame {frame + 1}', fontsize=8)
        name = DIRECTIONS[directions.labels[row]][0]
        axes[row, 0].set_ylabel(f'digit {digits.labels[row].item()}\n{name}', fontsize=8)
    figure.suptitle(f'moving digits ({args.split} split): the class is the digit, or the direction', fontsize=9)
    figure.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=110)
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
