"""ViViT: factorised video transformers.

"ViViT: A Video Vision Transformer", Arnab et al., arXiv 2103.15691. A video (b, c, frames, h, w)
is cut into tubelets (section 3.2) and, instead of attending jointly over all space-time tokens
(Model 1, `vit_pytorch.vit_3d.ViT`), the attention is factorised:

  'factorized_encoder'         Model 2 (section 3.3): a spatial transformer runs on each temporal
                               slice of tokens alone and hands one token per slice (its cls token,
                               or the mean) to a temporal transformer, which classifies the video.
  'factorized_self_attention'  Model 3: every layer attends first over space (within one slice),
                               then over time (the same spatial position across slices), then
                               applies its MLP.

The arguments are vit-pytorch's (`vit_pytorch.vivit.ViViT`), and its checkpoints load through
`vit_pytorch.pretrained.load_vit_pytorch`. `ViT` is the same class under the name earlier
vit-pytorch releases gave it, which its README example and public code still import (vit-pytorch
1.26.14 itself has no `vivit.ViT`, so its own README example fails there).

    import torch
    from vit_pytorch.vivit import ViViT

    model = ViViT(image_size=128, image_patch_size=16, frames=16, frame_patch_size=2,
                  num_classes=1000, dim=1024, spatial_depth=6, temporal_depth=6, heads=8,
                  mlp_dim=2048, variant='factorized_encoder')
    video = torch.randn(4, 3, 16, 128, 128)
    logits = model(video)                                     # (4, 1000)
    mask = torch.ones(4, 16, dtype=torch.bool)                # frames to attend to
    logits = model(video, mask=mask)

Where it follows vit-pytorch rather than the paper: the temporal transformer gets no position
embedding of its own (the per-slice tokens carry the spatio-temporal table of the patches), the
tubelet projection sits between two LayerNorms and the attention has no qkv bias; the factorised
self-attention reads the cls token of the first slice. Where it differs from vit-pytorch: with a
`mask`, the mean pooling over time counts the kept slices only (vit-pytorch averages over the
masked ones too), a sample with no kept slice is refused, and the masked frames are zeros before
the tubelet embedding, so that nothing they hold (NaN, inf) reaches the output: vit-pytorch's
factorised self-attention with `pool='cls'` reads the first slice's cls token even when that slice
is masked, and its output then depends on the masked frames (ours is vit-pytorch's on the video
with those frames zeroed). The recorder sees the spatial maps,
(b * slices, heads, prefix + h * w, same), laid on `token_grid`, then the temporal ones,
(b * (prefix + h * w) or b, heads, slices (+ 1), same).
"""

import torch
from einops import rearrange, reduce, repeat
from torch import nn

from vit_pytorch import vit

VARIANTS = ('factorized_encoder', 'factorized_self_attention')


class FactorizedTransformer(vit.Stack):
    """Layers of (spatial attention, temporal attention, feedforward) on (b, slices, tokens, dim) videos."""

    @staticmethod
    def layer(branches, x, *, mask=None):
        spatial, temporal, feedforward = branches
        batch, slices, tokens = x.shape[:3]     # all named: einops cannot infer a size from an empty batch
        x = rearrange(x, 'b f n d -> (b f) n d')
        x = spatial(x) + x
        x = rearrange(x, '(b f) n d -> (b n) f d', b=batch, f=slices)
        x = temporal(x, mask=mask) + x
        x = feedforward(x) + x
        return rearrange(x, '(b n) f d -> b f n d', b=batch, n=tokens)


