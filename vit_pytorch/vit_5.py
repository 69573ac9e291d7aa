"""ViT-5: the plain ViT with the refinements of the mid-2020s.

"ViT-5: Vision Transformers for The Mid-2020s", Wang et al., arXiv 2602.08071: keep the ViT's attention and MLP
blocks and bring the rest up to date: RMSNorm for every norm, the queries and keys RMS-normed per head before their
dot product (QK-norm), LayerScale on both residual branches (starting at 1e-4: `layer_scale_init`), register tokens,
and 2D axial rotary positions (RoPE) on top of the learned absolute table. The cls token is not turned; the
registers are turned by low frequencies of their own, so they keep an order without sitting on the image.

    import torch
    from vit_pytorch.vit_5 import ViT, vit_5

    model = ViT(image_size=256, patch_size=16, num_classes=1000, dim=512, depth=6, heads=8, mlp_dim=1024,
                dim_head=64, dropout=0.1, emb_dropout=0.1, num_registers=4)
    logits = model(torch.randn(2, 3, 256, 256))   # (2, 1000)

    small = vit_5('S')          # the paper's ViT-5-S at 224 pixels: 22,041,064 parameters

Where it differs from vit-pytorch 1.26.14, whose checkpoints load through `load_vit_pytorch` with its outputs (the
same function, other key names): vit-pytorch takes the patch grid as the square root of the token count, so only
square images work; here the rows and columns of any (h, w) grid get their own positions, and an image smaller than
`image_size` the top-left ones (as `vit.ViT`). Its RMSNorm divides by the norm with no epsilon; here torch's
`nn.RMSNorm` (epsilon the dtype's machine epsilon, or `norm_eps`). The tokens start at std 0.02, as in the paper's code.

Where vit-pytorch (and this module, so that its checkpoints load) differs from the official code
(github.com/wangf3014/ViT-5): the patches' frequencies there use theta 10,000 (here 100,000); the 4 registers lie on
a 2 x 2 grid turned by a 2D RoPE of theta 100 (here a sequence 0, 1, 2, 3 over all the head's pairs, theta 100);
the learned absolute table covers the patches only (here the cls token and registers too: a learned vector added to
a learned token, the same functions). `vit_5(variant)` builds the paper's models (`CONFIGS`); their parameter
counts are the official code's plus those (1 + registers) table rows.

`rope_layout='official'` (keyword only, ours) gives the official code's rotary positions instead: theta 10,000 for
the patches, the registers (a square number of them) on their own sqrt x sqrt grid, turned by row and column with
theta 100 as the patches are. With it and `norm_eps=1e-6` (the official RMSNorms' epsilon; here
by default the dtype's machine epsilon) the official code's weights give its outputs (tests/test_vit_5.py) but for
its RMSNorms' float32 arithmetic.
"""

import functools
import math

import torch
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import vit

PATCH_THETA = 100_000       # vit-pytorch's base of the patches' frequencies (the official code: 10,000)
OFFICIAL_PATCH_THETA = 10_000
REGISTER_THETA = 100        # the registers' base (reg_theta of the official code)

# the paper's models, as the official code builds them (vit5_small .. vit5_xlarge): name -> (dim, depth, heads);
# patches of 16, MLP ratio 4, 4 registers, dim_head = dim / heads
CONFIGS = {
    'S': (384, 12, 6),
    'B': (768, 12, 12),
    'L': (1024, 24, 16),
    'XL': (1152, 28, 16),
}


class RMSNorm(nn.RMSNorm):
    """vit-pytorch's `vit_5.RMSNorm(dim)`: x / rms(x) times a gain (its `g`, here nn.RMSNorm's `weight`: ViT-5's
    `load_vit_pytorch` maps one to the other). vit-pytorch's divides with no epsilon (`F.normalize`'s 1e-12 floor
    on the norm); here `eps` (keyword only, ours) is nn.RMSNorm's, None: the dtype's machine epsilon, as every
    RMSNorm of ViT-5 here."""

    def __init__(self, dim, *, eps=None):
        super().__init__(vit.positive_int('dim', dim), eps=eps)


