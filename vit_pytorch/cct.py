"""Compact Convolutional Transformer (CCT).

"Escaping the Big Data Paradigm with Compact Transformers", Hassani et al., arXiv 2104.05704:
replace the patch embedding by a small convolutional tokenizer (conv, ReLU, max-pool, repeated)
and the cls token by sequence pooling (a learned softmax weighting of the output tokens), so that
a compact transformer trains well from scratch on small datasets.

The named configurations follow the reference implementation (SHI-Labs/Compact-Transformers):
`cct_7(img_size=32, kernel_size=3, n_conv_layers=1, num_classes=10, positional_embedding='learnable')`
is CCT-7/3x1, the paper's CIFAR-10 model, with 3,760,139 parameters (3.76M in the paper).
The layer is the reference one: x + attention(LayerNorm(x)), then a LayerNorm of the residual
stream itself, then x + MLP(x); stochastic depth grows linearly over the layers. Checkpoints of
the reference code (and of `vit-pytorch`'s port of it) load through
`vit_pytorch.pretrained.load_vit_pytorch(model, path)`, or a state_dict converted by
`convert_reference_state_dict`.

    import torch
    from vit_pytorch.cct import CCT, cct_7

    model = cct_7(img_size=32, kernel_size=3, n_conv_layers=1, num_classes=10,
                  positional_embedding='learnable')
    logits = model(torch.randn(2, 3, 32, 32))   # (2, 10)

    model = CCT(img_size=(224, 448), embedding_dim=384, n_conv_layers=2, kernel_size=7, stride=2,
                padding=3, pooling_kernel_size=3, pooling_stride=2, pooling_padding=1,
                num_layers=14, num_heads=6, mlp_ratio=3., num_classes=1000,
                positional_embedding='learnable')
    logits = model(torch.randn(1, 3, 224, 448))  # (1, 1000)
"""

import re

import torch
from einops import einsum, rearrange, repeat
from torch import nn

from vit_pytorch import vit

# named configurations: (num_layers, num_heads, mlp_ratio, embedding_dim)
CONFIGS = {
    'cct_2': (2, 2, 1, 128),
    'cct_4': (4, 2, 1, 128),
    'cct_6': (6, 4, 2, 256),
    'cct_7': (7, 4, 2, 256),
    'cct_8': (8, 4, 2, 256),
    'cct_14': (14, 6, 3, 384),
    'cct_16': (16, 6, 3, 384),
}

POSITIONAL_EMBEDDINGS = ('sine', 'learnable', 'none')

# reference (SHI-Labs/Compact-Transformers and vit-pytorch) key -> ours
REFERENCE_KEYS = [
    (r'classifier\.blocks\.(\d+)\.pre_norm\.', r'transformer.layers.\1.self_attn.norm.'),
    (r'classifier\.blocks\.(\d+)\.self_attn\.qkv\.', r'transformer.layers.\1.self_attn.to_qkv.'),
    (r'classifier\.blocks\.(\d+)\.self_attn\.proj\.', r'transformer.layers.\1.self_attn.to_out.0.'),
    (r'classifier\.blocks\.(\d+)\.linear1\.', r'transformer.layers.\1.mlp.0.'),
    (r'classifier\.blocks\.(\d+)\.norm1\.', r'transformer.layers.\1.norm1.'),
    (r'classifier\.blocks\.(\d+)\.linear2\.', r'transformer.layers.\1.mlp.3.'),
    (r'classifier\.norm\.', 'transformer.norm.'),
    (r'classifier\.attention_pool\.', 'pool.attention_pool.'),
    (r'classifier\.fc\.', 'fc.'),
    (r'classifier\.positional_emb$', 'positional_emb'),
    (r'tokenizer\.conv_layers\.(\d+)\.0\.weight$', r'tokenizer.conv_layers.\1.0.weight'),
]

# helpers


