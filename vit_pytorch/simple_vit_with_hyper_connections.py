"""SimpleViT with hyper-connections and register tokens.

Zhu et al., "Hyper-Connections", arXiv 2409.19606: the residual stream becomes n streams H = (h_1 .. h_n) (the
expansion rate, `num_residual_streams`). Before each branch T (attention or MLP) a width connection mixes them: the
branch reads h_0 = sum_j A_m[j] h_j, and the streams are remixed by A_r, h'_i = sum_j A_r[j, i] h_j; after it a
depth connection adds the branch output to every stream with weights B: h''_i = B[i] T(h_0) + h'_i. In the paper's
matrix form (its Eq. 2 to 5) HC = [[0, B], [A_m, A_r]] and H'' = B^T T(H^T A_m)^T + A_r^T H. The input is copied into
every stream at the start, the streams summed at the end (before the final norm).

Static hyper-connections learn A = [A_m A_r] (n x (n + 1)) and B (n) directly; dynamic ones (the default, as in
vit-pytorch) add a per-token part read from the normed streams: A(H) = s_a tanh(norm(H) W_a) + A,
B(H) = s_b tanh(norm(H) W_b) + B, with W_a, W_b starting at zero and s_a, s_b at 0.01. Layer k starts at
A_m = e_(k mod n), A_r = I, B = 1 (the paper's initialisation): with one stream that is x + T(x), the pre-norm
residual.

    import torch
    from vit_pytorch.simple_vit_with_hyper_connections import SimpleViT

    model = SimpleViT(num_classes=1000, image_size=256, patch_size=32, dim=256, depth=6, heads=8, mlp_dim=512,
                      num_residual_streams=4)
    logits = model(torch.randn(2, 3, 256, 256))   # (2, 1000)

Where it differs from vit-pytorch 1.26.14 (whose checkpoints load unchanged, same keys): `dynamic=False` (keyword,
ours) gives the paper's static hyper-connections (vit-pytorch's are always dynamic); the registers come before the
patch tokens (vit-pytorch appends them; every layer treats tokens alike, so the function is the same); the streams
are the stack's layer-to-layer state, and each layer hands on their sum, so `forward_intermediates` gives (b, n, dim)
tokens and gradient checkpointing works as for every SimpleViT.
"""

import functools

import torch
from einops import rearrange, reduce, repeat
from torch import nn

from vit_pytorch import simple_vit, vit


class HyperConnection(nn.Module):
    """The width and depth connections around one branch of layer `layer_index` over `num_residual_streams` streams
    (b, n, streams, dim); `dynamic` adds the per-token part (the paper's DHC) to the static matrices (SHC)."""

    def __init__(self, dim, num_residual_streams, layer_index, *, dynamic=True):
        super().__init__()
        streams = num_residual_streams
        alpha_m = torch.zeros(streams, 1)
        alpha_m[layer_index % streams, 0] = 1.
        self.static_alpha = nn.Parameter(torch.cat((alpha_m, torch.eye(streams)), dim=1))   # [A_m A_r], (n, n + 1)
        self.static_beta = nn.Parameter(torch.ones(streams))
        self.dynamic = dynamic
        if dynamic:
            self.norm = nn.LayerNorm(dim, bias=False)
            self.dynamic_alpha_fn = nn.Parameter(torch.zeros(dim, streams + 1))
            self.dynamic_alpha_scale = nn.Parameter(torch.tensor(1e-2))
            self.dynamic_beta_fn = nn.Parameter(torch.zeros(dim))
            self.dynamic_beta_scale = nn.Parameter(torch.tensor(1e-2))

    def connections(self, streams):
        """(alpha, beta): (n, n + 1) and (n,) when static; (b, tokens, n, n + 1) and (b, tokens, n) when dynamic."""
        if not self.dynamic:
            return self.static_alpha, self.static_beta
        normed = self.norm(streams)
        alpha = (normed @ self.dynamic_alpha_fn).tanh() * self.dynamic_alpha_scale + self.static_alpha
        beta = (normed @ self.dynamic_beta_fn).tanh() * self.dynamic_beta_scale + self.static_beta
        return alpha, beta

    def width_connection(self, streams):
        """(the branch's input (b, n, dim), the remixed streams (b, n, streams, dim), beta)."""
        alpha, beta = self.connections(streams)
        mixed = alpha.transpose(-1, -2) @ streams        # mixed[t] = sum_s alpha[s, t] h_s: (b, n, streams + 1, dim)
        return mixed[..., 0, :], mixed[..., 1:, :], beta

    def depth_connection(self, branch_output, streams, beta):
        """Every stream plus beta[stream] times the branch's output."""
        return rearrange(beta, '... s -> ... s 1') * rearrange(branch_output, 'b n d -> b n 1 d') + streams


class Transformer(vit.Stack):
    """vit-pytorch's hyper-connection `Transformer`: `depth` layers of (HyperConnection, attention, HyperConnection,
    feedforward), then a LayerNorm of the streams' sum. The first layer copies its input into the streams; each layer
    leaves them in the state as 'streams' and returns their sum (b, n, dim)."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, num_residual_streams, *, attention=simple_vit.Attention,
                 dynamic=True):
        super().__init__([
            (HyperConnection(dim, num_residual_streams, index, dynamic=dynamic), attention(dim, heads, dim_head),
             HyperConnection(dim, num_residual_streams, index, dynamic=dynamic), simple_vit.FeedForward(dim, mlp_dim))
            for index in range(depth)
        ], norm=nn.LayerNorm(dim))
        self.num_residual_streams = num_residual_streams

    def step(self, entry, x, state):
        streams = state.get('streams')
        if streams is None:
            streams = repeat(x, 'b n d -> b n s d', s=self.num_residual_streams)
        attn_connection, attn, ff_connection, ff = entry
        for connection, branch in ((attn_connection, attn), (ff_connection, ff)):
            branch_input, streams, beta = connection.width_connection(streams)
            streams = connection.depth_connection(branch(branch_input), streams, beta)
        return reduce(streams, 'b n s d -> b n d', 'sum'), {'streams': streams}


class SimpleViT(simple_vit.Registers, simple_vit.SimpleViT):
    """`vit_pytorch.simple_vit.SimpleViT` with `num_residual_streams` hyper-connected residual streams and
    `num_register_tokens` registers (learned, without positions, before the patch tokens); `dynamic` (keyword, ours):
    False gives static hyper-connections.

    `forward_features` returns all tokens after the final norm, (b, registers + h * w, dim); `forward_head` drops the
    registers before the mean pooling. `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, num_residual_streams,
                 num_register_tokens=4, channels=3, dim_head=64, dynamic=True):
        check_arguments(**vit.arguments(locals()))
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                         transformer=functools.partial(Transformer, num_residual_streams=num_residual_streams,
                                                       dynamic=dynamic))
        self.add_registers(num_register_tokens, dim, lambda tokens: vit.init_tokens(tokens, patch_norm=True))


# argument checks


def check_arguments(*, num_residual_streams, num_register_tokens, dynamic, **_):
    vit.positive_int('num_residual_streams', num_residual_streams)
    vit.non_negative_int('num_register_tokens', num_register_tokens)
    vit.boolean('dynamic', dynamic)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's module has our parameter names and computes the same function, with dynamic connections."""
    if not model.transformer.layers[0][0].dynamic:
        raise ValueError("vit-pytorch's hyper-connections are dynamic (dynamic_alpha_fn, dynamic_beta_fn and their "
                         "norm); this model's are static (dynamic=False): build it with dynamic=True to load the "
                         "checkpoint")
    return None
