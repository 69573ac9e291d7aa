"""Looped ViT: one set of weights for every loop, one output a loop under deep supervision, the adaptive exit's
criterion, the losses' formulas; vit-pytorch's weights."""

import json

import pytest
import torch
import torch.nn.functional as F

from helpers import FIXTURES, count, first_training_step, load_fixture, move_off_initialisation
from vit_pytorch import LoopedViT
from vit_pytorch.looped_vit import (CONFIGS, Attention, adaptive_exit_targets, deep_supervision_loss,
                                    deep_supervision_weights, looped_vit)
from vit_pytorch.pretrained import load_vit_pytorch

TINY = dict(image_size=(16, 24), patch_size=4, num_classes=5, dim=16, heads=2, dim_head=8, mlp_dim=32,
            pre_loop_depth=1, num_looped_blocks=2, post_loop_depth=1, loop_depth=3)


def tiny(**overrides):
    torch.manual_seed(0)
    return move_off_initialisation(LoopedViT(**dict(TINY, **overrides))).eval()


def images(batch=3):
    return torch.randn(batch, 3, 16, 24, generator=torch.Generator().manual_seed(1))


def looped_calls(model, fn):
    """How many times the looped block ran during `fn()`, and fn's result."""
    calls = []
    hook = model.looped.register_forward_hook(lambda *_: calls.append(1))
    try:
        with torch.no_grad():
            result = fn()
    finally:
        hook.remove()
    return len(calls), result


def test_the_looped_blocks_parameters_are_shared_across_loops():
    """The parameter count does not grow with the loops, and each loop runs the same module."""
    counts = {loops: count(LoopedViT(**dict(TINY, loop_depth=loops))) for loops in (1, 3, 8)}
    assert len(set(counts.values())) == 1
    model = tiny()
    block = count(model.looped)
    assert block == 2 * count(model.pre_loop) and block > 0
    runs, _ = looped_calls(model, lambda: model(images(), loop_depth=7))
    assert runs == 7


