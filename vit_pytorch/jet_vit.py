"""JetViT: a ViT whose every layer chooses linear, window or full attention.

"JetViT: Efficient High-Resolution Vision Transformer with Post-Training Attention Search", arXiv 2605.26636:
start from a trained full-attention ViT and make it cheap at high resolution by giving each layer the cheapest
attention that keeps its accuracy. Each layer holds three attentions: 'LA', ReLU linear attention (cost linear in
the tokens) plus a squeeze dynamic convolution of the values (a depthwise kernel per image, predicted from the
values' mean), which gives back the locality linear attention loses; 'WA', softmax attention inside non-overlapping
windows of `window_size` x `window_size` tokens with a learned relative-position bias; 'FA', full softmax attention.
`attn_layers` gives each layer's choice: a kind, or a tuple of kinds drawn at random (torch's generator) in every
forward. The search runs in stages: window or linear per layer ([('WA', 'LA')] * depth), then each layer's winner
or full attention; `set_attn_layers` sets the choices on the trained model, whose weights stay as they are.

    import torch
    from vit_pytorch.jet_vit import JetViT

    model = JetViT(image_size=64, patch_size=8, num_classes=10, dim=64, depth=3, heads=4, dim_head=16,
                   mlp_dim=128, window_size=4, attn_layers=[('WA', 'LA'), ('WA', 'LA'), 'FA'])
    logits = model(torch.randn(2, 3, 64, 64))        # (2, 10), a random pick of WA or LA in the first two layers
    model.set_attn_layers(['LA', 'WA', 'FA'])        # the search's result: every layer fixed

As vit-pytorch 1.26.14, whose checkpoints load unchanged (same keys, same outputs): window attention has
dim // dim_head heads whatever `heads` says, and the three attentions of a layer have their own weights. Where it
differs: `num_classes=0` makes `forward` return the pooled embedding (vit-pytorch's returns the tokens), the choice is
drawn from torch's generator (so `torch.manual_seed` and gradient checkpointing see the same choice; vit-pytorch uses
Python's `random`), a list of kinds in `attn_layers` is a choice like a tuple (a checkpoint's JSON config turns
tuples into lists), and bad choices or a grid the windows do not tile are refused when the model is built.
"""

import torch
import torch.nn.functional as F
from einops import einsum, rearrange, reduce
from torch import nn

from vit_pytorch import multiscale, vit

KINDS = ('WA', 'LA', 'FA')


