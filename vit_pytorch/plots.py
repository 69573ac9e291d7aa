"""Pictures of the analyses in `vit_pytorch.analysis`, drawn as the ViT paper draws them, saved as PNG.

Needs matplotlib (`pip install matplotlib`), imported only when a picture is drawn. Figures are
rendered with the Agg canvas directly, so the pyplot backend and state of the caller (a
notebook, say) are left alone. Every function writes one PNG and returns its path.

    import torch
    from vit_pytorch import ViT, analysis, plots
    from vit_pytorch.recorder import Recorder

    model = ViT(image_size=32, patch_size=8, num_classes=10, dim=64, depth=3, heads=4, mlp_dim=128).eval()
    images = torch.rand(4, 3, 32, 32)
    recorder = Recorder(model)
    _, attns = recorder(images)
    layout = dict(grid=recorder.grid, num_prefix_tokens=recorder.num_prefix_tokens)
    rollout = analysis.to_patch_grid(analysis.attention_rollout(attns)[:, 0], **layout)
    plots.save_attention_overlay(images, rollout, 'rollout.png')
    plots.save_mean_attention_distance(analysis.mean_attention_distance(attns, patch_size=8, **layout),
                                       'distance.png')
"""

from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange

__all__ = ['save_attention_overlay', 'save_attention_heads', 'save_position_embedding_similarity',
           'save_mean_attention_distance', 'save_patch_embedding_components', 'save_training_curves']


def new_figure(width, height):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("vit_pytorch.plots needs matplotlib, not installed here: pip install matplotlib") from error
    figure = Figure(figsize=(width, height), layout='constrained')
    FigureCanvasAgg(figure)
    return figure


def save_figure(figure, path, dpi):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi, format='png')
    return path


def _as_image(image):
    """(c, H, W) in [0, 1] -> an array for imshow, and the colour map it needs."""
    if image.ndim != 3 or image.shape[0] not in (1, 3):
        raise ValueError(f"image must have shape (1 or 3, H, W), got {tuple(image.shape)}")
    image = image.detach().float().cpu().clamp(0, 1)
    if image.shape[0] == 1:
        return image[0].numpy(), 'gray'
    return rearrange(image, 'c h w -> h w c').numpy(), None


def _upsampled(weights, size):
    """(h, w) weights -> (H, W), scaled from their minimum (0) to their maximum (1) and bilinearly upsampled;
    equal weights everywhere are all 1 (attention spread evenly hides nothing), not all 0."""
    weights = weights.detach().float().cpu()
    spread = weights.max() - weights.min()
    weights = (weights - weights.min()) / spread if spread > 0 else torch.ones_like(weights)
    return F.interpolate(weights[None, None], size=size, mode='bilinear', align_corners=False)[0, 0].clamp(0, 1)


def _check_grid(grid):
    """A ValueError for attention maps on a grid of one patch, where every map is one flat value."""
    if grid[0] * grid[1] == 1:
        raise ValueError(f"maps must cover more than one patch, got a {grid[0]}x{grid[1]} grid: attention over "
                         f"a single patch has nothing to show")


def axis_off(axis):
    axis.set_xticks([])
    axis.set_yticks([])


def save_attention_overlay(images, maps, path, *, titles=None, cmap='inferno', alpha=0.6, dpi=100):
    """Attention on the input space (the paper's Figure 6), one column per image.

    images: (k, c, H, W) in [0, 1]; maps: (k, h, w) weights on the patch grid, e.g. the cls
    row of the attention rollout. Rows: the input, the map upsampled and laid over it, and
    the input multiplied by the map as in the paper. Each map is stretched to [0, 1] from its
    minimum to its maximum, since rollout maps are often nearly flat; the colour bar beside the
    attention row reads on that scale. Maps of a single patch have nothing to show and are refused.
    """
    if images.ndim != 4 or maps.ndim != 3 or images.shape[0] != maps.shape[0]:
        raise ValueError(f"images must be (k, c, H, W) and maps (k, h, w) with the same k, got "
                         f"{tuple(images.shape)} and {tuple(maps.shape)}")
    _check_grid(maps.shape[-2:])
    count = images.shape[0]
    if titles is not None and len(titles) != count:
        raise ValueError(f"titles must have one entry per image ({count}), got {len(titles)}")
    height, width = images.shape[-2:]
    panel_width, panel_height = 1.4 * width / max(height, width), 1.4 * height / max(height, width)
    figure = new_figure(panel_width * count + 0.4, panel_height * 3 + (0.4 if titles is not None else 0.2))
    axes = figure.subplots(3, count, squeeze=False)
    for column in range(count):
        image, image_cmap = _as_image(images[column])
        weights = _upsampled(maps[column], (height, width))
        masked = images[column].detach().float().cpu().clamp(0, 1) * weights
        masked, _ = _as_image(masked)
        axes[0, column].imshow(image, cmap=image_cmap, vmin=0, vmax=1)
        axes[1, column].imshow(image, cmap=image_cmap, vmin=0, vmax=1)
        shown = axes[1, column].imshow(weights.numpy(), cmap=cmap, alpha=alpha, vmin=0, vmax=1)
        axes[2, column].imshow(masked, cmap=image_cmap, vmin=0, vmax=1)
        if titles is not None:
            axes[0, column].set_title(titles[column], fontsize=8)
        for row in range(3):
            axis_off(axes[row, column])
    for row, label in enumerate(('input', 'attention', 'input x attention')):
        axes[row, 0].set_ylabel(label, fontsize=8)
    bar = figure.colorbar(shown, ax=axes[1, :], fraction=0.02, pad=0.01, ticks=[0, 1])
    bar.ax.set_yticklabels(['least', 'most'], fontsize=7)
    bar.solids.set_alpha(1)
    return save_figure(figure, path, dpi)


