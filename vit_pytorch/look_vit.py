"""LookupViT: a few compressed tokens do the heavy work, many lookup tokens are read and updated cheaply.

"LookupViT: Compressing visual information to a limited number of tokens", Koner et al., arXiv 2407.12753:
the image is cut into many small patches, the lookup tokens (n of them), and a few compressed tokens (m << n) are
made from them by resizing their map. In every layer the compressed tokens first read the lookup tokens by
cross-attention, then go through the heavy layer (self-attention and a wide MLP) among themselves only; the lookup
tokens then read the compressed tokens through the same similarities (the cross-attention's logits transposed,
softmax over the compressed tokens: "bidirectional cross-attention") and pass a light MLP. The heavy layers' cost
depends on m alone; the lookup tokens cost O(n m) in the cross-attentions and O(n) in their MLP.

    import torch
    from vit_pytorch.look_vit import LookViT

    model = LookViT(image_size=64, num_classes=10, dim=64, depth=2, heads=4, dim_head=16,
                    patch_size=16, highres_patch_size=8, cross_attn_heads=4, cross_attn_dim_head=16)
    logits = model(torch.randn(2, 3, 64, 64))   # (2, 10); 16 compressed tokens read 64 lookup tokens

The layout is vit-pytorch 1.26.14's LookViT (its arguments and defaults; its checkpoints load through
`vit_pytorch.pretrained.load_vit_pytorch` with equal outputs): the lookup tokens come from a convolution over the
flattened small patches (`patch_conv_kernel_size`), a LayerNorm and the fixed 2D sin-cos table; the compressed
tokens are their bilinear resize to the `patch_size` grid; after the reverse cross-attention the lookup stream is
normed (a LayerNorm on the residual stream, as vit-pytorch has it); the classifier reads the sum of the two streams'
normed means. Where it differs from vit-pytorch's code, the function is the same:
  - LayerNorms are PyTorch's (weight and bias) where vit-pytorch's are bias-free with a unit offset (`gamma + 1`);
    a loaded checkpoint gets weight = gamma + 1 and bias 0. The head has a bias (0 when loaded).
  - The key and value projections of the lookup attention are one Linear (`to_kv`), and the self-attention's
    query, key and value projections one (`to_qkv`).
  - vit-pytorch's `pos_embedding` parameter is never used in its forward; ours has none (loading drops it).
Both cross-attentions take the explicit path (softmax of the logits, then the values) as vit-pytorch's do: the
reverse direction reuses the lookup attention's (m, n) logits, transposed, where the fused kernel would compute
them a second time (measured: about 2% of a training step at S/16's size; docs/performance.md).
Images must have the model's `image_size`, as in vit-pytorch.

`forward_features` returns (b, m + n, dim): the m compressed tokens (the prefix, `num_prefix_tokens`) then the n
lookup tokens on their grid (`token_grid`), each stream after its final norm. The recorder sees three maps a layer:
the lookup cross-attention (b, heads, m, n), the self-attention of the compressed tokens (b, heads, m, m) and the
reverse cross-attention (b, heads, n, m).
"""

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit
from vit_pytorch.simple_vit import posemb_sincos_2d
from vit_pytorch.vit import pair


class CrossAttention(nn.Module):
    """What the two directions share: heads, scale, the normed context (b, j, dim), the recorder's protocol
    (`fused`, `attention_probs`) and the bias-free output projection. `attend(attn, v)` takes the (b, heads, i, j)
    weights (a softmax over j): through `attention_probs`, dropout, times the values (b, heads, j, dim_head), heads
    merged and projected. The path is always the explicit one (`fused` stays False): the two directions share one
    logit matrix, which the fused kernel would compute twice (see the module docstring)."""

    def __init__(self, dim, heads=8, dim_head=64, dropout=0.):
        super().__init__()
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.dropout = dropout
        self.fused = False

        self.norm_context = nn.LayerNorm(dim)
        self.attention_probs = nn.Identity()
        self.to_out = nn.Sequential(nn.Linear(heads * dim_head, dim, bias=False), nn.Dropout(dropout))

    def attend(self, attn, v):
        out = F.dropout(self.attention_probs(attn), self.dropout, self.training) @ v
        return self.to_out(rearrange(out, 'b h i d -> b i (h d)'))


