"""LeVJEPA: LeJEPA for video, with a block-causal video transformer that sees a few of its tokens.

"LeVJEPA: Efficient & Scalable Video Pretraining without the Heuristics", Kuhn et al., arXiv 2608.27395. LeJEPA's
objective (`lejepa`: a prediction loss between views, with no stop-gradient, plus SIGReg pulling the projections
to an isotropic Gaussian) on clips: one global view of each clip (a large crop at full size) and
`num_local_views` local ones (small crops, resized to `local_size`, with photometric jitter); every local view's
projection is pulled to the global one's. The encoder, `VideoTransformer`, embeds each frame's patches, attends
block-causally (a patch sees the patches of its own frame and of the frames before it; the cls token sees every
patch and no patch sees it) with a factorised 3-D rotary embedding of (frame, row, column), and in training keeps
only a random `1 - drop_ratio` of the patch tokens of each view (95 % dropped by default), which is where the
method saves its compute.

    import torch
    from vit_pytorch.levjepa import LeVJEPA, VideoTransformer

    encoder = VideoTransformer(image_size=32, patch_size=8, frames=4, dim=64, depth=2, heads=4, mlp_dim=128)
    learner = LeVJEPA(encoder, image_size=32, local_size=16, num_local_views=2, drop_ratio=0.5)
    video = torch.rand(4, 3, 4, 32, 32)                 # (b, c, frames, h, w), pixels in [0, 1]
    loss, (invariance, sigreg) = learner(video, return_loss_breakdown=True)
    loss.backward()
    embedding = learner(video, return_embedding=True)   # (4, 64): the cls token of the whole clip

The same encoder as a registered clip classifier ('levjepa': `VideoTransformerClassifier`, the face every
registered model has, a linear head on the cls token), which the pre-training command's `--method levjepa
--model levjepa --drop-ratio` trains with the token dropping:

    from vit_pytorch.levjepa import VideoTransformerClassifier

    model = VideoTransformerClassifier(image_size=32, patch_size=8, frames=8, num_classes=10, dim=64, depth=2,
                                       heads=4, dim_head=16, mlp_dim=128)
    clips = torch.randn(2, 3, 8, 32, 32)                # 8 frames x 4 x 4 patches: 128 patch tokens
    logits = model(clips)                               # (2, 10)
    tokens = model.train().forward_features(clips, drop_ratio=0.75)   # (2, 33, 64): the cls token, 32 patches

vit-pytorch 1.26.14's classes, arguments, defaults, state_dict keys and return values are kept (its
`VideoTransformer` and `LeVJEPA` weights load as they are). Its own example fails: it compiles the block-causal
mask function with `torch.compile` before handing it to flex attention's `create_block_mask`, which reads the
function's signature to count its arguments; the compiled wrapper shows `(*args, **kwargs)`, so it stops with
"AssertionError: Expected 4 or 5 positional args, got 0" (torch 2.14.1, on the CPU). Past that (torch.compile
made the identity), its backward stops with "NotImplementedError: FlexAttention does not support backward on CPU":
it cannot train on a CPU at all. Ours builds the same mask as a dense boolean matrix for `vit.attend`
(scaled_dot_product_attention), so it runs and trains on any device.
Where ours differs from vit-pytorch's:
  - the crops and the photometric augmentation are drawn per clip (every frame of a clip gets the same crop and
    the same colour change), in torch (DINO's crops and jitter, through `lejepa`); vit-pytorch's torchvision transforms draw one
    crop and one jitter for the whole batch (torchvision draws once per call). Crops are resampled bilinearly
    without antialiasing (vit-pytorch: bicubic with antialiasing);
  - the global view and the local views go through the encoder as two batches, so `local_size` may differ from
    `image_size` (vit-pytorch concatenates them into one batch, which fails unless the sizes agree); the
    projector (its BatchNorm too) sees all the views together, as in vit-pytorch;
  - vit-pytorch concatenates [every clip's global view, every clip's local views] and reads the rows back as
    (clip, view) with `'(b v) d -> b v d'`, so for a batch of more than one clip the view it takes as a clip's
    global view, and the local views it pulls to it, are mostly other clips' (its loss on fixed views is ours on
    that arrangement: tests/test_levjepa.py); ours pulls each clip's local views to its own global view.
The paper's encoders (its code's vit_tiny to vit_large) are `CONFIGS`, built by `video_transformer(variant)`;
`levjepa(variant)` adds its code's recipe (`RECIPE`). They are its widths on vit-pytorch's layout, not its parameter
counts (the comment at CONFIGS says what differs).
SIGReg is `lejepa.sigreg_loss`, the Epps-Pulley statistic with the factor N as vit-pytorch's (and the official
code's): vit-pytorch's `knots` on [0, 3] doubled is the same trapezoidal rule as 2 * knots - 1 knots on [-3, 3].
"""