def save_attention_heads(image, maps, path, *, title=None, cmap='inferno', alpha=0.6, dpi=100):
    """One image and each head's attention map laid over it: image (c, H, W), maps (heads, h, w)."""
    if maps.ndim != 3:
        raise ValueError(f"maps must have shape (heads, h, w), got {tuple(maps.shape)}")
    _check_grid(maps.shape[-2:])
    height, width = image.shape[-2:]
    heads = maps.shape[0]
    aspect = width / height
    figure = new_figure(1.8 * aspect * (heads + 1) + 0.3, 1.8 + 0.5)
    axes = figure.subplots(1, heads + 1, squeeze=False)[0]
    picture, image_cmap = _as_image(image)
    axes[0].imshow(picture, cmap=image_cmap, vmin=0, vmax=1)
    axes[0].set_title('input', fontsize=8)
    for head in range(heads):
        axes[head + 1].imshow(picture, cmap=image_cmap, vmin=0, vmax=1)
        axes[head + 1].imshow(_upsampled(maps[head], (height, width)).numpy(), cmap=cmap, alpha=alpha,
                              vmin=0, vmax=1)
        axes[head + 1].set_title(f'head {head + 1}', fontsize=8)
    for axis in axes:
        axis_off(axis)
    if title is not None:
        figure.suptitle(title, fontsize=9)
    return save_figure(figure, path, dpi)


def _spread(count, most):
    """Up to `most` indices spread evenly over range(count), the first and the last included."""
    if count <= most:
        return list(range(count))
    return sorted({round(position * (count - 1) / (most - 1)) for position in range(most)})


def save_position_embedding_similarity(similarity, path, *, max_tiles=8, dpi=100):
    """Figure 7 (centre): tile (i, j) shows the cosine similarity of patch (i, j)'s position
    embedding to those of all patches; similarity is (h, w, h, w). The colours span the
    values' own range (the sin-cos table of SimpleViT, for one, never goes below about 0.8).

    A grid wider than `max_tiles` shows the tiles of `max_tiles` rows and columns spread evenly
    over it (labelled with their own numbers), each tile with the whole grid at 4 pixels or
    more per patch, so that a 16x16 grid stays readable."""
    if similarity.ndim != 4:
        raise ValueError(f"similarity must have shape (h, w, h, w), got {tuple(similarity.shape)}")
    _check_grid(similarity.shape[:2])
    height, width = similarity.shape[:2]
    rows, columns = _spread(height, max_tiles), _spread(width, max_tiles)
    tile = max(0.55, 0.045 * max(height, width) * 100 / dpi)      # inches: 4.5 pixels per patch at least
    figure = new_figure(tile * len(columns) + 1.4, tile * len(rows) + 0.9)
    axes = figure.subplots(len(rows), len(columns), squeeze=False, gridspec_kw=dict(wspace=0.02, hspace=0.02))
    figure.get_layout_engine().set(w_pad=0.005, h_pad=0.005, wspace=0.01, hspace=0.01)
    values = similarity.detach().float().cpu()
    for place, row in enumerate(rows):
        for spot, column in enumerate(columns):
            shown = axes[place, spot].imshow(values[row, column].numpy(), cmap='viridis',
                                             vmin=values.min().item(), vmax=values.max().item())
            axis_off(axes[place, spot])
            for spine in axes[place, spot].spines.values():
                spine.set_visible(False)
        axes[place, 0].set_ylabel(str(row + 1), fontsize=7, rotation=0, labelpad=8, va='center')
    for spot, column in enumerate(columns):
        axes[-1, spot].set_xlabel(str(column + 1), fontsize=7)
    figure.supxlabel('Input patch column', fontsize=9)
    figure.supylabel('Input patch row', fontsize=9)
    shown_part = '' if (len(rows), len(columns)) == (height, width) else \
        f' ({len(rows)} of {height} rows, {len(columns)} of {width} columns)'
    figure.suptitle(f'Position embedding similarity{shown_part}', fontsize=10)
    figure.colorbar(shown, ax=axes, shrink=0.8, label='Cosine similarity')
    return save_figure(figure, path, dpi)


