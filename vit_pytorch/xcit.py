"""XCiT: Cross-Covariance Image Transformers.

"XCiT: Cross-Covariance Image Transformers", El-Nouby et al., arXiv 2106.09681: attend across
channels instead of tokens. Cross-covariance attention (XCA) forms a (d x d) map per head from
the L2-normalised queries and keys, so its cost grows linearly with the number of tokens; a
local patch interaction (two depthwise 3x3 convolutions) lets neighbouring tokens talk, and two
class-attention layers (as in CaiT) read the tokens into a cls token. Patches come from a small
convolutional stem and positions from a Fourier encoding computed for each input's grid, so any
image whose sides divide by the patch size works.

    import torch
    from vit_pytorch.xcit import XCiT, xcit_tiny_12_p16_224

    model = XCiT(image_size=224, patch_size=16, num_classes=1000, dim=192, depth=12,
                 cls_depth=2, heads=4, mlp_dim=768, dim_head=48, layer_dropout=0.05)
    logits = model(torch.randn(2, 3, 224, 224))   # (2, 1000)

    paper_model = xcit_tiny_12_p16_224()           # XCiT-T12/16, 6,716,272 parameters

`layer_dropout` is stochastic depth: each residual branch is dropped per sample with that
probability while training.
"""

import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit

# helpers


def conv_stem(channels, dim, patch_size):
    """log2(patch_size) stride-2 3x3 convolutions with BatchNorm, GELU between (XCiT section 3.2).

    Widths double up to `dim`: patch 16 gives dim/8, dim/4, dim/2, dim, as in the paper.
    """
    num_convs = int(math.log2(patch_size))
    widths = [channels] + [dim // 2 ** (num_convs - 1 - i) for i in range(num_convs)]
    layers = []
    for i, (width_in, width_out) in enumerate(zip(widths[:-1], widths[1:])):
        if i > 0:
            layers.append(nn.GELU())
        layers += [nn.Conv2d(width_in, width_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width_out)]
    return nn.Sequential(*layers)


# classes


class FourierPositionEncoding(nn.Module):
    """Sin-cos features of each patch's (row, column), normalised to (0, 2 pi], projected to `dim`.

    `hidden_dim` features per axis, frequencies temperature ** (2 floor(i / 2) / hidden_dim),
    sin on even and cos on odd features, rows first (the official XCiT code).
    """

    def __init__(self, dim, hidden_dim=32, temperature=10000):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.temperature = temperature
        self.to_embedding = nn.Linear(2 * hidden_dim, dim)

    def axis_features(self, length, device):
        position = torch.arange(1, length + 1, device=device, dtype=torch.float32)
        position = position / (length + 1e-6) * 2 * math.pi
        frequency = torch.arange(self.hidden_dim, device=device, dtype=torch.float32)
        frequency = self.temperature ** (2 * torch.div(frequency, 2, rounding_mode='floor') / self.hidden_dim)
        angles = position[:, None] / frequency                          # (length, hidden_dim)
        return rearrange(torch.stack((angles[:, 0::2].sin(), angles[:, 1::2].cos()), dim=-1),
                         'n k two -> n (k two)')

    def forward(self, height, width):
        """(height * width, dim) position embeddings, rows in row-major grid order."""
        device = self.to_embedding.weight.device
        rows = repeat(self.axis_features(height, device), 'h k -> h w k', w=width)
        cols = repeat(self.axis_features(width, device), 'w k -> h w k', h=height)
        features = rearrange(torch.cat((rows, cols), dim=-1), 'h w k -> (h w) k')
        return self.to_embedding(features.to(self.to_embedding.weight.dtype))


class XCAttention(vit.Attention):
    """Pre-norm cross-covariance attention: each head attends across its `dim_head` channels.

    Queries and keys are L2-normalised along the tokens and their (dim_head x dim_head)
    cross-covariance, times a learned per-head temperature, is softmaxed over the key
    channels (XCiT eq. 4): the core's attention with channels in the sequence position. The
    recorded map is (b, heads, dim_head, dim_head).
    """

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., *, qkv_bias=False, norm_eps=1e-5):
        super().__init__(dim, heads, dim_head, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps,
                         to_out=nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(dropout)))
        self.temperature = nn.Parameter(torch.ones(heads, 1, 1))

    def forward(self, x):
        q, k, v = (rearrange(t, 'b h n d -> b h d n') for t in self.qkv(x))
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        # the temperature scales the (d, d) map, as XCiT's code does: its gradient then keeps that small map, where
        # q * temperature kept a second copy of q (xcit_tiny_12_p16_224, batch 8: 10 MiB more saved in a step)
        out = vit.attend(q, k, v, scale=self.temperature, fused=False, probs=self.attention_probs,
                         dropout=self.dropout if self.training else 0.)       # (b, h, d, n)
        return self.to_out(rearrange(out, 'b h d n -> b n (h d)'))


