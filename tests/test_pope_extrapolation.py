"""examples/pope_extrapolation.py (issue 28): the clips of every length show the same digits moving the labelled
way, the trained model on longer clips computes the model rebuilt for them with its weights (a causal one gives its
tokens of the short clip on the first frames; vit-pytorch's logits on a longer input: tests/test_vit_nd_any_grid.py),
and the summary's means and paired differences."""

import re

import pytest
import torch

from helpers import load_example

pope_extrapolation = load_example('pope_extrapolation')

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


def trained(name, frames, **overrides):
    """The example's `name` model (TINY) for clips of `frames` frames, its weights moved off their initialisation."""
    torch.manual_seed(0)
    model = pope_extrapolation.build(name, frames, **TINY, **overrides)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


@pytest.mark.parametrize('name', ['vit_nd_rotary', 'vit_nd_pope'])
@pytest.mark.parametrize('causal_dims', [None, (0,)])
def test_the_trained_model_on_longer_clips_computes_the_model_rebuilt_for_them_with_its_weights(name, causal_dims):
    """The script tests the trained model on the longer clips as it is; rebuilding it for them and loading its
    weights (what the script did before the models took any grid) gives the same logits, bit for bit."""
    model = trained(name, 8, causal_dims=causal_dims)
    rebuilt = pope_extrapolation.build(name, 16, **TINY, causal_dims=causal_dims).eval()
    rebuilt.load_state_dict(model.state_dict())
    videos, _ = pope_extrapolation.clips('test', 16, count=4)
    with torch.no_grad():
        assert torch.equal(model(videos), rebuilt(videos))


@pytest.mark.parametrize('name', ['vit_nd_rotary', 'vit_nd_pope'])
def test_a_causal_model_on_longer_clips_gives_its_tokens_of_the_short_clip_on_the_first_frames(name):
    """No slice reads a later one and the first slices keep the trained grid's positions, so the first 8 frames'
    tokens of 16-frame clips are those of the 8-frame clips alone, whatever follows them."""
    model = trained(name, 8, causal_dims=(0,))
    videos = torch.rand(2, 1, 16, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first = model(videos, return_embed=True)[:, :4]                       # (b, 4 slices, 4, 4, dim)
        torch.testing.assert_close(first, model(videos[:, :, :8], return_embed=True), rtol=1e-5, atol=1e-5)


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
