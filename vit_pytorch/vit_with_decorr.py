"""ViT with a decorrelation loss on the inputs of its layers.

"Decorrelation Speeds Up Vision Transformers", arXiv 2510.14657: inputs whose features are decorrelated
make gradient descent better conditioned, and a ViT trained with decorrelated layer inputs reaches its
accuracy sooner. The paper inserts a decorrelation matrix before each layer, updated by its own rule from
the off-diagonal covariance of that layer's input. vit-pytorch's module, which this one stands in for,
keeps only the objective: the mean squared off-diagonal entry of each layer input's second-moment matrix
(the covariance with `decorr_mean_center=True`), summed over the layers, as an auxiliary loss that the
training step adds to its task loss; no decorrelation matrix is inserted. So does this module.

    import torch
    from vit_pytorch.vit_with_decorr import ViT

    model = ViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16,
                mlp_dim=2048, decorr_sample_frac=0.25)
    images, labels = torch.randn(2, 3, 256, 256), torch.tensor([3, 7])
    logits, decorr_loss = model(images)           # (2, 1000) and a scalar, in training mode
    loss = torch.nn.functional.cross_entropy(logits, labels) + 0.1 * decorr_loss
    loss.backward()

`forward(img, return_decorr_aux_loss=None)` returns `(logits, decorr_aux_loss)` always, as vit-pytorch's
(the loss is 0 unless asked for; by default it is asked for in training mode). The loss reads the normed
input of every attention and feed-forward block (2 x depth tensors), on a random `decorr_sample_frac` of
the tokens of each, or, with `decorr_layer_outputs_across_depth=True`, the branch outputs of every block,
decorrelated across depth for each token. `DecorrelationLoss` works on its own on any (..., b, n, d) tokens.

Differences from vit-pytorch 1.26.14: its checkpoints load (`load_vit_pytorch`; the feed-forward's LayerNorm
becomes the first entry of our `FeedForward.net`), except those with `pool='mean'`, whose mean includes the cls
token; ours has no cls token under mean pooling, as `vit.ViT`, and that checkpoint is refused. Too few tokens
to sample (fewer than 2) raise a ValueError instead of an assert. `num_classes=0` gives the tokens, as `vit.ViT`.
"""

import torch
from einops import einsum, rearrange, reduce, repeat
from torch import nn

from vit_pytorch import vit


class DecorrelationLoss(nn.Module):
    """The mean of the squared off-diagonal entries of X^T X / n, X the (n, d) tokens of each sample, summed over
    the leading dimensions (layers) and subspaces, then averaged over the batch: (..., b, n, d) -> a scalar.

    sample_frac                 the share of each sample's tokens drawn at random (int(n * sample_frac) of them)
    soft_validate_num_sampled   fewer than 2 drawn tokens give a loss of 0 instead of a ValueError
    use_subspace, dim, dim_subspace, num_subspaces
                                project the d features onto `num_subspaces` fixed random orthonormal bases of
                                `dim_subspace` vectors first (a buffer, saved), and decorrelate within each
    mean_center                 subtract each sample's mean token first: the off-diagonal covariance
    across_depth                the caller passes (n, b, layers, d): no sampling, the layers are what is decorrelated
    """

    def __init__(self, sample_frac=1., soft_validate_num_sampled=False, use_subspace=False, dim=None,
                 dim_subspace=64, num_subspaces=1, mean_center=False, across_depth=False):
        check_loss_arguments(**vit.arguments(locals()))
        super().__init__()
        self.need_sample = sample_frac < 1. and not across_depth
        self.sample_frac = sample_frac
        self.soft_validate_num_sampled = soft_validate_num_sampled
        self.use_subspace, self.dim_subspace, self.num_subspaces = use_subspace, dim_subspace, num_subspaces
        self.mean_center = mean_center
        if use_subspace:
            self.register_buffer('proj', torch.empty(num_subspaces, dim, dim_subspace))
            for basis in self.proj:
                nn.init.orthogonal_(basis)

    def forward(self, tokens):
        check_tokens(tokens, self)
        num_tokens, dim = tokens.shape[-2:]
        if self.need_sample:
            keep = int(num_tokens * self.sample_frac)
            if keep < 2:
                if self.soft_validate_num_sampled:
                    return tokens.new_zeros(())
                raise ValueError(f"decorrelation needs at least 2 sampled tokens: sample_frac {self.sample_frac} of "
                                 f"{num_tokens} tokens keeps {keep}; raise it or pass soft_validate_num_sampled=True")
            chosen = torch.rand(tokens.shape[:-1], device=tokens.device).argsort(dim=-1)[..., :keep]
            tokens = tokens.gather(-2, repeat(chosen, '... n -> ... n d', d=dim))
        if self.use_subspace:
            tokens = einsum(tokens, self.proj.to(tokens.dtype), '... n d, s d e -> ... s n e')
        else:
            tokens = rearrange(tokens, '... n d -> ... 1 n d')
        if self.mean_center:
            tokens = tokens - tokens.mean(dim=-2, keepdim=True)
        width = tokens.shape[-1]
        moments = einsum(tokens, tokens, '... n d, ... n e -> ... d e') / tokens.shape[-2]    # (..., b, s, d, d)
        off_diagonal = 1. - torch.eye(width, device=tokens.device, dtype=tokens.dtype)
        per_sample = reduce(moments.pow(2) * off_diagonal, '... b s d e -> b', 'sum') / (width * (width - 1))
        return per_sample.mean()