class LocalPatchInteraction(nn.Module):
    """Pre-norm depthwise conv, GELU, BatchNorm, depthwise conv over the patch grid (XCiT section 3.1)."""

    def __init__(self, dim, kernel_size=3, *, norm_eps=1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        padding = kernel_size // 2
        self.net = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size, padding=padding, groups=dim),
            nn.GELU(),
            nn.BatchNorm2d(dim),
            nn.Conv2d(dim, dim, kernel_size, padding=padding, groups=dim),
        )

    def forward(self, x, *, grid):
        x = rearrange(self.norm(x), 'b (h w) c -> b c h w', h=grid[0], w=grid[1])
        return rearrange(self.net(x), 'b c h w -> b (h w) c')


class XCATransformer(vit.Stack):
    """x + XCA(x), x + LPI(x), x + FF(x) per layer, each branch LayerScaled; no final norm."""

    @staticmethod
    def layer(branches, x, *, grid):
        attn, local, ff = branches
        x = attn(x) + x
        x = local(x, grid=grid) + x
        return ff(x) + x


class ClassAttentionBlock(nn.Module):
    """Class attention then an MLP on the cls token, both LayerScaled, as in the official XCiT code.

    That code lets the patch tokens flow through the block as well: the attention step adds
    their normed copy to them, the MLP step normalises them (`tokens_norm=True`; otherwise only
    the cls token) and adds them to themselves. They only feed the next layer's keys and values;
    the released weights were trained this way, so it is kept.
    """

    def __init__(self, dim, heads, dim_head, mlp_dim, dropout=0., *, layer_dropout=0., layer_scale_init=1.,
                 tokens_norm=False, qkv_bias=False, norm_eps=1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = vit.ClassAttention(dim, heads, dim_head, dropout, qkv_bias=qkv_bias, prenorm=False)
        self.ff_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.ff = nn.Sequential(
            nn.Linear(dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, dim),
            nn.Dropout(dropout),
        )
        self.attn_scale = nn.Parameter(torch.full((dim,), float(layer_scale_init)))
        self.ff_scale = nn.Parameter(torch.full((dim,), float(layer_scale_init)))
        self.layer_dropout = layer_dropout
        self.tokens_norm = tokens_norm

    def forward(self, x):
        normed = self.norm(x)
        update = torch.cat((self.attn(normed), normed[:, 1:]), dim=1)
        x = x + vit.drop_path(update * self.attn_scale, self.layer_dropout, self.training)
        if self.tokens_norm:
            x = self.ff_norm(x)
        else:
            x = torch.cat((self.ff_norm(x[:, :1]), x[:, 1:]), dim=1)
        update = torch.cat((self.ff(x[:, :1]) * self.ff_scale, x[:, 1:]), dim=1)
        return x + vit.drop_path(update, self.layer_dropout, self.training)


class XCiT(vit.TokenFace, nn.Module):
    """XCiT with vit-pytorch's keyword arguments.

    `patch_size` must be a power of two (the convolutional stem halves the image that many
    times); images of any size divisible by it are accepted. `num_classes=0` makes `forward`
    return the normed tokens (b, 1 + n, dim), cls first.

    Options beyond vit-pytorch's API (the named configurations such as `xcit_tiny_12_p16_224`
    set the paper's values):
      channels          input channels.
      layer_scale_init  initial LayerScale value; None: 1 up to 12 layers, else 1e-5 (the paper).
      tokens_norm       the class-attention MLP step normalises all tokens, not only cls.
      qkv_bias          bias on the query/key/value projections (True: the paper).
      norm_eps          epsilon of every LayerNorm (1e-6 in the paper's code).

    `forward_features` returns [cls, patch tokens] after both stages and the final norm, (b, 1 + h * w, dim).
    """

    intermediates_from = 'xcit_transformer'

    num_prefix_tokens = 1

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, cls_depth, heads, mlp_dim,
                 dim_head=64, dropout=0., emb_dropout=0., local_patch_kernel_size=3, layer_dropout=0.,
                 channels=3, layer_scale_init=None, tokens_norm=False, qkv_bias=False, norm_eps=1e-5):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        if layer_scale_init is None:
            layer_scale_init = 1. if depth <= 12 else 1e-5
        self.channels = channels
        self.num_classes = num_classes

        self.to_patch_embedding = nn.Sequential(
            conv_stem(channels, dim, self.patch_size[0]),
            Rearrange('b c h w -> b (h w) c'),
        )
        self.pos_embedding = FourierPositionEncoding(dim)
        self.cls_token = nn.Parameter(torch.zeros(1, dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.dropout = nn.Dropout(emb_dropout)

        def scaled(block):
            return vit.LayerScale(dim, block, layer_scale_init, layer_dropout)

        self.xcit_transformer = XCATransformer([
            (scaled(XCAttention(dim, heads, dim_head, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps)),
             scaled(LocalPatchInteraction(dim, local_patch_kernel_size, norm_eps=norm_eps)),
             scaled(vit.FeedForward(dim, mlp_dim, dropout, norm_eps=norm_eps)))
            for _ in range(depth)
        ])
        self.cls_transformer = nn.ModuleList([
            ClassAttentionBlock(dim, heads, dim_head, mlp_dim, dropout, tokens_norm=tokens_norm,
                                layer_dropout=layer_dropout, layer_scale_init=layer_scale_init, qkv_bias=qkv_bias,
                                norm_eps=norm_eps)
            for _ in range(cls_depth)
        ])

        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.num_features = dim
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else None

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def forward_features(self, img):
        """[cls, patch tokens] after both stages and the final norm: (b, 1 + h * w, dim)."""
        grid = vit.check_images(img, channels=self.channels, patch_size=self.patch_size,
                                dtype=self.cls_token.dtype)
        x = self.to_patch_embedding(img)                               # (b, h * w, dim)
        x = self.dropout(x + self.pos_embedding(*grid))
        x = self.xcit_transformer(x, grid=grid)
        x = torch.cat((repeat(self.cls_token, 'n d -> b n d', b=x.shape[0]), x), dim=1)
        for block in self.cls_transformer:
            x = block(x)
        return self.norm(x)

    def forward_head(self, tokens, pre_logits=False):
        x = tokens[:, 0]
        if pre_logits or self.mlp_head is None:
            return x
        return self.mlp_head(x)

    def forward(self, img):
        tokens = self.forward_features(img)
        return tokens if self.mlp_head is None else self.forward_head(tokens)

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.cls_token)

    def set_grad_checkpointing(self, enable=True):
        self.xcit_transformer.grad_checkpointing = enable


# the paper's models (Table 9): name -> (dim, depth, heads, LayerScale init, tokens_norm);
# patch 16 or 8, MLP ratio 4, two class-attention layers, values of the released weights
CONFIGS = {
    'nano_12': (128, 12, 4, 1., False),
    'tiny_12': (192, 12, 4, 1., True),
    'tiny_24': (192, 24, 4, 1e-5, True),
    'small_12': (384, 12, 8, 1., True),
    'small_24': (384, 24, 8, 1e-5, True),
    'medium_24': (512, 24, 8, 1e-5, True),
    'large_24': (768, 24, 16, 1e-5, True),
}


def xcit(variant, *, patch_size=16, image_size=224, num_classes=1000, **overrides):
    """The paper's XCiT `variant` (a key of CONFIGS) with patch 16 or 8; keyword arguments override."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, depth, heads, init, tokens_norm = CONFIGS[variant]
    kwargs = dict(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                  cls_depth=2, heads=heads, mlp_dim=4 * dim, dim_head=dim // heads, layer_scale_init=init,
                  tokens_norm=tokens_norm, qkv_bias=True, norm_eps=1e-6)
    return XCiT(**{**kwargs, **overrides})


def xcit_nano_12_p16_224(**kwargs):
    return xcit('nano_12', **kwargs)


def xcit_tiny_12_p16_224(**kwargs):
    return xcit('tiny_12', **kwargs)


def xcit_tiny_24_p16_224(**kwargs):
    return xcit('tiny_24', **kwargs)


def xcit_small_12_p16_224(**kwargs):
    return xcit('small_12', **kwargs)


def xcit_small_24_p16_224(**kwargs):
    return xcit('small_24', **kwargs)


def xcit_medium_24_p16_224(**kwargs):
    return xcit('medium_24', **kwargs)


def xcit_large_24_p16_224(**kwargs):
    return xcit('large_24', **kwargs)


def xcit_tiny_12_p8_224(**kwargs):
    return xcit('tiny_12', **{'patch_size': 8, **kwargs})


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, cls_depth, heads, mlp_dim, dim_head,
                    dropout, emb_dropout, local_patch_kernel_size, layer_dropout, channels, layer_scale_init,
                    tokens_norm, qkv_bias, norm_eps):
    image_pair, patch_pair = vit.positive_pair('image_size', image_size), vit.positive_pair('patch_size', patch_size)
    patch = patch_pair[0]
    if patch_pair[0] != patch_pair[1] or patch < 2 or patch & (patch - 1):
        raise ValueError(f"patch_size must be a square power of two (2, 4, 8, 16, ...) for the "
                         f"convolutional stem, got {patch_size!r}")
    vit.patch_grid(image_pair, patch_pair)
    for name, value in dict(dim=dim, depth=depth, cls_depth=cls_depth, heads=heads, mlp_dim=mlp_dim,
                            dim_head=dim_head, channels=channels,
                            local_patch_kernel_size=local_patch_kernel_size).items():
        vit.positive_int(name, value)
    if dim % (patch // 2):
        raise ValueError(f"dim must be divisible by patch_size / 2 = {patch // 2} (the stem's first width "
                         f"is dim / {patch // 2}), got dim={dim}")
    if local_patch_kernel_size % 2 == 0:
        raise ValueError(f"local_patch_kernel_size must be odd, got {local_patch_kernel_size}")
    vit.non_negative_int('num_classes', num_classes)
    for name, value in dict(dropout=dropout, emb_dropout=emb_dropout, layer_dropout=layer_dropout).items():
        vit.probability(name, value)
    if layer_scale_init is not None:        # None: the paper's rule from depth
        vit.positive_float('layer_scale_init', layer_scale_init)
    vit.positive_float('norm_eps', norm_eps)
    for name, value in dict(tokens_norm=tokens_norm, qkv_bias=qkv_bias).items():
        vit.boolean(name, value)



# loading checkpoints


def timm_plan(model, keys):
    """timm's `Xcit` (the `xcit_*` models) -> XCiT.

    Names differ, values do not, except: timm's stem keeps each convolution and its BatchNorm in a
    pair (ours one Sequential), its Fourier projection is a 1x1 convolution (a Linear here), its class
    attention keeps k and v apart (one `to_kv` here), and the cls token has a leading batch axis.
    """
    state = model.state_dict()
    if ('blocks.0.attn.qkv.bias' in keys) != ('xcit_transformer.layers.0.0.fn.to_qkv.bias' in state):
        has = 'blocks.0.attn.qkv.bias' in keys
        raise ValueError(f"build the model with qkv_bias={has} (the checkpoint's attention "
                         f"{'has' if has else 'has no'} qkv bias)")
    dim = state['cls_token'].shape[-1]
    hidden = state['pos_embedding.to_embedding.weight'].shape[1]
    plan = {
        'cls_token': ({'cls_token': (1, 1, dim)}, lambda t: t[0]),
        'pos_embedding.to_embedding.weight': ({'pos_embed.token_projection.weight': (dim, hidden, 1, 1)},
                                              lambda w: rearrange(w, 'd k 1 1 -> d k')),
    }
    names = {'pos_embedding.to_embedding.': 'pos_embed.token_projection.', 'norm.': 'norm.', 'mlp_head.': 'head.'}
    # the stem: ours (conv, BatchNorm, GELU) x n in one Sequential; timm's proj.(2j) is (conv, BatchNorm),
    # proj.(2j + 1) a GELU
    for index in range(0, len(model.to_patch_embedding[0]), 3):
        for part in (0, 1):
            names[f'to_patch_embedding.0.{index + part}.'] = f'patch_embed.proj.{2 * (index // 3)}.{part}.'
    for i in range(len(model.xcit_transformer.layers)):
        ours, block = f'xcit_transformer.layers.{i}.', f'blocks.{i}.'
        names.update({
            ours + '0.scale': block + 'gamma1', ours + '0.fn.norm.': block + 'norm1.',
            ours + '0.fn.to_qkv.': block + 'attn.qkv.', ours + '0.fn.to_out.0.': block + 'attn.proj.',
            ours + '0.fn.temperature': block + 'attn.temperature',
            ours + '1.scale': block + 'gamma3', ours + '1.fn.norm.': block + 'norm3.',
            ours + '1.fn.net.0.': block + 'local_mp.conv1.', ours + '1.fn.net.2.': block + 'local_mp.bn.',
            ours + '1.fn.net.3.': block + 'local_mp.conv2.',
            ours + '2.scale': block + 'gamma2', ours + '2.fn.net.0.': block + 'norm2.',
            ours + '2.fn.net.1.': block + 'mlp.fc1.', ours + '2.fn.net.4.': block + 'mlp.fc2.',
        })
    for i in range(len(model.cls_transformer)):
        ours, block = f'cls_transformer.{i}.', f'cls_attn_blocks.{i}.'
        names.update({
            ours + 'attn_scale': block + 'gamma1', ours + 'norm.': block + 'norm1.',
            ours + 'attn.to_q.': block + 'attn.q.',
            ours + 'attn.to_out.0.': block + 'attn.proj.', ours + 'ff_scale': block + 'gamma2',
            ours + 'ff_norm.': block + 'norm2.', ours + 'ff.0.': block + 'mlp.fc1.', ours + 'ff.3.': block + 'mlp.fc2.',
        })
        for kind in ('weight', 'bias'):   # timm's separate k and v are our to_kv
            key = ours + f'attn.to_kv.{kind}'
            if key in state:
                plan[key] = vit.joined_kv_plan(state[key], block + f'attn.k.{kind}', block + f'attn.v.{kind}')
    vit.prefixed_plan(state, names, "timm's XCiT", plan)
    return plan, ('head.',)


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's XCiT is another model: it embeds patches with a Linear between LayerNorms and adds a "
        "learned position table (XCiT: a convolutional stem and a Fourier position encoding), scales the "
        "cross-covariance by exp(temperature) (XCiT: the temperature itself), puts BatchNorm before the GELU in "
        "the local patch interaction, and its class attention reads normed patch tokens without updating them")
