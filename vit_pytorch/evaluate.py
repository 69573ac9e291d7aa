"""Evaluate a trained checkpoint, and the data sets the trainer reads.

    python -m vit_pytorch.evaluate runs/digits-vit/checkpoint
    python -m vit_pytorch.evaluate runs/pets-vit/checkpoint --data ~/pets --split val

The model is rebuilt from the checkpoint's JSON configuration and safetensors weights alone,
and evaluated on the split it was tested on during training (or on `--data`). Data sets:

  digits  scikit-learn's 1,797 handwritten 8x8 digits (shipped with scikit-learn, so offline),
          split once and for all into 1,347 training and 450 test images (a stratified quarter,
          random_state=0), resized to the model's image size.
  folder  PATH/train/<class>/*.png|jpg|... and PATH/val/<class>/..., read with Pillow, the
          shorter side resized to the image size and centre-cropped; decoded once and held in
          memory as uint8.

  NAME:ARG  a source registered in SOURCES (the module that reads it is imported on first use),
          e.g. other kinds of input than images: signals (n, c, length), clips (n, c, frames, h, w).

Both commands need the 'train' extra (safetensors and numpy for checkpoints, scikit-learn for
the digits, Pillow for folders, matplotlib for the trainer's pictures); a missing package is
named with the command that installs it (`MissingExtra`): the package is not on the package index,
so the command installs the extra from this checkout by its absolute path.
"""

import argparse
import importlib
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange

from vit_pytorch import models

IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.bmp', '.gif', '.webp', '.tif', '.tiff')
DIGITS_SPLITS = ('train', 'test')
FOLDER_SPLITS = ('train', 'val')
# the pip name of each optional module the commands import, where it differs
DISTRIBUTIONS = dict(sklearn='scikit-learn', PIL='pillow')


class MissingExtra(ImportError):
    """An optional package a command needs is not installed; the message names it and the extra that brings it."""


def checkout():
    """The root of the vit_pytorch checkout this package runs from (an editable install or PYTHONPATH),
    or None for a package installed from a wheel, which has no setup.py beside it."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / 'setup.py').is_file() else None


def install_command(extra, distributions):
    """A pip command that installs `extra` (or, without a checkout, the `distributions` it would bring),
    as written from any folder: the package is not on the package index, so the extra comes from the
    checkout by its absolute path."""
    root = checkout()
    if root is None:
        return 'pip install ' + ' '.join(shlex.quote(distribution) for distribution in distributions)
    return 'pip install -e ' + shlex.quote(f'{root}[{extra}]')


def require(*modules, purpose, extra='train'):
    """Import `modules` now, or raise a MissingExtra naming every missing one and how to install them."""
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(DISTRIBUTIONS.get(module, module))
    if missing:
        how = f"the {extra!r} extra" if checkout() else 'them'
        raise MissingExtra(f"{purpose} needs {', '.join(missing)}, not installed here; install {how}: "
                           f"{install_command(extra, missing)}")


@dataclass
class ImageSet:
    """Inputs (n, c, ...), uint8 in [0, 255] or float, with integer labels (n,).

    Images are (n, c, h, w) in [0, 1]; a registered source may hold other inputs of one size,
    such as signals (n, c, length) or clips (n, c, frames, h, w).
    """
    images: torch.Tensor
    labels: torch.Tensor
    classes: list

    def __len__(self):
        return len(self.labels)

    def floats(self, index=slice(None)):
        images = self.images[index]
        return images.float() / 255 if images.dtype == torch.uint8 else images.float()


# data sets


def load_digits(split, *, image_size=16):
    """scikit-learn's digits, the fixed 'train' (1,347) or 'test' (450) split, resized to `image_size`."""
    require('sklearn', purpose='the digits data set')
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    if split not in DIGITS_SPLITS:
        raise ValueError(f"split must be one of {DIGITS_SPLITS} for the digits, got {split!r}")
    digits = sklearn_digits()
    train_index, test_index = train_test_split(range(len(digits.target)), test_size=0.25, random_state=0,
                                               stratify=digits.target)
    index = train_index if split == 'train' else test_index
    images = torch.tensor(digits.images[index], dtype=torch.float32)[:, None] / 16   # (n, 1, 8, 8), in [0, 1]
    height, width = _pair(image_size)
    if (height, width) != (8, 8):
        images = F.interpolate(images, size=(height, width), mode='bilinear', antialias=True).clamp(0, 1)
    return ImageSet(images, torch.tensor(digits.target[index]), [str(digit) for digit in range(10)])


