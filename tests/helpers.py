"""Helpers shared by the tests: model sizes, real data, a training loop, counts and fixtures.

Import them by name (`from helpers import digits_batch`); `conftest.py` keeps only pytest's fixtures.
"""

import importlib.util
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange

FIXTURES = Path(__file__).parent / 'fixtures'
ROOT = Path(__file__).resolve().parent.parent


def load_script(path, name=None):
    """The Python file at `path` (a script outside the package: an example, a benchmark) imported as a module."""
    spec = importlib.util.spec_from_file_location(name or Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_example(name):
    """examples/<name>.py as a module."""
    return load_script(ROOT / 'examples' / f'{name}.py')


def tiny_vit_kwargs(**overrides):
    """Keyword arguments of a tiny non-square ViT: 16x24 images, 4x8 patches (a 4x3 grid), 5 classes."""
    kwargs = dict(image_size=(16, 24), patch_size=(4, 8), num_classes=5, dim=32, depth=2,
                  heads=2, dim_head=16, mlp_dim=64)
    kwargs.update(overrides)
    return kwargs


def count(model, *, trainable_only=False):
    """The number of parameters of `model` (of those with requires_grad when `trainable_only`)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def digits_batch(count=32, size=8):
    """`count` real 8x8 handwritten digits from scikit-learn, as (count, 1, size, size) in [0, 1], and their labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images[:count], dtype=torch.float32)[:, None] / 16.0
    if size != 8:
        images = F.interpolate(images, size=(size, size), mode='nearest')
    return images, torch.tensor(digits.target[:count])


def fit_fixed_batch(model, images, labels, *, parameters=None, lr=3e-3, max_steps=300, check_every=10):
    """AdamW on one fixed batch until every label is predicted (checked in eval mode) or `max_steps`.

    Returns (eval-mode accuracy on the batch, steps taken); each module's train/eval mode is restored.
    """
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


def official_counts(name):
    """The models of a committed record `tests/fixtures/<name>.json` of an official code's parameter counts
    (written by fixture_tools.save_counts from tests/fixtures/make_<name>.py)."""
    return json.loads((FIXTURES / f'{name}.json').read_text())['models']


def load_fixture(name):
    """A committed fixture `tests/fixtures/<name>.safetensors`: (metadata, state_dict, other tensors).

    Fixture scripts store the model's weights under 'state_dict.<key>', anything else (inputs,
    reference outputs) under its own name, and JSON strings (e.g. the constructor's 'config') in
    the metadata, which comes back decoded where it parses as JSON.
    """
    from safetensors import safe_open

    from vit_pytorch.pretrained import read_checkpoint

    path = FIXTURES / f'{name}.safetensors'
    with safe_open(path, 'pt') as f:     # the metadata only: the tensors come through the public reader
        raw = f.metadata() or {}
    metadata = {}
    for key, value in raw.items():
        try:
            metadata[key] = json.loads(value)
        except json.JSONDecodeError:
            metadata[key] = value
    tensors = read_checkpoint(path)
    state_dict = {k.removeprefix('state_dict.'): v for k, v in tensors.items() if k.startswith('state_dict.')}
    others = {k: v for k, v in tensors.items() if not k.startswith('state_dict.')}
    return metadata, state_dict, others


def as_tuples(config, *names):
    """`config` with the lists under `names` turned into tuples (JSON has no tuples)."""
    return {**config, **{name: tuple(config[name]) for name in names if isinstance(config.get(name), list)}}


def reference_case(name, *tuple_names):
    """(config, state_dict, input, output) of a fixture written by a reference implementation.

    `config` holds the constructor's keyword arguments, with the lists under `tuple_names` as tuples.
    """
    metadata, state_dict, tensors = load_fixture(name)
    return as_tuples(metadata['config'], *tuple_names), state_dict, tensors['input'], tensors['output']


