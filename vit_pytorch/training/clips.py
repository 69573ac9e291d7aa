"""Moving digits: video clips made from real handwritten digits, generated on the fly, offline.

Each clip shows one of scikit-learn's handwritten digits (real 8 x 8 scans, upsampled to
`digit_size`) moving in a straight line at `speed` pixels per frame across a larger black frame,
for `frames` frames; the path always stays inside the frame. The class is the digit
(task='digit', 10 classes: any single frame tells) or the direction of motion (task='direction',
8 classes: right, down-right, down, ..., up-right; no single frame tells, the order of the frames
does). The digits are split as the trainer splits them (1,347 train, 450 test, a stratified
quarter with random_state=0), so that no test digit is ever seen in a training clip, and clip i
of a split shows digit i modulo the split's size: `count` = k x 1,347 shows every training digit
k times, each time on another random path. Nothing is stored on disk; the same arguments always
give the same clips. Needs scikit-learn (the 'train' extra) for the digits.

    from vit_pytorch.clips import moving_digits

    train = moving_digits('train', count=2694, task='direction')
    train.videos.shape, train.labels.shape    # (2694, 1, 8, 32, 32) uint8, (2694,)
    video = train.floats(slice(0, 4))         # (4, 1, 8, 32, 32) in [0, 1]

The training command reads them as `--data clips:digit` or `--data clips:direction`
(`data_source`): one clip of 8 frames per digit of each split (1,347 to train on, 450 to test),
frames of `--image-size` pixels (default 32) with the digit at half that side, moving the most
whole pixels a frame that keep its path inside (2 at 32 pixels, 1 at 16).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

SPLITS = ('train', 'test')
TASKS = ('digit', 'direction')
# (name, (dy, dx)) of the 8 directions of motion, clockwise from right (y grows downwards)
DIRECTIONS = (('right', (0, 1)), ('down-right', (1, 1)), ('down', (1, 0)), ('down-left', (1, -1)),
              ('left', (0, -1)), ('up-left', (-1, -1)), ('up', (-1, 0)), ('up-right', (-1, 1)))


@dataclass
class Clips:
    """Videos (n, 1, frames, size, size) as uint8 in [0, 255], integer labels (n,) and the class names."""
    videos: torch.Tensor
    labels: torch.Tensor
    classes: list

    def __len__(self):
        return len(self.labels)

    def floats(self, index=slice(None)):
        return self.videos[index].float() / 255


def split_digits(split, digit_size):
    """The split's digits upsampled to digit_size x digit_size, uint8 (n, digit_size, digit_size), and labels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    train_index, test_index = train_test_split(range(len(digits.target)), test_size=0.25, random_state=0,
                                               stratify=digits.target)
    index = train_index if split == 'train' else test_index
    images = torch.tensor(digits.images[index], dtype=torch.float32)[:, None] / 16      # (n, 1, 8, 8) in [0, 1]
    if digit_size != 8:
        images = F.interpolate(images, size=(digit_size, digit_size), mode='bilinear', antialias=True)
    images = (images.clamp(0, 1) * 255).round().to(torch.uint8)[:, 0]
    return images, torch.tensor(digits.target[index])


def moving_digits(split, *, count=None, frames=8, size=32, digit_size=16, speed=2, task='digit', seed=0):
    """Clips of the `split` ('train' or 'test') digits moving across a size x size frame; see the module.

    `count` clips (default: one per digit of the split); a clip's path is drawn from `seed` and the split.
    """
    check_arguments(split=split, count=count, frames=frames, size=size, digit_size=digit_size, speed=speed,
                    task=task, seed=seed)
    digits, digit_labels = split_digits(split, digit_size)
    count = len(digits) if count is None else count
    generator = torch.Generator().manual_seed(seed * 2 + SPLITS.index(split))
    which = torch.arange(count) % len(digits)
    direction = torch.randint(len(DIRECTIONS), (count,), generator=generator)
    steps = torch.tensor([step for _, step in DIRECTIONS])[direction] * speed      # (n, 2): pixels per frame
    # the start is drawn so that the whole path stays inside the frame
    travel = (frames - 1) * steps                                                  # (n, 2)
    room = size - digit_size - travel.abs()                                        # free range of the start
    start = (torch.rand(count, 2, generator=generator) * (room + 1)).floor().long() + (-travel).clamp(min=0)
    corner = start[:, None] + torch.arange(frames)[None, :, None] * steps[:, None]  # (n, frames, 2): top-left
    videos = paint(digits[which], corner, size)

    if task == 'digit':
        labels, classes = digit_labels[which], [str(digit) for digit in range(10)]
    else:
        labels, classes = direction, [name for name, _ in DIRECTIONS]
    return Clips(videos[:, None], labels, classes)


