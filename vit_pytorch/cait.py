"""CaiT: Class-Attention in Image Transformers.

"Going deeper with Image Transformers", Touvron et al., arXiv 2103.17239: make deep ViTs
trainable with LayerScale (each residual branch is multiplied by a learned per-channel
factor that starts near zero) and talking-heads attention, and let the patch tokens attend
only among themselves; a cls token then reads them in two class-attention layers, where
only the cls token is updated.

    import torch
    from vit_pytorch.cait import CaiT, cait_xxs24_224

    model = CaiT(image_size=224, patch_size=16, num_classes=1000, dim=192, depth=24,
                 cls_depth=2, heads=4, mlp_dim=768, dim_head=48, layer_dropout=0.05)
    logits = model(torch.randn(2, 3, 224, 224))   # (2, 1000)

    paper_model = cait_xxs24_224()                 # CaiT-XXS24, 11,956,264 parameters

`layer_dropout` is the paper's stochastic depth: each residual branch is dropped per sample
with that probability while training (and the kept ones rescaled).
"""

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import vit

# helpers


def layer_scale_init_for(depth):
    """The paper's LayerScale initialisation for a network of `depth` layers (section 2.1)."""
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


# classes


class TalkingHeadsAttention(vit.Attention):
    """Pre-norm self-attention whose heads exchange information before and after the softmax.

    Talking heads (Shazeer et al., arXiv 2003.02436): the (b, heads, n, n) logits are mixed
    across heads by a learned heads x heads linear map, softmaxed, and mixed again. Mixing
    the maps needs them explicitly, so there is no fused path; `fused` exists only so that
    one recorder works for every model. `attention_probs` sees the softmax output, before
    the second mixing.
    """

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., *, qkv_bias=False, norm_eps=1e-5):
        super().__init__(dim, heads, dim_head, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps,
                         to_out=nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(dropout)))
        self.fused = False
        self.mix_heads_pre_attn = nn.Linear(heads, heads)
        self.mix_heads_post_attn = nn.Linear(heads, heads)

    @staticmethod
    def mix_heads(attn, linear):
        # one (heads x heads) @ (heads x n n) product per image with the bias added in it (baddbmm): the result is
        # contiguous (b, g, i, j), so the softmax after it runs on rows. The einsum gave a permuted result at
        # batch 8 (its bias add and softmax strided) and timm's heads-last linear copies the logits first; mixing
        # and softmax of (8, 4, 196, 196) logits, one thread: 1.5 ms against 5.0 (einsum) and 4.6 (linear) (issue 29)
        b, heads, i, j = attn.shape
        mixed = torch.baddbmm(linear.bias.view(1, heads, 1).expand(b, heads, i * j),
                              linear.weight.expand(b, heads, heads), attn.reshape(b, heads, i * j))
        return mixed.view(b, heads, i, j)

    def forward(self, x):
        q, k, v = self.qkv(x)
        # q (n x dim_head) is scaled rather than the logits (n x n): 4x fewer multiplications at 196 tokens of 48.
        # One name, rebound: the mixed logits are freed before the second mixing allocates (one (b, heads, n, n)
        # block less held, fewer fresh pages faulted in)
        attn = self.mix_heads((q * self.scale) @ k.transpose(-1, -2), self.mix_heads_pre_attn)
        attn = self.attention_probs(attn.softmax(dim=-1))
        attn = F.dropout(self.mix_heads(attn, self.mix_heads_post_attn), self.dropout, self.training)
        return self.to_out(rearrange(attn @ v, 'b h n d -> b n (h d)'))


class ClassTransformer(nn.Module):
    """The class-attention stage: updates the cls token from fixed patch tokens (CaiT eq. 1).

    One LayerNorm normalises [cls, patches] for both the query and the keys/values.
    """

    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleList(layer) for layer in layers)

    def forward(self, cls_tokens, *, context):
        for attn, ff in self.layers:
            cls_tokens = attn(torch.cat((cls_tokens, context), dim=1)) + cls_tokens
            cls_tokens = ff(cls_tokens) + cls_tokens
        return cls_tokens