from collections import namedtuple
from math import pi

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import lejepa, vit

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

LeVJEPALosses = namedtuple('LeVJEPALosses', ['invariance_loss', 'sigreg_loss'])


def video_frequencies(dim_head, max_freq=10, *, axes=3):
    """A factorised rotary table of coordinates in [-1, 1] (frame, row, column: any `axes` of them), for
    `vit.AxialRotaryEmbedding`: `dim_head // (2 * axes)` frequencies per axis, from 1 to `max_freq / 2`, times pi
    (radians per unit of coordinate), each turning one pair of a head's channels; the rest pass. (axes, f)."""
    pairs = dim_head // (2 * axes)
    return repeat(torch.linspace(1., max_freq / 2, pairs) * pi, 'f -> a f', a=axes)


class Attention(vit.RotaryAttention):
    """RMSNorm pre-norm attention without biases, its queries and keys turned by the rotary `angles` (b, 1, n,
    pairs): each sample's tokens in their own order (token dropping), one angle for every head; masked."""

    def __init__(self, dim, heads=8, dim_head=64, dropout=0.):
        super().__init__(dim, heads, dim_head, dropout, norm=nn.RMSNorm(dim),
                         to_out=nn.Sequential(nn.Linear(heads * dim_head, dim, bias=False), nn.Dropout(dropout)))


