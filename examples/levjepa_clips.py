"""LeVJEPA on the moving digits: do its pre-trained clip features beat a random encoder's under a few-label probe?

    python examples/levjepa_clips.py --seeds 0 1 2 --epochs 4        # the table of docs/pretraining.md
    python examples/levjepa_clips.py --nd --seeds 0 1 2 --epochs 4   # the same with LeVJEPAND (levjepa_nd)
    python examples/levjepa_clips.py --no-flip --seeds 0 1 2 --epochs 4   # the local views unflipped (the docs)
    python examples/levjepa_clips.py --seeds 0 --epochs 1          # one short epoch, to time it

LeVJEPA (`vit_pytorch.levjepa`, arXiv 2608.27395) claims that its objective (LeJEPA's prediction loss between a
clip's global view and its local views, SIGReg, 95 % of the patch tokens dropped) pre-trains useful video
representations. Here a small `VideoTransformer` (clips of 8 frames at 32 pixels, patches of 4 pixels, one frame a
token: 512 patch tokens and a cls token; width 64, 4 layers, 4 heads of 16, MLP 128) is pre-trained on the
moving-digits clips of the training digits (`vit_pytorch.clips.moving_digits`, grayscale repeated to 3 channels so
that the paper's photometric augmentation applies; `--repeats` clips per training digit, each on its own random
path), without their labels. The recipe is the paper's code's on a small scale: one global view (a crop of 0.8 to
1 of the frame, resized to 32), `--local-views` local ones (crops of 0.02 to 0.4, resized to 16, colour jitter,
grayscale and a horizontal flip per clip, which `--no-flip` leaves out), `--drop-ratio` of the patch tokens
dropped, SIGReg weight 0.02 with 17 knots and 256 directions, a BatchNorm projector 256 wide to 64; AdamW at `--lr`
with cosine decay.

The probes read the frozen encoder's cls token (`LeVJEPA(..., return_embedding=True)`, every token kept, eval
mode) of each clip. Two labels come with every clip: the digit (10 classes; any frame tells) and the direction of
motion (8 classes; only the order of the frames tells). A seed draws the encoder's initialisation, the pre-training
and the labelled subset: `--labels` clips of each class from the training clips (one clip per training digit, each
on a path of its own), and each probe is scored on the 450 test clips (digits never seen in training). Probes:
5-NN (cosine similarity, majority vote) and a linear probe (multinomial logistic regression on the standardised
features, scikit-learn's L-BFGS). The baseline is the same encoder at its random initialisation (the same seed,
untrained), so the difference is paired per seed. `--supervised-epochs N` adds the same encoder trained from that
initialisation with a linear head on the labelled clips alone (cross-entropy, every token kept, N epochs).

`--nd` pre-trains the same encoder as `vit_pytorch.levjepa_nd`'s `NDTransformer` over (frames, rows, columns),
causal along the frames (the same layers, initialised from the same draws as the `VideoTransformer`: the same
function on the same weights), with `LeVJEPAND`: its source view is LeVJEPA's global view and its
`--local-views` target views LeVJEPA's local views, made by `levjepa`'s own crop and augmentations (`levjepa.ClipView`),
but at 32 pixels: the `NDTransformer` takes inputs of one shape, so the local crops are resized to 32, not 16
(`--local-size 32` gives LeVJEPA the same). LeVJEPAND encodes all the views of a batch as one batch where LeVJEPA
encodes the global and the local views apart; the probes, the seeds and the random-init baseline are the same.

Prints, per seed, the pre-training loss per epoch and every probe's test accuracy, then the table (mean +- sample
std over the seeds) and the paired differences pre-trained - random. Needs scikit-learn.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vit_pytorch import levjepa
from vit_pytorch.clips import moving_digits
from vit_pytorch.levjepa import LeVJEPA, VideoTransformer
from vit_pytorch.levjepa_nd import LeVJEPAND, NDTransformer

sys.path.insert(0, str(Path(__file__).parent))
from label_efficiency import knn_accuracy  # noqa: E402

TASKS = ('digit', 'direction')
ENCODER = dict(image_size=32, patch_size=4, frames=8, channels=3, dim=64, depth=4, heads=4, dim_head=16, mlp_dim=128)
# LeVJEPA's views (its defaults), for LeVJEPA and for LeVJEPAND's levjepa.ClipViews alike
VIEWS = dict(global_crop_scale=(0.8, 1.0), local_crop_scale=(0.02, 0.4), crop_ratio_range=(0.75, 1.3333))
# the learners' shared settings: a BatchNorm projector 256 wide to 64, SIGReg with 256 directions and 17 knots
LEARNER = dict(num_classes_K=64, projection_hidden=256, sigreg_loss_kwargs=dict(num_proj=256, knots=17))


def clips(split, count=None):
    """(videos (n, 3, 8, 32, 32) in [0, 1], {task: labels (n,)}) of the moving digits of `split`: one call per task
    (the same arguments give the same clips, only the labels differ), grayscale repeated to 3 channels."""
    by_task = {task: moving_digits(split, count=count, task=task) for task in TASKS}
    videos = by_task['digit'].floats()
    if not torch.equal(by_task['direction'].videos, by_task['digit'].videos):
        raise RuntimeError("moving_digits gave other clips for the direction task")
    return videos.expand(-1, 3, -1, -1, -1), {task: clips.labels for task, clips in by_task.items()}


def make_encoder(nd=False):
    """The example's encoder: a `VideoTransformer`, or with `nd` the same as a 3-D `NDTransformer` (patches of one
    frame by 4 x 4 pixels, causal along the frames), which builds the same parameters in the same order."""
    if not nd:
        return VideoTransformer(**ENCODER)
    sizes = {key: ENCODER[key] for key in ('channels', 'dim', 'depth', 'heads', 'dim_head', 'mlp_dim')}
    return NDTransformer(ndim=3, input_shape=(ENCODER['frames'], ENCODER['image_size'], ENCODER['image_size']),
                         patch_size=(1, ENCODER['patch_size'], ENCODER['patch_size']), causal_dims=(0,), **sizes)


def make_learner(seed, *, local_views, drop_ratio, nd=False, local_size=None, flip=True):
    """LeVJEPA (local views of `local_size`, 16 by default) or with `nd` LeVJEPAND with LeVJEPA's views at 32
    pixels, on `make_encoder(nd)` initialised by `seed`; `flip=False` leaves the local views unflipped (the crops
    draw the same random numbers either way, so only the flips differ)."""
    torch.manual_seed(seed)
    encoder = make_encoder(nd)
    size = ENCODER['image_size']
    if not nd:
        return LeVJEPA(encoder, image_size=size, local_size=local_size or 16, num_local_views=local_views,
                       drop_ratio=drop_ratio, local_augment_fn=levjepa.PhotometricAugment(hflip=flip), **VIEWS,
                       **LEARNER)
    if local_size not in (None, size):
        raise ValueError(f"local_size must be {size} (or None) with nd: the NDTransformer takes clips of one shape, "
                         f"got {local_size}")
    source = levjepa.ClipView(size, VIEWS['global_crop_scale'], levjepa.NormalizeVideo(), VIEWS['crop_ratio_range'])
    target = levjepa.ClipView(size, VIEWS['local_crop_scale'], levjepa.PhotometricAugment(hflip=flip),
                              VIEWS['crop_ratio_range'])
    return LeVJEPAND(encoder, input_shape=encoder.input_shape, augment_src=source, augment_tgt=target,
                     num_target_aug_views=local_views, drop_ratio=drop_ratio, **LEARNER)


def pretrain(learner, videos, *, epochs, batch_size, lr, seed, log=print):
    """AdamW (weight decay 0.05) with cosine decay over `epochs` of `videos`; the mean loss, invariance and SIGReg
    terms of each epoch."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(learner.parameters(), lr=lr, weight_decay=0.05)
    steps = epochs * (len(videos) // batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, steps))
    history = []
    learner.train()
    for epoch in range(epochs):
        started, totals = time.process_time(), torch.zeros(3)
        order = torch.randperm(len(videos), generator=generator)
        batches = order[:len(order) // batch_size * batch_size].view(-1, batch_size)
        for index in batches:
            loss, (invariance, sigreg) = learner(videos[index], return_loss_breakdown=True)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            totals += torch.tensor([loss.item(), invariance.item(), sigreg.item()])
        history.append((totals / len(batches)).tolist())
        log(f"  epoch {epoch + 1}: loss {history[-1][0]:.4f} (invariance {history[-1][1]:.4f}, SIGReg "
            f"{history[-1][2]:.4f}), {time.process_time() - started:.0f} CPU-s")
    return history


@torch.no_grad()
def features(encoder, videos, batch_size=64):
    """The cls token (n, dim) of each clip, every token kept, in eval mode (the encoder left as it was)."""
    was_training = encoder.training
    encoder.eval()
    out = torch.cat([encoder(videos[i:i + batch_size])[:, 0] for i in range(0, len(videos), batch_size)])
    encoder.train(was_training)
    return out


def labelled_subset(labels, per_class, seed):
    """Indices of `per_class` random clips of each class (drawn by `seed`), class by class."""
    generator = torch.Generator().manual_seed(seed)
    return torch.cat([(labels == c).nonzero()[:, 0][torch.randperm(int((labels == c).sum()), generator=generator)
                                                    [:per_class]] for c in labels.unique()])


def linear_probe_accuracy(train_features, train_labels, test_features, test_labels):
    """Multinomial logistic regression (L2, C=1) on features standardised by the labelled clips' statistics."""
    from sklearn.linear_model import LogisticRegression

    mean, std = train_features.mean(0), train_features.std(0).clamp_min(1e-6)
    probe = LogisticRegression(max_iter=2000).fit(((train_features - mean) / std).numpy(), train_labels.numpy())
    return float((probe.predict(((test_features - mean) / std).numpy()) == test_labels.numpy()).mean())


def supervised_accuracy(encoder, videos, labels, test_videos, test_labels, *, epochs, lr, seed, batch_size=16):
    """The encoder and a new linear head on its cls token trained on the labelled clips (cross-entropy, AdamW, cosine
    decay, every token kept); the test accuracy after the last epoch."""
    torch.manual_seed(seed)
    head = nn.Linear(encoder.dim, int(labels.max()) + 1)
    parameters = list(encoder.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.05)
    steps = epochs * -(-len(videos) // batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, steps))
    encoder.train()
    for _ in range(epochs):
        for index in torch.randperm(len(videos)).split(batch_size):
            loss = F.cross_entropy(head(encoder(videos[index])[:, 0]), labels[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    predictions = head(features(encoder, test_videos)).argmax(dim=1)
    return (predictions == test_labels).float().mean().item()


def probe_all(encoder, train_videos, train_labels, test_videos, test_labels, subsets):
    """{(task, probe): test accuracy} of 5-NN and the linear probe on each task's labelled subset, from the
    encoder's features (`features`: its cls token) of the labelled clips and of the test clips."""
    return probe_embeddings(lambda videos: features(encoder, videos), train_videos, train_labels, test_videos,
                            test_labels, subsets)


def probe_embeddings(embed, train_videos, train_labels, test_videos, test_labels, subsets):
    """`probe_all` on the features `embed(videos)` (n, width) gives, of the labelled clips (only those are embedded)
    and of the test clips."""
    labelled = torch.cat(list(subsets.values())).unique()
    labelled_features = embed(train_videos[labelled])
    train_features = labelled_features.new_zeros(len(train_videos), labelled_features.shape[-1])
    train_features[labelled] = labelled_features
    test_features = embed(test_videos)
    scores = {}
    for task in TASKS:
        index = subsets[task]
        args = (train_features[index], train_labels[task][index], test_features, test_labels[task])
        scores[(task, '5-NN')] = knn_accuracy(F.normalize(train_features[index], dim=-1), train_labels[task][index],
                                              F.normalize(test_features, dim=-1), test_labels[task], 5)   # cosine
        scores[(task, 'linear')] = linear_probe_accuracy(*args)
    return scores


def run_seed(seed, args, data, log=print):
    """{(start, task, probe): test accuracy} for one seed, and the pre-training's history."""
    pretrain_videos, train_videos, train_labels, test_videos, test_labels = data
    subsets = {task: labelled_subset(train_labels[task], args.labels, seed) for task in TASKS}
    learner = make_learner(seed, local_views=args.local_views, drop_ratio=args.drop_ratio, nd=args.nd,
                           local_size=args.local_size, flip=not args.no_flip)
    initial = {k: v.clone() for k, v in learner.encoder.state_dict().items()}

    scores = {}
    random_scores = probe_all(learner.encoder, train_videos, train_labels, test_videos, test_labels, subsets)
    scores.update({('random init', *key): value for key, value in random_scores.items()})

    history = pretrain(learner, pretrain_videos, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                       seed=seed, log=log)
    trained_scores = probe_all(learner.encoder, train_videos, train_labels, test_videos, test_labels, subsets)
    scores.update({(method_name(args), *key): value for key, value in trained_scores.items()})

    if args.supervised_epochs:
        for task in TASKS:
            encoder = make_encoder(args.nd)
            encoder.load_state_dict(initial)
            index = subsets[task]
            scores[('supervised', task, 'fine-tuned')] = supervised_accuracy(
                encoder, train_videos[index], train_labels[task][index], test_videos, test_labels[task],
                epochs=args.supervised_epochs, lr=args.supervised_lr, seed=seed)
    return scores, history


def method_name(args):
    return 'LeVJEPAND' if args.nd else 'LeVJEPA'


def spread(values, scale=100):
    """mean ± sample std of `values` times `scale` (the mean alone for one value), to one decimal."""
    mean = scale * statistics.mean(values)
    return f"{mean:.1f} ± {scale * statistics.stdev(values):.1f}" if len(values) > 1 else f"{mean:.1f}"


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--epochs', type=int, default=10, help='pre-training epochs')
    parser.add_argument('--repeats', type=int, default=2,
                        help='pre-training clips per training digit, each on its own path (default: %(default)s)')
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--lr', type=float, default=1e-3)
    parser.add_argument('--local-views', type=int, default=4)
    parser.add_argument('--local-size', type=int, default=None,
                        help="the local views' size in pixels (default: 16; with --nd 32, the only one it takes)")
    parser.add_argument('--nd', action='store_true',
                        help="pre-train with levjepa_nd's LeVJEPAND on a 3-D NDTransformer, LeVJEPA's views at 32")
    parser.add_argument('--no-flip', action='store_true',
                        help="don't flip the local views left-right (flipping swaps left and right motion)")
    parser.add_argument('--drop-ratio', type=float, default=0.95)
    parser.add_argument('--labels', type=int, default=10, help='labelled clips per class (default: %(default)s)')
    parser.add_argument('--supervised-epochs', type=int, default=0,
                        help='also train the encoder supervised on the labelled clips for this many epochs')
    parser.add_argument('--supervised-lr', type=float, default=1e-3)
    parser.add_argument('--train-limit', type=int, default=None,
                        help='use only the first N training digits (a quick run; default: all 1,347)')
    return parser


def load_data(args):
    """(pre-training clips, probe training clips, their labels, test clips, their labels) for `args`."""
    train_videos, train_labels = clips('train')
    test_videos, test_labels = clips('test')
    if args.train_limit:
        train_videos = train_videos[:args.train_limit]
        train_labels = {task: labels[:args.train_limit] for task, labels in train_labels.items()}
    # the pre-training clips: `repeats` passes over the training digits, each clip on a new path (moving_digits'
    # clip i shows digit i modulo 1,347), so the first pass is exactly the probe's training clips
    pretrain_videos, _ = clips('train', count=args.repeats * 1347)
    if args.train_limit:
        keep = (torch.arange(len(pretrain_videos)) % 1347) < args.train_limit
        pretrain_videos = pretrain_videos[keep]
    return pretrain_videos, train_videos, train_labels, test_videos, test_labels


def main(argv=None):
    args = make_parser().parse_args(argv)
    torch.set_num_threads(1)
    data = load_data(args)
    pretrain_videos, train_videos, _, test_videos, _ = data
    print(f"pre-training clips {len(pretrain_videos)}, probe training clips {len(train_videos)} "
          f"({args.labels} labelled per class), test clips {len(test_videos)}", flush=True)

    results, started = {}, time.process_time()
    for seed in args.seeds:
        print(f"seed {seed}:", flush=True)
        scores, _ = run_seed(seed, args, data, log=lambda line: print(line, flush=True))
        for key, value in scores.items():
            results.setdefault(key, []).append(value)
        print('  ' + ', '.join(f"{' '.join(key)} {100 * value:.1f}" for key, value in scores.items()), flush=True)
    print(f"{time.process_time() - started:.0f} CPU-s in all")

    print(f"\n| start | probe | digit (10 classes, {args.labels} labels each) | direction (8 classes, "
          f"{args.labels} labels each) |")
    print("|---|---|---|---|")
    method = method_name(args)
    rows = sorted({key[::2] for key in results}, key=lambda row: (['random init', method, 'supervised']
                                                                   .index(row[0]), row[1]))
    for start, probe in rows:
        cells = [spread(results[(start, task, probe)]) if (start, task, probe) in results else '' for task in TASKS]
        print(f"| {start} | {probe} | " + ' | '.join(cells) + ' |')
    print(f"\npaired differences, {method} - random init (points, per seed):")
    for task in TASKS:
        for probe in ('5-NN', 'linear'):
            differences = [a - b for a, b in zip(results[(method, task, probe)],
                                                 results[('random init', task, probe)])]
            print(f"  {task} {probe}: " + ' '.join(f"{100 * d:+.1f}" for d in differences)
                  + f"  (mean {spread(differences)})")


if __name__ == '__main__':
    main()
