"""ViT with a decorrelation loss on the inputs of its layers, or (an option) the paper's decorrelation matrices.

"Decorrelation Speeds Up Vision Transformers", arXiv 2510.14657 (Carrigg et al.): inputs whose features are
decorrelated make gradient descent better conditioned, and a ViT (the encoder of an MAE, in the paper) trained
with decorrelated layer inputs reaches its accuracy sooner. The two methods this module offers:

The paper's method, decorrelated backpropagation (Dalm et al., arXiv 2405.02385; the authors' code is
artcogsys/decorbp, read at commit 5a15d9a, whose ViT version is its commit 3255ca6): a learned matrix R before
the linear transform of a layer, z = R x, so that the layer multiplies z instead of x. R starts at the identity,
is no parameter (the task's gradient flows through it to x but never changes it), and after every optimizer step
moves by its own rule from the last batch's rows z: R <- R - lr ((1 - kappa) C R + kappa R diag(v)), C the
off-diagonal part of the second moment Z^T Z / N and v its diagonal minus 1, which drives the off-diagonal
second moments of z to 0 (kappa > 0: also its variances to 1, whitening). Here `decorr_matrices=True` puts one
(`Decorrelation`) before every Linear of the encoder: the patch projection, and in each layer the query/key/value
and output projections and both feed-forward Linears (decorbp replaces every Linear of the model it is given, and
the paper applies it to the MAE's encoder: the head has none here). `update_decorrelation_()` is the rule's step,
which the training loop (`vit_pytorch.training.loop.train_epoch`) takes after every optimizer step.

vit-pytorch's method, which this module stands in for: no matrix; the objective alone, the mean squared
off-diagonal entry of each layer input's second-moment matrix (the covariance with `decorr_mean_center=True`),
summed over the layers, as an auxiliary loss that the training step adds to its task loss, so that the task's
gradient decorrelates the inputs through the weights of the layers before. It is the default, as vit-pytorch's:
without `decorr_matrices` the model, its arguments, state_dict and outputs are vit-pytorch's.

    import torch
    from vit_pytorch.vit_with_decorr import ViT

    model = ViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16,
                mlp_dim=2048, decorr_sample_frac=0.25)
    images, labels = torch.randn(2, 3, 256, 256), torch.tensor([3, 7])
    logits, decorr_loss = model(images)           # (2, 1000) and a scalar, in training mode
    loss = torch.nn.functional.cross_entropy(logits, labels) + 0.1 * decorr_loss
    loss.backward()

    paper = ViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16, mlp_dim=2048,
                decorr_matrices=True, decorr_matrices_lr=1e-4, decorr_matrices_kappa=1e-3)
    optimizer = torch.optim.AdamW(paper.parameters(), lr=1e-4)   # R is no parameter: the optimizer never sees it
    logits, _ = paper(images, return_decorr_aux_loss=False)     # (2, 1000)
    torch.nn.functional.cross_entropy(logits, labels).backward()
    optimizer.step()
    paper.update_decorrelation_()                 # the rule's step, from the rows of the forward above

`forward(img, return_decorr_aux_loss=None)` returns `(logits, decorr_aux_loss)` always, as vit-pytorch's
(the loss is 0 unless asked for; by default it is asked for in training mode). The loss reads the normed
input of every attention and feed-forward block (2 x depth tensors), on a random `decorr_sample_frac` of
the tokens of each, or, with `decorr_layer_outputs_across_depth=True`, the branch outputs of every block,
decorrelated across depth for each token. `DecorrelationLoss` works on its own on any (..., b, n, d) tokens.
The two methods combine (matrices and the loss), though neither source does.

Differences from vit-pytorch 1.26.14: its checkpoints load (`load_vit_pytorch`; the feed-forward's LayerNorm
becomes the first entry of our `FeedForward.net`; into a model with matrices they start at the identity), except
those with `pool='mean'`, whose mean includes the cls token; ours has no cls token under mean pooling, as
`vit.ViT`, and that checkpoint is refused. Too few tokens to sample (fewer than 2) raise a ValueError instead of
an assert. `num_classes=0` gives the tokens, as `vit.ViT`. `decorr_matrices` and its options are ours.

Differences from the paper's code (decorbp): the rule, its loss and its row sampling are decorbp's 'standard'
method by default, its 'normalized' method with `decorr_matrices_method='normalized'`
(tests/fixtures/make_decorbp_official_fixtures.py checks a step of each against it); its lower-triangular
matrices (`full=False`) are not offered, nor its convolution version (our patch projection
is a Linear on flattened patches, which its Conv2d patch embedding computes too). Its defaults are taken as
ours (lr 1e-4 and kappa 1e-3 of its command line; every row read); the rates of the paper's ViT runs are not
known to us (we read the paper's abstract, not its method section). decorbp gives the 'normalized' rule no rate of
its own (one `--decor_lr` for both rules): at the same lr its decorrelation step is 1 / (d - 1) of the standard
rule's (docs/tokens.md trains both on the digits, the normalized rule at 1e-2 and 0.63). With several
processes (DDP) each process steps its matrices on its own rows and DDP's buffer broadcast makes the first
process's win at the next forward.
"""

