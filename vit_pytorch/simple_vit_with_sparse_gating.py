"""SimpleViT with gated attention and a sparsity loss on the gates.

Qiu et al., "Gated Attention for Large Language Models: Non-linearity, Sparsity, and Attention-Sink-Free",
arXiv 2505.06708: a sigmoid gate on each head's attention output, before the output projection (the paper's G1
position, its best one), Y' = Y * sigmoid(X W_theta). The gate is elementwise (one value per channel of each
head), head-specific (each head has its own rows of W_theta) and query-dependent (X is the normed input of the
query's own token). It adds a non-linearity between the value and output projections, which are otherwise one
low-rank linear map, and its scores come out sparse, which removes the attention sink on the first tokens.

`forward(img, return_loss=True)` returns (logits, sparsity loss) as vit-pytorch's module does: the mean gate score
of each image (over layers, heads, tokens and channels) p, then mean(p) (`sparsity_loss_type='l1'`) or
mean(relu(p - sparsity_threshold)) ('thresholded_l1', the default), a push towards sparser gates.

    import torch
    from vit_pytorch.simple_vit_with_sparse_gating import SimpleViTWithSparseGating

    model = SimpleViTWithSparseGating(image_size=64, patch_size=16, num_classes=10, dim=64, depth=2, heads=4,
                                      mlp_dim=128, num_register_tokens=4)
    img = torch.randn(2, 3, 64, 64)
    logits = model(img)                              # (2, 10)
    logits, loss = model(img, return_loss=True)      # loss: a scalar

The attention computes the official code's with its elementwise G1 gate (github.com/qiuzh20/gated_attention, a
Qwen3 language model): its weights give its outputs (tests/test_simple_vit_with_sparse_gating.py, its causal mask
and rotary positions aside); there each head's gate logits come out of the query projection, after its queries.

Where it differs from vit-pytorch 1.26.14, whose checkpoints it refuses: vit-pytorch's module of this name does not
gate the attention output; it multiplies each attention weight by sigmoid(q_mask . k_mask) of a low-rank query and
key (`dim_mask` channels a head, the registers left ungated as sinks), a gate on the scores that the paper does not
study. Here `dim_mask` is kept for vit-pytorch's signature and has no effect (the G1 gate is as wide as the head).
The registers are ordinary tokens, as in `simple_vit_with_register_tokens`.
"""

import torch
from einops import rearrange
from torch import nn

from vit_pytorch import simple_vit, vit

SPARSITY_LOSS_TYPES = ('l1', 'thresholded_l1')


class GatedAttention(vit.SimpleAttention):
    """SimpleViT's attention with the G1 gate: the attended values of each head times sigmoid(LN(x) W_theta), one
    gate per token, head and channel, before the output projection. `forward(x, return_gate=True)` returns (output
    (b, n, dim), gate scores (b, heads, n, dim_head))."""

    def __init__(self, dim, heads=8, dim_head=64):
        super().__init__(dim, heads, dim_head)
        self.to_gate = nn.Linear(dim, heads * dim_head, bias=False)

    def forward(self, x, return_gate=False):
        normed = self.norm(x)
        q, k, v = rearrange(self.to_qkv(normed), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=self.heads)
        gate = rearrange(self.to_gate(normed), 'b n (h d) -> b h n d', h=self.heads).sigmoid()
        out = self.attend(q, k, v) * gate
        out = self.to_out(rearrange(out, 'b h n d -> b n (h d)'))
        return (out, gate) if return_gate else out


class Transformer(vit.SimpleTransformer):
    """SimpleViT's encoder with gated attention; each layer leaves the mean gate score of each image (b,) in the
    stack's state, under 'gate_means' (a tuple, one entry a layer), for the sparsity loss."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, *, attention=GatedAttention):
        super().__init__(dim, depth, heads, dim_head, mlp_dim, attention=attention)

    def step(self, entry, x, state):
        attn, ff = entry
        out, gate = attn(x, return_gate=True)
        x = out + x
        means = state.get('gate_means', ()) + (gate.mean(dim=(1, 2, 3)),)
        return ff(x) + x, {'gate_means': means}


class SimpleViTWithSparseGating(simple_vit.Registers, simple_vit.SimpleViT):
    """SimpleViT with `num_register_tokens` registers (first in the sequence) and the G1 attention gate.

    `forward(img, return_loss=False)`: the logits, or (logits, sparsity loss) with `return_loss=True`.
    `forward_features` returns all tokens after the final norm, (b, registers + h * w, dim); the head drops the
    registers before the mean pooling. `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, num_register_tokens=4,
                 channels=3, dim_head=64, dim_mask=4, sparsity_loss_type='thresholded_l1', sparsity_threshold=0.05):
        check_arguments(**vit.arguments(locals()))
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                         attention=GatedAttention, transformer=Transformer)
        self.add_registers(num_register_tokens, dim, nn.init.normal_)
        self.sparsity_loss_type, self.sparsity_threshold = sparsity_loss_type, sparsity_threshold

    def sparsity_loss(self, gate_means):
        """The loss of the per-layer mean gate scores, a tuple of (b,): l1 or thresholded l1 of their mean."""
        p = torch.stack(gate_means).mean(dim=0)          # (b,): each image's mean gate score
        if self.sparsity_loss_type == 'thresholded_l1':
            p = (p - self.sparsity_threshold).relu()
        return p.mean()

    def forward(self, img, return_loss=False):
        if not return_loss:
            return self.forward_head(self.forward_features(img))
        tokens, state = self.transformer(self.embed(img), return_state=True)
        return self.forward_head(tokens), self.sparsity_loss(state['gate_means'])


# argument checks


def check_arguments(*, num_register_tokens, dim_mask, sparsity_loss_type, sparsity_threshold, **_):
    vit.non_negative_int('num_register_tokens', num_register_tokens)
    vit.positive_int('dim_mask', dim_mask)
    if sparsity_loss_type not in SPARSITY_LOSS_TYPES:
        raise ValueError(f"sparsity_loss_type must be one of {SPARSITY_LOSS_TYPES}, got {sparsity_loss_type!r}")
    vit.fraction('sparsity_threshold', sparsity_threshold, ' (a gate score, in [0, 1])')


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's module gates the attention scores, not the attention output: refused."""
    raise ValueError("vit-pytorch's SimpleViTWithSparseGating gates the attention weights by sigmoid(q_mask . k_mask) "
                     "of a low-rank query and key (to_qkv_and_mask, dim_mask), a gate on the scores; this model "
                     "follows the paper (arXiv 2505.06708, G1): a sigmoid gate on each head's attention output "
                     "(to_gate). The two compute different functions, so its weights cannot be loaded")
