"""ViT with Keel: post-LayerNorm made stable for deep stacks.

Chen and Wei, "Post-LayerNorm Is Back: Stable, ExpressivE, and Deep" (Keel), arXiv 2601.19895: a post-LN
Transformer, x <- LN(x + F(x)), loses its gradient with depth, because each LayerNorm divides the sum of two signals
of the same scale by about sqrt(2), a factor 2^(-L/2) over L sub-layers for the residual path. Keel weights the
residual by alpha = L, the number of sub-layers, and keeps a LayerNorm inside each branch (dual LN):

    x <- LN_post(alpha x + F(LN_pre(x)))

so the normalisation divides by about sqrt(alpha^2 + 1) and the residual path passes alpha / sqrt(alpha^2 + 1) =
1 - O(1 / L^2) of its gradient per sub-layer: (1 - O(1 / L^2))^L stays near 1 however deep the stack. The first
sub-layer (attention of the first layer) is a pre-LN residual x + F(LN(x)) without a post-LN, and the last
sub-layer's post-LN is the encoder's final norm, as in vit-pytorch 1.26.14; the LayerNorms of the stack have no bias.

    import torch
    from vit_pytorch.vit_with_keel_post_ln import ViT

    model = ViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16, mlp_dim=2048)
    logits = model(torch.randn(1, 3, 256, 256))   # (1, 1000)

Everything else is the core ViT (`vit_pytorch.vit`: Dual PatchNorm, cls or mean pooling, `num_classes=0` returns
the tokens). vit-pytorch's checkpoints load with the same outputs: its `post_norms.{i}` become the post-LN of
sub-layer i + 1, `layers.{i}.1`. Where it differs from vit-pytorch: depth 1 is accepted (2 sub-layers, alpha 2;
vit-pytorch asserts depth > 1), and `keel_residual_scale` must be a positive number (None: 2 * depth).
"""

from torch import nn

from vit_pytorch import vit


class Transformer(vit.Stack):
    """vit-pytorch's Keel `Transformer`: the 2 * depth sub-layers (attention, feedforward, attention, ...) each an
    entry of `layers`; entry 0 is (attention,), a pre-LN residual; every later entry (branch, post-LN) computes
    LN_post(alpha x + branch(x)), alpha = `keel_residual_scale` (None: 2 * depth); no further final norm."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0., keel_residual_scale=None, *,
                 qkv_bias=False, norm_eps=1e-5, gelu_approximate='none', attention=vit.Attention,
                 feedforward=vit.FeedForward):
        branches = []
        for _ in range(depth):
            branches += [attention(dim, heads, dim_head, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps, norm_bias=False),
                         feedforward(dim, mlp_dim, dropout, norm_eps=norm_eps, gelu_approximate=gelu_approximate,
                                     norm_bias=False)]
        super().__init__([(branches[0],)] + [(branch, nn.LayerNorm(dim, eps=norm_eps, bias=False))
                                              for branch in branches[1:]])
        self.keel_residual_scale = 2 * depth if keel_residual_scale is None else keel_residual_scale

    def step(self, entry, x, state, **kwargs):
        branch, *post_norm = entry
        if not post_norm:
            return branch(x) + x, {}
        return post_norm[0](branch(x) + self.keel_residual_scale * x), {}


class ViT(vit.ViT):
    """The core ViT (same arguments, methods and `num_classes=0` behaviour) on a Keel post-LN stack;
    `keel_residual_scale` is alpha (None: the number of sub-layers, 2 * depth).

    `forward_features` returns all tokens after the last sub-layer's post-LN, (b, prefix + h * w, dim);
    `forward_intermediates` and `feature_info` have one entry per sub-layer (2 * depth), as vit-pytorch's
    `transformer.layers`.
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, pool='cls', channels=3,
                 dim_head=64, dropout=0., emb_dropout=0., keel_residual_scale=None, **options):
        check_arguments(keel_residual_scale=keel_residual_scale)

        def transformer(*args, **kwargs):
            return Transformer(*args, keel_residual_scale=keel_residual_scale, **kwargs)
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, pool=pool, channels=channels, dim_head=dim_head,
                         dropout=dropout, emb_dropout=emb_dropout, transformer=transformer, **options)


# argument checks


def check_arguments(*, keel_residual_scale):
    if keel_residual_scale is not None:
        vit.positive_float('keel_residual_scale', keel_residual_scale)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's Keel ViT computes this function; its post-LNs `transformer.post_norms.{i}` are our
    `transformer.layers.{i + 1}.1`, its sub-layer `transformer.layers.{i}` our `transformer.layers.{i}.0`."""
    plan = {}
    for key, tensor in model.state_dict().items():
        source = key
        if key.startswith('transformer.layers.'):
            index, position, rest = key.removeprefix('transformer.layers.').split('.', 2)
            source = f'transformer.layers.{index}.{rest}' if position == '0' else \
                f'transformer.post_norms.{int(index) - 1}.{rest}'
        plan[key] = ({source: tuple(tensor.shape)}, lambda t: t)
    return plan, ('mlp_head.',)
