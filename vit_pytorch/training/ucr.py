"""Time-series classification sets of the UCR and UEA archives that ship inside the `aeon` package.

"The UCR Time Series Archive", Dau et al., arXiv 1810.07758 (IEEE/CAA J. Autom. Sinica, 2019), and
"The UEA multivariate time series classification archive, 2018", Bagnall et al., arXiv 1811.00075.
aeon (`aeon.datasets.load_classification`) carries a few of them in its own package data, so they
load offline, with the archive's own train/test split. Only those are offered here (any other name
would make aeon download it):

    name               train  test  channels  length  classes
    GunPoint              50   150         1     150        2
    ItalyPowerDemand      67  1029         1      24        2
    ArrowHead             36   175         1     251        3
    OSULeaf              200   242         1     427        6
    ACSF1                100   100         1    1460       10
    BasicMotions          40    40         6     100        4   (UEA, multivariate)

All have series of equal length. Needs the 'timeseries' extra (aeon, which needs Python >= 3.11);
this module imports aeon only when a set is loaded.

The training command reads them as `--data ucr:NAME` (`data_source`): each series is resampled
(linearly, both ends kept) to `--image-size` samples, by default its length rounded up to a
multiple of 8 and at least 48 (`default_length`: GunPoint 152, ItalyPowerDemand 48, ArrowHead
256, OSULeaf 432, ACSF1 1464, BasicMotions 104), so that the trainer's patches of 8 samples
divide it; the test split is the archive's.

    from vit_pytorch.ucr import load_ucr

    train = load_ucr('GunPoint', split='train')
    train.series.shape, train.labels.shape, train.classes    # (50, 1, 150), (50,), ['1', '2']
"""

import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# name -> (train size, test size, channels, length, classes), as aeon 1.6.0 ships them
DATASETS = {
    'GunPoint': (50, 150, 1, 150, 2),
    'ItalyPowerDemand': (67, 1029, 1, 24, 2),
    'ArrowHead': (36, 175, 1, 251, 3),
    'OSULeaf': (200, 242, 1, 427, 6),
    'ACSF1': (100, 100, 1, 1460, 10),
    'BasicMotions': (40, 40, 6, 100, 4),
}
SPLITS = ('train', 'test')


class MissingAeon(ImportError):
    """aeon, which carries the UCR/UEA sets, is not installed; the message says how to install it."""


@dataclass
class Series:
    """Signals (n, channels, length) as float32, integer labels (n,) and the class names (the archive's labels)."""
    series: torch.Tensor
    labels: torch.Tensor
    classes: list

    def __len__(self):
        return len(self.labels)


def load_classification():
    """aeon's `load_classification`, or a MissingAeon naming the extra that brings it."""
    try:
        from aeon.datasets import load_classification
    except ImportError as error:
        floor = '' if sys.version_info >= (3, 11) else \
            f" (aeon needs Python >= 3.11; this is {sys.version_info.major}.{sys.version_info.minor})"
        from vit_pytorch.training.extras import install_command

        raise MissingAeon(
            f"the UCR/UEA data sets come with the aeon package, not installed here{floor}; install the "
            f"'timeseries' extra: {install_command('timeseries', ['aeon'])}") from error
    return load_classification


def load_ucr(name, split='train'):
    """The `split` ('train' or 'test') of the set `name` (a key of DATASETS), as the archive splits it.

    Labels are numbered in the order of the class names, sorted as numbers where all of them are
    numbers (GunPoint's '1', '2' -> 0, 1), else as text.
    """
    if name not in DATASETS:
        raise ValueError(f"name must be one of the sets aeon ships ({', '.join(DATASETS)}), got {name!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    load = load_classification()
    values, names = load(name, split=split)
    classes = class_names(load(name, split='train')[1]) if split == 'test' else class_names(names)
    index = {label: number for number, label in enumerate(classes)}
    unknown = sorted({str(label) for label in names} - set(index))
    if unknown:
        raise ValueError(f"{name}'s test split has labels its train split lacks: {unknown}")
    labels = torch.tensor([index[str(label)] for label in names])
    return Series(torch.as_tensor(values, dtype=torch.float32), labels, classes)


def class_names(labels):
    names = sorted({str(label) for label in labels})
    try:
        return sorted(names, key=float)
    except ValueError:
        return names


# the training command's data source


def default_length(name):
    """The length the trainer resamples `name`'s series to by default: a multiple of 8, at least 48."""
    length = DATASETS[name][3]
    return max(48, -(-length // 8) * 8)


def resample(series, length):
    """(n, c, l) -> (n, c, length), linearly interpolated with both ends kept (unchanged if l == length)."""
    if series.shape[-1] == length:
        return series
    return F.interpolate(series, size=length, mode='linear', align_corners=True)


def data_source(name):
    """`--data ucr:NAME`: the set `name` for `vit_pytorch.train` and `vit_pytorch.evaluate`."""
    from vit_pytorch.training.data import DataSource, ImageSet

    if name not in DATASETS:
        raise ValueError(f"--data ucr:NAME takes one of the sets aeon ships ({', '.join(DATASETS)}), got {name!r}")
    own_channels = DATASETS[name][2]

    def load(split, *, image_size, channels, classes=None):
        length = image_size[0] if isinstance(image_size, (tuple, list)) and len(image_size) == 1 else image_size
        if isinstance(length, bool) or not isinstance(length, int) or length < 2:
            raise ValueError(f"--image-size is the number of samples a {name} series is resampled to: "
                             f"an int >= 2, got {image_size!r}")
        if channels != own_channels:
            raise ValueError(f"{name} has {own_channels} channel(s): --channels must be {own_channels}, got {channels}")
        data = load_ucr(name, split)
        if classes is not None and list(classes) != data.classes:
            raise ValueError(f"{name}'s classes are {data.classes}, not {list(classes)}")
        return ImageSet(resample(data.series, length), data.labels, data.classes)

    return DataSource(f'ucr:{name}', load, test_split='test', image_size=default_length(name),
                      channels=own_channels, requires=('aeon',), extra='timeseries', tiny=True)
