"""Swin Transformer and Swin Transformer V2.

"Swin Transformer: Hierarchical Vision Transformer using Shifted Windows", Liu et al., arXiv 2103.14030:
attend only within non-overlapping windows of the token map, shift the windows by half a window in
every other block so that neighbouring windows talk, and halve the map between stages by merging 2x2
tokens, so that the cost grows linearly with the image and the stages give a feature pyramid as a
CNN's do. A learned bias indexed by the relative position of query and key replaces position
embeddings.

"Swin Transformer V2: Scaling Up Capacity and Resolution", Liu et al., arXiv 2111.09883, section 3:
residual post-norm (each branch's output is normed before it joins the residual stream), scaled
cosine attention (cosine similarity of query and key times a learned per-head scale, capped at 100)
and a log-spaced continuous position bias (a small MLP of log-scaled relative coordinates, so that
the bias carries over to other window sizes).

    import torch
    from vit_pytorch.swin import SwinTransformer, SwinTransformerV2, swin_tiny_patch4_window7_224

    model = SwinTransformer(img_size=64, patch_size=4, num_classes=10, embed_dim=32, depths=(2, 2),
                            num_heads=(2, 4), window_size=4)
    logits = model(torch.randn(2, 3, 64, 64))                    # (2, 10)
    maps = model.forward_intermediates(torch.randn(2, 3, 64, 64))  # (2, 32, 16, 16), (2, 64, 8, 8)

    v2 = SwinTransformerV2(img_size=64, num_classes=10, embed_dim=32, depths=(2, 2), num_heads=(2, 4),
                           window_size=4)
    paper_model = swin_tiny_patch4_window7_224()                 # Swin-T, 28,288,354 parameters

The arguments and the computation are timm's (`timm.models.swin_transformer.SwinTransformer` and
`swin_transformer_v2.SwinTransformerV2`, timm 1.0.31), whose checkpoints load with
`vit_pytorch.pretrained.load_timm`; vit-pytorch has no Swin. Where it follows timm rather than a
clean reading of the paper:
  - a stage whose map is no larger than the window uses the map as its window and does not shift;
  - a map that the windows do not divide is zero-padded at its bottom and right after the cyclic
    shift (after the block's LayerNorm in V1), and the padding tokens are keys like any other;
  - the mask between tokens that the shift brought together adds -100 to their logits rather than
    -inf (the official code's value; in V2 a logit can reach 116, so the mask there is soft);
  - window size and shift are fixed at construction from `img_size`: with `dynamic_img_size=True`
    other sizes are padded to those windows, and `img_size` should be the size you mostly use.
"""

import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import multiscale, vit

CPB_HIDDEN = 512     # width of V2's continuous position bias MLP (the paper's code)
MAX_LOGIT_SCALE = math.log(100.)   # V2's cap on the cosine-attention scale (section 3.2)

# helpers


