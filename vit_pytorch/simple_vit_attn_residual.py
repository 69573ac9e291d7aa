"""SimpleViT with attention residuals (AttnRes).

Kimi Team, "Attention Residuals", arXiv 2603.15031: a pre-norm residual stream hands every layer the sum of all
earlier layers' outputs with unit weights, so the stream grows with depth and each layer's share of it shrinks.
AttnRes replaces the sum by attention over depth: each branch (attention or MLP) l reads
h_l = sum_i alpha_(i -> l) v_i over the outputs v_0 .. v_(l-1) of the branches before it (v_0: the patch tokens), with
alpha_(i -> l) = softmax_i(w_l . RMSNorm(v_i)) per token: a learned pseudo-query w_l per branch, starting at zero
(a uniform mean over depth), against the normed outputs as keys and the outputs themselves as values. The encoder's
output is one more such mix, then a LayerNorm.

    import torch
    from vit_pytorch.simple_vit_attn_residual import SimpleViTAttnResidual

    model = SimpleViTAttnResidual(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16,
                                  mlp_dim=2048)
    img = torch.randn(2, 3, 256, 256)
    logits, history = model(img, return_history=True)           # (2, 1000); 1 + 2 * depth outputs (2, 64, 1024)
    logits, _ = model(img, history=history, return_history=True)   # the earlier outputs as more keys and values

    blocks = SimpleViTAttnResidual(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16,
                                   mlp_dim=2048, block_size=4)   # Block AttnRes: 12 branches in 3 blocks of 4
    logits, kept = blocks(img, return_history=True)              # kept: b_0 .. b_3, 4 tensors (2, 64, 1024)

`learned_query=False` (vit-pytorch's option) makes each token's latest output its query instead of w_l. `history`
(vit-pytorch's): depth outputs of an earlier run put before this run's, so its branches attend over them too.

Block AttnRes (the paper's variant for memory at scale; ours only, keyword-only `block_size`, default None: Full
AttnRes as above): the 2 * depth branches, each one of the paper's layers (the README's pseudocode counts attention
and MLP alike), fall in blocks of `block_size` in turn. A block's representation is the plain sum of its branches'
outputs, b_n = sum_(j in block n) v_j, and the patch tokens are block 0, b_0 = v_0. The i-th branch of block n reads
the same softmax as above over b_0 .. b_(n-1), and from its second branch on also the block's partial sum
b_n^(i-1) (the outputs of its first i - 1 branches): keys RMSNorm(b), its own pseudo-query w_l. The stack keeps
the completed blocks and one partial sum, at most 2 * depth / block_size + 1 tensors, instead of every output (in a
no_grad forward the measured saving is the formula's to within 4 MiB; a training step saves every partial sum for
the backward pass, as many tensors as Full AttnRes, and saves memory through the mixes' fewer (mix, source) pairs
and a lower backward peak instead: docs/blocks.md, benchmarks/attn_residual_memory.py); no parameter is added, and
`block_size=1` is Full AttnRes. Sources: the README of the official
repository (MoonshotAI/Attention-Residuals: `block_attn_res` stacks the completed blocks and the partial sum,
keys their RMSNorm, logits against the pseudo-query, a softmax over them; blocks start with the token embedding;
the partial sum restarts at a boundary) and the paper's Eq. 5-6 as stored summaries quote them. Our choices, as no
source says: the encoder's output is one more mix over b_0 .. b_N (with `block_size=1`, Full AttnRes's), then the
LayerNorm; `block_size` must divide 2 * depth (the paper's blocks are all S = L / N layers; odd sizes put a
boundary before an MLP, which Eq. 6 defines and the README's pseudocode, written for even sizes, does not show);
`learned_query=False` is refused with it (the query would be a partial sum, in no source);
`return_history=True` returns the block representations (the given history, b_0 .. b_N) and `history` puts
them before b_0 as more completed blocks.

Where it differs from vit-pytorch 1.26.14, which does not compute the paper's function (its checkpoints are
refused, naming it): vit-pytorch mixes the depth outputs through a multi-head cross-attention with LayerNorms and
query, key-value and output projections, from a query drawn from a unit normal; a branch's input is then a learned
projection of the outputs, not their convex combination. Ours is the paper's mix, without parameters besides w_l and
the RMSNorm's weight. The first attention reads v_0 alone (a softmax over one output is 1), so it has no query, as
in vit-pytorch; vit-pytorch has no Block AttnRes.
"""

import functools

import torch
from einops import rearrange
from torch import nn

from vit_pytorch import simple_vit, vit


class DepthAttention(nn.Module):
    """`forward(history)`: sum_i softmax_i(q . RMSNorm(v_i)) v_i over the outputs v_i (b, n, dim) in `history`, per
    token: (b, n, dim). The query q is the learned pseudo-query (zero at first), or with `learned_query=False` each
    token's latest output."""

    def __init__(self, dim, learned_query=True, eps=1e-6):
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.query = nn.Parameter(torch.zeros(dim)) if learned_query else None

    def weights(self, history):
        """Each output's weight for each token, (depth, b, n). The norm's gain folds into the query,
        q . RMSNorm(v) = (v . (g q)) / rms(v), so that no normed copy of the outputs is kept for the backward pass."""
        query = self.norm.weight * (history[-1] if self.query is None else self.query)
        logits = torch.stack([(v * query).sum(dim=-1) * torch.rsqrt(v.pow(2).mean(dim=-1) + self.norm.eps)
                              for v in history])                                   # (depth, b, n)
        return logits.softmax(dim=0)

    def forward(self, history):
        # a sum over the outputs rather than one einsum over their stack: no (depth, b, n, dim) copy kept per branch
        return sum(rearrange(weight, 'b n -> b n 1') * v for weight, v in zip(self.weights(history), history))


