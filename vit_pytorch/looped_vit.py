"""Looped ViT: a block of shared layers run again and again, with deep supervision and an adaptive exit.

"Looped Diffusion Transformer", arXiv 2609.40305, as a classifier: the encoder is a few layers before the loop
(`pre_loop_depth`), a block of `num_looped_blocks` layers run `loop_depth` times with the same weights, and a few
layers after it (`post_loop_depth`) that decode the stream into the logits. Depth becomes a dial: more loops cost
compute but no parameters, and a model trained with 4 loops can run with 8. Deep supervision decodes the stream after
every loop (`return_all_logits=True`: one row of logits a loop) and trains them all (`deep_supervision_loss`, the last
loop weighted 1, the earlier ones together 1 by default). An exit gate (`adaptive_loop=True`), learned queries
attending over the decoded tokens, predicts after each loop the largest gain in loss per further loop
(`adaptive_exit_targets`, trained by regression); at inference `adaptive_exit=True` stops after the first loop where
that predicted gain is at most `exit_threshold` for every image of the batch.

    import torch
    import torch.nn.functional as F
    from vit_pytorch import LoopedViT
    from vit_pytorch.looped_vit import adaptive_exit_targets, deep_supervision_loss

    model = LoopedViT(image_size=32, patch_size=8, num_classes=10, dim=64, heads=4, dim_head=16, mlp_dim=128,
                      pre_loop_depth=1, num_looped_blocks=2, post_loop_depth=1, loop_depth=3, adaptive_loop=True)
    img, labels = torch.randn(2, 3, 32, 32), torch.tensor([3, 7])
    logits, benefits = model(img, return_all_logits=True, return_exit_benefits=True)   # (3, 2, 10), (2, 2)
    loss = deep_supervision_loss(logits, labels) + F.mse_loss(benefits, adaptive_exit_targets(logits, labels))
    loss.backward()
    deeper = model(img, loop_depth=6)                                 # (2, 10): six loops, the same weights
    early = model(img, adaptive_exit=True, exit_threshold=0.05)      # (2, 10)

As vit-pytorch 1.26.14, whose checkpoints load unchanged (same keys, same outputs): inputs of 1 to 7 spatial
dimensions (`input_shape`, or `image_size` for images), a cls token, and vit-pytorch's attention: each head's output
with its component along the token's own value removed (exclusive self-attention), times a sigmoid gate per head and
token; `num_classes=0` returns the pooled embedding (its Identity head). Where it differs: bad arguments are refused
by name where vit-pytorch asserts, and `forward_intermediates` gives the stream after each loop.

The paper's released sizes are `CONFIGS`, built by `looped_vit('B/16')` ('B/32', 'B/16', 'L/16': the official
code's widths, heads, SwiGLU width as `mlp_dim`, (6, 5, 6) or (8, 7, 8) layers and 4 loops, 512-pixel images). The
official model is a text-to-image MMDiT, not this classifier: it has a text stream, RMSNorm, query/key norms, rotary
positions and SwiGLU MLPs, applies XSA in the looped blocks only, and XSA or the gate (its released models: XSA
alone, the gate with a bias); its 'exponential' weighting is scaled to sum to 2 as the others, vit-pytorch's (and
so this module's) is not (docs/blocks.md).
"""

import re
from math import prod

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit

AXES = 'fghijkl'


# deep supervision


def final_weights(loops):
    return torch.cat((torch.zeros(loops - 1), torch.ones(1)))


def exponential_weights(loops):
    return 2. ** (torch.arange(loops) - (loops - 1))


def final_mean_weights(loops):
    return torch.cat((torch.full((loops - 1,), 1. / max(loops - 1, 1)), torch.ones(1)))


# each loop's weight in the deep supervision loss: only the last, halving backwards from the last, or the last at 1
# and the earlier ones sharing 1
WEIGHTINGS = dict(final=final_weights, exponential=exponential_weights, final_mean=final_mean_weights)


