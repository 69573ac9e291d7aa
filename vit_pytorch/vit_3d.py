"""3D ViT: the Vision Transformer on videos and volumes.

A video (or a volume such as a CT scan) of shape (b, c, frames, h, w) is cut into tubelets of
`frame_patch_size` x `image_patch_size` voxels, each embedded linearly, and the sequence of all
tubelets, with a learned position embedding and a cls token, goes through the plain ViT encoder:
attention is joint over space and time. This is "Model 1" (spatio-temporal attention) of ViViT,
"ViViT: A Video Vision Transformer", Arnab et al., arXiv 2103.15691, with its tubelet embedding
(section 3.2), and the model of Hugging Face's `VivitForVideoClassification`, whose checkpoints
load through `vit_pytorch.pretrained.load_hf` (build with `patch_norm=False, qkv_bias=True,
norm_eps=1e-6, gelu_approximate='tanh'`, as `vivit_b_16x2_kinetics400` does). The factorised
ViViT models are `vit_pytorch.vivit.ViViT`.

    import torch
    from vit_pytorch.vit_3d import ViT

    model = ViT(image_size=128, image_patch_size=16, frames=16, frame_patch_size=2,
                num_classes=1000, dim=1024, depth=6, heads=8, mlp_dim=2048)
    logits = model(torch.randn(4, 3, 16, 128, 128))   # (4, 1000)

The arguments are vit-pytorch's (`vit_pytorch.vit_3d.ViT`), whose pool='cls' checkpoints load
through `load_vit_pytorch` (its head LayerNorm is our final norm: the same function on the cls
token). Known differences from vit-pytorch: with pool='mean' there is no cls token and the mean is
over the normed patch tokens (vit-pytorch keeps a cls token, averages over it too, then norms:
those checkpoints are refused); a video must have the model's size (vit-pytorch slices its
position table for shorter inputs, which misplaces positions); the position table and cls token
start at the patch tokens' scale (`vit.init_tokens`).

Tubelets are flattened as (pf p1 p2 c), tokens ordered (frames, rows, columns); `token_grid` gives
that grid. The recorder's maps are (b, heads, 1 + f * h * w, same).
"""

import math

import torch
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import vit
from vit_pytorch.vit import TubeletEmbedding, check_geometry, tubelet_grid  # noqa: F401  (their old home)


class ViT(vit.TokenFace, nn.Module):
    """ViT over tubelets; `num_classes=0` makes `forward` return all tokens after the final norm.

    Options beyond vit-pytorch's API (defaults keep its model), as for the core `vit.ViT`:
      patch_norm        LayerNorms around the tubelet projection (False: the paper, Hugging Face).
      qkv_bias          bias on the query/key/value projection (True: the paper, Hugging Face).
      norm_eps          epsilon of every LayerNorm (1e-6: the paper, Hugging Face).
      gelu_approximate  'none' (exact GELU) or 'tanh' (Hugging Face's `gelu_fast`, the JAX code).

    `forward_features` returns all tokens after the final norm, (b, prefix + f * h * w, dim).
    """

    def __init__(self, *, image_size, image_patch_size, frames, frame_patch_size, num_classes, dim, depth, heads,
                 mlp_dim, pool='cls', channels=3, dim_head=64, dropout=0., emb_dropout=0.,
                 patch_norm=True, qkv_bias=False, norm_eps=1e-5, gelu_approximate='none'):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(image_patch_size)
        self.frames, self.frame_patch_size = frames, frame_patch_size
        self.grid_size = self.token_grid((frames, *self.image_size))
        self.pool, self.channels, self.num_classes = pool, channels, num_classes
        self.num_prefix_tokens = 1 if pool == 'cls' else 0

        self.to_patch_embedding = vit.TubeletEmbedding(channels=channels, patch_size=self.patch_size,
                                                       frame_patch_size=frame_patch_size, dim=dim,
                                                       patch_norm=patch_norm, norm_eps=norm_eps)
        self.cls_token = nn.Parameter(torch.zeros(1, dim)) if pool == 'cls' else None
        self.pos_embedding = nn.Parameter(torch.zeros(self.num_prefix_tokens + math.prod(self.grid_size), dim))
        vit.init_tokens(self.pos_embedding, *([self.cls_token] if pool == 'cls' else []), patch_norm=patch_norm)
        self.dropout = nn.Dropout(emb_dropout)
        self.transformer = vit.Transformer(dim, depth, heads, dim_head, mlp_dim, dropout, qkv_bias=qkv_bias,
                                       norm_eps=norm_eps, gelu_approximate=gelu_approximate)
        self.num_features = dim
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else None

    def token_grid(self, size):
        """The (frames, h, w) grid of tubelet tokens for videos of `size` (frames, h, w); for an (h, w)
        pair (what the recorder passes) the (h, w) grid of one frame's tokens."""
        return vit.tubelet_grid(size, patch_size=self.patch_size, frame_patch_size=self.frame_patch_size)

    def patch_tokens(self, video):
        """The checked video's tubelet tokens, before positions: (b, f * h * w, dim)."""
        vit.check_video(video, channels=self.channels, frames=self.frames, image_size=self.image_size,
                        dtype=self.pos_embedding.dtype)
        return self.to_patch_embedding(video)

    def embed(self, video):
        """cls token and tubelet tokens with their position embeddings: (b, prefix + f * h * w, dim)."""
        x = self.patch_tokens(video)
        if self.cls_token is not None:
            x = torch.cat((repeat(self.cls_token, 'n d -> b n d', b=x.shape[0]), x), dim=1)
        return self.dropout(x + self.pos_embedding)

    def forward_features(self, video):
        """All tokens after the final norm: (b, prefix + f * h * w, dim)."""
        return self.transformer(self.embed(video))

    def forward_head(self, tokens, pre_logits=False):
        """The cls token (or the mean of the tubelet tokens), then the head."""
        x = tokens.mean(dim=1) if self.pool == 'mean' else tokens[:, 0]
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, video):
        tokens = self.forward_features(video)
        return tokens if self.mlp_head is None else self.forward_head(tokens)

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.pos_embedding)

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# ViViT's Model 1 as Google released it (google/vivit-b-16x2-kinetics400, Hugging Face's VivitConfig()):
# name -> (dim, depth, heads, mlp_dim, image_patch_size, frame_patch_size)
CONFIGS = {
    'vivit_b_16x2': (768, 12, 12, 3072, 16, 2),
}


