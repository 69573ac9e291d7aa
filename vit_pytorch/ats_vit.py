"""ViT with Adaptive Token Sampling: vit-pytorch's `vit_pytorch.ats_vit.ViT`.

"ATS: Adaptive Token Sampling For Efficient Vision Transformers", Fayyaz et al., arXiv 2111.15667:
a layer scores every patch token by how much the cls token reads from it, its cls attention (summed
over heads) times the norm of its value vector, normalised to a distribution over the patches; it
then keeps an inverse-transform sample of K of them (K evenly spaced points read through the scores'
cumulative distribution, as in the official code), duplicates removed. Only the kept tokens (and the cls token)
go on: a layer keeps at most K, fewer for an image whose scores are concentrated. The sampler has no
parameters. `max_tokens_per_depth` gives K for each layer (None: a plain layer, with no sampler). A layer with
no more patch tokens than its K keeps them all (vit-pytorch's rule), unless `always_sample=True`: then it samples
all the same, min(K, patch tokens) points, duplicates dropped, as the official code does at its budget.

    import torch
    from vit_pytorch.ats_vit import ViT

    model = ViT(image_size=64, patch_size=8, num_classes=10, dim=64, depth=4,
                max_tokens_per_depth=(64, 32, 16, 8), heads=4, mlp_dim=128)
    logits, token_ids = model(torch.randn(2, 3, 64, 64), return_sampled_token_ids=True)   # (2, 10), (2, 8)

`token_ids` holds, for each image, the patches (row-major, from 0) the last layer kept, in ascending
order, then -1 for each slot left empty.

The arguments, parameter names and return values are vit-pytorch's (1.26.14). The sampler has no parameters, so
its weights are a plain ViT's and `load_state_dict` takes them; `vit_pytorch.pretrained.load_vit_pytorch` loads
a vit-pytorch checkpoint only into a model in which no layer samples (every K at least the patch count,
`always_sample=False`), where the two compute the same function, and refuses it, naming the difference, where a
layer samples. Where ours differs, it follows the paper (and its official code, github.com/adaptivetokensampling/ATS):
  - `always_sample=True` (ours only; default False, vit-pytorch's rule) makes a layer sample even where its
    n - 1 patch tokens are no more than its K, as the official code does (its `forward` caps n_tokens at the
    token count and samples); a test checks a layer at K = n - 1 against the official sampler's fixture, where 12
    points over 12 patches keep 7, 7 and 2 of them. `max_tokens_per_depth` may hold None: a layer with no sampler
    (vit-pytorch takes ints only).
  - the sample is the paper's deterministic inverse transform sampling of the sorted scores, as the official
    sampler computes it for a budget of K (its `inverse_transform_sampling` with n_tokens = n_ref_tokens = K + 1;
    a test checks the kept tokens against its own on a fixture): the cumulative scores min-max normalised (the
    least significant token at 0), K points evenly from the least non-zero value to 1, each picking the token of
    the nearest value among the K most significant, duplicates dropped. (The official configurations pass the
    first layer's token count as n_ref_tokens to every layer, which samples 196 points at 224 pixels whatever the
    layer's budget; vit-pytorch's `max_tokens_per_depth` is a budget per layer, so ours takes K points.) A model
    is a function of its input, in training and evaluation alike; vit-pytorch draws a Gumbel-max sample instead,
    a different random set of tokens on every call. A
    layer that samples therefore keeps other tokens than vit-pytorch's; where no layer samples (every K
    at least the patch count) the two give the same output (a test checks it on a vit-pytorch fixture).
  - the score is the official code's: the heads' cls attention summed, times the norm of the whole value
    vector (all heads); vit-pytorch weighs each head's attention by that head's value norm.
  - the score reads the attention before dropout (vit-pytorch's after it; the same without dropout).
  - every sampling layer keeps K slots (min(K, n - 1) with `always_sample`; static shapes: `torch.export` and
    `torch.compile` follow it); a duplicate's slot is left empty: masked out of every later attention, id -1.
    vit-pytorch pads the batch to its largest count of distinct tokens.
Only the kept tokens' queries are computed in a sampling layer (vit-pytorch forms all n rows of the
attention matrix and then gathers K + 1).

`ats_vit('DeiT-S', max_tokens)` builds the official configuration (`CONFIGS`, from the official
configs/ImageNet/DeiT_S.yaml: DeiT-S, ATS in layers 3 to 11, counted from 0, each with a budget of 197 tokens, the cls
token among them): layers 0 to 2 plain (None), the ATS layers keeping at most `max_tokens` patch tokens, with
`always_sample=True`. Its default, the official budget less the cls token, is 196, as many as the patches at 224
pixels: each ATS layer then samples 196 points over its 196 slots, duplicates dropped, as the official code does (a
test checks that layers 3 to 11 sample, 0 to 2 do not, and that fewer than 196 patches are kept on a random image
with random weights). A smaller `max_tokens` samples fewer points. Its parameters are the official model's
(22,050,664, timm's DeiT-S's too) without the 12 layers' qkv biases (-13,824) and with the patch embedding's two
LayerNorms (+2,304): 22,039,144.
"""