def _pair(size):
    return tuple(size) if isinstance(size, (tuple, list)) else (size, size)


def _read_image(file, size, channels):
    from PIL import Image, UnidentifiedImageError

    height, width = size
    try:
        with Image.open(file) as image:
            image = image.convert('L' if channels == 1 else 'RGB')
            scale = max(height / image.height, width / image.width)
            resized = (max(width, round(image.width * scale)), max(height, round(image.height * scale)))
            image = image.resize(resized, Image.Resampling.BICUBIC)
            left, top = (image.width - width) // 2, (image.height - height) // 2
            image = image.crop((left, top, left + width, top + height))
            data = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"cannot read image {file}: {error}") from error
    return rearrange(data, '(h w c) -> c h w', h=height, w=width, c=channels)


def folder_classes(root):
    """Sorted class names: the subfolders of ROOT/train."""
    root = Path(root).expanduser()
    if not root.exists():
        raise FileNotFoundError(f"data folder {root} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"data folder {root} is not a folder")
    train = root / 'train'
    if not train.is_dir():
        raise FileNotFoundError(f"data folder {root} has no train/ folder; expected {root}/train/<class>/*.png "
                                f"and {root}/val/<class>/*.png")
    classes = sorted(entry.name for entry in train.iterdir() if entry.is_dir())
    if len(classes) < 2:
        raise ValueError(f"{train} must hold one folder per class (at least two), found {classes}")
    return classes


def load_folder(root, split, *, image_size, channels=3, classes=None):
    """ROOT/<split>/<class>/<images> as an ImageSet; `classes` (default: those of ROOT/train) fixes the labels."""
    require('PIL', purpose='reading an image folder')
    root = Path(root).expanduser()
    classes = list(classes) if classes is not None else folder_classes(root)
    folder = root / split
    if not folder.is_dir():
        raise FileNotFoundError(f"data folder {root} has no {split}/ folder; expected {folder}/<class>/*.png")
    found = sorted(entry.name for entry in folder.iterdir() if entry.is_dir())
    strangers = sorted(set(found) - set(classes))
    if strangers:
        raise ValueError(f"{folder} has class folders {strangers} that {root / 'train'} does not have "
                         f"(training classes: {classes})")
    size = _pair(image_size)
    images, labels = [], []
    for label, name in enumerate(classes):
        class_folder = folder / name
        if not class_folder.is_dir():
            continue
        files = sorted(file for file in class_folder.iterdir() if file.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"class folder {class_folder} is empty: it has no images "
                             f"({', '.join(IMAGE_SUFFIXES)}); add images or remove the folder")
        images.extend(_read_image(file, size, channels) for file in files)
        labels.extend([label] * len(files))
    if not images:
        raise ValueError(f"{folder} holds no images in class folders")
    return ImageSet(torch.stack(images), torch.tensor(labels), classes)


# data sources named NAME:ARG -> 'module:function'; function(ARG) returns the DataSource
SOURCES = {
    'ucr': 'vit_pytorch.ucr:data_source',         # ucr:GunPoint, ... signals (n, c, length); the 'timeseries' extra
    'clips': 'vit_pytorch.clips:data_source',     # clips:digit, clips:direction: moving digits (n, 1, 8, h, w)
}


@dataclass
class DataSource:
    """What `--data` names: how each split loads, and the defaults that come with the data.

    `load(split, *, image_size, channels, classes)` returns an ImageSet; `image_size` and
    `channels` are the defaults when the command line leaves them out (None: the data's own);
    `requires` are modules checked first, with `extra` named as the way to install them.
    """
    name: str
    load: object
    test_split: str = 'test'
    image_size: object = None
    channels: object = None
    requires: tuple = ()
    extra: str = 'train'
    tiny: bool = False           # small inputs, where one thread beats several on a CPU

    @property
    def run_name(self):
        return self.name.replace(':', '-')


def _digits_source():
    def load(split, *, image_size, channels, classes=None):
        if channels != 1:
            raise ValueError(f"the digits are grayscale: channels must be 1, got {channels}")
        return load_digits(split, image_size=image_size)
    return DataSource('digits', load, test_split='test', image_size=16, channels=1, requires=('sklearn',), tiny=True)


def _folder_source(root):
    def load(split, *, image_size, channels, classes=None):
        return load_folder(root, split, image_size=image_size, channels=channels, classes=classes)
    return DataSource(str(Path(root).expanduser().resolve()), load, test_split='val', image_size=32, channels=3,
                      requires=('PIL',))


def data_source(data):
    """The DataSource `data` names: 'digits', a registered NAME:ARG, or a folder path."""
    if data == 'digits':
        return _digits_source()
    name, _, argument = str(data).partition(':')
    if name in SOURCES and argument:
        module, function = SOURCES[name].split(':')
        return getattr(importlib.import_module(module), function)(argument)
    if name in SOURCES:
        raise ValueError(f"--data {data!r} needs an argument after the colon, as {name}:NAME")
    return _folder_source(data)


def load_split(data, split, *, image_size, channels, classes=None):
    """The ImageSet of `split` for `data` ('digits', NAME:ARG or a folder path)."""
    return data_source(data).load(split, image_size=image_size, channels=channels, classes=classes)


def normalise(images, mean, std):
    """(inputs - mean) / std per channel (dim 1), for inputs of any number of trailing dimensions."""
    pattern = 'c -> c' + ' 1' * (images.ndim - 2)
    mean = rearrange(torch.tensor(mean, dtype=images.dtype, device=images.device), pattern)
    std = rearrange(torch.tensor(std, dtype=images.dtype, device=images.device), pattern)
    return (images - mean) / std


# evaluation


def autocast(device, enabled):
    """bf16 autocast for `--amp` (CPU and GPU alike; bf16 needs no loss scaling)."""
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=enabled)


