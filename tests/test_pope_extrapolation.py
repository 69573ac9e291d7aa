"""examples/pope_extrapolation.py (issue 28): the clips of every length show the same digits moving the labelled
way, a model rebuilt for longer clips keeps its weights and continues its positions (a causal one gives the trained
model's tokens on the first frames; a plain one gives what vit-pytorch computes on the longer input), and the
summary's means and paired differences."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from helpers import load_fixture, reference_case
from vit_pytorch.pretrained import load_vit_pytorch

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location('pope_extrapolation', ROOT / 'examples' / 'pope_extrapolation.py')
pope_extrapolation = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(pope_extrapolation)

TINY = dict(dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32)
# (dy, dx) of the 8 classes, clockwise from right, y growing downwards: written here, not read from the module
STEPS = [(0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1)]


def centre_of_ink(videos):
    """(n, frames, 2) row and column of each frame's ink-weighted centre."""
    frames = videos[:, 0]                                                    # (n, t, h, w)
    rows = torch.arange(frames.shape[-2], dtype=torch.float64)[:, None]
    columns = torch.arange(frames.shape[-1], dtype=torch.float64)[None, :]
    ink = frames.double().sum(dim=(-2, -1))
    return torch.stack(((frames * rows).sum(dim=(-2, -1)) / ink, (frames * columns).sum(dim=(-2, -1)) / ink), -1)


