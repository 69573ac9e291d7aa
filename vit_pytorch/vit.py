"""Vision Transformer.

"An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale",
Dosovitskiy et al., arXiv 2010.11929: cut the image into patches, embed each patch
linearly, add a learned position embedding, and run a plain pre-norm Transformer
encoder; classify from a learned cls token (or from the mean of the patch tokens).

By default the patch embedding carries LayerNorms on both sides of the projection
("Dual PatchNorm", Kumar et al., arXiv 2302.01327), as in the `vit-pytorch`
package, whose checkpoints load here unchanged. `patch_norm=False, qkv_bias=True,
norm_eps=1e-6` give the paper's model exactly (see `vit_pytorch.pretrained`).

    import torch
    from vit_pytorch import ViT

    model = ViT(image_size=224, patch_size=16, num_classes=1000,
                dim=384, depth=12, heads=6, mlp_dim=1536)
    logits = model(torch.randn(2, 3, 224, 224))   # (2, 1000)

This file needs only torch and einops; copy it as is. It reads top to bottom: the
attention primitive, the FeedForward and Attention blocks, the Stack and the Transformer (and
SimpleViT's), the patch and tubelet embeddings and the ViT; then the blocks the token-level
variants share (drop-path, LayerScale, class attention, rotary positions, patch dropout, NaViT's packed
sequences, the zero head, the Linear initialisation, position-table resampling, stage
selection); then the argument checks and the compatibility with old checkpoint layouts.
The blocks of multi-scale models (windows, stages, spatial reduction) live in
`vit_pytorch.multiscale`, which builds on this file; this file imports nothing of the package.
"""

import inspect
import math
import re
from types import MappingProxyType

import torch
import torch.nn.functional as F
from einops import einsum, rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn
from torch.utils.checkpoint import checkpoint


def attend(q, k, v, *, scale, dropout=0., fused=True, probs=None, mask=None):
    """softmax(q k^T * scale + mask) v for (..., n, d) queries and (..., m, d) keys and values.

    The one attention computation of the package. `fused=True` runs
    `scaled_dot_product_attention`; `fused=False` forms the (..., n, m) matrix and passes it
    through `probs` (an `nn.Identity` whose forward hook is how `vit_pytorch.recorder` sees
    it). `mask` is boolean (True: may attend) or an additive float bias. An empty batch takes the
    explicit path: the fused kernel gives a learned bias passed as `mask` no (zero) gradient there. So does a
    float mask that needs a gradient on the CPU (a learned position bias in training), without dropout: there the
    kernel is its math path, the same product plus a safe softmax's `all` and `where` over every map, and the
    explicit product's forward and backward are 1.09-1.23x faster at Swin-T's window shapes (docs/performance.md).
    """
    math_path = (q.device.type == 'cpu' and not dropout and mask is not None and mask.requires_grad
                 and torch.is_grad_enabled())
    if fused and q.numel() and not math_path:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)
    dots = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        dots = dots.masked_fill(~mask, float('-inf')) if mask.dtype == torch.bool else dots + mask
    attn = dots.softmax(dim=-1)
    if probs is not None:
        attn = probs(attn)
    return F.dropout(attn, dropout) @ v


class FeedForward(nn.Module):
    """Pre-norm MLP, (b, n, dim) -> (b, n, dim): LayerNorm, Linear, GELU, Dropout, Linear, Dropout in `net`.

    The layouts of vit-pytorch's other MLPs, so that their keys load unchanged: `dropout=None` leaves the
    Dropout layers out (SimpleViT's: keys net.0, net.1, net.3), `activation` replaces the GELU (MobileViT's
    SiLU), `norm_bias=False` gives a LayerNorm without bias (NaViT's), `norm` replaces the LayerNorm (ViT-5's
    and LeVJEPA's RMSNorm), `gated=True` makes the first Linear twice as wide and its second half, through the
    activation, gate the first (GEGLU, Shazeer, arXiv 2002.05202; RvT's), `linear` builds both Linears from
    (in_features, out_features) (a Linear that transforms its input first: decorrelated backpropagation's, in
    vit_with_decorr). NaViT and MobileViT hold the MLP as a bare Sequential: they take this module's `net`.
    """

    def __init__(self, dim, hidden_dim, dropout=0., *, norm_eps=1e-5, gelu_approximate='none', norm_bias=True,
                 activation=None, norm=None, gated=False, linear=nn.Linear):
        super().__init__()

        def drop():
            return [] if dropout is None else [nn.Dropout(dropout)]
        activation = nn.GELU(approximate=gelu_approximate) if activation is None else activation
        self.net = nn.Sequential(
            nn.LayerNorm(dim, eps=norm_eps, bias=norm_bias) if norm is None else norm,
            linear(dim, hidden_dim * 2 if gated else hidden_dim),
            Gated(activation) if gated else activation,
            *drop(),
            linear(hidden_dim, dim),
            *drop(),
        )

    def forward(self, x):
        return self.net(x)


class Gated(nn.Module):
    """(..., 2 d) -> (..., d): the first half times `activation` of the second (a gated linear unit's gate)."""

    def __init__(self, activation):
        super().__init__()
        self.activation = activation

    def forward(self, x):
        x, gates = x.chunk(2, dim=-1)
        return self.activation(gates) * x