from functools import partial

import torch
import torch.nn.functional as F
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


class Decorrelation(nn.Module):
    """Decorrelated backpropagation's matrix (the paper's method): z = R x for x (..., d), R a (d, d) buffer
    `weight` that starts at the identity. The task's gradient passes through R to x but never changes R (a buffer,
    no optimizer holds it); `update()` does, by its own rule, from the rows z of the last forward in training:

        X = Z^T Z / N         (Z: the N kept rows of z, d wide; the second moment, not mean-centred)
        C = X - diag(X)       (the off-diagonal part)         v = diag(X) - 1
        R <- R - lr ((1 - kappa) C R + kappa R diag(v))

    returning ((1 - kappa) sum C^2 + kappa sum v^2) / d^2 of those rows (before the step). kappa = 0 only
    decorrelates; kappa > 0 also pulls each variance towards 1 (whitening). This is decorbp's 'standard' rule as
    its code computes it (artcogsys/decorbp, `Decorrelation.update`, commit 5a15d9a; `kappa * v * weight` there
    scales R's columns by v, hence R diag(v), where its earlier notes write the variance term on the left, diag(v)
    R; the two agree while R is diagonal). `method='normalized'` is decorbp's other rule: the decorrelation term
    divided by the d - 1 off-diagonal entries of a row and the variance term doubled (the gradient of v^2),

        R <- R - lr ((1 - kappa) / (d - 1) C R + 2 kappa R diag(v)),

    returning (((1 - kappa) / (d - 1)) sum C^2 + kappa sum v^2) / d: each row's decorrelation step averages its
    d - 1 off-diagonal entries where the standard rule sums them. `sample_frac` < 1 keeps
    int(N * sample_frac) rows drawn with replacement (at least one) from the N = b * n rows of a forward
    (decorbp's `downsample_perc`); the output always transforms every row. With no training forward since the
    last update, `update()` does nothing (None).
    """

    def __init__(self, dim, *, lr=1e-4, kappa=1e-3, sample_frac=1., method='standard'):
        check_method(method)
        super().__init__()
        self.lr, self.kappa, self.sample_frac, self.method = lr, kappa, sample_frac, method
        self.register_buffer('weight', torch.eye(dim))
        self.rows = None

    def forward(self, x):
        z = F.linear(x, self.weight)
        if self.training:
            rows = rearrange(z.detach(), '... d -> (...) d')
            if self.sample_frac < 1.:
                keep = max(1, int(len(rows) * self.sample_frac))
                rows = rows[torch.randint(len(rows), (keep,), device=rows.device)]
            self.rows = rows
        return z

    @torch.no_grad()
    def update(self):
        if self.rows is None:
            return None
        rows, self.rows = self.rows.to(self.weight.dtype), None
        dim = self.weight.shape[0]
        second = rows.T @ rows / len(rows)
        off_diagonal = second - torch.diag_embed(second.diagonal())
        variance_gap = second.diagonal() - 1.
        # the two terms' weights: decorbp's 'standard' rule, or its 'normalized' one (per off-diagonal entry of a
        # row; the variance term's gradient, 2 v); the loss summed over d^2 entries, or averaged over the d rows
        decorrelate, whiten, size = ((1. - self.kappa) / (dim - 1), 2. * self.kappa, dim) \
            if self.method == 'normalized' else (1. - self.kappa, self.kappa, dim ** 2)
        self.weight -= self.lr * (decorrelate * off_diagonal @ self.weight + whiten * self.weight * variance_gap)
        return (decorrelate * off_diagonal.pow(2).sum() + self.kappa * variance_gap.pow(2).sum()) / size