def sinusoidal_embedding(length, dim):
    """The reference's 1D table: sin(p / 10000 ** (2 (i // 2) / dim)) at even i, cos at odd i; (length, dim)."""
    position = torch.arange(length, dtype=torch.float64)[:, None]
    channel = torch.arange(dim)
    angles = position / 10000 ** (2 * (channel // 2) / dim)
    return torch.where(channel % 2 == 0, angles.sin(), angles.cos()).float()


def convert_reference_state_dict(state_dict):
    """A checkpoint of the reference CCT (SHI-Labs/Compact-Transformers, or vit-pytorch's port) in our keys.

    The reference saves its position table, learned or sine, as `classifier.positional_emb`
    (1, n, dim); it becomes `positional_emb` (n, dim). A 'sine' model checks that table against
    its own on loading and drops it. Keys the converter does not know raise a ValueError.
    """
    converted, unknown = {}, []
    for key, value in state_dict.items():
        for pattern, replacement in REFERENCE_KEYS:
            if re.match(pattern, key):
                new_key = re.sub(pattern, replacement, key)
                converted[new_key] = value[0] if new_key == 'positional_emb' else value
                break
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"state_dict has keys the reference CCT converter does not know "
                         f"(a cls-token model, or not a CCT checkpoint?): {unknown[:5]}")
    return converted


def tokenizer_grid(size, layers, kernel, stride, padding, pool_kernel, pool_stride, pool_padding):
    """The (h', w') token grid the tokenizer leaves of an input of `size` (h, w)."""
    height, width = size
    for _ in range(layers):
        height, width = (vit.conv_output_size(vit.conv_output_size(side, kernel, stride, padding),
                                          pool_kernel, pool_stride, pool_padding) for side in (height, width))
    return height, width


# classes


class Tokenizer(nn.Module):
    """`n_conv_layers` x (conv without bias, ReLU, max-pool); (b, c, h, w) -> (b, h' w', dim)."""

    def __init__(self, *, channels, dim, n_conv_layers, kernel_size, stride, padding,
                 pooling_kernel_size, pooling_stride, pooling_padding, in_planes=64):
        super().__init__()
        widths = [channels] + [in_planes] * (n_conv_layers - 1) + [dim]
        self.conv_layers = nn.Sequential(*[
            nn.Sequential(
                nn.Conv2d(chan_in, chan_out, kernel_size, stride, padding, bias=False),
                nn.ReLU(),
                nn.MaxPool2d(pooling_kernel_size, pooling_stride, pooling_padding),
            )
            for chan_in, chan_out in zip(widths[:-1], widths[1:])
        ])
        self.geometry = (n_conv_layers, kernel_size, stride, padding,
                         pooling_kernel_size, pooling_stride, pooling_padding)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight)

    def grid_size(self, height, width):
        """The (h', w') token grid for an input of height x width, without running the convolutions."""
        return tokenizer_grid((height, width), *self.geometry)

    def forward(self, img):
        return rearrange(self.conv_layers(img), 'b d h w -> b (h w) d')


class TransformerEncoderLayer(nn.Module):
    def __init__(self, dim, heads, mlp_dim, dropout=0., attention_dropout=0.1, drop_path_rate=0.):
        super().__init__()
        # the core attention (its LayerNorm is CCT's pre-norm), heads of width dim / heads, an output
        # projection even for one head, and separate attention and projection dropouts
        self.self_attn = vit.Attention(dim, heads, dim // heads, attention_dropout,
                                       to_out=nn.Sequential(nn.Linear(dim, dim), nn.Dropout(dropout)))
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, dim),
            nn.Dropout(dropout),
        )
        self.drop_path_rate = drop_path_rate

    def forward(self, x):
        x = x + vit.drop_path(self.self_attn(x), self.drop_path_rate, self.training)
        x = self.norm1(x)            # the reference norms the residual stream itself here
        return x + vit.drop_path(self.mlp(x), self.drop_path_rate, self.training)


class Transformer(vit.Stack):
    """CCT's encoder layers and a final LayerNorm, run (and checkpointed) by the core's stack."""

    @staticmethod
    def layer(encoder_layer, x):
        return encoder_layer(x)


class SequencePool(nn.Module):
    """Sequence pooling: softmax(Linear(x)) over the tokens weights their average; (b, n, d) -> (b, d).

    The (b, n) weights pass through `pool_weights` (an identity) for forward hooks.
    """

    def __init__(self, dim):
        super().__init__()
        self.attention_pool = nn.Linear(dim, 1)
        self.pool_weights = nn.Identity()

    def forward(self, x):
        weights = self.pool_weights(rearrange(self.attention_pool(x), 'b n 1 -> b n').softmax(dim=-1))
        return einsum(weights, x, 'b n, b n d -> b d')


def add_positions(module, kind, length, dim):
    """`module.positional_emb`: a trained (length, dim) table, the fixed sine table (a buffer not saved) or None."""
    if kind == 'learnable':
        module.positional_emb = nn.Parameter(torch.zeros(length, dim))
        nn.init.trunc_normal_(module.positional_emb, std=0.2)
    elif kind == 'sine':
        module.register_buffer('positional_emb', sinusoidal_embedding(length, dim), persistent=False)
    else:
        module.positional_emb = None