class ViViT(vit.TokenFace, nn.Module):
    """ViViT's factorised encoder or factorised self-attention; `num_classes=0` makes `forward` return
    the pooled embedding (b, dim).

    `use_flash_attn=False` computes attention explicitly (vit-pytorch's option): the fused path is the
    default, and the recorder switches paths by itself. `mask` (b, frames), True where a frame is
    real, keeps the temporal attention off padded frames; a temporal token is kept when all its
    `frame_patch_size` frames are.

    `forward_features` returns the video's pooled embedding, (b, dim).
    """

    def __init__(self, *, image_size, image_patch_size, frames, frame_patch_size, num_classes, dim,
                 spatial_depth, temporal_depth, heads, mlp_dim, pool='cls', channels=3, dim_head=64,
                 dropout=0., emb_dropout=0., variant='factorized_encoder', use_flash_attn=True):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(image_patch_size)
        self.frames, self.frame_patch_size = frames, frame_patch_size
        self.pool, self.channels, self.num_classes, self.variant = pool, channels, num_classes, variant
        self.num_prefix_tokens = 1 if pool == 'cls' else 0
        slices, (rows, columns) = frames // frame_patch_size, self.token_grid(self.image_size)

        self.to_patch_embedding = vit.TubeletEmbedding(channels=channels, patch_size=self.patch_size,
                                                       frame_patch_size=frame_patch_size, dim=dim)
        self.pos_embedding = nn.Parameter(torch.zeros(slices, rows * columns, dim))
        self.spatial_cls_token = nn.Parameter(torch.zeros(1, dim)) if pool == 'cls' else None
        self.temporal_cls_token = nn.Parameter(torch.zeros(1, dim)) \
            if pool == 'cls' and variant == 'factorized_encoder' else None
        vit.init_tokens(*(p for p in (self.pos_embedding, self.spatial_cls_token, self.temporal_cls_token)
                          if p is not None), patch_norm=True)
        self.dropout = nn.Dropout(emb_dropout)

        if variant == 'factorized_encoder':
            self.spatial_transformer = vit.Transformer(dim, spatial_depth, heads, dim_head, mlp_dim, dropout)
            self.temporal_transformer = vit.Transformer(dim, temporal_depth, heads, dim_head, mlp_dim, dropout)
        else:
            self.factorized_transformer = FactorizedTransformer([
                (vit.Attention(dim, heads, dim_head, dropout), vit.Attention(dim, heads, dim_head, dropout),
                 vit.FeedForward(dim, mlp_dim, dropout))
                for _ in range(spatial_depth)
            ], norm=nn.LayerNorm(dim))
        for module in self.modules():
            if isinstance(module, vit.Attention):
                module.fused = use_flash_attn
        self.num_features = dim
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    @property
    def intermediates_from(self):
        """The factorised encoder's temporal transformer ((b, prefix + slices, dim) tokens), or the factorised
        self-attention stack ((b, slices, prefix + h * w, dim))."""
        return 'temporal_transformer' if self.variant == 'factorized_encoder' else 'factorized_transformer'

    def token_grid(self, image_size):
        """The (h, w) grid of one temporal slice's patch tokens, for frames of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def embed(self, video, mask=None):
        """Tubelet tokens with positions, each slice led by the spatial cls token: (b, slices, prefix + h * w, dim).
        The frames that `mask` (b, frames) leaves out are zeros here: attention gives their tokens the weight 0,
        but 0 * NaN (or inf) is NaN, so without this whatever they hold could reach the output."""
        vit.check_video(video, channels=self.channels, frames=self.frames, image_size=self.image_size,
                        dtype=self.pos_embedding.dtype)
        if mask is not None:
            check_mask(mask, batch=video.shape[0], frames=self.frames)
            video = video.masked_fill(~mask[:, None, :, None, None], 0.)
        slices = self.pos_embedding.shape[0]
        x = rearrange(self.to_patch_embedding(video), 'b (f n) d -> b f n d', f=slices) + self.pos_embedding
        if self.spatial_cls_token is not None:
            cls_tokens = repeat(self.spatial_cls_token, '1 d -> b f 1 d', b=x.shape[0], f=slices)
            x = torch.cat((cls_tokens, x), dim=2)
        return self.dropout(x)

    def temporal_mask(self, mask, batch):
        """(b, frames) frame mask -> (b, slices) slice mask, checked; None stays None."""
        if mask is None:
            return None
        check_mask(mask, batch=batch, frames=self.frames)
        kept = reduce(mask, 'b (f pf) -> b f', 'all', pf=self.frame_patch_size)
        if not kept.any(dim=1).all():
            raise ValueError(f"mask leaves a video with no temporal slice to attend to (a slice is kept when all "
                             f"its {self.frame_patch_size} frames are): keep at least one in every video")
        return kept

    def forward_features(self, video, mask=None):
        """The video's embedding before the head: (b, dim)."""
        x = self.embed(video, mask)
        batch, slices = x.shape[:2]
        kept = self.temporal_mask(mask, batch)                              # (b, slices) or None
        if self.variant == 'factorized_encoder':
            x = self.spatial_transformer(rearrange(x, 'b f n d -> (b f) n d'))
            x = rearrange(x, '(b f) n d -> b f n d', f=slices)
            x = x[:, :, 0] if self.pool == 'cls' else x.mean(dim=2)         # (b, slices, dim)
            attend = kept
            if self.temporal_cls_token is not None:
                x = torch.cat((repeat(self.temporal_cls_token, '1 d -> b 1 d', b=batch), x), dim=1)
                attend = None if kept is None else torch.cat((kept.new_ones(batch, 1), kept), dim=1)
            x = self.temporal_transformer(x, mask=key_mask(attend))
            return x[:, 0] if self.pool == 'cls' else masked_mean(x, kept)
        tokens = x.shape[2]
        attend = None if kept is None else repeat(kept, 'b f -> (b n) f', n=tokens)
        x = self.factorized_transformer(x, mask=key_mask(attend))              # (b, slices, tokens, dim)
        if self.pool == 'cls':
            return x[:, 0, 0]
        return masked_mean(x.mean(dim=2), kept)

    def forward_head(self, x, pre_logits=False):
        return x if pre_logits else self.mlp_head(x)

    def forward(self, video, mask=None):
        return self.forward_head(self.forward_features(video, mask=mask))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.pos_embedding, removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        for module in self.modules():
            if isinstance(module, vit.Stack):
                module.grad_checkpointing = enable