class LookupAttention(CrossAttention):
    """The compressed tokens read the lookup tokens: queries from the normed compressed tokens (b, m, dim), keys and
    values from the normed lookup tokens (b, n, dim). Returns the (b, m, dim) output and the logits
    q k^T / sqrt(dim_head), (b, heads, m, n), which the reverse direction reuses."""

    def __init__(self, dim, heads=8, dim_head=64, dropout=0.):
        super().__init__(dim, heads, dim_head, dropout)
        self.norm = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, heads * dim_head, bias=False)
        self.to_kv = nn.Linear(dim, heads * dim_head * 2, bias=False)

    def forward(self, compressed, lookup):
        q = rearrange(self.to_q(self.norm(compressed)), 'b m (h d) -> b h m d', h=self.heads)
        k, v = rearrange(self.to_kv(self.norm_context(lookup)), 'b n (kv h d) -> kv b h n d', kv=2, h=self.heads)
        dots = (q * self.scale) @ k.transpose(-1, -2)
        return self.attend(dots.softmax(dim=-1), v), dots


class ReverseAttention(CrossAttention):
    """The lookup tokens read the compressed tokens through the lookup attention's logits (b, heads, m, n)
    transposed, softmax over the compressed tokens. Only the values, from the normed compressed tokens, and the
    output projection are this module's. (b, m, dim) compressed tokens -> (b, n, dim)."""

    def __init__(self, dim, heads=8, dim_head=64, dropout=0.):
        super().__init__(dim, heads, dim_head, dropout)
        self.to_v = nn.Linear(dim, heads * dim_head, bias=False)

    def forward(self, compressed, dots):
        v = rearrange(self.to_v(self.norm_context(compressed)), 'b m (h d) -> b h m d', h=self.heads)
        # softmax over the compressed tokens where the logits lie (dim -2), then seen as (b, heads, n, m): no copy of
        # the transposed logits, which a softmax over the last dim of the transposed view would make
        return self.attend(dots.softmax(dim=-2).transpose(-1, -2), v)


class LookupLayer(nn.Module):
    """One LookupViT block on the two streams: (b, m, dim) compressed tokens and (b, n, dim) lookup tokens in,
    the same out."""

    def __init__(self, dim, *, heads, dim_head, mlp_factor, highres_mlp_factor, cross_attn_heads,
                 cross_attn_dim_head, dropout):
        super().__init__()
        self.lookup_attn = LookupAttention(dim, cross_attn_heads, cross_attn_dim_head, dropout)
        self.attn = vit.Attention(dim, heads, dim_head, dropout,
                                  to_out=nn.Sequential(nn.Linear(heads * dim_head, dim, bias=False),
                                                       nn.Dropout(dropout)))
        self.ff = vit.FeedForward(dim, int(dim * mlp_factor), dropout)
        self.reverse_attn = ReverseAttention(dim, cross_attn_heads, cross_attn_dim_head, dropout)
        self.highres_norm = nn.LayerNorm(dim)
        self.highres_ff = vit.FeedForward(dim, int(dim * highres_mlp_factor), dropout)

    def forward(self, z, x):
        out, dots = self.lookup_attn(z, x)              # information gathering
        z = out + z
        z = self.attn(z) + z                            # the heavy layer, on the m compressed tokens only
        z = self.ff(z) + z
        x = self.highres_norm(self.reverse_attn(z, dots) + x)   # global context back to the lookup tokens
        x = self.highres_ff(x) + x                      # their light MLP
        return z, x


class LookupStack(vit.Stack):
    """LookupLayers; `forward(x, compressed=m)` on (b, m + n, dim), the m compressed tokens first, and each layer's
    output (`return_layers`) laid out the same way. Between the layers the two streams travel apart, as a pair:
    joined after every layer and split in the next, they cost a copy of all tokens a layer, forward and backward
    (about 1% of a training step; docs/performance.md)."""

    @staticmethod
    def layer(layer, streams):
        return layer(*streams)

    def forward(self, x, *, compressed, return_layers=False):
        streams, outputs, _ = self.run((x[:, :compressed], x[:, compressed:]), keep_layers=return_layers)
        x = torch.cat(streams, dim=1)
        return (x, [torch.cat(output, dim=1) for output in outputs]) if return_layers else x


