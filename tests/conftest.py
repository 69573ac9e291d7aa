import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def tiny_vit_kwargs(**overrides):
    kwargs = dict(image_size=(16, 24), patch_size=(4, 8), num_classes=5, dim=32, depth=2,
                  heads=2, dim_head=16, mlp_dim=64)
    kwargs.update(overrides)
    return kwargs


def digits_batch(count=32, size=8):
    """`count` real 8x8 handwritten digits from scikit-learn, as (count, 1, size, size) in [0, 1]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images[:count], dtype=torch.float32)[:, None] / 16.0
    if size != 8:
        images = torch.nn.functional.interpolate(images, size=(size, size), mode='nearest')
    return images, torch.tensor(digits.target[:count])
