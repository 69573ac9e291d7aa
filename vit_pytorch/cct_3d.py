"""Compact Convolutional Transformer for videos (CCT-3D).

"Escaping the Big Data Paradigm with Compact Transformers", Hassani et al., arXiv 2104.05704, with
a 3D convolutional tokenizer: `n_conv_layers` x (Conv3d without bias, ReLU, MaxPool3d) turn a video
(b, c, frames, h, w) into tokens, then CCT's encoder (`vit_pytorch.cct`: its layer, stochastic
depth and sequence pooling) classifies them. The arguments and the function are vit-pytorch's
(`vit_pytorch.cct_3d.CCT`, and `cct_2` ... `cct_16`), whose checkpoints load through
`vit_pytorch.pretrained.load_vit_pytorch`.

    import torch
    from vit_pytorch.cct_3d import CCT, cct_7

    model = CCT(img_size=224, num_frames=8, embedding_dim=384, n_conv_layers=2, frame_kernel_size=3,
                kernel_size=7, stride=2, padding=3, pooling_kernel_size=3, pooling_stride=2,
                pooling_padding=1, num_layers=14, num_heads=6, mlp_ratio=3., num_classes=1000,
                positional_embedding='learnable')
    logits = model(torch.randn(1, 3, 8, 224, 224))     # (1, 1000)

    small = cct_7(img_size=32, num_frames=8, kernel_size=3, n_conv_layers=1, num_classes=10)
    logits = small(torch.randn(2, 3, 8, 32, 32))       # (2, 10)

vit-pytorch fixes `dropout_rate=0.` and `attention_dropout=0.1` for its 3D CCT (passing them is an
error there); here they are arguments with those defaults.
"""

import re

import torch
from einops import rearrange
from torch import nn

from vit_pytorch import cct, vit

# helpers


def tokenizer_grid(size, *, layers, kernels, strides, paddings, pool_kernels, pool_strides, pool_paddings):
    """The (frames', h', w') token grid the tokenizer leaves of a (frames, h, w) input."""
    for _ in range(layers):
        size = tuple(vit.conv_output_size(vit.conv_output_size(side, k, s, p), pk, ps, pp) for side, k, s, p, pk, ps, pp
                     in zip(size, kernels, strides, paddings, pool_kernels, pool_strides, pool_paddings))
    return size


# classes


class Tokenizer(nn.Module):
    """`n_conv_layers` x (Conv3d without bias, ReLU, MaxPool3d); (b, c, f, h, w) -> (b, f' h' w', dim).

    Each of kernel, stride, padding and the pooling's is a (frames, h, w) triple.
    """

    def __init__(self, *, channels, dim, n_conv_layers, kernel, stride, padding, pool_kernel, pool_stride,
                 pool_padding, in_planes=64):
        super().__init__()
        widths = [channels] + [in_planes] * (n_conv_layers - 1) + [dim]
        self.conv_layers = nn.Sequential(*[
            nn.Sequential(
                nn.Conv3d(chan_in, chan_out, kernel, stride, padding, bias=False),
                nn.ReLU(),
                nn.MaxPool3d(pool_kernel, pool_stride, pool_padding),
            )
            for chan_in, chan_out in zip(widths[:-1], widths[1:])
        ])
        self.geometry = dict(layers=n_conv_layers, kernels=kernel, strides=stride, paddings=padding,
                             pool_kernels=pool_kernel, pool_strides=pool_stride, pool_paddings=pool_padding)
        for module in self.modules():
            if isinstance(module, nn.Conv3d):
                nn.init.kaiming_normal_(module.weight)

    def grid_size(self, frames, height, width):
        """The (f', h', w') token grid for an input of frames x height x width, without running it."""
        return tokenizer_grid((frames, height, width), **self.geometry)

    def forward(self, video):
        return rearrange(self.conv_layers(video), 'b d f h w -> b (f h w) d')