def paint(digits, corner, size):
    """(n, frames, size, size) uint8 frames, black but for digit i (n, ds, ds) with its top-left pixel at
    corner[i, t] (n, frames, 2) in frame t."""
    count, frames = corner.shape[:2]
    offsets = torch.arange(digits.shape[-1])
    rows = corner[..., 0, None, None] + offsets[:, None]                            # (n, frames, ds, 1)
    columns = corner[..., 1, None, None] + offsets[None, :]                         # (n, frames, 1, ds)
    videos = torch.zeros(count, frames, size, size, dtype=torch.uint8)
    clip, frame = torch.arange(count)[:, None, None, None], torch.arange(frames)[None, :, None, None]
    videos[clip, frame, rows, columns] = digits[:, None].expand(-1, frames, -1, -1)
    return videos


@dataclass
class ActionClips:
    """An action task: `views` (n, 2, 1, observed, size, size) uint8 (the clip, then its left-right mirror),
    `actions` (n, horizon, 2) float: the digit's (dy, dx) displacement over each of the next `horizon` frames,
    in units of its speed (a step without a wall is -1, 0 or 1 on each axis), and `audio` (n, observed x samples)
    float, the position tones of `action_clips(audio_samples=...)`, or None."""
    views: torch.Tensor
    actions: torch.Tensor
    audio: torch.Tensor = None

    def __len__(self):
        return len(self.actions)

    def floats(self, index=slice(None)):
        return self.views[index].float() / 255


def action_clips(split, *, count=None, observed=4, horizon=3, size=32, digit_size=16, speed=2, seed=0,
                 audio_samples=0):
    """The moving digits as an action task for `vit_pytorch.vat`: from two views of the first `observed` frames,
    predict the digit's displacement over the next `horizon` frames.

    The digit starts anywhere in the frame, moves `speed` pixels a frame in one of the 8 directions and bounces
    off the frame's edges (its top-left corner runs back and forth over 0..size - digit_size on each axis), so
    the next steps are the observed motion continued, reversed on an axis where the digit reaches a wall. Paths
    depend only on `seed`, the split and the clip's index, not on `observed` or `horizon`. Digits as in
    `moving_digits` (the trainer's split; clip i shows digit i modulo the split's size).

    `audio_samples` > 0 adds a sound track, `audio` (n, observed x audio_samples): while frame t is shown, a
    unit sine of `audio_samples` samples whose pitch is the digit's horizontal position in that frame of the clip
    (the first view): sin(2 pi f s) for s = 0, 1, ... (each frame's tone starts at phase 0), with
    f = (1 + 6 x / (size - digit_size)) / 16 cycles per sample, x the column of the digit's top-left corner: 1/16
    at the left wall, 7/16 at the right (`position_tones`). It tells the horizontal position and, over the frames,
    the horizontal motion; nothing of the vertical.

        from vit_pytorch.clips import action_clips

        task = action_clips('train', count=256)
        task.views.shape, task.actions.shape     # (256, 2, 1, 4, 32, 32) uint8, (256, 3, 2)
        action_clips('train', count=256, audio_samples=256).audio.shape      # (256, 1024)
    """
    check_action_arguments(split=split, count=count, observed=observed, horizon=horizon, size=size,
                           digit_size=digit_size, speed=speed, seed=seed, audio_samples=audio_samples)
    digits, _ = split_digits(split, digit_size)
    count = len(digits) if count is None else count
    generator = torch.Generator().manual_seed(seed * 2 + SPLITS.index(split) + 1000)
    direction = torch.randint(len(DIRECTIONS), (count,), generator=generator)
    steps = torch.tensor([step for _, step in DIRECTIONS])[direction] * speed      # (n, 2)
    room = size - digit_size                                                       # corner range 0..room
    start = (torch.rand(count, 2, generator=generator) * (room + 1)).floor().long()
    unfolded = start[:, None] + torch.arange(observed + horizon)[None, :, None] * steps[:, None]
    # a bounce is a reflection: the unfolded path modulo 2 * room, folded back at room
    folded = unfolded.remainder(2 * room)
    corner = torch.where(folded > room, 2 * room - folded, folded)                 # (n, frames, 2)
    videos = paint(digits[torch.arange(count) % len(digits)], corner[:, :observed], size)
    views = torch.stack((videos, videos.flip(-1)), dim=1)[:, :, None]
    actions = (corner[:, observed:] - corner[:, observed - 1:-1]).float() / speed
    audio = position_tones(corner[:, :observed, 1], room, audio_samples) if audio_samples else None
    return ActionClips(views, actions, audio)


