"""CrossViT: a two-branch, multi-scale Vision Transformer.

"CrossViT: Cross-Attention Multi-Scale Vision Transformer for Image Classification", Chen, Fan
and Panda, arXiv 2103.14899: run a small-patch and a large-patch ViT side by side, and after
each round of self-attention let each branch's cls token visit the other branch, projected to
its width, as the only query of a cross-attention over the other branch's patch tokens. The
patch tokens are never cross-attended to each other, so the exchange costs linear time; the
prediction is the mean of the two branches' heads.

    import torch
    from vit_pytorch.cross_vit import CrossViT, crossvit_tiny_240

    model = CrossViT(image_size=240, num_classes=1000, sm_dim=96, lg_dim=192,
                     sm_patch_size=12, sm_enc_depth=1, sm_enc_heads=3, sm_enc_mlp_dim=384,
                     lg_patch_size=16, lg_enc_depth=4, lg_enc_heads=3, lg_enc_mlp_dim=768,
                     lg_image_size=224, cross_attn_depth=1, cross_attn_heads=3, depth=3)
    logits = model(torch.randn(2, 3, 240, 240))   # (2, 1000)

    paper_model = crossvit_tiny_240()              # CrossViT-Ti, 7,014,800 parameters

As in the paper the large branch may see the image resized (`lg_image_size`, bicubic), so that
both branches have about as many patches per side (20 at 240 / 12 and 14 at 224 / 16).
"""

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import vit

# classes


class ImageEmbedder(nn.Module):
    """Patch tokens of one branch with a cls token and learned positions: (b, 1 + n, dim).

    Images of another size than `image_size` are first resized to it (bicubic), which is
    how the large branch of the paper sees a 240 image at 224.
    """

    def __init__(self, *, dim, image_size, patch_size, channels=3, dropout=0., patch_norm=True, norm_eps=1e-5):
        super().__init__()
        self.image_size, self.patch_size = image_size, patch_size
        grid = vit.patch_grid(image_size, patch_size)
        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=patch_size, dim=dim,
                                                     patch_norm=patch_norm, norm_eps=norm_eps)
        self.cls_token = nn.Parameter(torch.zeros(1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1 + grid[0] * grid[1], dim))
        vit.init_tokens(self.cls_token, self.pos_embedding, patch_norm=patch_norm)
        self.dropout = nn.Dropout(dropout)

    def forward(self, img):
        if tuple(img.shape[-2:]) != self.image_size:
            img = F.interpolate(img, size=self.image_size, mode='bicubic', align_corners=False)
        x = self.to_patch_embedding(img)
        x = torch.cat((repeat(self.cls_token, 'n d -> b n d', b=x.shape[0]), x), dim=1)
        return self.dropout(x + self.pos_embedding)


class CrossFusion(nn.Module):
    """One branch's cls token visits the other branch (CrossViT eq. 7-8).

    The cls token is projected to the other width (f: LayerNorm, GELU, Linear), updated by
    `depth` residual cross-attention layers over [itself, the other branch's patches], and
    projected back (g); the result replaces the cls token.
    """

    def __init__(self, dim, other_dim, depth, heads, dim_head, dropout=0., *, qkv_bias=False, norm_eps=1e-5):
        super().__init__()
        self.project_in = nn.Sequential(nn.LayerNorm(dim, eps=norm_eps), nn.GELU(), nn.Linear(dim, other_dim))
        # the visiting cls token is the only query of a cross-attention over [itself, the other patches]
        self.layers = nn.ModuleList([
            vit.ClassAttention(other_dim, heads, dim_head, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps)
            for _ in range(depth)
        ])
        self.project_out = nn.Sequential(nn.LayerNorm(other_dim, eps=norm_eps), nn.GELU(),
                                         nn.Linear(other_dim, dim))

    def forward(self, cls_token, other_patches):
        cls_token = self.project_in(cls_token)                          # (b, 1, other_dim)
        for attn in self.layers:
            cls_token = attn(torch.cat((cls_token, other_patches), dim=1)) + cls_token
        return self.project_out(cls_token)                              # (b, 1, dim)


