"""Moving digits: clips of real digits, checked from their pixels (where the digit is, how it moves)."""

import pytest
import torch

from vit_pytorch.clips import DIRECTIONS, action_clips, moving_digits, split_digits


def centroids(videos):
    """(n, frames, 2) centre of mass (row, column) of every frame of (n, 1, frames, h, w) clips."""
    mass = videos[:, 0].float()
    rows, columns = torch.arange(mass.shape[-2]).float(), torch.arange(mass.shape[-1]).float()
    total = mass.sum(dim=(-1, -2))
    return torch.stack(((mass.sum(-1) * rows).sum(-1) / total, (mass.sum(-2) * columns).sum(-1) / total), dim=-1)


def test_clips_have_the_documented_shapes_and_types():
    clips = moving_digits('test', count=20, frames=6, size=24, digit_size=8, speed=3)
    assert clips.videos.shape == (20, 1, 6, 24, 24) and clips.videos.dtype == torch.uint8
    assert clips.labels.shape == (20,) and clips.classes == [str(d) for d in range(10)]
    floats = clips.floats(slice(0, 5))
    assert floats.shape == (5, 1, 6, 24, 24) and 0 <= floats.min() and floats.max() <= 1
    assert len(moving_digits('test')) == 450          # one clip per test digit by default


def test_every_frame_shows_the_whole_digit():
    clips = moving_digits('train', count=64)
    mass = clips.videos.float().sum(dim=(-1, -2))[:, 0]             # (n, frames)
    digits, _ = split_digits('train', 16)
    torch.testing.assert_close(mass, digits[:64].float().sum(dim=(-1, -2))[:, None].expand_as(mass))


def test_the_digit_moves_in_a_straight_line_in_the_labelled_direction():
    clips = moving_digits('train', count=200, task='direction', speed=2)
    assert clips.classes == [name for name, _ in DIRECTIONS]
    path = centroids(clips.videos)
    steps = torch.tensor([step for _, step in DIRECTIONS]).float()[clips.labels] * 2
    torch.testing.assert_close(path[:, 1:] - path[:, :-1], steps[:, None].expand(-1, 7, -1), atol=1e-3, rtol=0)
    assert set(clips.labels.tolist()) == set(range(8))


def test_a_clip_played_backwards_moves_the_opposite_way():
    clips = moving_digits('train', count=50, task='direction')
    forwards, backwards = centroids(clips.videos), centroids(clips.videos.flip(2))
    torch.testing.assert_close(backwards[:, -1] - backwards[:, 0], -(forwards[:, -1] - forwards[:, 0]))
    opposite = (clips.labels + 4) % 8                                # the direction list goes round clockwise
    steps = torch.tensor([step for _, step in DIRECTIONS]).float()
    torch.testing.assert_close(backwards[:, 1] - backwards[:, 0], steps[opposite] * 2, atol=1e-3, rtol=0)


def test_digit_labels_are_the_digits_shown():
    clips = moving_digits('test', count=450, task='digit')
    digits, labels = split_digits('test', 16)
    assert torch.equal(clips.labels, labels)
    first = clips.videos[:, 0, 0].float()
    assert torch.equal(first.sum(dim=(-1, -2)), digits.float().sum(dim=(-1, -2)))


def test_the_splits_are_the_trainers_digit_splits():
    from vit_pytorch.evaluate import load_digits

    for split, size in (('train', 1347), ('test', 450)):
        digits, labels = split_digits(split, 8)
        reference = load_digits(split, image_size=8)
        assert len(digits) == size and torch.equal(labels, reference.labels)
        # ours are rounded to uint8
        torch.testing.assert_close(digits.float() / 255, reference.floats()[:, 0], atol=1 / 255, rtol=0)


def test_same_arguments_same_clips_another_seed_other_paths():
    a, b = moving_digits('train', count=30, seed=3), moving_digits('train', count=30, seed=3)
    assert torch.equal(a.videos, b.videos)
    other = moving_digits('train', count=30, seed=4)
    assert not torch.equal(a.videos, other.videos) and torch.equal(a.labels, other.labels)
    test = moving_digits('test', count=30, seed=3, task='direction')
    assert not torch.equal(moving_digits('train', count=30, seed=3, task='direction').labels, test.labels)


def test_count_cycles_through_the_digits_of_the_split():
    clips = moving_digits('train', count=2 * 1347, frames=2, size=20, digit_size=8)
    assert torch.equal(clips.labels[:1347], clips.labels[1347:])
    assert not torch.equal(centroids(clips.videos[:50]), centroids(clips.videos[1347:1397]))


