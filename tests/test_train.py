"""The training command: it learns, resumes exactly, reads folders, draws, runs on 2 processes, and
says clearly what is wrong. Runs use tiny models and few epochs to stay fast."""

import contextlib
import io
import json
import math
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import digits_batch

from vit_pytorch import checkpoint as ckpt
from vit_pytorch import plots, train
from vit_pytorch.evaluate import load_digits, main as evaluate_main
from vit_pytorch.models import INPUTS, MODELS, build_model, known_names

TINY = ['--threads', '1', '--dim', '32', '--depth', '2', '--heads', '2', '--dim-head', '16', '--mlp-dim', '64']
FAST = ['--quiet', '--no-plots', '--batch-size', '128', '--warmup-epochs', '1'] + TINY


def run(*argv):
    return train.main([str(arg) for arg in argv])


def log_of(out):
    return [json.loads(line) for line in (Path(out) / 'log.jsonl').read_text().splitlines()]


def weights_of(out):
    from safetensors.torch import load_file
    return load_file(Path(out) / 'checkpoint' / 'model.safetensors')


def write_image_folder(root, splits=(('train', 6), ('val', 3)), size=12):
    """Two classes that a model can tell apart: horizontal and vertical stripes, as PNG files."""
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for split, count in splits:
        for name in ('horizontal', 'vertical'):
            folder = Path(root) / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                stripes = (torch.arange(size) // 2 % 2).float()
                pattern = stripes[:, None] if name == 'horizontal' else stripes[None]
                pattern = pattern.expand(size, size)
                noisy = (0.8 * pattern + 0.2 * torch.rand(size, size, generator=generator)) * 255
                rgb = noisy.to(torch.uint8)[..., None].expand(size, size, 3).contiguous().numpy()
                Image.fromarray(rgb).save(folder / f'{index}.png')
    return Path(root)


# the recipe's pieces


def test_model_arguments_parse_to_python_values():
    assert train.parse_model_kwargs(['--dim', '192', '--pool', 'mean', '--qkv-bias', '--patch-size=(4, 8)',
                                     '--dropout', '0.1']) == \
        dict(dim=192, pool='mean', qkv_bias=True, patch_size=(4, 8), dropout=0.1)


def test_learning_rate_warms_up_linearly_then_decays_as_a_cosine_to_zero():
    schedule = dict(peak=1.0, warmup_steps=10, total_steps=110)
    assert train.learning_rate(0, **schedule) == pytest.approx(0.1)
    assert train.learning_rate(9, **schedule) == pytest.approx(1.0)
    assert train.learning_rate(60, **schedule) == pytest.approx(0.5)          # halfway through the cosine
    assert train.learning_rate(35, **schedule) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert train.learning_rate(110, **schedule) == pytest.approx(0.0, abs=1e-12)


def test_one_training_epoch_steps_on_the_schedule_through_every_image_once_and_sums_what_each_step_gives():
    from vit_pytorch.training.loop import train_epoch

    weight = torch.nn.Linear(1, 1, bias=False)
    optimizer = torch.optim.SGD(weight.parameters(), lr=0.0)
    seen, rates, events = [], [], []

    def step_loss(index, generator, rng, global_step):
        seen.extend(index.tolist())
        rates.append(optimizer.param_groups[0]['lr'])
        events.append('forward')
        loss = weight(torch.ones(len(index), 1)).sum()
        return loss, loss.item(), torch.tensor([len(index), 1.0], dtype=torch.float64)

    totals, lr = train_epoch(weight, optimizer, step_loss, epoch=1, seed=3, images=10, batch_size=4, steps=3,
                             peak=1.0, warmup_steps=2, total_steps=6, clip_grad=0,
                             after_backward=lambda: events.append('backward'),
                             after_step=lambda step: events.append(step))
    assert sorted(seen) == list(range(10))                        # 4 + 4 + 2: the last batch takes the rest
    # epoch 1 of 3 steps: global steps 3, 4, 5 of a cosine from step 2 to step 6
    assert rates == pytest.approx([0.5 * (1 + math.cos(math.pi * k / 4)) for k in (1, 2, 3)])
    assert lr == rates[-1]
    assert totals.tolist() == [10.0, 3.0]
    assert events == ['forward', 'backward', 3, 'forward', 'backward', 4, 'forward', 'backward', 5]


def test_an_epoch_stops_before_the_step_that_would_apply_a_non_finite_gradient():
    from vit_pytorch.training.loop import TrainingDiverged, train_epoch

    weight = torch.nn.Linear(1, 1, bias=False)
    before = weight.weight.detach().clone()
    optimizer = torch.optim.SGD(weight.parameters(), lr=0.1)

    def step_loss(index, generator, rng, global_step):
        loss = weight(torch.full((len(index), 1), float('inf'))).sum()
        return loss, loss.item(), torch.zeros(1, dtype=torch.float64)

    args = train.parse_args([])[0]
    with pytest.raises(TrainingDiverged, match='step 1/2'):
        train_epoch(weight, optimizer, step_loss, epoch=0, seed=0, images=4, batch_size=2, steps=2, peak=0.1,
                    warmup_steps=0, total_steps=2, clip_grad=1.0,
                    divergence=dict(args=args, kept=Path('nowhere'), world_size=1, device='cpu'))
    assert torch.equal(weight.weight, before)


def test_weight_decay_spares_norms_biases_position_embeddings_and_tokens():
    model = build_model('vit', image_size=16, patch_size=4, num_classes=3, dim=32, depth=1, heads=2, mlp_dim=64)
    decay, no_decay = train.parameter_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay['params']}
    assert decay['weight_decay'] == 0.05 and no_decay['weight_decay'] == 0.0
    assert decayed == {n for n, p in model.named_parameters()
                       if p.ndim == 2 and n not in ('pos_embedding', 'cls_token')}
    assert 'transformer.layers.0.0.to_qkv.weight' in decayed
    assert 'pos_embedding' not in decayed and 'cls_token' not in decayed and 'mlp_head.bias' not in decayed


