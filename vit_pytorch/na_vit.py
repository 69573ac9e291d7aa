"""NaViT: a Vision Transformer for any aspect ratio and resolution.

"Patch n' Pack: NaViT, a Vision Transformer for any Aspect Ratio and Resolution", Dehghani et al.,
arXiv 2307.06304: instead of resizing every image to one square size, cut each image at its own
size into patches and pack the patch sequences of several images into one sequence (Patch n'
Pack). A mask keeps every token's attention inside its own image, positions are two learned
tables (one for the row, one for the column: factorised, so any grid up to `image_size` has
them), a random share of each image's tokens can be dropped while training (token dropping),
and each image is pooled on its own (attention pooling with a per-image mask).

    import torch
    from vit_pytorch.na_vit import NaViT

    model = NaViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16,
                  mlp_dim=2048, token_dropout_prob=0.1)
    images = [torch.randn(3, 256, 256), torch.randn(3, 128, 128), torch.randn(3, 128, 256),
              torch.randn(3, 64, 256)]
    logits = model(images)                                               # (4, 1000), in input order
    logits = model(images, group_images=True, group_max_seq_len=64)      # packed into sequences of <= 64 tokens
    logits = model([[images[0]], [images[1], images[2], images[3]]])     # or packed by hand

The arguments, the parameters and the function are vit-pytorch's (1.26.14) `NaViT`: LayerNorms
without a bias, queries and keys normalised per head (RMS, a learned gain per head and channel,
no 1/sqrt(dim_head) scale), attention pooling by one learned query per image, then a LayerNorm
and a bias-free classifier. Its checkpoints load with `vit_pytorch.pretrained.load_vit_pytorch`.

How the images are laid out for attention (`packing`):
  'varlen' (default)  every image attends within its own tokens: the tokens of all images form one
                      sequence sorted by length, and images of one length are batched into one
                      `scaled_dot_product_attention` call; nothing is padded and no attention is
                      computed across images. The fastest on a CPU (benchmarks/na_vit_packing.py).
  'mask'              the paper's packing: the images of each group become one sequence, padded to
                      the longest, and a block-diagonal boolean mask goes to the fused attention.
Both give the same logits (tests/test_na_vit.py); the grouping (`group_images`, lists of lists)
decides the layout of 'mask' and changes nothing in 'varlen'. A (b, c, h, w) tensor is b images
of one size, each its own sequence, without a mask.

Recorded attention (`vit_pytorch.recorder.Recorder`): per layer, then for the pooling, one map
per attention call: with 'mask', (sequences, heads, n, n) over the padded packed sequences
(zero between images) and (sequences, heads, images per sequence, n) for the pooling; with
'varlen', (images of that length, heads, l, l) for each length in increasing order, and
(images, heads, 1, l) for the pooling; for a tensor batch (b, heads, h * w, h * w).

Known differences from vit-pytorch: a (b, c, h, w) tensor is one sequence per image (vit-pytorch
packs the whole batch into one sequence; the logits are the same); grouping counts exactly the
tokens that token dropping keeps (at least one per image); images larger than `image_size` are
refused with an error naming them; the LayerNorms are `nn.LayerNorm(bias=False)`, so their
parameter is `weight` (vit-pytorch's `gamma`, beside an all-zero `beta` buffer). The paper's
fractional positions and resolution sampling are not here: sample the sizes in the data.
torch.compile: pass `dynamic=False`; each new set of image sizes is compiled anew.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from vit_pytorch import vit
from vit_pytorch.vit import attend_segments, grid_positions, kept_tokens  # noqa: F401  (their old home)

# helpers


def group_images_by_max_seq_len(images, *, patch_size, max_seq_len, token_dropout=None):
    """Greedy packing: consecutive images go into one group until the next would exceed `max_seq_len` tokens.

    `token_dropout` (height, width) -> probability counts only the tokens that token dropping keeps.
    """
    groups, group, length = [], [], 0
    for index, image in enumerate(images):
        height, width = image.shape[-2:]
        num_tokens = (height // patch_size[0]) * (width // patch_size[1])
        if token_dropout is not None:
            num_tokens = vit.kept_tokens(num_tokens, token_dropout(height, width))
        if num_tokens > max_seq_len:
            raise ValueError(f"group_max_seq_len={max_seq_len} is too short for img batched_images[{index}] of "
                             f"size {height}x{width}: it has {num_tokens} tokens")
        if group and length + num_tokens > max_seq_len:
            groups.append(group)
            group, length = [], 0
        group.append(image)
        length += num_tokens
    if group:
        groups.append(group)
    return groups


# classes


class QKNorm(nn.Module):
    """Each head's queries (or keys) scaled to norm sqrt(dim_head), times a learned gain per head and
    channel: (b, heads, n, dim_head) -> same (an RMSNorm, ViT-22B's query-key normalisation)."""

    def __init__(self, heads, dim_head):
        super().__init__()
        self.scale = dim_head ** 0.5
        self.gamma = nn.Parameter(torch.ones(heads, 1, dim_head))

    def forward(self, x):
        return F.normalize(x, dim=-1) * self.scale * self.gamma


class Attention(vit.Attention):
    """Pre-norm multi-head attention with normalised queries and keys, (b, n, dim) -> (b, n, dim).

    Keys and values come from `context` when it is given (the pooling's cross-attention; the
    context is not normed again). Images are kept apart by `mask` (b, 1, n, m), True where a
    query may attend, or by `segments` (see `vit.attend_segments`). Queries and keys are normalised,
    so the logits need no 1/sqrt(dim_head) scale.
    """

    def __init__(self, dim, heads=8, dim_head=64, dropout=0.):
        super().__init__(dim, heads, dim_head, dropout, norm_bias=False,
                         to_out=nn.Sequential(nn.Linear(heads * dim_head, dim, bias=False), nn.Dropout(dropout)))
        self.scale = 1.     # normalised queries and keys: no 1/sqrt(dim_head)
        self.q_norm = QKNorm(heads, dim_head)
        self.k_norm = QKNorm(heads, dim_head)

    def build_projections(self, dim, inner_dim, *, bias):
        """Queries from the tokens, keys and values from the context: `to_q` and `to_kv`."""
        self.to_q = nn.Linear(dim, inner_dim, bias=bias)
        self.to_kv = nn.Linear(dim, inner_dim * 2, bias=bias)

    def forward(self, x, *, context=None, mask=None, segments=None):
        x = self.norm(x)
        context = x if context is None else context
        if mask is not None:
            # a masked key gets the weight 0, but 0 * NaN (or inf) is NaN: one broken image would make every image
            # of its sequence NaN. Its keys and values see zeros instead; the broken token itself stays NaN in the
            # residual stream (its query reaches its own row only), and `NaViT.pool` gives its image NaN
            context = torch.nan_to_num(context, nan=0., posinf=0., neginf=0.)
        q = rearrange(self.to_q(x), 'b n (h d) -> b h n d', h=self.heads)
        k, v = rearrange(self.to_kv(context), 'b n (kv h d) -> kv b h n d', kv=2, h=self.heads)
        q, k = self.q_norm(q), self.k_norm(k)
        out = self.attend(q, k, v, mask=mask) if segments is None else vit.attend_segments(self, q, k, v, segments)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


def FeedForward(dim, hidden_dim, dropout=0.):
    """The core's MLP with a bias-free LayerNorm, as vit-pytorch's NaViT holds it: a bare Sequential (keys 0, 1, 4)."""
    return vit.FeedForward(dim, hidden_dim, dropout, norm_bias=False).net


@dataclass(frozen=True)
class Layout:
    """Where each image's tokens lie in a (sequences, n, dim) token tensor.

    attention   keyword arguments that keep the images apart in self-attention: {} (one image per
                sequence), {'mask': (sequences, 1, n, n)} or {'segments': ...}
    pooling     the same for the pooling queries, (sequences, queries, dim), over the tokens
    queries     pooling queries per sequence
    order       (images,) the pooled slot, among sequences * queries, of each image in input order
    """
    attention: dict
    pooling: dict
    queries: int
    order: torch.Tensor


@dataclass(frozen=True)
class PackedTokens:
    """What `NaViT.forward_features` returns: tokens (sequences, n, dim) after the final norm, and their layout."""
    tokens: torch.Tensor
    layout: Layout

    def detach(self):
        return PackedTokens(self.tokens.detach(), self.layout)


class NaViT(vit.TokenFace, vit.NormedHead, nn.Module):
    """NaViT with vit-pytorch's keyword arguments.

    `image_size` is the largest image (it sizes the row and column position tables); any image
    up to it whose sides divide by `patch_size` is accepted. `token_dropout_prob`: None, a
    probability, or a function (height, width) -> probability; in training each image keeps a
    random max(1, int(n (1 - p))) of its n tokens. `num_classes=0` makes `forward` return the
    pooled embedding (images, dim), after the head's LayerNorm.

    Options beyond vit-pytorch's API:
      packing   'varlen' (default) or 'mask': how images are kept apart in attention (see the
                module's docstring); the same function.

    `forward_features` returns all tokens after the final norm as `PackedTokens` (tokens (sequences, n, dim) and
    their layout).
    """

    num_prefix_tokens = 0

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 dropout=0., emb_dropout=0., token_dropout_prob=None, packing='varlen'):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.channels, self.num_classes, self.packing = channels, num_classes, packing
        self.token_dropout_prob = token_dropout_prob
        patch_dim = channels * self.patch_size[0] * self.patch_size[1]

        self.to_patch_embedding = nn.Sequential(
            nn.LayerNorm(patch_dim, bias=False),
            nn.Linear(patch_dim, dim),
            nn.LayerNorm(dim, bias=False),
        )
        # factorised positions: a row's embedding plus a column's
        self.pos_embed_height = nn.Parameter(torch.zeros(self.grid_size[0], dim))
        self.pos_embed_width = nn.Parameter(torch.zeros(self.grid_size[1], dim))
        self.attn_pool_queries = nn.Parameter(torch.zeros(dim))
        vit.init_tokens(self.pos_embed_height, self.pos_embed_width, self.attn_pool_queries, patch_norm=True)
        self.dropout = nn.Dropout(emb_dropout)

        self.transformer = vit.Stack([
            (Attention(dim, heads, dim_head, dropout), FeedForward(dim, mlp_dim, dropout)) for _ in range(depth)
        ], norm=nn.LayerNorm(dim, bias=False))

        self.attn_pool = Attention(dim, heads, dim_head)
        self.num_features = dim
        self.mlp_head = vit.normed_head(dim, num_classes, bias=False)

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def token_dropout(self, height, width):
        """The share of tokens dropped from a (height, width) image in training (0 without token dropping)."""
        drop = self.token_dropout_prob
        if drop is None:
            return 0.
        if callable(drop):
            return check_token_dropout(drop(height, width), height, width)
        return drop

    # packing

    def groups(self, batched_images, group_images, group_max_seq_len):
        """The checked images of a list (or a list of lists) as a list of groups: the sequences of 'mask' packing."""
        images, nested = self.image_list(batched_images) if not isinstance(batched_images, torch.Tensor) \
            else (list(self.checked_batch(batched_images)), False)
        if group_images:
            vit.positive_int('group_max_seq_len', group_max_seq_len)
            if nested:
                raise ValueError("group_images=True packs a flat list of images; batched_images is already "
                                 "grouped (a list of lists)")
            dropout = self.token_dropout if self.training and self.token_dropout_prob is not None else None
            return group_images_by_max_seq_len(images, patch_size=self.patch_size, max_seq_len=group_max_seq_len,
                                               token_dropout=dropout)
        return images if nested else [images]

    def checked_batch(self, img):
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, dtype=self.pos_embed_height.dtype)
        self.check_size(img.shape[-2:], 'batched_images')
        return img

    def image_list(self, batched_images):
        """A list of images (checked) or a list of lists of them; whether it is nested."""
        if isinstance(batched_images, (list, tuple)) and batched_images and all(
                isinstance(group, (list, tuple)) for group in batched_images):
            for i, group in enumerate(batched_images):
                if not group:
                    raise ValueError(f"batched_images[{i}] is an empty group: every packed sequence needs an img")
                for j, image in enumerate(group):
                    self.check_image(image, f'batched_images[{i}][{j}]')
            return [list(group) for group in batched_images], True
        if not isinstance(batched_images, (list, tuple)) or not batched_images:
            kind = 'an empty list' if isinstance(batched_images, (list, tuple)) else type(batched_images).__name__
            hint = "; convert a numpy array with torch.from_numpy(array).float()" \
                if type(batched_images).__module__ == 'numpy' else ''
            raise TypeError(f"batched_images must be a list of img tensors (c, h, w), a list of such lists (one per "
                            f"packed sequence), or a (b, c, h, w) tensor; got {kind}{hint}")
        for i, image in enumerate(batched_images):
            self.check_image(image, f'batched_images[{i}]')
        return list(batched_images), False

    def check_image(self, image, name):
        """A (c, h, w) image this model can take, or an error naming it."""
        if not isinstance(image, torch.Tensor):
            hint = "; convert a numpy array with torch.from_numpy(array).float()" \
                if type(image).__module__ == 'numpy' else ''
            raise TypeError(f"{name} must be an img tensor (c, h, w), got {type(image).__name__}{hint}")
        if image.ndim != 3:
            raise ValueError(f"{name} must be an img tensor (c, h, w), got shape {tuple(image.shape)}")
        dtype = self.pos_embed_height.dtype
        if not image.is_floating_point():
            raise TypeError(f"{name} must be a floating point img, got dtype {image.dtype}; convert with img.float()")
        if image.dtype != dtype and not torch.is_autocast_enabled(image.device.type):
            raise TypeError(f"{name}: img has dtype {image.dtype} but the model's parameters are {dtype}; convert "
                            f"with img.to({dtype}) or run the model under torch.autocast")
        if image.shape[0] != self.channels:
            raise ValueError(f"{name} must be an img with {self.channels} channels (dim 0), got shape "
                             f"{tuple(image.shape)}")
        (height, width), (patch_height, patch_width) = image.shape[-2:], self.patch_size
        if height < patch_height or width < patch_width or height % patch_height or width % patch_width:
            raise ValueError(f"{name}: img height and width ({height}, {width}) must be positive multiples of "
                             f"patch_size {self.patch_size}")
        self.check_size((height, width), name)

    def check_size(self, size, name):
        if size[0] > self.image_size[0] or size[1] > self.image_size[1]:
            raise ValueError(f"{name}: img of size {size[0]}x{size[1]} is larger than image_size "
                             f"{self.image_size[0]}x{self.image_size[1]}, the largest the position tables cover")

    def patches(self, image):
        """An image's patches (n, c p1 p2) and their (row, column) on its grid (n, 2), token dropping applied."""
        height, width = image.shape[-2:]
        patches = rearrange(image, 'c (h p1) (w p2) -> (h w) (c p1 p2)', p1=self.patch_size[0], p2=self.patch_size[1])
        positions = vit.grid_positions(height // self.patch_size[0], width // self.patch_size[1], device=image.device)
        if self.training and self.token_dropout_prob is not None:
            keep = vit.kept_tokens(len(patches), self.token_dropout(height, width))
            kept = torch.randperm(len(patches), device=image.device)[:keep].sort().values
            patches, positions = patches[kept], positions[kept]
        return patches, positions

    def embed(self, patches, positions):
        """Patch tokens with their row and column embeddings: (..., n, c p1 p2), (..., n, 2) -> (..., n, dim)."""
        rows, columns = positions.unbind(dim=-1)
        return self.dropout(self.to_patch_embedding(patches) + self.pos_embed_height[rows] +
                            self.pos_embed_width[columns])

    def pack(self, groups):
        """The tokens of every image, laid out for attention: (sequences, n, dim) and its `Layout`."""
        patches, positions = zip(*(self.patches(image) for group in groups for image in group))
        lengths = [len(p) for p in patches]
        if self.packing == 'varlen':
            return self.pack_varlen(patches, positions, lengths)
        return self.pack_masked(groups, patches, positions, lengths)

    def pack_batch(self, img):
        """A (b, c, h, w) batch as b sequences of one image each: nothing to mask."""
        (height, width), grid = img.shape[-2:], self.token_grid(img.shape[-2:])
        patches = rearrange(img, 'b c (h p1) (w p2) -> b (h w) (c p1 p2)', p1=self.patch_size[0],
                            p2=self.patch_size[1])
        positions = repeat(vit.grid_positions(*grid, device=img.device), 'n two -> b n two', b=img.shape[0])
        if self.training and self.token_dropout_prob is not None:
            keep = vit.kept_tokens(grid[0] * grid[1], self.token_dropout(height, width))
            kept = torch.rand(patches.shape[:2], device=img.device).argsort(dim=-1)[:, :keep].sort(dim=-1).values
            patches = patches.gather(1, repeat(kept, 'b k -> b k d', d=patches.shape[-1]))
            positions = positions.gather(1, repeat(kept, 'b k -> b k two', two=2))
        return self.embed(patches, positions), Layout({}, {}, 1, torch.arange(img.shape[0], device=img.device))

    def pack_varlen(self, patches, positions, lengths):
        """One sequence: the images sorted by length; runs of equal length attend as one batch."""
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        tokens = self.embed(torch.cat([patches[i] for i in order]), torch.cat([positions[i] for i in order]))
        runs = {}
        for i in order:
            runs[lengths[i]] = runs.get(lengths[i], 0) + 1
        segments = tuple((count, length, length) for length, count in runs.items())
        pooling = tuple((count, 1, length) for length, count in runs.items())
        slot = [0] * len(order)                 # where each image's pooled embedding lands
        for position, i in enumerate(order):
            slot[i] = position
        return tokens[None], Layout({'segments': segments}, {'segments': pooling}, len(order),
                                    torch.tensor(slot, device=tokens.device))

    def pack_masked(self, groups, patches, positions, lengths):
        """One padded sequence per group; a block-diagonal mask keeps its images apart."""
        tokens = self.embed(torch.cat(patches), torch.cat(positions)).split(lengths)
        device = tokens[0].device
        sequences, image_ids, start = [], [], 0
        for group in groups:
            members = range(start, start + len(group))
            sequences.append(torch.cat([tokens[i] for i in members]))
            image_ids.append(torch.cat([torch.full((lengths[i],), i - start, device=device) for i in members]))
            start += len(group)
        tokens = pad_sequence(sequences, batch_first=True)                        # (sequences, n, dim)
        image_ids = pad_sequence(image_ids, batch_first=True, padding_value=-1)   # (sequences, n); -1: padding
        mask = rearrange(image_ids, 'b i -> b 1 i 1') == rearrange(image_ids, 'b j -> b 1 1 j')
        # pooling: query q reads image q of its sequence; the queries beyond a sequence's images read
        # everything (their results are dropped) so that no row of the mask is empty
        queries = max(len(group) for group in groups)
        counts = torch.tensor([len(group) for group in groups], device=device)
        query_ids = torch.arange(queries, device=device)
        unused = rearrange(query_ids, 'q -> 1 q') >= rearrange(counts, 'b -> b 1')   # (sequences, queries)
        pool_mask = (rearrange(query_ids, 'q -> 1 q 1') == rearrange(image_ids, 'b j -> b 1 j')) | unused[..., None]
        order = (~unused).flatten().nonzero().flatten()
        return tokens, Layout({'mask': mask}, {'mask': pool_mask[:, None]}, queries, order)

    # the model

    def forward_features(self, batched_images, group_images=False, group_max_seq_len=2048):
        """All tokens after the final norm, as `PackedTokens` (tokens (sequences, n, dim) and their layout)."""
        vit.boolean('group_images', group_images)
        if isinstance(batched_images, torch.Tensor) and not (group_images and len(batched_images)):
            tokens, layout = self.pack_batch(self.checked_batch(batched_images))
        else:
            tokens, layout = self.pack(self.groups(batched_images, group_images, group_max_seq_len))
        return PackedTokens(self.transformer(tokens, **layout.attention), layout)

    def pooled(self, features):
        """Each image's embedding, by attention pooling over its own tokens: (images, dim), in input order."""
        tokens, layout = features.tokens, features.layout
        queries = repeat(self.attn_pool_queries, 'd -> b q d', b=tokens.shape[0], q=layout.queries)
        pooled = self.attn_pool(queries, context=tokens, **layout.pooling) + queries
        if 'mask' in layout.pooling:
            # the pooling query of an image with a broken (NaN or inf) token: NaN, as the image alone gives, rather
            # than what its other tokens made of the zeros that stood in for the broken one as a key
            broken = ~torch.isfinite(tokens.sum(dim=-1))          # normed tokens: a finite one cannot sum to inf
            sees_broken = (layout.pooling['mask'][:, 0] & broken[:, None, :]).any(dim=-1)       # (b, q)
            pooled = pooled.masked_fill(sees_broken[..., None], float('nan'))
        return rearrange(pooled, 'b q d -> (b q) d')[layout.order]

    def forward(self, batched_images, group_images=False, group_max_seq_len=2048):
        """Logits (images, num_classes) of a list of (c, h, w) images, a list of lists (packed sequences),
        or a (b, c, h, w) batch; with `group_images` a flat list is packed into sequences of at most
        `group_max_seq_len` tokens."""
        return self.forward_head(self.forward_features(batched_images, group_images, group_max_seq_len))

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dim_head, dropout,
                    emb_dropout, token_dropout_prob, packing):
    vit.check_patches(image_size, patch_size)
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                    channels=channels, dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout)
    if token_dropout_prob is not None and not callable(token_dropout_prob):
        vit.probability('token_dropout_prob', token_dropout_prob)
    if packing not in ('varlen', 'mask'):
        raise ValueError(f"packing must be 'varlen' (each image attends within its own tokens) or 'mask' "
                         f"(packed sequences with a block-diagonal mask), got {packing!r}")


def check_token_dropout(value, height, width):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0. <= value < 1.:
        raise ValueError(f"token_dropout_prob({height}, {width}) must return a probability in [0, 1), got {value!r}")
    return float(value)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `NaViT` computes this function. Its LayerNorms keep `gamma` and an all-zero `beta`
    buffer (ours: `weight`, no bias); every other name is ours."""
    plan = {}
    norms = {name for name, module in model.named_modules() if isinstance(module, nn.LayerNorm)}
    for key, tensor in model.state_dict().items():
        module = key.rpartition('.')[0]
        shape = tuple(tensor.shape)
        if module in norms:
            plan[key] = ({f'{module}.gamma': shape, f'{module}.beta': shape}, zero_beta(f'{module}.beta'))
        else:
            plan[key] = ({key: shape}, lambda t: t)
    return plan, ('mlp_head.1.',)


def zero_beta(name):
    def take_gamma(gamma, beta):
        if beta.count_nonzero():
            raise ValueError(f"{name} is not zero: vit-pytorch's NaViT keeps its LayerNorms' beta at zero, and "
                             f"this model's LayerNorms have no bias")
        return gamma
    return take_gamma