class Transformer(vit.Stack):
    """`depth` layers of (DepthAttention, attention, DepthAttention, feedforward): each branch reads the depth mix of
    every output before it (the first attention the patch tokens alone: no mix). The outputs gather in the state as
    'history' (a tuple, the tokens first); each layer returns its MLP's output; the encoder's output is the final
    mix through a LayerNorm. `forward(x, history=...)` puts an earlier run's outputs before x."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, learned_query=True, *, attention=simple_vit.Attention):
        super().__init__([
            (DepthAttention(dim, learned_query) if index else None, attention(dim, heads, dim_head),
             DepthAttention(dim, learned_query), simple_vit.FeedForward(dim, mlp_dim))
            for index in range(depth)
        ])
        self.final_pool = DepthAttention(dim, learned_query)
        self.final_norm = nn.LayerNorm(dim)

    def step(self, entry, x, state, history=None):
        outputs = state.get('history')
        if outputs is None:
            outputs = (*(history or ()), x)
        attn_mix, attn, ff_mix, ff = entry
        outputs = (*outputs, attn(outputs[-1] if attn_mix is None else attn_mix(outputs)))
        out = ff(ff_mix(outputs))
        return out, {'history': (*outputs, out)}

    def run(self, x, **kwargs):
        _, outputs, state = super().run(x, **kwargs)
        return self.final_norm(self.final_pool(state['history'])), outputs, state


class BlockTransformer(Transformer):
    """Block AttnRes: `Transformer` with the 2 * depth branches in blocks of `block_size` (a divisor of 2 * depth).
    The state's 'history' holds the completed blocks (an earlier run's, then b_0 = the patch tokens, b_1, ...),
    'partial' the current block's sum so far (None at a boundary) and 'branches' how many branches have run; each
    branch reads the depth mix of the completed blocks and the partial sum."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, *, block_size, attention=simple_vit.Attention):
        super().__init__(dim, depth, heads, dim_head, mlp_dim, attention=attention)
        self.block_size = block_size

    def step(self, entry, x, state, history=None):
        blocks = state.get('history')
        if blocks is None:
            blocks, partial, done = (*(history or ()), x), None, 0
        else:
            partial, done = state['partial'], state['branches']
        attn_mix, attn, ff_mix, ff = entry
        for mix, branch in ((attn_mix, attn), (ff_mix, ff)):
            sources = blocks if partial is None else (*blocks, partial)
            out = branch(sources[-1] if mix is None else mix(sources))
            partial = out if partial is None else partial + out
            done += 1
            if done % self.block_size == 0:
                blocks, partial = (*blocks, partial), None
        return out, {'history': blocks, 'partial': partial, 'branches': done}


class SimpleViTAttnResidual(simple_vit.SimpleViT):
    """`vit_pytorch.simple_vit.SimpleViT` (same arguments and methods) with attention residuals; `learned_query`
    (vit-pytorch's): False queries the depth outputs with each token's latest one.

    `block_size` (keyword-only, ours; None: Full AttnRes): Block AttnRes over blocks of `block_size` branches
    (attention and MLP each count one; a divisor of 2 * depth; 1 is Full AttnRes), with the same parameters.

    `forward(img, history=None, return_history=False)`: `history` a list of depth outputs (b, h * w, dim) of an
    earlier run; `return_history=True` returns (logits, every depth output: the given history, the patch tokens and
    each branch's output; with `block_size`, the given history and the 2 * depth / block_size + 1 block
    representations). `forward_features` returns the final depth mix after its norm, (b, h * w, dim).
    `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 learned_query=True, block_size=None):
        check_arguments(**vit.arguments(locals()))
        transformer = (functools.partial(Transformer, learned_query=learned_query) if block_size is None else
                       functools.partial(BlockTransformer, block_size=block_size))
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head, transformer=transformer)

    def forward(self, img, history=None, return_history=False):
        tokens = self.embed(img)
        check_history(history, tokens)
        features, state = self.transformer(tokens, history=history, return_state=True)
        logits = self.forward_head(features)
        return (logits, list(state['history'])) if return_history else logits


# argument checks


def check_arguments(*, learned_query, block_size, depth, **_):
    vit.boolean('learned_query', learned_query)
    if block_size is None:
        return
    branches = 2 * vit.positive_int('depth', depth)
    if branches % vit.positive_int('block_size', block_size):
        raise ValueError(f"block_size must divide 2 * depth = {branches} (the attention and MLP branches, each one "
                         f"of the paper's layers), got {block_size}")
    if not learned_query:
        raise ValueError("block_size (Block AttnRes) needs learned_query=True: the paper's blocks are read by a "
                         "learned pseudo-query; with learned_query=False the query would be a block's partial sum, "
                         "which no source defines")


def check_history(history, tokens):
    if history is None:
        return
    if not isinstance(history, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in history):
        raise TypeError(f"history must be a list of tensors (an earlier run's return_history), got "
                        f"{type(history).__name__}")
    for index, output in enumerate(history):
        if output.shape != tokens.shape:
            raise ValueError(f"history[{index}] must have the shape of this run's tokens {tuple(tokens.shape)}, got "
                             f"{tuple(output.shape)}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    raise ValueError("vit-pytorch's simple_vit_attn_residual mixes the depth outputs through a multi-head "
                     "cross-attention with query, key-value and output projections (attn.to_q, attn.to_kv, "
                     "attn.to_out, learned_query); the paper (arXiv 2603.15031) and this model mix them by a softmax "
                     "over depth of a pseudo-query against the RMSNorm'd outputs, a convex combination of them: its "
                     "checkpoints compute another function and cannot be loaded")