class VideoTransformer(nn.Module):
    """The encoder: `forward(video, drop_ratio=None)` gives the normed tokens (b, 1 + kept patches, dim), the cls
    token first, then the patches frame by frame (row-major within a frame), or in training, with a `drop_ratio`,
    a random `max(1, int(n * (1 - drop_ratio)))` of them in random order. `block_causal=False`: every token
    attends to every other."""

    def __init__(self, *, dim, depth, heads, mlp_dim, image_size, patch_size, frames, channels=3, dim_head=64,
                 dropout=0., emb_dropout=0., rotary_max_freq=10., block_causal=True):
        check_video_transformer_arguments(**vit.arguments(locals()))
        super().__init__()
        patch_h, patch_w = vit.pair(patch_size)
        patch_dim = channels * patch_h * patch_w
        self.dim, self.heads, self.channels, self.frames = dim, heads, channels, frames
        self.patch_h, self.patch_w = patch_h, patch_w
        self.block_causal = block_causal

        self.to_patch_embedding = nn.Sequential(
            Rearrange('b c f (h p1) (w p2) -> b (f h w) (c p1 p2)', p1=patch_h, p2=patch_w),
            nn.LayerNorm(patch_dim, bias=False),
            nn.Linear(patch_dim, dim),
            nn.LayerNorm(dim, bias=False),
        )
        self.cls_token = nn.Parameter(torch.randn(dim))
        self.rotary_emb = vit.AxialRotaryEmbedding(video_frequencies(dim_head, rotary_max_freq))
        self.transformer = encoder_stack(dim, depth, heads, dim_head, mlp_dim, dropout)
        self.norm = nn.RMSNorm(dim)
        self.dropout = nn.Dropout(emb_dropout)

    @property
    def num_features(self):
        return self.dim

    def forward(self, video, drop_ratio=None):
        check_clip(video, channels=self.channels, patch=(self.patch_h, self.patch_w))
        batch, _, frames, height, width = video.shape
        grid = (frames, height // self.patch_h, width // self.patch_w)
        x = self.dropout(self.to_patch_embedding(video))

        # (frame, row, column) of each patch: in [-1, 1) for the rotary angles, the frame index for the mask
        coords, index = grid_coordinates(grid, batch, device=video.device)
        frame = index[..., 0]
        x = torch.cat((repeat(self.cls_token, 'd -> b 1 d', b=batch), x), dim=1)

        if drop_ratio is not None and self.training:
            x, coords, frame = keep_random_tokens(drop_ratio, x, coords, frame)

        mask = block_causal_mask(frame) if self.block_causal else None
        angles = rearrange(self.rotary_emb(coords), 'b n p -> b 1 n p')
        return self.norm(self.transformer(x, angles=angles, mask=mask))


class TokenClassifier(vit.TokenFace, nn.Module):
    """The face of a registered classifier on a LeVJEPA encoder (`VideoTransformer`, levjepa_nd's `NDTransformer`):
    the encoder as `encoder` (its forward and state_dict keys as they are, under `encoder.`), a linear head on its
    cls token (the embedding LeVJEPA pre-trains and probes), the token dropping passed through `forward_features`
    (the encoder drops tokens in training only), `forward_intermediates` with the patches laid on the input's grid
    (`token_grid`), the head reset and gradient checkpointing."""

    num_prefix_tokens = 1
    intermediates_from = 'encoder.transformer'

    def __init__(self, encoder, *, num_classes, patch_size):
        super().__init__()
        self.encoder, self.num_classes, self.channels = encoder, num_classes, encoder.channels
        self.num_features = self.embed_dim = encoder.dim
        self.patch_size = tuple(patch_size)
        self.mlp_head = nn.Linear(encoder.dim, num_classes) if num_classes > 0 else nn.Identity()

    def token_grid(self, shape):
        """The grid of patch tokens of an input whose last sides are `shape`'s (one per patch side)."""
        sides = tuple(shape)[-len(self.patch_size):]
        return tuple(side // patch for side, patch in zip(sides, self.patch_size))

    def forward_features(self, x, drop_ratio=None):
        """The encoder's normed tokens (b, 1 + n, dim); in training with `drop_ratio`, n of them kept."""
        return self.encoder(x, drop_ratio=drop_ratio)

    def forward_head(self, tokens, pre_logits=False):
        """The cls token: the pre-logits embedding, or the logits."""
        pooled = tokens[:, 0]
        return pooled if pre_logits else self.mlp_head(pooled)

    def forward(self, x, drop_ratio=None):
        return self.forward_head(self.forward_features(x, drop_ratio=drop_ratio))

    def forward_intermediates(self, x, indices=None, *, output='tokens'):
        """Each chosen layer's output (see `TokenFace`): tokens (b, 1 + n, dim); output 'maps' lays the patches on
        the input's grid, (b, dim, *grid)."""
        if output != 'maps':
            return super().forward_intermediates(x, indices, output=output)
        grid = {f'g{i}': side for i, side in enumerate(self.token_grid(x.shape))}
        axes = ' '.join(grid)
        return [rearrange(tokens[:, 1:], f'b ({axes}) d -> b d {axes}', **grid)
                for tokens in super().forward_intermediates(x, indices)]

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.encoder.cls_token, removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        self.encoder.transformer.grad_checkpointing = enable


class VideoTransformerClassifier(TokenClassifier):
    """The registered clip classifier on LeVJEPA's encoder ('levjepa' in the registry): `encoder`, a
    `VideoTransformer` built from the same arguments, and a linear head on its cls token (`TokenClassifier`), so a
    `VideoTransformer`'s weights are this model's without its head.

    `forward_features(video, drop_ratio=None)` returns the encoder's normed tokens, (b, 1 + frames * h * w, dim) in
    patches of the clip's grid (`token_grid`), the cls token first, then the patches frame by frame, row-major; in
    training with a `drop_ratio`, the cls token and a random `max(1, int(n * (1 - drop_ratio)))` of the n patches
    (the token dropping LeVJEPA trains with; the training command's `--drop-ratio`), and every patch in eval mode.
    `forward(video, drop_ratio=None)` is the head on them. `num_classes=0` makes `forward` return the pooled
    embedding, the cls token (b, dim). The recorder sees (b, heads, 1 + n, 1 + n) maps a layer (n the patches
    kept), the cls token first; with `block_causal` a patch's row is zero beyond its own frame and at the cls
    token. `forward_intermediates(output='maps')` lays each layer's patches on the grid, (b, dim, frames, h, w).
    """

    def __init__(self, *, image_size, patch_size, frames, num_classes, dim, depth, heads, mlp_dim, channels=3,
                 dim_head=64, dropout=0., emb_dropout=0., rotary_max_freq=10., block_causal=True):
        check_classifier_arguments(**vit.arguments(locals()))
        encoder = VideoTransformer(image_size=image_size, patch_size=patch_size, frames=frames, dim=dim, depth=depth,
                                   heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                                   dropout=dropout, emb_dropout=emb_dropout, rotary_max_freq=rotary_max_freq,
                                   block_causal=block_causal)
        super().__init__(encoder, num_classes=num_classes, patch_size=(1, encoder.patch_h, encoder.patch_w))


def encoder_stack(dim, depth, heads, dim_head, mlp_dim, dropout):
    """The encoder's layers: RMSNorm pre-norm rotary attention and feed-forward, no final norm (the model's)."""
    return vit.Stack([(Attention(dim, heads, dim_head, dropout),
                       vit.FeedForward(dim, mlp_dim, dropout, norm=nn.RMSNorm(dim))) for _ in range(depth)])


def grid_coordinates(grid, batch, *, device=None):
    """(scaled, index) of the cls token and the patches of a `grid` (row-major), each (batch, 1 + n, len(grid)):
    the patches' integer coordinates and the same scaled to [-1, 1) for the rotary angles; the cls token's are
    all -1 (no patch index) and all 0."""
    index = torch.cartesian_prod(*(torch.arange(n, device=device) for n in grid)).view(-1, len(grid))
    scaled = (index / torch.tensor(grid, device=device) - 0.5) * 2
    scaled = torch.cat((scaled.new_zeros(1, len(grid)), scaled))
    index = torch.cat((index.new_full((1, len(grid)), -1), index))
    return (repeat(t, 'n i -> b n i', b=batch) for t in (scaled, index))


def keep_random_tokens(drop_ratio, *tokens):
    """The cls token and a random `max(1, int(n * (1 - drop_ratio)))` of the n others, the same for each of
    `tokens` ((b, 1 + n, ...) each, the cls token first), in random order."""
    batch, count = tokens[0].shape[:2]
    kept = max(1, int((count - 1) * (1 - drop_ratio)))
    patches = torch.rand(batch, count - 1, device=tokens[0].device).topk(kept, dim=-1).indices + 1
    keep = torch.cat((patches.new_zeros(batch, 1), patches), dim=1)            # the cls token is never dropped
    return [t.gather(1, keep.view(batch, 1 + kept, *[1] * (t.ndim - 2)).expand(-1, -1, *t.shape[2:]))
            for t in tokens]      # 1 + kept, not -1: an empty batch has no size to infer


def block_causal_mask(frame):
    """(b, 1, n, n) booleans, True where query i may attend to key j: i is the cls token (frame -1, which sees
    everything), or j is a patch of i's frame or an earlier one (no patch attends to the cls token)."""
    query, key = frame[:, :, None], frame[:, None, :]
    return ((query == -1) | ((key >= 0) & (query >= key)))[:, None]


class WeightStandardizedLinear(nn.Module):
    """A linear layer whose weight rows are standardised (mean 0, variance 1) in every forward: the projector's
    first layer without batch statistics (Richemond et al., arXiv 2010.10241)."""

    def __init__(self, dim, dim_out, bias=True, eps=1e-4):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(dim_out, dim) * dim ** -0.5)
        self.bias = nn.Parameter(torch.zeros(dim_out)) if bias else None

    def forward(self, x):
        mean = self.weight.mean(dim=-1, keepdim=True)
        var = self.weight.var(dim=-1, keepdim=True, unbiased=False)
        return F.linear(x, (self.weight - mean) / var.clamp_min(self.eps).sqrt(), self.bias)


class NormalizeVideo(nn.Module):
    """Per-channel normalisation of clips (b, c, t, h, w)."""

    def __init__(self, mean=IMAGENET_MEAN, std=IMAGENET_STD):
        super().__init__()
        self.register_buffer('mean', torch.tensor(mean).view(-1, 1, 1, 1), persistent=False)
        self.register_buffer('std', torch.tensor(std).view(-1, 1, 1, 1), persistent=False)

    def forward(self, video):
        return (video - self.mean) / self.std


class PhotometricAugment(nn.Module):
    """vit-pytorch's local-view augmentation, one draw per clip (every frame alike): colour jitter (brightness and
    contrast 0.4, saturation 0.2, hue 0.1) with probability `color_jitter_prob`, grayscale with `grayscale_prob`,
    Gaussian blur (sigma 0.1 to 2 pixels) with `gaussian_blur_prob`, then the normalisation. The horizontal flip
    (`hflip`) is drawn with the crop (`video_crop`), which reads it from here."""

    def __init__(self, color_jitter_prob=0.8, grayscale_prob=0.2, gaussian_blur_prob=0.0, hflip=True,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD):
        super().__init__()
        self.color_jitter_prob, self.grayscale_prob = color_jitter_prob, grayscale_prob
        self.gaussian_blur_prob, self.hflip = gaussian_blur_prob, hflip
        self.normalize = NormalizeVideo(mean, std)

    def forward(self, video):
        frames = video.shape[2]
        x = rearrange(video, 'b c t h w -> (b t) c h w')
        # one draw per clip: the clip's frames side by side as one image (the blur then crosses their edges)
        x = rearrange(x, '(b t) c h w -> b c h (t w)', t=frames)
        x = lejepa.color_jitter(x, p=self.color_jitter_prob, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)
        x = lejepa.random_grayscale(x, p=self.grayscale_prob)
        x = lejepa.gaussian_blur(x, p=self.gaussian_blur_prob, sigma=(0.1, 2.0))
        return self.normalize(rearrange(x, 'b c h (t w) -> b c t h w', t=frames))


def video_crop(video, size, scale, ratio, flip_p=0.):
    """A random resized crop of each clip (b, c, t, h, w), the same for all its frames, resized to `size`."""
    frames = video.shape[2]
    folded = rearrange(video, 'b c t h w -> b (c t) h w')
    cropped = lejepa.random_resized_crop(folded, vit.pair(size), scale, ratio=ratio, flip_p=flip_p)
    return rearrange(cropped, 'b (c t) h w -> b c t h w', t=frames)


def augmented_view(video, size, scale, ratio, augment):
    """A view of each clip: `video_crop` of `scale` resized to `size`, flipped left-right with probability 0.5 where
    `augment` flips (its `hflip`, as PhotometricAugment's), then `augment`."""
    flip = 0.5 if getattr(augment, 'hflip', False) else 0.
    return augment(video_crop(video, size, scale, ratio, flip_p=flip))


class ClipView(nn.Module):
    """`augmented_view` as a module: one of LeVJEPA's views of clips (b, c, t, h, w), a crop of `scale` and aspect
    `ratio` resized to `size`, flipped where `augment` flips, then `augment` (`NormalizeVideo`, `PhotometricAugment`);
    the views LeVJEPAND takes as its augmentations when it trains on LeVJEPA's views."""

    def __init__(self, size, scale, augment, ratio=(0.75, 1.3333)):
        super().__init__()
        self.size, self.scale, self.augment, self.ratio = vit.pair(size), tuple(scale), augment, tuple(ratio)

    def forward(self, video):
        return augmented_view(video, self.size, self.scale, self.ratio, self.augment)


class LeVJEPA(nn.Module):
    """`forward(video)` returns the loss of one step (with `return_loss_breakdown=True`, also its
    `LeVJEPALosses(invariance_loss, sigreg_loss)`, weighted); `return_embedding=True` the encoder's cls token
    of `video` as given. `loss(projections)` is the loss of given projections (b, views, K), the global view's
    first."""

    def __init__(self, encoder, image_size, local_size=96, num_local_views=4, num_classes_K=256,
                 projection_hidden=256, local_crop_scale=(0.02, 0.4), global_crop_scale=(0.8, 1.0), drop_ratio=0.95,
                 use_batch_norm=True, norm_fn=None, use_weight_standardization=False, invariance_loss_weight=1.,
                 sigreg_loss_weight=0.02, sigreg_loss_kwargs=dict(num_proj=1024, knots=17), local_augment_fn=None,
                 global_augment_fn=None, crop_ratio_range=(0.75, 1.3333)):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.encoder = encoder
        self.image_size, self.local_size = vit.pair(image_size), vit.pair(local_size)
        self.local_crop_scale, self.global_crop_scale = tuple(local_crop_scale), tuple(global_crop_scale)
        self.crop_ratio_range = tuple(crop_ratio_range)
        self.global_augment = NormalizeVideo() if global_augment_fn is None else global_augment_fn
        self.local_augment = PhotometricAugment() if local_augment_fn is None else local_augment_fn

        self.projector = projector(encoder.dim, projection_hidden, num_classes_K, use_batch_norm=use_batch_norm,
                                   norm_fn=norm_fn, use_weight_standardization=use_weight_standardization)
        self.num_local_views, self.drop_ratio = num_local_views, drop_ratio
        self.invariance_loss_weight, self.sigreg_loss_weight = invariance_loss_weight, sigreg_loss_weight
        self.sigreg_loss_kwargs = {**dict(num_proj=1024, knots=17), **sigreg_loss_kwargs}

    def views(self, video):
        """(global view (b, c, t, h, w), local views (b * num_local_views, c, t, h', w'), clip by clip)."""
        global_view = augmented_view(video, self.image_size, self.global_crop_scale, self.crop_ratio_range,
                                     self.global_augment)
        local = repeat(video, 'b c t h w -> (b v) c t h w', v=self.num_local_views)
        return global_view, augmented_view(local, self.local_size, self.local_crop_scale, self.crop_ratio_range,
                                           self.local_augment)

    def project(self, global_view, local_views):
        """The projections (b, 1 + num_local_views, K) of the views, the global one first."""
        batch = global_view.shape[0]
        tokens = [self.encoder(global_view, drop_ratio=self.drop_ratio)[:, 0]]
        if self.num_local_views:
            tokens.append(self.encoder(local_views, drop_ratio=self.drop_ratio)[:, 0])
        projections = self.projector(torch.cat(tokens))                       # one batch: BatchNorm sees all views
        global_projection, local_projections = projections[:batch], projections[batch:]
        local_projections = rearrange(local_projections, '(b v) d -> b v d', b=batch)
        return torch.cat((global_projection[:, None], local_projections), dim=1)

    def loss(self, projections, *, projections_directions=None):
        """(weighted invariance loss, weighted SIGReg) of projections (b, views, K), the global view's first."""
        return losses(self, projections, projections_directions)

    def forward(self, video, return_embedding=False, return_loss_breakdown=False, *, projections_directions=None):
        if return_embedding:
            return self.encoder(video)[:, 0]
        invariance, sigreg = self.loss(self.project(*self.views(video)), projections_directions=projections_directions)
        total = invariance + sigreg
        return (total, LeVJEPALosses(invariance, sigreg)) if return_loss_breakdown else total


def projector(dim, hidden, dim_out, *, use_batch_norm, norm_fn, use_weight_standardization):
    """vit-pytorch's small projector, discarded after pre-training: linear, norm, GELU, linear."""
    norm_fn = (nn.BatchNorm1d if use_batch_norm else nn.RMSNorm) if norm_fn is None else norm_fn
    linear = WeightStandardizedLinear if use_weight_standardization else nn.Linear
    return nn.Sequential(linear(dim, hidden), norm_fn(hidden), nn.GELU(), nn.Linear(hidden, dim_out))


def losses(learner, projections, directions=None):
    """(weighted invariance loss, weighted SIGReg) of projections (b, views, K), the first view the target: every
    view pulled to it (`lejepa.prediction_loss`), SIGReg per view with the learner's `sigreg_loss_kwargs`
    (vit-pytorch's `knots` on [0, 3] doubled: 2 * knots - 1 on [-3, 3]) and `directions` (K, num_proj) if given."""
    views = rearrange(projections, 'b v d -> v b d')
    invariance = lejepa.prediction_loss(views[:1], views[1:])
    knots = learner.sigreg_loss_kwargs['knots']
    sigreg = lejepa.sigreg_loss(views, num_slices=learner.sigreg_loss_kwargs['num_proj'], domain=(-3., 3.),
                                num_knots=2 * knots - 1, projections=directions)
    return invariance * learner.invariance_loss_weight, sigreg * learner.sigreg_loss_weight


# The paper's encoders, from its code (MLO-lab/LeVJEPA @ 481a99b, module.py: vit_tiny, vit_small, vit_base,
# vit_large; the README names ViT-Tiny and ViT-S/B/L): name -> (dim, depth, heads). All take patches of 16, heads of
# dim // heads channels and an MLP 4 * dim wide (mlp_ratio=4); conf/config.yaml's clips are 16 frames at 224, one
# frame a token (tubelet_size 1). module.py also has vit_huge, vit_giant and vit_gigantic, which the paper does not
# train. The widths go onto vit-pytorch's VideoTransformer, which ours keeps: bias-free RMSNorms and attention
# projections, a normed linear patch embedding; the official encoder is V-JEPA's (LayerNorms with biases, qkv and
# output biases, a Conv3d patch embedding), so the counts differ by those (tests/test_levjepa.py writes the
# differences out).
CONFIGS = {'tiny': (192, 12, 3), 'small': (384, 12, 6), 'base': (768, 12, 12), 'large': (1024, 24, 16)}

# conf/config.yaml's recipe (same commit), in LeVJEPA's arguments: one global 224 crop (scale 0.8 to 1) and 10 local
# 96 crops (scale 0.02 to 0.4), 95 % of the patch tokens dropped, a projector 2048 wide to 256 with BatchNorm,
# SIGReg weight 0.02 with 17 knots and 1024 directions. Its photometric augmentation (jitter 0.8, grayscale 0.2, no
# blur, flips, hue 0.1) is PhotometricAugment's default.
RECIPE = dict(image_size=224, local_size=96, num_local_views=10, num_classes_K=256, projection_hidden=2048,
              local_crop_scale=(0.02, 0.4), global_crop_scale=(0.8, 1.0), drop_ratio=0.95, use_batch_norm=True,
              sigreg_loss_weight=0.02, sigreg_loss_kwargs=dict(num_proj=1024, knots=17))


def video_transformer(variant, *, image_size=224, frames=16, **overrides):
    """The paper's ViT-`variant` encoder (a key of CONFIGS) on 16-frame clips at 224, patches of 16; keyword
    arguments override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, depth, heads = CONFIGS[variant]
    kwargs = dict(dim=dim, depth=depth, heads=heads, dim_head=dim // heads, mlp_dim=4 * dim, image_size=image_size,
                  patch_size=16, frames=frames)
    return VideoTransformer(**{**kwargs, **overrides})


def levjepa(variant, **overrides):
    """LeVJEPA with the paper's ViT-`variant` encoder (`video_transformer(variant)`) and its code's recipe
    (RECIPE); keyword arguments override the recipe."""
    return LeVJEPA(video_transformer(variant), **{**RECIPE, **overrides})


def sigreg_loss(x, num_proj=1024, knots=17):
    """vit-pytorch's `levjepa.sigreg_loss`: SIGReg of x (..., n, d) over `num_proj` random directions, its
    integral on `knots` points of [0, 3] (the integrand is even: `lejepa.sigreg_loss` on 2 * knots - 1 points of
    [-3, 3] is the same trapezoidal sum), averaged over the directions and the leading dimensions."""
    vit.positive_int('num_proj', num_proj)
    if vit.positive_int('knots', knots) < 2:
        raise ValueError(f"knots must be at least 2 (the trapezoidal rule's two ends), got {knots}")
    return lejepa.sigreg_loss(x, num_slices=num_proj, domain=(-3., 3.), num_knots=2 * knots - 1)


def check_clip(video, *, channels, patch):
    if not isinstance(video, torch.Tensor) or video.ndim != 5 or video.shape[1] != channels \
            or video.shape[-2] % patch[0] or video.shape[-1] % patch[1]:
        got = tuple(video.shape) if isinstance(video, torch.Tensor) else type(video).__name__
        raise ValueError(f"video must be (b, {channels}, frames, h, w) with h and w multiples of the patch size "
                         f"{patch}, got {got}")


# argument checks


def check_video_transformer_arguments(*, dim, depth, heads, mlp_dim, image_size, patch_size, frames, channels,
                                      dim_head, dropout, emb_dropout, rotary_max_freq, block_causal):
    vit.patch_grid(vit.positive_pair('image_size', image_size), vit.positive_pair('patch_size', patch_size))
    for name, value in dict(dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim, frames=frames, channels=channels,
                            dim_head=dim_head).items():
        vit.positive_int(name, value)
    if dim_head < 6:
        raise ValueError(f"dim_head must be at least 6: the rotary embedding turns 3 axes x 2 channels per "
                         f"frequency, got {dim_head}")
    vit.probability('dropout', dropout)
    vit.probability('emb_dropout', emb_dropout)
    vit.positive_float('rotary_max_freq', rotary_max_freq)
    vit.boolean('block_causal', block_causal)


def check_classifier_arguments(*, num_classes, **encoder):
    vit.non_negative_int('num_classes', num_classes)
    check_video_transformer_arguments(**encoder)


def check_arguments(*, encoder, image_size, local_size, num_local_views, num_classes_K, projection_hidden,
                    local_crop_scale, global_crop_scale, drop_ratio, use_batch_norm, norm_fn,
                    use_weight_standardization, invariance_loss_weight, sigreg_loss_weight, sigreg_loss_kwargs,
                    local_augment_fn, global_augment_fn, crop_ratio_range):
    check_learner_arguments(encoder=encoder, num_classes_K=num_classes_K, projection_hidden=projection_hidden,
                            drop_ratio=drop_ratio, use_batch_norm=use_batch_norm, norm_fn=norm_fn,
                            use_weight_standardization=use_weight_standardization,
                            invariance_loss_weight=invariance_loss_weight, sigreg_loss_weight=sigreg_loss_weight,
                            sigreg_loss_kwargs=sigreg_loss_kwargs,
                            augment=dict(local_augment_fn=local_augment_fn, global_augment_fn=global_augment_fn))
    vit.positive_pair('image_size', image_size)
    vit.positive_pair('local_size', local_size)
    if vit.non_negative_int('num_local_views', num_local_views) == 0:
        raise ValueError("num_local_views must be a positive int: the invariance loss pulls each local view to the "
                         "global one, so it needs at least one, got 0")
    for name, value in dict(local_crop_scale=local_crop_scale, global_crop_scale=global_crop_scale).items():
        if not isinstance(value, (tuple, list)) or len(value) != 2 or not \
                0 < vit.finite_number(name, value[0], 'a (low, high) pair in (0, 1]') <= \
                vit.finite_number(name, value[1], 'a (low, high) pair in (0, 1]') <= 1:
            raise ValueError(f"{name} must be a (low, high) share of the frame's area with 0 < low <= high <= 1, "
                             f"got {value!r}")
    if not isinstance(crop_ratio_range, (tuple, list)) or len(crop_ratio_range) != 2 or not \
            0 < vit.finite_number('crop_ratio_range', crop_ratio_range[0]) <= \
            vit.finite_number('crop_ratio_range', crop_ratio_range[1]):
        raise ValueError(f"crop_ratio_range must be a (low, high) aspect ratio range with 0 < low <= high, got "
                         f"{crop_ratio_range!r}")


def check_learner_arguments(*, encoder, num_classes_K, projection_hidden, drop_ratio, use_batch_norm, norm_fn,
                            use_weight_standardization, invariance_loss_weight, sigreg_loss_weight,
                            sigreg_loss_kwargs, augment):
    """The checks LeVJEPA and LeVJEPAND share; `augment`: {name: an augmentation callable or None}."""
    if not isinstance(getattr(encoder, 'dim', None), int) or not callable(encoder):
        raise TypeError(f"encoder must have a `dim` and a forward(x, drop_ratio) giving tokens (b, 1 + n, dim), the "
                        f"cls token first (a VideoTransformer, an NDTransformer), got {type(encoder).__name__}")
    vit.positive_int('num_classes_K', num_classes_K)
    vit.positive_int('projection_hidden', projection_hidden)
    if drop_ratio is not None:
        vit.probability('drop_ratio', drop_ratio)
    vit.boolean('use_batch_norm', use_batch_norm)
    vit.boolean('use_weight_standardization', use_weight_standardization)
    if norm_fn is not None and not callable(norm_fn):
        raise TypeError(f"norm_fn must build a norm layer from a width (nn.BatchNorm1d, nn.RMSNorm) or be None, got "
                        f"{norm_fn!r}")
    for name, value in dict(invariance_loss_weight=invariance_loss_weight,
                            sigreg_loss_weight=sigreg_loss_weight).items():
        if vit.finite_number(name, value, 'a finite float >= 0') < 0:
            raise ValueError(f"{name} must be a finite float >= 0, got {value}")
    if not isinstance(sigreg_loss_kwargs, dict) or set(sigreg_loss_kwargs) - {'num_proj', 'knots'}:
        raise TypeError(f"sigreg_loss_kwargs must be a dict of num_proj, knots, got {sigreg_loss_kwargs!r}")
    kwargs = {**dict(num_proj=1024, knots=17), **sigreg_loss_kwargs}
    vit.positive_int('sigreg_loss_kwargs num_proj', kwargs['num_proj'])
    if vit.positive_int('sigreg_loss_kwargs knots', kwargs['knots']) < 2:
        raise ValueError(f"sigreg_loss_kwargs knots must be at least 2, got {kwargs['knots']}")
    for name, value in augment.items():
        if value is not None and not callable(value):
            raise TypeError(f"{name} must be a callable on input batches or None, got {value!r}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `VideoTransformer` and `LeVJEPA` (and `levjepa_nd`'s): our names, but for the rotary table: its
    `rotary_emb.scales` (f,) are our `rotary_emb.frequencies` (axes, f) divided by pi, the same for every axis."""
    plan = {}
    for key, tensor in model.state_dict().items():
        if key.endswith('rotary_emb.frequencies'):
            plan[key] = ({key.removesuffix('frequencies') + 'scales': tuple(tensor.shape[1:])},
                         lambda scales, axes=tensor.shape[0]: repeat(scales * pi, 'f -> a f', a=axes))
        else:
            plan[key] = ({key: tuple(tensor.shape)}, lambda t: t)
    return plan, ()