def stage_resolutions(grid, num_stages):
    """(h, w) token map of each stage: the patch grid, then halved (rounding up) by each merging."""
    sizes = [tuple(grid)]
    for _ in range(num_stages - 1):
        sizes.append(tuple((side + 1) // 2 for side in sizes[-1]))
    return sizes


def window_and_shift(resolution, window_size):
    """A stage's window and shift: the map itself, unshifted, along an axis the window covers whole."""
    window = tuple(min(side, size) for side, size in zip(resolution, window_size))
    shift = tuple(0 if side <= size else size // 2 for side, size in zip(resolution, window_size))
    return window, shift


def query_minus_key_index(window):
    """(n, n) index of query i and key j's relative position (dy, dx) = query minus key, the layout of the
    reference's tables: the transpose of the shared key-minus-query index."""
    return multiscale.relative_position_index(window).t().contiguous()


def log_spaced_coordinates(window, pretrained_window):
    """V2's ((2 wh - 1) (2 ww - 1), 2) relative coordinates, scaled to [-8, 8] by the (pretraining)
    window and log-spaced: sign(x) log2(1 + |x|) / log2(8) (Swin V2, eq. 4)."""
    reference = pretrained_window if pretrained_window[0] > 0 else window
    axes = [torch.arange(-(size - 1), size, dtype=torch.float32, device='cpu') / max(ref - 1, 1)
            for size, ref in zip(window, reference)]
    coords = torch.stack(torch.meshgrid(*axes, indexing='ij'), dim=-1) * 8   # (2 wh - 1, 2 ww - 1, 2)
    coords = torch.sign(coords) * torch.log2(coords.abs() + 1.0) / math.log2(8)
    return rearrange(coords, 'h w two -> (h w) two')


def attend_windows(attention, q, k, v, *, scale, mask):
    """`vit.attend` with the module's switches (the position bias is part of the mask)."""
    return vit.attend(q, k, v, scale=scale, mask=mask, fused=attention.fused,
                      dropout=attention.dropout if attention.training else 0., probs=attention.attention_probs)


def merge_heads(out):
    """(b * windows, heads, n, d) -> (b * windows, n, heads * d). While exporting, by an explicit copy: torch 2.13's
    ONNX exporter decomposes scaled_dot_product_attention with a batched mask (a shifted window's) into a kernel
    whose output strides differ from the traced ones, and a reshape traced as a view then fails ("Cannot view a
    tensor with shape ...", pytorch issue 136543). In eager mode the reshape stays a view wherever it can be."""
    if torch.compiler.is_exporting():
        out = out.transpose(1, 2).clone(memory_format=torch.contiguous_format)
        return rearrange(out, 'b n h d -> b n (h d)')
    return rearrange(out, 'b h n d -> b n (h d)')


# classes


class WindowAttention(vit.Attention):
    """Swin's (shifted) window attention with a learned relative position bias, pre-norm: (b, h, w, dim) ->
    (b, h, w, dim).

    The normed map is cut into windows (`multiscale.ShiftedWindows`); each window attends within itself,
    softmax(q k^T / sqrt(d) + B + mask) v, with B[i, j] read from a learned ((2 wh - 1) (2 ww - 1),
    heads) table at the relative position of query i and key j (Swin, section 3.2). The recorded
    map is (b * windows, heads, wh * ww, wh * ww).
    """

    def __init__(self, dim, heads, dim_head, dropout=0., *, window_size, shift_size, feature_size, qkv_bias=True,
                 proj_dropout=0.):
        super().__init__(dim, heads, dim_head, dropout, qkv_bias=qkv_bias,
                         to_out=nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(proj_dropout)))
        self.windows = multiscale.ShiftedWindows(window_size, shift_size, feature_size)
        height, width = self.windows.window_size
        self.relative_position_bias_table = nn.Parameter(torch.empty((2 * height - 1) * (2 * width - 1), heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.register_buffer('relative_position_index', multiscale.built_on_cpu(query_minus_key_index((height, width))),
                             persistent=False)

    def qkv(self, windows):
        return rearrange(self.to_qkv(windows), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=self.heads)

    def position_bias(self):
        """(heads, n, n): the table read at each (query, key) pair's relative position."""
        return self.relative_position_bias_table.t()[:, self.relative_position_index]

    def forward(self, x):
        windows = self.windows.split(self.norm(x))                   # (b * windows, n, dim)
        mask = self.windows.attention_mask(self.position_bias(), x.shape[0], x.shape[1:3])
        out = attend_windows(self, *self.qkv(windows), scale=self.scale, mask=mask)
        return self.windows.merge(self.to_out(merge_heads(out)), x.shape[1:3])


class CosineWindowAttention(nn.Module):
    """Swin V2's (shifted) window attention, without a norm (the block norms its output): (b, h, w, dim)
    -> (b, h, w, dim).

    softmax(cos(q, k) * min(exp(logit_scale), 100) + 16 sigmoid(B) + mask) v within each window, B
    from an MLP of the log-spaced relative coordinates (Swin V2, section 3.2-3.3). The query and value
    projections have a bias, the key projection none. The recorded map is (b * windows, heads, wh * ww,
    wh * ww).
    """

    def __init__(self, dim, heads, dropout=0., *, window_size, shift_size, feature_size, qkv_bias=True,
                 proj_dropout=0., pretrained_window_size=(0, 0)):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.fused = True
        self.windows = multiscale.ShiftedWindows(window_size, shift_size, feature_size)

        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias else None
        self.v_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias else None
        self.logit_scale = nn.Parameter(torch.full((heads, 1, 1), math.log(10.)))
        self.cpb_mlp = nn.Sequential(nn.Linear(2, CPB_HIDDEN), nn.ReLU(), nn.Linear(CPB_HIDDEN, heads, bias=False))
        coordinates = log_spaced_coordinates(self.windows.window_size, pretrained_window_size)
        self.register_buffer('relative_coordinates', multiscale.built_on_cpu(coordinates), persistent=False)
        self.register_buffer('relative_position_index', multiscale.built_on_cpu(query_minus_key_index(self.windows.window_size)),
                             persistent=False)
        self.attention_probs = nn.Identity()
        self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(proj_dropout))

    def qkv(self, windows):
        bias = None if self.q_bias is None else torch.cat((self.q_bias, torch.zeros_like(self.q_bias), self.v_bias))
        return rearrange(F.linear(windows, self.to_qkv.weight, bias), 'b n (qkv h d) -> qkv b h n d',
                         qkv=3, h=self.heads)

    def position_bias(self):
        """(heads, n, n): 16 sigmoid of the MLP's bias at each (query, key) pair's relative position."""
        table = self.cpb_mlp(self.relative_coordinates)              # ((2 wh - 1) (2 ww - 1), heads)
        return 16 * torch.sigmoid(table.t()[:, self.relative_position_index])

    def forward(self, x):
        q, k, v = self.qkv(self.windows.split(x))
        scale = torch.clamp(self.logit_scale, max=MAX_LOGIT_SCALE).exp()
        q, k = F.normalize(q, dim=-1) * scale, F.normalize(k, dim=-1)
        mask = self.windows.attention_mask(self.position_bias(), x.shape[0], x.shape[1:3])
        out = attend_windows(self, q, k, v, scale=1., mask=mask)
        return self.windows.merge(self.to_out(merge_heads(out)), x.shape[1:3])


class PatchMerging(nn.Module):
    """(b, h, w, dim) -> (b, ceil(h / 2), ceil(w / 2), out_dim): each 2x2 neighbourhood's tokens
    concatenated (the map zero-padded to even sides), normed and projected (V1) or projected and
    normed (V2, `post_norm=True`)."""

    def __init__(self, dim, out_dim, *, post_norm=False):
        super().__init__()
        self.post_norm = post_norm
        self.norm = nn.LayerNorm(out_dim if post_norm else 4 * dim)
        self.reduction = nn.Linear(4 * dim, out_dim, bias=False)

    def forward(self, x):
        height, width = x.shape[1:3]
        x = F.pad(x, (0, 0, 0, width % 2, 0, height % 2))
        # channels ordered (column offset, row offset, c), as the reference concatenates them
        x = rearrange(x, 'b (h p1) (w p2) c -> b h w (p2 p1 c)', p1=2, p2=2)
        return self.norm(self.reduction(x)) if self.post_norm else self.reduction(self.norm(x))


class SwinStage(nn.Module):
    """Patch merging (none in the first stage), then the stage's blocks."""

    def __init__(self, downsample, blocks):
        super().__init__()
        self.downsample = nn.Identity() if downsample is None else downsample
        self.blocks = blocks

    def forward(self, x):
        return self.blocks(self.downsample(x))


class Swin(nn.Module):
    """What Swin V1 and V2 share: a patch embedding, stages of shifted-window blocks with patch merging
    between them, a final norm and an average-pooled head. `block` builds one block's (attention,
    feedforward) residual branches, `merging` a stage's patch merging."""

    num_prefix_tokens = 0

    def __init__(self, *, img_size, patch_size, in_chans, num_classes, embed_dim, depths, num_heads, window_size,
                 drop_rate, drop_path_rate, dynamic_img_size, block, merging):
        super().__init__()
        self.img_size, self.patch_size = vit.pair(img_size), vit.pair(patch_size)
        self.in_chans, self.num_classes = in_chans, num_classes
        self.dynamic_img_size = dynamic_img_size
        num_stages = len(depths)
        num_heads = (num_heads,) * num_stages if isinstance(num_heads, int) else tuple(num_heads)
        dims = [embed_dim * 2 ** i for i in range(num_stages)]
        self.num_features = dims[-1]

        self.to_patch_embedding = vit.PatchEmbedding(channels=in_chans, patch_size=self.patch_size, dim=embed_dim,
                                                     patch_norm=False)
        self.patch_norm = nn.LayerNorm(embed_dim)

        # stochastic depth grows linearly over all blocks, from 0 to drop_path_rate (the official code)
        rates = multiscale.drop_path_rates(drop_path_rate, sum(depths))
        resolutions = stage_resolutions(vit.patch_grid(self.img_size, self.patch_size), num_stages)
        stages = []
        for i, (depth, dim, heads, resolution) in enumerate(zip(depths, dims, num_heads, resolutions)):
            window, shift = window_and_shift(resolution, vit.pair(window_size))
            blocks = [block(dim=dim, heads=heads, stage=i, window_size=window, feature_size=resolution,
                            shift_size=shift if j % 2 else (0, 0), drop_path=rates[sum(depths[:i]) + j])
                      for j in range(depth)]
            stages.append(SwinStage(merging(dims[i - 1], dim) if i > 0 else None, vit.Stack(blocks)))
        self.stages = nn.ModuleList(stages)
        self.feature_info = [dict(num_chs=dim, reduction=max(self.patch_size) * 2 ** i, module=f'stages.{i}')
                             for i, dim in enumerate(dims)]

        self.norm = nn.LayerNorm(self.num_features)
        self.dropout = nn.Dropout(drop_rate)
        self.mlp_head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else None
        self.apply(vit.init_linear_weights)

    def embed(self, img):
        """The checked image's normed patch embeddings on their grid: (b, h, w, embed_dim)."""
        grid = vit.check_images(img, channels=self.in_chans, patch_size=self.patch_size,
                                dtype=self.patch_norm.weight.dtype)
        if not self.dynamic_img_size and tuple(img.shape[-2:]) != self.img_size:
            raise ValueError(f"img must be {self.img_size[0]}x{self.img_size[1]} (h x w), the model's img_size, got "
                             f"{img.shape[-2]}x{img.shape[-1]}; build the model with dynamic_img_size=True for "
                             f"other sizes divisible by patch_size {self.patch_size}")
        return rearrange(self.patch_norm(self.to_patch_embedding(img)), 'b (h w) d -> b h w d', h=grid[0], w=grid[1])

    def forward_features(self, img):
        """The last stage's map after the final norm: (b, h, w, num_features), as timm's."""
        x = self.embed(img)
        for stage in self.stages:
            x = stage(x)
        return self.norm(x)

    def forward_head(self, x, pre_logits=False):
        """Average the map; return the pooled embedding (b, num_features), or the logits."""
        x = self.dropout(x.mean(dim=(1, 2)))
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, img):
        """Logits (b, num_classes); with num_classes=0 the pooled embedding (b, num_features), as timm's."""
        return self.forward_head(self.forward_features(img))

    def forward_intermediates(self, img, indices=None):
        """Each chosen stage's output map before the final norm, (b, c, h, w) with `feature_info`'s channels
        and stride: indices None for every stage, an int n for the last n, or a list of stage numbers."""
        chosen = vit.take_indices(indices, len(self.stages))
        x, maps = self.embed(img), []
        for i, stage in enumerate(self.stages[:max(chosen) + 1]):
            x = stage(x)
            if i in chosen:
                maps.append(rearrange(x, 'b h w c -> b c h w'))
        return [maps[sorted(set(chosen)).index(i)] for i in chosen]

    def attention_on_grid(self, maps, image_size, stage=0):
        """One stage's recorded window maps as attention over its whole token map, for the pictures.

        `maps` are the Recorder's maps of one call on images of `image_size` (every block's, in
        order). Returns ((b, blocks, heads, h * w, h * w), (h, w)): each block's windows placed
        at their tokens' row-major positions on the stage's unshifted map, zero between windows
        and for the padding, so that `vit_pytorch.analysis`' rollout and attention distance apply.
        """
        index = vit.take_indices([stage], len(self.stages))[0]
        size = stage_resolutions(vit.patch_grid(tuple(image_size), self.patch_size), len(self.stages))[index]
        depths = [len(other.blocks.layers) for other in self.stages]
        if len(maps) != sum(depths):
            raise ValueError(f"maps must be the {sum(depths)} maps of one call (one per block), got {len(maps)}")
        attentions = [module for module in self.stages[index].modules()
                      if isinstance(module, (WindowAttention, CosineWindowAttention))]
        full = []
        for attention, window_maps in zip(attentions, maps[sum(depths[:index]):]):
            positions = attention.windows.token_positions(size).to(window_maps.device)   # (windows, n)
            per_window = rearrange(window_maps, '(b w) h i j -> b h w i j', w=positions.shape[0])
            tokens = size[0] * size[1]
            grid_maps = per_window.new_zeros(*per_window.shape[:2], tokens + 1, tokens + 1)  # the last: padding
            grid_maps[:, :, positions[:, :, None], positions[:, None, :]] = per_window
            full.append(grid_maps[..., :tokens, :tokens])
        return torch.stack(full, dim=1), size

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.norm.weight)

    def no_weight_decay(self):
        """Names of the parameters timm trains without weight decay (its optimizer factory asks for them):
        V1's bias tables, V2's position-bias MLPs and logit scales."""
        return {name for name, _ in self.named_parameters()
                if any(part in name for part in ('relative_position_bias_table', 'cpb_mlp', 'logit_scale'))}

    def set_grad_checkpointing(self, enable=True):
        for stage in self.stages:
            stage.blocks.grad_checkpointing = enable


class SwinTransformer(Swin):
    """Swin Transformer (V1) with timm's keyword arguments.

    img_size           the image size the windows are laid out for; other sizes need dynamic_img_size.
    patch_size         side of the square (or (h, w)) patches embedded by a linear map.
    in_chans           input channels.
    num_classes        0: `forward` returns the pooled embedding (b, num_features).
    embed_dim          width of the first stage; each merging doubles it.
    depths, num_heads  blocks and heads of each stage (num_heads: one int for every stage, or one each).
    window_size        side (or (h, w)) of the attention windows.
    mlp_ratio          feedforward width over the block width.
    qkv_bias           bias on the query/key/value projection.
    drop_rate          dropout before the head; proj_drop_rate after the attention projection and in
                       the feedforward; attn_drop_rate on the attention weights.
    drop_path_rate     stochastic depth of the last block, growing linearly from 0 in the first.
    dynamic_img_size   accept any image size divisible by patch_size (maps padded to whole windows).

    Recorder layout: one map per block, in stage and block order, of shape (b * windows, heads,
    wh * ww, wh * ww) where the windows of a block tile its (cyclically shifted, padded) map in
    row-major order, batch outermost, and (wh, ww) is the stage's window (the map itself where it
    is smaller than `window_size`); with different shapes per stage the Recorder returns a list.

    `forward_features` returns the last stage's map after the final norm, (b, h, w, num_features), as timm's.
    `num_classes=0` makes `forward` return the pooled embedding (b, num_features).
    """

    def __init__(self, *, img_size=224, patch_size=4, in_chans=3, num_classes=1000, embed_dim=96,
                 depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7, mlp_ratio=4., qkv_bias=True,
                 drop_rate=0., proj_drop_rate=0., attn_drop_rate=0., drop_path_rate=0.1, dynamic_img_size=False):
        check_arguments(**vit.arguments(locals()))

        def block(*, dim, heads, stage, window_size, shift_size, feature_size, drop_path):
            attention = WindowAttention(dim, heads, dim // heads, attn_drop_rate, window_size=window_size,
                                        shift_size=shift_size, feature_size=feature_size, qkv_bias=qkv_bias,
                                        proj_dropout=proj_drop_rate)
            feedforward = vit.FeedForward(dim, int(dim * mlp_ratio), proj_drop_rate)
            return multiscale.DropPath(attention, drop_path), multiscale.DropPath(feedforward, drop_path)

        super().__init__(img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=num_classes,
                         embed_dim=embed_dim, depths=depths, num_heads=num_heads, window_size=window_size,
                         drop_rate=drop_rate, drop_path_rate=drop_path_rate, dynamic_img_size=dynamic_img_size,
                         block=block, merging=PatchMerging)


class SwinTransformerV2(Swin):
    """Swin Transformer V2 with timm's keyword arguments: those of `SwinTransformer`, and

    pretrained_window_sizes  per stage, the window (int or (h, w)) the position-bias MLP was trained
                             with, which scales the relative coordinates (0: the stage's own window);
                             None: 0 for every stage.

    Each block is x + norm(attention(x)), x + norm(feedforward(x)) (residual post-norm); the norms
    start at zero, so every block starts as the identity (the reference's initialisation). The
    recorder layout is `SwinTransformer`'s.

    `forward_features` returns the last stage's map after the final norm, (b, h, w, num_features), as timm's.
    `num_classes=0` makes `forward` return the pooled embedding (b, num_features).
    """

    def __init__(self, *, img_size=256, patch_size=4, in_chans=3, num_classes=1000, embed_dim=96,
                 depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=8, mlp_ratio=4., qkv_bias=True,
                 drop_rate=0., proj_drop_rate=0., attn_drop_rate=0., drop_path_rate=0.1, dynamic_img_size=False,
                 pretrained_window_sizes=None):
        check_v2_arguments(**vit.arguments(locals()))
        pretrained = [vit.pair(size) for size in pretrained_window_sizes or (0,) * len(depths)]

        def block(*, dim, heads, stage, window_size, shift_size, feature_size, drop_path):
            attention = CosineWindowAttention(dim, heads, attn_drop_rate, window_size=window_size,
                                              shift_size=shift_size, feature_size=feature_size, qkv_bias=qkv_bias,
                                              proj_dropout=proj_drop_rate, pretrained_window_size=pretrained[stage])
            hidden = int(dim * mlp_ratio)
            feedforward = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(proj_drop_rate),
                                        nn.Linear(hidden, dim), nn.Dropout(proj_drop_rate))
            return (multiscale.DropPath(nn.Sequential(attention, zero_layer_norm(dim)), drop_path),
                    multiscale.DropPath(nn.Sequential(feedforward, zero_layer_norm(dim)), drop_path))

        def merging(dim, out_dim):
            return PatchMerging(dim, out_dim, post_norm=True)

        super().__init__(img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=num_classes,
                         embed_dim=embed_dim, depths=depths, num_heads=num_heads, window_size=window_size,
                         drop_rate=drop_rate, drop_path_rate=drop_path_rate, dynamic_img_size=dynamic_img_size,
                         block=block, merging=merging)