import math

import torch
import torch.nn.functional as F
from einops import rearrange, reduce, repeat
from torch import nn

from vit_pytorch import vit


class AdaptiveTokenSampling(nn.Module):
    """The sampler: from the cls token's attention and the values, K patch tokens to keep (parameter-free).

    `forward(cls_attention, values)` takes the cls row of the attention (b, heads, n) (the cls token first)
    and the values (b, heads, n, dim_head); it returns `ids` (b, k), the positions (1 .. n-1) of the sampled
    patch tokens, and `keep` (b, k), False where a slot repeats the token before it; k = min(K, n - 1).
    """

    def __init__(self, output_num_tokens, eps=1e-6):
        super().__init__()
        self.output_num_tokens = output_num_tokens
        self.eps = eps

    def forward(self, cls_attention, values):
        value_norms = rearrange(values[:, :, 1:], 'b h n d -> b n (h d)').norm(dim=-1)
        scores = reduce(cls_attention[..., 1:], 'b h n -> b n', 'sum') * value_norms
        sorted_scores, order = scores.sort(dim=-1)
        cdf = sorted_scores.cumsum(dim=-1)
        # the official code's normalisation: the least significant token at 0, the whole at 1
        cdf = (cdf - cdf[:, :1]) / (cdf[:, -1:] - cdf[:, :1]).clamp_min(self.eps)
        # k = min(K, n - 1) points (the official code caps its budget at the token count) evenly from the least
        # non-zero value of the normalised distribution to 1 (all at 1 where there is none), each picking the token
        # of the nearest value among the k most significant (the official code compares the points with these only);
        # not searchsorted, which ONNX lacks
        k = min(self.output_num_tokens, cdf.shape[-1])
        start = cdf.masked_fill(cdf == 0, float('inf')).amin(dim=-1, keepdim=True).clamp_max(1.)
        points = start + (1 - start) * torch.linspace(0, 1, k, device=cdf.device, dtype=cdf.dtype)
        candidates = cdf[:, -k:]
        picks = (rearrange(points, 'b k -> b k 1') - rearrange(candidates, 'b n -> b 1 n')).abs().argmin(dim=-1)
        picks = picks + (cdf.shape[-1] - k)
        # the points rise, so repeated picks are neighbours: keep each token's first slot
        keep = F.pad(picks[:, 1:] != picks[:, :-1], (1, 0), value=True)
        return order.gather(-1, picks) + 1, keep


class Attention(vit.Attention):
    """The core attention, with adaptive token sampling when `output_num_tokens` (K) is set.

    `forward(x, mask)` takes the tokens (b, n, dim) and which of them are real (b, n; None: all) and returns
    (output, mask, ids): where the layer samples (n - 1 > K, or with `always_sample` wherever K is set), the output
    is the attention output of the cls token and the k = min(K, n - 1) sampled tokens (b, 1 + k, dim), `ids`
    (b, 1 + k) their positions in `x` (the cls token's 0) and `mask` which of them are kept; elsewhere the output
    of every token and `ids` None. The recorded map of a sampling layer is (b, heads, 1 + k, n): the kept tokens'
    queries over every key.
    """

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., output_num_tokens=None, *, always_sample=False):
        # vit-pytorch's ATS layer always projects its output, even one head as wide as the model
        super().__init__(dim, heads, dim_head, dropout,
                         to_out=nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(dropout)))
        self.output_num_tokens = output_num_tokens
        self.always_sample = always_sample
        self.ats = None if output_num_tokens is None else AdaptiveTokenSampling(output_num_tokens)

    def samples(self, num_tokens):
        """Whether the layer samples from `num_tokens` tokens (the cls token among them)."""
        return self.ats is not None and (self.always_sample or num_tokens - 1 > self.output_num_tokens)

    def forward(self, x, *, mask=None):
        q, k, v = self.qkv(x)
        key_mask = None if mask is None else rearrange(mask, 'b n -> b 1 1 n')
        ids = None
        if self.samples(x.shape[1]):
            cls_dots = q[:, :, :1] @ k.transpose(-1, -2) * self.scale             # (b, h, 1, n)
            if key_mask is not None:
                cls_dots = cls_dots.masked_fill(~key_mask, float('-inf'))
            sampled, keep = self.ats(cls_dots.softmax(dim=-1)[:, :, 0], v)
            ids = F.pad(sampled, (1, 0), value=0)
            kept = F.pad(keep, (1, 0), value=True)
            mask = kept if mask is None else kept & mask.gather(1, ids)
            q = q.gather(2, repeat(ids, 'b n -> b h n d', h=q.shape[1], d=q.shape[-1]))
        out = self.attend(q, k, v, mask=key_mask)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)')), mask, ids