class Attention(vit.RotaryAttention):
    """ViT-5's attention, (b, n, dim) -> (b, n, dim): an RMSNorm before, each head's queries and keys RMS-normed
    (gains shared by the heads), then turned by the rotary `angles` (see `vit.RotaryAttention`); `norm_eps` is the
    RMSNorms' epsilon (None: the dtype's machine epsilon)."""

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., *, norm_eps=None):
        super().__init__(dim, heads, dim_head, dropout, norm=nn.RMSNorm(dim, eps=norm_eps))
        self.q_norm = nn.RMSNorm(dim_head, eps=norm_eps)
        self.k_norm = nn.RMSNorm(dim_head, eps=norm_eps)

    def qkv(self, x):
        q, k, v = super().qkv(x)
        return self.q_norm(q), self.k_norm(k), v


class Transformer(vit.Stack):
    """`depth` layers of (attention, feedforward), each branch LayerScaled from 1e-4, then an RMSNorm (every RMSNorm's
    epsilon `rms_norm_eps`, None: the dtype's machine epsilon);
    `forward(x, angles=...)` hands the rotary angles to every attention. `vit.ViT`'s options of its own blocks
    (LayerNorm epsilon `norm_eps`, qkv bias, GELU approximation, block builders) are not ViT-5's: `_` takes them."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0., *, layer_scale_init=1e-4,
                 rms_norm_eps=None, **_):
        def scaled(block):
            return vit.LayerScale(dim, block, layer_scale_init)
        super().__init__([
            (scaled(Attention(dim, heads, dim_head, dropout, norm_eps=rms_norm_eps)),
             scaled(vit.FeedForward(dim, mlp_dim, dropout, norm=nn.RMSNorm(dim, eps=rms_norm_eps))))
            for _ in range(depth)
        ], norm=nn.RMSNorm(dim, eps=rms_norm_eps))


class ViT(vit.ViT):
    """ViT-5: a cls token, `num_registers` register tokens, then the patches, with learned absolute positions and
    2D rotary ones; the cls token classifies.

    `forward_features` returns all tokens after the final RMSNorm, (b, 1 + num_registers + h * w, dim), and
    `num_classes=0` makes `forward` return them too, as in vit-pytorch; `forward_head(tokens, pre_logits=True)` is
    the cls token. `dim_head` must be divisible by 4 (each of the two axes turns a quarter of its channels' pairs).
    Recorded attention maps: one (b, heads, n, n) map per layer over [cls, registers, patches].

    `layer_scale_init` (keyword only, ours; the official code's `init_scale`): the LayerScales' start, the paper's
    1e-4 by default. `rope_layout` (keyword only, ours): 'vit_pytorch' (the default) or 'official' (the official
    code's frequencies and register grid; see the module's docstring). `norm_eps` (keyword only, ours): the epsilon
    of every RMSNorm (the blocks', the queries' and keys', the final one); None (the default) is torch's, the
    dtype's machine epsilon; the official code's is 1e-6 (vit-pytorch's none).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 dropout=0., emb_dropout=0., num_registers=4, layer_scale_init=1e-4, rope_layout='vit_pytorch',
                 norm_eps=None):
        check_arguments(**vit.arguments(locals()))
        self.extra_tokens = num_registers        # after the cls token, before the patches (read by vit.ViT)
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head, dropout=dropout,
                         emb_dropout=emb_dropout, patch_norm=False,
                         transformer=functools.partial(Transformer, layer_scale_init=layer_scale_init,
                                                       rms_norm_eps=norm_eps))
        if num_registers:
            self.register_tokens = nn.Parameter(torch.zeros(num_registers, dim))
            vit.init_tokens(self.register_tokens, patch_norm=False)
        # a quarter of the pairs per image axis (rows, then columns); vit-pytorch's registers turn all pairs, on one
        # axis, the official code's a quarter per axis of their own square grid
        self.rope_layout = rope_layout
        official = rope_layout == 'official'
        self.patch_rotary = vit.AxialRotaryEmbedding(repeat(
            vit.rope_frequencies(dim_head // 4, OFFICIAL_PATCH_THETA if official else PATCH_THETA),
            'f -> axes f', axes=2))
        self.register_rotary = vit.AxialRotaryEmbedding(
            repeat(vit.rope_frequencies(dim_head // 4, REGISTER_THETA), 'f -> axes f', axes=2) if official
            else vit.rope_frequencies(dim_head // 2, REGISTER_THETA)[None])

    def prefix_tokens(self, batch_size):
        tokens = torch.cat((self.cls_token, self.register_tokens)) if self.extra_tokens else self.cls_token
        return repeat(tokens, 'n d -> b n d', b=batch_size)

    def rotary_angles(self, grid):
        """Each token's rotary angles, (1 + registers + h * w, dim_head / 2): 0 for the cls token (not turned),
        register i at position i of its own axis, the patch in row r, column c at (r, c) of the patch grid."""
        device = self.patch_rotary.frequencies.device
        patches = self.patch_rotary(vit.grid_positions(*grid, device=device))
        if self.rope_layout == 'official':
            side = math.isqrt(self.extra_tokens)
            registers = self.register_rotary(vit.grid_positions(side, side, device=device))
        else:
            registers = self.register_rotary(torch.arange(self.extra_tokens, device=device)[:, None])
        return torch.cat((patches.new_zeros(1, patches.shape[1]), registers, patches))

    def forward_features(self, img):
        """All tokens after the final RMSNorm: (b, 1 + registers + h * w, dim)."""
        x = self.embed(img)
        return self.transformer(x, angles=self.rotary_angles(self.token_grid(img.shape[-2:])))


def vit_5(variant, *, image_size=224, num_classes=1000, **overrides):
    """The paper's ViT-5 `variant` (a key of CONFIGS) at `image_size`; keyword arguments override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, depth, heads = CONFIGS[variant]
    config = dict(image_size=image_size, patch_size=16, num_classes=num_classes, dim=dim, depth=depth, heads=heads,
                  mlp_dim=4 * dim, dim_head=dim // heads, num_registers=4)
    return ViT(**{**config, **overrides})


# argument checks


def check_arguments(*, dim_head, num_registers, layer_scale_init, rope_layout, norm_eps, **_):
    vit.non_negative_int('num_registers', num_registers)
    if rope_layout not in ('vit_pytorch', 'official'):
        raise ValueError(f"rope_layout must be 'vit_pytorch' or 'official', got {rope_layout!r}")
    if rope_layout == 'official' and math.isqrt(num_registers) ** 2 != num_registers:
        raise ValueError(f"num_registers must be a square number with rope_layout='official' (the registers lie on "
                         f"a square grid), got {num_registers}")
    vit.positive_float('layer_scale_init', layer_scale_init)
    if norm_eps is not None:
        vit.positive_float('norm_eps', norm_eps)
    vit.positive_int('dim_head', dim_head)
    if dim_head % 4:
        raise ValueError(f"dim_head must be divisible by 4 (a quarter of each head's channel pairs turns by each "
                         f"image axis), got {dim_head}")


# loading checkpoints

# vit-pytorch's key -> ours (its RMSNorms' gain `g` is nn.RMSNorm's `weight`; its LayerScales are lists beside the
# layers, ours wrap the branches)
VIT_PYTORCH_KEYS = [
    (r'to_patch_embedding\.1\.', 'to_patch_embedding.2.'),
    (r'transformer\.ls1\.(\d+)$', r'transformer.layers.\1.0.scale'),
    (r'transformer\.ls2\.(\d+)$', r'transformer.layers.\1.1.scale'),
    (r'transformer\.layers\.(\d+)\.(\d)\.(.*)\.g$', r'transformer.layers.\1.\2.fn.\3.weight'),
    (r'transformer\.layers\.(\d+)\.(\d)\.', r'transformer.layers.\1.\2.fn.'),
    (r'transformer\.norm\.g$', 'transformer.norm.weight'),
    (r'rotary_emb\.patch_inv_freq$', 'patch_rotary.frequencies'),
    (r'rotary_emb\.reg_inv_freq$', 'register_rotary.frequencies'),
]


def official_plan(model, keys):
    """The official code's `vit_models` (wangf3014/ViT-5, models_vit5.py) -> ViT(rope_layout='official').

    Names differ. Its position table covers the patches only: the cls token's and registers' rows here are zero.
    Every block keeps the rotary frequencies (`attn.rope.freqs`, `attn.rope_reg.freqs`), all equal: they are
    checked equal and become the model's one pair of tables, for both image axes."""
    if model.rope_layout != 'official':
        raise ValueError("the official code's rotary positions are not vit-pytorch's: build the model with "
                         "rope_layout='official' (e.g. vit_5('S', rope_layout='official'))")
    dim, depth, prefix = model.embed_dim, len(model.transformer.layers), model.num_prefix_tokens
    patches = model.grid_size[0] * model.grid_size[1]
    shapes = {key: tuple(tensor.shape) for key, tensor in model.state_dict().items()}
    plan = {
        'cls_token': ({'cls_token': (1, 1, dim)}, _flat),
        'pos_embedding': ({'pos_embed': (1, patches, dim)}, lambda table: torch.cat((table.new_zeros(prefix, dim),
                                                                                      table[0]))),
        'to_patch_embedding.2.weight': ({'patch_embed.proj.weight': (dim, model.channels, *model.patch_size)},
                                        lambda w: rearrange(w, 'd c p1 p2 -> d (p1 p2 c)')),
        'to_patch_embedding.2.bias': ({'patch_embed.proj.bias': (dim,)}, _same),
        'transformer.norm.weight': ({'norm.weight': (dim,)}, _same),
    }
    if model.extra_tokens:
        plan['register_tokens'] = ({'reg_token': (1, model.extra_tokens, dim)}, _flat)
    for ours, theirs in (('patch_rotary', 'rope'), ('register_rotary', 'rope_reg')):
        if model.extra_tokens == 0 and ours == 'register_rotary':
            plan['register_rotary.frequencies'] = ({}, lambda: model.register_rotary.frequencies.clone())
            continue
        sources = {f'blocks.{i}.attn.{theirs}.freqs': (shapes[f'{ours}.frequencies'][1],) for i in range(depth)}
        plan[f'{ours}.frequencies'] = (sources, _one_table)
    for key in ('mlp_head.weight', 'mlp_head.bias'):
        if key in shapes:
            plan[key] = ({key.replace('mlp_head', 'head'): shapes[key]}, _same)
    for i in range(depth):
        for ours, theirs in {'0.scale': 'gamma_1', '0.fn.norm.weight': 'norm1.weight',
                             '0.fn.to_qkv.weight': 'attn.qkv.weight', '0.fn.to_out.0.weight': 'attn.proj.weight',
                             '0.fn.to_out.0.bias': 'attn.proj.bias', '0.fn.q_norm.weight': 'attn.q_norm.weight',
                             '0.fn.k_norm.weight': 'attn.k_norm.weight', '1.scale': 'gamma_2',
                             '1.fn.net.0.weight': 'norm2.weight', '1.fn.net.1.weight': 'mlp.fc1.weight',
                             '1.fn.net.1.bias': 'mlp.fc1.bias', '1.fn.net.4.weight': 'mlp.fc2.weight',
                             '1.fn.net.4.bias': 'mlp.fc2.bias'}.items():
            key = f'transformer.layers.{i}.{ours}'
            plan[key] = ({f'blocks.{i}.{theirs}': shapes[key]}, _same)
    return plan, ('head.',)


def _same(tensor):
    return tensor


def _flat(tokens):
    return tokens[0]


def _one_table(*tables):
    if any(not torch.equal(table, tables[0]) for table in tables):
        raise ValueError("the checkpoint's blocks have different rotary frequencies; the official code gives them one")
    return repeat(tables[0], 'f -> axes f', axes=2)


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `vit_5.ViT`: renamed by VIT_PYTORCH_KEYS; its frequencies, one vector for both image axes
    (and one for the registers), gain the axis dimension of ours."""
    if model.rope_layout != 'vit_pytorch':
        raise ValueError("vit-pytorch's ViT-5 has its own rotary positions: build the model with "
                         "rope_layout='vit_pytorch' (the default)")
    reshaped = {}
    for name in ('patch_rotary', 'register_rotary'):
        axes, count = model.get_submodule(name).frequencies.shape
        reshaped[f'{name}.frequencies'] = ((count,), lambda t, axes=axes: repeat(t, 'f -> axes f', axes=axes))
    plan, unknown = vit.renamed_plan(model, keys, VIT_PYTORCH_KEYS, reshaped)
    if unknown:
        raise ValueError(f"no part of this ViT-5 takes {', '.join(unknown[:5])}: build it with the checkpoint's "
                         f"depth, num_registers and num_classes")
    return plan, ('mlp_head.',)