class LookViT(vit.TokenFace, nn.Module):
    """vit-pytorch's LookViT (its arguments and defaults). `patch_size` makes the compressed tokens' grid,
    `highres_patch_size` the lookup tokens' (smaller patches, more tokens).

    `num_classes=0` makes `forward` return the pooled embedding (b, dim) (vit-pytorch's returns an empty (b, 0)).
    `forward_features` returns the m compressed then the n lookup tokens after their final norms, (b, m + n, dim);
    `forward_head` adds the two streams' means.
    """

    def __init__(self, *, dim, image_size, num_classes, depth=3, patch_size=16, heads=8, mlp_factor=4, dim_head=64,
                 highres_patch_size=12, highres_mlp_factor=4, cross_attn_heads=8, cross_attn_dim_head=64,
                 patch_conv_kernel_size=7, dropout=0.1, channels=3):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = pair(image_size), pair(patch_size)
        self.highres_patch_size = pair(highres_patch_size)
        self.channels, self.num_classes, self.embed_dim, self.num_features = channels, num_classes, dim, dim
        self.grid_size = self.token_grid(self.image_size)
        self.compressed_grid = vit.patch_grid(self.image_size, self.patch_size)
        self.num_prefix_tokens = math.prod(self.compressed_grid)

        patch_height, patch_width = self.highres_patch_size
        self.to_patches = nn.Sequential(
            Rearrange('b c (h p1) (w p2) -> b (p1 p2 c) h w', p1=patch_height, p2=patch_width),
            nn.Conv2d(patch_height * patch_width * channels, dim, patch_conv_kernel_size,
                      padding=patch_conv_kernel_size // 2),
            Rearrange('b d h w -> b h w d'),
            nn.LayerNorm(dim),
        )
        # fixed, so not saved; a buffer so that it follows .to(device)
        self.register_buffer('pos_embedding', posemb_sincos_2d(*self.grid_size, dim), persistent=False)
        self.transformer = LookupStack([
            LookupLayer(dim, heads=heads, dim_head=dim_head, mlp_factor=mlp_factor,
                        highres_mlp_factor=highres_mlp_factor, cross_attn_heads=cross_attn_heads,
                        cross_attn_dim_head=cross_attn_dim_head, dropout=dropout)
            for _ in range(depth)
        ])
        self.norm = nn.LayerNorm(dim)
        self.highres_norm = nn.LayerNorm(dim)
        self.to_logits = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    @property
    def feature_info(self):
        # each block's output is laid out on the lookup tokens' grid (the compressed tokens are the prefix)
        return [dict(info, reduction=self.highres_patch_size[0]) for info in super().feature_info]

    def token_grid(self, image_size):
        """The (h, w) grid of the lookup tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.highres_patch_size[0], image_size[1] // self.highres_patch_size[1]

    def embed(self, img):
        """The compressed then the lookup tokens, (b, m + n, dim): the lookup tokens with their positions, and
        their map resized (bilinear) to the compressed grid."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.to_patches[1].weight.dtype)
        lookup = self.to_patches(img) + rearrange(self.pos_embedding.to(img.dtype), '(h w) d -> h w d',
                                                  h=self.grid_size[0])
        compressed = F.interpolate(rearrange(lookup, 'b h w d -> b d h w'), self.compressed_grid, mode='bilinear')
        return torch.cat((rearrange(compressed, 'b d h w -> b (h w) d'), rearrange(lookup, 'b h w d -> b (h w) d')),
                         dim=1)

    def forward_features(self, img):
        """The compressed then the lookup tokens after their final norms: (b, m + n, dim)."""
        x = self.transformer(self.embed(img), compressed=self.num_prefix_tokens)
        m = self.num_prefix_tokens
        return torch.cat((self.norm(x[:, :m]), self.highres_norm(x[:, m:])), dim=1)

    def forward_head(self, tokens, pre_logits=False):
        """The compressed tokens' mean plus the lookup tokens' mean, then the head."""
        m = self.num_prefix_tokens
        x = tokens[:, :m].mean(dim=1) + tokens[:, m:].mean(dim=1)       # (b, dim)
        return x if pre_logits else self.to_logits(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.norm.weight, name='to_logits',
                       removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, dim, image_size, num_classes, depth, patch_size, heads, mlp_factor, dim_head,
                    highres_patch_size, highres_mlp_factor, cross_attn_heads, cross_attn_dim_head,
                    patch_conv_kernel_size, dropout, channels):
    image_size = vit.positive_pair('image_size', image_size)
    patch_size, highres_patch_size = (vit.positive_pair('patch_size', patch_size),
                                      vit.positive_pair('highres_patch_size', highres_patch_size))
    vit.patch_grid(image_size, patch_size)
    if image_size[0] % highres_patch_size[0] or image_size[1] % highres_patch_size[1]:
        raise ValueError(f"image_size {image_size} must be divisible by highres_patch_size {highres_patch_size} "
                         f"in both height and width")
    if not all(big > small for big, small in zip(patch_size, highres_patch_size)):
        raise ValueError(f"patch_size {patch_size} (the compressed tokens') must be larger than highres_patch_size "
                         f"{highres_patch_size} (the lookup tokens') on both sides: fewer compressed tokens")
    for name, value in dict(dim=dim, depth=depth, heads=heads, dim_head=dim_head, cross_attn_heads=cross_attn_heads,
                            cross_attn_dim_head=cross_attn_dim_head, channels=channels).items():
        vit.positive_int(name, value)
    if dim % 4 or dim < 8:
        raise ValueError(f"dim must be a multiple of 4 and at least 8 (the sin-cos position table), got {dim}")
    vit.non_negative_int('num_classes', num_classes)
    for name, value in dict(mlp_factor=mlp_factor, highres_mlp_factor=highres_mlp_factor).items():
        if int(dim * vit.positive_float(name, value)) < 1:
            raise ValueError(f"{name} * dim must be at least 1 (the MLP's hidden width), got {value} * {dim}")
    if vit.positive_int('patch_conv_kernel_size', patch_conv_kernel_size) % 2 == 0:
        raise ValueError(f"patch_conv_kernel_size must be odd (the convolution keeps the grid), "
                         f"got {patch_conv_kernel_size}")
    vit.probability('dropout', dropout)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's LookViT: its unit-offset LayerNorms (`gamma`) are ours with weight = gamma + 1 and bias 0, its
    separate key and value projections our `to_kv`, its head's missing bias 0; its unused `pos_embedding` is read
    and dropped. Its block i holds (attention, MLP, lookup attention, reverse attention, norm, light MLP)."""
    state = model.state_dict()
    shape = {key: tuple(tensor.shape) for key, tensor in state.items()}
    dim = model.embed_dim

    def norm(ours, theirs):
        return {ours + 'weight': ({theirs + 'gamma': (dim,)}, lambda gamma: gamma + 1),
                ours + 'bias': ({theirs + 'gamma': (dim,)}, torch.zeros_like)}

    def same(ours, theirs):
        return {ours: ({theirs: shape[ours]}, lambda tensor: tensor)}

    def feedforward(ours, theirs):
        return {**norm(ours + 'net.0.', theirs + '0.'), **same(ours + 'net.1.weight', theirs + '1.weight'),
                **same(ours + 'net.1.bias', theirs + '1.bias'), **same(ours + 'net.4.weight', theirs + '4.weight'),
                **same(ours + 'net.4.bias', theirs + '4.bias')}

    plan = {
        **norm('to_patches.3.', 'to_patches.3.'), **norm('norm.', 'norm.'), **norm('highres_norm.', 'highres_norm.'),
        'to_patches.1.bias': ({'to_patches.1.bias': shape['to_patches.1.bias']}, lambda tensor: tensor),
        # vit-pytorch's pos_embedding is a parameter its forward never reads: taken here and dropped
        'to_patches.1.weight': ({'to_patches.1.weight': shape['to_patches.1.weight'], 'pos_embedding': None},
                                lambda weight, unused: weight),
    }
    if 'to_logits.weight' in state:
        plan.update({**same('to_logits.weight', 'to_logits.weight'),
                     'to_logits.bias': ({'to_logits.weight': shape['to_logits.weight']},
                                        lambda weight: weight.new_zeros(weight.shape[0]))})
    for i in range(len(model.transformer.layers)):
        ours, theirs = f'transformer.layers.{i}.', f'layers.{i}.'
        qkv = shape[ours + 'attn.to_qkv.weight']
        third, half = (qkv[0] // 3, qkv[1]), shape[ours + 'lookup_attn.to_kv.weight']
        half = (half[0] // 2, half[1])
        plan.update({
            **norm(ours + 'attn.norm.', theirs + '0.norm.'),
            ours + 'attn.to_qkv.weight': ({theirs + f'0.to_{name}.weight': third for name in 'qkv'},
                                          lambda q, k, v: torch.cat((q, k, v))),
            **same(ours + 'attn.to_out.0.weight', theirs + '0.to_out.1.weight'),
            **feedforward(ours + 'ff.', theirs + '1.'),
            **norm(ours + 'lookup_attn.norm.', theirs + '2.norm.'),
            **norm(ours + 'lookup_attn.norm_context.', theirs + '2.norm_context.'),
            **same(ours + 'lookup_attn.to_q.weight', theirs + '2.to_q.weight'),
            ours + 'lookup_attn.to_kv.weight': ({theirs + '2.to_k.weight': half, theirs + '2.to_v.weight': half},
                                                lambda k, v: torch.cat((k, v))),
            **same(ours + 'lookup_attn.to_out.0.weight', theirs + '2.to_out.1.weight'),
            **norm(ours + 'reverse_attn.norm_context.', theirs + '3.norm_context.'),
            **same(ours + 'reverse_attn.to_v.weight', theirs + '3.to_v.weight'),
            **same(ours + 'reverse_attn.to_out.0.weight', theirs + '3.to_out.1.weight'),
            **norm(ours + 'highres_norm.', theirs + '4.'),
            **feedforward(ours + 'highres_ff.', theirs + '5.'),
        })
    return plan, ('to_logits.',)