class CCT(vit.TokenFace, nn.Module):
    """CCT with a 3D tokenizer; `num_classes=0` makes `forward` return the pooled embedding (b, dim).

    `positional_embedding`: 'learnable', 'sine' (a fixed 1D table over the token sequence, not saved)
    or 'none' (then any video size the tokenizer leaves tokens of works). `frame_padding` and
    `frame_pooling_padding` default to half their kernels.

    `forward_features` returns the tokens after the final norm, (b, f' * h' * w', embedding_dim) on the tokenizer's grid.
    """

    num_prefix_tokens = 0

    def __init__(self, img_size=224, num_frames=8, embedding_dim=768, n_input_channels=3, n_conv_layers=1,
                 frame_stride=1, frame_kernel_size=3, frame_padding=None, frame_pooling_kernel_size=1,
                 frame_pooling_stride=1, frame_pooling_padding=None, kernel_size=7, stride=2, padding=3,
                 pooling_kernel_size=3, pooling_stride=2, pooling_padding=1, *, num_layers=12, num_heads=12,
                 mlp_ratio=4.0, num_classes=1000, positional_embedding='sine', dropout_rate=0.,
                 attention_dropout=0.1, stochastic_depth_rate=0.1):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        frame_padding = frame_kernel_size // 2 if frame_padding is None else frame_padding
        if frame_pooling_padding is None:
            frame_pooling_padding = frame_pooling_kernel_size // 2
        self.image_size, self.frames = vit.pair(img_size), num_frames
        self.channels, self.num_classes = n_input_channels, num_classes
        self.tokenizer = Tokenizer(
            channels=n_input_channels, dim=embedding_dim, n_conv_layers=n_conv_layers,
            kernel=(frame_kernel_size, kernel_size, kernel_size), stride=(frame_stride, stride, stride),
            padding=(frame_padding, padding, padding),
            pool_kernel=(frame_pooling_kernel_size, pooling_kernel_size, pooling_kernel_size),
            pool_stride=(frame_pooling_stride, pooling_stride, pooling_stride),
            pool_padding=(frame_pooling_padding, pooling_padding, pooling_padding))
        self.grid_size = self.token_grid((num_frames, *self.image_size))
        sequence_length = self.grid_size[0] * self.grid_size[1] * self.grid_size[2]

        self.positional_embedding = positional_embedding
        if positional_embedding == 'learnable':
            self.positional_emb = nn.Parameter(torch.zeros(sequence_length, embedding_dim))
            nn.init.trunc_normal_(self.positional_emb, std=0.2)
        elif positional_embedding == 'sine':
            self.register_buffer('positional_emb', cct.sinusoidal_embedding(sequence_length, embedding_dim),
                                 persistent=False)
        else:
            self.positional_emb = None
        self.dropout = nn.Dropout(dropout_rate)

        rates = [stochastic_depth_rate * i / max(num_layers - 1, 1) for i in range(num_layers)]   # linear in depth
        self.transformer = cct.Transformer([
            cct.TransformerEncoderLayer(embedding_dim, num_heads, int(embedding_dim * mlp_ratio), dropout_rate,
                                        attention_dropout, rate)
            for rate in rates
        ], norm=nn.LayerNorm(embedding_dim))
        self.pool = cct.SequencePool(embedding_dim)
        self.num_features = embedding_dim
        self.fc = nn.Linear(embedding_dim, num_classes) if num_classes > 0 else None
        self.apply(vit.init_linear_weights)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + 'positional_emb'
        if self.positional_embedding == 'sine' and key in state_dict:
            table = state_dict.pop(key)
            if table.shape != self.positional_emb.shape or not torch.allclose(
                    table.to(self.positional_emb), self.positional_emb, atol=1e-4):
                raise ValueError(f"{key} in the checkpoint is not this model's fixed sine table (shape "
                                 f"{tuple(table.shape)}): build the model with positional_embedding='learnable'")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def token_grid(self, size):
        """The (frames, h, w) grid of tokens the tokenizer leaves for videos of `size` (frames, h, w)."""
        return self.tokenizer.grid_size(*size)

    def forward_features(self, video):
        """Tokens after the final norm: (b, f' h' w', dim)."""
        vit.check_video(video, channels=self.channels, dtype=self.transformer.norm.weight.dtype)
        size = tuple(video.shape[2:])
        if min(self.token_grid(size)) < 1:
            raise ValueError(f"video of {size[0]} frames of {size[1]}x{size[2]} is too small for the tokenizer: "
                             f"it leaves no tokens")
        if self.positional_emb is not None and size != (self.frames, *self.image_size):
            raise ValueError(
                f"video must be {self.frames} frames of {self.image_size[0]}x{self.image_size[1]} (the model's "
                f"num_frames and img_size), got {size[0]} frames of {size[1]}x{size[2]}; positions are a table "
                f"for that size (positional_embedding='none' accepts any size)")
        x = self.tokenizer(video)
        if self.positional_emb is not None:
            x = x + self.positional_emb
        return self.transformer(self.dropout(x))

    def forward_head(self, tokens, pre_logits=False):
        x = self.pool(tokens)
        return x if pre_logits or self.fc is None else self.fc(x)

    def forward(self, video):
        return self.forward_head(self.forward_features(video))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.transformer.norm.weight, name='fc')

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


