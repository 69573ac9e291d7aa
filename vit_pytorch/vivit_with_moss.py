"""ViViT with MOSS: high-order space-time self-similarity features (vit-pytorch's `vivit_with_moss`).

MOSS, "Exploring High-Order Self-Similarity for Video Understanding" (openreview Co6SCyBIjo), as applied in
arXiv 2605.03269 (a policy's video encoder, where vit-pytorch's module cites both). A space-time self-similarity
(STSS) describes each token by its cosine similarities to its local space-time neighbourhood, a window of
`local_time` x `local_height` x `local_width` tokens: how the content around it moves, apart from what it is.
The first order is the STSS of the tokens; an encoder (a Linear over the spatial offsets, two 3x3 convolutions
over the token map, a Linear over the time offsets) turns it into features of the token width, and the STSS of
those features is the second order, and so on for `moss_orders`. The orders' features, each projected, are added
to a projection of the tokens. Here the MOSS block runs on ViViT's factorised encoder (Model 2 of arXiv
2103.15691, `vit_pytorch.vivit`): after the spatial transformer on each time slice, its patch tokens pass
through MOSS, their mean joins the slice's cls token, and the temporal transformer runs over the slices.

    import torch
    from vit_pytorch.vivit_with_moss import ViViT, MOSS

    model = ViViT(image_size=64, image_patch_size=16, frames=8, frame_patch_size=2, num_classes=10, dim=64,
                  spatial_depth=2, temporal_depth=2, heads=4, mlp_dim=128, moss_causal=True)
    logits = model(torch.randn(2, 3, 8, 64, 64))                   # (2, 10)
    moss = MOSS(dim=64, local_time=3, local_height=3, local_width=3, hidden_dim=16, orders=2, causal=True)
    features = moss(torch.randn(2, 8, 4, 4, 64))                   # (batch, frames, h, w, dim) -> the same

`moss_causal=True` (vit-pytorch's default) makes time causal: MOSS's windows reach back `local_time - 1` slices
and not forward (a stream can be fed in chunks, `MOSS(..., causal=True)(x, cache=..., return_cache=True)`), and
the temporal attention is causal. Where it differs from vit-pytorch: with causal time and `pool='cls'`,
vit-pytorch's temporal cls token leads the sequence and causal attention lets it attend to itself only, so its
logits do not depend on the video at all (its default configuration); ours keeps the cls token first but lets it
attend to every slice, while no slice attends to it (as `vit_nd` does, so that no slice sees a later one through
it). `load_vit_pytorch` loads vit-pytorch's checkpoints with equal outputs except those (refused by name).
`moss_layout='official'` (keyword only, ours; `MOSS(..., layout='official')`) computes the official code's MOSS block
instead (KimManjin/CorrelationSideTuning @ 67aaf40, `MOSSBlock`: per order a LayerNorm and a Linear before the STSS,
BatchNorm'd convolutions after it, the orders' features summed, no projection of the tokens), whose features the
ViViT adds to its patch tokens, as the official code adds them to its side network's; it needs `moss_causal=False`
(the official windows are centred in time), its channels are `moss_official_channels`, and `load_vit_pytorch`
refuses such a model (vit-pytorch's MOSS has other weights). The default is vit-pytorch's layout.
The frames must number `frames` (vit-pytorch also takes fewer, reading the first rows of its table).
The recorder sees the spatial maps (b * slices, heads, 1 + h * w, same), then the temporal ones
(b, heads, 1 + slices, same), as ViViT's.
"""

import torch
import torch.nn.functional as F
from einops import rearrange, reduce, repeat
from torch import nn

from vit_pytorch import vit, vivit


