"""LeVJEPA for inputs of any number of dimensions: audio (b, c, t), video (b, c, t, h, w), volumes over time.

"LeVJEPA: Efficient & Scalable Video Pretraining without the Heuristics", arXiv 2608.27395, with LeJEPA's objective
(arXiv 2511.08544), generalised as vit-pytorch 1.26.14's `levjepa_nd` does: `NDTransformer` cuts an input of
`ndim` dimensions into patches, adds a factorised rotary embedding of every axis, attends causally along each axis
in `causal_dims` (a patch sees the patches at its own index or earlier along each of them; the cls token sees every
patch and, with causal dimensions, no patch sees it), and keeps only a random `1 - drop_ratio` of the patch tokens
in training. `LeVJEPAND` pulls the projections of `num_target_aug_views` target views (`augment_tgt`) of each input
to the projection of its source view (`augment_src`), with SIGReg on every view; the augmentations are the user's
(the identity by default).

    import torch
    from vit_pytorch.levjepa_nd import LeVJEPAND, NDTransformer

    augment = lambda x: x + torch.randn_like(x) * 0.1
    encoder = NDTransformer(ndim=4, input_shape=(4, 8, 16, 16), patch_size=(1, 4, 8, 8), dim=64, depth=2, heads=4,
                            mlp_dim=128)
    learner = LeVJEPAND(encoder, input_shape=(4, 8, 16, 16), augment_src=augment, augment_tgt=augment,
                        drop_ratio=0.5)
    volumes = torch.randn(2, 3, 4, 8, 16, 16)           # (b, c, t, x, y, z)
    loss = learner(volumes)
    loss.backward()
    embedding = learner(volumes, return_embedding=True) # (2, 64)

The same encoder as a registered classifier ('levjepa_nd': `NDTransformerClassifier`, a linear head on the cls
token), here on clips in tubelets of 2 frames x 8 x 8 pixels, as the pre-training command's `--method levjepa
--model levjepa_nd --drop-ratio` trains it:

    from vit_pytorch.levjepa_nd import NDTransformerClassifier

    model = NDTransformerClassifier(ndim=3, input_shape=(8, 32, 32), patch_size=(2, 8, 8), num_classes=10, dim=64,
                                    depth=2, heads=4, dim_head=16, mlp_dim=128)
    clips = torch.randn(2, 3, 8, 32, 32)                # 4 x 4 x 4 tubelets: 64 patch tokens
    logits = model(clips)                               # (2, 10)
    tokens = model.train().forward_features(clips, drop_ratio=0.75)   # (2, 17, 64): the cls token, 16 tubelets

vit-pytorch's classes, arguments, defaults, state_dict keys and return values are kept (its weights load as they
are). Its attention runs through flex attention where this torch compiles it and falls back to a dense mask
elsewhere; ours is always the dense boolean mask through `vit.attend` (scaled_dot_product_attention): the same
function on every device. Where ours differs: vit-pytorch concatenates [every source view, every target view] and
reads the rows back as (input, view), so with more than one input in the batch the views it pairs are mostly other
inputs'; ours pulls each input's target views to its own source view.
"""

from collections import namedtuple
from math import prod

import torch
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import levjepa, vit

# vit-pytorch's levjepa_nd defines these again, the same as its levjepa's
sigreg_loss, WeightStandardizedLinear = levjepa.sigreg_loss, levjepa.WeightStandardizedLinear

LeVJEPANDLosses = namedtuple('LeVJEPANDLosses', ['invariance_loss', 'sigreg_loss'])

AXES = 'fghijkl'                                       # vit-pytorch's names of up to 7 axes


def causal_mask(coords, causal_dims):
    """(b, 1, n, n) booleans of the tokens' integer coordinates (b, n, ndim), the cls token's all -1: True where
    query i may attend to key j along every axis of `causal_dims` (`levjepa.block_causal_mask` on each); None
    without causal dimensions (every token attends to every other)."""
    if not causal_dims:
        return None
    masks = [levjepa.block_causal_mask(coords[..., axis]) for axis in causal_dims]
    return torch.stack(masks).all(dim=0)


