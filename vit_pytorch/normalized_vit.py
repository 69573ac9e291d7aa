"""nViT: the normalized Transformer (nGPT) as a ViT.

Loshchilov et al., "nGPT: Normalized Transformer with Representation Learning on the Hypersphere", arXiv
2410.01131: every hidden state and every vector of a weight matrix in the embedding space lives on the unit
sphere. There are no LayerNorms and no weight decay to keep scales in check; instead each block moves the hidden
state h towards the (normalised) output of its branch by a learned per-channel step, the "eigen learning rate"
alpha (eq. 10-11), and returns to the sphere:

    h <- Norm(h + alpha_A (Norm(Attention(h)) - h)),    h <- Norm(h + alpha_M (Norm(MLP(h)) - h))

Queries and keys are normalised per head and scaled by one learned s_qk, with softmax scale sqrt(d_k) (eq. 15-16);
the MLP is a SwiGLU whose halves are scaled by s_u and s_v sqrt(d_model) (eq. 20-21); the logits by s_z (eq. 3).
Each learned factor is stored as the paper does (section 2.6): a parameter that starts at `scale` and is used times
`init / scale`, so that Adam moves it by steps of `lr * init / scale` (alpha: init 1/depth, scale 1/sqrt(dim);
s_qk, s_z: init 1, scale 1/sqrt(dim); s_u, s_v: init 1, scale 1).

    import torch
    from vit_pytorch.normalized_vit import nViT

    model = nViT(image_size=64, patch_size=16, num_classes=10, dim=128, depth=2, heads=4, mlp_dim=256)
    logits = model(torch.randn(2, 3, 64, 64))   # (2, 10)
    # after each optimizer step, put the stored weights back on the sphere (the trainer does this):
    model.norm_weights_()

The weights are normalised in every forward as well (as vit-pytorch does), so the model computes nGPT's function
whatever its stored weights; `norm_weights_()` after each step (the paper's renormalisation) keeps the stored
weights unit, so that a step's size does not shrink as their norm grows. The image side is vit-pytorch's: patches
flattened as (c p1 p2) and embedded by a unit-column matrix, a learned table of unit position rows added, the sum
normalised; the classifier reads the mean of the tokens.

The official code (github.com/NVIDIA/ngpt, a language model) steps by |alpha|: `alpha_abs=True` does so, and with
it the official blocks' weights give its hidden states and logits to float64 rounding (tests/test_normalized_vit.py,
its attention kernel and rotary positions aside).

Where it differs from vit-pytorch 1.26.14 (whose checkpoints load, converted, through `load_vit_pytorch`):
  - one s_qk scales both queries and keys, as in the paper (vit-pytorch learns a separate q_scale and k_scale);
    a checkpoint loads with s_qk = sqrt(q_scale k_scale / sqrt(d_k)), the same attention logits, and is refused
    where some q_scale * k_scale <= 0, which one s_qk cannot give;
  - alpha and s_z are stored as in the paper: vit-pytorch stores alpha at init / sqrt(dim) and uses it times
    sqrt(dim) (Adam's steps on alpha 1/alpha_init times larger than the paper's), and starts s_z at sqrt(dim)
    (the paper and ours: at 1);
  - queries, keys and values come from one unit-row matrix `to_qkv` (vit-pytorch: three; the same function),
    likewise the MLP's two halves;
  - `num_classes=0` makes `forward` return the pooled embedding (b, dim) (vit-pytorch: an empty (b, 0) tensor);
  - images smaller than `image_size` take the table's top-left sub-grid of positions (vit-pytorch: the first
    rows of the table, another patch's position unless the image is as wide as `image_size`).
"""

import torch
import torch.nn.functional as F
from einops.layers.torch import Rearrange
from einops import rearrange
from torch import nn

from vit_pytorch import vit


def l2norm(t, dim=-1):
    return F.normalize(t, dim=dim)