class ChanLayerNorm(nn.Module):
    """LayerNorm over the channels of (b, c, h, w) maps, with a gain `gamma` (1, c, 1, 1) and no bias."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(1, dim, 1, 1))

    def forward(self, x):
        centred = x - x.mean(dim=1, keepdim=True)
        # the biased variance written out: var_mean warns of zero degrees of freedom on an empty batch
        return centred * (centred.square().mean(dim=1, keepdim=True) + self.eps).rsqrt() * self.gamma


class STSSEncoder(nn.Module):
    """An STSS (b, t, h, w, lt, lh, lw) -> features (b, t, h, w, dim): the spatial offsets of each time offset
    projected to `hidden_dim`, two 3x3 convolutions over the token map, then all time offsets projected to `dim`."""

    def __init__(self, dim, local_time=3, local_height=3, local_width=3, hidden_dim=64):
        super().__init__()
        self.spatial_to_hidden = nn.Linear(local_height * local_width, hidden_dim)
        self.conv = nn.Sequential(
            nn.Conv2d(hidden_dim, hidden_dim, 3, padding=1), ChanLayerNorm(hidden_dim), nn.GELU(),
            nn.Conv2d(hidden_dim, hidden_dim, 3, padding=1), ChanLayerNorm(hidden_dim), nn.GELU(),
        )
        self.time_to_out = nn.Linear(local_time * hidden_dim, dim)

    def forward(self, sim):
        b, t, h, w, lt = sim.shape[:5]
        x = self.spatial_to_hidden(rearrange(sim, 'b t h w lt lh lw -> (b t lt) h w (lh lw)'))
        x = self.conv(rearrange(x, 'n h w d -> n d h w'))
        return self.time_to_out(rearrange(x, '(b t lt) d h w -> b t h w (lt d)', b=b, t=t, lt=lt))


class OfficialSTSSEncoder(nn.Module):
    """One order of MOSS in the official code's layout (KimManjin/CorrelationSideTuning, Recognition/modules/moss.py):
    tokens (b, t, h, w, dim) -> LayerNorm, a Linear to `hidden_dim`, their STSS (`stss`, a function) ->
    (b, t, h, w, lt, lh, lw); per time offset, a 1x1 convolution of the lh * lw similarities to `channels[0]`, two
    3x3 convolutions to `channels[1]`, `channels[2]`; the time offsets' maps side by side, a 3x3 convolution to
    `channels[3]`; a Linear to `dim`. Each convolution is bias-free, then BatchNorm and GELU."""

    def __init__(self, dim, local_time, local_height, local_width, hidden_dim, channels):
        super().__init__()
        extracted, first, second, fused = channels

        def conv(dim_in, dim_out, kernel):
            return nn.Sequential(nn.Conv3d(dim_in, dim_out, (1, kernel, kernel), padding=(0, kernel // 2, kernel // 2),
                                           bias=False), nn.BatchNorm3d(dim_out), nn.GELU())

        self.ln_pre = nn.LayerNorm(dim)
        self.in_proj = nn.Linear(dim, hidden_dim)
        self.extraction = conv(local_height * local_width, extracted, 1)
        self.integration = nn.Sequential(conv(extracted, first, 3), conv(first, second, 3))
        self.fuse = conv(local_time * second, fused, 3)
        self.out_proj = nn.Linear(fused, dim)

    def forward(self, x, stss):
        sim = stss(self.in_proj(self.ln_pre(x)))
        lt = sim.shape[4]
        x = self.integration(self.extraction(rearrange(sim, 'b t h w l u v -> (b l) (u v) t h w')))
        x = self.fuse(rearrange(x, '(b l) c t h w -> b (l c) t h w', l=lt))
        return self.out_proj(rearrange(x, 'b c t h w -> b t h w c'))


class MOSS(nn.Module):
    """High-order self-similarity features of (b, t, h, w, dim) tokens, the same shape out.

    `to_out(x) + sum_k to_order_out[k](f_k)`, where f_1 = encoder_1(STSS(x)) and f_k = encoder_k(STSS(f_{k-1})).
    STSS(x)[b, t, i, j, l, u, v] is the cosine similarity of token (t, i, j) to token (t + l - a, i + u - lh // 2,
    j + v - lw // 2), 0 outside the clip; a = local_time // 2, or local_time - 1 when `causal` (only the past).
    A causal MOSS takes `cache` (what `return_cache=True` returned for the frames before `x`: per order the
    normalised last `local_time - 1` frames) and gives the features of a longer stream chunk by chunk.

    `layout='official'` (keyword only, ours) computes the official code's MOSS block instead
    (KimManjin/CorrelationSideTuning, `MOSSBlock`): `sum_k f_k`, f_1 = encoder_1(x), f_k = encoder_k(f_{k-1}), each
    encoder an `OfficialSTSSEncoder` (LayerNorm and a Linear to `hidden_dim` before the STSS, BatchNorm'd
    convolutions of `official_channels` after it, a Linear back to `dim`), no projection of the tokens; time is
    centred (`causal=False` only), and a `local_time` of 1 compares each frame with the one before it (the first
    with itself), as the official code does. `official_channels` (extraction, integration, integration, fusion)
    defaults to (64, 64, 64, 128), 13 of the official code's 20 MOSS configurations' (the others' (96, 96, 96,
    192)), and is read only in that layout.
    """

    def __init__(self, dim, local_time=3, local_height=3, local_width=3, hidden_dim=64, orders=2, causal=False, *,
                 layout='vit_pytorch', official_channels=(64, 64, 64, 128)):
        super().__init__()
        check_moss_arguments(**vit.arguments(locals()))
        self.local_time, self.local_height, self.local_width = local_time, local_height, local_width
        self.causal, self.layout = causal, layout
        if layout == 'official':
            self.encoders = nn.ModuleList(OfficialSTSSEncoder(dim, local_time, local_height, local_width, hidden_dim,
                                                              tuple(official_channels)) for _ in range(orders))
            return
        self.encoders = nn.ModuleList(STSSEncoder(dim, local_time, local_height, local_width, hidden_dim)
                                      for _ in range(orders))
        self.to_order_out = nn.ModuleList(nn.Linear(dim, dim) for _ in range(orders))
        self.to_out = nn.Linear(dim, dim)

    def stss_transform(self, x, cache=None, return_cache=False):
        """STSS of (b, t, h, w, c) features: (b, t, h, w, lt, lh, lw) cosine similarities (and the next cache)."""
        lt, lh, lw = self.local_time, self.local_height, self.local_width
        h, w = x.shape[2:4]
        x = rearrange(F.normalize(x, dim=-1), 'b t h w c -> b c t h w')
        past, future = (lt - 1, 0) if self.causal else (lt // 2, lt // 2)
        frames = x if cache is None else torch.cat((cache, x), dim=2)
        if self.layout == 'official' and lt == 1:               # the official code's one-frame window: the frame before
            frames = torch.cat((frames[:, :, :1], frames[:, :, :-1]), dim=2)
        padded = F.pad(frames, (lw // 2, lw // 2, lh // 2, lh // 2, 0 if cache is not None else past, future))
        windows = padded.unfold(2, lt, 1).unfold(3, lh, 1).unfold(4, lw, 1)     # (b, c, t, h, w, lt, lh, lw)
        sim = torch.einsum('bcthw,bcthwluv->bthwluv', x, windows)
        if not return_cache:
            return sim
        kept = padded[:, :, padded.shape[2] - (lt - 1):, lh // 2:lh // 2 + h, lw // 2:lw // 2 + w]
        return sim, (kept if self.causal else None)

    def forward(self, x, cache=None, return_cache=False):
        if cache is not None and not self.causal:
            raise ValueError("cache is for a causal MOSS (causal=True), whose windows reach only into the past; "
                             "this MOSS is not causal")
        if self.layout == 'official':
            features = []
            for encoder in self.encoders:
                x = encoder(x, self.stss_transform)
                features.append(x)
            out = torch.stack(features).sum(dim=0)
            return (out, (None,) * len(features)) if return_cache else out
        out = self.to_out(x)
        caches = []
        for k, (encoder, to_order_out) in enumerate(zip(self.encoders, self.to_order_out)):
            sim, next_cache = self.stss_transform(x, None if cache is None else cache[k], return_cache=True)
            caches.append(next_cache)
            x = encoder(sim)
            out = out + to_order_out(x)
        return (out, tuple(caches)) if return_cache else out


class ViViT(vivit.ViViT):
    """ViViT's factorised encoder with a MOSS block between the spatial and the temporal transformer;
    `num_classes=0` makes `forward` return the pooled embedding after the head's LayerNorm (b, dim).

    `forward_features` returns the video's pooled embedding before the head, (b, dim): the temporal cls
    token, or the mean of the slices. `moss_layout` (keyword only, ours): 'vit_pytorch' (the default) or 'official'
    (the official code's MOSS block, its features added to the patch tokens; `moss_causal=False`, channels
    `moss_official_channels`; see `MOSS`). `mask` (b, frames) keeps the temporal attention off padded frames
    (non-causal models only). The head is vit-pytorch's LayerNorm then Linear (`mlp_head`).
    """

    def __init__(self, *, image_size, image_patch_size, frames, frame_patch_size, num_classes, dim, spatial_depth,
                 temporal_depth, heads, mlp_dim, pool='cls', channels=3, dim_head=64, dropout=0., emb_dropout=0.,
                 use_flash_attn=True, moss_local_time=3, moss_local_height=3, moss_local_width=3, moss_hidden_dim=64,
                 moss_orders=2, moss_causal=True, moss_layout='vit_pytorch', moss_official_channels=(64, 64, 64, 128)):
        check_arguments(**vit.arguments(locals()))
        super().__init__(image_size=image_size, image_patch_size=image_patch_size, frames=frames,
                         frame_patch_size=frame_patch_size, num_classes=num_classes, dim=dim,
                         spatial_depth=spatial_depth, temporal_depth=temporal_depth, heads=heads, mlp_dim=mlp_dim,
                         pool=pool, channels=channels, dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout,
                         variant='factorized_encoder', use_flash_attn=use_flash_attn)
        self.moss = MOSS(dim, local_time=moss_local_time, local_height=moss_local_height,
                         local_width=moss_local_width, hidden_dim=moss_hidden_dim, orders=moss_orders,
                         causal=moss_causal, layout=moss_layout, official_channels=moss_official_channels)
        self.mlp_head = vit.normed_head(dim, num_classes)
        slices = frames // frame_patch_size
        self.register_buffer('causal_mask', temporal_causal_mask(slices, cls=pool == 'cls') if moss_causal else None,
                             persistent=False)

    def forward_features(self, video, mask=None):
        """The video's embedding before the head: (b, dim)."""
        if mask is not None and self.moss.causal:
            raise ValueError("mask cannot be given to a causal model (moss_causal=True): its MOSS windows and "
                             "temporal attention read every earlier frame; build it with moss_causal=False")
        x = self.embed(video, mask)                                         # (b, slices, prefix + h * w, dim)
        batch, slices = x.shape[:2]
        kept = self.temporal_mask(mask, batch)
        x = rearrange(self.spatial_transformer(rearrange(x, 'b f n d -> (b f) n d')), '(b f) n d -> b f n d',
                      f=slices)
        prefix, patches = x[:, :, :self.num_prefix_tokens], x[:, :, self.num_prefix_tokens:]
        rows, columns = self.token_grid(self.image_size)
        patches = rearrange(patches, 'b f (h w) d -> b f h w d', h=rows, w=columns)
        # the official layout's features carry no projection of the tokens: added to them, as the official code adds
        # them to its side network's tokens
        features = self.moss(patches)
        patches = features + patches if self.moss.layout == 'official' else features
        x = reduce(patches, 'b f h w d -> b f d', 'mean')
        if self.pool == 'cls':
            x = torch.cat((repeat(self.temporal_cls_token, '1 d -> b 1 d', b=batch), prefix[:, :, 0] + x), dim=1)
        attend = self.causal_mask
        if kept is not None:
            attend = vivit.key_mask(torch.cat((kept.new_ones(batch, 1), kept), dim=1) if self.pool == 'cls' else kept)
        x = self.temporal_transformer(x, mask=attend)
        return x[:, 0] if self.pool == 'cls' else vivit.masked_mean(x, kept)

    def forward_head(self, x, pre_logits=False):
        """The head's LayerNorm (`pre_logits`: the normed embedding), then its Linear."""
        x = self.mlp_head[0](x)
        return x if pre_logits or self.num_classes == 0 else self.mlp_head[1](x)

    def reset_classifier(self, num_classes):
        """A new zero-initialised Linear for `num_classes` after the kept LayerNorm (0: forward returns the
        normed embedding)."""
        vit.non_negative_int('num_classes', num_classes)
        self.num_classes = num_classes
        norm = self.mlp_head[0]
        self.mlp_head = nn.Sequential(norm, *([vit.zero_linear(norm.normalized_shape[0], num_classes, like=norm.weight)]
                                             if num_classes > 0 else []))