class CaiT(vit.TokenFace, nn.Module):
    """CaiT with vit-pytorch's keyword arguments.

    `depth` self-attention layers over the patch tokens, then `cls_depth` class-attention
    layers. `num_classes=0` makes `forward` return the normed tokens (b, 1 + n, dim), cls first.

    Options beyond vit-pytorch's API (defaults keep its model; the named configurations such
    as `cait_xxs24_224` set the paper's):
      channels          input channels.
      layer_scale_init  initial LayerScale value; None: the paper's rule from `depth`
                        (0.1 up to 18 layers, 1e-5 up to 24, 1e-6 beyond).
      patch_norm        LayerNorms around the patch projection (False: the paper).
      qkv_bias          bias on the query/key/value projections (True: the paper).
      norm_eps          epsilon of every LayerNorm (1e-6 in the paper's code).

    `forward_features` returns [cls, patch tokens] after both stages and the final norm, (b, 1 + h * w, dim).
    """

    intermediates_from = 'patch_transformer'

    num_prefix_tokens = 1

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, cls_depth, heads, mlp_dim,
                 dim_head=64, dropout=0., emb_dropout=0., layer_dropout=0., channels=3,
                 layer_scale_init=None, patch_norm=True, qkv_bias=False, norm_eps=1e-5):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.channels, self.num_classes = channels, num_classes
        if layer_scale_init is None:
            layer_scale_init = layer_scale_init_for(depth)

        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim,
                                                     patch_norm=patch_norm, norm_eps=norm_eps)
        # positions for the patches only: the cls token joins after the self-attention stage
        self.pos_embedding = nn.Parameter(torch.zeros(self.grid_size[0] * self.grid_size[1], dim))
        self.cls_token = nn.Parameter(torch.zeros(1, dim))
        vit.init_tokens(self.pos_embedding, self.cls_token, patch_norm=patch_norm)
        self.dropout = nn.Dropout(emb_dropout)

        def scaled(block):
            return vit.LayerScale(dim, block, layer_scale_init, layer_dropout)

        def feedforward():
            return scaled(vit.FeedForward(dim, mlp_dim, dropout, norm_eps=norm_eps))

        attention = dict(dim=dim, heads=heads, dim_head=dim_head, dropout=dropout, qkv_bias=qkv_bias,
                         norm_eps=norm_eps)
        # the self-attention stage has no final norm: CaiT normalises once, after the class attention
        self.patch_transformer = vit.Stack(
            [(scaled(TalkingHeadsAttention(**attention)), feedforward()) for _ in range(depth)])
        self.cls_transformer = ClassTransformer(
            [(scaled(vit.ClassAttention(**attention)), feedforward()) for _ in range(cls_depth)])

        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.num_features = dim
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else None

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def forward_features(self, img):
        """[cls, patch tokens] after both stages and the final norm: (b, 1 + h * w, dim)."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.pos_embedding.dtype)
        x = self.dropout(self.to_patch_embedding(img) + self.pos_embedding)
        x = self.patch_transformer(x)                                   # (b, h * w, dim)
        cls_tokens = repeat(self.cls_token, 'n d -> b n d', b=x.shape[0])
        cls_tokens = self.cls_transformer(cls_tokens, context=x)        # (b, 1, dim)
        return self.norm(torch.cat((cls_tokens, x), dim=1))

    def forward_head(self, tokens, pre_logits=False):
        x = tokens[:, 0]
        if pre_logits or self.mlp_head is None:
            return x
        return self.mlp_head(x)

    def forward(self, img):
        tokens = self.forward_features(img)
        return tokens if self.mlp_head is None else self.forward_head(tokens)

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.cls_token)

    def set_grad_checkpointing(self, enable=True):
        self.patch_transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, cls_depth, heads, mlp_dim, dim_head,
                    dropout, emb_dropout, layer_dropout, channels, layer_scale_init, patch_norm, qkv_bias, norm_eps):
    vit.check_patches(image_size, patch_size)
    for name, value in dict(dim=dim, depth=depth, cls_depth=cls_depth, heads=heads, mlp_dim=mlp_dim,
                            dim_head=dim_head, channels=channels).items():
        vit.positive_int(name, value)
    vit.non_negative_int('num_classes', num_classes)
    for name, value in dict(dropout=dropout, emb_dropout=emb_dropout, layer_dropout=layer_dropout).items():
        vit.probability(name, value)
    if layer_scale_init is not None:        # None: the paper's rule from depth
        vit.positive_float('layer_scale_init', layer_scale_init)
    vit.positive_float('norm_eps', norm_eps)
    for name, value in dict(patch_norm=patch_norm, qkv_bias=qkv_bias).items():
        vit.boolean(name, value)


# the paper's models (Table 3): name -> (dim, depth, heads, LayerScale init), all with patch 16,
# MLP ratio 4, two class-attention layers; inits as in the released weights
CONFIGS = {
    'xxs24': (192, 24, 4, 1e-5),
    'xxs36': (192, 36, 4, 1e-5),
    'xs24': (288, 24, 6, 1e-5),
    's24': (384, 24, 8, 1e-5),
    's36': (384, 36, 8, 1e-6),
    'm36': (768, 36, 16, 1e-6),
    'm48': (768, 48, 16, 1e-6),
}


def cait(variant, *, image_size=224, num_classes=1000, **overrides):
    """The paper's CaiT `variant` (a key of CONFIGS); keyword arguments override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, depth, heads, init = CONFIGS[variant]
    kwargs = dict(image_size=image_size, patch_size=16, num_classes=num_classes, dim=dim, depth=depth,
                  cls_depth=2, heads=heads, mlp_dim=4 * dim, dim_head=dim // heads, layer_scale_init=init,
                  patch_norm=False, qkv_bias=True, norm_eps=1e-6)
    return CaiT(**{**kwargs, **overrides})