@pytest.mark.parametrize('frames', [8, 16])
def test_the_clips_of_every_length_show_the_same_digits_moving_one_pixel_a_frame_the_labelled_way(frames):
    videos, labels = pope_extrapolation.clips('test', frames, count=24)
    assert videos.shape == (24, 1, frames, 32, 32)
    assert labels.tolist() == pope_extrapolation.clips('test', 8, count=24)[1].tolist()
    # the whole digit stays in the frame, so its ink's centre moves by exactly one step a frame
    moves = centre_of_ink(videos).diff(dim=1)                                # (n, frames - 1, 2)
    expected = torch.tensor(STEPS, dtype=torch.float64)[labels][:, None].expand_as(moves)
    torch.testing.assert_close(moves, expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize('name', ['vit_nd_rotary', 'vit_nd_pope'])
def test_a_model_rebuilt_for_longer_clips_keeps_its_weights_and_continues_its_positions(name):
    torch.manual_seed(0)
    model = pope_extrapolation.build(name, 8, **TINY)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    longer = pope_extrapolation.extend(model, name, 16, **TINY)
    assert not longer.training and longer.grid_size == (8, 4, 4)
    for key, tensor in model.state_dict().items():
        assert torch.equal(longer.state_dict()[key], tensor), key
    # time is the outermost axis of the row-major grid: the first 4 slices are the trained grid, in its order
    assert torch.equal(longer.positions[:model.positions.shape[0]], model.positions)
    assert longer.positions[:, 0].tolist() == [t for t in range(8) for _ in range(16)]


@pytest.mark.parametrize('name', ['vit_nd_rotary', 'vit_nd_pope'])
def test_a_causal_model_rebuilt_for_longer_clips_gives_the_trained_models_tokens_on_the_first_frames(name):
    """No slice reads a later one and the first slices keep the trained grid's positions, so the first 8 frames'
    tokens of 16-frame clips are the trained 8-frame model's on those frames, whatever follows them."""
    torch.manual_seed(0)
    model = pope_extrapolation.build(name, 8, causal_dims=(0,), **TINY)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    model.eval()
    longer = pope_extrapolation.extend(model, name, 16, causal_dims=(0,), **TINY)
    videos = torch.rand(2, 1, 16, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first = longer(videos, return_embed=True)[:, :4]                      # (b, 4 slices, 4, 4, dim)
        torch.testing.assert_close(first, model(videos[:, :, :8], return_embed=True), rtol=1e-5, atol=1e-5)


def vit_pytorch_model(name):
    """Our `name` model holding the weights of vit-pytorch's fixture (built for 4 x 8 x 12: 2 slices of time) and its
    configuration, less input_shape."""
    config, state_dict, _, _ = reference_case(f'vit_pytorch_1.26.14_{name}', 'input_shape', 'patch_size',
                                              'causal_dims')
    module = name.removesuffix('_causal')
    model = pope_extrapolation.MODELS[module](**config)
    return load_vit_pytorch(model, state_dict).eval(), module, {k: v for k, v in config.items() if k != 'input_shape'}


@pytest.mark.parametrize('name', ['vit_nd_rotary', 'vit_nd_pope'])
def test_a_model_rebuilt_for_twice_the_frames_gives_vit_pytorchs_logits_on_them(name):
    """vit-pytorch reads the grid from the input: positions 0 .. slices - 1, its frequencies and offset unchanged."""
    _, _, tensors = load_fixture('vit_pytorch_1.26.14_vit_nd_longer')
    model, module, config = vit_pytorch_model(name)
    with pytest.raises(ValueError, match='input_shape'):
        model(tensors['input'])                                  # as built, ours takes its own input_shape only
    with torch.no_grad():
        logits = pope_extrapolation.extend(model, module, 8, **config)(tensors['input'])
    torch.testing.assert_close(logits, tensors[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('name', ['vit_nd_rotary_causal', 'vit_nd_pope_causal'])
def test_vit_pytorchs_causal_mask_on_twice_the_frames_wraps_time_round_the_built_length(name):
    """vit-pytorch's causal mask keeps the grid it was built for: on 4 slices of time instead of 2, slice t is
    taken as t mod 2, so slice 2 reads slices 0 and 2 only and is hidden from slice 1; ours, rebuilt for the
    longer grid, is causal over the 4 slices and so differs, and given that wrapped mask gives vit-pytorch's logits."""
    _, _, tensors = load_fixture('vit_pytorch_1.26.14_vit_nd_longer')
    model, module, config = vit_pytorch_model(name)
    longer = pope_extrapolation.extend(model, module, 8, **config)
    with torch.no_grad():
        assert not torch.allclose(longer(tensors['input']), tensors[name], atol=1e-3)
        time = torch.arange(4 * 2 * 3) // (2 * 3)                 # each token's slice: grid 4 x 2 x 3, row-major
        longer.causal_mask = (time[:, None] % 2) >= (time[None, :] % 2)
        torch.testing.assert_close(longer(tensors['input']), tensors[name], rtol=1e-4, atol=1e-5)


def test_the_summary_gives_each_models_mean_and_sd_and_the_differences_paired_by_seed():
    def result(*accuracies):
        return dict(accuracy={'8': accuracies[0], '16': accuracies[1]})

    results = {'vit_nd_rotary': [result(1.0, 0.5), result(0.9, 0.7)],
               'vit_nd_pope': [result(1.0, 0.75), result(0.8, 0.7)]}
    lines = pope_extrapolation.summary(results, [8, 16])
    # rotary: 8 frames 100, 90 -> 95 ± 7.07; 16 frames 50, 70 -> 60 ± 14.14 (sample sd: |a - b| / sqrt 2)
    assert lines[0] == 'vit_nd_rotary: 8 frames 95.00 ± 7.07%, 16 frames 60.00 ± 14.14%'
    assert lines[1] == 'vit_nd_pope: 8 frames 90.00 ± 14.14%, 16 frames 72.50 ± 3.54%'
    # PoPE minus RoPE seed by seed: 8 frames 0, -10; 16 frames +25, 0
    assert lines[2] == ('PoPE - RoPE, paired: 8 frames -5.00 ± 7.07 (+0.00, -10.00), '
                        '16 frames 12.50 ± 17.68 (+25.00, +0.00)')


@pytest.mark.slow
def test_main_prints_each_run_and_reuses_its_results(tmp_path, capsys):
    argv = ['--out', str(tmp_path), '--seeds', '0', '--epochs', '1', '--train', '64', '--test', '16',
            '--test-frames', '8', '16']
    pope_extrapolation.main(argv)
    first = capsys.readouterr().out.splitlines()
    for line, name in zip(first, ['vit_nd_rotary', 'vit_nd_pope']):
        assert re.fullmatch(rf'{name} seed 0: 8 frames [\d.]+%, 16 frames [\d.]+% \([\d.]+ s of training\)', line)
    assert first[-1].startswith('PoPE - RoPE, paired: 8 frames ')
    stamps = {path: path.stat().st_mtime_ns for path in tmp_path.iterdir()}
    pope_extrapolation.main(argv)
    assert capsys.readouterr().out.splitlines() == first
    assert stamps == {path: path.stat().st_mtime_ns for path in tmp_path.iterdir()}