class Attention(nn.Module):
    """Pre-norm multi-head self-attention, (b, n, dim) -> (b, n, dim).

    `to_out` replaces the output projection (default: Linear then Dropout, left out as
    vit-pytorch does when one head already has the model's width); `norm` and `to_qkv` replace the
    pre-norm and the query/key/value projection (a variant with other parameters for some tokens); `linear`
    builds the default projections from (in_features, out_features, bias=...) (a Linear that transforms its
    input first: decorrelated backpropagation's, in vit_with_decorr). `fused` and `attention_probs` are the
    recorder's protocol (see `attend`).
    """

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., *, qkv_bias=False, norm_eps=1e-5, norm_bias=True,
                 to_out=None, norm=None, to_qkv=None, linear=nn.Linear):
        super().__init__()
        inner_dim = heads * dim_head
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.dropout = dropout
        self.fused = True

        self.norm = nn.LayerNorm(dim, eps=norm_eps, bias=norm_bias) if norm is None else norm
        if to_qkv is None and linear is not nn.Linear:
            to_qkv = linear(dim, inner_dim * 3, bias=qkv_bias)
        if to_qkv is None:
            self.build_projections(dim, inner_dim, bias=qkv_bias)
        else:
            self.to_qkv = to_qkv
        self.attention_probs = nn.Identity()
        if to_out is None:
            to_out = nn.Identity() if heads == 1 and dim_head == dim else \
                nn.Sequential(linear(inner_dim, dim), nn.Dropout(dropout))
        self.to_out = to_out

    def build_projections(self, dim, inner_dim, *, bias):
        """The query, key and value projections, one Linear `to_qkv`; a subclass with other projections
        (NaViT's keys and values from a context) overrides this and `qkv` or `forward`."""
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=bias)

    def qkv(self, x, *, key_index=None):
        """Queries, keys and values of the normed tokens: 3 x (b, heads, n, dim_head). `key_index` (b, m): only those
        tokens are keys and values, (b, heads, m, dim_head), and only theirs are projected (MP3's context)."""
        x = self.norm(x)
        if key_index is None:
            return rearrange(self.to_qkv(x), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=self.heads)
        if type(self.to_qkv) is not nn.Linear:          # a Linear subclass may transform its input first
            raise TypeError(f"key_index projects the keys and values of some tokens with the rows of one Linear "
                            f"to_qkv; {type(self).__name__}'s to_qkv is a {type(self.to_qkv).__name__}")
        weight, bias = self.to_qkv.weight, self.to_qkv.bias
        inner = weight.shape[0] // 3
        q = F.linear(x, weight[:inner], None if bias is None else bias[:inner])
        keys = x.gather(1, repeat(key_index, 'b m -> b m d', d=x.shape[-1]))
        kv = F.linear(keys, weight[inner:], None if bias is None else bias[inner:])
        return (rearrange(q, 'b n (h d) -> b h n d', h=self.heads),
                *rearrange(kv, 'b m (kv h d) -> kv b h m d', kv=2, h=self.heads))

    def attend(self, q, k, v, *, scale=None, mask=None):
        """`attend` with this module's scale, dropout (in training) and recording switch."""
        return attend(q, k, v, scale=self.scale if scale is None else scale, mask=mask, fused=self.fused,
                      dropout=self.dropout if self.training else 0., probs=self.attention_probs)

    def forward(self, x, *, mask=None, key_index=None):
        """`mask`: boolean or additive, broadcast to (b, heads, n, keys). `key_index` (b, m): the tokens that alone are
        keys and values, the function of a boolean mask of them at the cost of m keys instead of n."""
        out = self.attend(*(self.qkv(x) if key_index is None else self.qkv(x, key_index=key_index)), mask=mask)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class Stack(nn.Module):
    """A stack of residual layers, then a final norm (`None`: none); the variants compose their encoders from it.

    Each entry of `layers` is one layer; the default `layer` reads an entry as residual
    branches run in turn, x = x + branch(x): (attention, feedforward) is the pre-norm encoder
    layer. Keyword arguments of `forward` go to each layer. `grad_checkpointing=True`
    recomputes each layer's activations in the backward pass instead of storing them.

    Layers can hand state down the stack (the first layer's values for value residuals, earlier
    attention logits, shallow outputs for long skips): a subclass overrides `step(entry, x, state,
    **kwargs)`, which returns the new x and a dict of entries to add to `state`. `state` starts
    empty in each forward and reaches a layer read-only, as the entries of the layers before it; the
    stack merges what a layer returns into a new dict, so a layer that gradient checkpointing runs
    again in the backward pass sees the same state and adds nothing twice. `return_state=True` hands the state
    the last layer left to the caller as well, last of the outputs (what the layers gathered for an auxiliary loss).

        class ValueResidualStack(Stack):      # later layers attend over their values mixed with the first's
            @staticmethod
            def step(branches, x, state):
                attn, ff = branches
                q, k, v = attn.qkv(x)
                first = state.get('values', v)
                out = attn.attend(q, k, (v + first) / 2)
                x = attn.to_out(rearrange(out, 'b h n d -> b n (h d)')) + x
                return ff(x) + x, {'values': first}
    """

    def __init__(self, layers, *, norm=None):
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleList(layer) if isinstance(layer, (list, tuple)) else layer
                                    for layer in layers)
        self.norm = nn.Identity() if norm is None else norm
        self.grad_checkpointing = False

    @staticmethod
    def layer(branches, x, **kwargs):
        attn, *rest = branches
        x = attn(x, **kwargs) + x
        for branch in rest:
            x = branch(x) + x
        return x

    def step(self, entry, x, state, **kwargs):
        """One layer given the `state` the layers before it left: (x, entries to add); by default `layer`, adding none."""
        return self.layer(entry, x, **kwargs), {}

    def run(self, x, *, keep_layers=True, **kwargs):
        """(normed x, every layer's output, the state the layers left): for a stack whose forward returns some of
        that state too (ATS's kept token ids). `keep_layers=False` keeps no layer's output (None in their place), so
        that each is freed once the layers after it are done with it: a list of them holds depth tensors (b, n, dim)
        to the end of the stack (SimpleViT's no_grad forward at depth 48, batch 8, 256 tokens, width 128 peaked 57 MiB
        over its start with the list, 11 MiB without; benchmarks/attn_residual_memory.py, docs/blocks.md)."""
        state, outputs = {}, [] if keep_layers else None
        for layer in self.layers:
            view = MappingProxyType(state)
            if self.grad_checkpointing and torch.is_grad_enabled():
                x, entries = checkpoint(self.step, layer, x, view, use_reentrant=False, **kwargs)
            else:
                x, entries = self.step(layer, x, view, **kwargs)
            state = {**state, **entries}
            if keep_layers:
                outputs.append(x)
        return self.norm(x), outputs, state

    def forward(self, x, *, return_layers=False, return_state=False, **kwargs):
        x, outputs, state = self.run(x, keep_layers=return_layers, **kwargs)
        returned = (x, *([outputs] if return_layers else []), *([dict(state)] if return_state else []))
        return returned if len(returned) > 1 else x


def init_tokens(*parameters, patch_norm):
    """Start position tables and learned tokens at the scale of the patch tokens they join.

    Patch tokens leave the Dual PatchNorm (`patch_norm=True`) at unit scale, so these start from
    a unit normal, as in vit-pytorch; the paper's plain projection gives small tokens, and they
    start at std 0.02, as in the paper and timm. A table of std 0.02 beside unit-scale patch tokens
    is drowned out, and the model learns worse (a test on the digits checks the difference).
    """
    for parameter in parameters:
        nn.init.normal_(parameter) if patch_norm else nn.init.trunc_normal_(parameter, std=0.02)


class Transformer(Stack):
    """The ViT encoder, vit-pytorch's `Transformer`: `depth` pre-norm (attention, feedforward) layers, then a LayerNorm.

    `forward(x)` returns the normed tokens; vit-pytorch's weights load as they are. `attention` and
    `feedforward` build each layer's blocks with the arguments of `Attention` and `FeedForward` (a
    variant passes its own); `final_norm=False` leaves the norm out.
    """

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0., *, qkv_bias=False, norm_eps=1e-5,
                 gelu_approximate='none', attention=Attention, feedforward=FeedForward, final_norm=True):
        super().__init__([
            (attention(dim, heads, dim_head, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps),
             feedforward(dim, mlp_dim, dropout, norm_eps=norm_eps, gelu_approximate=gelu_approximate))
            for _ in range(depth)
        ], norm=nn.LayerNorm(dim, eps=norm_eps) if final_norm else None)


class SimpleAttention(Attention):
    """SimpleViT's attention (Beyer et al., arXiv 2205.01580; vit-pytorch's `simple_vit.Attention`): the core's
    without dropout and with a bias-free output projection (key `to_out.weight`)."""

    def __init__(self, dim, heads=8, dim_head=64):
        super().__init__(dim, heads, dim_head, to_out=nn.Linear(heads * dim_head, dim, bias=False))