ViT = ViViT     # the class's name in earlier vit-pytorch releases, still imported by its README


def key_mask(kept):
    """(b, n) True where a token may be attended to -> an attention mask (b, 1, 1, n) for every query."""
    return None if kept is None else rearrange(kept, 'b n -> b 1 1 n')


def masked_mean(x, kept):
    """Mean over the slices of (b, slices, dim), counting the kept ones only when there is a mask."""
    if kept is None:
        return x.mean(dim=1)
    weights = kept.to(x.dtype)
    return torch.einsum('b f d, b f -> b d', x, weights) / weights.sum(dim=1, keepdim=True)


# argument checks


def check_arguments(*, image_size, image_patch_size, frames, frame_patch_size, num_classes, dim, spatial_depth,
                    temporal_depth, heads, mlp_dim, pool, channels, dim_head, dropout, emb_dropout, variant,
                    use_flash_attn):
    vit.check_geometry(image_size=image_size, image_patch_size=image_patch_size, frames=frames,
                       frame_patch_size=frame_patch_size)
    for name, value in dict(dim=dim, spatial_depth=spatial_depth, temporal_depth=temporal_depth, heads=heads,
                            mlp_dim=mlp_dim, channels=channels, dim_head=dim_head).items():
        vit.positive_int(name, value)
    vit.non_negative_int('num_classes', num_classes)
    vit.probability('dropout', dropout)
    vit.probability('emb_dropout', emb_dropout)
    vit.boolean('use_flash_attn', use_flash_attn)
    if pool not in ('cls', 'mean'):
        raise ValueError(f"pool must be 'cls' (cls token) or 'mean' (mean pooling), got {pool!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if variant == 'factorized_self_attention' and spatial_depth != temporal_depth:
        raise ValueError(f"the factorized_self_attention variant has one temporal attention per layer: "
                         f"spatial_depth ({spatial_depth}) and temporal_depth ({temporal_depth}) must be equal")


def check_mask(mask, *, batch, frames):
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a boolean tensor of shape (b, frames), True where a frame is kept, got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)}")
    if tuple(mask.shape) != (batch, frames):
        raise ValueError(f"mask must have shape (b, frames) = {(batch, frames)}, got {tuple(mask.shape)}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's ViViT: our names; its tokens and position table carry a leading batch axis."""
    state = model.state_dict()
    batched = ('pos_embedding', 'spatial_cls_token', 'temporal_cls_token')
    plan = {key: ({key: (1, *tensor.shape) if key in batched else tuple(tensor.shape)},
                  (lambda t: t[0]) if key in batched else (lambda t: t))
            for key, tensor in state.items()}
    return plan, ('mlp_head.',)