def test_translate_shifts_each_image_by_its_own_offset_filling_with_zeros():
    images = torch.arange(2 * 16, dtype=torch.float32).reshape(2, 1, 4, 4) + 1
    shifted = train.translate(images, torch.tensor([[1, 0], [0, -1]]), pad=1)
    down = torch.cat((torch.zeros(1, 4), images[0, 0, :3]))             # first image: one row down
    left = torch.cat((images[1, 0, :, 1:], torch.zeros(4, 1)), dim=1)    # second image: one column left
    assert torch.equal(shifted[0, 0], down) and torch.equal(shifted[1, 0], left)


def test_digits_split_is_the_fixed_held_out_quarter():
    train_set, test_set = load_digits('train'), load_digits('test')
    assert (len(train_set), len(test_set)) == (1347, 450)
    assert train_set.images.shape[1:] == (1, 16, 16)
    assert torch.equal(load_digits('test').labels, test_set.labels)
    per_digit = torch.bincount(torch.cat((train_set.labels, test_set.labels)))
    assert (torch.bincount(test_set.labels) - per_digit / 4).abs().max() <= 1   # stratified: a quarter of each digit


# training


def test_short_run_on_digits_beats_90_percent_and_draws_its_curves(tmp_path):
    out = tmp_path / 'run'
    assert run('--epochs', 8, '--lr', 5e-3, '--translate', 0, '--out', out, '--quiet', '--batch-size', 64,
               *TINY) == 0
    log = log_of(out)
    assert [record['epoch'] for record in log] == list(range(1, 9))
    assert log[-1]['test_accuracy'] >= 0.90          # 96.2% measured (seeds 1, 2: 94.7%, 93.6%); chance is 10%
    curves = out / 'curves.png'
    assert curves.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and curves.stat().st_size > 5000
    assert (out / 'attention.png').stat().st_size > 0
    assert (out / 'position_similarity.png').stat().st_size > 0