class CrossTransformer(nn.Module):
    """Both cls tokens visit the other branch, from the same (pre-fusion) tokens; patches are kept."""

    def __init__(self, sm_dim, lg_dim, depth, heads, dim_head=None, dropout=0., *, qkv_bias=False, norm_eps=1e-5):
        super().__init__()
        blocks = dict(qkv_bias=qkv_bias, norm_eps=norm_eps)
        self.sm_attend_lg = CrossFusion(sm_dim, lg_dim, depth, heads, dim_head or lg_dim // heads, dropout, **blocks)
        self.lg_attend_sm = CrossFusion(lg_dim, sm_dim, depth, heads, dim_head or sm_dim // heads, dropout, **blocks)

    def forward(self, sm_tokens, lg_tokens):
        (sm_cls, sm_patches), (lg_cls, lg_patches) = (sm_tokens[:, :1], sm_tokens[:, 1:]), \
            (lg_tokens[:, :1], lg_tokens[:, 1:])
        sm_cls, lg_cls = self.sm_attend_lg(sm_cls, lg_patches), self.lg_attend_sm(lg_cls, sm_patches)
        return torch.cat((sm_cls, sm_patches), dim=1), torch.cat((lg_cls, lg_patches), dim=1)


class MultiScaleEncoder(nn.Module):
    """`depth` rounds of: each branch's own encoder, then the cls-token exchange."""

    def __init__(self, *, depth, sm_dim, lg_dim, sm_enc_params, lg_enc_params, cross_attn_heads,
                 cross_attn_depth, cross_attn_dim_head=None, dropout=0., qkv_bias=False, norm_eps=1e-5):
        super().__init__()
        blocks = dict(qkv_bias=qkv_bias, norm_eps=norm_eps)
        self.layers = nn.ModuleList([
            nn.ModuleList([
                # each branch's encoder has no final norm: CrossViT normalises once, after the last block
                vit.Transformer(sm_dim, dropout=dropout, final_norm=False, **sm_enc_params, **blocks),
                vit.Transformer(lg_dim, dropout=dropout, final_norm=False, **lg_enc_params, **blocks),
                CrossTransformer(sm_dim, lg_dim, cross_attn_depth, cross_attn_heads, cross_attn_dim_head, dropout,
                                 **blocks),
            ])
            for _ in range(depth)
        ])

    def forward(self, sm_tokens, lg_tokens):
        for sm_enc, lg_enc, cross_attend in self.layers:
            sm_tokens, lg_tokens = sm_enc(sm_tokens), lg_enc(lg_tokens)
            sm_tokens, lg_tokens = cross_attend(sm_tokens, lg_tokens)
        return sm_tokens, lg_tokens


class CrossViT(vit.TokenFace, nn.Module):
    """CrossViT with vit-pytorch's keyword arguments.

    `forward_features` returns both branches' normed tokens, (sm_tokens, lg_tokens), of shapes
    (b, 1 + n_sm, sm_dim) and (b, 1 + n_lg, lg_dim); `num_classes=0` makes `forward` return them. The logits are the mean of
    the two heads, as in the paper (vit-pytorch sums them).

    Options beyond vit-pytorch's API (the named configurations such as `crossvit_tiny_240`
    set the paper's values):
      cross_attn_dim_head  None: each cross-attention uses its own width / cross_attn_heads (the paper).
      lg_image_size        size the large branch resizes the image to (224 for 240 in the paper);
                           None: image_size.
      patch_norm           LayerNorms around the patch projections (False: the paper).
      qkv_bias             bias on the query/key/value projections (True: the paper).
      norm_eps             epsilon of every LayerNorm (1e-6 in the paper's code).
    """

    num_prefix_tokens = 1

    def __init__(self, *, image_size, num_classes, sm_dim, lg_dim, sm_patch_size=12, sm_enc_depth=1,
                 sm_enc_heads=8, sm_enc_mlp_dim=2048, sm_enc_dim_head=64, lg_patch_size=16, lg_enc_depth=4,
                 lg_enc_heads=8, lg_enc_mlp_dim=2048, lg_enc_dim_head=64, cross_attn_depth=2, cross_attn_heads=8,
                 cross_attn_dim_head=64, depth=3, dropout=0.1, emb_dropout=0.1, channels=3, lg_image_size=None,
                 patch_norm=True, qkv_bias=False, norm_eps=1e-5):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size = vit.pair(image_size)
        lg_image_size = self.image_size if lg_image_size is None else vit.pair(lg_image_size)
        sm_patch_size, lg_patch_size = vit.pair(sm_patch_size), vit.pair(lg_patch_size)
        self.channels = channels
        self.num_classes = num_classes
        self.patch_size = sm_patch_size
        embed = dict(channels=channels, dropout=emb_dropout, patch_norm=patch_norm, norm_eps=norm_eps)
        self.sm_image_embedder = ImageEmbedder(dim=sm_dim, image_size=self.image_size, patch_size=sm_patch_size,
                                               **embed)
        self.lg_image_embedder = ImageEmbedder(dim=lg_dim, image_size=lg_image_size, patch_size=lg_patch_size,
                                               **embed)
        self.multi_scale_encoder = MultiScaleEncoder(
            depth=depth, sm_dim=sm_dim, lg_dim=lg_dim,
            sm_enc_params=dict(depth=sm_enc_depth, heads=sm_enc_heads, mlp_dim=sm_enc_mlp_dim,
                               dim_head=sm_enc_dim_head),
            lg_enc_params=dict(depth=lg_enc_depth, heads=lg_enc_heads, mlp_dim=lg_enc_mlp_dim,
                               dim_head=lg_enc_dim_head),
            cross_attn_heads=cross_attn_heads, cross_attn_depth=cross_attn_depth,
            cross_attn_dim_head=cross_attn_dim_head, dropout=dropout, qkv_bias=qkv_bias, norm_eps=norm_eps,
        )
        self.sm_norm = nn.LayerNorm(sm_dim, eps=norm_eps)
        self.lg_norm = nn.LayerNorm(lg_dim, eps=norm_eps)
        self.num_features = sm_dim + lg_dim
        self.sm_mlp_head = nn.Linear(sm_dim, num_classes) if num_classes > 0 else None
        self.lg_mlp_head = nn.Linear(lg_dim, num_classes) if num_classes > 0 else None

    def forward_features(self, img):
        """Both branches' tokens after the final norms: ((b, 1 + n_sm, sm_dim), (b, 1 + n_lg, lg_dim))."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.sm_norm.weight.dtype)
        sm_tokens, lg_tokens = self.multi_scale_encoder(self.sm_image_embedder(img), self.lg_image_embedder(img))
        return self.sm_norm(sm_tokens), self.lg_norm(lg_tokens)

    def forward_head(self, tokens, pre_logits=False):
        """The mean of both heads' logits; `pre_logits`: both cls tokens, (b, sm_dim + lg_dim)."""
        sm_cls, lg_cls = tokens[0][:, 0], tokens[1][:, 0]
        if pre_logits or self.sm_mlp_head is None:
            return torch.cat((sm_cls, lg_cls), dim=-1)
        return (self.sm_mlp_head(sm_cls) + self.lg_mlp_head(lg_cls)) / 2

    def forward(self, img):
        tokens = self.forward_features(img)
        return tokens if self.sm_mlp_head is None else self.forward_head(tokens)

    @property
    def feature_info(self):
        """One entry a round of the multi-scale encoder: the small branch's tokens after the round's cls exchange."""
        return [dict(num_chs=self.sm_norm.normalized_shape[0], reduction=self.patch_size,
                     module=f'multi_scale_encoder.layers.{i}.2') for i in range(len(self.multi_scale_encoder.layers))]

    def forward_intermediates(self, img, indices=None):
        """Each chosen round's small-branch tokens (b, 1 + n_sm, sm_dim), before the final norm: indices None for
        every round, an int n for the last n, or a list of round numbers."""
        chosen = vit.take_indices(indices, len(self.multi_scale_encoder.layers), what='block')
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.sm_norm.weight.dtype)
        sm_tokens, lg_tokens, rounds = self.sm_image_embedder(img), self.lg_image_embedder(img), []
        for sm_enc, lg_enc, cross_attend in self.multi_scale_encoder.layers[:max(chosen) + 1]:
            sm_tokens, lg_tokens = cross_attend(sm_enc(sm_tokens), lg_enc(lg_tokens))
            rounds.append(sm_tokens)
        return [rounds[i] for i in chosen]

    def token_grid(self, image_size):
        """The small branch's (h, w) grid of patch tokens for images of `image_size` (the model's own size)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def reset_classifier(self, num_classes):
        """New zero-initialised heads on both branches for `num_classes` (0 removes them)."""
        vit.non_negative_int('num_classes', num_classes)
        self.num_classes = num_classes
        like = self.sm_norm.weight
        self.sm_mlp_head, self.lg_mlp_head = (
            (vit.zero_linear(self.sm_norm.normalized_shape[0], num_classes, like=like),
             vit.zero_linear(self.lg_norm.normalized_shape[0], num_classes, like=like))
            if num_classes > 0 else (None, None))

    def set_grad_checkpointing(self, enable=True):
        for sm_enc, lg_enc, _ in self.multi_scale_encoder.layers:
            sm_enc.grad_checkpointing = lg_enc.grad_checkpointing = enable


# the paper's models (Table 1): name -> (sm_dim, lg_dim, large-branch depth, heads, MLP ratio); all
# with small patch 12 at 240, large patch 16 at 224, one small-branch layer, one cross-attention
# layer, three multi-scale blocks
CONFIGS = {
    'tiny': (96, 192, 4, 3, 4),
    'small': (192, 384, 4, 6, 4),
    'base': (384, 768, 4, 12, 4),
    '9': (128, 256, 3, 4, 3),
    '15': (192, 384, 5, 6, 3),
    '18': (224, 448, 6, 7, 3),
}


def crossvit(variant, *, num_classes=1000, **overrides):
    """The paper's CrossViT `variant` (a key of CONFIGS) at 240; keyword arguments override the table."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    sm_dim, lg_dim, lg_depth, heads, mlp_ratio = CONFIGS[variant]
    kwargs = dict(image_size=240, num_classes=num_classes, sm_dim=sm_dim, lg_dim=lg_dim,
                  sm_patch_size=12, sm_enc_depth=1, sm_enc_heads=heads, sm_enc_mlp_dim=mlp_ratio * sm_dim,
                  sm_enc_dim_head=sm_dim // heads, lg_patch_size=16, lg_enc_depth=lg_depth, lg_enc_heads=heads,
                  lg_enc_mlp_dim=mlp_ratio * lg_dim, lg_enc_dim_head=lg_dim // heads, cross_attn_depth=1,
                  cross_attn_heads=heads, cross_attn_dim_head=None, depth=3, dropout=0., emb_dropout=0.,
                  lg_image_size=224, patch_norm=False, qkv_bias=True, norm_eps=1e-6)
    return CrossViT(**{**kwargs, **overrides})


def crossvit_tiny_240(**kwargs):
    return crossvit('tiny', **kwargs)


def crossvit_small_240(**kwargs):
    return crossvit('small', **kwargs)


def crossvit_base_240(**kwargs):
    return crossvit('base', **kwargs)


def crossvit_9_240(**kwargs):
    return crossvit('9', **kwargs)


def crossvit_15_240(**kwargs):
    return crossvit('15', **kwargs)


def crossvit_18_240(**kwargs):
    return crossvit('18', **kwargs)


# argument checks


def check_arguments(*, image_size, num_classes, sm_dim, lg_dim, sm_patch_size, sm_enc_depth, sm_enc_heads,
                    sm_enc_mlp_dim, sm_enc_dim_head, lg_patch_size, lg_enc_depth, lg_enc_heads, lg_enc_mlp_dim,
                    lg_enc_dim_head, cross_attn_depth, cross_attn_heads, cross_attn_dim_head, depth, dropout,
                    emb_dropout, channels, lg_image_size, patch_norm, qkv_bias, norm_eps):
    image_size = vit.positive_pair('image_size', image_size)
    lg_image_size = image_size if lg_image_size is None else vit.positive_pair('lg_image_size', lg_image_size)
    sm_patch_size = vit.positive_pair('sm_patch_size', sm_patch_size)
    lg_patch_size = vit.positive_pair('lg_patch_size', lg_patch_size)
    for name, size, patch_name, patch in (('image_size', image_size, 'sm_patch_size', sm_patch_size),
                                          ('lg_image_size', lg_image_size, 'lg_patch_size', lg_patch_size)):
        if size[0] % patch[0] or size[1] % patch[1]:
            raise ValueError(f"{name} {size} must be divisible by {patch_name} {patch} in both height and width "
                             f"(change either)")
    for name, value in dict(sm_dim=sm_dim, lg_dim=lg_dim, sm_enc_depth=sm_enc_depth, sm_enc_heads=sm_enc_heads,
                            sm_enc_mlp_dim=sm_enc_mlp_dim, sm_enc_dim_head=sm_enc_dim_head,
                            lg_enc_depth=lg_enc_depth, lg_enc_heads=lg_enc_heads, lg_enc_mlp_dim=lg_enc_mlp_dim,
                            lg_enc_dim_head=lg_enc_dim_head, cross_attn_depth=cross_attn_depth,
                            cross_attn_heads=cross_attn_heads, depth=depth, channels=channels).items():
        vit.positive_int(name, value)
    if cross_attn_dim_head is None:
        for name, width in (('sm_dim', sm_dim), ('lg_dim', lg_dim)):
            if width % cross_attn_heads:
                raise ValueError(f"{name}={width} must be divisible by cross_attn_heads={cross_attn_heads} "
                                 f"when cross_attn_dim_head is None")
    else:
        vit.positive_int('cross_attn_dim_head', cross_attn_dim_head)
    vit.non_negative_int('num_classes', num_classes)
    vit.probability('dropout', dropout)
    vit.probability('emb_dropout', emb_dropout)
    vit.positive_float('norm_eps', norm_eps)
    for name, value in dict(patch_norm=patch_norm, qkv_bias=qkv_bias).items():
        vit.boolean(name, value)


# loading checkpoints


def timm_plan(model, keys):
    """timm's `CrossVit` (the `crossvit_*` models, not the `*_dagger_*` ones with convolutional stems)
    -> CrossViT with plain patch projections (`patch_norm=False`).

    timm numbers the branches (0 small, 1 large) where ours names them; its patch projections are
    convolutions (Linears over (p1 p2 c) here), its cross-attention keeps k and v apart (one
    `to_kv` here), and tokens and position tables carry a leading batch axis.
    """
    state = model.state_dict()
    first = 'multi_scale_encoder.layers.0.0.layers.0.0.to_qkv.bias'
    if 'sm_image_embedder.to_patch_embedding.1.weight' in state:
        raise ValueError("timm's CrossViT projects patches without LayerNorms: build the model with patch_norm=False")
    if ('blocks.0.blocks.0.0.attn.qkv.bias' in keys) != (first in state):
        has = 'blocks.0.blocks.0.0.attn.qkv.bias' in keys
        raise ValueError(f"build the model with qkv_bias={has} (the checkpoint's attention "
                         f"{'has' if has else 'has no'} qkv bias)")
    # timm keeps a lone cross-attention layer per branch unnumbered (fusion.b.), several numbered (fusion.b.j.)
    single = 'blocks.0.fusion.0.norm1.weight' in keys
    plan, names = {}, {}
    for index, branch in enumerate(('sm', 'lg')):
        embedder = getattr(model, f'{branch}_image_embedder')
        dim = state[f'{branch}_image_embedder.cls_token'].shape[-1]
        (patch_height, patch_width), size = embedder.patch_size, embedder.image_size
        grid = (size[0] // patch_height, size[1] // patch_width)
        plan.update({
            f'{branch}_image_embedder.to_patch_embedding.2.weight': (
                {f'patch_embed.{index}.proj.weight': (dim, model.channels, patch_height, patch_width)},
                lambda w: rearrange(w, 'd c p1 p2 -> d (p1 p2 c)')),
            f'{branch}_image_embedder.cls_token': ({f'cls_token_{index}': (1, 1, dim)}, lambda t: t[0]),
            f'{branch}_image_embedder.pos_embedding': ({f'pos_embed_{index}': None},
                                                       dict(num_prefix_tokens=1, grid=grid)),
        })
        names.update({f'{branch}_image_embedder.to_patch_embedding.2.': f'patch_embed.{index}.proj.',
                      f'{branch}_norm.': f'norm.{index}.', f'{branch}_mlp_head.': f'head.{index}.'})
    for k, (sm_enc, lg_enc, cross) in enumerate(model.multi_scale_encoder.layers):
        ours, block = f'multi_scale_encoder.layers.{k}.', f'blocks.{k}.'
        for index, encoder in enumerate((sm_enc, lg_enc)):
            for i in range(len(encoder.layers)):
                layer, theirs = ours + f'{index}.layers.{i}.', block + f'blocks.{index}.{i}.'
                names.update({layer + '0.norm.': theirs + 'norm1.', layer + '0.to_qkv.': theirs + 'attn.qkv.',
                              layer + '0.to_out.0.': theirs + 'attn.proj.', layer + '1.net.0.': theirs + 'norm2.',
                              layer + '1.net.1.': theirs + 'mlp.fc1.', layer + '1.net.4.': theirs + 'mlp.fc2.'})
        for index, fusion in enumerate(('sm_attend_lg', 'lg_attend_sm')):
            layers = getattr(cross, fusion).layers
            if single and len(layers) != 1:
                raise ValueError(f"the checkpoint has one cross-attention layer per branch: build the model with "
                                 f"cross_attn_depth=1, not {len(layers)}")
            names.update({ours + f'2.{fusion}.project_in.': block + f'projs.{index}.',
                          ours + f'2.{fusion}.project_out.': block + f'revert_projs.{index}.'})
            for j in range(len(layers)):
                layer = ours + f'2.{fusion}.layers.{j}.'
                theirs = block + (f'fusion.{index}.' if single else f'fusion.{index}.{j}.')
                names.update({layer + 'norm.': theirs + 'norm1.', layer + 'to_q.': theirs + 'attn.wq.',
                              layer + 'to_out.0.': theirs + 'attn.proj.'})
                for kind in ('weight', 'bias'):   # timm's separate k and v are our to_kv
                    key = layer + f'to_kv.{kind}'
                    if key in state:
                        plan[key] = vit.joined_kv_plan(state[key], theirs + f'attn.wk.{kind}',
                                                       theirs + f'attn.wv.{kind}')
    vit.prefixed_plan(state, names, "timm's CrossViT", plan)
    return plan, ('head.',)


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's CrossViT computes another function: it normalises each branch at the end of every "
        "encoder (CrossViT: once, after the last block), projects the visiting cls token with a single Linear "
        "(CrossViT: LayerNorm, GELU, Linear), leaves the other branch's patch tokens un-normalised as keys and "
        "values, and sums the two heads (ours averages them, as the paper does)")
