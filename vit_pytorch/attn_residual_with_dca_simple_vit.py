"""SimpleViT with multi-way attention residuals: attention residuals with DeepCrossAttention's separate query, key
and value mixes, per group of heads.

Three papers combined, as vit-pytorch 1.26.14 combines them:
- Kimi Team, "Attention Residuals", arXiv 2603.15031: a layer's input is a softmax over depth of all earlier
  outputs v_i, alpha_i = softmax_i(w . RMSNorm(v_i)) with a learned pseudo-query w starting at zero (a uniform mean);
- Heddes et al., "DeepCrossAttention: Supercharging Transformer Residual Connections", arXiv 2502.06785: the
  attention's queries, keys and values each read their own combination of the earlier outputs;
- "Multi-Head Attention Residuals", arXiv 2607.27230: one such depth mix per group of heads.

Each block b: xq, xk, xv = three depth mixes of the outputs so far (per group of `head_groups` heads);
x = Attention(xq, xk, xv) + xv (the value mix doubles as the residual; the mean over groups when grouped), then
x + MLP(x) is the block's output and joins the depth outputs (with `ffn_heads > 1` each MLP head reads its own depth
mix of them and x). The outputs start as the patch tokens and an MLP of them; the encoder's output is the last
block's, RMSNorm'd. Queries, keys and values are RMSNorm'd; `gate` multiplies each head's output by a sigmoid of its
query input. vit-pytorch's checkpoints load unchanged (same keys, same outputs).

    import torch
    from vit_pytorch.attn_residual_with_dca_simple_vit import SimpleViT

    model = SimpleViT(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=4, dim_head=8, mlp_dim=64,
                      head_groups=2, ffn_heads=4)
    logits = model(torch.randn(2, 3, 32, 32))   # (2, 10)

Where it differs from vit-pytorch: the attention goes through the package's one attention primitive (fused, the
recorder's explicit path when recording); the depth outputs are the stack's layer-to-layer state, so gradient
checkpointing and `forward_intermediates` (each block's output) work as for every SimpleViT; bad arguments are
refused by name where vit-pytorch asserts.
"""

import math

import torch
from einops import einsum, rearrange, reduce
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import simple_vit, vit


class GroupedLinear(nn.Module):
    """A block-diagonal Linear: group g of the input (g, b, n, dim) maps through rows g of `weight` (out_dim, dim),
    (b, n, out_dim); the parameters and cost of a dense Linear."""

    def __init__(self, dim, out_dim, groups, bias=False):
        super().__init__()
        self.groups = groups
        self.weight = nn.Parameter(torch.empty(out_dim, dim))
        self.bias = nn.Parameter(torch.zeros(out_dim)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))    # nn.Linear's initialisation

    def forward(self, x):
        weight = rearrange(self.weight, '(g e) d -> g e d', g=self.groups)
        out = rearrange(einsum(x, weight, 'g b n d, g e d -> b n g e'), 'b n g e -> b n (g e)')
        return out if self.bias is None else out + self.bias


def linear(dim_in, dim_out, groups=1, bias=False):
    return GroupedLinear(dim_in, dim_out, groups, bias=bias) if groups > 1 else nn.Linear(dim_in, dim_out, bias=bias)


def feedforward(dim, hidden_dim, heads=1):
    """vit-pytorch's MLP as a bare Sequential (keys 0, 1, 3); `heads > 1`: its input is (heads, b, n, dim), head h
    projected into its slice of the hidden width."""
    return nn.Sequential(nn.LayerNorm(dim), linear(dim, hidden_dim, heads, bias=True), nn.GELU(),
                         nn.Linear(hidden_dim, dim))