def encoder(dim, num_layers, num_heads, mlp_ratio, dropout_rate, attention_dropout, stochastic_depth_rate):
    rates = [stochastic_depth_rate * i / max(num_layers - 1, 1) for i in range(num_layers)]   # linear in depth
    return Transformer([
        TransformerEncoderLayer(dim, num_heads, int(dim * mlp_ratio), dropout_rate, attention_dropout, rate)
        for rate in rates
    ], norm=nn.LayerNorm(dim))


class TransformerClassifier(nn.Module):
    """CCT without its tokenizer: tokens (b, sequence_length, embedding_dim) -> logits (b, num_classes).

    vit-pytorch's block of this name, with its signature: positions ('sine', 'learnable' or 'none';
    a table needs `sequence_length`), dropout, the encoder layers and final norm, then sequence
    pooling (`seq_pool=True`) or a learned class token put in front and read out (`seq_pool=False`),
    then the head (`num_classes=0`: the pooled embedding). Its defaults are vit-pytorch's
    (`dropout_rate=0.1`, where CCT's is 0).
    """

    def __init__(self, seq_pool=True, embedding_dim=768, num_layers=12, num_heads=12, mlp_ratio=4.0,
                 num_classes=1000, dropout_rate=0.1, attention_dropout=0.1, stochastic_depth_rate=0.1,
                 positional_embedding='sine', sequence_length=None):
        check_classifier_arguments(**vit.arguments(locals()))
        super().__init__()
        self.seq_pool = seq_pool
        self.embedding_dim = embedding_dim
        self.class_emb = None if seq_pool else nn.Parameter(torch.zeros(1, embedding_dim))
        length = None if sequence_length is None else sequence_length + (not seq_pool)
        add_positions(self, positional_embedding, length, embedding_dim)
        self.dropout = nn.Dropout(dropout_rate)
        self.transformer = encoder(embedding_dim, num_layers, num_heads, mlp_ratio, dropout_rate, attention_dropout,
                                   stochastic_depth_rate)
        self.pool = SequencePool(embedding_dim) if seq_pool else None
        self.fc = nn.Linear(embedding_dim, num_classes) if num_classes > 0 else None
        self.apply(vit.init_linear_weights)

    def forward(self, x):
        if x.ndim != 3 or x.shape[-1] != self.embedding_dim:
            raise ValueError(f"x must be tokens (b, n, {self.embedding_dim}), got shape {tuple(x.shape)}")
        if self.class_emb is not None:
            x = torch.cat((repeat(self.class_emb, 'n d -> b n d', b=x.shape[0]).to(x.dtype), x), dim=1)
        if self.positional_emb is not None:
            if x.shape[1] != self.positional_emb.shape[0]:
                raise ValueError(f"x must have {self.positional_emb.shape[0] - (not self.seq_pool)} tokens, the "
                                 f"sequence_length of the position table, got {x.shape[1] - (not self.seq_pool)}")
            x = x + self.positional_emb
        x = self.transformer(self.dropout(x))
        x = self.pool(x) if self.seq_pool else x[:, 0]
        return x if self.fc is None else self.fc(x)


