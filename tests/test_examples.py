"""The example scripts without a test of their own run at a tiny size and print what their docstrings promise
(examples/vat_actions.py and examples/looped_exit_gate.py; ats_tokens, moving_digits and the others are tested
where their results are used)."""

import math
import re
from pathlib import Path

import pytest
import torch

from helpers import load_example
from vit_pytorch.clips import action_clips



def example(name):
    return load_example(name)


def run_vat_actions(capsys, *argv):
    """The example's rules (zero, last step repeated) and its (train loss, test L1, dy's, dx's) after each epoch."""
    example('vat_actions').main(list(argv))
    lines = capsys.readouterr().out.splitlines()
    zero, last = map(float, re.fullmatch(r'test L1: zero ([\d.]+), last step repeated ([\d.]+)', lines[0]).groups())
    assert lines[1].startswith('per axis (dy, dx): zero (') and lines[2].startswith('model ')
    pattern = r'epoch {}: train loss ([\d.]+), test L1 ([\d.]+) \(dy ([\d.]+), dx ([\d.]+)\) '
    epochs = [tuple(map(float, re.match(pattern.format(epoch), line).groups()))
              for epoch, line in enumerate(lines[3:], start=1)]
    return zero, last, epochs


@pytest.mark.slow
def test_vat_actions_prints_its_baselines_and_a_finite_error_per_epoch(capsys):
    zero, last, epochs = run_vat_actions(capsys, '--epochs', '2', '--train', '64', '--test', '40')
    # predicting zero errs by the mean absolute displacement of the test clips, computed here from the data
    assert zero == pytest.approx(action_clips('test', count=40).actions.abs().mean().item(), abs=5e-4)
    assert 0 <= last
    assert len(epochs) == 2 and torch.isfinite(torch.tensor(epochs)).all()


@pytest.mark.slow
@pytest.mark.parametrize('model, dx_below', [(['vat'], None), (['siglip'], None), (['vaat'], 0.3),
                                             (['vaat', '--silent'], None)], ids=['vat', 'siglip', 'vaat', 'silent'])
def test_each_action_transformer_beats_predicting_zero_after_five_epochs(capsys, model, dx_below):
    # the first 5 epochs of docs/actions.md's runs: the motion seen in the 4 frames mostly continues, so a policy
    # that reads it errs well below zero's 0.669; at seed 0 VAT, SigLIPVAT, VAAT and VAAT silent reached 0.469,
    # 0.378, 0.198 and 0.470 after 5 epochs. The tones give the digit's column in each frame, so VAAT's horizontal
    # error falls far below zero's 0.656 on dx: 0.068 with the tones, 0.659 silent (VAT: 0.657)
    zero, last, epochs = run_vat_actions(capsys, '--model', *model, '--epochs', '5', '--train', '2048')
    assert epochs[-1][1] < zero - 0.1
    if dx_below is not None:
        assert epochs[-1][3] < dx_below


@pytest.mark.slow
def test_looped_exit_gate_reports_both_checkpoints_and_reuses_them(tmp_path, capsys):
    module = example('looped_exit_gate')
    module.main(['--out', str(tmp_path), '--epochs', '1'])
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith('--')] == [
        '--exit-gate-loss-weight 1:', '--exit-gate-loss-weight 0:']
    for weight in (1, 0):
        report = module.gate_report(tmp_path / f'weight_{weight}' / 'checkpoint', thresholds=(-1.0, 1e9))
        accuracies = [float(a) for a in report[0].split('accuracy after each loop ')[1].split()]
        # a threshold below every predicted gain never exits early: each image runs every loop and scores the last
        # loop's accuracy; one above every gain exits after the first loop
        never = re.fullmatch(r'threshold -1.0: accuracy ([\d.]+), mean loops ([\d.]+)', report[1]).groups()
        first = re.fullmatch(r'threshold 1000000000.0: accuracy ([\d.]+), mean loops ([\d.]+)', report[2]).groups()
        assert float(never[0]) == pytest.approx(accuracies[-1]) and float(never[1]) == len(accuracies)
        assert float(first[0]) == pytest.approx(accuracies[0]) and float(first[1]) == 1.0
    # a second call trains nothing: the checkpoints are reused, not replaced
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob('*') if p.is_file()}
    module.main(['--out', str(tmp_path), '--epochs', '1'])
    assert 'test accuracy' not in capsys.readouterr().out
    assert stamps == {p: p.stat().st_mtime_ns for p in tmp_path.rglob('*') if p.is_file()}