def deep_supervision_weights(num_loops, weighting='final_mean'):
    """(num_loops,) weights of the loops' losses: a name of WEIGHTINGS, or one number a loop."""
    if isinstance(weighting, str):
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {sorted(WEIGHTINGS)} or one weight a loop, got {weighting!r}")
        return WEIGHTINGS[weighting](num_loops)
    weights = torch.as_tensor(weighting, dtype=torch.float32)
    if weights.shape != (num_loops,):
        raise ValueError(f"weighting must give one weight for each of the {num_loops} loops, got shape "
                         f"{tuple(weights.shape)}")
    return weights


def per_loop_losses(logits, labels, label_smoothing=0.):
    """(loops, b) cross-entropies of logits (loops, b, classes) (or (b, classes): one loop) against labels (b,) or
    class probabilities (b, classes) (mixup's soft targets)."""
    if logits.ndim == 2:
        logits = logits[None]
    loops = logits.shape[0]
    losses = F.cross_entropy(rearrange(logits, 'l b c -> (l b) c'), repeat(labels, 'b ... -> (l b) ...', l=loops),
                             reduction='none', label_smoothing=label_smoothing)
    return rearrange(losses, '(l b) -> l b', l=loops)


def deep_supervision_loss(logits, labels, weighting='final_mean', label_smoothing=0.):
    """The batch mean of sum_l w_l CE(logits_l, labels); plain cross-entropy for one loop's (b, classes)."""
    if logits.ndim == 2:
        return F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
    losses = per_loop_losses(logits, labels, label_smoothing)
    weights = deep_supervision_weights(logits.shape[0], weighting).to(losses)
    return (losses * weights[:, None]).sum(dim=0).mean()


@torch.no_grad()
def adaptive_exit_targets(logits, labels, label_smoothing=0.):
    """The exit gate's targets, (loops - 1, b): after loop r, the largest gain in loss per further loop,
    max over k > r of max(0, (L_r - L_k) / (k - r)); 0 means no later loop is better."""
    loops = logits.shape[0]
    if loops < 2:
        raise ValueError(f"adaptive exit targets need the logits of at least 2 loops, got {loops}")
    losses = per_loop_losses(logits, labels, label_smoothing)
    index = torch.arange(loops, device=losses.device)
    steps = (index[None, :] - index[:, None])[..., None]                     # (r, k, 1): k - r
    gains = (losses[:, None] - losses[None, :]) / steps.clamp(min=1)         # (r, k, b)
    gains = torch.where(steps > 0, gains, torch.zeros_like(gains))
    return gains.clamp(min=0.).amax(dim=1)[:-1]


# blocks


class Attention(vit.Attention):
    """vit-pytorch's looped-ViT attention: each head's attended values minus their component along the token's own
    (unit) value, times sigmoid(Linear(normed x)) per head and token, then a bias-free output projection."""

    def __init__(self, dim, heads=8, dim_head=64, dropout=0.):
        super().__init__(dim, heads, dim_head, dropout,
                         to_out=nn.Sequential(nn.Linear(heads * dim_head, dim, bias=False), nn.Dropout(dropout)))
        self.to_gate = nn.Linear(dim, heads, bias=False)

    def forward(self, x):
        normed = self.norm(x)
        q, k, v = rearrange(self.to_qkv(normed), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=self.heads)
        out = self.attend(q, k, v)
        own = F.normalize(v, dim=-1)
        out = out - (out * own).sum(dim=-1, keepdim=True) * own               # exclusive self-attention
        out = out * rearrange(self.to_gate(normed).sigmoid(), 'b n h -> b h n 1')
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


def transformer(dim, depth, heads, dim_head, mlp_dim, dropout):
    """vit-pytorch's looped-ViT `Transformer`: `depth` (Attention, FeedForward) layers, no final norm."""
    return vit.Stack([(Attention(dim, heads, dim_head, dropout), vit.FeedForward(dim, mlp_dim, dropout))
                      for _ in range(depth)])


