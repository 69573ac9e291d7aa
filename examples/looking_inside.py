"""Looking inside a ViT: draw the ViT paper's pictures for small models trained on CPU.

1. A ViT on scikit-learn's handwritten digits: the model in a checkpoint written by the
   training command (--checkpoint), or, without one, a 6-layer ViT trained here for 20
   epochs (digits upsampled to 32x32, 4x4 patches: an 8x8 grid plus a cls token).
   Pictures: attention rollout over test digits (Figure 6 of the paper), the last layer's
   cls attention per head, position-embedding similarity, mean attention distance and the
   principal components of the embedding filters (Figure 7).
2. A ViT trained for 300 steps to tell random 48x48 crops of the two photographs that ship
   with scikit-learn (`china.jpg`, `flower.jpg`) apart, then run on each whole photograph
   (a rectangular 13x20 patch grid, position embeddings resampled): rollout, per-head cls
   attention, mean attention distance and RGB embedding filters.
3. The fixed sin-cos position table of SimpleViT, for comparison with a learned one.

    python -m vit_pytorch.train --image-size 32 --out runs/digits-32        # 98.67% test accuracy
    python examples/looking_inside.py --checkpoint runs/digits-32/checkpoint
    python examples/looking_inside.py            # trains its own digits model instead

Nothing is downloaded: both data sets ship inside scikit-learn. Each model's training shows a
progress bar (tqdm, when installed). Measured on a shared 2-core machine (load average 5.7 at the
start, 4.4 at the end) with one torch thread: this script without --checkpoint 125 s (93 s of CPU),
84 s of it the digits model's 20 epochs and 34 s the photograph model's 300 steps; the training
command above, 283 s of CPU (measured before).
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vit_pytorch import SimpleViT, ViT, analysis, plots
from vit_pytorch.recorder import Recorder

DIGITS_SIZE = 32


def digits(size=DIGITS_SIZE):
    """scikit-learn's 1797 8x8 digits, bilinearly upsampled to size x size in [0, 1]; 1500 train, 297 test."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32)[:, None] / 16.0
    images = F.interpolate(images, size=(size, size), mode='bilinear', align_corners=False).clamp(0, 1)
    labels = torch.tensor(data.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    images, labels = images[order], labels[order]
    return (images[:1500], labels[:1500]), (images[1500:], labels[1500:])


def photographs(downsample=4):
    """china.jpg and flower.jpg from scikit-learn, (2, 3, 104, 160) in [0, 1] after 4x area downsampling."""
    from sklearn.datasets import load_sample_image

    photos = torch.stack([torch.tensor(load_sample_image(name)) for name in ('china.jpg', 'flower.jpg')])
    photos = photos.permute(0, 3, 1, 2).float() / 255.0                  # (2, 3, 427, 640)
    photos = F.interpolate(photos, scale_factor=1 / downsample, mode='area')  # (2, 3, 106, 160)
    return photos[..., :104, :]


def random_crops(photos, count, size, generator):
    """`count` random size x size crops (random photo, position and horizontal flip) and the photo index."""
    labels = torch.randint(0, photos.shape[0], (count,), generator=generator)
    tops = torch.randint(0, photos.shape[2] - size + 1, (count,), generator=generator)
    lefts = torch.randint(0, photos.shape[3] - size + 1, (count,), generator=generator)
    flips = torch.rand(count, generator=generator) < 0.5
    crops = torch.stack([photos[label, :, top:top + size, left:left + size]
                         for label, top, left in zip(labels.tolist(), tops.tolist(), lefts.tolist())])
    crops[flips] = crops[flips].flip(-1)
    return crops, labels


def progress(steps, description):
    """range(steps) under a tqdm bar on stderr, or, without tqdm, with a line at its start and end."""
    try:
        from tqdm import tqdm
    except ImportError:                                              # tqdm is optional, as for the trainer
        print(f'{description}: {steps} steps', file=sys.stderr, flush=True)
        yield from range(steps)
        print(f'{description}: done', file=sys.stderr, flush=True)
        return
    yield from tqdm(range(steps), desc=description, dynamic_ncols=True, mininterval=0.5)


def train(model, batches, steps, lr, *, description='training'):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    for step in progress(steps, description):
        images, labels = batches(step)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval()


def digits_model():
    return ViT(image_size=DIGITS_SIZE, patch_size=4, num_classes=10, channels=1, dim=64, depth=6, heads=4,
               dim_head=16, mlp_dim=128)


def uniform_distance(model, *, grid, num_prefix_tokens):
    """Mean attention distance of attention spread evenly over all tokens: the "global" reference."""
    n = num_prefix_tokens + grid[0] * grid[1]
    uniform = torch.full((1, 1, 1, n, n), 1.0 / n)
    return analysis.mean_attention_distance(uniform, grid=grid, num_prefix_tokens=num_prefix_tokens,
                                            patch_size=model.patch_size).item()


def load_checkpoint(path):
    """(model, test digits, preparation) from a checkpoint of `python -m vit_pytorch.train` on the digits."""
    from vit_pytorch.checkpoint import load_model
    from vit_pytorch.evaluate import load_split, normalise

    model, config = load_model(path)
    data = config['data']
    if data['source'] != 'digits':
        raise SystemExit(f"{path} was trained on {data['source']}, not on the digits")
    test = load_split('digits', data['test_split'], image_size=data['image_size'], channels=data['channels'])
    return model, (test.floats(), test.labels), lambda images: normalise(images, data['mean'], data['std'])


def draw_digits(model, test, out, prepare=lambda images: images):
    images, labels = test
    with torch.no_grad():
        recorder = Recorder(model)
        logits, attns = recorder(prepare(images))
    accuracy = (logits.argmax(-1) == labels).float().mean().item()
    layout = dict(grid=recorder.grid, num_prefix_tokens=recorder.num_prefix_tokens)
    shown = slice(0, 8)
    rollout = analysis.attention_rollout(attns)
    if layout['num_prefix_tokens']:        # the cls token's row; a mean-pooled model: the mean over all rows
        rollout, heads = rollout[:, 0], analysis.cls_attention(attns, **layout)[0]
        heads_title = 'last layer, cls token to patches'
    else:
        rollout, heads = rollout.mean(dim=1), analysis.to_patch_grid(attns[0, -1].mean(dim=1), **layout)
        heads_title = 'last layer, mean attention each patch receives'
    rollout = analysis.to_patch_grid(rollout, **layout)
    titles = [f'label {label}, pred {prediction}' for label, prediction in
              zip(labels[shown].tolist(), logits.argmax(-1)[shown].tolist())]
    components, explained = analysis.patch_embedding_components(analysis.patch_filters(model), num_components=14)
    return accuracy, [
        plots.save_attention_overlay(images[shown], rollout[shown], out / 'digits_attention_rollout.png',
                                     titles=titles),
        plots.save_attention_heads(images[0], heads, out / 'digits_last_layer_attention.png',
                                   title=f'{heads_title} (digit {labels[0].item()})'),
        plots.save_position_embedding_similarity(
            analysis.position_embedding_similarity(model.pos_embedding, **layout),
            out / 'digits_position_embedding_similarity.png'),
        plots.save_mean_attention_distance(
            analysis.mean_attention_distance(attns, patch_size=model.patch_size, **layout),
            out / 'digits_mean_attention_distance.png', uniform=uniform_distance(model, **layout)),
        plots.save_patch_embedding_components(components, out / 'digits_embedding_filters.png',
                                              explained=explained),
    ]


def draw_photographs(model, photos, out):
    with torch.no_grad():
        recorder = Recorder(model)
        logits, attns = recorder(photos)
    layout = dict(grid=recorder.grid, num_prefix_tokens=recorder.num_prefix_tokens)
    probabilities = logits.softmax(-1)
    rollout = analysis.to_patch_grid(analysis.attention_rollout(attns)[:, 0], **layout)
    names = ('china', 'flower')
    titles = [f'{name}.jpg (p = {probabilities[index, index]:.2f})' for index, name in enumerate(names)]
    components, explained = analysis.patch_embedding_components(analysis.patch_filters(model))
    return recorder.grid, [
        plots.save_attention_overlay(photos, rollout, out / 'photo_attention_rollout.png', titles=titles),
        plots.save_attention_heads(photos[0], analysis.cls_attention(attns, **layout)[0],
                                   out / 'photo_last_layer_cls_attention.png',
                                   title='china.jpg: last layer, cls token to patches', dpi=70),
        plots.save_mean_attention_distance(
            analysis.mean_attention_distance(attns, patch_size=model.patch_size, **layout),
            out / 'photo_mean_attention_distance.png', uniform=uniform_distance(model, **layout)),
        plots.save_patch_embedding_components(components, out / 'photo_embedding_filters.png',
                                              explained=explained),
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--checkpoint', type=Path, help='digits model written by python -m vit_pytorch.train')
    parser.add_argument('--out', type=Path, default=Path('docs/images'))
    parser.add_argument('--digits-epochs', type=int, default=20)
    parser.add_argument('--photo-steps', type=int, default=300)
    # models this small lose more to the synchronisation of intra-op threads than they gain, by far on a busy
    # machine (measured on a shared 2-core one: 4.2 s a digits step with torch's default 2 threads, 0.22 s with 1)
    parser.add_argument('--threads', type=int, default=1, help='torch threads (default: 1)')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    start = time.perf_counter()

    if args.checkpoint is not None:
        model, test_set, prepare = load_checkpoint(args.checkpoint)
    else:
        (images, labels), test_set = digits()
        prepare = lambda images: images
        model = digits_model()
        per_epoch = len(labels) // 64
        order = torch.cat([torch.randperm(len(labels)) for _ in range(args.digits_epochs)])
        batches = order[:args.digits_epochs * per_epoch * 64].view(-1, 64)
        train(model, lambda step: (images[batches[step]], labels[batches[step]]), len(batches), lr=2e-3,
              description=f'digits model, {args.digits_epochs} epochs')
    print('drawing the digits pictures', file=sys.stderr, flush=True)
    accuracy, paths = draw_digits(model, test_set, args.out, prepare)
    print(f'digits: test accuracy {accuracy:.3f} on {len(test_set[1])} images ({time.perf_counter() - start:.0f} s)')

    photos = photographs()
    photo_model = ViT(image_size=48, patch_size=8, num_classes=2, dim=64, depth=4, heads=4, dim_head=16,
                      mlp_dim=128, dynamic_image_size=True)
    generator = torch.Generator().manual_seed(0)
    train(photo_model, lambda step: random_crops(photos, 64, 48, generator), args.photo_steps, lr=1e-3,
          description='photograph model')
    crops, crop_labels = random_crops(photos, 512, 48, generator)
    with torch.no_grad():
        crop_accuracy = (photo_model(crops).argmax(-1) == crop_labels).float().mean().item()
    print('drawing the photograph pictures', file=sys.stderr, flush=True)
    grid, photo_paths = draw_photographs(photo_model, photos, args.out)
    print(f'photographs: accuracy {crop_accuracy:.3f} on 512 fresh crops; whole photographs on a {grid} grid '
          f'({time.perf_counter() - start:.0f} s)')

    sincos = SimpleViT(image_size=DIGITS_SIZE, patch_size=4, num_classes=10, dim=64, depth=1, heads=1, mlp_dim=64)
    paths += photo_paths + [plots.save_position_embedding_similarity(
        analysis.position_embedding_similarity(sincos.pos_embedding, grid=sincos.grid_size),
        args.out / 'simple_vit_sincos_similarity.png')]
    for path in paths:
        print(f'wrote {path} ({path.stat().st_size // 1024} KB)')


if __name__ == '__main__':
    main()