class SqueezeDynamicConv(nn.Module):
    """A depthwise `kernel_size` convolution of the values on their (h, w) grid whose kernels are predicted per image
    from the values' mean over the tokens (squeeze): (b, heads, h * w, dim_head) -> the same."""

    def __init__(self, dim, grid, kernel_size=3):
        super().__init__()
        self.grid, self.kernel_size = grid, kernel_size
        self.mlp = nn.Sequential(nn.Linear(dim, dim // 4), nn.SiLU(), nn.Linear(dim // 4, dim * kernel_size ** 2))

    def forward(self, v):
        b, heads, k = v.shape[0], v.shape[1], self.kernel_size
        if b == 0:
            return torch.zeros_like(v)             # no kernels to convolve with, and conv2d needs a group
        kernels = rearrange(self.mlp(reduce(v, 'b h n d -> b (h d)', 'mean')), 'b (c k1 k2) -> (b c) 1 k1 k2',
                            k1=k, k2=k)
        maps = rearrange(v, 'b h (y x) d -> 1 (b h d) y x', y=self.grid[0])
        if torch.compiler.is_exporting():
            out = shifted_sum(maps, kernels)
        else:
            # every image's channels one group each, so each image convolves with its own kernels
            out = F.conv2d(maps, kernels, padding=k // 2, groups=kernels.shape[0])
        return rearrange(out, '1 (b h d) y x -> b h (y x) d', b=b, h=heads)


def shifted_sum(maps, kernels):
    """The grouped convolution above as a sum of k * k shifted maps, each times its kernel weight: (1, c, y, x) with
    (c, 1, k, k) -> (1, c, y, x). For export: the grouped convolution's group count (b * channels) grows with the
    batch, and ONNX's Conv takes its group as a constant, so a graph with a dynamic batch cannot hold it."""
    k = kernels.shape[-1]
    y, x = maps.shape[-2:]
    padded = F.pad(maps, (k // 2,) * 4)
    weights = rearrange(kernels, 'c 1 k1 k2 -> k1 k2 c 1 1')
    return sum(padded[..., i:i + y, j:j + x] * weights[i, j] for i in range(k) for j in range(k))


class LinearAttention(vit.Attention):
    """'LA': relu(q) (relu(k)^T v) / (relu(q) . sum_j relu(k_j)), in time linear in the tokens, plus the squeeze
    dynamic convolution of the values, then the output projection; (b, h * w, dim) -> the same. The explicit path
    (`fused=False`, while the recorder records) forms the (b, heads, n, n) matrix relu(q) relu(k)^T, rows normalised
    to sum 1, and passes it through `attention_probs`."""

    def __init__(self, dim, grid, heads=8, dim_head=64, dropout=0., kernel_size=3):
        super().__init__(dim, heads, dim_head, dropout)
        self.dynamic_conv = SqueezeDynamicConv(heads * dim_head, grid, kernel_size)

    def forward(self, x):
        q, k, v = self.qkv(x)
        q, k = q.relu(), k.relu()
        if self.fused:
            context = einsum(k, v, 'b h n d, b h n e -> b h d e')
            normaliser = einsum(q, k.sum(dim=2), 'b h n d, b h d -> b h n')
            out = einsum(q, context, 'b h n d, b h d e -> b h n e') / normaliser.clamp(min=1e-6)[..., None]
        else:
            weights = q @ k.transpose(-1, -2)
            out = self.attention_probs(weights / weights.sum(dim=-1, keepdim=True).clamp(min=1e-6)) @ v
        return self.to_out(rearrange(out + self.dynamic_conv(v), 'b h n d -> b n (h d)'))


class WindowAttention(vit.Attention):
    """'WA': softmax attention inside each window of `window_size` x `window_size` tokens of the (h, w) grid, with a
    learned bias per head and relative offset; dim // dim_head heads (vit-pytorch's), a bias-free output projection.
    The recorder sees (b * windows, heads, window_size ** 2, window_size ** 2), windows row-major."""

    def __init__(self, dim, grid, dim_head=64, dropout=0., window_size=7):
        super().__init__(dim, dim // dim_head, dim_head, dropout,
                         to_out=nn.Sequential(nn.Linear(dim, dim, bias=False), nn.Dropout(dropout)))
        self.grid, self.window_size = grid, window_size
        self.rel_pos_bias = nn.Embedding((2 * window_size - 1) ** 2, self.heads)
        # vit-pytorch's table is indexed by query minus key offset, the core's index by key minus query: reversed
        index = (2 * window_size - 1) ** 2 - 1 - multiscale.relative_position_index((window_size, window_size))
        self.register_buffer('rel_pos_indices', index, persistent=False)

    def forward(self, x):
        w = self.window_size
        windows = rearrange(x, 'b (x w1 y w2) d -> (b x y) (w1 w2) d', w1=w, w2=w, y=self.grid[1] // w)
        bias = rearrange(self.rel_pos_bias(self.rel_pos_indices), 'i j h -> h i j')
        out = self.attend(*self.qkv(windows), mask=bias.to(x.dtype))
        out = rearrange(out, '(b x y) h (w1 w2) d -> b (x w1 y w2) (h d)', x=self.grid[0] // w, y=self.grid[1] // w,
                        w1=w)
        return self.to_out(out)


class AttentionChoice(nn.Module):
    """A layer's three attentions `options` ('WA', 'LA', 'FA'), of which `choice` runs: a kind, or a tuple of kinds
    of which each forward draws one (vit-pytorch's `RandomLayerSelector`)."""

    def __init__(self, options, choice):
        super().__init__()
        self.options = nn.ModuleDict(options)
        self.choice = choice

    def forward(self, x):
        choice = self.choice
        if not isinstance(choice, str):
            choice = choice[int(torch.randint(len(choice), ()))]
        return self.options[choice](x)


class JetViT(vit.TokenFace, nn.Module):
    """vit-pytorch's JetViT: the patch embedding between two LayerNorms, a learned position table (no cls token),
    `depth` layers of (AttentionChoice, FeedForward), a final LayerNorm, mean pooling.

    Images must be of `image_size` (the windows and the dynamic convolution are laid on its grid).
    `forward_features` returns the patch tokens after the final norm, (b, h * w, dim).
    `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    """

    num_prefix_tokens = 0

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 dropout=0., emb_dropout=0., window_size=7, attn_layers=None):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.grid_size = grid = self.token_grid(self.image_size)
        self.channels, self.num_classes, self.embed_dim = channels, num_classes, dim
        self.num_features, self.window_size = dim, window_size

        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim)
        self.pos_embedding = nn.Parameter(torch.randn(grid[0] * grid[1], dim))
        self.dropout = nn.Dropout(emb_dropout)
        choices = layer_choices(attn_layers, depth)
        self.transformer = vit.Stack([
            (AttentionChoice(dict(WA=WindowAttention(dim, grid, dim_head, dropout, window_size),
                                  LA=LinearAttention(dim, grid, heads, dim_head, dropout),
                                  FA=vit.Attention(dim, heads, dim_head, dropout)), choice),
             vit.FeedForward(dim, mlp_dim, dropout))
            for choice in choices
        ], norm=nn.LayerNorm(dim))
        self.to_latent = nn.Identity()
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    @property
    def attn_layers(self):
        """Each layer's choice: a kind, or a tuple of kinds drawn from in every forward."""
        return [layer[0].choice for layer in self.transformer.layers]

    def set_attn_layers(self, attn_layers):
        """Give the layers new choices (the attention search's next stage or its result); the weights stay."""
        check_choices(attn_layers, len(self.transformer.layers), self.grid_size, self.window_size)
        for layer, choice in zip(self.transformer.layers, layer_choices(attn_layers, len(self.transformer.layers))):
            layer[0].choice = choice

    def token_grid(self, image_size):
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def forward_features(self, img):
        """The patch tokens after the final norm: (b, h * w, dim)."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.pos_embedding.dtype)
        x = self.dropout(self.to_patch_embedding(img) + self.pos_embedding)
        return self.transformer(x)

    def forward_head(self, tokens, pre_logits=False):
        """The mean of the tokens, then the head."""
        x = self.to_latent(tokens.mean(dim=1))
        return x if pre_logits else self.mlp_head(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.pos_embedding, removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


def layer_choices(attn_layers, depth):
    """One choice a layer: a kind, or a tuple of kinds; None is full attention everywhere."""
    if attn_layers is None:
        return ['FA'] * depth
    return [choice if isinstance(choice, str) else tuple(choice) for choice in attn_layers]


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dim_head, dropout,
                    emb_dropout, window_size, attn_layers):
    grid = vit.patch_grid(vit.positive_pair('image_size', image_size), vit.positive_pair('patch_size', patch_size))
    for name, value in dict(dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                            window_size=window_size).items():
        vit.positive_int(name, value)
    vit.non_negative_int('num_classes', num_classes)
    vit.probability('dropout', dropout)
    vit.probability('emb_dropout', emb_dropout)
    if dim % dim_head:
        raise ValueError(f"dim must be divisible by dim_head (window attention has dim // dim_head heads), got dim "
                         f"{dim} and dim_head {dim_head}")
    if heads * dim_head < 4:
        raise ValueError(f"heads * dim_head must be at least 4 (the dynamic convolution squeezes it by 4), got "
                         f"{heads} * {dim_head}")
    check_choices(attn_layers, depth, grid, window_size)


def check_choices(attn_layers, depth, grid, window_size):
    if attn_layers is None:
        return
    if not isinstance(attn_layers, (list, tuple)) or len(attn_layers) != depth:
        raise ValueError(f"attn_layers must be None or a list of {depth} choices (one a layer), got {attn_layers!r}")
    for choice in attn_layers:
        kinds = [choice] if isinstance(choice, str) else choice
        if not isinstance(kinds, (list, tuple)) or not kinds or any(kind not in KINDS for kind in kinds):
            raise ValueError(f"each entry of attn_layers must be one of {KINDS} or a non-empty tuple of them, got "
                             f"{choice!r}")
        if 'WA' in kinds and (grid[0] % window_size or grid[1] % window_size):
            raise ValueError(f"window attention ('WA') needs the patch grid {grid} divisible by window_size "
                             f"{window_size}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's JetViT has our parameter names and computes the same function."""
    return None