class DecorrelatedLinear(nn.Linear):
    """A Linear whose input passes a `Decorrelation` first: y = W (R x) + b. Its parameters keep nn.Linear's keys
    (`weight`, `bias`); R is `decorrelation.weight`."""

    def __init__(self, in_features, out_features, bias=True, *, lr=1e-4, kappa=1e-3, sample_frac=1.,
                 method='standard'):
        super().__init__(in_features, out_features, bias=bias)
        self.decorrelation = Decorrelation(in_features, lr=lr, kappa=kappa, sample_frac=sample_frac, method=method)

    def forward(self, x):
        return F.linear(self.decorrelation(x), self.weight, self.bias)


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

    `decorr_matrices=True` (ours; off by default, which is vit-pytorch's model) adds the paper's method: a
    `Decorrelation` matrix before every Linear of the encoder (the patch projection, and in each layer the
    query/key/value and output projections and both feed-forward Linears; not the head), each updated by
    `update_decorrelation_()` after every optimizer step (the training loop calls it), with its rule's
    `decorr_matrices_lr`, `decorr_matrices_kappa` and `decorr_matrices_sample_frac`, and
    `decorr_matrices_method` ('standard', decorbp's default, or its 'normalized' rule; see `Decorrelation`).

    `forward_features` returns all tokens after the final norm, (b, prefix + h * w, dim).
    `num_classes=0` makes `forward` return (all those tokens, the loss), as `vit.ViT` does the tokens.
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, pool='cls', channels=3,
                 dim_head=64, dropout=0., emb_dropout=0., decorr_sample_frac=1., decorr_use_subspace=False,
                 decorr_dim_subspace=64, decorr_num_subspaces=1, decorr_mean_center=False,
                 decorr_layer_outputs_across_depth=False, decorr_matrices=False, decorr_matrices_lr=1e-4,
                 decorr_matrices_kappa=1e-3, decorr_matrices_sample_frac=1., decorr_matrices_method='standard'):
        check_arguments(**vit.arguments(locals()))
        blocks = dict(attention=Attention)
        if decorr_matrices:
            linear = partial(DecorrelatedLinear, lr=decorr_matrices_lr, kappa=decorr_matrices_kappa,
                             sample_frac=decorr_matrices_sample_frac, method=decorr_matrices_method)
            blocks = dict(attention=partial(Attention, linear=linear),
                          feedforward=partial(vit.FeedForward, linear=linear),
                          patch_embedding=partial(vit.PatchEmbedding, linear=linear))
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, pool=pool, channels=channels, dim_head=dim_head,
                         dropout=dropout, emb_dropout=emb_dropout, transformer=Transformer, **blocks)
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

    @torch.no_grad()
    def update_decorrelation_(self):
        """The paper's step after each optimizer step: every decorrelation matrix moves by its rule, from the rows
        of the last forward in training. Returns the mean of their losses (before the step), or None when there are
        no matrices or no such rows."""
        losses = [loss for module in self.modules() if isinstance(module, Decorrelation)
                  for loss in [module.update()] if loss is not None]
        return torch.stack(losses).mean() if losses else None

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


def check_method(method, name='method'):
    if method not in ('standard', 'normalized'):
        raise ValueError(f"{name} must be 'standard' or 'normalized' (decorbp's two rules), got {method!r}")


def check_arguments(*, decorr_sample_frac, decorr_use_subspace, decorr_dim_subspace, decorr_num_subspaces,
                    decorr_mean_center, decorr_layer_outputs_across_depth, decorr_matrices, decorr_matrices_lr,
                    decorr_matrices_kappa, decorr_matrices_sample_frac, decorr_matrices_method, dim, **_):
    vit.fraction('decorr_sample_frac', decorr_sample_frac, ' (the share of tokens sampled; 0: no loss)')
    for name, value in dict(decorr_use_subspace=decorr_use_subspace, decorr_mean_center=decorr_mean_center,
                            decorr_layer_outputs_across_depth=decorr_layer_outputs_across_depth,
                            decorr_matrices=decorr_matrices).items():
        vit.boolean(name, value)
    vit.positive_float('decorr_matrices_lr', decorr_matrices_lr)
    check_method(decorr_matrices_method, 'decorr_matrices_method')
    vit.fraction('decorr_matrices_kappa', decorr_matrices_kappa, ' (the weight of the variance term)')
    if vit.fraction('decorr_matrices_sample_frac', decorr_matrices_sample_frac,
                    ' (the share of rows the update reads)') == 0:
        raise ValueError(f"decorr_matrices_sample_frac must be in (0, 1] (the share of rows the update reads), "
                         f"got {decorr_matrices_sample_frac!r}")
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
        if key.endswith('decorrelation.weight'):                # vit-pytorch has none: they start at the identity
            plan[key] = ({}, partial(torch.eye, tensor.shape[0], dtype=tensor.dtype))
            continue
        theirs = key
        layer, dot, rest = key.partition('.1.net.')
        if key.startswith('transformer.layers.') and dot:
            theirs = layer + '.1.' + renamed['net.' + rest[:2]] + rest[2:]
        plan[key] = ({theirs: tuple(tensor.shape)}, same)
    return plan, ('mlp_head.',)