def temporal_causal_mask(slices, *, cls):
    """(n, n) boolean mask of causal time: slice i attends to slices 0..i; with a leading cls token (`cls`), the
    cls token attends to every slice and no slice attends to it (it has read the later slices)."""
    mask = torch.ones(slices, slices, dtype=torch.bool).tril()
    if not cls:
        return mask
    return torch.cat((torch.ones(1, slices + 1, dtype=torch.bool),
                      torch.cat((torch.zeros(slices, 1, dtype=torch.bool), mask), dim=1)))


# argument checks


def check_moss_arguments(*, dim, local_time, local_height, local_width, hidden_dim, orders, causal, layout,
                         official_channels):
    vit.positive_int('dim', dim)
    for name, value in dict(local_time=local_time, local_height=local_height, local_width=local_width).items():
        vit.positive_int(name, value)
        if value % 2 == 0:
            raise ValueError(f"{name} must be odd (a window centred on the token), got {value}")
    vit.positive_int('hidden_dim', hidden_dim)
    vit.positive_int('orders', orders)
    vit.boolean('causal', causal)
    if layout not in ('vit_pytorch', 'official'):
        raise ValueError(f"layout must be 'vit_pytorch' or 'official', got {layout!r}")
    if not isinstance(official_channels, (tuple, list)) or len(official_channels) != 4:
        raise TypeError(f"official_channels must be 4 channel counts (extraction, integration, integration, fusion), "
                        f"got {official_channels!r}")
    for value in official_channels:
        vit.positive_int('official_channels', value)
    if layout == 'official' and causal:
        raise ValueError("causal must be False with layout='official': the official code's windows are centred in "
                         "time")