class NormLinear(nn.Linear):
    """A bias-free Linear whose vectors in the embedding space are unit: with `norm_dim_in` the rows of the
    (dim_out, dim) weight (the input is the embedding), else its columns (the output is). The stored weight is
    normalised in every forward; `renormalise_()` writes the normalised weight back."""

    def __init__(self, dim, dim_out, norm_dim_in=True):
        super().__init__(dim, dim_out, bias=False)
        self.norm_dim = -1 if norm_dim_in else 0
        self.renormalise_()

    def normed_weight(self):
        return F.normalize(self.weight, dim=self.norm_dim)

    @torch.no_grad()
    def renormalise_(self):
        self.weight.copy_(self.normed_weight())

    def forward(self, x):
        return F.linear(x, self.normed_weight())


class Scale(nn.Module):
    """A learned factor of `shape` stored as nGPT stores it: `param` starts at `scale`, and the factor is
    param * init / scale, so it starts at `init` (section 2.6)."""

    def __init__(self, shape, *, init, scale):
        super().__init__()
        self.param = nn.Parameter(torch.full(shape, float(scale)))
        self.factor = init / scale

    def forward(self):
        return self.param * self.factor


class Attention(vit.Attention):
    """nGPT's attention: unit-row projections, queries and keys normalised per head and scaled by s_qk, softmax
    scale sqrt(dim_head) (eq. 15-16), a unit-column output projection; no norm before it."""

    def __init__(self, dim, heads=8, dim_head=64, dropout=0.):
        inner_dim = heads * dim_head
        super().__init__(dim, heads, dim_head, dropout, norm=nn.Identity(), to_qkv=NormLinear(dim, inner_dim * 3),
                         to_out=NormLinear(inner_dim, dim, norm_dim_in=False))
        self.scale = dim_head ** 0.5
        self.s_qk = Scale((heads, 1, dim_head), init=1., scale=dim ** -0.5)

    def qkv(self, x):
        q, k, v = rearrange(self.to_qkv(x), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=self.heads)
        s_qk = self.s_qk()
        return l2norm(q) * s_qk, l2norm(k) * s_qk, v


class FeedForward(nn.Module):
    """nGPT's SwiGLU MLP (eq. 20-21): u * SiLU(v) with u = W_u h * s_u and v = W_v h * s_v * sqrt(dim), then a
    unit-column output projection. Its width is int(hidden_dim * 2 / 3), vit-pytorch's (a GELU MLP's parameter
    count at hidden_dim)."""

    def __init__(self, dim, hidden_dim, dropout=0.):
        super().__init__()
        inner_dim = int(hidden_dim * 2 / 3)
        self.to_hidden_and_gate = NormLinear(dim, inner_dim * 2)
        self.s_u = Scale((inner_dim,), init=1., scale=1.)
        self.s_v = Scale((inner_dim,), init=1., scale=1.)
        self.gate_scale = dim ** 0.5
        self.dropout = nn.Dropout(dropout)
        self.to_out = NormLinear(inner_dim, dim, norm_dim_in=False)

    def forward(self, x):
        u, v = self.to_hidden_and_gate(x).chunk(2, dim=-1)
        hidden = u * self.s_u() * F.silu(v * self.s_v() * self.gate_scale)
        return self.to_out(self.dropout(hidden))


class HypersphereStep(nn.Module):
    """One residual branch of nGPT: h <- Norm(h + alpha (Norm(block(h)) - h)) per token, alpha (dim,) learned
    (eq. 10-11); h (b, n, dim) on the unit sphere in, on the sphere out. `alpha_abs`: the step is |alpha| (the
    official code's)."""

    def __init__(self, block, dim, alpha_init, alpha_abs=False):
        super().__init__()
        self.block = block
        self.alpha = Scale((dim,), init=alpha_init, scale=dim ** -0.5)
        self.alpha_abs = alpha_abs

    def forward(self, h):
        alpha = self.alpha().abs() if self.alpha_abs else self.alpha()
        return l2norm(torch.lerp(h, l2norm(self.block(h)), alpha))     # h + alpha (end - h), fused