def test_deep_supervision_returns_one_output_a_loop_each_the_model_stopped_there():
    model = tiny()
    img = images()
    with torch.no_grad():
        every = model(img, return_all_logits=True)
        assert every.shape == (3, 3, 5)
        for loop in range(3):
            torch.testing.assert_close(every[loop], model(img, loop_depth=loop + 1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('stop_after', [0, 1])
def test_the_adaptive_exit_stops_after_the_first_loop_whose_predicted_gains_are_all_at_most_the_threshold(stop_after):
    """The threshold is the largest predicted gain after loop `stop_after`: the exit comes at the first loop whose
    predictions over the batch are all at most it, which is loop `stop_after` or earlier."""
    model = tiny(adaptive_loop=True, loop_depth=5)
    img = images()
    with torch.no_grad():
        logits, benefits = model(img, return_all_logits=True, return_exit_benefits=True)    # (5, b, c), (4, b)
    threshold = benefits[stop_after].max().item()
    first = next(loop for loop in range(4) if benefits[loop].max() <= threshold)
    runs, out = looped_calls(model, lambda: model(img, adaptive_exit=True, exit_threshold=threshold))
    assert runs == first + 1
    torch.testing.assert_close(out, logits[first], rtol=1e-6, atol=1e-6)


def test_the_adaptive_exit_runs_every_loop_when_every_prediction_is_above_the_threshold():
    model = tiny(adaptive_loop=True, loop_depth=5)
    img = images()
    with torch.no_grad():
        _, benefits = model(img, return_exit_benefits=True)
    runs, _ = looped_calls(model, lambda: model(img, adaptive_exit=True,
                                                exit_threshold=benefits.min().item() - 1.0))
    assert runs == 5


def test_the_deep_supervision_loss_weights_each_loops_cross_entropy():
    """final_mean: the last loop's cross-entropy at 1, the earlier ones' at 1 / (loops - 1); exponential: 2^(l - L + 1)."""
    logits = torch.randn(4, 6, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    ce = torch.stack([F.cross_entropy(logits[loop], labels, reduction='none') for loop in range(4)])    # (4, b)
    weights = {'final_mean': torch.tensor([1 / 3, 1 / 3, 1 / 3, 1.]), 'final': torch.tensor([0., 0., 0., 1.]),
               'exponential': torch.tensor([1 / 8, 1 / 4, 1 / 2, 1.])}
    for name, w in weights.items():
        expected = (ce * w.double()[:, None]).sum(dim=0).mean()
        torch.testing.assert_close(deep_supervision_loss(logits, labels, weighting=name), expected, msg=name)


def test_the_deep_supervision_loss_of_class_probabilities_is_linear_in_them():
    """Mixup's soft targets: probabilities lam * a + (1 - lam) * b give lam * loss(a) + (1 - lam) * loss(b), and
    one-hot probabilities the loss of their labels."""
    logits = torch.randn(3, 6, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a, b = torch.tensor([0, 1, 2, 3, 4, 0]), torch.tensor([4, 4, 1, 0, 2, 3])
    one_hot_a, one_hot_b = F.one_hot(a, 5).double(), F.one_hot(b, 5).double()
    torch.testing.assert_close(deep_supervision_loss(logits, one_hot_a), deep_supervision_loss(logits, a))
    torch.testing.assert_close(deep_supervision_loss(logits, 0.3 * one_hot_a + 0.7 * one_hot_b),
                               0.3 * deep_supervision_loss(logits, a) + 0.7 * deep_supervision_loss(logits, b))


def test_the_exit_targets_are_the_largest_gain_per_further_loop():
    logits = torch.randn(4, 6, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    ce = torch.stack([F.cross_entropy(logits[loop], labels, reduction='none') for loop in range(4)])
    expected = torch.stack([torch.stack([(ce[r] - ce[k]) / (k - r) for k in range(r + 1, 4)]).amax(dim=0).clamp(min=0)
                            for r in range(3)])
    torch.testing.assert_close(adaptive_exit_targets(logits, labels), expected)


def test_inputs_of_other_dimensions_loop_too():
    """input_shape with three dimensions (clips), patches per dimension."""
    torch.manual_seed(0)
    model = LoopedViT(input_shape=(4, 8, 8), patch_size=(2, 4, 4), channels=2, num_classes=5, dim=16, heads=2,
                      dim_head=8, mlp_dim=32, pre_loop_depth=1, num_looped_blocks=1, post_loop_depth=1, loop_depth=2)
    with torch.no_grad():
        assert model(torch.randn(2, 2, 4, 8, 8), return_all_logits=True).shape == (2, 2, 5)


# vit-pytorch 1.26.14 (tests/fixtures/make_gate_jet_looped_fixtures.py)


def test_vit_pytorchs_checkpoint_loads_strictly_and_gives_its_outputs():
    """The logits, every loop's logits and the exit gate's predictions."""
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_looped_vit')
    config = dict(metadata['config'], image_size=tuple(metadata['config']['image_size']))
    model = load_vit_pytorch(LoopedViT(**config), state_dict).eval()
    assert model.state_dict().keys() == state_dict.keys()
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], rtol=1e-4, atol=1e-5)
        every, benefits = model(tensors['input'], return_all_logits=True, return_exit_benefits=True)
    torch.testing.assert_close(every, tensors['all_logits'], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(benefits, tensors['exit_benefits'], rtol=1e-4, atol=1e-5)


# the official Looped-DiT code (OpenSenseNova/Looped-DiT, read from the code index's copy of a fork, Bili-Sakura/
# Looped-DiT-diffusers: model.py and configs at its first commit bf69669, diffusion.py at 89a3c53; written out by
# tests/fixtures/make_looped_vit_official_fixtures.py, run outside this repository)

OFFICIAL = json.loads((FIXTURES / 'looped_vit_official.json').read_text())


@pytest.mark.parametrize('loops', range(2, 9))
def test_the_final_mean_weights_are_the_official_final_plus_mean(loops):
    """The last loop at 1, the earlier ones sharing 1: the official weighting scales its weights to sum to 2, which
    these already do. float32 against Python's floats: 1 / (loops - 1) rounds to 6e-8 relative."""
    official = torch.tensor(OFFICIAL['weights']['final_plus_mean'][str(loops)])
    torch.testing.assert_close(deep_supervision_weights(loops, 'final_mean'), official, rtol=1e-6, atol=0)


@pytest.mark.parametrize('loops', range(2, 9))
def test_the_exponential_weights_have_the_official_shape_but_not_its_sum(loops):
    """Each loop half the next, as the official weighting: its weights are these scaled to sum to 2 (these,
    vit-pytorch's, sum to 2 - 2^(1 - loops): 1.875 at 4 loops). Powers of 2: exact in float32."""
    ours = deep_supervision_weights(loops, 'exponential').double()
    official = torch.tensor(OFFICIAL['weights']['exponential'][str(loops)], dtype=torch.float64)
    torch.testing.assert_close(ours * 2 / ours.sum(), official, rtol=1e-12, atol=0)
    assert ours.sum().item() == 2 - 2. ** (1 - loops)


def test_the_exclusive_self_attention_is_the_official_one():
    """An attention layer whose gate is 1/2 everywhere (zero weights) and whose output projection is 2 I gives its
    heads' output less its component along each token's own value: the official exclusive_self_attention of the same
    heads (2 of 8 channels). float32 through softmax attention over 7 tokens: a few ulp of values near 1."""
    _, _, tensors = load_fixture('looped_vit_official_xsa')
    attention = Attention(16, heads=2, dim_head=8).eval()
    with torch.no_grad():
        attention.to_qkv.weight.copy_(tensors['qkv_weight'])
        attention.to_gate.weight.zero_()
        attention.to_out[0].weight.copy_(2 * torch.eye(16))
        torch.testing.assert_close(attention(tensors['x']), tensors['output'], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('name', sorted(OFFICIAL['models']))
def test_a_released_models_layout_is_the_official_codes(name):
    """The official configuration's layers before, in and after the loop, its loops, patch and image size, heads of
    head_dim channels, width, and the official SwiGLU's hidden width as the MLP's."""
    entry = OFFICIAL['models'][name]
    with torch.device('meta'):
        model = looped_vit(name)
    stacks = (model.pre_loop, model.looped, model.post_loop)
    assert [len(stack.layers) for stack in stacks] == entry['loop_split']
    assert sum(entry['loop_split']) == entry['blocks']
    assert model.loop_depth == entry['num_loops']
    assert model.patch_size == (entry['patch_size'],) * 2 and model.input_shape == (entry['image_size'],) * 2
    for stack in stacks:
        for attention, feedforward in stack.layers:
            assert (attention.heads, attention.scale) == (entry['num_heads'], entry['head_dim'] ** -0.5)
            assert attention.to_qkv.in_features == entry['hidden_size']
            assert attention.to_qkv.out_features == 3 * entry['num_heads'] * entry['head_dim']
            assert feedforward.net[1].out_features == entry['mlp_hidden']


def test_every_size_of_the_official_code_is_in_the_table():
    assert sorted(OFFICIAL['models']) == sorted(f'{size}/{patch}' for size, patch in
                                                (('B', 16), ('B', 32), ('L', 16)))
    assert {name.split('/')[0] for name in OFFICIAL['models']} == set(CONFIGS)


@pytest.mark.parametrize('variant', ['B', 'S/16', 'B/0', 'B/2.5', 2])
def test_an_unknown_variant_is_refused_by_name(variant):
    with pytest.raises(ValueError, match='variant must be one of'):
        looped_vit(variant)


# clear errors


@pytest.mark.parametrize('overrides, message', [
    (dict(image_size=None), 'input_shape'),
    (dict(patch_size=5), 'divisible'),
    (dict(pool='max'), 'pool'),
    (dict(deep_supervision_weighting='linear'), 'weighting'),
    (dict(deep_supervision_weighting=[1., 2.]), 'weighting'),
])
def test_a_bad_argument_is_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        LoopedViT(**dict(TINY, **overrides))


def test_the_exit_needs_the_gate():
    with pytest.raises(ValueError, match='adaptive_loop=True'):
        tiny()(images(), adaptive_exit=True)


def test_an_input_of_another_shape_is_refused_naming_the_expected_one():
    with pytest.raises(ValueError, match=r"\('b', 3, 16, 24\)"):
        tiny()(torch.randn(2, 3, 16, 16))


# the training command: --deep-supervision trains on every loop's logits


@pytest.mark.parametrize('weighting', [None, 'exponential'])
def test_the_trainers_loss_with_deep_supervision_is_the_deep_supervision_loss_of_every_loop(weighting, monkeypatch,
                                                                                          tmp_path):
    from vit_pytorch.evaluate import load_digits

    chosen = () if weighting is None else ('--deep-supervision-weighting', weighting)
    seen = first_training_step(monkeypatch, tmp_path, 'looped_vit', '--deep-supervision', *chosen)
    labels = load_digits('train', image_size=8).labels[seen['index']]
    with torch.no_grad():
        logits = seen['model'](seen['images'], return_all_logits=True)              # (3 loops, b, classes)
    expected = deep_supervision_loss(logits, labels, weighting=weighting or 'final_mean', label_smoothing=0.1)
    last = F.cross_entropy(logits[-1], labels, label_smoothing=0.1)
    assert logits.shape[0] == 3 and abs(expected - last) > 0.01 * last      # the earlier loops count visibly
    assert seen['loss'] == pytest.approx(expected.item(), rel=1e-5)


def test_without_deep_supervision_the_trainer_trains_on_the_last_loops_cross_entropy(monkeypatch, tmp_path):
    from vit_pytorch.evaluate import load_digits

    seen = first_training_step(monkeypatch, tmp_path, 'looped_vit')
    labels = load_digits('train', image_size=8).labels[seen['index']]
    with torch.no_grad():
        logits = seen['model'](seen['images'])
    assert seen['loss'] == pytest.approx(F.cross_entropy(logits, labels, label_smoothing=0.1).item(), rel=1e-5)


def test_deep_supervision_for_a_model_without_loops_is_refused(tmp_path, capsys):
    from vit_pytorch import train

    assert train.main([str(option) for option in ('--model', 'vit', '--deep-supervision', '--image-size', 8,
                                                  '--depth', 1, '--epochs', 1, '--quiet', '--no-plots',
                                                  '--out', tmp_path / 'run')]) == 2
    error = capsys.readouterr().err
    assert '--deep-supervision trains --model looped_vit on its own loss; --model vit has none' in error
    assert len(error.strip().splitlines()) == 1


def test_a_deep_supervision_weighting_without_deep_supervision_is_refused(tmp_path, capsys):
    from vit_pytorch import train

    assert train.main([str(option) for option in ('--model', 'looped_vit', '--deep-supervision-weighting',
                                                  'exponential', '--image-size', 8, '--epochs', 1, '--quiet',
                                                  '--no-plots', '--out', tmp_path / 'run')]) == 2
    error = capsys.readouterr().err
    assert '--deep-supervision-weighting shapes the loss of --deep-supervision, which is not given' in error
    assert len(error.strip().splitlines()) == 1
    assert not (tmp_path / 'run').exists()


# the training command: with --adaptive-loop True the deep supervision loss adds the exit gate's regression


def trainer_step_gradients(monkeypatch, tmp_path, model, *options):
    """helpers.first_training_step, its loss backpropagated (`grads`), and `labels`: the ones
    LoopedViT.training_loss was given."""
    from helpers import first_training_step

    seen = {}
    own_loss = LoopedViT.training_loss

    def training_loss(self, logits, labels, *args, **kwargs):
        seen['labels'] = labels.clone()                                  # the batch's labels, as the trainer gives
        return own_loss(self, logits, labels, *args, **kwargs)

    monkeypatch.setattr(LoopedViT, 'training_loss', training_loss)
    return {**first_training_step(monkeypatch, tmp_path, model, *options, backward=True), **seen}


@pytest.mark.parametrize('weight', [None, 0.5])
def test_the_trainers_loss_with_an_exit_gate_adds_its_mean_squared_error_to_the_gains(weight, monkeypatch, tmp_path):
    """Deep supervision + weight x mean((predicted gain - max over later loops of the loss's gain per loop)^2),
    written out loop by loop here; the gate term is a visible part of it."""
    chosen = () if weight is None else ('--exit-gate-loss-weight', weight)
    seen = trainer_step_gradients(monkeypatch, tmp_path, 'looped_vit', '--deep-supervision', '--adaptive-loop',
                                  'True', *chosen)
    assert seen['labels'].shape == (16, 10) and set(seen['labels'].unique().tolist()) == {0., 1.}   # one-hot
    labels = seen['labels'].argmax(dim=1)
    with torch.no_grad():
        logits, benefits = seen['model'](seen['images'], return_all_logits=True, return_exit_benefits=True)
    losses = torch.stack([F.cross_entropy(loop, labels, label_smoothing=0.1, reduction='none') for loop in logits])
    supervised = (losses[-1] + losses[:-1].mean(dim=0)).mean()                  # final_mean: 1, and 1 shared
    targets = torch.stack([torch.stack([(losses[r] - losses[k]) / (k - r) for k in range(r + 1, 3)]).amax(dim=0)
                           .clamp(min=0) for r in range(2)])                        # (2, b)
    gate = ((benefits - targets) ** 2).mean()
    expected = supervised + (1.0 if weight is None else weight) * gate
    assert gate > 100 * 1e-5 * expected              # the gate term is 100 times the comparison's tolerance
    assert seen['loss'] == pytest.approx(expected.item(), rel=1e-5)


def test_a_trainer_step_with_an_exit_gate_gives_the_gates_parameters_a_gradient(monkeypatch, tmp_path):
    seen = trainer_step_gradients(monkeypatch, tmp_path, 'looped_vit', '--deep-supervision', '--adaptive-loop',
                                  'True')
    gate = {name: grad for name, grad in seen['grads'].items() if name.startswith('exit_gate.')}
    assert len(gate) == len(list(seen['model'].exit_gate.parameters())) > 0
    for name, grad in gate.items():
        assert grad is not None and grad.abs().sum() > 0, name


@pytest.mark.parametrize('options, message', [
    (('--adaptive-loop', 'True'), '--adaptive-loop shapes the loss of --deep-supervision, which is not given'),
    (('--deep-supervision', '--exit-gate-loss-weight', 0.5),
     "--exit-gate-loss-weight weights the loss of --model looped_vit's exit_gate, which trains only with "
     "--deep-supervision and a model that has one"),
    (('--deep-supervision', '--adaptive-loop', 'True', '--exit-gate-loss-weight', -1),
     '--exit-gate-loss-weight must be a finite number >= 0, got -1'),
])
def test_an_exit_gate_that_the_trainer_would_not_train_is_refused(options, message, tmp_path, capsys):
    from vit_pytorch import train

    assert train.main([str(option) for option in ('--model', 'looped_vit', *options, '--image-size', 8,
                                                  '--epochs', 1, '--quiet', '--no-plots',
                                                  '--out', tmp_path / 'run')]) == 2
    error = capsys.readouterr().err
    assert message in error
    assert len(error.strip().splitlines()) == 1


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow
def test_vit_pytorchs_main_block_runs():
    """Its `__main__` block: 256 pixels, patches of 16, width 512, 6 + 5 x 4 + 6 layers, the gate trained."""
    model = LoopedViT(image_size=256, patch_size=16, num_classes=1000, dim=512, heads=8, dim_head=64, mlp_dim=2048,
                      pre_loop_depth=6, num_looped_blocks=5, post_loop_depth=6, loop_depth=4,
                      deep_supervision_weighting='final_mean', adaptive_loop=True)
    img, labels = torch.randn(2, 3, 256, 256), torch.randint(0, 1000, (2,))
    logits, exit_benefits = model(img, return_all_logits=True, return_exit_benefits=True)
    loss = deep_supervision_loss(logits, labels, weighting='final_mean')
    gate_loss = F.mse_loss(exit_benefits, adaptive_exit_targets(logits, labels))
    (loss + gate_loss).backward()
    with torch.no_grad():
        assert model(img, loop_depth=8).shape == (2, 1000)
        assert model(img, adaptive_exit=True, exit_threshold=0.05).shape == (2, 1000)