# the pitch of the left wall and of the right wall, in cycles per sample (below the Nyquist frequency 1/2)
TONE_BAND = (1 / 16, 7 / 16)


def position_tones(columns, room, samples):
    """(n, frames x samples) float: for frame t, sin(2 pi f s) for s = 0..samples - 1, its frequency f in cycles
    per sample linear in columns[:, t] (n, frames) from TONE_BAND[0] at column 0 to TONE_BAND[1] at `room`."""
    low, high = TONE_BAND
    frequency = low + (high - low) * columns.double() / room                       # (n, frames)
    phase = 2 * math.pi * frequency[..., None] * torch.arange(samples, dtype=torch.float64)
    return torch.sin(phase).flatten(1).float()


# argument checks


def check_action_arguments(*, split, count, observed, horizon, size, digit_size, speed, seed, audio_samples):
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    for name, value in dict(observed=observed, horizon=horizon, size=size, digit_size=digit_size,
                            speed=speed).items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    for name, value in dict(count=count, seed=seed, audio_samples=audio_samples).items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if observed < 2:
        raise ValueError(f"observed must be at least 2 (one frame shows no motion), got {observed}")
    if not 0 < speed < size - digit_size:
        raise ValueError(f"speed must be below size - digit_size = {size - digit_size} (the room the digit moves "
                         f"in), got speed={speed} with size={size}, digit_size={digit_size}")



def check_arguments(*, split, count, frames, size, digit_size, speed, task, seed):
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS} (the class is the digit or the direction of motion), "
                         f"got {task!r}")
    for name, value in dict(frames=frames, size=size, digit_size=digit_size, speed=speed).items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    for name, value in dict(count=count, seed=seed).items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if size - digit_size < (frames - 1) * speed:
        raise ValueError(f"a digit of {digit_size} pixels moving {speed} pixels a frame for {frames} frames needs "
                         f"a frame of at least {digit_size + (frames - 1) * speed} pixels, got size={size}")


# the training command's data source

FRAMES = 8


def clip_settings(size, frames=FRAMES):
    """moving_digits' frame geometry for `--image-size` `size`: the digit at half the side, the fastest
    whole-pixel speed (at least 1) whose path fits."""
    digit_size = size // 2
    return dict(frames=frames, size=size, digit_size=digit_size, speed=max(1, (size - digit_size) // (frames - 1)))


def data_source(task):
    """`--data clips:TASK` (TASK 'digit' or 'direction') for `vit_pytorch.train` and `vit_pytorch.evaluate`."""
    from vit_pytorch.training.data import DataSource, ImageSet

    if task not in TASKS:
        raise ValueError(f"--data clips:TASK takes a task of {TASKS} (the class is the digit or the direction of "
                         f"motion), got {task!r}")

    def load(split, *, image_size, channels, classes=None):
        size = image_size[-1] if isinstance(image_size, (tuple, list)) else image_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 2 * FRAMES:
            raise ValueError(f"--image-size is the side of a clip's frames: an int >= {2 * FRAMES} (a digit of half "
                             f"the side moving one pixel a frame for {FRAMES} frames), got {image_size!r}")
        if channels != 1:
            raise ValueError(f"the moving digits are grayscale: --channels must be 1, got {channels}")
        clips = moving_digits(split, task=task, **clip_settings(size))
        if classes is not None and list(classes) != clips.classes:
            raise ValueError(f"clips:{task}'s classes are {clips.classes}, not {list(classes)}")
        return ImageSet(clips.videos, clips.labels, clips.classes)

    return DataSource(f'clips:{task}', load, test_split='test', image_size=32, channels=1, requires=('sklearn',),
                      tiny=True)