class Transformer(vit.Stack):
    """`depth` layers of (attention, MLP) `HypersphereStep`s; no norm: every step ends on the sphere."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0., *, alpha_init, alpha_abs=False):
        super().__init__([
            (HypersphereStep(Attention(dim, heads, dim_head, dropout), dim, alpha_init, alpha_abs),
             HypersphereStep(FeedForward(dim, mlp_dim, dropout), dim, alpha_init, alpha_abs))
            for _ in range(depth)
        ])

    @staticmethod
    def layer(steps, x, **kwargs):
        for step in steps:
            x = step(x)
        return x


class nViT(vit.TokenFace, nn.Module):
    """A ViT of nGPT blocks (vit-pytorch's `normalized_vit.nViT`, its arguments); `residual_lerp_scale_init` is
    alpha's init (None: 1 / depth, "in the order of 1 / n_layers" as the paper says).

    `alpha_abs` (keyword only, ours; default False, as the paper and vit-pytorch): each step size is |alpha|, as
    the official code (NVIDIA/ngpt) takes it, so that a learned alpha below zero still steps towards the branch.
    vit-pytorch's checkpoints are refused for such a model (`load_vit_pytorch` names the option).

    `forward_features` returns the tokens, each on the unit sphere, (b, h * w, dim); the head takes their mean
    to `to_pred` (unit rows) times s_z. `num_classes=0` makes `forward` return that mean (b, dim).
    Call `norm_weights_()` after each optimizer step (vit_pytorch.training does).
    """

    num_prefix_tokens = 0

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, dropout=0., channels=3,
                 dim_head=64, residual_lerp_scale_init=None, alpha_abs=False):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.channels, self.num_classes, self.embed_dim, self.num_features = channels, num_classes, dim, dim
        patch_height, patch_width = self.patch_size

        self.to_patch_embedding = nn.Sequential(
            Rearrange('b c (h p1) (w p2) -> b (h w) (c p1 p2)', p1=patch_height, p2=patch_width),
            NormLinear(channels * patch_height * patch_width, dim, norm_dim_in=False),
        )
        self.abs_pos_emb = NormLinear(dim, self.grid_size[0] * self.grid_size[1])    # its rows: the positions
        alpha_init = 1 / depth if residual_lerp_scale_init is None else residual_lerp_scale_init
        self.alpha_abs = alpha_abs
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout, alpha_init=alpha_init,
                                       alpha_abs=alpha_abs)
        self.build_head(num_classes)

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def forward_features(self, img):
        """Every token on the unit sphere: (b, h * w, dim)."""
        grid = vit.check_images(img, channels=self.channels, patch_size=self.patch_size,
                                max_image_size=self.image_size, dtype=self.abs_pos_emb.weight.dtype)
        positions = vit.top_left_pos_embedding(self.abs_pos_emb.normed_weight(), old_grid=self.grid_size,
                                               new_grid=grid)
        return self.transformer(l2norm(self.to_patch_embedding(img) + positions))

    def forward_head(self, tokens, pre_logits=False):
        """The mean of the tokens (b, dim); the logits z = (to_pred's unit rows . mean) * s_z."""
        x = tokens.mean(dim=1)
        return x if pre_logits or self.num_classes == 0 else self.to_pred(x) * self.s_z()

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def build_head(self, num_classes):
        """`to_pred` (random unit rows) and s_z (at 1) for `num_classes`; none for 0."""
        vit.non_negative_int('num_classes', num_classes)
        self.num_classes = num_classes
        self.to_pred = self.s_z = None
        if num_classes > 0:
            like = self.abs_pos_emb.weight
            self.to_pred = NormLinear(self.embed_dim, num_classes).to(like)
            self.s_z = Scale((num_classes,), init=1., scale=self.embed_dim ** -0.5).to(like)

    def reset_classifier(self, num_classes):
        """A new head for `num_classes` (0: `forward` returns the pooled embedding) whose logits start at zero, as
        the house transfers: random unit rows (a zero row has no direction to normalise) and s_z stored at 0."""
        self.build_head(num_classes)
        if num_classes > 0:
            nn.init.zeros_(self.s_z.param)

    @torch.no_grad()
    def norm_weights_(self):
        """Put every stored weight back on the unit sphere (the paper's step after each optimizer step)."""
        for module in self.modules():
            if isinstance(module, NormLinear):
                module.renormalise_()

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, dropout, channels, dim_head,
                    residual_lerp_scale_init, alpha_abs):
    vit.patch_grid(vit.positive_pair('image_size', image_size), vit.positive_pair('patch_size', patch_size))
    for name, value in dict(dim=dim, depth=depth, heads=heads, channels=channels, dim_head=dim_head).items():
        vit.positive_int(name, value)
    if vit.positive_int('mlp_dim', mlp_dim) < 2:
        raise ValueError(f"mlp_dim must be at least 2 (the SwiGLU's width is int(mlp_dim * 2 / 3)), got {mlp_dim}")
    vit.non_negative_int('num_classes', num_classes)
    vit.probability('dropout', dropout)
    if residual_lerp_scale_init is not None:
        vit.positive_float('residual_lerp_scale_init', residual_lerp_scale_init)
    vit.boolean('alpha_abs', alpha_abs)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's nViT, converted: its parametrized weights (`linear.parametrizations.weight.original`)
    normalised as its forward does, q/k/v and the MLP's halves concatenated, its alpha and logit scale (used
    times sqrt(dim)) and its q_scale k_scale pair (see the module docstring) turned into our stored factors."""
    if model.alpha_abs:
        raise ValueError("vit-pytorch's nViT steps by alpha as it is; this model takes |alpha| (alpha_abs=True, the "
                         "official code's): build it with alpha_abs=False to load the checkpoint")
    dim = model.embed_dim

    def weight(name, norm_dim):
        return ({f'{name}.linear.parametrizations.weight.original': None},
                lambda w: F.normalize(w, dim=norm_dim))

    def concatenated(*names):
        return ({f'{name}.linear.parametrizations.weight.original': None for name in names},
                lambda *ws: torch.cat([F.normalize(w, dim=-1) for w in ws]))

    def factor(name, scale):
        return {name: None}, lambda t: t * dim ** 0.5 / scale.factor

    plan = {
        'to_patch_embedding.1.weight': weight('to_patch_embedding.1', 0),
        'abs_pos_emb.weight': weight('abs_pos_emb', -1),
    }
    for i, (attn_step, ff_step) in enumerate(model.transformer.layers):
        ours, theirs = f'transformer.layers.{i}', f'layers.{i}'
        plan.update({
            f'{ours}.0.block.to_qkv.weight': concatenated(*(f'{theirs}.0.to_{x}' for x in 'qkv')),
            f'{ours}.0.block.s_qk.param': ({f'{theirs}.0.q_scale': None, f'{theirs}.0.k_scale': None},
                                           shared_qk_scale(attn_step.block.s_qk, f'{theirs}.0')),
            f'{ours}.0.block.to_out.weight': weight(f'{theirs}.0.to_out', 0),
            f'{ours}.1.block.to_hidden_and_gate.weight': concatenated(f'{theirs}.1.to_hidden', f'{theirs}.1.to_gate'),
            f'{ours}.1.block.s_u.param': ({f'{theirs}.1.hidden_scale': None}, lambda t: t),
            f'{ours}.1.block.s_v.param': ({f'{theirs}.1.gate_scale': None}, lambda t: t),
            f'{ours}.1.block.to_out.weight': weight(f'{theirs}.1.to_out', 0),
            f'{ours}.0.alpha.param': factor(f'residual_lerp_scales.{i}.0', attn_step.alpha),
            f'{ours}.1.alpha.param': factor(f'residual_lerp_scales.{i}.1', ff_step.alpha),
        })
    if model.num_classes > 0:
        plan['to_pred.weight'] = weight('to_pred', -1)
        plan['s_z.param'] = factor('logit_scale', model.s_z)
    return plan, ('to_pred.', 'logit_scale')


def shared_qk_scale(s_qk, name):
    dim_head = s_qk.param.shape[-1]

    def convert(q_scale, k_scale):
        product = q_scale * k_scale
        if (product <= 0).any():
            raise ValueError(
                f"{name}: q_scale * k_scale is <= 0 in {int((product <= 0).sum())} channel(s); vit-pytorch learns "
                f"two scales where the paper (and this model) has one s_qk on both queries and keys, whose square "
                f"cannot be negative")
        return (product / dim_head ** 0.5).sqrt() / s_qk.factor
    return convert