def cait_xxs24_224(**kwargs):
    return cait('xxs24', **kwargs)


def cait_xxs36_224(**kwargs):
    return cait('xxs36', **kwargs)


def cait_xs24_384(**kwargs):
    return cait('xs24', **{'image_size': 384, **kwargs})


def cait_s24_224(**kwargs):
    return cait('s24', **kwargs)


def cait_s36_384(**kwargs):
    return cait('s36', **{'image_size': 384, **kwargs})


def cait_m36_384(**kwargs):
    return cait('m36', **{'image_size': 384, **kwargs})


def cait_m48_448(**kwargs):
    return cait('m48', **{'image_size': 448, **kwargs})


# loading checkpoints


def timm_plan(model, keys):
    """timm's `Cait` (the `cait_*` models) -> CaiT with a plain patch projection (`patch_norm=False`).

    Names differ, values do not, except: the patch projection is a convolution (a Linear over
    (p1 p2 c) here), the class attention keeps k and v apart (one `to_kv` here), and the tokens
    and positions carry a leading batch axis.
    """
    state = model.state_dict()
    if 'to_patch_embedding.1.weight' in state:
        raise ValueError("timm's CaiT projects patches without LayerNorms: build the model with patch_norm=False")
    if ('blocks.0.attn.qkv.bias' in keys) != ('patch_transformer.layers.0.0.fn.to_qkv.bias' in state):
        has = 'blocks.0.attn.qkv.bias' in keys
        raise ValueError(f"build the model with qkv_bias={has} (the checkpoint's attention "
                         f"{'has' if has else 'has no'} qkv bias)")
    dim = state['cls_token'].shape[-1]
    plan = {
        'to_patch_embedding.2.weight': ({'patch_embed.proj.weight': (dim, model.channels, *model.patch_size)},
                                        lambda w: rearrange(w, 'd c p1 p2 -> d (p1 p2 c)')),
        'cls_token': ({'cls_token': (1, 1, dim)}, lambda t: t[0]),
        'pos_embedding': ({'pos_embed': None}, dict(num_prefix_tokens=0, grid=model.grid_size)),
    }
    names = {'to_patch_embedding.2.': 'patch_embed.proj.', 'norm.': 'norm.', 'mlp_head.': 'head.'}
    for stage, theirs in (('patch_transformer', 'blocks'), ('cls_transformer', 'blocks_token_only')):
        for i in range(len(getattr(model, stage).layers)):
            ours, block = f'{stage}.layers.{i}.', f'{theirs}.{i}.'
            names.update({
                ours + '0.scale': block + 'gamma_1', ours + '0.fn.norm.': block + 'norm1.',
                ours + '0.fn.to_qkv.': block + 'attn.qkv.', ours + '0.fn.to_q.': block + 'attn.q.',
                ours + '0.fn.to_out.0.': block + 'attn.proj.',
                ours + '0.fn.mix_heads_pre_attn.': block + 'attn.proj_l.',
                ours + '0.fn.mix_heads_post_attn.': block + 'attn.proj_w.',
                ours + '1.scale': block + 'gamma_2', ours + '1.fn.net.0.': block + 'norm2.',
                ours + '1.fn.net.1.': block + 'mlp.fc1.', ours + '1.fn.net.4.': block + 'mlp.fc2.',
            })
            for kind in ('weight', 'bias'):   # class attention: timm's separate k and v are our to_kv
                key = ours + f'0.fn.to_kv.{kind}'
                if key in state:
                    plan[key] = vit.joined_kv_plan(state[key], block + f'attn.k.{kind}', block + f'attn.v.{kind}')
    vit.prefixed_plan(state, names, "timm's CaiT", plan)
    return plan, ('head.',)


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's CaiT computes another function: its class-attention layers mix the heads (talking "
        "heads, as its self-attention does) and take the patch tokens as keys and values without a LayerNorm, "
        "where CaiT's class attention (and ours) normalises [cls, patches] and does not mix heads")
