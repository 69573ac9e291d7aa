import pytest
import torch

from helpers import digits_batch, tiny_vit_kwargs
from vit_pytorch import ViT, analysis
from vit_pytorch.recorder import Recorder
from vit_pytorch.simple_vit import posemb_sincos_2d

plots = pytest.importorskip('vit_pytorch.plots')
pytest.importorskip('matplotlib')

PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000, f'{path} is not a drawn PNG'


@pytest.fixture(scope='module')
def recorded():
    torch.manual_seed(0)
    images, labels = digits_batch(3, size=16)
    model = ViT(**tiny_vit_kwargs(image_size=16, patch_size=4, channels=1, depth=3)).eval()
    recorder = Recorder(model)
    with torch.no_grad():
        _, attns = recorder(images)
    return model, images, attns, dict(grid=recorder.grid, num_prefix_tokens=recorder.num_prefix_tokens)


def test_attention_overlay_is_written(recorded, tmp_path):
    _, images, attns, layout = recorded
    rollout = analysis.to_patch_grid(analysis.attention_rollout(attns)[:, 0], **layout)
    assert_png(plots.save_attention_overlay(images, rollout, tmp_path / 'overlay.png', titles=['a', 'b', 'c']))


def test_attention_overlay_on_a_rectangular_rgb_image(tmp_path):
    images, maps = torch.rand(2, 3, 20, 36), torch.rand(2, 5, 9)
    assert_png(plots.save_attention_overlay(images, maps, tmp_path / 'rgb.png'))


def test_attention_heads_are_written(recorded, tmp_path):
    _, images, attns, layout = recorded
    maps = analysis.cls_attention(attns, **layout)[0]
    assert_png(plots.save_attention_heads(images[0], maps, tmp_path / 'heads.png', title='heads'))


def test_position_embedding_similarity_is_written(tmp_path):
    similarity = analysis.position_embedding_similarity(posemb_sincos_2d(4, 6, 32), grid=(4, 6))
    assert_png(plots.save_position_embedding_similarity(similarity, tmp_path / 'nested' / 'similarity.png'))


def test_position_similarity_of_a_large_grid_shows_spread_tiles_big_enough_to_read(tmp_path, monkeypatch):
    figures = []
    real_save = plots.save_figure
    monkeypatch.setattr(plots, 'save_figure', lambda figure, path, dpi: figures.append(figure) or real_save(figure, path, dpi))
    similarity = analysis.position_embedding_similarity(posemb_sincos_2d(12, 12, 32), grid=(12, 12))
    assert_png(plots.save_position_embedding_similarity(similarity, tmp_path / 'similarity.png', max_tiles=4))
    figure = figures[0]
    tiles = [axis for axis in figure.axes if axis.get_images() and axis.get_label() != '<colorbar>']
    assert len(tiles) == 16                                          # 4 of the 12 rows and columns
    rows = [axis.get_ylabel() for axis in tiles if axis.get_ylabel()]
    assert rows == ['1', '5', '8', '12']                             # spread evenly, the first and the last
    assert '4 of 12 rows' in figure.get_suptitle()
    figure.canvas.draw()
    widths = [axis.get_window_extent().width for axis in tiles]
    assert min(widths) >= 3 * 12, min(widths)                        # 3 pixels or more for each of 12 patches


def test_mean_attention_distance_is_written(recorded, tmp_path):
    model, _, attns, layout = recorded
    distance = analysis.mean_attention_distance(attns, patch_size=model.patch_size, **layout)
    assert_png(plots.save_mean_attention_distance(distance, tmp_path / 'distance.png'))


@pytest.mark.parametrize('channels', [1, 3])
def test_embedding_filter_components_are_written(tmp_path, channels):
    components, explained = analysis.patch_embedding_components(torch.randn(32, channels, 4, 4), num_components=9)
    assert_png(plots.save_patch_embedding_components(components, tmp_path / 'filters.png', explained=explained))


def test_shape_mismatch_is_refused_before_drawing(tmp_path):
    with pytest.raises(ValueError, match='same k'):
        plots.save_attention_overlay(torch.rand(2, 1, 8, 8), torch.rand(3, 2, 2), tmp_path / 'x.png')
    assert not (tmp_path / 'x.png').exists()


def test_drawing_leaves_the_pyplot_backend_alone(tmp_path):
    matplotlib = pytest.importorskip('matplotlib')
    backend = matplotlib.get_backend()
    plots.save_mean_attention_distance(torch.rand(3, 2), tmp_path / 'distance.png')
    assert matplotlib.get_backend() == backend