def save_mean_attention_distance(distance, path, *, unit='pixels', uniform=None, title='Mean attention distance',
                                 dpi=100):
    """Figure 7 (right): mean attention distance of every head against the layer it sits in.

    distance: (layers, heads), or (b, layers, heads) averaged over the batch here. `uniform`,
    the distance of attention spread evenly over the grid, is drawn as a dashed line when given.
    """
    if distance.ndim == 3:
        distance = distance.mean(dim=0)
    if distance.ndim != 2:
        raise ValueError(f"distance must have shape (layers, heads) or (b, layers, heads), got {tuple(distance.shape)}")
    values = distance.detach().float().cpu()
    layers, heads = values.shape
    figure = new_figure(4.0, 3.2)
    axis = figure.add_subplot()
    depth = torch.arange(1, layers + 1).float()
    for head in range(heads):
        axis.scatter(depth.numpy(), values[:, head].numpy(), s=18, label=f'Head {head + 1}')
    axis.set_xlabel('Network depth (layer)')
    axis.set_ylabel(f'Mean attention distance ({unit})')
    if title:
        axis.set_title(title, fontsize=9)
    if uniform is not None:
        axis.axhline(float(uniform), color='grey', linestyle='--', linewidth=1, label='uniform attention')
    axis.set_xticks(depth.numpy())
    top = max(values.max().item(), float(uniform or 0))
    axis.set_ylim(0, 1.1 * top if top > 0 else 1)
    axis.grid(alpha=0.3)
    if heads <= 16:
        axis.legend(fontsize=8, ncols=2 if heads > 8 else 1, loc='lower left')
    return save_figure(figure, path, dpi)


def save_patch_embedding_components(components, path, *, explained=None, columns=7, dpi=100):
    """Figure 7 (left): principal components of the patch-embedding filters, each scaled to [0, 1].

    components: (k, c, patch_h, patch_w) with c = 1 (grey) or 3 (RGB); `explained`, the
    fraction of variance of each, is printed under it when given.
    """
    if components.ndim != 4:
        raise ValueError(f"components must have shape (k, c, patch_h, patch_w), got {tuple(components.shape)}")
    count = components.shape[0]
    columns = min(columns, count)
    rows = -(-count // columns)
    figure = new_figure(0.9 * columns + 0.2, 0.95 * rows + 0.45)
    axes = figure.subplots(rows, columns, squeeze=False)
    values = components.detach().float().cpu()
    for index, axis in enumerate(axes.flat):
        axis_off(axis)
        if index >= count:
            axis.set_axis_off()
            continue
        component = values[index]
        component = (component - component.min()) / (component.max() - component.min()).clamp_min(1e-12)
        picture, cmap = _as_image(component)
        axis.imshow(picture, cmap=cmap, vmin=0, vmax=1, interpolation='nearest')
        if explained is not None:
            axis.set_xlabel(f'{100 * float(explained[index]):.1f}%', fontsize=6)
    kind = 'RGB embedding filters' if values.shape[1] == 3 else 'Embedding filters'
    figure.suptitle(f'{kind} (first {count} principal components)', fontsize=9)
    return save_figure(figure, path, dpi)


def save_training_curves(history, path, *, split='test', train_loss_floor=None, note=None, dpi=100):
    """Loss and accuracy per epoch, training and `split` ('test', or 'val' for a folder), as one PNG.

    history: one dict per epoch with 'epoch', 'train_loss', 'train_accuracy', 'test_loss' and
    'test_accuracy' (those of the held-out split named `split`). `train_loss_floor`, the least loss the training
    targets allow (label smoothing keeps it above 0), is drawn as a dotted line; `note`, a line
    under the plots saying how the two losses differ, when given.
    """
    if not history:
        raise ValueError("history must hold at least one epoch's record, got none")
    epochs = [record['epoch'] for record in history]
    figure = new_figure(9, 3.5 if note is None else 3.9)
    loss_axis, accuracy_axis = figure.subplots(1, 2)
    for name, label in (('train', 'train'), ('test', split)):
        loss_axis.plot(epochs, [record[f'{name}_loss'] for record in history], label=label)
        accuracy_axis.plot(epochs, [record[f'{name}_accuracy'] for record in history], label=label)
    if train_loss_floor:
        loss_axis.axhline(train_loss_floor, color='grey', linestyle=':', linewidth=1,
                          label=f'least train loss ({train_loss_floor:.2f})')
    loss_axis.set(xlabel='epoch', ylabel='loss', title='Loss')
    accuracy_axis.set(xlabel='epoch', ylabel='accuracy', title='Accuracy', ylim=(0, 1))
    # the final epoch's accuracy (the model that is saved), not the best epoch picked on the held-out images
    final = history[-1]
    accuracy_axis.annotate(f"final {split} {100 * final['test_accuracy']:.2f}%",
                           (final['epoch'], final['test_accuracy']), textcoords='offset points', xytext=(0, -14),
                           ha='right', fontsize=8)
    for axis in (loss_axis, accuracy_axis):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
        axis.xaxis.get_major_locator().set_params(integer=True)
    if note is not None:
        figure.supxlabel(note, fontsize=7, color='dimgrey')
    return save_figure(figure, path, dpi)