class Attention(vit.Attention):
    """The core attention on an input the stack has already normed (with this module's `norm`), so that the stack
    can keep the normed input for the loss without norming twice."""

    def qkv(self, normed):
        return rearrange(self.to_qkv(normed), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=self.heads)


class Transformer(vit.Transformer):
    """The ViT encoder whose layers hand down their blocks' normed inputs and branch outputs when `gather=True`
    (state 'normed_inputs' and 'layer_outputs', in order: attention then feed-forward of each layer)."""

    def step(self, entry, x, state, *, gather=False):
        attn, ff = entry
        attn_in = attn.norm(x)
        attn_out = attn(attn_in)
        x = x + attn_out
        ff_in = ff.net[0](x)
        ff_out = ff.net[1:](ff_in)
        x = x + ff_out
        if not gather:
            return x, {}
        return x, {'normed_inputs': state.get('normed_inputs', ()) + (attn_in, ff_in),
                   'layer_outputs': state.get('layer_outputs', ()) + (attn_out, ff_out)}


class ViT(vit.ViT):
    """`vit_pytorch.ViT` (vit-pytorch's arguments) whose forward also returns the decorrelation loss:
    `forward(img, return_decorr_aux_loss=None)` -> (logits (b, num_classes), loss (a scalar; 0 unless asked for,
    by default asked for in training)). `decorr_sample_frac=0` builds no loss.

    `forward_features` returns all tokens after the final norm, (b, prefix + h * w, dim).
    `num_classes=0` makes `forward` return (all those tokens, the loss), as `vit.ViT` does the tokens.
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, pool='cls', channels=3,
                 dim_head=64, dropout=0., emb_dropout=0., decorr_sample_frac=1., decorr_use_subspace=False,
                 decorr_dim_subspace=64, decorr_num_subspaces=1, decorr_mean_center=False,
                 decorr_layer_outputs_across_depth=False):
        check_arguments(**vit.arguments(locals()))
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, pool=pool, channels=channels, dim_head=dim_head,
                         dropout=dropout, emb_dropout=emb_dropout, attention=Attention, transformer=Transformer)
        self.decorr_layer_outputs_across_depth = decorr_layer_outputs_across_depth
        self.has_decorr_loss = decorr_sample_frac > 0.
        self.decorr_loss = DecorrelationLoss(
            decorr_sample_frac, use_subspace=decorr_use_subspace, dim=dim, dim_subspace=decorr_dim_subspace,
            num_subspaces=decorr_num_subspaces, mean_center=decorr_mean_center,
            across_depth=decorr_layer_outputs_across_depth) if self.has_decorr_loss else None

    def decorr_aux_loss(self, state):
        """The loss of what the layers gathered: their blocks' normed inputs (2 depth, b, n, d), or their branch
        outputs across depth (n, b, 2 depth, d)."""
        if self.decorr_layer_outputs_across_depth:
            return self.decorr_loss(rearrange(torch.stack(state['layer_outputs']), 'l b n d -> n b l d'))
        return self.decorr_loss(torch.stack(state['normed_inputs']))

    def forward(self, img, return_decorr_aux_loss=None):
        wanted = self.training if return_decorr_aux_loss is None else return_decorr_aux_loss
        x = self.embed(img)
        if wanted and self.has_decorr_loss:
            tokens, state = self.transformer(x, return_state=True, gather=True)
            loss = self.decorr_aux_loss(state)
        else:
            tokens, loss = self.transformer(x), x.new_zeros(())
        return (tokens if self.mlp_head is None else self.forward_head(tokens)), loss


class RegisteredViT(ViT):
    """The model the package's registry builds as 'vit_with_decorr' (`vit_pytorch.models`): this module's `ViT`
    whose forward returns the logits alone, as every registered classifier's does, unless asked for the loss:
    `forward(img, return_decorr_aux_loss=False)` -> logits; `True` -> (logits, loss). The training command asks
    for it (the registry's `AUX_LOSSES`) and adds `--decorr-aux-loss-weight` times it to the cross-entropy.
    The same arguments, state_dict and `forward_features` (all tokens after the final norm, (b, prefix + h * w,
    dim)) as `ViT`; `num_classes=0` makes `forward` return those tokens (and the loss when asked for).
    """

    def forward(self, img, return_decorr_aux_loss=False):
        logits, loss = super().forward(img, return_decorr_aux_loss=return_decorr_aux_loss)
        return (logits, loss) if return_decorr_aux_loss else logits


# argument checks


def check_loss_arguments(*, sample_frac, soft_validate_num_sampled, use_subspace, dim, dim_subspace, num_subspaces,
                         mean_center, across_depth):
    vit.fraction('sample_frac', sample_frac, ' (the share of tokens sampled)')
    for name, value in dict(soft_validate_num_sampled=soft_validate_num_sampled, use_subspace=use_subspace,
                            mean_center=mean_center, across_depth=across_depth).items():
        vit.boolean(name, value)
    vit.positive_int('num_subspaces', num_subspaces)
    vit.positive_int('dim_subspace', dim_subspace)
    if dim is not None:
        vit.positive_int('dim', dim)
    if use_subspace:
        if dim is None:
            raise ValueError("dim (the tokens' width) must be given with use_subspace=True")
        if dim_subspace >= dim or dim_subspace < 2:
            raise ValueError(f"dim_subspace must be in [2, dim) = [2, {dim}) (a subspace of the features with at "
                             f"least two to decorrelate), got {dim_subspace}")


def check_tokens(tokens, loss):
    if not isinstance(tokens, torch.Tensor) or not tokens.is_floating_point() or tokens.ndim < 3:
        raise TypeError(f"tokens must be a floating point tensor (..., b, n, d), got "
                        f"{getattr(tokens, 'shape', type(tokens).__name__)}")
    if loss.use_subspace and tokens.shape[-1] != loss.proj.shape[1]:
        raise ValueError(f"tokens must have the loss's dim = {loss.proj.shape[1]} features (last dimension), got "
                         f"shape {tuple(tokens.shape)}")
    if tokens.shape[-1] < 2:
        raise ValueError(f"tokens must have at least 2 features to decorrelate (last dimension), got shape "
                         f"{tuple(tokens.shape)}")


def check_arguments(*, decorr_sample_frac, decorr_use_subspace, decorr_dim_subspace, decorr_num_subspaces,
                    decorr_mean_center, decorr_layer_outputs_across_depth, dim, **_):
    vit.fraction('decorr_sample_frac', decorr_sample_frac, ' (the share of tokens sampled; 0: no loss)')
    for name, value in dict(decorr_use_subspace=decorr_use_subspace, decorr_mean_center=decorr_mean_center,
                            decorr_layer_outputs_across_depth=decorr_layer_outputs_across_depth).items():
        vit.boolean(name, value)
    vit.positive_int('decorr_num_subspaces', decorr_num_subspaces)
    vit.positive_int('decorr_dim_subspace', decorr_dim_subspace)
    if decorr_use_subspace:
        if decorr_dim_subspace >= dim or decorr_dim_subspace < 2:
            raise ValueError(f"decorr_dim_subspace must be in [2, dim) = [2, {dim}) with decorr_use_subspace=True, "
                             f"got {decorr_dim_subspace}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `ViT` of this module: its feed-forward keeps the LayerNorm beside `net` (ours is net.0, and its
    Linears net.0 / net.3 are our net.1 / net.4); cls token and position table carry a leading 1."""
    if model.pool != 'cls':
        raise ValueError("vit-pytorch's decorrelation ViT keeps its cls token under pool='mean' and averages it with "
                         "the patch tokens; this model has no cls token under mean pooling: only pool='cls' "
                         "checkpoints load")
    state = model.state_dict()
    same = lambda t: t                                                              # noqa: E731
    plan = {'cls_token': ({'cls_token': (1, *state['cls_token'].shape)}, lambda t: t[0]),
            'pos_embedding': ({'pos_embedding': (1, *state['pos_embedding'].shape)}, lambda t: t[0])}
    renamed = {'net.0.': 'norm.', 'net.1.': 'net.0.', 'net.4.': 'net.3.'}
    for key, tensor in state.items():
        if key in plan:
            continue
        theirs = key
        layer, dot, rest = key.partition('.1.net.')
        if key.startswith('transformer.layers.') and dot:
            theirs = layer + '.1.' + renamed['net.' + rest[:2]] + rest[2:]
        plan[key] = ({theirs: tuple(tensor.shape)}, same)
    return plan, ('mlp_head.',)