class DepthMix(nn.Module):
    """`streams` mixes over depth, each with `groups` pseudo-queries (zero at first): `forward(history)` returns per
    stream sum_i softmax_i(w_(s, g) . RMSNorm(v_i)) v_i over the outputs v_i (b, n, dim): (groups, b, n, dim) each,
    or (b, n, dim) with `merge_groups` (one group)."""

    def __init__(self, dim, streams=3, groups=1, merge_groups=False, eps=1e-6):
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.pseudo_queries = nn.Parameter(torch.zeros(streams, groups, dim))
        self.merge_groups = merge_groups

    def forward(self, history):
        if not torch.is_grad_enabled():
            # nothing is kept for a backward pass: one einsum over the stacked outputs is the faster way
            values = torch.stack(history)                                       # (depth, b, n, dim)
            logits = einsum(self.norm(values), self.pseudo_queries, 'l b n d, s g d -> s g l b n')
            out = einsum(logits.softmax(dim=2), values, 's g l b n, l b n d -> s g b n d')
            return tuple(rearrange(out, 's 1 b n d -> s b n d') if self.merge_groups else out)
        # the norm's gain folds into the queries, w . RMSNorm(v) = (v . (g w)) / rms(v), and the mix is a sum over the
        # outputs, so that no (depth, b, n, dim) stack or normed copy of them is kept for the backward pass
        queries = self.pseudo_queries * self.norm.weight                       # (streams, groups, dim)
        logits = torch.stack([einsum(v, queries, 'b n d, s g d -> s g b n')
                              * torch.rsqrt(v.pow(2).mean(dim=-1) + self.norm.eps) for v in history], dim=2)
        out = sum(rearrange(weight, 's g b n -> s g b n 1') * v
                  for weight, v in zip(logits.softmax(dim=2).unbind(dim=2), history))   # (streams, groups, b, n, dim)
        return tuple(rearrange(out, 's 1 b n d -> s b n d') if self.merge_groups else out)


class Attention(vit.Attention):
    """Attention whose queries, keys and values come from three inputs, each RMSNorm'd: `forward(xq, xk, xv)`, each
    (b, n, dim), or (head_groups, b, n, dim) with `head_groups > 1` (group g's heads project from input g); `gate`:
    each head's output times sigmoid(Linear(normed xq))."""

    def __init__(self, dim, heads=8, dim_head=64, head_groups=1, gate=True, eps=1e-6):
        self.head_groups, self.eps = head_groups, eps
        super().__init__(dim, heads, dim_head, norm=nn.Identity(),
                         to_out=nn.Linear(heads * dim_head, dim, bias=False))
        self.to_gate = nn.Sequential(linear(dim, heads, head_groups), Rearrange('b n h -> b h n 1'),
                                     nn.Sigmoid()) if gate else None

    def build_projections(self, dim, inner_dim, *, bias):
        self.norm_q, self.norm_k, self.norm_v = (nn.RMSNorm(dim, eps=self.eps) for _ in range(3))
        self.to_q, self.to_k, self.to_v = (linear(dim, inner_dim, self.head_groups, bias=bias) for _ in range(3))

    def forward(self, xq, xk, xv):
        xq, xk, xv = self.norm_q(xq), self.norm_k(xk), self.norm_v(xv)
        q, k, v = (rearrange(projection(x), 'b n (h d) -> b h n d', h=self.heads)
                   for projection, x in ((self.to_q, xq), (self.to_k, xk), (self.to_v, xv)))
        out = self.attend(q, k, v)
        if self.to_gate is not None:
            out = out * self.to_gate(xq)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class TransformerBlock(nn.Module):
    """One block over the depth outputs so far: `forward(history)` returns its output (b, n, dim)."""

    def __init__(self, dim, heads, dim_head, mlp_dim, head_groups=1, ffn_heads=1, gate=True, eps=1e-6):
        super().__init__()
        self.head_groups = head_groups
        self.attn_res = DepthMix(dim, streams=3, groups=head_groups, merge_groups=head_groups == 1, eps=eps)
        self.attn = Attention(dim, heads, dim_head, head_groups=head_groups, gate=gate, eps=eps)
        self.ffn_res = DepthMix(dim, streams=1, groups=ffn_heads, eps=eps) if ffn_heads > 1 else None
        self.ff = feedforward(dim, mlp_dim, ffn_heads)

    def forward(self, history):
        xq, xk, xv = self.attn_res(history)
        residual = reduce(xv, 'g b n d -> b n d', 'mean') if self.head_groups > 1 else xv
        x = self.attn(xq, xk, xv) + residual
        ffn_in = x if self.ffn_res is None else self.ffn_res([*history, x])[-1]
        return x + self.ff(ffn_in)