def test_levjepa_clips_direction_labels_follow_the_digits_motion():
    # the probe's direction labels, checked against the pixels: the digit's centre of brightness moves from the
    # first frame to the last along the label's (dy, dx) of vit_pytorch.clips.DIRECTIONS (speed 2 for 7 frames,
    # so 14 pixels on each moving axis, none on a still one), and every channel shows the same frame
    from vit_pytorch.clips import DIRECTIONS

    videos, labels = example('levjepa_clips').clips('test')
    assert videos.shape == (450, 3, 8, 32, 32) and torch.equal(videos[:, 0], videos[:, 2])
    grid = torch.arange(32.)
    mass = videos[:, 0].sum(dim=(-2, -1))                                                  # (n, frames)
    centre = torch.stack((torch.einsum('nfyx,y->nf', videos[:, 0], grid),
                          torch.einsum('nfyx,x->nf', videos[:, 0], grid)), dim=-1) / mass[..., None]
    moved = centre[:, -1] - centre[:, 0]                                                   # (n, 2)
    expected = torch.tensor([step for _, step in DIRECTIONS], dtype=torch.float)[labels['direction']] * 14
    assert torch.allclose(moved, expected, atol=1e-3)
    # the digit labels are the test split's digits in order (clip i shows digit i): scikit-learn's digits split as
    # the trainer splits them, a stratified quarter with random_state=0
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    target = load_digits().target
    test_index = train_test_split(range(len(target)), test_size=0.25, random_state=0, stratify=target)[1]
    assert labels['digit'].tolist() == target[test_index].tolist()


def test_levjepa_clips_labelled_subset_takes_that_many_clips_of_every_class():
    module = example('levjepa_clips')
    labels = torch.arange(100) % 7
    first, again, other = (module.labelled_subset(labels, 3, seed) for seed in (0, 0, 1))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert len(first.unique()) == 21 and labels[first].bincount().tolist() == [3] * 7


