"""The UCR/UEA loader: the archive's splits as aeon ships them, labels numbered, a clear error without aeon.

aeon is not in the test extra (it needs Python >= 3.11 and brings numba, llvmlite and pandas, some
300 MB); the tests that read the real sets skip without it. The conversion itself is also checked
with a stand-in for aeon's `load_classification`, so it runs everywhere.
"""

import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from vit_pytorch.ucr import DATASETS, MissingAeon, class_names, load_ucr


@pytest.fixture
def fake_aeon(monkeypatch):
    """aeon.datasets.load_classification replaced by a stand-in holding two tiny 'GunPoint' splits."""
    splits = {
        'train': (np.arange(12, dtype=np.float64).reshape(3, 1, 4), np.array(['2', '10', '2'])),
        'test': (np.ones((2, 1, 4)), np.array(['10', '2'])),
    }
    datasets = types.ModuleType('aeon.datasets')
    datasets.load_classification = lambda name, split: splits[split]
    monkeypatch.setitem(sys.modules, 'aeon', types.ModuleType('aeon'))
    monkeypatch.setitem(sys.modules, 'aeon.datasets', datasets)
    return splits


def test_labels_are_numbered_in_numeric_order_of_the_train_classes(fake_aeon):
    train, test = load_ucr('GunPoint', 'train'), load_ucr('GunPoint', 'test')
    assert train.classes == test.classes == ['2', '10']
    assert train.labels.tolist() == [0, 1, 0] and test.labels.tolist() == [1, 0]
    assert train.series.dtype == torch.float32 and torch.equal(train.series, torch.arange(12.).reshape(3, 1, 4))
    assert len(test) == 2


def test_class_names_sort_as_numbers_where_they_are_numbers():
    assert class_names(['10', '2', '1', '2']) == ['1', '2', '10']
    assert class_names(np.array(['walking', 'badminton', 'running'])) == ['badminton', 'running', 'walking']


def test_without_aeon_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, 'aeon', None)          # makes `import aeon...` raise ImportError
    monkeypatch.setitem(sys.modules, 'aeon.datasets', None)
    with pytest.raises(MissingAeon, match=r"aeon.*'timeseries' extra.*pip install"):
        load_ucr('GunPoint')


def test_only_the_sets_aeon_ships_are_offered():
    with pytest.raises(ValueError, match=r'GunPoint.*BasicMotions.*got .Adiac.'):
        load_ucr('Adiac')                                   # an archive set aeon would download
    with pytest.raises(ValueError, match=r'split must be one of'):
        load_ucr('GunPoint', split='val')


def test_the_data_modules_need_only_torch_at_import():
    code = ("import sys, vit_pytorch.ucr, vit_pytorch.clips; "
            "print(sorted(m for m in ('aeon', 'sklearn', 'numpy', 'pandas') if m in sys.modules))")
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() in ("[]", "['numpy']")          # torch may import numpy itself


# the real sets (skipped without aeon)


@pytest.mark.parametrize('name', sorted(DATASETS))
def test_real_set_has_the_archives_sizes(name):
    pytest.importorskip('aeon')
    train_size, test_size, channels, length, classes = DATASETS[name]
    train, test = load_ucr(name, 'train'), load_ucr(name, 'test')
    assert train.series.shape == (train_size, channels, length) and test.series.shape == (test_size, channels, length)
    assert len(train.classes) == classes and set(train.labels.tolist()) == set(range(classes))
    assert torch.isfinite(train.series).all() and torch.isfinite(test.series).all()


def test_real_gunpoint_is_aeons_data_and_labels():
    pytest.importorskip('aeon')
    from aeon.datasets import load_classification

    values, labels = load_classification('GunPoint', split='test')
    test = load_ucr('GunPoint', 'test')
    assert torch.equal(test.series, torch.as_tensor(values, dtype=torch.float32))
    assert [test.classes[label] for label in test.labels] == [str(label) for label in labels]
