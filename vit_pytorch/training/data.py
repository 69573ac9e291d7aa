"""The data sets the commands read: scikit-learn's digits, class-per-folder images, and the sources registered
in SOURCES by name (signals, clips), each a DataSource whose splits load as an ImageSet.

  digits  scikit-learn's 1,797 handwritten 8x8 digits (shipped with scikit-learn, so offline),
          split once and for all into 1,347 training and 450 test images (a stratified quarter,
          random_state=0), resized to the model's image size.
  folder  PATH/train/<class>/*.png|jpg|... and PATH/val/<class>/..., read with Pillow, the
          shorter side resized to the image size and centre-cropped; decoded once and held in
          memory as uint8.
  NAME:ARG  a source registered in SOURCES (the module that reads it is imported on first use),
          e.g. other kinds of input than images: signals (n, c, length), clips (n, c, frames, h, w).
"""

import importlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange

from vit_pytorch.training.extras import require

IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.bmp', '.gif', '.webp', '.tif', '.tiff')
DIGITS_SPLITS = ('train', 'test')
FOLDER_SPLITS = ('train', 'val')


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
    'ucr': 'vit_pytorch.training.ucr:data_source',      # ucr:GunPoint, ... signals (n, c, length); the 'timeseries' extra
    'clips': 'vit_pytorch.training.clips:data_source',  # clips:digit, clips:direction: moving digits (n, 1, 8, h, w)
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