def test_interrupted_run_resumed_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    whole, broken = tmp_path / 'whole', tmp_path / 'broken'
    assert run('--epochs', 3, '--out', whole, *FAST) == 0

    saves = []
    real_save = train.save_checkpoint

    def save_then_die(*args, **kwargs):
        real_save(*args, **kwargs)
        saves.append(1)
        if len(saves) == 2:
            raise KeyboardInterrupt                     # killed right after epoch 2 was saved

    monkeypatch.setattr(train, 'save_checkpoint', save_then_die)
    assert run('--epochs', 3, '--out', broken, *FAST) == 130
    monkeypatch.setattr(train, 'save_checkpoint', real_save)
    assert len(log_of(broken)) == 2
    assert run('--out', broken, '--resume') == 0

    expected, resumed = weights_of(whole), weights_of(broken)
    assert expected.keys() == resumed.keys()
    for key in expected:
        assert torch.equal(expected[key], resumed[key]), key
    timing = ('epoch_seconds', 'images_per_second', 'elapsed_seconds')
    strip = lambda log: [{k: v for k, v in record.items() if k not in timing} for record in log]
    assert strip(log_of(broken)) == strip(log_of(whole))


def cosine_lr(peak, step, *, warmup_steps, total_steps):
    """The schedule after warm-up, written out: peak * (1 + cos(pi * progress)) / 2."""
    return peak * (1 + math.cos(math.pi * (step - warmup_steps) / (total_steps - warmup_steps))) / 2


def stripes_run(tmp_path, *extra):
    """A one-epoch run on 12 striped images in batches of 4 (3 steps an epoch): its output folder."""
    data, out = write_image_folder(tmp_path / 'stripes'), tmp_path / 'run'
    assert run('--data', data, '--image-size', 8, '--patch-size', 4, '--epochs', 1, '--out', out, *FAST,
               '--batch-size', 4, *extra) == 0
    return out


def test_resume_with_more_epochs_extends_a_finished_run_on_the_stretched_schedule(tmp_path):
    out = stripes_run(tmp_path)
    first = weights_of(out)
    # options given with the run's own values are accepted
    assert run('--out', out, '--resume', '--epochs', 2, '--dim', 32, '--batch-size', 4, '--quiet') == 0
    log = log_of(out)
    assert [record['epoch'] for record in log] == [1, 2]
    # the last step of epoch 2 on the cosine of a 2-epoch run, 3 steps an epoch, warm-up 1 epoch
    assert log[1]['lr'] == pytest.approx(cosine_lr(3e-3, 5, warmup_steps=3, total_steps=6))
    assert any(not torch.equal(first[key], value) for key, value in weights_of(out).items())


def test_resume_with_a_new_learning_rate_uses_it_as_the_peak_of_the_remaining_steps(tmp_path):
    out = stripes_run(tmp_path)
    assert run('--out', out, '--resume', '--epochs', 2, '--lr', 1e-3, '--quiet', '--no-plots') == 0
    log = log_of(out)
    assert log[0]['lr'] == pytest.approx(3e-3)                      # the end of the warm-up, at the old peak
    assert log[1]['lr'] == pytest.approx(cosine_lr(1e-3, 5, warmup_steps=3, total_steps=6))


def test_resume_refuses_a_changed_model_data_or_recipe_naming_each_flag_and_both_values(tmp_path, capsys):
    out = stripes_run(tmp_path)
    capsys.readouterr()
    assert run('--out', out, '--resume', '--epochs', 2, '--model', 'simple_vit', '--batch-size', 64,
               '--image-size', 32, '--data', 'digits', '--dim', 48, '--qkv-bias') == 2
    error = capsys.readouterr().err
    for said in ('--model simple_vit (the run has vit)', '--batch-size 64 (the run has 4)',
                 '--image-size 32 (the run has 8)', "--data digits (the run has", '--dim 48 (the run has 32)',
                 '--qkv-bias True'):
        assert said in error
    assert len(log_of(out)) == 1                                     # nothing was trained


