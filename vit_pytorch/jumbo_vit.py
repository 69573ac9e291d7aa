"""Jumbo: a K-times-wider cls token with its own wider feed-forward.

"Simpler Fast Vision Transformers with a Jumbo CLS Token", Fuller et al., arXiv 2502.15021: the cls token is
K * dim wide. For attention it is split into K tokens of the model's width, which attend with the patch tokens
as any token does; after attention the K pieces are joined again and the joined token goes through its own
feed-forward, K * dim wide, whose weights all layers share (each layer has its own LayerNorm before it). The
patch tokens' path is a plain pre-norm ViT layer. The classifier reads the whole jumbo token, joined with the
mean of the patch tokens.

    import torch
    from vit_pytorch.jumbo_vit import JumboViT

    model = JumboViT(image_size=64, patch_size=8, num_classes=10, dim=32, depth=2, heads=2, mlp_dim=64,
                     jumbo_cls_k=3, jumbo_ff_mult=2)
    logits = model(torch.randn(2, 3, 64, 64))   # (2, 10)

At vit-pytorch 1.26.14's path with its class name, arguments and defaults, on SimpleViT's patch side (sin-cos
positions, the patch projection between two LayerNorms, bias-free attention). Where vit-pytorch's JumboViT
differs from the paper (its code, github.com/antofuller/jumbo, `models/jumbo.py`), ours follows the paper and
`load_vit_pytorch` refuses vit-pytorch's checkpoints naming the difference:
  - vit-pytorch shares the LayerNorm before the jumbo feed-forward across layers; the paper shares the MLP only;
  - vit-pytorch classifies the mean of the K pieces (dim wide); the paper the whole jumbo token (K * dim) joined
    with the patch tokens' mean, after the final norm;
  - vit-pytorch's feed-forwards are dim * mlp_dim and K * dim * int(K * dim * jumbo_ff_mult) wide (its
    FeedForward takes a multiplier where it is given a width); ours mlp_dim and K * dim * jumbo_ff_mult.
`num_jumbo_cls` (several jumbo tokens, each K * dim wide) is vit-pytorch's extension; the paper has one. The
jumbo token starts from a unit normal, at the scale of the normed patch tokens (vit-pytorch: zeros; the paper's
code: std 0.02). The paper's jumbo MLP is 4 times wider than the token (`jumbo_ff_mult=4`); vit-pytorch's
default, kept here, is 2.

`patch_side='paper'` (an option beyond vit-pytorch's API) puts the layers on the paper's code's patch side
instead: a learned position table for the patch tokens (the jumbo token has none), the plain patch projection
(no LayerNorms around it), biases on the query/key/value and output projections, and the learned tokens and
table starting at std 0.02. That model computes the official code's function, and its checkpoints load with
`vit_pytorch.pretrained.load_official` (`jumbo_vit(name, patch_side='paper')` for its released sizes).

`forward_features` returns (b, num_jumbo_cls * K + h * w, dim): the jumbo tokens' pieces (the prefix,
`num_prefix_tokens`) then the patch tokens, after the final norm.
"""

import torch
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import simple_vit, vit
from vit_pytorch.vit import pair