class AdaptiveLoopGate(nn.Module):
    """The exit gate: `num_queries` learned queries a head attend over the decoded tokens; their mean, through an
    MLP, is the predicted gain of looping on, (b, n, dim) -> (b,). The recorder sees (b, heads, num_queries, n)."""

    def __init__(self, dim, heads=8, dim_head=64, num_queries=4, mlp_mult=2, dropout=0.):
        super().__init__()
        self.heads, self.scale, self.dropout, self.fused = heads, dim_head ** -0.5, dropout, True
        self.queries = nn.Parameter(torch.randn(heads, num_queries, dim_head) * dim_head ** -0.5)
        self.norm_kv = nn.LayerNorm(dim)
        self.to_kv = nn.Linear(dim, heads * dim_head * 2, bias=False)
        self.attention_probs = nn.Identity()
        self.to_out = nn.Linear(heads * dim_head, dim, bias=False)
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim * mlp_mult), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(dim * mlp_mult, 1), Rearrange('b 1 -> b'))

    def forward(self, x):
        k, v = rearrange(self.to_kv(self.norm_kv(x)), 'b n (kv h d) -> kv b h n d', kv=2, h=self.heads)
        q = repeat(self.queries, 'h q d -> b h q d', b=x.shape[0])
        out = vit.attend(q, k, v, scale=self.scale, dropout=self.dropout if self.training else 0., fused=self.fused,
                         probs=self.attention_probs)
        return self.mlp(self.to_out(rearrange(out, 'b h q d -> b q (h d)')).mean(dim=1))