def test_resume_of_a_finished_run_without_more_epochs_says_how_to_extend_it(tmp_path, capsys):
    out = stripes_run(tmp_path)
    assert run('--out', out, '--resume') == 2
    error = capsys.readouterr().err
    assert 'has done 1' in error and 'give more epochs' in error


def test_folder_data_set_trains_and_evaluate_reproduces_the_last_accuracy(tmp_path, capsys):
    data = write_image_folder(tmp_path / 'stripes')
    out = tmp_path / 'run'
    assert run('--data', data, '--image-size', 8, '--patch-size', 4, '--epochs', 2, '--out', out,
               '--batch-size', 4, '--translate', 0, '--hflip', '--mixup', 0.2, '--amp', *FAST) == 0
    config = json.loads((out / 'checkpoint' / 'config.json').read_text())
    assert config['data']['classes'] == ['horizontal', 'vertical']
    assert config['model_kwargs']['image_size'] == 8 and config['model_kwargs']['channels'] == 3
    capsys.readouterr()
    assert evaluate_main([str(out / 'checkpoint'), '--json', '--amp']) == 0
    result = json.loads(capsys.readouterr().out)
    assert result['count'] == 6 and result['split'] == 'val'
    assert result['accuracy'] == pytest.approx(log_of(out)[-1]['test_accuracy'])
    assert result['loss'] == pytest.approx(log_of(out)[-1]['test_loss'], rel=1e-5)


def test_every_training_image_is_used_every_epoch_the_last_batch_taking_the_rest(tmp_path, monkeypatch):
    batches = []
    real_augment = train.augment

    def counting(images, labels, *args):
        batches.append(len(labels))
        return real_augment(images, labels, *args)

    monkeypatch.setattr(train, 'augment', counting)
    out = stripes_run(tmp_path, '--batch-size', 5, '--epochs', 2)        # 12 images: 5, 5 and 2
    assert batches == [5, 5, 2] * 2
    assert [record['train_images'] for record in log_of(out)] == [12, 12]


@pytest.mark.parametrize('count, world_size', [(256, 2), (67, 2), (1, 2), (0, 2), (10, 3), (2, 3)])
def test_a_batch_is_split_into_contiguous_parts_that_differ_by_at_most_one_image(count, world_size):
    parts = [range(count)[train.share(count, rank, world_size)] for rank in range(world_size)]
    assert [index for part in parts for index in part] == list(range(count))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


# a torchrun worker: the training command, then the names of the threads the process still has
WORKER = """
import json, os, sys
from vit_pytorch import train
code = train.main(sys.argv[1:])
threads = sorted(open(f'/proc/self/task/{task}/comm').read().strip() for task in os.listdir('/proc/self/task'))
with open(os.path.join(os.environ['THREADS_REPORT'], f"rank{os.environ['RANK']}.json"), 'w') as report:
    json.dump(dict(rank=int(os.environ['RANK']), threads=threads), report)
sys.exit(code)
"""