@pytest.mark.parametrize('kwargs, match', [
    (dict(split='val'), r'split must be one of'),
    (dict(task='speed'), r'task must be one of'),
    (dict(size=20), r'needs a frame of at least 30 pixels, got size=20'),
    (dict(frames=0), r'frames must be a positive int'),
    (dict(count=-1), r'count must be a non-negative int'),
])
def test_bad_arguments_are_refused_with_their_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        moving_digits(**{'split': 'train', **kwargs})


# the action task (for vit_pytorch.vat)


def test_action_clips_have_two_views_of_the_observed_frames_and_a_chunk_of_actions():
    task = action_clips('train', count=6, observed=4, horizon=3)
    assert task.views.shape == (6, 2, 1, 4, 32, 32) and task.views.dtype == torch.uint8
    assert task.actions.shape == (6, 3, 2)


def test_the_second_view_is_the_left_right_mirror_of_the_first():
    task = action_clips('train', count=6)
    assert torch.equal(task.views[:, 1], task.views[:, 0].flip(-1))


def test_the_actions_are_the_digits_measured_displacement_over_the_next_frames():
    # the same paths observed for longer show the future frames: measure the digit's motion in them
    task = action_clips('test', count=40, observed=4, horizon=3, speed=2)
    longer = action_clips('test', count=40, observed=7, horizon=1, speed=2)
    centres = centroids(longer.views[:, 0])                         # (n, 7, 2)
    measured = (centres[:, 4:] - centres[:, 3:6]) / 2
    torch.testing.assert_close(task.actions, measured, rtol=0, atol=1e-4)


def test_the_digit_bounces_so_some_next_steps_reverse_the_observed_motion():
    task = action_clips('train', count=200)
    centres = centroids(task.views[:, 0])
    observed = centres[:, -1] - centres[:, -2]
    reversed_axis = (task.actions * observed[:, None] < 0).any(dim=(1, 2))
    assert 0 < reversed_axis.sum() < 200


def test_every_action_clip_frame_shows_the_whole_digit():
    task = action_clips('train', count=50, observed=8)
    sums = task.views[:, 0].float().sum(dim=(-2, -1))               # (n, 1, frames)
    assert torch.equal(sums, sums[..., :1].expand_as(sums))


@pytest.mark.parametrize('size', [32, 40])
def test_each_frames_tone_has_the_pitch_of_the_digits_horizontal_position(size):
    # the digit's column measured from the pixels (its centre of mass less that of the digit image itself) and
    # the tone's frequency measured by an FFT of the frame's samples: f = (1 + 6 x / room) / 16 cycles per sample
    samples, room = 256, size - 16
    task = action_clips('test', count=60, size=size, audio_samples=samples)
    digits, _ = split_digits('test', 16)
    own = centroids(digits[:60, None, None])[:, 0, 1]                             # (n,) column within the digit
    column = centroids(task.views[:, 0])[..., 1] - own[:, None]                    # (n, frames)
    spectrum = torch.fft.rfft(task.audio.double().unflatten(1, (4, samples))).abs()
    frequency = spectrum.argmax(-1).double() / samples                             # (n, frames) cycles per sample
    torch.testing.assert_close(frequency, (1 + 6 * column.double() / room) / 16, atol=1e-5, rtol=0)
    # every column lands on a whole FFT bin here: a unit sine puts samples / 2 in it and nothing elsewhere
    torch.testing.assert_close(spectrum.amax(-1), torch.full_like(frequency, samples / 2))
    assert spectrum.sum(-1).sub(samples / 2).abs().max() < 1e-6 * samples
    assert set(column.round().long().flatten().tolist()) > {0, room}               # both walls are heard


def test_the_audio_is_absent_unless_asked_for_and_covers_the_observed_frames():
    assert action_clips('train', count=3).audio is None
    audio = action_clips('train', count=3, observed=5, audio_samples=100).audio
    assert audio.shape == (3, 500) and audio.dtype == torch.float32


@pytest.mark.parametrize('changes, words', [(dict(observed=1), 'observed must be at least 2'),
                                            (dict(speed=16), 'speed must be below'),
                                            (dict(horizon=0), 'horizon must be a positive int'),
                                            (dict(audio_samples=-1), 'audio_samples must be a non-negative int')])
def test_bad_action_task_arguments_are_refused_by_name(changes, words):
    with pytest.raises(ValueError, match=words):
        action_clips('train', count=2, **changes)