def digits_split(size=16, test_count=450, seed=1234):
    """All 1797 scikit-learn digits, upsampled (bilinear) to size x size: (train images, labels, test images, labels),
    with a fixed random held-out split of `test_count` images."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    images = F.interpolate(images, size=(size, size), mode='bilinear', align_corners=False)
    labels = torch.tensor(digits.target)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    test, train = order[:test_count], order[test_count:]
    return images[train], labels[train], images[test], labels[test]


def train_and_test(model, split, *, epochs, lr=3e-3, batch_size=64, weight_decay=0.05, seed=0):
    """AdamW with a one-cycle schedule over `split` (from `digits_split`); the test accuracy in eval mode."""
    import math

    train_images, train_labels, test_images, test_labels = split
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps = epochs * math.ceil(len(train_images) / batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps)
    order = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(train_images), generator=order).split(batch_size):
            loss = F.cross_entropy(model(train_images[batch]), train_labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    with torch.no_grad():
        return (model(test_images).argmax(-1) == test_labels).float().mean().item()


# A gradient that is zero by the mathematics comes out of float32 arithmetic as round-off: 0 under one CPU
# kernel, ~1e-10 of the largest gradient under another (a softmax over one key, tests/test_conformance.py).
# Round-off is of the order of float32's epsilon (1.2e-7) times the terms summed into it, which the largest
# gradient bounds. Measured on the conformance table (moved off initialisation): the zero-by-design gradients
# it names come out at most 2.1e-7 of the largest, the smallest real one at 1.5e-5 (the same to 2 digits under
# ATEN_CPU_CAPABILITY=default, avx2 and avx512); 2e-6 is ~10 times above the one and ~7 times below the other.
GRADIENT_FLOOR = 2e-6


def relative_gradient_norms(model, outputs, seed=0):
    """Backward of a fixed random projection of `outputs` (a tensor or a tuple of tensors): name -> the norm of
    each parameter's gradient over the largest parameter's (None where it got none).

    A random projection, so that no gradient cancels by symmetry (the sum of a LayerNorm's outputs would).
    """
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    generator = torch.Generator().manual_seed(seed)
    model.zero_grad(set_to_none=True)
    sum((out * torch.randn(out.shape, generator=generator)).sum() for out in outputs).backward()
    norms = {name: None if p.grad is None else p.grad.norm().item() for name, p in model.named_parameters()}
    largest = max(norm for norm in norms.values() if norm is not None)
    return {name: None if norm is None else norm / largest for name, norm in norms.items()}


def parameters_without_gradient(model, outputs, *, seed=0, floor=GRADIENT_FLOOR):
    """Names of the parameters whose gradient (see `relative_gradient_norms`) is missing or below `floor`."""
    return [name for name, ratio in relative_gradient_norms(model, outputs, seed=seed).items()
            if ratio is None or ratio < floor]


def move_off_initialisation(model, seed=0, scale=0.1):
    """Add fixed Gaussian noise to every parameter: a model that starts a branch at zero (LayerScale, a zero
    BatchNorm weight) gives everything inside it a zero gradient at initialisation, whatever its graph."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)
    return model


def install_fake_aeon(monkeypatch):
    """aeon.datasets.load_classification replaced (through `monkeypatch`) by two tiny 'GunPoint' splits of 150
    samples: class 1 rises, class 2 falls; returns the splits, name -> (values (n, 1, 150), labels)."""
    import sys
    import types

    import numpy as np

    ramp = np.linspace(-1, 1, 150)
    rng = np.random.default_rng(0)

    def split(count):
        labels = np.array(['1', '2'] * (count // 2))
        values = np.stack([ramp if label == '1' else -ramp for label in labels])[:, None]
        return values + 0.1 * rng.standard_normal(values.shape), labels

    splits = dict(train=split(16), test=split(10))
    datasets = types.ModuleType('aeon.datasets')
    datasets.load_classification = lambda name, split: splits[split]
    monkeypatch.setitem(sys.modules, 'aeon', types.ModuleType('aeon'))
    monkeypatch.setitem(sys.modules, 'aeon.datasets', datasets)
    return splits


class OneStep(Exception):
    """Stops the training command after the loss of its first batch."""


def first_training_step(monkeypatch, tmp_path, model, *options, backward=False, before_step=None):
    """The training command's loss on its first batch (16 digits of 8 pixels) with `--model model`, a small
    size and label smoothing 0.1: dict(loss, index (the digits' indices), images (as the model saw them), model).
    With `backward` the loss is backpropagated and `grads` holds the parameters' gradients by name (None where
    none flowed); `before_step()` runs just before the step (after the command's own checks)."""
    import random

    import pytest

    from vit_pytorch import train

    seen = {}

    def one_step(network, optimizer, step_loss, **_):
        if before_step is not None:
            before_step()
        images = []
        hook = network.register_forward_pre_hook(lambda module, args: images.append(args[0].clone()))
        seen['index'] = torch.arange(16)
        loss = step_loss(seen['index'], torch.Generator().manual_seed(0), random.Random(0), 0)[0]
        hook.remove()
        if backward:
            network.zero_grad()
            loss.backward()
            seen['grads'] = {name: p.grad for name, p in network.named_parameters()}
        seen.update(loss=loss.item(), images=images[0], model=network)
        raise OneStep

    monkeypatch.setattr(train, 'train_epoch', one_step)
    with pytest.raises(OneStep):
        train.main([str(option) for option in (
            '--model', model, '--image-size', 8, '--dim', 32, '--heads', 2, '--dim-head', 16, '--mlp-dim', 64,
            '--label-smoothing', 0.1, '--quiet', '--no-plots', '--threads', 1, '--out', tmp_path / 'run',
            *options)])
    return seen


def feature_pyramid(maps, feature_info, width):
    """A feature pyramid network's top-down pass on a model's stage maps (b, c, h, w), finest first: each map
    projected to `width` channels by a 1x1 convolution of the channels its `feature_info` entry states, then,
    from the coarsest, each level plus the next coarser one upsampled (nearest) to its size. The levels, finest
    first: a detection or segmentation head's input, which a wrong stride or channel count breaks."""
    pyramid = [torch.nn.Conv2d(info['num_chs'], width, 1)(m) for info, m in zip(feature_info, maps, strict=True)]
    for i in range(len(pyramid) - 2, -1, -1):
        pyramid[i] = pyramid[i] + F.interpolate(pyramid[i + 1], size=pyramid[i].shape[-2:])
    return pyramid


def check_trainer_adds_auxiliary_loss(monkeypatch, tmp_path, model, option, weight, logits_and_loss):
    """The training command's loss on its first batch with `option weight` (the weight of `model`'s auxiliary loss;
    depth 2) is the cross-entropy (label smoothing 0.1) plus weight x the auxiliary loss, both recomputed from that
    batch and the model it trained (`logits_and_loss(model, images)` gives its logits and auxiliary loss). The
    auxiliary loss is large enough to show: at weight 5 a visible part of the sum, so that a weight of 0 trains on
    the cross-entropy alone."""
    import pytest

    from vit_pytorch.evaluate import load_digits

    seen = first_training_step(monkeypatch, tmp_path, model, '--depth', 2, option, weight)
    labels = load_digits('train', image_size=8).labels[seen['index']]
    with torch.no_grad():
        logits, auxiliary = logits_and_loss(seen['model'], seen['images'])
    cross_entropy = F.cross_entropy(logits, labels, label_smoothing=0.1)
    assert 5 * auxiliary > 0.01 * cross_entropy
    assert seen['loss'] == pytest.approx((cross_entropy + weight * auxiliary).item(), rel=1e-5)


def refused_training_error(tmp_path, capsys, *options):
    """The training command's error for `options` (at a small size), which it refuses in one line, exit status 2."""
    from vit_pytorch import train

    status = train.main([str(option) for option in (*options, '--image-size', 8, '--depth', 1, '--epochs', 1,
                                                    '--quiet', '--no-plots', '--out', tmp_path / 'run')])
    error = capsys.readouterr().err
    assert status == 2 and len(error.strip().splitlines()) == 1, error
    return error


def check_vit_pytorch_nd_checkpoint(model_class, name, frequencies_key):
    """vit-pytorch's checkpoint `name` of an N-D ViT with rotary (or polar) positions loads into `model_class` and
    gives its logits and its patch embeddings on their grid (`return_embed=True`); a new model of the checkpoint's
    configuration starts from its frequencies (`frequencies_key`)."""
    from vit_pytorch.pretrained import load_vit_pytorch

    config, state_dict, x, expected = reference_case(name, 'input_shape', 'patch_size', 'causal_dims')
    _, _, tensors = load_fixture(name)
    torch.testing.assert_close(model_class(**config).rotary_emb.frequencies, state_dict[frequencies_key])
    model = load_vit_pytorch(model_class(**config), state_dict).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model(x, return_embed=True), tensors['embed'], rtol=1e-4, atol=1e-5)


def check_it_trains_every_parameter(model, input_shape):
    """One cross-entropy step of `model` (5 classes) on 2 inputs of 2 channels of `input_shape`: (2, 5) logits and a
    non-zero gradient for every parameter."""
    x = torch.randn(2, 2, *input_shape, generator=torch.Generator().manual_seed(2))
    logits = model(x)
    assert logits.shape == (2, 5)
    F.cross_entropy(logits, torch.tensor([0, 3])).backward()
    assert [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0] == []


def check_only_position_differences_count(model):
    """A 3-D ViT (inputs (2, 2, 4, 8, 12)) whose positions enter only through their differences (rotary or polar):
    its whole grid of positions moved by (3, -2, 5) gives the same patch embeddings, one token's moved alone
    changes them."""
    x = torch.randn(2, 2, 4, 8, 12, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(x, return_embed=True)
        positions = model.positions.clone()
        model.positions = positions + torch.tensor([3, -2, 5])
        shifted = model(x, return_embed=True)
        moved = positions.clone()
        moved[0] += torch.tensor([1, 0, 0])
        model.positions = moved
        one_moved = model(x, return_embed=True)
    torch.testing.assert_close(shifted, before, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(one_moved, before, rtol=1e-3, atol=1e-3)


def check_a_causal_first_dimension_hides_later_slices(patch_outputs):
    """Inputs (2, 2, 8, 8, 12) whose dimension 0 (4 slices of patches of 2) is causal: moving the input's slices 2-3
    leaves slices 0-1 of `patch_outputs(x)` ((b, *grid, dim)) bit for bit; the later slices do change."""
    x = torch.randn(2, 2, 8, 8, 12, generator=torch.Generator().manual_seed(2))
    later = x.clone()
    later[:, :, 4:] += torch.randn(later[:, :, 4:].shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before, after = patch_outputs(x), patch_outputs(later)
    assert torch.equal(before[:, :2], after[:, :2])
    assert not torch.allclose(before[:, 2:], after[:, 2:])


# LeVJEPA's objective against the official code's (tests/test_levjepa.py, tests/test_levjepa_nd.py; the fixture is
# of a reference reconstructed from the search index's text of MLO-lab/LeVJEPA @ 481a99b, weaker than a checkout)


class LeVJEPACls(torch.nn.Module):
    """An encoder whose cls token is its input, (n, dim) -> tokens (n, 1, dim): the fixture's stand-in."""

    def __init__(self, dim):
        super().__init__()
        self.dim, self.ndim = dim, 1

    def forward(self, x, drop_ratio=None):
        return x[:, None]


def check_levjepa_official_objective(learner, project):
    """Our loss and its gradient against the official multiview_forward's on the fixture's cls tokens: the official
    Projector's weights loaded into ours, its SIGReg directions given, training mode (BatchNorm's batch statistics).
    `project(global_cls, local_cls)`: the learner's projections (b, 1 + v, K)."""
    metadata, state, tensors = load_fixture('levjepa_official')
    learner.projector.load_state_dict({key.removeprefix('net.'): value for key, value in state.items()})
    learner.train()
    global_cls = tensors['global_cls'].clone().requires_grad_()
    local_cls = tensors['local_cls'].clone().requires_grad_()
    invariance, sigreg = learner.loss(project(global_cls, rearrange(local_cls, 'b v d -> (b v) d')),
                                      projections_directions=tensors['directions'])
    (invariance + sigreg).backward()
    # float32, as the official code ran: its knot table is float32 (ours float64), its sums in another order
    torch.testing.assert_close(invariance, tensors['pred_loss'], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(sigreg, metadata['config']['sigreg_weight'] * tensors['sigreg_loss'],
                               rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(invariance + sigreg, tensors['loss'], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(global_cls.grad, tensors['grad.global_cls'], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(local_cls.grad, tensors['grad.local_cls'], rtol=1e-4, atol=1e-6)


def levjepa_official_config():
    metadata, _, _ = load_fixture('levjepa_official')
    config = metadata['config']
    return config, dict(num_classes_K=config['output_dim'], projection_hidden=config['hidden_dim'], drop_ratio=None,
                        sigreg_loss_weight=config['sigreg_weight'],
                        sigreg_loss_kwargs=dict(num_proj=config['num_proj'], knots=config['knots']))