class Transformer(vit.Stack):
    """vit-pytorch's `Transformer` of this module: `depth` TransformerBlocks, then an RMSNorm of the last output.
    `forward(x, history=(...))`: the depth outputs before x (the patch tokens); each block's output joins them in the
    state as 'history'."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, head_groups=1, ffn_heads=1, gate=True, eps=1e-6):
        super().__init__([TransformerBlock(dim, heads, dim_head, mlp_dim, head_groups=head_groups,
                                           ffn_heads=ffn_heads, gate=gate, eps=eps) for _ in range(depth)],
                         norm=nn.RMSNorm(dim, eps=eps))

    def step(self, block, x, state, history=()):
        outputs = state.get('history', (*history, x))
        out = block(outputs)
        return out, {'history': (*outputs, out)}


class SimpleViT(vit.TokenFace, nn.Module):
    """vit-pytorch's multi-way attention-residual SimpleViT: patch tokens (between LayerNorms without bias) with 2D
    sin-cos positions of `temperature`, an MLP of them, `depth` blocks over the growing depth outputs, the mean of the
    tokens, a Linear head. `num_classes=0` makes `forward` return the pooled embedding (b, dim).

    `forward_features` returns the last block's output after the final RMSNorm, (b, h * w, dim).
    """

    num_prefix_tokens = 0

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, dim_head=64, mlp_dim, channels=3,
                 head_groups=1, ffn_heads=1, gate=True, eps=1e-6, temperature=10000):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.channels, self.num_classes, self.embed_dim, self.temperature = channels, num_classes, dim, temperature
        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim,
                                                     norm_bias=False)
        self.register_buffer('pos_embedding', simple_vit.posemb_sincos_2d(
            *self.token_grid(self.image_size), dim, temperature=temperature), persistent=False)
        self.initial_ff = feedforward(dim, mlp_dim)
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, head_groups=head_groups,
                                       ffn_heads=ffn_heads, gate=gate, eps=eps)
        self.num_features = dim
        self.linear_head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def token_grid(self, image_size):
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def embed(self, img):
        """Patch tokens with their positions: (b, h * w, dim); any size divisible by the patch."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, dtype=self.pos_embedding.dtype)
        grid = self.token_grid(img.shape[-2:])
        positions = self.pos_embedding if grid == self.token_grid(self.image_size) else simple_vit.posemb_sincos_2d(
            *grid, self.embed_dim, temperature=self.temperature, device=img.device)
        return self.to_patch_embedding(img) + positions.to(img.dtype)

    def forward_features(self, img):
        tokens = self.embed(img)
        return self.transformer(self.initial_ff(tokens), history=(tokens,))

    def forward_head(self, tokens, pre_logits=False):
        x = tokens.mean(dim=1)
        return x if pre_logits else self.linear_head(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.pos_embedding, name='linear_head',
                       removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, dim_head, mlp_dim, channels,
                    head_groups, ffn_heads, gate, eps, temperature, **_):
    simple_vit.check_arguments(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim,
                               depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head)
    for name, value in dict(head_groups=head_groups, ffn_heads=ffn_heads).items():
        vit.positive_int(name, value)
    if heads % head_groups:
        raise ValueError(f"head_groups must divide heads={heads}, got {head_groups}")
    if mlp_dim % ffn_heads:
        raise ValueError(f"ffn_heads must divide mlp_dim={mlp_dim}, got {ffn_heads}")
    vit.boolean('gate', gate)
    vit.positive_float('eps', eps)
    vit.positive_float('temperature', temperature)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's module has our parameter names and computes the same function."""
    return None