class CCT(vit.TokenFace, nn.Module):
    """Compact Convolutional Transformer; `num_classes=0` makes `forward` return the pooled embedding (b, dim).

    `positional_embedding`: 'learnable' (a trained table, the paper's CIFAR models), 'sine' (a fixed
    1D sin-cos table, a buffer that is not saved) or 'none' (then any input size works).

    `forward_features` returns the tokens after the final norm, (b, h' * w', embedding_dim) on the tokenizer's grid.
    The arguments up to `stochastic_depth_rate` may be positional, in vit-pytorch's order; the
    transformer's (`num_layers` on) are keyword-only there too (they pass on as keywords).
    """

    num_prefix_tokens = 0

    def __init__(self, img_size=224, embedding_dim=768, n_input_channels=3, n_conv_layers=1,
                 kernel_size=7, stride=2, padding=3, pooling_kernel_size=3, pooling_stride=2, pooling_padding=1,
                 dropout_rate=0., attention_dropout=0.1, stochastic_depth_rate=0.1, *,
                 num_layers=12, num_heads=12, mlp_ratio=4.0, num_classes=1000, positional_embedding='sine'):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size = vit.pair(img_size)
        self.channels = n_input_channels
        self.num_classes = num_classes
        self.tokenizer = Tokenizer(channels=n_input_channels, dim=embedding_dim, n_conv_layers=n_conv_layers,
                                   kernel_size=kernel_size, stride=stride, padding=padding,
                                   pooling_kernel_size=pooling_kernel_size, pooling_stride=pooling_stride,
                                   pooling_padding=pooling_padding)
        self.grid_size = self.token_grid(self.image_size)
        sequence_length = self.grid_size[0] * self.grid_size[1]

        self.positional_embedding = positional_embedding
        add_positions(self, positional_embedding, sequence_length, embedding_dim)
        self.dropout = nn.Dropout(dropout_rate)
        self.transformer = encoder(embedding_dim, num_layers, num_heads, mlp_ratio, dropout_rate, attention_dropout,
                                   stochastic_depth_rate)
        self.pool = SequencePool(embedding_dim)
        self.num_features = embedding_dim
        self.fc = nn.Linear(embedding_dim, num_classes) if num_classes > 0 else None
        self.apply(vit.init_linear_weights)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + 'positional_emb'
        if self.positional_embedding == 'sine' and key in state_dict:
            table = state_dict.pop(key)
            if table.shape != self.positional_emb.shape or not torch.allclose(
                    table.to(self.positional_emb), self.positional_emb, atol=1e-4):
                raise ValueError(
                    f"{key} in the checkpoint is not this model's fixed sine table "
                    f"(shape {tuple(table.shape)}): build the model with positional_embedding='learnable'"
                )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward_features(self, img):
        """Tokens after the final norm: (b, h' w', dim)."""
        vit.check_images(img, channels=self.channels, patch_size=(1, 1),
                         dtype=self.transformer.norm.weight.dtype)
        height, width = img.shape[-2:]
        if min(self.tokenizer.grid_size(height, width)) < 1:
            raise ValueError(f"img of {height}x{width} (h x w) is too small for the tokenizer: it leaves no tokens")
        if self.positional_emb is not None and tuple(img.shape[-2:]) != self.image_size:
            raise ValueError(
                f"img must be {self.image_size[0]}x{self.image_size[1]} (h x w), the model's img_size, got "
                f"{img.shape[-2]}x{img.shape[-1]}; positions are a table for that size "
                f"(positional_embedding='none' accepts any size)"
            )
        x = self.tokenizer(img)
        if self.positional_emb is not None:
            x = x + self.positional_emb
        return self.transformer(self.dropout(x))

    def forward_head(self, tokens, pre_logits=False):
        x = self.pool(tokens)
        return x if pre_logits or self.fc is None else self.fc(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def token_grid(self, image_size):
        """The (h, w) grid of tokens the convolutional tokenizer leaves for images of `image_size` (h, w)."""
        return self.tokenizer.grid_size(*image_size)

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.transformer.norm.weight, name='fc')

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