@torch.no_grad()
def evaluate(model, data, *, mean, std, batch_size=256, device='cpu', amp=False, rank=0, world_size=1):
    """dict(loss, accuracy, correct, count) of `model` on `data`; with several processes each takes a shard."""
    was_training = model.training
    model.eval()
    shard = torch.arange(rank, len(data), world_size)
    totals = torch.zeros(3, dtype=torch.float64, device=device)       # loss sum, correct, count
    for start in range(0, len(shard), batch_size):
        index = shard[start:start + batch_size]
        images = normalise(data.floats(index).to(device), mean, std)
        labels = data.labels[index].to(device)
        with autocast(device, amp):
            logits = model(images)
        totals += torch.stack([F.cross_entropy(logits.float(), labels, reduction='sum').double(),
                               (logits.argmax(dim=-1) == labels).sum().double(),
                               torch.tensor(len(index), dtype=torch.float64, device=device)])
    if world_size > 1:
        torch.distributed.all_reduce(totals)
    model.train(was_training)
    loss, correct, count = totals.tolist()
    return dict(loss=loss / max(count, 1), accuracy=correct / max(count, 1), correct=int(correct), count=int(count))


# the constructor arguments by which a model takes other sizes than it was built for
DYNAMIC_SIZE_ARGUMENTS = ('dynamic_image_size', 'dynamic_img_size')


