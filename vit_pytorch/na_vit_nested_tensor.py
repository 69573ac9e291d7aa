"""NaViT with vit-pytorch's nested-tensor API, run on packed sequences: `vit_pytorch.na_vit_nested_tensor.NaViT`.

"Patch n' Pack: NaViT, a Vision Transformer for any Aspect Ratio and Resolution", Dehghani et al.,
arXiv 2307.06304: every image is cut into patches at its own size and no image attends to another.
vit-pytorch's version keeps the images apart with `torch.nested` jagged tensors; this one packs them
instead, as `vit_pytorch.na_vit` does ('varlen' packing): the tokens of all images form one sequence
sorted by length, and each run of images of one length is one batched `scaled_dot_product_attention`
call (`vit_pytorch.vit.attend_segments`), with nothing padded and no attention across images. The
function is the same (equal logits on vit-pytorch's own fixture). Measured once on a shared CPU (torch
2.13, one thread; 8 images of 16 to 64 pixels, patch 8, dim 64, depth 4, heads 4): 255 ms a forward
for vit-pytorch's nested tensors, 41 ms for this packing.

    import torch
    from vit_pytorch.na_vit_nested_tensor import NaViT

    model = NaViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16,
                  mlp_dim=2048, token_dropout_prob=0.1)
    images = [torch.randn(3, 256, 256), torch.randn(3, 128, 128), torch.randn(3, 128, 256),
              torch.randn(3, 256, 128), torch.randn(3, 64, 256)]
    logits = model(images)   # (5, 1000), in input order

The arguments, parameter names and the function are vit-pytorch's (1.26.14), whose checkpoints load
unchanged; that model is not `vit_pytorch.na_vit.NaViT`: its queries and keys are LayerNormed per head
(`qk_rmsnorm`, a LayerNorm without bias despite the name) and scaled by 1/sqrt(dim_head), queries, keys
and values have three projections, the patch LayerNorm has a bias, patches are flattened channel
first, and the pooled token is the pooling attention's output without a residual. Beyond vit-pytorch:
`token_dropout_prob=None` means none in training too (vit-pytorch raises comparing None with 0), each
image keeps max(1, int(n (1 - p))) of its n tokens in training, bad images are errors naming them,
`num_classes=0` makes `forward` return the pooled, normed embedding (images, dim), and every parameter trains:
vit-pytorch builds its jagged tensors with `torch.nested.nested_tensor`, which makes a leaf without autograd
history, so in its model the patch embedding, both position tables and the pooling queries get no gradient
(torch 2.13 and 2.14.1; the same forward, but ours also keeps their gradients and optimiser state).
"""

import torch
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import vit


class Attention(vit.Attention):
    """Pre-norm attention with LayerNormed queries and keys; keys and values from `context` when given.

    `segments` keeps images apart in one packed sequence (see `vit_pytorch.vit.attend_segments`).
    """

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., *, qk_norm=True):
        super().__init__(dim, heads, dim_head, dropout, norm_bias=False,
                         to_out=nn.Linear(heads * dim_head, dim, bias=False))
        self.query_norm = nn.LayerNorm(dim_head, bias=False) if qk_norm else nn.Identity()
        self.key_norm = nn.LayerNorm(dim_head, bias=False) if qk_norm else nn.Identity()

    def build_projections(self, dim, inner_dim, *, bias):
        """vit-pytorch's three projections: `to_queries`, `to_keys`, `to_values`."""
        self.to_queries = nn.Linear(dim, inner_dim, bias=bias)
        self.to_keys = nn.Linear(dim, inner_dim, bias=bias)
        self.to_values = nn.Linear(dim, inner_dim, bias=bias)

    def forward(self, x, *, context=None, segments):
        x = self.norm(x)
        context = x if context is None else context
        q, k, v = (rearrange(t, 'b n (h d) -> b h n d', h=self.heads)
                   for t in (self.to_queries(x), self.to_keys(context), self.to_values(context)))
        out = vit.attend_segments(self, self.query_norm(q), self.key_norm(k), v, segments)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


def attention_block(qk_norm):
    """A builder for `vit.Transformer`: this module's attention."""
    def build(dim, heads, dim_head, dropout=0., **options):
        return Attention(dim, heads, dim_head, dropout, qk_norm=qk_norm)
    return build