class JumboStack(vit.Stack):
    """Layers (attention, feedforward, jumbo norm) over (b, jumbo pieces + patches, dim), and the jumbo
    feed-forward all of them share: attention over every token, then the patch tokens' feed-forward and, on the
    joined jumbo token (b, num_jumbo_cls, k * dim), its LayerNorm and the shared MLP."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, *, num_jumbo_cls, jumbo_cls_k, jumbo_ff_mult,
                 projection_bias=False):
        jumbo_dim = dim * jumbo_cls_k

        def attention():
            if not projection_bias:
                return simple_vit.Attention(dim, heads, dim_head)
            return vit.Attention(dim, heads, dim_head, qkv_bias=True, to_out=nn.Linear(heads * dim_head, dim))
        super().__init__([(attention(), simple_vit.FeedForward(dim, mlp_dim), nn.LayerNorm(jumbo_dim))
                          for _ in range(depth)], norm=nn.LayerNorm(dim))
        hidden_dim = int(jumbo_dim * jumbo_ff_mult)
        self.jumbo_ff = nn.Sequential(nn.Linear(jumbo_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, jumbo_dim))
        self.jumbo_cls_k = jumbo_cls_k
        self.num_jumbo_tokens = num_jumbo_cls * jumbo_cls_k

    def step(self, entry, x, state):
        attn, ff, jumbo_norm = entry
        x = attn(x) + x
        jumbo, patches = x[:, :self.num_jumbo_tokens], x[:, self.num_jumbo_tokens:]
        jumbo = rearrange(jumbo, 'b (n k) d -> b n (k d)', k=self.jumbo_cls_k)     # the pieces joined
        jumbo = self.jumbo_ff(jumbo_norm(jumbo)) + jumbo
        patches = ff(patches) + patches
        jumbo = rearrange(jumbo, 'b n (k d) -> b (n k) d', k=self.jumbo_cls_k)     # split again for attention
        return torch.cat((jumbo, patches), dim=1), {}


class JumboViT(vit.TokenFace, nn.Module):
    """vit-pytorch's JumboViT (its arguments and defaults), computing the paper's function (see the module's
    docstring). `num_classes=0` makes `forward` return the pooled embedding (b, num_features): the jumbo tokens
    (num_jumbo_cls * K * dim) joined with the patch tokens' mean (dim). `patch_side`: 'simple' (SimpleViT's, the
    default) or 'paper' (the paper's code's: learned positions, plain patch projection, biased projections).

    `forward_features` returns all tokens after the final norm, (b, num_jumbo_cls * K + h * w, dim).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, num_jumbo_cls=1,
                 jumbo_cls_k=6, jumbo_ff_mult=2, channels=3, dim_head=64, patch_side='simple'):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = pair(image_size), pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.channels, self.num_classes, self.embed_dim = channels, num_classes, dim
        self.jumbo_cls_k = jumbo_cls_k
        self.num_prefix_tokens = num_jumbo_cls * jumbo_cls_k
        self.num_features = (self.num_prefix_tokens + 1) * dim

        self.patch_side = patch_side
        paper = patch_side == 'paper'
        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim,
                                                     patch_norm=not paper)
        self.jumbo_cls_token = nn.Parameter(torch.zeros(num_jumbo_cls, jumbo_cls_k * dim))
        if paper:
            self.pos_embedding = nn.Parameter(torch.zeros(self.grid_size[0] * self.grid_size[1], dim))
            vit.init_tokens(self.pos_embedding, self.jumbo_cls_token, patch_norm=False)
        else:
            # fixed, so not saved; a buffer so that it follows .to(device)
            self.register_buffer('pos_embedding', simple_vit.posemb_sincos_2d(*self.grid_size, dim),
                                 persistent=False)
            vit.init_tokens(self.jumbo_cls_token, patch_norm=True)
        self.transformer = JumboStack(dim, depth, heads, dim_head, mlp_dim, num_jumbo_cls=num_jumbo_cls,
                                      jumbo_cls_k=jumbo_cls_k, jumbo_ff_mult=jumbo_ff_mult, projection_bias=paper)
        self.linear_head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def embed(self, img):
        """The jumbo tokens split into pieces of width dim, then the patch tokens with their positions:
        (b, num_jumbo_cls * K + h * w, dim). Any image whose sides divide by the patch size."""
        grid = vit.check_images(img, channels=self.channels, patch_size=self.patch_size,
                                dtype=self.jumbo_cls_token.dtype)
        if grid == self.grid_size:
            positions = self.pos_embedding
        elif self.patch_side == 'paper':    # the learned table resampled, as the paper's code's set_pos_embed does
            positions = vit.resample_pos_embedding(self.pos_embedding, old_grid=self.grid_size, new_grid=grid,
                                                   antialias=True)
        else:
            positions = simple_vit.posemb_sincos_2d(*grid, self.embed_dim, device=self.pos_embedding.device)
        patches = self.to_patch_embedding(img) + positions.to(img.dtype)
        jumbo = repeat(self.jumbo_cls_token, 'n (k d) -> b (n k) d', b=img.shape[0], k=self.jumbo_cls_k)
        return torch.cat((jumbo, patches), dim=1)

    def forward_features(self, img):
        """All tokens after the final norm: (b, num_jumbo_cls * K + h * w, dim)."""
        return self.transformer(self.embed(img))

    def forward_head(self, tokens, pre_logits=False):
        """The jumbo tokens joined whole, beside the patch tokens' mean, then the head."""
        jumbo = rearrange(tokens[:, :self.num_prefix_tokens], 'b n d -> b (n d)')
        x = torch.cat((jumbo, tokens[:, self.num_prefix_tokens:].mean(dim=1)), dim=-1)    # (b, num_features)
        return x if pre_logits else self.linear_head(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.jumbo_cls_token, name='linear_head',
                       removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# the paper's models (its code's configs.py): name -> (dim, heads, K); all 12 layers, patches of 16, MLP ratio 4,
# jumbo MLP ratio 4
CONFIGS = {'pico': (96, 3, 6), 'nano': (128, 4, 6), 'tiny': (192, 3, 6), 'small': (384, 6, 6), 'base': (768, 12, 3)}


def jumbo_vit(variant, *, image_size=224, num_classes=1000, **overrides):
    """The paper's Jumbo-`variant` (a key of CONFIGS) on this module's patch side; keyword arguments override it."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dim, heads, k = CONFIGS[variant]
    kwargs = dict(image_size=image_size, patch_size=16, num_classes=num_classes, dim=dim, depth=12, heads=heads,
                  dim_head=dim // heads, mlp_dim=4 * dim, jumbo_cls_k=k, jumbo_ff_mult=4)
    return JumboViT(**{**kwargs, **overrides})


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, num_jumbo_cls, jumbo_cls_k,
                    jumbo_ff_mult, channels, dim_head, patch_side):
    vit.check_patches(image_size, patch_size)
    if patch_side not in ('simple', 'paper'):
        raise ValueError(f"patch_side must be 'simple' or 'paper', got {patch_side!r}")
    for name, value in dict(dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim, num_jumbo_cls=num_jumbo_cls,
                            jumbo_cls_k=jumbo_cls_k, channels=channels, dim_head=dim_head).items():
        vit.positive_int(name, value)
    if dim % 4 or dim < 8:
        raise ValueError(f"dim must be a multiple of 4 and at least 8 (the sin-cos position table), got {dim}")
    vit.non_negative_int('num_classes', num_classes)
    if int(dim * jumbo_cls_k * vit.positive_float('jumbo_ff_mult', jumbo_ff_mult)) < 1:
        raise ValueError(f"jumbo_ff_mult * jumbo_cls_k * dim must be at least 1 (the jumbo MLP's hidden width), "
                         f"got {jumbo_ff_mult} * {jumbo_cls_k} * {dim}")


# loading checkpoints


def official_plan(model, keys):
    """The paper's code's `Jumbo` (antofuller/jumbo, models/jumbo.py) -> JumboViT(patch_side='paper').

    Names differ; the patch projection is a Conv2d there (its kernel flattened here in (p1 p2 c) order), the
    jumbo token (1, K, dim) there (one jumbo token, K pieces). The official model has no cls token in use but
    keeps one (`cls_token`, never read), which is read and dropped.
    """
    if model.patch_side != 'paper':
        raise ValueError("the paper's code has learned positions, a plain patch projection and biased projections: "
                         "build the model with patch_side='paper' (e.g. jumbo_vit('small', patch_side='paper'))")
    if model.num_prefix_tokens != model.jumbo_cls_k:
        tokens = model.num_prefix_tokens // model.jumbo_cls_k
        raise ValueError(f"the paper's code has one jumbo token, the model {tokens}: build it with num_jumbo_cls=1")
    k, dim = model.jumbo_cls_k, model.embed_dim
    shapes = {key: tuple(tensor.shape) for key, tensor in model.state_dict().items()}
    plan = {
        'to_patch_embedding.2.weight': ({'patch_embed.proj.weight': (dim, model.channels, *model.patch_size)},
                                        _patch_kernel),
        'to_patch_embedding.2.bias': ({'patch_embed.proj.bias': shapes['to_patch_embedding.2.bias']}, _same),
        'pos_embedding': ({'pos_embed': None}, dict(num_prefix_tokens=0, grid=model.grid_size)),
        'jumbo_cls_token': ({'jumbo_token': (1, k, dim)}, _joined),
        'the unused cls token': ({'cls_token': (1, 1, dim)}, _dropped),
    }
    names = {'transformer.jumbo_ff.0.': 'jumbo_mlp.fc1.', 'transformer.jumbo_ff.2.': 'jumbo_mlp.fc2.',
             'transformer.norm.': 'norm.', 'linear_head.': 'head.'}
    for i in range(len(model.transformer.layers)):
        names.update({f'transformer.layers.{i}.{a}': f'blocks.{i}.{b}' for a, b in {
            '0.norm.': 'norm1.', '0.to_qkv.': 'attn.qkv.', '0.to_out.': 'attn.proj.', '1.net.0.': 'norm2.',
            '1.net.1.': 'mlp.fc1.', '1.net.3.': 'mlp.fc2.', '2.': 'norm3.'}.items()})
    for key, shape in shapes.items():
        if key in plan:
            continue
        prefix = next((prefix for prefix in names if key.startswith(prefix)), None)
        if prefix is None:
            raise ValueError(f"the paper's Jumbo has no counterpart of {key}")
        plan[key] = ({names[prefix] + key[len(prefix):]: shape}, _same)
    return plan, ('head.',)


def _same(tensor):
    return tensor


def _patch_kernel(weight):
    return rearrange(weight, 'd c p1 p2 -> d (p1 p2 c)')


def _dropped(tensor):
    return None


def _joined(tokens):
    return rearrange(tokens, '1 k d -> 1 (k d)')


def vit_pytorch_plan(model, keys):
    if model.patch_side != 'simple':
        raise ValueError("vit-pytorch's JumboViT is on SimpleViT's patch side: build the model with "
                         "patch_side='simple'")
    raise ValueError(
        "vit-pytorch's JumboViT computes another function than the paper's (and this one): one LayerNorm before the "
        "jumbo feed-forward shared by all layers (the paper: one per layer, the MLP alone shared), a head on the mean "
        "of the jumbo token's K pieces (the paper: on the whole jumbo token joined with the patch tokens' mean), and "
        "feed-forwards dim * mlp_dim wide (its FeedForward takes mlp_dim as a multiplier)")