@torch.no_grad()
def check_size(model, config, data, *, checkpoint, image_size, device):
    """A ValueError in the command's own terms when `model` does not take `data` at `--image-size`: the
    model's advice names its constructor's arguments, which this command cannot set."""
    data_config = config['data']
    was_training = model.training
    try:
        model.eval()(normalise(data.floats(slice(0, 1)).to(device), data_config['mean'], data_config['std']))
    except ValueError as error:
        name, kwargs = config['model'], config.get('model_kwargs', {})
        reason = str(error).split('; ')[0]
        advice = (f"the model in {checkpoint} ({name}, trained at {data_config['image_size']}) does not take "
                  f"--image-size {image_size} ({reason}): leave out --image-size to evaluate it at the size it "
                  f"trained at")
        accepted = models.parameters(name) or ()
        dynamic = next((argument for argument in DYNAMIC_SIZE_ARGUMENTS if argument in accepted), None)
        if dynamic is not None and not kwargs.get(dynamic):
            advice += (f"; a model that takes other sizes is trained with python -m vit_pytorch.train --model {name} "
                       f"--{dynamic.replace('_', '-')} (and the rest of its options)")
        raise ValueError(advice) from error
    finally:
        model.train(was_training)


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m vit_pytorch.evaluate', description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('checkpoint', help='checkpoint folder (or its model.safetensors)')
    parser.add_argument('--data', help="'digits' or a class-per-folder data set (default: the one it trained on)")
    parser.add_argument('--split', help="split to evaluate (default: the one tested during training)")
    parser.add_argument('--image-size', type=int,
                        help="resize the data to this size, for a model that takes other sizes (na_vit, or one "
                             "trained with --dynamic-image-size) (default: the size it trained at)")
    parser.add_argument('--batch-size', type=int, default=256)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--amp', action='store_true', help='bf16 autocast')
    parser.add_argument('--json', action='store_true', help='print the result as one JSON line')
    args = parser.parse_args(argv)

    from vit_pytorch.checkpoint import CheckpointError, load_config, load_model

    try:
        data_config = load_config(args.checkpoint).get('data', {})     # config.json: JSON, no extra needed
        source = args.data or data_config.get('source')
        if source is None:
            raise CheckpointError(f"{args.checkpoint} does not say what data it was trained on; pass --data")
        chosen = data_source(source)
        # every missing package named at once where one extra brings them all
        one_extra = chosen.extra == 'train'
        require('safetensors', 'numpy', *(chosen.requires if one_extra else ()),
                purpose='python -m vit_pytorch.evaluate')
        if not one_extra:
            require(*chosen.requires, purpose=f'python -m vit_pytorch.evaluate on {source}', extra=chosen.extra)
        model, config = load_model(args.checkpoint, device=args.device)
        data_config = config.get('data', {})
        missing = [key for key in ('channels', 'mean', 'std') + (() if args.image_size else ('image_size',))
                   if data_config.get(key) is None]
        if missing:
            raise CheckpointError(f"the configuration of {args.checkpoint} lacks the data's {', '.join(missing)} "
                                  f"(config.json, 'data'): corrupt, or not written by vit_pytorch.train?")
        split = args.split or data_config.get('test_split') or chosen.test_split
        image_size = args.image_size or data_config['image_size']
        data = chosen.load(split, image_size=image_size, channels=data_config['channels'],
                           classes=data_config.get('classes') if source != 'digits' else None)
        if args.image_size:
            check_size(model, config, data, checkpoint=args.checkpoint, image_size=image_size, device=args.device)
        result = evaluate(model, data, mean=data_config['mean'], std=data_config['std'],
                          batch_size=args.batch_size, device=args.device, amp=args.amp)
    except (CheckpointError, FileNotFoundError, NotADirectoryError, ValueError, MissingExtra) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result.update(checkpoint=str(args.checkpoint), data=str(source), split=split, image_size=image_size)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{source} {split}: accuracy {100 * result['accuracy']:.2f}% ({result['correct']}/{result['count']}), "
              f"loss {result['loss']:.4f}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