class LoopedViT(nn.Module):
    """vit-pytorch's LoopedViT: patches of an input of 1 to 7 spatial dimensions, a cls token and a learned position
    table, `pre_loop` layers, the `looped` layers run `loop_depth` times, then `post_loop` layers and a LayerNorm
    (`decode`), pooled by the cls token or the mean of the patches (`pool`).

    `forward(x, loop_depth=None, return_all_logits=False, return_exit_benefits=False, adaptive_exit=False,
    exit_threshold=None)`: the logits after the last loop, (b, num_classes); `return_all_logits` gives every loop's,
    (loops, b, num_classes); `return_exit_benefits` adds the exit gate's predictions after every loop but the last,
    (loops - 1, b); `adaptive_exit` stops after the first loop whose predictions are all at most the threshold.
    `forward_features` returns the decoded tokens after the last loop, (b, 1 + patches, dim); `forward_intermediates`
    the stream after each loop, (b, 1 + patches, dim). `num_classes=0` makes `forward` return the pooled embedding.
    """

    num_prefix_tokens = 1

    def __init__(self, *, num_classes, dim, ndim=2, input_shape=None, patch_size=None, image_size=None,
                 pre_loop_depth=6, num_looped_blocks=5, post_loop_depth=6, loop_depth=4,
                 deep_supervision_weighting='final_mean', pool='cls', heads=8, dim_head=64, mlp_dim=2048, channels=3,
                 dropout=0., emb_dropout=0., adaptive_loop=False, exit_threshold=0.):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        input_shape = image_size if input_shape is None else input_shape
        ndim = len(input_shape) if isinstance(input_shape, (tuple, list)) else ndim
        self.input_shape, self.patch_size = per_axis(input_shape, ndim), per_axis(patch_size, ndim)
        self.channels, self.num_classes, self.embed_dim, self.num_features = channels, num_classes, dim, dim
        self.pool, self.loop_depth, self.exit_threshold = pool, loop_depth, exit_threshold
        self.register_buffer('loop_weights', deep_supervision_weights(loop_depth, deep_supervision_weighting),
                             persistent=False)

        axes = AXES[:ndim]
        cut = ' '.join(f'({axis} p{i})' for i, axis in enumerate(axes))
        within = ' '.join(f'p{i}' for i in range(ndim))
        self.to_patch_embedding = nn.Sequential(
            Rearrange(f"b c {cut} -> b ({' '.join(axes)}) ({within} c)",
                      **{f'p{i}': size for i, size in enumerate(self.patch_size)}),
            nn.Linear(channels * prod(self.patch_size), dim),
            nn.LayerNorm(dim))
        self.grid_size = tuple(side // patch for side, patch in zip(self.input_shape, self.patch_size))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.randn(1, prod(self.grid_size) + 1, dim))
        self.dropout = nn.Dropout(emb_dropout)

        self.pre_loop = transformer(dim, pre_loop_depth, heads, dim_head, mlp_dim, dropout)
        self.looped = transformer(dim, num_looped_blocks, heads, dim_head, mlp_dim, dropout)
        self.post_loop = transformer(dim, post_loop_depth, heads, dim_head, mlp_dim, dropout)
        self.norm = nn.LayerNorm(dim)
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()
        self.exit_gate = AdaptiveLoopGate(dim, heads, dim_head, dropout=dropout) if adaptive_loop else None

    @property
    def feature_info(self):
        """One entry a loop (the stream after it), `loop_depth` of them."""
        reduction = self.patch_size[0] if len(set(self.patch_size)) == 1 else self.patch_size
        return [dict(num_chs=self.embed_dim, reduction=reduction, module='looped')
                for _ in range(self.loop_depth)]

    def token_grid(self, image_size):
        return tuple(side // patch for side, patch in zip(image_size, self.patch_size))

    def embed(self, x):
        """The checked input's patch tokens after the cls token, with positions, through the pre-loop layers."""
        check_input(x, channels=self.channels, input_shape=self.input_shape, dtype=self.pos_embedding.dtype)
        x = self.to_patch_embedding(x)
        x = torch.cat((repeat(self.cls_token, '1 1 d -> b 1 d', b=x.shape[0]), x), dim=1)
        return self.pre_loop(self.dropout(x + self.pos_embedding))

    def decode(self, x):
        """The stream after a loop through the post-loop layers and the norm: (b, 1 + patches, dim)."""
        return self.norm(self.post_loop(x))

    def forward_features(self, x, loop_depth=None):
        """The decoded tokens after the last of `loop_depth` loops: (b, 1 + patches, dim)."""
        x = self.embed(x)
        for _ in range(check_loop_depth(self.loop_depth if loop_depth is None else loop_depth)):
            x = self.looped(x)
        return self.decode(x)

    def forward_head(self, tokens, pre_logits=False):
        """The cls token (or the mean of the patch tokens), then the head."""
        x = tokens[:, 1:].mean(dim=1) if self.pool == 'mean' else tokens[:, 0]
        return x if pre_logits else self.mlp_head(x)

    def forward_intermediates(self, x, indices=None, *, output='tokens'):
        """The stream after each loop (before decoding): indices None for every loop, an int n for the last n, or a
        list of loop numbers; (b, 1 + patches, dim) each, or with output='maps' the patches on their grid (images:
        (b, dim, h, w))."""
        if output not in ('tokens', 'maps'):
            raise ValueError(f"output must be 'tokens' or 'maps', got {output!r}")
        chosen = vit.take_indices(indices, self.loop_depth, what='loop')
        x, streams = self.embed(x), []
        for _ in range(self.loop_depth):
            x = self.looped(x)
            streams.append(x)
        streams = [streams[i] for i in chosen]
        if output == 'maps':
            axes = ' '.join(AXES[:len(self.grid_size)])
            return [rearrange(s[:, 1:], f'b ({axes}) d -> b d {axes}',
                              **dict(zip(AXES, self.grid_size))) for s in streams]
        return streams

    def forward(self, x, loop_depth=None, return_all_logits=False, return_exit_benefits=False, adaptive_exit=False,
                exit_threshold=None):
        loops = check_loop_depth(self.loop_depth if loop_depth is None else loop_depth)
        threshold = self.exit_threshold if exit_threshold is None else exit_threshold
        gated = adaptive_exit or return_exit_benefits
        if gated:
            check_exit_gate(self, loops)
        x = self.embed(x)
        logits, benefits = [], []
        for loop in range(loops):
            x = self.looped(x)
            last = loop == loops - 1
            if not (last or gated or return_all_logits):
                continue                       # decode a loop only when it is supervised, gated or the last
            decoded = self.decode(x)
            logits.append(self.forward_head(decoded))
            if last or not gated:
                continue
            benefit = self.exit_gate(decoded)                                 # (b,)
            benefits.append(benefit)
            if adaptive_exit and bool(benefit.max() <= threshold):
                break
        logits = torch.stack(logits) if return_all_logits else logits[-1]
        return (logits, torch.stack(benefits)) if return_exit_benefits else logits

    def training_loss(self, logits, labels, label_smoothing=0., exit_benefits=None, exit_gate_loss_weight=1.):
        """The deep supervision loss of `forward(x, return_all_logits=True)`'s logits (loops, b, num_classes), each
        loop's cross-entropy weighted as `deep_supervision_weighting` says, plus, given the exit gate's predictions
        `exit_benefits` (loops - 1, b) (`return_exit_benefits=True`), `exit_gate_loss_weight` times their mean
        squared error to `adaptive_exit_targets` of the same logits and label smoothing (vit-pytorch 1.26.14's
        example adds that error with weight 1): what the training command trains on with --deep-supervision (and
        --exit-gate-loss-weight for a model built with adaptive_loop=True)."""
        loss = deep_supervision_loss(logits, labels, self.loop_weights, label_smoothing)
        if exit_benefits is None:
            return loss
        vit.finite_number('exit_gate_loss_weight', exit_gate_loss_weight, 'at least 0')
        if exit_gate_loss_weight < 0:
            raise ValueError(f"exit_gate_loss_weight must be at least 0, got {exit_gate_loss_weight}")
        targets = adaptive_exit_targets(logits, labels, label_smoothing)
        if exit_benefits.shape != targets.shape:
            raise ValueError(f"exit_benefits must have shape {tuple(targets.shape)} (loops - 1, b: one prediction "
                             f"after every loop but the last), got {tuple(exit_benefits.shape)}")
        return loss + exit_gate_loss_weight * F.mse_loss(exit_benefits, targets)

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.pos_embedding, removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        for stack in (self.pre_loop, self.looped, self.post_loop):
            stack.grad_checkpointing = enable


# The paper's models, as the official code releases them (OpenSenseNova/Looped-DiT, configs/{b32,b16,l16}_pretrain.yml
# and the LoopedMMDiT they build; tests/fixtures/make_looped_vit_official_fixtures.py): size -> (dim, heads, dim_head,
# mlp_dim, (pre-loop, looped, post-loop) layers), every one looped LOOPS times, on IMAGE_SIZE-pixel images. mlp_dim is
# the width of the official SwiGLU (int(hidden_size * mlp_ratio) rounded up to a multiple of 8).
CONFIGS = {'B': (768, 12, 64, 2048, (6, 5, 6)), 'L': (1248, 24, 52, 3376, (8, 7, 8))}
LOOPS = 4
IMAGE_SIZE = 512


def looped_vit(variant, *, image_size=IMAGE_SIZE, num_classes=1000, **overrides):
    """The paper's Looped-DiT `variant`, a key of CONFIGS and a patch size ('B/32', 'B/16', 'L/16'), as this
    classifier; keyword arguments override the table."""
    match = re.fullmatch(r'(.+)/([1-9][0-9]*)', variant) if isinstance(variant, str) else None
    if match is None or match[1] not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, a slash and a patch size, as 'B/16', "
                         f"got {variant!r}")
    dim, heads, dim_head, mlp_dim, (pre, looped, post) = CONFIGS[match[1]]
    kwargs = dict(image_size=image_size, patch_size=int(match[2]), num_classes=num_classes, dim=dim, heads=heads,
                  dim_head=dim_head, mlp_dim=mlp_dim, pre_loop_depth=pre, num_looped_blocks=looped,
                  post_loop_depth=post, loop_depth=LOOPS)
    return LoopedViT(**{**kwargs, **overrides})


def per_axis(value, ndim):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * ndim


# argument checks


def check_arguments(*, num_classes, dim, ndim, input_shape, patch_size, image_size, pre_loop_depth,
                    num_looped_blocks, post_loop_depth, loop_depth, deep_supervision_weighting, pool, heads, dim_head,
                    mlp_dim, channels, dropout, emb_dropout, adaptive_loop, exit_threshold):
    shape = image_size if input_shape is None else input_shape
    if shape is None:
        raise ValueError("input_shape (or image_size) must be given: the input's size, an int or one a dimension")
    if isinstance(shape, (tuple, list)):
        ndim = len(shape)
    elif isinstance(ndim, bool) or not isinstance(ndim, int) or not 1 <= ndim <= 7:
        raise ValueError(f"ndim must be an int from 1 to 7 (the input's spatial dimensions), got {ndim!r}")
    if not 1 <= ndim <= 7:
        raise ValueError(f"{'image_size' if input_shape is None else 'input_shape'} must have 1 to 7 dimensions, got {shape!r}")
    if patch_size is None:
        raise ValueError("patch_size must be given: an int or one a dimension")
    if isinstance(patch_size, (tuple, list)) and len(patch_size) != ndim:
        raise ValueError(f"patch_size must have one size for each of the {ndim} dimensions, got {patch_size!r}")
    shape_name = 'image_size' if input_shape is None else 'input_shape'
    for name, values in ((shape_name, per_axis(shape, ndim)), ('patch_size', per_axis(patch_size, ndim))):
        for value in values:
            vit.positive_int(name, value)
    if any(side % patch for side, patch in zip(per_axis(shape, ndim), per_axis(patch_size, ndim))):
        raise ValueError(f"{shape_name} {shape!r} must be divisible by patch_size {patch_size!r} in every dimension")
    for name, value in dict(dim=dim, num_looped_blocks=num_looped_blocks, loop_depth=loop_depth, heads=heads,
                            dim_head=dim_head, mlp_dim=mlp_dim, channels=channels).items():
        vit.positive_int(name, value)
    vit.non_negative_int('pre_loop_depth', pre_loop_depth)
    vit.non_negative_int('post_loop_depth', post_loop_depth)
    vit.non_negative_int('num_classes', num_classes)
    if pool not in ('cls', 'mean'):
        raise ValueError(f"pool must be 'cls' (the cls token) or 'mean' (mean of the patches), got {pool!r}")
    vit.probability('dropout', dropout)
    vit.probability('emb_dropout', emb_dropout)
    vit.boolean('adaptive_loop', adaptive_loop)
    vit.finite_number('exit_threshold', exit_threshold, 'a gain in loss per loop, at least 0')
    if exit_threshold < 0:
        raise ValueError(f"exit_threshold must be at least 0 (a gain in loss per loop), got {exit_threshold}")
    deep_supervision_weights(loop_depth, deep_supervision_weighting)


def check_loop_depth(loop_depth):
    vit.positive_int('loop_depth', loop_depth)
    return loop_depth


def check_exit_gate(model, loops):
    if model.exit_gate is None:
        raise ValueError("adaptive_exit and return_exit_benefits need the exit gate: build the model with "
                         "adaptive_loop=True")
    if loops < 2:
        raise ValueError(f"adaptive_exit and return_exit_benefits need loop_depth of at least 2, got {loops}")


def check_input(x, *, channels, input_shape, dtype):
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating point torch.Tensor, got {type(x).__name__}"
                        f"{'' if not isinstance(x, torch.Tensor) else ' of dtype ' + str(x.dtype)}")
    if x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"x has dtype {x.dtype} but the model's parameters are {dtype}; convert with x.to({dtype})")
    expected = ('b', channels, *input_shape)
    if x.ndim != len(expected) or x.shape[1] != channels or tuple(x.shape[2:]) != input_shape:
        raise ValueError(f"x must have shape {expected} (the model's channels and input_shape), got "
                         f"{tuple(x.shape)}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's LoopedViT has our parameter names and computes the same function."""
    return None