class NDTransformer(nn.Module):
    """The encoder: `forward(x, drop_ratio=None)` gives the normed tokens (b, 1 + kept patches, dim) of an input
    (b, channels, *input_shape), the cls token first, then the patches row-major over the axes (or in training,
    with a `drop_ratio`, a random `max(1, int(n * (1 - drop_ratio)))` of them in random order)."""

    def __init__(self, *, ndim, input_shape, patch_size, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 dropout=0., emb_dropout=0., rotary_max_freq=10., causal_dims=(0,)):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        input_shape, patch_size = as_tuple(input_shape, ndim), as_tuple(patch_size, ndim)
        self.ndim, self.dim, self.heads, self.channels = ndim, dim, heads, channels
        self.input_shape = input_shape
        self.causal_dims = (causal_dims,) if isinstance(causal_dims, int) else tuple(causal_dims)
        self.num_patches_per_dim = tuple(size // patch for size, patch in zip(input_shape, patch_size))
        self.num_patches = prod(self.num_patches_per_dim)

        axes, patches = AXES[:ndim], [f'p{i}' for i in range(ndim)]
        self.to_patch_embedding = nn.Sequential(
            Rearrange(f"b c {' '.join(f'({a} {p})' for a, p in zip(axes, patches))} -> "
                      f"b ({' '.join(axes)}) (c {' '.join(patches)})", **dict(zip(patches, patch_size))),
            nn.LayerNorm(channels * prod(patch_size), bias=False),
            nn.Linear(channels * prod(patch_size), dim),
            nn.LayerNorm(dim, bias=False),
        )
        self.cls_token = nn.Parameter(torch.randn(dim))
        frequencies = levjepa.video_frequencies(dim_head, rotary_max_freq, axes=ndim)
        self.rotary_emb = vit.AxialRotaryEmbedding(frequencies)
        self.transformer = levjepa.encoder_stack(dim, depth, heads, dim_head, mlp_dim, dropout)
        self.norm = nn.RMSNorm(dim)
        self.dropout = nn.Dropout(emb_dropout)

    @property
    def num_features(self):
        return self.dim

    def forward(self, x, drop_ratio=None):
        check_input(x, channels=self.channels, input_shape=self.input_shape)
        batch = x.shape[0]
        x = self.dropout(self.to_patch_embedding(x))

        # each patch's integer coordinates for the mask, and the same in [-1, 1) for the rotary angles
        scaled, index = levjepa.grid_coordinates(self.num_patches_per_dim, batch, device=x.device)
        x = torch.cat((repeat(self.cls_token, 'd -> b 1 d', b=batch), x), dim=1)

        if drop_ratio is not None and self.training:
            x, scaled, index = levjepa.keep_random_tokens(drop_ratio, x, scaled, index)

        angles = rearrange(self.rotary_emb(scaled), 'b n p -> b 1 n p')
        return self.norm(self.transformer(x, angles=angles, mask=causal_mask(index, self.causal_dims)))


class NDTransformerClassifier(levjepa.TokenClassifier):
    """The registered classifier on levjepa_nd's encoder ('levjepa_nd' in the registry): `encoder`, an
    `NDTransformer` built from the same arguments, and a linear head on its cls token (`levjepa.TokenClassifier`),
    so an `NDTransformer`'s weights are this model's without its head; for clips, a 3-D input (b, c, frames, h, w)
    with tubelets (`patch_size` along the frames too).

    `forward_features(x, drop_ratio=None)` returns the encoder's normed tokens, (b, 1 + prod(grid), dim) for the
    patch grid of `input_shape`, the cls token first, then the patches row-major over the axes; in training with a
    `drop_ratio`, the cls token and a random `max(1, int(n * (1 - drop_ratio)))` of the n patches (the training
    command's `--drop-ratio`), and every patch in eval mode. `forward(x, drop_ratio=None)` is the head on them.
    `num_classes=0` makes `forward` return the pooled embedding, the cls token (b, dim). The recorder sees
    (b, heads, 1 + n, 1 + n) maps a layer, the cls token first, masked along `causal_dims`;
    `forward_intermediates(output='maps')` lays each layer's patches on the grid, (b, dim, *grid).
    """

    def __init__(self, *, ndim, input_shape, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3,
                 dim_head=64, dropout=0., emb_dropout=0., rotary_max_freq=10., causal_dims=(0,)):
        check_classifier_arguments(**vit.arguments(locals()))
        encoder = NDTransformer(ndim=ndim, input_shape=input_shape, patch_size=patch_size, dim=dim, depth=depth,
                                heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head, dropout=dropout,
                                emb_dropout=emb_dropout, rotary_max_freq=rotary_max_freq, causal_dims=causal_dims)
        super().__init__(encoder, num_classes=num_classes, patch_size=as_tuple(patch_size, ndim))


class LeVJEPAND(nn.Module):
    """`forward(x)` returns the loss of one step (with `return_loss_breakdown=True`, also its
    `LeVJEPANDLosses(invariance_loss, sigreg_loss)`, weighted); `return_embedding=True` the encoder's cls token
    of `x` as given. `loss(projections)` is the loss of given projections (b, views, K), the source view's first."""

    def __init__(self, encoder, *, input_shape, augment_src=None, augment_tgt=None, num_target_aug_views=1,
                 num_classes_K=256, projection_hidden=256, drop_ratio=0.95, use_batch_norm=True, norm_fn=None,
                 use_weight_standardization=False, invariance_loss_weight=1., sigreg_loss_weight=0.02,
                 sigreg_loss_kwargs=dict(num_proj=1024, knots=17)):
        levjepa.check_learner_arguments(
            encoder=encoder, num_classes_K=num_classes_K, projection_hidden=projection_hidden, drop_ratio=drop_ratio,
            use_batch_norm=use_batch_norm, norm_fn=norm_fn, use_weight_standardization=use_weight_standardization,
            invariance_loss_weight=invariance_loss_weight, sigreg_loss_weight=sigreg_loss_weight,
            sigreg_loss_kwargs=sigreg_loss_kwargs, augment=dict(augment_src=augment_src, augment_tgt=augment_tgt))
        vit.positive_int('num_target_aug_views', num_target_aug_views)
        check_input_shape(input_shape, encoder.ndim)
        super().__init__()
        self.encoder = encoder
        self.input_shape = as_tuple(input_shape, encoder.ndim)
        self.augment_src = nn.Identity() if augment_src is None else augment_src
        self.augment_tgt = nn.Identity() if augment_tgt is None else augment_tgt
        self.projector = levjepa.projector(encoder.dim, projection_hidden, num_classes_K,
                                           use_batch_norm=use_batch_norm, norm_fn=norm_fn,
                                           use_weight_standardization=use_weight_standardization)
        self.num_target_aug_views, self.drop_ratio = num_target_aug_views, drop_ratio
        self.invariance_loss_weight, self.sigreg_loss_weight = invariance_loss_weight, sigreg_loss_weight
        self.sigreg_loss_kwargs = {**dict(num_proj=1024, knots=17), **sigreg_loss_kwargs}

    def views(self, x):
        """(source views (b, c, ...), target views (b * num_target_aug_views, c, ...), input by input)."""
        return self.augment_src(x), self.augment_tgt(x.repeat_interleave(self.num_target_aug_views, dim=0))

    def project(self, source, targets):
        """The projections (b, 1 + num_target_aug_views, K), each input's source view first."""
        batch = source.shape[0]
        projections = self.projector(self.encoder(torch.cat((source, targets)), drop_ratio=self.drop_ratio)[:, 0])
        targets = rearrange(projections[batch:], '(b v) d -> b v d', b=batch)
        return torch.cat((projections[:batch, None], targets), dim=1)

    def loss(self, projections, *, projections_directions=None):
        """(weighted invariance loss, weighted SIGReg) of projections (b, views, K), the source view's first."""
        return levjepa.losses(self, projections, projections_directions)

    def forward(self, x, return_embedding=False, return_loss_breakdown=False, *, projections_directions=None):
        if return_embedding:
            return self.encoder(x)[:, 0]
        invariance, sigreg = self.loss(self.project(*self.views(x)), projections_directions=projections_directions)
        total = invariance + sigreg
        return (total, LeVJEPANDLosses(invariance, sigreg)) if return_loss_breakdown else total


def as_tuple(value, ndim):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * ndim


def check_input(x, *, channels, input_shape):
    if not isinstance(x, torch.Tensor) or tuple(x.shape[1:]) != (channels, *input_shape):
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be (b, {channels}, {', '.join(map(str, input_shape))}), the encoder's channels and "
                         f"input_shape, got {got}")