def test_levjepa_clips_nd_is_levjepa_with_local_views_of_the_full_size():
    # --nd (LeVJEPAND on the 3-D NDTransformer, LeVJEPA's views through ClipView) against the library's LeVJEPA
    # with local views of 32 (--local-size 32): the same initial weights, and on the same draws the same loss and
    # encoder gradient (the two encode the views in one batch or in two; only float rounding may differ)
    module = example('levjepa_clips')
    clips = torch.rand(6, 3, 8, 32, 32, generator=torch.Generator().manual_seed(0))
    learners = [module.make_learner(0, local_views=2, drop_ratio=0.9, nd=nd, local_size=32) for nd in (False, True)]
    states = [learner.state_dict() for learner in learners]
    assert states[0].keys() == states[1].keys() and all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    losses, gradients = [], []
    for learner in learners:
        torch.manual_seed(1)
        loss = learner(clips)
        loss.backward()
        losses.append(loss)
        gradients.append(torch.cat([p.grad.flatten() for p in learner.encoder.parameters()]))
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0)
    torch.testing.assert_close(gradients[1], gradients[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('nd', [False, True])
def test_levjepa_clips_no_flip_changes_only_the_local_views_flips(nd):
    # --no-flip against the default on the same draws: the same global (source) views, and each local (target)
    # view the flipped run's, or its left-right mirror where that run flipped it; a flip-off run of a seed is the
    # flip-on run without the flips (the comparison of docs/pretraining.md)
    module = example('levjepa_clips')
    clips = torch.rand(4, 3, 8, 32, 32, generator=torch.Generator().manual_seed(0))
    views = []
    for flip in (True, False):
        learner = module.make_learner(0, local_views=4, drop_ratio=0.9, nd=nd, flip=flip)
        torch.manual_seed(1)
        views.append(learner.views(clips))
    (global_on, local_on), (global_off, local_off) = views
    assert torch.equal(global_on, global_off)
    same = [torch.allclose(on, off, atol=1e-5) for on, off in zip(local_on, local_off)]
    mirrored = [torch.allclose(on.flip(-1), off, atol=1e-5) for on, off in zip(local_on, local_off)]
    assert all(s != m for s, m in zip(same, mirrored))          # each view one or the other, not both
    assert 0 < sum(mirrored) < len(mirrored)                     # 16 views: some flipped, some not


@pytest.mark.slow
def test_levjepa_clips_pretraining_lowers_its_loss_and_the_probe_beats_chance():
    # the loss on a fixed batch of the training's size (32: SIGReg grows with N), views, dropped tokens and SIGReg
    # directions (one seed for all the draws) falls when the optimizer steps on it (seed 0: 0.344 before, 0.261
    # after; the epochs' mean losses alone do not show it: they move by noise, and fell with the optimizer's step
    # removed); a linear probe on 5 labelled clips of each digit reads the digit, visible in every frame, far
    # above 1 in 10 (0.367 here)
    module = example('levjepa_clips')
    torch.set_num_threads(1)
    args = module.make_parser().parse_args(['--train-limit', '256', '--repeats', '1'])
    pretrain_videos, train_videos, train_labels, test_videos, test_labels = module.load_data(args)
    learner = module.make_learner(0, local_views=4, drop_ratio=0.95)

    def fixed_loss():
        torch.manual_seed(1)
        with torch.no_grad():
            return learner(pretrain_videos[:32]).item()

    before = fixed_loss()
    module.pretrain(learner, pretrain_videos, epochs=3, batch_size=32, lr=1e-3, seed=0, log=lambda line: None)
    after = fixed_loss()
    assert after < before
    subsets = {task: module.labelled_subset(train_labels[task], 5, 0) for task in module.TASKS}
    scores = module.probe_all(learner.encoder, train_videos, train_labels, test_videos, test_labels, subsets)
    assert scores[('digit', 'linear')] > 0.2


class _StopBeforeKnn(Exception):
    pass


@pytest.mark.parametrize('model', [None, 'swin'])
def test_label_efficiency_passes_model_to_the_pretraining_and_the_scratch_fine_tuning(monkeypatch, tmp_path, model):
    """--model reaches `pretrain` and the from-scratch `train` argv; a fine-tuning from a checkpoint takes its network
    from --init alone; without --model the argv are those of the ViT table (no --model at all)."""
    module = example('label_efficiency')
    calls = []

    def run_once(command, folder, epochs, argv):
        calls.append((command.__name__.rsplit('.', 1)[-1], Path(folder).name, [str(arg) for arg in argv]))
        return [{'test_accuracy': 0.5}] * epochs

    def load_digits(*args, **kwargs):
        raise _StopBeforeKnn
    monkeypatch.setattr(module, 'run_once', run_once)
    monkeypatch.setattr(module, 'load_digits', load_digits)
    argv = ['--methods', 'esvit', 'dino', '--seeds', '0', '--fractions', '0.1', '--out', str(tmp_path)]
    with pytest.raises(_StopBeforeKnn):
        module.main(argv + ([] if model is None else ['--model', model]))

    def model_of(args):
        return args[args.index('--model') + 1] if '--model' in args else None
    by_folder = {folder: (command, args) for command, folder, args in calls}
    assert sorted(by_folder) == ['finetune-dino-0.1-seed0', 'finetune-esvit-0.1-seed0', 'finetune-scratch-0.1-seed0',
                                 'pretrain-dino', 'pretrain-esvit']
    for method in ('esvit', 'dino'):
        command, args = by_folder[f'pretrain-{method}']
        assert command == 'pretrain' and args[args.index('--method') + 1] == method
        assert model_of(args) == model
        command, args = by_folder[f'finetune-{method}-0.1-seed0']
        assert command == 'train' and model_of(args) is None
        assert Path(args[args.index('--init') + 1]) == tmp_path / f'pretrain-{method}' / 'checkpoint'
    command, args = by_folder['finetune-scratch-0.1-seed0']
    assert command == 'train' and '--init' not in args and model_of(args) == model


def test_label_efficiency_passes_lejepa_args_to_lejepas_pretraining_alone(monkeypatch, tmp_path):
    module = example('label_efficiency')
    calls = {}

    def run_once(command, folder, epochs, argv):
        calls[Path(folder).name] = [str(arg) for arg in argv]
        return [{'test_accuracy': 0.5}] * epochs

    def load_digits(*args, **kwargs):
        raise _StopBeforeKnn
    monkeypatch.setattr(module, 'run_once', run_once)
    monkeypatch.setattr(module, 'load_digits', load_digits)
    with pytest.raises(_StopBeforeKnn):
        module.main(['--methods', 'lejepa', 'mae', '--seeds', '0', '--fractions', '0.1', '--out', str(tmp_path),
                     '--lejepa-args', '--lejepa-projector batchnorm'])
    assert calls['pretrain-lejepa'][-4:-2] == ['--lejepa-projector', 'batchnorm']
    assert '--lejepa-projector' not in calls['pretrain-mae']


def test_lejepa_probes_effective_rank_counts_equal_orthogonal_directions():
    # 3 orthogonal directions of equal spread, centred: 3 equal singular values, entropy ln 3, effective rank 3;
    # spreads 2:1 give p = (2/3, 1/3), effective rank exp(-(2/3) ln(2/3) - (1/3) ln(1/3))
    module = example('lejepa_probes')
    basis = torch.linalg.qr(torch.randn(12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))[0]
    spread = torch.cat([torch.eye(3), -torch.eye(3)]).double()              # (6, 3): columns orthogonal, mean 0
    assert module.effective_rank(spread @ basis[:, :3].T + 5) == pytest.approx(3, rel=1e-9)
    two = torch.cat([torch.diag(torch.tensor([2., 1.])), -torch.diag(torch.tensor([2., 1.]))]).double()
    expected = math.exp(-(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3))
    assert module.effective_rank(two @ basis[:, :2].T) == pytest.approx(expected, rel=1e-9)


def test_levjepa_drop_ratio_merges_the_seeds_run_apart_into_one_table(tmp_path):
    """Two folders of one seed each: the table gives the mean and sample std over both (hand-worked: each seed's CPU-s
    an epoch (2 + 4) / 2 = 3 and (4 + 6) / 2 = 5, so 4.0 +- sqrt(2) = 1.4; accuracies 0.5, 0.7: 60.0 +- 14.1)."""
    import json

    module = example('levjepa_drop_ratio')
    keys = ['digit 5-NN', 'digit linear', 'direction 5-NN', 'direction linear']
    for seed, (seconds, accuracy) in enumerate((([2., 4.], 0.5), ([4., 6.], 0.7))):
        folder = tmp_path / f'seed-{seed}'
        folder.mkdir()
        scores = {key: accuracy for key in keys}
        (folder / 'results.json').write_text(json.dumps({'0.75': [dict(seconds=seconds, scores=scores)],
                                                         'random init': [dict(seconds=None, scores=scores)]}))
    lines = module.table(module.load([tmp_path / 'seed-0', tmp_path / 'seed-1'])).splitlines()
    assert lines[2] == '| 0.75 | 2 | 4.0 ± 1.4 | ' + ' | '.join(['60.0 ± 14.1'] * 4) + ' |'
    assert lines[3] == '| random init | 2 | - | ' + ' | '.join(['60.0 ± 14.1'] * 4) + ' |'


@pytest.mark.slow
def test_levjepa_drop_ratio_runs_the_command_and_probes_its_network_and_the_initial_one(tmp_path, capsys):
    module = example('levjepa_drop_ratio')
    module.main(['--ratios', '0.75', '--seeds', '0', '--epochs', '1', '--out', str(tmp_path), '--', '--dim', '16',
                 '--depth', '1', '--heads', '2', '--dim-head', '8', '--mlp-dim', '32'])
    out = capsys.readouterr().out
    assert re.search(r'^seed 0, drop 0.75: [\d.]+ CPU-s an epoch', out, flags=re.M)
    results = module.load([tmp_path])
    assert set(results) == {0.75, 'random init'} and len(results[0.75][0][0]) == 1
    assert all(0 <= value <= 1 for _, scores in results[0.75] + results['random init'] for value in scores.values())


def test_esvit_probes_mean_cosine_averages_the_pairs_of_different_rows():
    # unit rows e1, e2 and (e1 + e2) / sqrt 2: cosines 0, 1/sqrt 2, 1/sqrt 2 over the 3 pairs; the diagonal is left out
    rows = torch.tensor([[1., 0.], [0., 1.], [2 ** -0.5, 2 ** -0.5]], dtype=torch.float64)
    assert example('esvit_probes').mean_cosine(rows) == pytest.approx(2 ** 0.5 / 3, rel=1e-12)


def test_probing_edits_the_learner_the_command_builds_and_keeps_its_method():
    from vit_pytorch import ViT, pretrain
    from vit_pytorch.training import pretraining

    module = example('probing')
    edited = module.edited_method('dino', lambda learner: setattr(learner, 'center_moving_average_decay', 0.5))
    assert isinstance(edited, type(pretraining.METHODS['dino']))
    args, _ = pretrain.parse_args(['--method', 'dino', '--num-classes-k', '16', '--projection-hidden-size', '8',
                                   '--bottleneck-dim', '4'])
    encoder = ViT(image_size=8, patch_size=4, num_classes=2, dim=8, depth=1, heads=1, dim_head=8, mlp_dim=8,
                  channels=1)
    learner = edited.build(args, encoder, image_size=(8, 8), mean=[0.5], std=[0.25])
    assert learner.center_moving_average_decay == 0.5
    assert pretraining.METHODS['dino'].build(args, encoder, image_size=(8, 8), mean=[0.5],
                                             std=[0.25]).center_moving_average_decay == 0.9
