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


def fit_fixed_batch(model, images, labels, *, parameters=None, lr=3e-3, max_steps=300, check_every=10):
    """AdamW on one fixed batch until every label is predicted (checked in eval mode) or `max_steps`.

    Returns (eval-mode accuracy on the batch, steps taken); each module's train/eval mode is restored.
    """
    import torch.nn.functional as F

    modes = {module: module.training for module in model.modules()}

    def accuracy():
        model.eval()
        with torch.no_grad():
            correct = (model(images).argmax(-1) == labels).float().mean().item()
        for module, training in modes.items():
            module.training = training
        return correct

    parameters = model.parameters() if parameters is None else parameters
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0)
    for step in range(1, max_steps + 1):
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % check_every == 0 and accuracy() == 1.0:
            break
    return accuracy(), step