@pytest.mark.skipif(not Path('/proc/self/task').is_dir(), reason='lists threads through /proc')
def test_two_processes_train_like_one_with_the_same_global_batch(tmp_path):
    """torchrun with gloo: the 2 processes split each batch and average gradients, so after an epoch
    the weights equal a single process's (up to the order of float additions). 1,347 images at 256
    end in a batch of 67, split 33 and 34. Each process then tears its process group down whole:
    none of gloo's threads is left to outlive the interpreter (where they aborted the process)."""
    single, double = tmp_path / 'single', tmp_path / 'double'
    args = ['--epochs', '1', '--batch-size', '256', '--quiet', '--no-plots', '--warmup-epochs', '1', '--threads', '1',
            '--dim', '32', '--depth', '1', '--heads', '2', '--dim-head', '16', '--mlp-dim', '64', '--device', 'cpu']
    reports = tmp_path / 'threads'                      # a file per rank: the ranks' stdout lines interleave
    reports.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS='1', THREADS_REPORT=str(reports))
    assert run(*args, '--out', single) == 0
    worker = tmp_path / 'worker.py'
    worker.write_text(WORKER)
    process = subprocess.Popen(
        [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', str(worker), *args,
         '--out', str(double)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:                       # take torchrun's workers down with it
            os.killpg(process.pid, 9)
            process.wait()
    assert process.returncode == 0, stderr[-3000:]
    one, two = weights_of(single), weights_of(double)
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-5, msg=key)
    assert log_of(double)[0]['test_accuracy'] == pytest.approx(log_of(single)[0]['test_accuracy'], abs=0.01)
    assert log_of(double)[0]['train_images'] == log_of(single)[0]['train_images'] == 1347
    left = {report['rank']: report['threads']
            for report in (json.loads(file.read_text()) for file in sorted(reports.glob('rank*.json')))}
    assert sorted(left) == [0, 1], stdout[-2000:]
    assert not [name for threads in left.values() for name in threads if 'gloo' in name], left


# the command line


def help_entries(text):
    """{option: its help, joined onto one line} from argparse's --help output."""
    entries, current = {}, None
    for line in text.splitlines():
        start = re.match(r'  (--?[\w-]+)', line)
        if start:
            current = start[1]
            entries[current] = line
        elif current and line.startswith('   '):
            entries[current] += ' ' + line.strip()
        else:
            current = None
    return entries


def test_help_shows_every_options_real_default_once(capsys, monkeypatch):
    monkeypatch.setenv('COLUMNS', '120')
    with pytest.raises(SystemExit) as stop:
        run('--help')
    assert stop.value.code == 0
    entries = help_entries(capsys.readouterr().out)
    entries.pop('-h')
    assert len(entries) == 33                           # 33 options, each with its own entry
    for option, entry in entries.items():
        assert entry.count('default') == 1, entry
    for option, default in (('--epochs', '50'), ('--seed', '0'), ('--weight-decay', '0.05'), ('--lr', '0.003'),
                            ('--batch-size', '64'), ('--data', 'digits')):
        assert f'(default: {default})' in entries[option], entries[option]
    assert '(default: vit; vit_1d for signals, vit_3d for clips)' in entries['--model']   # the data's kind's ViT
    assert 'True' not in entries['--no-plots'] and 'False' not in entries['--hflip']
    assert '16 for the digits' in entries['--image-size'] and 'None' not in entries['--image-size']


@pytest.mark.parametrize('module, distribution', [('sklearn', 'scikit-learn'), ('safetensors', 'safetensors'),
                                                  ('numpy', 'numpy')])
def test_training_without_the_train_extra_names_what_to_install(tmp_path, capsys, monkeypatch, module, distribution):
    monkeypatch.setitem(sys.modules, module, None)                   # import fails as if not installed
    assert run('--epochs', 1, '--out', tmp_path / 'run', *FAST) == 2
    error = capsys.readouterr().err
    assert f'needs {distribution}' in error
    assert "pip install -e '" in error and "[train]'" in error
    assert not (tmp_path / 'run').exists()                          # said before anything was trained


def test_pictures_without_matplotlib_name_what_to_install_and_how_to_do_without(tmp_path, capsys, monkeypatch):
    data = write_image_folder(tmp_path / 'stripes', splits=(('train', 2), ('val', 1)))
    monkeypatch.setitem(sys.modules, 'matplotlib', None)
    assert run('--data', data, '--image-size', 8, '--epochs', 1, '--out', tmp_path / 'run', '--quiet', *TINY) == 2
    error = capsys.readouterr().err
    assert 'needs matplotlib' in error and '--no-plots' in error and "[train]'" in error
    assert not (tmp_path / 'run').exists()


def test_a_folder_without_pillow_names_what_to_install(tmp_path, capsys, monkeypatch):
    data = write_image_folder(tmp_path / 'stripes', splits=(('train', 2), ('val', 1)))
    monkeypatch.setitem(sys.modules, 'PIL', None)
    assert run('--data', data, '--image-size', 8, '--epochs', 1, '--out', tmp_path / 'run', *FAST) == 2
    error = capsys.readouterr().err
    assert 'needs pillow' in error and "[train]'" in error


def test_an_image_of_fewer_than_4_patches_is_warned_about(tmp_path, capsys):
    data = write_image_folder(tmp_path / 'stripes', splits=(('train', 2), ('val', 1)))
    common = ['--data', data, '--image-size', 8, '--epochs', 1, *FAST]
    assert run(*common, '--patch-size', 4, '--out', tmp_path / 'four') == 0          # 2x2 patches: fine
    assert 'warning' not in capsys.readouterr().err
    assert run(*common, '--patch-size', 8, '--out', tmp_path / 'one') == 0           # a single patch
    error = capsys.readouterr().err
    assert 'warning: a 8x8 image is only 1 patch(es) (1x1) for vit' in error and '--patch-size' in error


# pictures


@pytest.fixture(scope='module')
def pictured(tmp_path_factory):
    """A run on two classes of stripes, 10 validation images each, listed class by class, with its pictures
    drawn: (the figures by file name, the command's output)."""
    root = tmp_path_factory.mktemp('pictured')
    data = write_image_folder(root / 'stripes', splits=(('train', 4), ('val', 10)))
    figures, printed = {}, io.StringIO()
    real_save = plots.save_figure

    def keep(figure, path, dpi):
        figures[Path(path).name] = figure
        return real_save(figure, path, dpi)

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setattr(plots, 'save_figure', keep)
        assert run('--data', data, '--image-size', 8, '--patch-size', 4, '--epochs', 2, '--batch-size', 4,
                   '--out', root / 'run', '--quiet', '--warmup-epochs', 1, *TINY) == 0
    return figures, printed.getvalue()


def test_attention_pictures_name_label_and_prediction_for_examples_of_every_class(pictured):
    figures, _ = pictured
    titles = [axis.get_title() for axis in figures['attention.png'].axes if axis.get_title()]
    assert len(titles) == 8
    pairs = [re.fullmatch(r'label (\w+)\npredicted (\w+)', title).groups() for title in titles]
    assert {label for label, _ in pairs} == {'horizontal', 'vertical'}
    assert [label for label, _ in pairs] == ['horizontal', 'vertical'] * 4      # the classes take turns


def test_examples_take_the_classes_in_turn():
    labels = torch.tensor([0, 0, 0, 1, 1, 2])
    assert train.pick_examples(labels, 4).tolist() == [0, 3, 5, 1]
    assert train.pick_examples(labels, 10).tolist() == [0, 3, 5, 1, 4, 2]


def test_attention_distance_picture_has_a_title_and_the_uniform_attention_line(pictured):
    figures, _ = pictured
    axis = figures['attention_distance.png'].axes[0]
    assert axis.get_title()
    uniform = [line for line in axis.get_lines() if line.get_label() == 'uniform attention']
    # a 2x2 grid of 4-pixel patches: from each patch, 0, 4, 4 and 4 * sqrt(2) pixels to the four patches
    assert len(uniform) == 1 and uniform[0].get_ydata()[0] == pytest.approx((8 + 4 * math.sqrt(2)) / 4)


def test_curves_name_the_folders_split_and_say_why_the_training_loss_stays_high(pictured):
    figures, _ = pictured
    figure = figures['curves.png']
    labels = [text.get_text() for axis in figure.axes for text in axis.get_legend().get_texts()]
    assert 'val' in labels and 'test' not in labels
    smoothed = F.cross_entropy(torch.tensor([[0.95, 0.05]]).log(), torch.tensor([0]), label_smoothing=0.1)
    floor = [line for line in figure.axes[0].get_lines() if line.get_label().startswith('least train loss')]
    assert len(floor) == 1 and floor[0].get_ydata()[0] == pytest.approx(smoothed.item())
    note = ' '.join(text.get_text() for text in figure.texts)
    assert 'label smoothing 0.1' in note and 'shifts' in note and 'val loss' in note


def test_the_last_line_names_the_pictures(pictured):
    _, printed = pictured
    last = printed.strip().splitlines()[-1]
    assert last.startswith('val accuracy')
    for name in ('curves.png', 'attention.png', 'attention_distance.png', 'position_similarity.png'):
        assert name in last


# models by name


def test_unknown_model_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown model name 'vitt'.*simple_vit.*vit"):
        build_model('vitt')


def test_registry_names_the_class_each_module_defines():
    assert MODELS['vit'] == 'vit_pytorch.vit:ViT' and MODELS['simple_vit'] == 'vit_pytorch.simple_vit:SimpleViT'
    for name, target in MODELS.items():
        module_name, class_name = target.split(':')
        path = Path(train.__file__).parent / (module_name.rsplit('.', 1)[1] + '.py')
        if path.exists():                               # variants arrive one by one
            assert f'class {class_name}(' in path.read_text(), name
    assert 'vit' in known_names() and any('S/16' in name for name in known_names())


def test_named_configuration_builds_the_paper_vit():
    pytest.importorskip('vit_pytorch.pretrained')
    model = build_model('Ti/16', image_size=32, num_classes=10)
    assert model.transformer.layers[0][0].to_qkv.in_features == 192 and len(model.transformer.layers) == 12


# clear errors


def test_missing_data_folder_is_named(tmp_path, capsys):
    assert run('--data', tmp_path / 'nowhere', '--out', tmp_path / 'run', *FAST) == 2
    assert f"data folder {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err


def test_empty_class_folder_is_named(tmp_path, capsys):
    data = write_image_folder(tmp_path / 'stripes', splits=(('train', 2), ('val', 1)))
    (data / 'train' / 'diagonal').mkdir()
    assert run('--data', data, '--image-size', 8, '--out', tmp_path / 'run', *FAST) == 2
    assert f"class folder {data / 'train' / 'diagonal'} is empty" in capsys.readouterr().err


def test_unknown_model_name_on_the_command_line(tmp_path, capsys):
    assert run('--model', 'resnet', '--out', tmp_path / 'run', *FAST) == 2
    error = capsys.readouterr().err
    assert "unknown model name 'resnet'" in error and 'simple_vit' in error


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    """A checkpoint folder of a tiny one-epoch run."""
    out = tmp_path_factory.mktemp('saved') / 'run'
    assert run('--epochs', 1, '--out', out, *FAST) == 0
    return out / 'checkpoint'


def corrupt_copy(saved, tmp_path, name, damage):
    import shutil
    copy = tmp_path / 'checkpoint'
    shutil.copytree(saved, copy)
    damage(copy / name)
    return copy


def test_truncated_weights_give_a_clear_error(saved, tmp_path, capsys):
    copy = corrupt_copy(saved, tmp_path, 'model.safetensors',
                        lambda file: file.write_bytes(file.read_bytes()[:1000]))
    assert evaluate_main([str(copy)]) == 2
    assert f"cannot read {copy / 'model.safetensors'}" in capsys.readouterr().err
    with pytest.raises(ckpt.CheckpointError, match='corrupt, truncated'):
        ckpt.load_model(copy)


def test_corrupt_config_gives_a_clear_error(saved, tmp_path):
    copy = corrupt_copy(saved, tmp_path, 'config.json', lambda file: file.write_text('{"model": "vit", '))
    with pytest.raises(ckpt.CheckpointError, match='config.json is not valid JSON'):
        ckpt.load_model(copy)


def test_weights_from_another_run_are_caught(saved, tmp_path):
    copy = corrupt_copy(saved, tmp_path, 'config.json', lambda file: file.write_text(
        file.read_text().replace('"dim": 32', '"dim": 48')))
    with pytest.raises(ckpt.CheckpointError, match='disagree'):
        ckpt.load_model(copy)


def test_weights_that_do_not_fit_the_model_list_the_entries(saved):
    other = build_model('vit', image_size=16, patch_size=4, num_classes=10, dim=32, depth=1, heads=2,
                        dim_head=16, mlp_dim=64, channels=1)
    with pytest.raises(ckpt.CheckpointError, match=r'unexpected: transformer\.layers\.1\.'):
        ckpt.load_weights(other, saved)


def test_missing_checkpoint_and_weights_only_resume_are_explained(saved, tmp_path, capsys):
    assert evaluate_main([str(tmp_path / 'none')]) == 2
    assert f"no checkpoint at {tmp_path / 'none'}" in capsys.readouterr().err
    import shutil
    copy = tmp_path / 'weights_only'
    shutil.copytree(saved, copy)
    (copy / 'state.json').unlink()
    assert run('--resume', copy, '--out', tmp_path / 'run', '--quiet') == 2
    assert 'holds weights only' in capsys.readouterr().err


def test_checkpoint_files_are_written_with_one_mode_that_of_the_umask(saved):
    umask = os.umask(0o022)
    os.umask(umask)
    modes = {file.name: stat.S_IMODE(file.stat().st_mode) for file in saved.iterdir()}
    assert sorted(modes) == ['config.json', 'model.safetensors', 'optimizer.safetensors', 'state.json']
    assert set(modes.values()) == {0o666 & ~umask}, {name: oct(mode) for name, mode in modes.items()}


def test_evaluate_without_safetensors_names_what_to_install(saved, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, 'safetensors', None)
    assert evaluate_main([str(saved)]) == 2
    error = capsys.readouterr().err
    assert 'python -m vit_pytorch.evaluate needs safetensors' in error
    assert "pip install -e '" in error and "[train]'" in error


def test_evaluate_reloads_the_model_without_the_trainer(saved, capsys):
    import ast
    import vit_pytorch.evaluate
    tree = ast.parse(Path(vit_pytorch.evaluate.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | \
        {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert 'vit_pytorch.train' not in imported and 'vit_pytorch.training.checkpoints' in imported
    model, config = ckpt.load_model(saved)
    assert config['model'] == 'vit' and not model.training
    capsys.readouterr()
    assert evaluate_main([str(saved), '--json']) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result['count'], result['split']) == (450, 'test')
    assert result['accuracy'] == pytest.approx(log_of(saved.parent)[-1]['test_accuracy'])


@pytest.mark.parametrize('name', sorted(MODELS))
def test_every_registered_model_builds_from_the_trainer_defaults_and_takes_a_step(name):
    module = MODELS[name].split(':')[0].rsplit('.', 1)[1]
    if not (Path(train.__file__).parent / f'{module}.py').exists():
        pytest.skip(f'{module}.py is not written yet')
    if name in INPUTS:
        pytest.skip(f'{name} takes {INPUTS[name]}, not images: tests/test_train_kinds.py gives it a step on those')
    kwargs = train.model_config(name, {}, image_size=16, channels=1, num_classes=10)
    model = build_model(name, **kwargs)
    digits = digits_batch(8, size=16)
    images, labels = digits[0], digits[1]
    optimizer = torch.optim.AdamW(train.parameter_groups(model, 0.05), lr=1e-3)
    outputs = model(images)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    assert all(output.shape == (8, 10) for output in outputs)
    sum(torch.nn.functional.cross_entropy(output, labels) for output in outputs).backward()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_each_models_own_argument_names_are_ones_it_takes():
    """ARGUMENT_NAMES renames the trainer's settings for a model only onto arguments that model accepts, and
    every model then takes the data's channels and classes (the image size too, unless it takes any size)."""
    from vit_pytorch.training import registry

    for name, names in registry.ARGUMENT_NAMES.items():
        assert set(names.values()) <= registry.parameters(name), name
    for name in registry.MODELS:
        names = registry.ARGUMENT_NAMES.get(name, {})
        config = registry.model_config(name, {}, image_size=17, channels=3, num_classes=11)
        assert config.get(names.get('channels', 'channels')) == 3, (name, config)
        assert config.get(names.get('num_classes', 'num_classes')) == 11, (name, config)
        assert config.get(names.get('image_size', 'image_size'), 17) == 17, (name, config)