class SimpleTransformer(Stack):
    """SimpleViT's encoder, vit-pytorch's `simple_vit.Transformer`: `depth` (SimpleAttention, FeedForward without
    dropout) layers, then a LayerNorm; `forward(x)` returns the normed tokens. `attention` builds each layer's
    attention from (dim, heads, dim_head); the flash SimpleViTs' options: `final_norm=False` leaves the norm out,
    `fused=False` gives every attention the explicit path."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, *, attention=SimpleAttention, final_norm=True,
                 fused=True):
        super().__init__([(attention(dim, heads, dim_head), FeedForward(dim, mlp_dim, None)) for _ in range(depth)],
                         norm=nn.LayerNorm(dim) if final_norm else None)
        for attention_block, _ in self.layers:
            attention_block.fused = fused


class PatchEmbedding(nn.Sequential):
    """(b, c, h, w) -> (b, h/ph * w/pw, dim): patches flattened as (ph pw c), projected by a Linear (built by
    `linear` from (in_features, out_features)), between two LayerNorms when `patch_norm` (Dual PatchNorm;
    `norm_bias=False`: LayerNorms without bias)."""

    def __init__(self, *, channels, patch_size, dim, patch_norm=True, norm_eps=1e-5, norm_bias=True, linear=nn.Linear):
        patch_height, patch_width = patch_size
        patch_dim = channels * patch_height * patch_width
        super().__init__(
            Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=patch_height, p2=patch_width),
            nn.LayerNorm(patch_dim, eps=norm_eps, bias=norm_bias) if patch_norm else nn.Identity(),
            linear(patch_dim, dim),
            nn.LayerNorm(dim, eps=norm_eps, bias=norm_bias) if patch_norm else nn.Identity(),
        )


class TubeletEmbedding(nn.Sequential):
    """(b, c, f, h, w) -> (b, f/pf * h/ph * w/pw, dim): tubelets flattened as (pf p1 p2 c) and projected,
    between two LayerNorms when `patch_norm` (Dual PatchNorm, as vit-pytorch's video models do)."""

    def __init__(self, *, channels, patch_size, frame_patch_size, dim, patch_norm=True, norm_eps=1e-5):
        patch_height, patch_width = patch_size
        patch_dim = channels * frame_patch_size * patch_height * patch_width
        super().__init__(
            Rearrange('b c (f pf) (h p1) (w p2) -> b (f h w) (pf p1 p2 c)',
                      pf=frame_patch_size, p1=patch_height, p2=patch_width),
            nn.LayerNorm(patch_dim, eps=norm_eps) if patch_norm else nn.Identity(),
            nn.Linear(patch_dim, dim),
            nn.LayerNorm(dim, eps=norm_eps) if patch_norm else nn.Identity(),
        )


def tubelet_grid(size, *, patch_size, frame_patch_size):
    """The (frames, h, w) tubelet grid of a (frames, h, w) video size; of an (h, w) size, one frame's (h, w)."""
    *frames, height, width = size
    spatial = (height // patch_size[0], width // patch_size[1])
    return (frames[0] // frame_patch_size, *spatial) if frames else spatial


def reset_head(model, num_classes, in_features, *, like, name='mlp_head', removed=None):
    """Every model's `reset_classifier`: `model.<name>` becomes a zero-initialised Linear(in_features, num_classes)
    on `like`'s device and dtype, as the paper transfers, or `removed` (what the model holds without classes: None,
    or vit-pytorch's nn.Identity) for 0; sets `model.num_classes`."""
    non_negative_int('num_classes', num_classes)
    model.num_classes = num_classes
    setattr(model, name, zero_linear(in_features, num_classes, like=like) if num_classes > 0 else removed)


def token_layout(model, image_size, num_tokens):
    """How a sequence of `num_tokens` tokens lies on the image: ((h, w) patch grid, number of prefix tokens).

    Read from what every model of the package declares: `model.token_grid(image_size)`, the
    grid of its patch tokens (row-major), and `model.num_prefix_tokens`, the tokens before them
    (cls, distillation, registers). A sequence is the patches alone or the prefix and the
    patches; anything else (pooled stages, channel attention, the other branch of CrossViT)
    gives (None, None), as does a model that declares no grid.
    """
    token_grid, prefix = getattr(model, 'token_grid', None), getattr(model, 'num_prefix_tokens', None)
    if not callable(token_grid) or not isinstance(prefix, int) or image_size is None:
        return None, None
    grid = tuple(token_grid(tuple(image_size)))
    for candidate in (prefix, 0):
        if num_tokens == candidate + grid[0] * grid[1]:
            return grid, candidate
    return None, None


def collect_block_outputs(model, img, transformer):
    """Run the model once; every block output of `transformer`, in order."""
    calls, handles = [], []
    if 'return_layers' in inspect.signature(transformer.forward).parameters:
        asked = []

        def ask_for_layers(module, args, kwargs):
            asked.append(kwargs.get('return_layers', False))
            return args, {**kwargs, 'return_layers': True}

        def take_layers(module, args, kwargs, output):
            calls.append(list(output[1]))
            return output if asked.pop() else output[0]

        handles.append(transformer.register_forward_pre_hook(ask_for_layers, with_kwargs=True))
        handles.append(transformer.register_forward_hook(take_layers, with_kwargs=True))
    else:
        layers = getattr(transformer, 'layers', None)
        if not isinstance(layers, nn.ModuleList):
            raise ValueError(
                f"{type(transformer).__name__} neither supports forward(x, return_layers=True) nor has a "
                f"`layers` ModuleList whose blocks could be hooked"
            )
        calls.append([])
        for block in layers:
            handles.append(block.register_forward_hook(
                lambda module, args, output: calls[-1].append(output[0] if isinstance(output, tuple) else output)))
    try:
        (model.forward_features if hasattr(model, 'forward_features') else model)(img)
    finally:
        for handle in handles:
            handle.remove()
    calls = [outputs for outputs in calls if outputs]
    if len(calls) != 1:
        raise ValueError(
            f"{type(transformer).__name__} ran {len(calls)} times in one forward of {type(model).__name__}; "
            f"forward_intermediates needs a transformer that runs exactly once (pass transformer=<module>)"
        )
    return calls[0]


def find_transformer(model, transformer):
    if transformer is not None:
        if not isinstance(transformer, nn.Module):
            raise TypeError(f"transformer must be a torch.nn.Module of the model, got {type(transformer).__name__}")
        return transformer
    if isinstance(getattr(model, 'transformer', None), nn.Module):
        return model.transformer
    stacks = [(name, child) for name, child in model.named_children()
              if 'return_layers' in inspect.signature(child.forward).parameters]
    if len(stacks) == 1:
        return stacks[0][1]
    raise ValueError(
        f"{type(model).__name__} has no `transformer` module and {len(stacks)} children supporting "
        f"forward(x, return_layers=True) ({', '.join(name for name, _ in stacks) or 'none'}); pass transformer=<module>"
    )


def block_outputs(model, img, indices=None, *, output='tokens', transformer=None):
    """Outputs of chosen blocks of the model's transformer, for probing or as a dense-prediction backbone.

    The transformer is `transformer=`, else `model.transformer`, else the one child whose forward takes
    `return_layers` (CaiT's patch stage, XCiT's). The model runs once (its `forward_features` when it has one).

    indices: None for every block, an int n for the last n, or a list of block numbers
             (negative counts from the end).
    output:  'tokens' gives each block's output as it is, (b, n, dim) (before the final
             norm); 'maps' drops the prefix tokens and lays the patches on their grid,
             (b, dim, h, w).
    """
    if output not in ('tokens', 'maps'):
        raise ValueError(f"output must be 'tokens' or 'maps', got {output!r}")
    transformer = find_transformer(model, transformer)
    blocks = collect_block_outputs(model, img, transformer)
    chosen = [blocks[i] for i in take_indices(indices, len(blocks), what='block')]
    if output == 'tokens':
        return chosen
    maps = []
    for tokens in chosen:
        grid, prefix = token_layout(model, tuple(img.shape[-2:]), tokens.shape[1])
        if grid is None:
            raise ValueError(
                f"cannot lay {tokens.shape[1]} tokens of {type(model).__name__} on a patch grid for an image of "
                f"size {tuple(img.shape[-2:])}; use output='tokens'"
            )
        maps.append(rearrange(tokens[:, prefix:], 'b (h w) d -> b d h w', h=grid[0], w=grid[1]))
    return maps


class NormedHead:
    """vit-pytorch's head of a LayerNorm and a Linear on the pooled embedding, `mlp_head = Sequential(LayerNorm,
    Linear)` built by `normed_head` (the encoder's output is not normed; `head_name` names the attribute where
    vit-pytorch's does otherwise): `forward_head`, `forward` and `reset_classifier` for a model with `num_classes` and
    `forward_features`. `pooled(features)` gives the (b, dim) embedding: by default the cls token or the mean of all
    tokens by `pool`, through `to_latent`; the NaViTs pool by attention. Used by efficient.ViT,
    vit_with_patch_dropout.ViT, the flash SimpleViT and the NaViTs."""

    head_name = 'mlp_head'

    def pooled(self, tokens):
        return self.to_latent(tokens.mean(dim=1) if self.pool == 'mean' else tokens[:, 0])

    def forward_head(self, features, pre_logits=False):
        """Pool, then the head's LayerNorm (`pre_logits`: the normed embedding) and Linear."""
        head = getattr(self, self.head_name)
        x = head[0](self.pooled(features))
        return x if pre_logits or self.num_classes == 0 else head[1](x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def reset_classifier(self, num_classes):
        """A new zero-initialised Linear for `num_classes` after the kept LayerNorm (0: forward returns the
        pooled, normed embedding)."""
        non_negative_int('num_classes', num_classes)
        self.num_classes = num_classes
        norm = getattr(self, self.head_name)[0]
        head = [norm]
        if num_classes > 0:
            head.append(zero_linear(norm.normalized_shape[0], num_classes, like=norm.weight,
                                    bias=norm.bias is not None))
        setattr(self, self.head_name, nn.Sequential(*head))


def normed_head(dim, num_classes, *, bias=True):
    """`NormedHead`'s head: Sequential(LayerNorm, Linear to `num_classes`), the Linear left out for 0;
    `bias=False` leaves the bias out of both (the NaViTs')."""
    linear = [nn.Linear(dim, num_classes, bias=bias)] if num_classes > 0 else []
    return nn.Sequential(nn.LayerNorm(dim, bias=bias), *linear)


class TokenFace:
    """The face the token models share, over the blocks of one transformer.

    `feature_info` has one entry per block of the submodule named `intermediates_from`: the width of its
    output `num_chs` (`embed_dim`, else `num_features`), `reduction` the pixels a token covers (the model's
    `patch_size`; None where it has none, as behind CCT's and T2T's convolutional tokenizers) and the block's
    `module` name. `forward_intermediates` returns those blocks' outputs.
    """

    intermediates_from = 'transformer'

    @property
    def feature_info(self):
        blocks = self.get_submodule(self.intermediates_from).layers
        width = getattr(self, 'embed_dim', None) or self.num_features
        return [dict(num_chs=width, reduction=getattr(self, 'patch_size', None),
                     module=f'{self.intermediates_from}.layers.{i}') for i in range(len(blocks))]

    def forward_intermediates(self, x, indices=None, *, output='tokens'):
        """The chosen blocks' outputs, one run of the model: indices None for every block, an int n for the last
        n, or a list of block numbers (negative from the end). output 'tokens' gives each as the block returns it,
        before the final norm ((b, n, num_chs) for most; NaViT's packed (1, n, num_chs)); 'maps' lays the patch
        tokens on their grid, (b, num_chs, h, w). Indices out of range are refused before the model runs."""
        take_indices(indices, len(self.feature_info), what='block')
        return block_outputs(self, x, indices, output=output, transformer=self.get_submodule(self.intermediates_from))


class ViT(TokenFace, nn.Module):
    """Vision Transformer with a cls token or mean pooling.

    `num_classes=0` makes `forward` return all tokens after the final norm,
    (b, prefix + patches, dim), as in vit-pytorch; `forward_head(tokens, pre_logits=True)`
    gives the pooled embedding. `embed_dim` is the tokens' width (`dim`).

    Options beyond vit-pytorch's API (defaults keep its model):
      patch_norm          LayerNorms around the patch projection (False: the paper's ViT).
      qkv_bias            bias on the query/key/value projection (True: the paper's ViT).
      norm_eps            epsilon of every LayerNorm (1e-6 in the paper's code).
      pre_logits_dim      a Linear + tanh "representation" layer before the head, as in the
                          ImageNet-21k checkpoints of the paper; None leaves it out.
      gelu_approximate    'none' (exact GELU, timm and Hugging Face) or 'tanh' (the JAX code).
      dynamic_image_size  accept any image size divisible by the patch size, resampling the
                          position embeddings in 2D (bicubic) to the input's patch grid.
    Without `dynamic_image_size`, images smaller than `image_size` and non-square ones are taken as
    vit-pytorch's FAQ promises (each side at most `image_size` and divisible by `patch_size`): the
    patch in row i, column j gets the position embedding of row i, column j of the full grid (the
    table's top-left sub-grid), so a patch keeps the position it has in a full-size image of which
    the input is the top-left crop, and a model trained on full-size images sees positions it
    learned. vit-pytorch takes the first h * w rows of the flattened table instead, which are the
    top-left sub-grid only when the input is as wide as `image_size` (else a patch gets the
    position of another one). Resampling (`dynamic_image_size=True`) suits an image rescaled to
    another size instead: it spreads the full table over the smaller grid.
    The position table and cls token start at the scale of the patch tokens: a unit normal with
    the Dual PatchNorm (vit-pytorch), std 0.02 without it (the paper, timm); see `init_tokens`.
    For variants: `attention`, `feedforward` and `patch_embedding` build the blocks, called
    with the arguments of `Attention`, `FeedForward` and `PatchEmbedding`; `transformer` the
    encoder, with those of `Transformer` (a subclass whose layers hand state down, `Stack.step`).

    `forward_features` returns all tokens after the final norm, (b, prefix + h * w, dim).
    """

    extra_tokens = 0    # learned tokens after the cls token that a variant adds (DeiT's distillation token)

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim,
                 pool='cls', channels=3, dim_head=64, dropout=0., emb_dropout=0.,
                 patch_norm=True, qkv_bias=False, norm_eps=1e-5, pre_logits_dim=None,
                 gelu_approximate='none', dynamic_image_size=False,
                 attention=Attention, feedforward=FeedForward, patch_embedding=PatchEmbedding,
                 transformer=Transformer):
        check_vit_arguments(**arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = pair(image_size), pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.pool, self.channels, self.num_classes, self.embed_dim = pool, channels, num_classes, dim
        self.dynamic_image_size = dynamic_image_size
        self.num_prefix_tokens = (1 if pool == 'cls' else 0) + self.extra_tokens

        self.to_patch_embedding = patch_embedding(channels=channels, patch_size=self.patch_size, dim=dim,
                                                  patch_norm=patch_norm, norm_eps=norm_eps)
        if pool == 'cls':
            self.cls_token = nn.Parameter(torch.zeros(1, dim))
        else:
            # vit-pytorch saves a (0, dim) cls_token under mean pooling: an empty buffer keeps that key
            # for its checkpoints without an empty parameter (which FSDP cannot shard)
            self.register_buffer('cls_token', torch.zeros(0, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(self.num_prefix_tokens + math.prod(self.grid_size), dim))
        init_tokens(self.pos_embedding, *([self.cls_token] if pool == 'cls' else []), patch_norm=patch_norm)
        self.dropout = nn.Dropout(emb_dropout)

        self.transformer = transformer(dim, depth, heads, dim_head, mlp_dim, dropout, qkv_bias=qkv_bias,
                                   norm_eps=norm_eps, gelu_approximate=gelu_approximate,
                                   attention=attention, feedforward=feedforward)

        self.to_latent = nn.Identity() if pre_logits_dim is None else nn.Sequential(
            nn.Linear(dim, pre_logits_dim), nn.Tanh())
        self.mlp_head = nn.Linear(pre_logits_dim or dim, num_classes) if num_classes > 0 else None

    @property
    def num_features(self):
        """The pre-logits width: `dim`, or the representation layer's (read from `to_latent`, which transfer
        experiments replace)."""
        return self.embed_dim if isinstance(self.to_latent, nn.Identity) else self.to_latent[0].out_features

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def patch_tokens(self, img):
        """The checked image's patch tokens, before positions: (b, h * w, dim)."""
        check_images(img, channels=self.channels, patch_size=self.patch_size, dtype=self.pos_embedding.dtype,
                     max_image_size=None if self.dynamic_image_size else self.image_size)
        return self.to_patch_embedding(img)

    def prefix_tokens(self, batch_size):
        """The learned tokens before the patches, before positions: (b, prefix, dim)."""
        return repeat(self.cls_token, 'n d -> b n d', b=batch_size)

    def pos_embedding_for(self, grid):
        """Position embeddings for an (h, w) patch grid: the table's top-left (h, w) sub-grid, or with
        `dynamic_image_size` the table resampled in 2D (see the class docstring for why)."""
        if self.dynamic_image_size:
            return resample_pos_embedding(self.pos_embedding, old_grid=self.grid_size, new_grid=grid,
                                          num_prefix_tokens=self.num_prefix_tokens)
        return top_left_pos_embedding(self.pos_embedding, old_grid=self.grid_size, new_grid=grid,
                                      num_prefix_tokens=self.num_prefix_tokens)

    def embed_tokens(self, patches, grid, indices=None):
        """Prefix tokens and `patches` with their position embeddings: (b, prefix + k, dim).

        `patches` (b, k, dim) are the tokens of the (h, w) grid's cells `indices` (b, k), counted
        row-major, or of every cell; a masked model (MAE) passes the visible ones.
        """
        positions = self.pos_embedding_for(grid)                       # (prefix + h * w, dim)
        prefix, patch_positions = positions[:self.num_prefix_tokens], positions[self.num_prefix_tokens:]
        patch_positions = patch_positions if indices is None else patch_positions[indices]
        x = torch.cat((self.prefix_tokens(patches.shape[0]) + prefix, patches + patch_positions), dim=1)
        return self.dropout(x)

    def embed(self, img):
        """Prefix and patch tokens with position embeddings: (b, prefix + h * w, dim)."""
        return self.embed_tokens(self.patch_tokens(img), self.token_grid(img.shape[-2:]))

    def forward_features(self, img):
        """All tokens after the final norm: (b, prefix + h * w, dim)."""
        return self.transformer(self.embed(img))

    def forward_head(self, tokens, pre_logits=False):
        """Pool the tokens; return the pre-logits embedding, or the logits."""
        x = self.to_latent(tokens.mean(dim=1) if self.pool == 'mean' else tokens[:, 0])
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, img):
        tokens = self.forward_features(img)
        return tokens if self.mlp_head is None else self.forward_head(tokens)

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it), as the paper does for transfer."""
        reset_head(self, num_classes, self.num_features, like=self.pos_embedding)

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        fix_old_vit_pytorch_layout(state_dict, prefix, pool=self.pool)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


# ---------------------------------------------------------------------------------------------
# Blocks the variants share


def drop_path(x, p, training):
    """Stochastic depth: zero a residual branch for a random subset of the samples, rescale the rest."""
    if p == 0. or not training:
        return x
    keep = x.new_empty(x.shape[0], *((1,) * (x.ndim - 1))).bernoulli_(1 - p)
    return x * keep.div_(1 - p)                  # the (b, 1, ...) mask scaled, not the whole branch


class LayerScale(nn.Module):
    """`fn(x) * scale`, one learned scale per channel starting at `init_value`, then stochastic depth
    (CaiT, arXiv 2103.17239, section 2.1)."""

    def __init__(self, dim, fn, init_value, layer_dropout=0.):
        super().__init__()
        self.fn = fn
        self.scale = nn.Parameter(torch.full((dim,), float(init_value)))
        self.layer_dropout = layer_dropout

    def forward(self, x, **kwargs):
        return drop_path(self.fn(x, **kwargs) * self.scale, self.layer_dropout, self.training)


class ClassAttention(nn.Module):
    """The first token (a cls token) is the only query; keys and values are all tokens.

    (b, 1 + n, dim) -> (b, 1, dim), pre-norm unless `prenorm=False` (the caller norms). CaiT's
    class attention, CrossViT's cross-attention and XCiT's class attention are this block.
    """

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., *, qkv_bias=False, norm_eps=1e-5, prenorm=True):
        super().__init__()
        inner_dim = heads * dim_head
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.dropout = dropout
        self.fused = True

        self.norm = nn.LayerNorm(dim, eps=norm_eps) if prenorm else nn.Identity()
        self.to_q = nn.Linear(dim, inner_dim, bias=qkv_bias)
        self.to_kv = nn.Linear(dim, inner_dim * 2, bias=qkv_bias)
        self.attention_probs = nn.Identity()
        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(dropout))

    def forward(self, x):
        x = self.norm(x)
        q = rearrange(self.to_q(x[:, :1]), 'b n (h d) -> b h n d', h=self.heads)
        k, v = rearrange(self.to_kv(x), 'b n (kv h d) -> kv b h n d', kv=2, h=self.heads)
        out = attend(q, k, v, scale=self.scale, fused=self.fused, probs=self.attention_probs,
                     dropout=self.dropout if self.training else 0.)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


def rope_frequencies(pairs, theta):
    """RoFormer's geometric frequencies (Su et al., arXiv 2104.09864) for `pairs` channel pairs:
    theta^(-2i / (2 pairs)), i < pairs, from 1 down towards 1 / theta (radians per unit of position)."""
    return 1. / theta ** (torch.arange(0, 2 * pairs, 2).float() / (2 * pairs))


class AxialRotaryEmbedding(nn.Module):
    """Rotary position angles (RoPE) for tokens on a grid of any number of axes, each axis turning its own pairs.

    `frequencies` (axes, f), a buffer saved with the model; `forward(positions)` turns (..., n, axes) positions
    (integer indices, or coordinates scaled as the model wants them: LeVJEPA's in [-1, 1)) into (..., n, axes * f)
    angles, axis a driving each head's channel pairs a f .. (a + 1) f - 1 (the rows' pairs, then the
    columns', as vit-pytorch lays them out). A 1D sequence is one axis. `RotaryAttention` turns queries and keys by
    the angles (`rotate`); a token given angle 0 (a cls token) is not turned.

    `mixed=True` turns each pair along a direction across all axes instead (N-D RoPE with mixed frequencies, as
    vit-pytorch's `vit_nd_rotary`): `frequencies` (..., f, axes), one frequency vector per pair, and the angles
    (..., n, f) are the dot products of the positions with them; leading axes (heads) give each head its own
    angles, which `rotate` broadcasts over (b, heads, n, d). Axial frequencies are the block-diagonal case.
    """

    def __init__(self, frequencies, *, mixed=False):
        super().__init__()
        self.mixed = mixed
        self.register_buffer('frequencies', frequencies.contiguous())     # an expanded view cannot be loaded into

    def forward(self, positions):
        # angles in float32 at least: in bfloat16 an angle of a few hundred radians (RvT's) is off by up to one
        frequencies = self.frequencies.to(torch.promote_types(self.frequencies.dtype, torch.float32))
        if self.mixed:
            return einsum(frequencies, positions.to(frequencies), '... f a, n a -> ... n f')
        return rearrange(positions.to(frequencies)[..., None] * frequencies, '... a f -> ... (a f)')


def rotate(x, angles):
    """x (..., n, d) with each channel pair (2i, 2i + 1), i < p, turned by angles (n, p) in radians (or any shape
    that broadcasts against x's leading axes: (heads, n, p) per head, (b, 1, n, p) per sample); channels from
    2p on pass unturned. Queries and keys turned alike give q . k that depends on their angles' difference alone."""
    pairs = angles.shape[-1]
    turned, rest = x[..., :2 * pairs], x[..., 2 * pairs:]
    first, second = rearrange(turned, '... (p two) -> two ... p', two=2)
    cos, sin = angles.cos(), angles.sin()
    turned = rearrange([first * cos - second * sin, first * sin + second * cos], 'two ... p -> ... (p two)')
    turned = turned.to(x.dtype)
    return torch.cat((turned, rest), dim=-1) if rest.shape[-1] else turned


class RotaryAttention(Attention):
    """`Attention` whose queries and keys are turned by rotary angles before q k^T (RoPE), so that a query and a key
    interact through the difference of their positions alone.

    `forward(x, *, angles=None, mask=None, **kwargs)`: `angles` (n, pairs) for the n tokens, from
    `AxialRotaryEmbedding` (None: nothing turned); other keyword arguments go to `qkv` (RvT's convolutional queries
    take the patch grid). A subclass that norms q and k does it in `qkv`, before the turn (ViT-5's QK-norm).
    """

    def forward(self, x, *, angles=None, mask=None, **kwargs):
        q, k, v = self.qkv(x, **kwargs)
        if angles is not None:
            q, k = rotate(q, angles), rotate(k, angles)
        return self.to_out(rearrange(self.attend(q, k, v, mask=mask), 'b h n d -> b n (h d)'))


class PatchDropout(nn.Module):
    """In training, keep max(1, int(n (1 - prob))) random tokens of each sample; (b, n, d) -> (b, keep, d)."""

    def __init__(self, prob):
        super().__init__()
        self.prob = probability('patch_dropout', prob)

    def forward(self, x):
        if not self.training or self.prob == 0.:
            return x
        batch, num_tokens, dim = x.shape
        keep = max(1, int(num_tokens * (1 - self.prob)))
        indices = torch.rand(batch, num_tokens, device=x.device).topk(keep, dim=-1).indices   # (b, keep)
        return x.gather(1, repeat(indices, 'b k -> b k d', d=dim))


def kept_tokens(num_tokens, drop_prob):
    """How many of an image's `num_tokens` tokens token dropping keeps: at least one."""
    return max(1, int(num_tokens * (1 - drop_prob)))


def grid_positions(height, width, device=None):
    """(row, column) of each cell of an (height, width) grid, row-major: (height * width, 2)."""
    return torch.cartesian_prod(torch.arange(height, device=device), torch.arange(width, device=device)) \
        .reshape(height * width, 2)


def attend_segments(attention, q, k, v, segments):
    """`attention.attend` inside segments of one sequence, never across them.

    q (1, heads, queries, d) and k, v (1, heads, keys, d) hold the segments one after the other;
    `segments` lists (count, queries per image, keys per image) for runs of `count` images of
    equal length, each run one batched attention call.
    """
    outputs = []
    q_runs = q.split([count * queries for count, queries, _ in segments], dim=2)
    k_runs = k.split([count * keys for count, _, keys in segments], dim=2)
    v_runs = v.split([count * keys for count, _, keys in segments], dim=2)
    for (count, _, _), q_run, k_run, v_run in zip(segments, q_runs, k_runs, v_runs):
        q_run, k_run, v_run = (rearrange(t, '1 h (n l) d -> n h l d', n=count) for t in (q_run, k_run, v_run))
        outputs.append(rearrange(attention.attend(q_run, k_run, v_run), 'n h l d -> 1 h (n l) d'))
    return torch.cat(outputs, dim=2)


def zero_linear(in_features, out_features, *, like, bias=True):
    """A zero-initialised Linear on the device and dtype of the tensor `like` (a new head, as the paper transfers)."""
    head = nn.Linear(in_features, out_features, bias=bias, device=like.device, dtype=like.dtype)
    nn.init.zeros_(head.weight)
    if bias:
        nn.init.zeros_(head.bias)
    return head


def init_linear_weights(module):
    """The initialisation most reference codes share (timm's too): truncated normal (std 0.02) Linear weights,
    zero biases; other modules keep PyTorch's default. Pass it to `model.apply`."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def resample_pos_embedding(pos_embedding, *, old_grid, new_grid, num_prefix_tokens=0,
                           mode='bicubic', antialias=False, align_corners=False):
    """Resample a learned (num_prefix_tokens + h * w, d) position table to a new (h, w) grid.

    The grid part is interpolated in 2D; prefix rows (cls, distillation tokens) are kept as
    they are. Which reference each setting reproduces:
      - timm, when loading a checkpoint at another resolution: mode='bicubic', antialias=True;
      - Hugging Face `interpolate_pos_encoding=True`: mode='bicubic', antialias=False;
      - the official JAX code (scipy.ndimage.zoom, order 1): mode='bilinear', align_corners=True.
    """
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    expected_rows = num_prefix_tokens + old_grid[0] * old_grid[1]
    if pos_embedding.ndim != 2 or pos_embedding.shape[0] != expected_rows:
        raise ValueError(
            f"pos_embedding must have shape ({expected_rows}, d) for {num_prefix_tokens} prefix tokens and "
            f"grid {old_grid}, got {tuple(pos_embedding.shape)}"
        )
    if old_grid == new_grid:
        return pos_embedding
    prefix, grid = pos_embedding[:num_prefix_tokens], pos_embedding[num_prefix_tokens:]
    grid = rearrange(grid, '(h w) d -> 1 d h w', h=old_grid[0], w=old_grid[1])
    corners = dict(align_corners=align_corners) if mode in ('bilinear', 'bicubic') else {}
    grid = F.interpolate(grid.float(), size=new_grid, mode=mode, antialias=antialias, **corners)
    grid = rearrange(grid, '1 d h w -> (h w) d').to(pos_embedding.dtype)
    return torch.cat((prefix, grid))


def top_left_pos_embedding(pos_embedding, *, old_grid, new_grid, num_prefix_tokens=0):
    """The rows of a (num_prefix_tokens + h * w, d) position table for a grid no larger than (h, w): the prefix
    rows, then the cells of the table's top-left `new_grid`, row-major."""
    if tuple(new_grid) == tuple(old_grid):
        return pos_embedding
    prefix, grid = pos_embedding[:num_prefix_tokens], pos_embedding[num_prefix_tokens:]
    grid = rearrange(grid, '(h w) d -> h w d', h=old_grid[0])[:new_grid[0], :new_grid[1]]
    return torch.cat((prefix, rearrange(grid, 'h w d -> (h w) d')))


def conv_output_size(size, kernel, stride, padding=0):
    """The length that a convolution or pooling (kernel, stride, padding) leaves of `size`."""
    return (size + 2 * padding - kernel) // stride + 1


def take_indices(indices, count, *, what='stage'):
    """Which of `count` stages (or blocks) `forward_intermediates` returns: None for all, an int n for
    the last n, or a list of numbers (negative ones count from the end)."""
    if indices is None:
        return list(range(count))
    if isinstance(indices, int) and not isinstance(indices, bool):
        if not 1 <= indices <= count:
            raise ValueError(f"indices as an int takes the last n {what}s, 1 <= n <= {count}, got {indices}")
        return list(range(count - indices, count))
    if not isinstance(indices, (list, tuple)) or not indices:
        raise ValueError(f"indices must be None, an int or a non-empty list of {what} numbers, got {indices!r}")
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, int) or not -count <= index < count:
            raise ValueError(f"indices must be {what} numbers in [-{count}, {count}), got {index!r} in {indices!r}")
    return [index % count for index in indices]


# ---------------------------------------------------------------------------------------------
# Argument checks: every bad argument is a TypeError/ValueError that names it


def arguments(local_variables):
    """A constructor's arguments, from `locals()` taken as its first statement."""
    return {name: value for name, value in local_variables.items() if name not in ('self', '__class__')}


def pair(t):
    return tuple(t) if isinstance(t, (tuple, list)) else (t, t)


def positive_int(name, value):
    """`value` if it is a positive int; otherwise a TypeError/ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return value


def non_negative_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a non-negative int, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value}")
    return value


def positive_pair(name, value):
    """An int or an (h, w) pair of positive ints, returned as (h, w)."""
    if isinstance(value, (tuple, list)) and len(value) != 2:
        raise ValueError(f"{name} must be an int or an (h, w) pair, got {tuple(value)!r}")
    height, width = pair(value)
    return positive_int(name, height), positive_int(name, width)


def finite_number(name, value, expected='a finite number'):
    """`value` as a float if it is a finite int or float; a bool or a string is a TypeError, NaN or an
    infinity a ValueError, each naming `name`, the value and `expected` (the range the caller wants)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return float(value)


def probability(name, value):
    """A dropout-like rate in [0, 1): 1 would drop everything."""
    if not 0.0 <= finite_number(name, value, 'a float in [0, 1)') < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def fraction(name, value, meaning=''):
    """A weight or share in [0, 1], both ends included; `meaning` says what it weighs, for the message."""
    expected = f"a float in [0, 1]{meaning}"
    if not 0.0 <= finite_number(name, value, expected) <= 1.0:
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return float(value)


def positive_float(name, value):
    """A finite float > 0: a norm's epsilon, a LayerScale init, a temperature, a width ratio."""
    if finite_number(name, value, 'a positive finite float') <= 0:
        raise ValueError(f"{name} must be a positive finite float, got {value}")
    return float(value)


def per_channel(name, value, channels, *, positive=False):
    """One finite number per channel (a normalisation's mean or std; `positive`: each > 0), as a list."""
    items = value.tolist() if hasattr(value, 'tolist') else value
    if not isinstance(items, (tuple, list)) or len(items) != channels:
        raise ValueError(f"{name} must have one value per channel ({channels}), got {value!r}")
    check = positive_float if positive else finite_number
    return [check(f'{name}[{index}]', item) for index, item in enumerate(items)]


def boolean(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def patch_grid(image_size, patch_size, *, patch_name='patch_size'):
    """(h, w) patch grid of an image, or a ValueError when the sides do not divide."""
    (image_height, image_width), (patch_height, patch_width) = image_size, patch_size
    if image_height % patch_height or image_width % patch_width:
        raise ValueError(
            f"image_size {image_size} must be divisible by {patch_name} {patch_size} "
            f"in both height and width"
        )
    return image_height // patch_height, image_width // patch_width


def check_patches(image_size, patch_size, *, patch_name='patch_size'):
    """The (h, w) patch grid of a constructor's `image_size` and `patch_size` (each an int or an (h, w) pair of
    positive ints, the image divisible by the patch); a TypeError/ValueError naming the argument otherwise."""
    return patch_grid(positive_pair('image_size', image_size), positive_pair(patch_name, patch_size),
                      patch_name=patch_name)


def check_transformer_arguments(*, num_classes, dim, depth, heads, mlp_dim, channels, dim_head, **rates):
    """The sizes every ViT-like constructor takes: positive ints `dim` ... `dim_head`, a non-negative
    `num_classes`, and each of `rates` (`dropout`, `emb_dropout`, ...) in [0, 1)."""
    for name, value in dict(dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels,
                            dim_head=dim_head).items():
        positive_int(name, value)
    non_negative_int('num_classes', num_classes)
    for name, value in rates.items():
        probability(name, value)


def check_vit_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, pool, channels,
                        dim_head, dropout, emb_dropout, patch_norm, qkv_bias, norm_eps, pre_logits_dim,
                        gelu_approximate, dynamic_image_size, **blocks):
    check_patches(image_size, patch_size)
    check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                channels=channels, dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout)
    positive_float('norm_eps', norm_eps)
    for name, value in dict(patch_norm=patch_norm, qkv_bias=qkv_bias, dynamic_image_size=dynamic_image_size).items():
        boolean(name, value)
    if pool not in ('cls', 'mean'):
        raise ValueError(f"pool must be 'cls' (cls token) or 'mean' (mean pooling), got {pool!r}")
    if gelu_approximate not in ('none', 'tanh'):
        raise ValueError(f"gelu_approximate must be 'none' or 'tanh', got {gelu_approximate!r}")
    if pre_logits_dim is not None:
        positive_int('pre_logits_dim', pre_logits_dim)
    for name, block in blocks.items():
        if not callable(block):
            raise TypeError(f"{name} must be a callable that builds the block, got {block!r}")


def check_geometry(*, image_size, image_patch_size, frames, frame_patch_size):
    """The video geometry every video model shares: sides and frames divisible by the tubelet."""
    check_patches(image_size, image_patch_size, patch_name='image_patch_size')
    positive_int('frames', frames)
    positive_int('frame_patch_size', frame_patch_size)
    if frames % frame_patch_size:
        raise ValueError(f"frames ({frames}) must be divisible by frame_patch_size ({frame_patch_size})")


def check_images(img, *, channels, patch_size, image_size=None, max_image_size=None, dtype=None):
    """Validate a (b, c, h, w) image batch; returns its (h, w) patch grid.

    `image_size=None` accepts any size divisible by `patch_size`; `max_image_size` (h, w) any such size
    no higher and no wider; `dtype`, the model's parameter dtype, is required of `img` outside autocast.
    """
    if not isinstance(img, torch.Tensor):
        hint = "; convert a numpy array with torch.from_numpy(array).float()" \
            if type(img).__module__ == 'numpy' else ''
        raise TypeError(f"img must be a torch.Tensor of shape (b, c, h, w), got {type(img).__name__}{hint}")
    if not img.is_floating_point():
        raise TypeError(f"img must be a floating point tensor, got dtype {img.dtype}; convert with img.float()")
    if dtype is not None and img.dtype != dtype and not torch.is_autocast_enabled(img.device.type):
        raise TypeError(
            f"img has dtype {img.dtype} but the model's parameters are {dtype}; "
            f"convert with img.to({dtype}) or run the model under torch.autocast"
        )
    if img.ndim != 4:
        hint = " (a single image? add a batch dimension with img.unsqueeze(0))" if img.ndim == 3 else ""
        raise ValueError(f"img must have shape (b, c, h, w), got a {img.ndim}-d tensor of shape {tuple(img.shape)}{hint}")
    if img.shape[1] != channels:
        raise ValueError(f"img must have {channels} channels (dim 1), got shape {tuple(img.shape)}")
    size = tuple(img.shape[-2:])
    if size[0] < patch_size[0] or size[1] < patch_size[1]:
        raise ValueError(f"img must be at least one patch {tuple(patch_size)} high and wide, got {size[0]}x{size[1]}")
    divisible = not (size[0] % patch_size[0] or size[1] % patch_size[1])
    if image_size is not None and size != tuple(image_size):
        remedy = ("build the model with dynamic_image_size=True to resample position embeddings to other sizes"
                  if divisible else
                  f"resize it to {image_size[0]}x{image_size[1]} (other sizes must be divisible by patch_size "
                  f"{tuple(patch_size)}, e.g. {size[0] - size[0] % patch_size[0]}x{size[1] - size[1] % patch_size[1]}, "
                  f"and then need dynamic_image_size=True)")
        raise ValueError(f"img must be {image_size[0]}x{image_size[1]} (h x w), the model's image_size, "
                         f"got {size[0]}x{size[1]}; {remedy}")
    if max_image_size is not None and (size[0] > max_image_size[0] or size[1] > max_image_size[1]):
        raise ValueError(f"img must be at most {max_image_size[0]}x{max_image_size[1]} (h x w), the model's "
                         f"image_size, got {size[0]}x{size[1]}; build the model with dynamic_image_size=True to "
                         f"resample position embeddings to larger sizes")
    if not divisible:
        example = f", e.g. {size[0] - size[0] % patch_size[0]}x{size[1] - size[1] % patch_size[1]}" \
            if max_image_size is not None else ''
        raise ValueError(f"img height and width {size} must be divisible by patch_size {tuple(patch_size)}"
                         f"{example}")
    return size[0] // patch_size[0], size[1] // patch_size[1]


def check_video(video, *, channels, frames=None, image_size=None, patch_size=None, frame_patch_size=None,
                dtype=None):
    """Validate a (b, c, frames, h, w) batch: `frames` / `image_size` when the model needs that size, else
    sizes divisible by `frame_patch_size` / `patch_size`; `dtype` is required outside autocast."""
    if not isinstance(video, torch.Tensor):
        hint = "; convert a numpy array with torch.from_numpy(array).float()" \
            if type(video).__module__ == 'numpy' else ''
        raise TypeError(f"video must be a torch.Tensor of shape (b, c, frames, h, w), got "
                        f"{type(video).__name__}{hint}")
    if not video.is_floating_point():
        raise TypeError(f"video must be a floating point tensor, got dtype {video.dtype}; convert with video.float()")
    if dtype is not None and video.dtype != dtype and not torch.is_autocast_enabled(video.device.type):
        raise TypeError(f"video has dtype {video.dtype} but the model's parameters are {dtype}; convert with "
                        f"video.to({dtype}) or run the model under torch.autocast")
    if video.ndim != 5:
        hint = " (a single video? add a batch dimension with video.unsqueeze(0))" if video.ndim == 4 else ""
        raise ValueError(f"video must have shape (b, c, frames, h, w), got a {video.ndim}-d tensor of shape "
                         f"{tuple(video.shape)}{hint}")
    if video.shape[1] != channels:
        raise ValueError(f"video must have {channels} channels (dim 1), got shape {tuple(video.shape)}")
    size = tuple(video.shape[2:])
    if frames is not None and image_size is not None and size != (frames, *image_size):
        raise ValueError(f"video must be {frames} frames of {image_size[0]}x{image_size[1]} (frames, h, w: the "
                         f"model's frames and image_size), got {size[0]} frames of {size[1]}x{size[2]}")
    if patch_size is not None:
        steps = (frame_patch_size, *patch_size)
        if any(side < step or side % step for side, step in zip(size, steps)):
            raise ValueError(f"video frames, height and width {size} must be positive multiples of the tubelet "
                             f"size (frame_patch_size, image_patch_size) = {steps}")


# ---------------------------------------------------------------------------------------------
# Old checkpoint layouts


def fix_old_vit_pytorch_layout(state_dict, prefix, *, pool):
    """Bring a vit-pytorch checkpoint of an older layout to today's, in place.

    Up to 1.16.0 vit-pytorch saved cls_token as (1, tokens, dim) and pos_embedding as
    (1, tokens + n, dim). Up to 1.15.7 there was a cls token even under mean pooling, and the
    mean included it: no ViT(pool='mean') computes that, so it is refused by name.
    """
    cls_key, pos_key = prefix + 'cls_token', prefix + 'pos_embedding'
    if cls_key in state_dict and state_dict[cls_key].ndim == 3:
        if pool == 'mean' and state_dict[cls_key].shape[1] > 0:
            raise ValueError(
                f"{cls_key} of shape {tuple(state_dict[cls_key].shape)} comes from vit-pytorch <= 1.15.7 with "
                f"pool='mean', which averages over the cls token as well; ViT(pool='mean') averages the patch "
                f"tokens only and cannot reproduce that model"
            )
        state_dict[cls_key] = state_dict[cls_key][0]
    if pos_key in state_dict and state_dict[pos_key].ndim == 3:
        state_dict[pos_key] = state_dict[pos_key][0]


def renamed_plan(model, keys, renames, reshaped=()):
    """A loader plan (see `vit_pytorch.pretrained`) for a checkpoint whose keys differ from `model`'s by names:
    each of `keys` becomes ours by the first (pattern, replacement) of `renames` that matches it (else itself) and
    is copied as it is, or, for our keys in `reshaped` ({ours: (the checkpoint's shape, convert)}), converted.
    Returns (plan, the keys no tensor of `model` takes)."""
    state, reshaped = model.state_dict(), dict(reshaped)
    plan, unknown = {}, []
    for key in keys:
        ours = next((re.sub(pattern, replacement, key) for pattern, replacement in renames if re.match(pattern, key)),
                    key)
        if ours not in state:
            unknown.append(key)
        else:
            shape, convert = reshaped.get(ours, (tuple(state[ours].shape), lambda t: t))
            plan[ours] = ({key: shape}, convert)
    return plan, unknown


def prefixed_plan(state, names, source, plan=None):
    """Complete a loader plan (see `vit_pytorch.pretrained`) for a checkpoint whose keys differ from ours by their
    prefixes: every key of `state` (our state_dict) not yet in `plan` takes the checkpoint's key that the first
    prefix of `names` ({ours: theirs}) it starts with gives, and is copied as it is. A key that no prefix covers is
    a ValueError naming `source`, the checkpoint's model (e.g. "timm's CaiT"). Returns the plan."""
    plan = {} if plan is None else plan
    for key, tensor in state.items():
        if key not in plan:
            prefix = next((prefix for prefix in names if key.startswith(prefix)), None)
            if prefix is None:
                raise ValueError(f"{source} has no counterpart of {key}")
            plan[key] = ({names[prefix] + key[len(prefix):]: tuple(tensor.shape)}, _unchanged)
    return plan


def joined_kv_plan(tensor, k_key, v_key):
    """A loader plan entry for our joined key-value projection `tensor` (`to_kv`, keys then values) from a
    checkpoint's separate `k_key` and `v_key`, half of it each."""
    half = (tensor.shape[0] // 2, *tensor.shape[1:])
    return {k_key: half, v_key: half}, lambda k, v: torch.cat((k, v))


def _unchanged(tensor):
    return tensor