def feedforward_block(dim, hidden_dim, dropout=0., **options):
    """A builder for `vit.Transformer`: NaViT's MLP (bias-free LayerNorm)."""
    return vit.FeedForward(dim, hidden_dim, dropout, norm_bias=False).net


class PackedNaViT(vit.TokenFace, vit.NormedHead, nn.Module):
    """What the 2D and 3D NaViT share: the encoder, the pooling, the head, and the packing of items
    (images or volumes) of different sizes into one sequence. A subclass sets `self.to_patch_embedding`,
    its position tables, `self.num_registers` (and `self.register_tokens` when positive), and defines
    `check_item`, `item_patches` and `position_embedding`."""

    num_prefix_tokens = 0

    def build_core(self, *, dim, depth, heads, dim_head, mlp_dim, dropout, emb_dropout, qk_norm, num_classes):
        self.num_classes, self.embed_dim = num_classes, dim
        self.dropout = nn.Dropout(emb_dropout)
        self.transformer = vit.Transformer(dim, depth, heads, dim_head, mlp_dim, dropout,
                                       attention=attention_block(qk_norm), feedforward=feedforward_block,
                                       final_norm=False)
        self.transformer.norm = nn.LayerNorm(dim, bias=False)     # vit-pytorch's final norm has no bias
        self.attn_pool_queries = nn.Parameter(torch.randn(dim))
        self.attn_pool = Attention(dim, heads, dim_head)
        self.to_latent = nn.Identity()
        self.num_features = dim
        self.mlp_head = vit.normed_head(dim, num_classes, bias=False)

    def kept(self, patches, positions):
        """Token dropping in training: a random max(1, int(n (1 - p))) of an item's n tokens."""
        if not self.training or not self.token_dropout_prob:
            return patches, positions
        keep = vit.kept_tokens(len(patches), self.token_dropout_prob)
        kept = torch.randperm(len(patches), device=patches.device)[:keep]
        return patches[kept], positions[kept]

    def pack(self, items):
        """All items' tokens in one sequence sorted by length (1, n, dim), the attention and pooling
        segments, and each item's place in that order."""
        patches, positions = zip(*(self.kept(*self.item_patches(item)) for item in items))
        lengths = [len(p) + self.num_registers for p in patches]
        order = sorted(range(len(items)), key=lengths.__getitem__)
        tokens = self.to_patch_embedding(torch.cat(patches)) + self.position_embedding(torch.cat(positions))
        tokens = tokens.split([len(p) for p in patches])
        if self.num_registers:
            tokens = [torch.cat((self.register_tokens, t)) for t in tokens]
        tokens = self.dropout(torch.cat([tokens[i] for i in order]))[None]
        runs = {}
        for i in order:
            runs[lengths[i]] = runs.get(lengths[i], 0) + 1
        segments = tuple((count, length, length) for length, count in runs.items())
        pooling = tuple((count, 1, length) for length, count in runs.items())
        slot = torch.empty(len(order), dtype=torch.long)
        slot[torch.tensor(order)] = torch.arange(len(order))
        return tokens, segments, pooling, slot.to(tokens.device)

    def items(self, batch, name):
        if isinstance(batch, torch.Tensor) and batch.ndim >= 1:
            batch = list(batch)
        if not isinstance(batch, (list, tuple)) or not batch:
            kind = 'an empty list' if isinstance(batch, (list, tuple)) else type(batch).__name__
            raise TypeError(f"{name} must be a non-empty list of tensors, got {kind}")
        for i, item in enumerate(batch):
            self.check_item(item, f'{name}[{i}]')
        return list(batch)

    def forward_features(self, batch):
        """The packed tokens after the final norm (1, n, dim), the pooling segments and each item's slot."""
        tokens, segments, pooling, slot = self.pack(self.items(batch, self.input_name))
        return self.transformer(tokens, segments=segments), pooling, slot

    def pooled(self, features):
        """Attention pooling of each item over its own tokens: (items, dim), in input order."""
        tokens, pooling, slot = features
        queries = repeat(self.attn_pool_queries, 'd -> 1 n d', n=len(slot))
        pooled = rearrange(self.attn_pool(queries, context=tokens, segments=pooling), '1 n d -> n d')[slot]
        return self.to_latent(pooled)

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