def check_arguments(*, image_size, image_patch_size, frames, frame_patch_size, num_classes, dim, spatial_depth,
                    temporal_depth, heads, mlp_dim, pool, channels, dim_head, dropout, emb_dropout, use_flash_attn,
                    moss_local_time, moss_local_height, moss_local_width, moss_hidden_dim, moss_orders, moss_causal,
                    moss_layout, moss_official_channels):
    vivit.check_arguments(image_size=image_size, image_patch_size=image_patch_size, frames=frames,
                          frame_patch_size=frame_patch_size, num_classes=num_classes, dim=dim,
                          spatial_depth=spatial_depth, temporal_depth=temporal_depth, heads=heads, mlp_dim=mlp_dim,
                          pool=pool, channels=channels, dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout,
                          variant='factorized_encoder', use_flash_attn=use_flash_attn)
    try:
        check_moss_arguments(dim=dim, local_time=moss_local_time, local_height=moss_local_height,
                             local_width=moss_local_width, hidden_dim=moss_hidden_dim, orders=moss_orders,
                             causal=moss_causal, layout=moss_layout, official_channels=moss_official_channels)
    except (TypeError, ValueError) as error:
        raise type(error)(f"moss_{error}") from None


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `vivit_with_moss.ViViT`: our names; its tokens and position table carry a leading batch axis.
    Refused for causal time with a cls token, where vit-pytorch's logits do not depend on the video, and for the
    official layout, which has other weights and computes another function."""
    if model.moss.layout != 'vit_pytorch':
        raise ValueError(f"vit-pytorch's vivit_with_moss.ViViT has vit-pytorch's MOSS; this model was built with "
                         f"moss_layout={model.moss.layout!r} (the official code's MOSS block, other weights and "
                         f"another function): build it with moss_layout='vit_pytorch' (the default)")
    if model.moss.causal and model.pool == 'cls':
        raise ValueError(
            "vit-pytorch's vivit_with_moss.ViViT with moss_causal=True and pool='cls' reads a temporal cls token "
            "that causal attention lets attend to itself only, so its logits do not depend on the video; this "
            "model's cls token attends to every slice and computes another function (pool='mean' or "
            "moss_causal=False load with equal outputs)"
        )
    return vivit.vit_pytorch_plan(model, keys)