def _cct(name, *, kernel_size=3, stride=None, padding=None, **kwargs):
    num_layers, num_heads, mlp_ratio, embedding_dim = CONFIGS[name]
    stride = max(1, kernel_size // 2 - 1) if stride is None else stride
    padding = max(1, kernel_size // 2) if padding is None else padding
    return CCT(num_layers=num_layers, num_heads=num_heads, mlp_ratio=mlp_ratio, embedding_dim=embedding_dim,
               kernel_size=kernel_size, stride=stride, padding=padding, **kwargs)


def cct_2(**kwargs):
    """CCT-2 (2 layers, 2 heads, width 128, MLP ratio 1); other arguments as for `CCT`."""
    return _cct('cct_2', **kwargs)


def cct_4(**kwargs):
    """CCT-4 (4 layers, 2 heads, width 128, MLP ratio 1)."""
    return _cct('cct_4', **kwargs)


def cct_6(**kwargs):
    """CCT-6 (6 layers, 4 heads, width 256, MLP ratio 2)."""
    return _cct('cct_6', **kwargs)


def cct_7(**kwargs):
    """CCT-7 (7 layers, 4 heads, width 256, MLP ratio 2)."""
    return _cct('cct_7', **kwargs)


def cct_8(**kwargs):
    """CCT-8 (8 layers, 4 heads, width 256, MLP ratio 2)."""
    return _cct('cct_8', **kwargs)


def cct_14(**kwargs):
    """CCT-14 (14 layers, 6 heads, width 384, MLP ratio 3)."""
    return _cct('cct_14', **kwargs)


def cct_16(**kwargs):
    """CCT-16 (16 layers, 6 heads, width 384, MLP ratio 3)."""
    return _cct('cct_16', **kwargs)


# argument checks


def check_arguments(*, img_size, embedding_dim, n_input_channels, n_conv_layers, kernel_size, stride, padding,
                    pooling_kernel_size, pooling_stride, pooling_padding, num_layers, num_heads, mlp_ratio,
                    num_classes, positional_embedding, dropout_rate, attention_dropout, stochastic_depth_rate):
    image_size = vit.positive_pair('img_size', img_size)
    for name, value in dict(embedding_dim=embedding_dim, n_input_channels=n_input_channels,
                            n_conv_layers=n_conv_layers, kernel_size=kernel_size, stride=stride,
                            pooling_kernel_size=pooling_kernel_size, pooling_stride=pooling_stride,
                            num_layers=num_layers, num_heads=num_heads).items():
        vit.positive_int(name, value)
    for name, value in dict(padding=padding, pooling_padding=pooling_padding, num_classes=num_classes).items():
        vit.non_negative_int(name, value)
    for name, value in dict(dropout_rate=dropout_rate, attention_dropout=attention_dropout,
                            stochastic_depth_rate=stochastic_depth_rate).items():
        vit.probability(name, value)
    expected = 'a number > 0 (the MLP width over embedding_dim)'
    if int(embedding_dim * vit.finite_number('mlp_ratio', mlp_ratio, expected)) < 1:
        raise ValueError(f"mlp_ratio must give an MLP width of at least 1 (int(embedding_dim * mlp_ratio)), "
                         f"got {mlp_ratio} with embedding_dim {embedding_dim}")
    if embedding_dim % num_heads:
        raise ValueError(f"embedding_dim {embedding_dim} must be divisible by num_heads {num_heads}")
    if pooling_padding > pooling_kernel_size // 2:
        raise ValueError(f"pooling_padding must be at most half of pooling_kernel_size "
                         f"({pooling_kernel_size}), got {pooling_padding}")
    if positional_embedding not in POSITIONAL_EMBEDDINGS:
        raise ValueError(f"positional_embedding must be one of {POSITIONAL_EMBEDDINGS}, got {positional_embedding!r}")

    grid = tokenizer_grid(image_size, n_conv_layers, kernel_size, stride, padding, pooling_kernel_size,
                          pooling_stride, pooling_padding)
    if min(grid) < 1:
        raise ValueError(f"img_size {image_size} is too small for the tokenizer: it leaves a {grid} token grid")


def check_classifier_arguments(*, seq_pool, embedding_dim, num_layers, num_heads, mlp_ratio, num_classes,
                               dropout_rate, attention_dropout, stochastic_depth_rate, positional_embedding,
                               sequence_length):
    if not isinstance(seq_pool, bool):
        raise TypeError(f"seq_pool must be True (sequence pooling) or False (a class token), got {seq_pool!r}")
    for name, value in dict(embedding_dim=embedding_dim, num_layers=num_layers, num_heads=num_heads).items():
        vit.positive_int(name, value)
    vit.non_negative_int('num_classes', num_classes)
    for name, value in dict(dropout_rate=dropout_rate, attention_dropout=attention_dropout,
                            stochastic_depth_rate=stochastic_depth_rate).items():
        vit.probability(name, value)
    if int(embedding_dim * vit.finite_number('mlp_ratio', mlp_ratio, 'a number > 0')) < 1:
        raise ValueError(f"mlp_ratio must give an MLP width of at least 1 (int(embedding_dim * mlp_ratio)), "
                         f"got {mlp_ratio} with embedding_dim {embedding_dim}")
    if embedding_dim % num_heads:
        raise ValueError(f"embedding_dim {embedding_dim} must be divisible by num_heads {num_heads}")
    if positional_embedding not in POSITIONAL_EMBEDDINGS:
        raise ValueError(f"positional_embedding must be one of {POSITIONAL_EMBEDDINGS}, got {positional_embedding!r}")
    if positional_embedding != 'none':
        if sequence_length is None:
            raise ValueError(f"positional_embedding={positional_embedding!r} needs sequence_length (the number of "
                             f"tokens); give it, or positional_embedding='none'")
        vit.positive_int('sequence_length', sequence_length)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's CCT (a port of SHI-Labs/Compact-Transformers, whose checkpoints have the same keys):
    renamed by REFERENCE_KEYS; the position table loses its leading batch axis, and a 'sine' model
    checks the saved table against its own (`CCT._load_from_state_dict`)."""
    state = model.state_dict()
    plan, unknown = {}, []
    for key in keys:
        ours = next((re.sub(pattern, replacement, key) for pattern, replacement in REFERENCE_KEYS
                     if re.match(pattern, key)), None)
        if ours == 'positional_emb' and model.positional_emb is not None:
            plan[ours] = ({key: (1, *model.positional_emb.shape)}, lambda t: t[0])
        elif ours in state:
            plan[ours] = ({key: tuple(state[ours].shape)}, lambda t: t)
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"no part of this CCT takes {', '.join(unknown[:5])}: build it with the checkpoint's "
                         f"positional_embedding, num_classes and layers (a cls-token CCT, seq_pool=False, is "
                         f"not offered)")
    return plan, ()