class NaViT(PackedNaViT):
    """NaViT on a list of (c, h, w) images of any sizes up to `image_size` (divisible by `patch_size`).

    `forward_features` returns the packed tokens after the final norm (1, n, dim), the pooling segments and each
    image's slot.
    `num_classes=0` makes `forward` return the pooled embedding (images, dim).
    """

    input_name = 'images'
    num_registers = 0

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 dropout=0., emb_dropout=0., qk_rmsnorm=True, token_dropout_prob=None):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.channels, self.token_dropout_prob = channels, token_dropout_prob
        grid = (self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1])
        patch_dim = channels * self.patch_size[0] * self.patch_size[1]

        self.to_patch_embedding = nn.Sequential(nn.LayerNorm(patch_dim), nn.Linear(patch_dim, dim), nn.LayerNorm(dim))
        self.pos_embed_height = nn.Parameter(torch.randn(grid[0], dim))
        self.pos_embed_width = nn.Parameter(torch.randn(grid[1], dim))
        self.build_core(dim=dim, depth=depth, heads=heads, dim_head=dim_head, mlp_dim=mlp_dim, dropout=dropout,
                        emb_dropout=emb_dropout, qk_norm=qk_rmsnorm, num_classes=num_classes)

    def item_patches(self, image):
        """An image's patches (h * w, c p1 p2), flattened channel first, and their (row, column) (h * w, 2)."""
        (p1, p2), (height, width) = self.patch_size, image.shape[-2:]
        patches = rearrange(image, 'c (h p1) (w p2) -> (h w) (c p1 p2)', p1=p1, p2=p2)
        return patches, vit.grid_positions(height // p1, width // p2, device=image.device)

    def position_embedding(self, positions):
        rows, columns = positions.unbind(dim=-1)
        return self.pos_embed_height[rows] + self.pos_embed_width[columns]

    def check_item(self, image, name):
        check_item(image, name, kind='image (c, h, w)', channels=self.channels, patch=self.patch_size,
                   largest=self.image_size, dtype=self.pos_embed_height.dtype)


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dim_head, dropout,
                    emb_dropout, qk_rmsnorm, token_dropout_prob):
    vit.check_patches(image_size, patch_size)
    check_common(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels,
                 dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout, qk_rmsnorm=qk_rmsnorm,
                 token_dropout_prob=token_dropout_prob)


def check_common(*, num_classes, dim, depth, heads, mlp_dim, channels, dim_head, dropout, emb_dropout, qk_rmsnorm,
                 token_dropout_prob):
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                    channels=channels, dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout)
    vit.boolean('qk_rmsnorm', qk_rmsnorm)
    if token_dropout_prob is not None:
        vit.probability('token_dropout_prob', token_dropout_prob)


def check_item(item, name, *, kind, channels, patch, largest, dtype):
    """An image (c, h, w) or volume (c, f, h, w) whose trailing sides divide by `patch` and fit in `largest`."""
    if not isinstance(item, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, an {kind}, got {type(item).__name__}")
    if item.ndim != 1 + len(patch):
        raise ValueError(f"{name} must be an {kind}, got shape {tuple(item.shape)}")
    if not item.is_floating_point():
        raise TypeError(f"{name} must be a floating point tensor, got dtype {item.dtype}; convert with .float()")
    if item.dtype != dtype and not torch.is_autocast_enabled(item.device.type):
        raise TypeError(f"{name} has dtype {item.dtype} but the model's parameters are {dtype}; convert with "
                        f".to({dtype}) or run the model under torch.autocast")
    if item.shape[0] != channels:
        raise ValueError(f"{name} must have {channels} channels (dim 0), got shape {tuple(item.shape)}")
    sides = tuple(item.shape[1:])
    if any(side < step or side % step for side, step in zip(sides, patch)):
        raise ValueError(f"{name}: sides {sides} must be positive multiples of the patch {tuple(patch)}")
    if any(side > most for side, most in zip(sides, largest)):
        raise ValueError(f"{name}: sides {sides} exceed {tuple(largest)}, the largest the position tables cover")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's nested-tensor NaViT has our parameter names and computes the same function."""
    return None