def vivit_b_16x2_kinetics400(*, image_size=224, frames=32, num_classes=400, **overrides):
    """ViViT-B/16x2, spatio-temporal attention, as trained on Kinetics-400: 32 frames of 224 x 224, the
    paper's numerics (no patch LayerNorms, qkv bias, LayerNorm eps 1e-6, tanh GELU as Hugging Face's
    `gelu_fast`). Keyword arguments of `ViT` override anything."""
    dim, depth, heads, mlp_dim, patch, frame_patch = CONFIGS['vivit_b_16x2']
    kwargs = dict(image_size=image_size, image_patch_size=patch, frames=frames, frame_patch_size=frame_patch,
                  num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim, dim_head=dim // heads,
                  patch_norm=False, qkv_bias=True, norm_eps=1e-6, gelu_approximate='tanh')
    return ViT(**{**kwargs, **overrides})


# argument checks


def check_arguments(*, image_size, image_patch_size, frames, frame_patch_size, num_classes, dim, depth, heads,
                    mlp_dim, pool, channels, dim_head, dropout, emb_dropout, patch_norm, qkv_bias, norm_eps,
                    gelu_approximate):
    vit.check_geometry(image_size=image_size, image_patch_size=image_patch_size, frames=frames,
                       frame_patch_size=frame_patch_size)
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                    channels=channels, dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout)
    vit.positive_float('norm_eps', norm_eps)
    vit.boolean('patch_norm', patch_norm)
    vit.boolean('qkv_bias', qkv_bias)
    if pool not in ('cls', 'mean'):
        raise ValueError(f"pool must be 'cls' (cls token) or 'mean' (mean pooling), got {pool!r}")
    if gelu_approximate not in ('none', 'tanh'):
        raise ValueError(f"gelu_approximate must be 'none' or 'tanh', got {gelu_approximate!r}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `vit_3d.ViT(pool='cls')`: our names, except that its head is (LayerNorm, Linear) on the
    cls token, where ours is a final LayerNorm of all tokens (the same function on the cls token) and a
    Linear; its cls token and position table carry a leading batch axis."""
    if model.pool == 'mean':
        raise ValueError("vit-pytorch's 3D ViT(pool='mean') keeps a cls token, averages it with the tubelet "
                         "tokens and norms after pooling; this model (no cls token, norm then pool) cannot "
                         "reproduce it: only its pool='cls' checkpoints load")
    state = model.state_dict()
    dim = state['pos_embedding'].shape[-1]
    renamed = {'mlp_head.0.': 'transformer.norm.', 'mlp_head.1.': 'mlp_head.'}
    plan = {'cls_token': ({'cls_token': (1, 1, dim)}, lambda t: t[0]),
            'pos_embedding': ({'pos_embedding': (1, *state['pos_embedding'].shape)}, lambda t: t[0])}
    theirs_of = {ours: theirs for theirs, ours in renamed.items()}
    for key, tensor in state.items():
        if key not in plan:
            prefix = next((p for p in theirs_of if key.startswith(p)), None)
            source = theirs_of[prefix] + key[len(prefix):] if prefix else key
            plan[key] = ({source: tuple(tensor.shape)}, lambda t: t)
    return plan, ('mlp_head.1.',)


def hf_plan(model, keys):
    """Hugging Face `VivitModel` / `VivitForVideoClassification` -> ViT with the paper's numerics.

    The tubelet projection is a Conv3d (a Linear over (pf p1 p2 c) here); q, k and v are three Linears
    (one here); tokens and positions carry a leading batch axis. Files on disk use the legacy names
    (`encoder.layer.N.attention.attention.query`), transformers 5 in memory `layers.N.attention.q_proj`.
    """
    state = model.state_dict()
    if 'to_patch_embedding.1.weight' in state or model.pool != 'cls' or 'transformer.layers.0.0.to_qkv.bias' \
            not in state:
        raise ValueError("Hugging Face's ViViT has a plain tubelet projection, a cls token and a qkv bias: build "
                         "the model with patch_norm=False, pool='cls', qkv_bias=True (see vivit_b_16x2_kinetics400)")
    anchors = [key for key in keys if key.endswith('embeddings.cls_token')]
    p = anchors[0][:-len('embeddings.cls_token')] if anchors else ''
    legacy = not any(key.startswith(f'{p}layers.') for key in keys)
    layer = f'{p}encoder.layer.{{}}.' if legacy else f'{p}layers.{{}}.'
    q, k, v, o, fc1, fc2 = (
        ('attention.attention.query', 'attention.attention.key', 'attention.attention.value',
         'attention.output.dense', 'intermediate.dense', 'output.dense') if legacy else
        ('attention.q_proj', 'attention.k_proj', 'attention.v_proj', 'attention.o_proj', 'mlp.fc1', 'mlp.fc2'))
    d = state['pos_embedding'].shape[-1]
    tubelet = (d, model.channels, model.frame_patch_size, *model.patch_size)
    plan = {
        'to_patch_embedding.2.weight': ({f'{p}embeddings.patch_embeddings.projection.weight': tubelet},
                                        lambda w: rearrange(w, 'd c pf p1 p2 -> d (pf p1 p2 c)')),
        'to_patch_embedding.2.bias': ({f'{p}embeddings.patch_embeddings.projection.bias': (d,)}, lambda t: t),
        'cls_token': ({f'{p}embeddings.cls_token': (1, 1, d)}, lambda t: t[0]),
        'pos_embedding': ({f'{p}embeddings.position_embeddings': (1, *state['pos_embedding'].shape)},
                          lambda t: t[0]),
        'transformer.norm.weight': ({f'{p}layernorm.weight': (d,)}, lambda t: t),
        'transformer.norm.bias': ({f'{p}layernorm.bias': (d,)}, lambda t: t),
    }
    for i in range(len(model.transformer.layers)):
        ours, theirs = f'transformer.layers.{i}.', layer.format(i)
        for kind in ('weight', 'bias'):
            qkv_shape = tuple(state[ours + f'0.to_qkv.{kind}'].shape)
            part = (qkv_shape[0] // 3, *qkv_shape[1:])
            # HF keeps q, k and v apart; ours is one Linear with rows [q; k; v]
            plan[ours + f'0.to_qkv.{kind}'] = ({theirs + f'{name}.{kind}': part for name in (q, k, v)},
                                              lambda *t: torch.cat(t))
            for our_name, their_name in [('0.norm', 'layernorm_before'), ('0.to_out.0', o),
                                         ('1.net.0', 'layernorm_after'), ('1.net.1', fc1), ('1.net.4', fc2)]:
                key = ours + f'{our_name}.{kind}'
                plan[key] = ({theirs + f'{their_name}.{kind}': tuple(state[key].shape)}, lambda t: t)
    if model.mlp_head is not None:
        for kind in ('weight', 'bias'):
            plan[f'mlp_head.{kind}'] = ({f'classifier.{kind}': tuple(state[f'mlp_head.{kind}'].shape)}, lambda t: t)
    return plan, ('classifier.',)