def zero_layer_norm(dim):
    """A LayerNorm whose weight and bias start at zero (V2's residual post-norm)."""
    norm = nn.LayerNorm(dim)
    nn.init.zeros_(norm.weight)
    return norm


# the papers' models: name -> (embed_dim, depths, num_heads); patch 4, MLP ratio 4 (Swin Table 1 / V2 Table 1)
CONFIGS = {
    'tiny': (96, (2, 2, 6, 2), (3, 6, 12, 24)),
    'small': (96, (2, 2, 18, 2), (3, 6, 12, 24)),
    'base': (128, (2, 2, 18, 2), (4, 8, 16, 32)),
    'large': (192, (2, 2, 18, 2), (6, 12, 24, 48)),
}


def swin(variant, *, version=1, img_size=224, window_size=7, **overrides):
    """The paper's Swin (`version=1`) or Swin V2 (`version=2`) `variant`, a key of CONFIGS; keyword
    arguments of the class override anything."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    if version not in (1, 2):
        raise ValueError(f"version must be 1 (Swin) or 2 (Swin V2), got {version!r}")
    embed_dim, depths, num_heads = CONFIGS[variant]
    cls = SwinTransformer if version == 1 else SwinTransformerV2
    return cls(**{**dict(img_size=img_size, window_size=window_size, embed_dim=embed_dim, depths=depths,
                         num_heads=num_heads), **overrides})


def swin_tiny_patch4_window7_224(**kwargs):
    return swin('tiny', **kwargs)


def swin_small_patch4_window7_224(**kwargs):
    return swin('small', **kwargs)


def swin_base_patch4_window7_224(**kwargs):
    return swin('base', **kwargs)


def swin_base_patch4_window12_384(**kwargs):
    return swin('base', **{'img_size': 384, 'window_size': 12, **kwargs})


def swin_large_patch4_window7_224(**kwargs):
    return swin('large', **kwargs)


def swin_large_patch4_window12_384(**kwargs):
    return swin('large', **{'img_size': 384, 'window_size': 12, **kwargs})


def swinv2_tiny_window8_256(**kwargs):
    return swin('tiny', version=2, **{'img_size': 256, 'window_size': 8, **kwargs})


def swinv2_tiny_window16_256(**kwargs):
    return swin('tiny', version=2, **{'img_size': 256, 'window_size': 16, **kwargs})


def swinv2_small_window8_256(**kwargs):
    return swin('small', version=2, **{'img_size': 256, 'window_size': 8, **kwargs})


def swinv2_small_window16_256(**kwargs):
    return swin('small', version=2, **{'img_size': 256, 'window_size': 16, **kwargs})


def swinv2_base_window8_256(**kwargs):
    return swin('base', version=2, **{'img_size': 256, 'window_size': 8, **kwargs})


def swinv2_base_window16_256(**kwargs):
    return swin('base', version=2, **{'img_size': 256, 'window_size': 16, **kwargs})


# argument checks


def check_arguments(*, img_size, patch_size, in_chans, num_classes, embed_dim, depths, num_heads, window_size,
                    mlp_ratio, qkv_bias, drop_rate, proj_drop_rate, attn_drop_rate, drop_path_rate, dynamic_img_size):
    image = vit.positive_pair('img_size', img_size)
    patch = vit.positive_pair('patch_size', patch_size)
    if image[0] % patch[0] or image[1] % patch[1]:
        raise ValueError(f"img_size {img_size!r} must be divisible by patch_size {patch_size!r} in height and width")
    vit.positive_int('in_chans', in_chans)
    vit.non_negative_int('num_classes', num_classes)
    vit.positive_int('embed_dim', embed_dim)
    if not isinstance(depths, (list, tuple)) or not depths:
        raise TypeError(f"depths must be a non-empty tuple of blocks per stage, got {depths!r}")
    for depth in depths:
        vit.positive_int('depths', depth)
    if isinstance(num_heads, (list, tuple)):
        if len(num_heads) != len(depths):
            raise ValueError(f"num_heads must give one head count per stage ({len(depths)} stages in depths), "
                             f"got {num_heads!r}")
        heads = list(num_heads)
    else:
        heads = [num_heads] * len(depths)
    for i, count in enumerate(heads):
        vit.positive_int('num_heads', count)
        if embed_dim * 2 ** i % count:
            raise ValueError(f"num_heads {count} must divide stage {i}'s width embed_dim * 2**{i} = "
                             f"{embed_dim * 2 ** i}")
    vit.positive_pair('window_size', window_size)
    vit.positive_float('mlp_ratio', mlp_ratio)
    if int(embed_dim * mlp_ratio) < 1:
        raise ValueError(f"mlp_ratio {mlp_ratio} leaves embed_dim {embed_dim} a feedforward of width 0")
    vit.boolean('qkv_bias', qkv_bias)
    vit.boolean('dynamic_img_size', dynamic_img_size)
    for name, value in dict(drop_rate=drop_rate, proj_drop_rate=proj_drop_rate, attn_drop_rate=attn_drop_rate,
                            drop_path_rate=drop_path_rate).items():
        vit.probability(name, value)


def check_v2_arguments(*, pretrained_window_sizes, **kwargs):
    check_arguments(**kwargs)
    if pretrained_window_sizes is None:
        return
    if not isinstance(pretrained_window_sizes, (list, tuple)) or len(pretrained_window_sizes) != len(kwargs['depths']):
        raise ValueError(f"pretrained_window_sizes must give one window per stage ({len(kwargs['depths'])} stages in "
                         f"depths), 0 for none, got {pretrained_window_sizes!r}")
    for size in pretrained_window_sizes:
        for side in vit.pair(size):
            vit.non_negative_int('pretrained_window_sizes', side)


# loading checkpoints


def _linear_from_conv(weight):
    # timm's patch embedding is a Conv2d (d, c, p1, p2); ours a Linear over patches flattened as (p1 p2 c)
    return rearrange(weight, 'd c p1 p2 -> d (p1 p2 c)')


def _same(tensor):
    return tensor


V1_BLOCK = {'0.fn.norm.': 'norm1.', '0.fn.to_qkv.': 'attn.qkv.', '0.fn.to_out.0.': 'attn.proj.',
            '0.fn.relative_position_bias_table': 'attn.relative_position_bias_table',
            '1.fn.net.0.': 'norm2.', '1.fn.net.1.': 'mlp.fc1.', '1.fn.net.4.': 'mlp.fc2.'}
V2_BLOCK = {'0.fn.0.to_qkv.': 'attn.qkv.', '0.fn.0.q_bias': 'attn.q_bias', '0.fn.0.v_bias': 'attn.v_bias',
            '0.fn.0.logit_scale': 'attn.logit_scale', '0.fn.0.cpb_mlp.': 'attn.cpb_mlp.',
            '0.fn.0.to_out.0.': 'attn.proj.', '0.fn.1.': 'norm1.',
            '1.fn.0.0.': 'mlp.fc1.', '1.fn.0.3.': 'mlp.fc2.', '1.fn.1.': 'norm2.'}


def timm_plan(model, keys):
    """timm's `SwinTransformer` (`swin_*`) -> SwinTransformer, `SwinTransformerV2` (`swinv2_*`) ->
    SwinTransformerV2.

    Names differ, values do not, except the patch embedding (timm's Conv2d is our Linear). The
    checkpoint's window must be the model's (V1's bias tables have its size); V2's position-bias
    MLP fits any window (set pretrained_window_sizes to the checkpoint's).
    """
    v2 = isinstance(model, SwinTransformerV2)
    if any(key.endswith('relative_position_index') or key.endswith('attn_mask') for key in keys) \
            or 'layers.0.downsample.reduction.weight' in keys:
        raise ValueError("this is the original Microsoft layout (patch merging at the end of each stage, index and "
                         "mask buffers saved); timm's layout is expected: load the file into timm's model (which "
                         "converts it) and save its state_dict")
    # the version and the bias are read from Swin's attention keys; a file without them is not told
    # to change an option (the loader says that it holds another model's weights)
    attention = [key for key in keys if key.startswith('layers.0.blocks.0.attn.')]
    if attention and v2 != any('cpb_mlp' in key for key in attention):
        theirs, ours = ('Swin V2', 'SwinTransformer') if not v2 else ('Swin V1', 'SwinTransformerV2')
        right = 'SwinTransformerV2' if not v2 else 'SwinTransformer'
        raise ValueError(f"the checkpoint is a {theirs} model, this is a {ours}: load it into {right}")
    bias_key = 'layers.0.blocks.0.attn.q_bias' if v2 else 'layers.0.blocks.0.attn.qkv.bias'
    has_bias = bias_key in keys
    state = model.state_dict()
    ours_bias = any(key.endswith('q_bias' if v2 else 'to_qkv.bias') for key in state)
    if attention and has_bias != ours_bias:
        raise ValueError(f"build the model with qkv_bias={has_bias} (the checkpoint's attention "
                         f"{'has' if has_bias else 'has no'} qkv bias)")
    names = {'to_patch_embedding.2.bias': 'patch_embed.proj.bias', 'patch_norm.': 'patch_embed.norm.',
             'norm.': 'norm.', 'mlp_head.': 'head.fc.'}
    for i, stage in enumerate(model.stages):
        names[f'stages.{i}.downsample.'] = f'layers.{i}.downsample.'
        for j in range(len(stage.blocks.layers)):
            for ours, theirs in (V2_BLOCK if v2 else V1_BLOCK).items():
                names[f'stages.{i}.blocks.layers.{j}.{ours}'] = f'layers.{i}.blocks.{j}.{theirs}'
    weight = state['to_patch_embedding.2.weight']
    plan = {'to_patch_embedding.2.weight': (
        {'patch_embed.proj.weight': (weight.shape[0], model.in_chans, *model.patch_size)}, _linear_from_conv)}
    for key, tensor in state.items():
        if key in plan:
            continue
        prefix = next((prefix for prefix in names if key.startswith(prefix)), None)
        if prefix is None:
            raise ValueError(f"timm's Swin has no counterpart of {key}")
        plan[key] = ({names[prefix] + key[len(prefix):]: tuple(tensor.shape)}, _same)
    return plan, ('head.',)