class Transformer(vit.Stack):
    """vit-pytorch's ATS encoder: `depth` pre-norm layers, the i-th keeping at most `max_tokens_per_depth[i]` patch
    tokens (None: a plain layer, no sampler), no final norm. `forward(x)` returns (tokens, token_ids): the tokens the
    last layer kept (b, n', dim) and their positions in the input (b, n'; -1 for an empty slot, the cls token's 0)."""

    def __init__(self, dim, depth, max_tokens_per_depth, heads, dim_head, mlp_dim, dropout=0., *,
                 always_sample=False):
        super().__init__([(Attention(dim, heads, dim_head, dropout, output_num_tokens=tokens,
                                     always_sample=always_sample),
                           vit.FeedForward(dim, mlp_dim, dropout))
                          for tokens in max_tokens_per_depth])

    def step(self, entry, x, state):
        attn, ff = entry
        out, mask, ids = attn(x, mask=state.get('mask'))
        entries = {}
        if ids is not None:
            token_ids = state.get('token_ids')
            token_ids = ids if token_ids is None else token_ids.gather(1, ids)
            x = x.gather(1, repeat(ids, 'b n -> b n d', d=x.shape[-1]))
            entries = dict(mask=mask, token_ids=token_ids)
        x = out + x
        return ff(x) + x, entries

    def forward(self, x, *, return_layers=False):
        tokens, outputs, state = self.run(x, keep_layers=return_layers)
        token_ids = state.get('token_ids')
        if token_ids is None:
            token_ids = repeat(torch.arange(x.shape[1], device=x.device), 'n -> b n', b=x.shape[0])
        else:
            token_ids = token_ids.masked_fill(~state['mask'], -1)
        return ((tokens, token_ids), outputs) if return_layers else (tokens, token_ids)