# argument checks


def check_input_shape(input_shape, ndim):
    """An int or `ndim` positive ints, as vit-pytorch's `ensure_tuple` reads it."""
    shape = as_tuple(input_shape, ndim)
    if len(shape) != ndim:
        raise ValueError(f"input_shape must have ndim = {ndim} entries, got {input_shape!r}")
    for size in shape:
        vit.positive_int('input_shape', size)


def check_classifier_arguments(*, num_classes, **encoder):
    vit.non_negative_int('num_classes', num_classes)
    check_arguments(**encoder)


def check_arguments(*, ndim, input_shape, patch_size, dim, depth, heads, mlp_dim, channels, dim_head, dropout,
                    emb_dropout, rotary_max_freq, causal_dims):
    if vit.positive_int('ndim', ndim) > len(AXES):
        raise ValueError(f"ndim must be between 1 and {len(AXES)}, got {ndim}")
    input_shape, patch_size = as_tuple(input_shape, ndim), as_tuple(patch_size, ndim)
    for name, value in dict(input_shape=input_shape, patch_size=patch_size).items():
        if len(value) != ndim:
            raise ValueError(f"{name} must have ndim = {ndim} entries, got {value!r}")
        for size in value:
            vit.positive_int(name, size)
    for axis, (size, patch) in enumerate(zip(input_shape, patch_size)):
        if size % patch:
            raise ValueError(f"input_shape[{axis}] = {size} must be divisible by patch_size[{axis}] = {patch}")
    for name, value in dict(dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels,
                            dim_head=dim_head).items():
        vit.positive_int(name, value)
    if dim_head < 2 * ndim:
        raise ValueError(f"dim_head must be at least 2 * ndim = {2 * ndim}: the rotary embedding turns one channel "
                         f"pair per axis and frequency, got {dim_head}")
    vit.probability('dropout', dropout)
    vit.probability('emb_dropout', emb_dropout)
    vit.positive_float('rotary_max_freq', rotary_max_freq)
    dims = (causal_dims,) if isinstance(causal_dims, int) else causal_dims
    if not isinstance(dims, (tuple, list)) or any(isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < ndim
                                                  for d in dims):
        raise ValueError(f"causal_dims must be axes in [0, {ndim}) (an int or a tuple of them), got {causal_dims!r}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `NDTransformer` and `LeVJEPAND`: our names but for the rotary table (see `levjepa`'s plan)."""
    return levjepa.vit_pytorch_plan(model, keys)