def _cct(name, *, kernel_size=3, stride=None, padding=None, **kwargs):
    num_layers, num_heads, mlp_ratio, embedding_dim = cct.CONFIGS[name]
    stride = max(1, kernel_size // 2 - 1) if stride is None else stride
    padding = max(1, kernel_size // 2) if padding is None else padding
    return CCT(num_layers=num_layers, num_heads=num_heads, mlp_ratio=mlp_ratio, embedding_dim=embedding_dim,
               kernel_size=kernel_size, stride=stride, padding=padding, **kwargs)


def cct_2(**kwargs):
    """CCT-2 (2 layers, 2 heads, width 128, MLP ratio 1) with a 3D tokenizer; other arguments as for `CCT`."""
    return _cct('cct_2', **kwargs)


def cct_4(**kwargs):
    return _cct('cct_4', **kwargs)


def cct_6(**kwargs):
    return _cct('cct_6', **kwargs)


def cct_7(**kwargs):
    return _cct('cct_7', **kwargs)


def cct_8(**kwargs):
    return _cct('cct_8', **kwargs)


def cct_14(**kwargs):
    return _cct('cct_14', **kwargs)


def cct_16(**kwargs):
    return _cct('cct_16', **kwargs)


# argument checks


def check_arguments(*, img_size, num_frames, embedding_dim, n_input_channels, n_conv_layers, frame_stride,
                    frame_kernel_size, frame_padding, frame_pooling_kernel_size, frame_pooling_stride,
                    frame_pooling_padding, kernel_size, stride, padding, pooling_kernel_size, pooling_stride,
                    pooling_padding, num_layers, num_heads, mlp_ratio, num_classes, positional_embedding,
                    dropout_rate, attention_dropout, stochastic_depth_rate):
    vit.positive_int('num_frames', num_frames)
    for name, value in dict(frame_stride=frame_stride, frame_kernel_size=frame_kernel_size,
                            frame_pooling_kernel_size=frame_pooling_kernel_size,
                            frame_pooling_stride=frame_pooling_stride).items():
        vit.positive_int(name, value)
    for name, value in dict(frame_padding=frame_padding, frame_pooling_padding=frame_pooling_padding).items():
        if value is not None:
            vit.non_negative_int(name, value)
    pooling = frame_pooling_kernel_size // 2 if frame_pooling_padding is None else frame_pooling_padding
    if pooling > frame_pooling_kernel_size // 2:
        raise ValueError(f"frame_pooling_padding must be at most half of frame_pooling_kernel_size "
                         f"({frame_pooling_kernel_size}), got {frame_pooling_padding}")
    # the spatial arguments are the 2D CCT's; its check also refuses an img_size the tokenizer empties
    cct.check_arguments(img_size=img_size, embedding_dim=embedding_dim, n_input_channels=n_input_channels,
                        n_conv_layers=n_conv_layers, kernel_size=kernel_size, stride=stride, padding=padding,
                        pooling_kernel_size=pooling_kernel_size, pooling_stride=pooling_stride,
                        pooling_padding=pooling_padding, num_layers=num_layers, num_heads=num_heads,
                        mlp_ratio=mlp_ratio, num_classes=num_classes, positional_embedding=positional_embedding,
                        dropout_rate=dropout_rate, attention_dropout=attention_dropout,
                        stochastic_depth_rate=stochastic_depth_rate)
    padding_frames = frame_kernel_size // 2 if frame_padding is None else frame_padding
    frames = tokenizer_grid((num_frames,), layers=n_conv_layers, kernels=(frame_kernel_size,),
                            strides=(frame_stride,), paddings=(padding_frames,),
                            pool_kernels=(frame_pooling_kernel_size,), pool_strides=(frame_pooling_stride,),
                            pool_paddings=(pooling,))[0]
    if frames < 1:
        raise ValueError(f"num_frames {num_frames} is too few for the tokenizer's frame kernels and strides: it "
                         f"leaves {frames} frames of tokens")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's 3D CCT: the 2D CCT's names (`cct.REFERENCE_KEYS`; its convolutions are Conv3d), the
    position table with a leading batch axis; a 'sine' model checks the saved table against its own
    (`CCT._load_from_state_dict`)."""
    state = model.state_dict()
    plan, unknown = {}, []
    for key in keys:
        ours = next((re.sub(pattern, replacement, key) for pattern, replacement in cct.REFERENCE_KEYS
                     if re.match(pattern, key)), None)
        if ours == 'positional_emb' and model.positional_emb is not None:
            plan[ours] = ({key: (1, *model.positional_emb.shape)}, lambda t: t[0])
        elif ours in state:
            plan[ours] = ({key: tuple(state[ours].shape)}, lambda t: t)
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"no part of this 3D CCT takes {', '.join(unknown[:5])}: build it with the checkpoint's "
                         f"positional_embedding, num_classes and layers")
    return plan, ()