class ViT(vit.TokenFace, vit.NormedHead, nn.Module):
    """ViT whose layers keep an adaptive sample of the patch tokens; see the module's docstring.

    `always_sample=True` (keyword-only, ours; default False, vit-pytorch's rule) makes every layer with a K sample,
    even where its patch tokens are no more than K: min(K, patch tokens) points, duplicates dropped, as many slots.

    `forward(img, return_sampled_token_ids=False)` returns the logits (b, num_classes), and with
    `return_sampled_token_ids=True` also the patches the last layer kept (b, K), ascending, -1 for an empty slot
    (K: the slots of the last layer that sampled, min(its max_tokens_per_depth entry, the tokens it read); every
    patch where none did).
    `forward_features` returns the last layer's tokens (not normed), (b, 1 + K, dim), the cls token first; an empty
    slot holds a copy of a kept token that no other token attends to. `num_classes=0` makes `forward` return the
    pooled embedding after the head's norm, (b, dim).
    """

    num_prefix_tokens = 1
    pool = 'cls'

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, max_tokens_per_depth, heads, mlp_dim,
                 channels=3, dim_head=64, dropout=0., emb_dropout=0., always_sample=False):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.channels, self.num_classes, self.embed_dim, self.num_features = channels, num_classes, dim, dim
        self.max_tokens_per_depth, self.always_sample = tuple(max_tokens_per_depth), always_sample

        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim)
        self.pos_embedding = nn.Parameter(torch.randn(1, math.prod(self.grid_size) + 1, dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.dropout = nn.Dropout(emb_dropout)
        self.transformer = Transformer(dim, depth, self.max_tokens_per_depth, heads, dim_head, mlp_dim, dropout,
                                       always_sample=always_sample)
        self.to_latent = nn.Identity()
        self.mlp_head = nn.Sequential(nn.LayerNorm(dim), *([nn.Linear(dim, num_classes)] if num_classes > 0 else []))

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def embed(self, img):
        """The cls token and the patch tokens, with positions: (b, 1 + h * w, dim)."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.pos_embedding.dtype)
        x = self.to_patch_embedding(img)
        x = torch.cat((repeat(self.cls_token, '1 1 d -> b 1 d', b=x.shape[0]), x), dim=1)
        return self.dropout(x + self.pos_embedding)

    def forward_features(self, img):
        """The last layer's tokens (not normed): (b, 1 + kept slots, dim)."""
        return self.transformer(self.embed(img))[0]

    def forward(self, img, return_sampled_token_ids=False):
        tokens, token_ids = self.transformer(self.embed(img))
        logits = self.forward_head(tokens)
        if not return_sampled_token_ids:
            return logits
        empty = token_ids[:, 1:] < 0
        patch_ids = (token_ids[:, 1:] - 1).masked_fill(empty, -1)
        # ascending, the empty slots (-1) last, as vit-pytorch orders them
        order = patch_ids.masked_fill(empty, math.prod(self.grid_size)).argsort(dim=-1)
        return logits, patch_ids.gather(1, order)

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# the paper's models (the official configs/ImageNet/<name>.yaml): name -> (dim, depth, heads, the ATS layers (from 0),
# the token budget of each, the cls token counted); patches of 16, MLP ratio 4
CONFIGS = {'DeiT-S': (384, 12, 6, range(3, 12), 197)}


def ats_vit(variant, max_tokens=None, *, image_size=224, num_classes=1000, **overrides):
    """The paper's `variant` (a key of CONFIGS) with ATS in its ATS layers; keyword arguments override the table.

    max_tokens: the patch tokens each ATS layer keeps at most (its K); None gives the official budget, 197 tokens less
                the cls token: 196, every patch at 224 pixels.
    The ATS layers sample as the official code does, even where K is at least their patch tokens
    (`always_sample=True`: min(K, n - 1) points, duplicates dropped); the other layers are plain layers, with no
    sampler (None in `max_tokens_per_depth`). `max_tokens_per_depth` or `always_sample` in `overrides` replace these.
    """
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, depth, heads, ats_layers, budget = CONFIGS[variant]
    k = budget - 1 if max_tokens is None else vit.positive_int('max_tokens', max_tokens)
    config = {**dict(image_size=image_size, patch_size=16, num_classes=num_classes, dim=dim, depth=depth, heads=heads,
                     dim_head=dim // heads, mlp_dim=4 * dim, always_sample=True), **overrides}
    if 'max_tokens_per_depth' not in config:
        layers = range(vit.positive_int('depth', config['depth']))
        config['max_tokens_per_depth'] = tuple(k if i in ats_layers else None for i in layers)
    return ViT(**config)


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, max_tokens_per_depth, heads, mlp_dim,
                    channels, dim_head, dropout, emb_dropout, always_sample):
    vit.check_patches(image_size, patch_size)
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                    channels=channels, dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout)
    vit.boolean('always_sample', always_sample)
    if not isinstance(max_tokens_per_depth, (tuple, list)):
        raise TypeError(f"max_tokens_per_depth must be a tuple of {depth} token counts (or None), one per layer, "
                        f"got {type(max_tokens_per_depth).__name__} {max_tokens_per_depth!r}")
    counts = [value for value in max_tokens_per_depth if value is not None]
    for value in counts:
        vit.positive_int('every entry of max_tokens_per_depth (None: a layer without a sampler)', value)
    if len(max_tokens_per_depth) != depth:
        raise ValueError(f"max_tokens_per_depth must have one entry per layer (depth={depth}), got "
                         f"{len(max_tokens_per_depth)}: {tuple(max_tokens_per_depth)}")
    if counts != sorted(counts, reverse=True):
        raise ValueError(f"max_tokens_per_depth must not increase from layer to layer among its token counts (a "
                         f"layer cannot keep tokens an earlier one dropped), got {tuple(max_tokens_per_depth)}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `ats_vit.ViT` has our parameter names and its sampler no parameters, so its checkpoint loads
    where no layer of `model` samples (every K at least the patch count, `always_sample=False`): the two compute
    the same function there. A model in which a layer samples is refused: vit-pytorch's sampling is another
    function (see the module's docstring)."""
    # some layer samples iff one would at the full token count: the first that samples receives every token
    patches = math.prod(model.grid_size)
    if any(attention.samples(1 + patches) for attention, _ in model.transformer.layers):
        raise ValueError(
            f"vit-pytorch's ATS samples other tokens than the paper's: a Gumbel-max draw from each head's cls "
            f"attention weighed by that head's value norms, a new random set on every call, where this ViT takes the "
            f"official code's deterministic inverse transform sample of the summed cls attention times the whole "
            f"value norm; with max_tokens_per_depth={model.max_tokens_per_depth} and always_sample="
            f"{model.always_sample} over {patches} patches a layer here samples, so the checkpoint would compute "
            f"another function. It loads into a model whose layers do not sample (every entry at least {patches}, "
            f"always_sample=False), where the two agree")
    return None
