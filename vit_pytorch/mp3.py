"""MP3: masked position prediction pre-training.

"Position Prediction as an Effective Pretraining Strategy", Zhai et al., ICML 2022, arXiv 2207.07611: give
the transformer the patch tokens without any position embedding and train it to classify, for every patch,
which of the n positions it came from. A random `masking_ratio` of the patches is masked out of the keys
and values of every attention layer (the remaining patches are the context), which makes the task harder
and the step cheaper; every patch, masked or not, stays a query and has its position predicted. After
pre-training the head is dropped and the ViT, with its position embeddings, is fine-tuned.

    import torch
    from vit_pytorch.mp3 import ViT, MP3

    v = ViT(num_classes=1000, image_size=64, patch_size=8, dim=128, depth=2, heads=4, mlp_dim=256)
    mp3 = MP3(vit=v, masking_ratio=0.75)
    loss = mp3(torch.randn(4, 3, 64, 64))      # cross-entropy over the 64 positions, for all 64 patches
    loss.backward()
    logits, context = mp3.logits(torch.randn(4, 3, 64, 64))   # (4, 64, 64) and (4, 64), True: a key

`ViT` is vit-pytorch's model of this module: a ViT with the fixed 2D sin-cos position table of SimpleViT,
dropout, no final norm, mean pooling and a LayerNorm-then-Linear head. The wrapper uses only the public face
of the model it trains, `patch_tokens` (the tokens before any position), `transformer(x, key_index=...)` (its
attention, `vit.Attention`, takes the keys and values of those tokens only), `token_grid`, `image_size` and
`embed_dim`, so it trains `vit_pytorch.ViT` and `SimpleViT` as well. Each layer projects the keys and values of
the m context patches alone and attends from all n patches to them (n x m scores, not an n x n map under a mask):
the recorder's maps of the wrapper (`vit_pytorch.recorder`) are (b, heads, n, m), the keys being the context
patches in patch order (the columns where `logits`' context mask is True).

Differences from vit-pytorch 1.26.14, whose MP3 gives every layer the first layer's input (the patch
embeddings) as keys and values: as the paper, the keys and values of each layer are that layer's own tokens
of the context patches (self-attention with the masked patches left out), so context tokens are updated
from layer to layer. vit-pytorch's `ViT` checkpoints load (`load_vit_pytorch`; its separate query and key-value
projections become one). `masking_ratio` in (0, 1) is a ValueError outside, not an assert. It has no default,
as vit-pytorch's has none; 0.75, the pre-training command's default (`--masking-ratio`), is the value of
vit-pytorch's README example. The paper's own choice was not checked against its text or official code.
"""

import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import simple_vit, vit


def attention_with_projection(dim, heads, dim_head, dropout=0., **kwargs):
    """The core attention, with its output projection even where one head has the model's width (vit-pytorch's)."""
    return vit.Attention(dim, heads, dim_head, dropout, to_out=nn.Sequential(nn.Linear(heads * dim_head, dim),
                                                                              nn.Dropout(dropout)), **kwargs)


class ViT(vit.NormedHead, vit.TokenFace, nn.Module):
    """vit-pytorch's MP3 `ViT`: patch tokens plus SimpleViT's sin-cos table for the input's grid, pre-norm layers
    with dropout and no final norm, the mean of the tokens, then `mlp_head` (LayerNorm, Linear).

    `forward_features` returns all tokens, not normed, (b, h * w, dim).
    `num_classes=0` makes `forward` return the pooled embedding after the head's LayerNorm (b, dim).
    """

    num_prefix_tokens = 0
    pool = 'mean'

    def __init__(self, *, num_classes, image_size, patch_size, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 dropout=0.):
        check_vit_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.channels, self.num_classes, self.embed_dim, self.num_features = channels, num_classes, dim, dim

        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim)
        # fixed, so not saved; a buffer so that it follows .to(device)
        self.register_buffer('pos_embedding', simple_vit.posemb_sincos_2d(*self.grid_size, dim), persistent=False)
        self.transformer = vit.Transformer(dim, depth, heads, dim_head, mlp_dim, dropout,
                                           attention=attention_with_projection, final_norm=False)
        self.to_latent = nn.Identity()
        self.mlp_head = nn.Sequential(nn.LayerNorm(dim), *([nn.Linear(dim, num_classes)] if num_classes else []))

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def patch_tokens(self, img):
        """The checked image's patch tokens, before positions: (b, h * w, dim); any size divisible by the patch."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, dtype=self.pos_embedding.dtype)
        return self.to_patch_embedding(img)

    def embed(self, img):
        """Patch tokens with the sin-cos positions of their grid: (b, h * w, dim)."""
        grid = self.token_grid(img.shape[-2:])
        positions = self.pos_embedding if grid == self.grid_size else \
            simple_vit.posemb_sincos_2d(*grid, self.embed_dim, device=self.pos_embedding.device)
        return self.patch_tokens(img) + positions.to(self.pos_embedding.dtype)

    def forward_features(self, img):
        """All tokens, not normed: (b, h * w, dim)."""
        return self.transformer(self.embed(img))

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


class MP3(nn.Module):
    """`MP3(vit, masking_ratio)`: `forward(img)` returns the position-prediction loss; `logits(img)` the
    predictions (b, n, n) over the n positions of the training grid and the context mask (b, n)."""

    def __init__(self, vit, masking_ratio):
        check_arguments(vit=vit, masking_ratio=masking_ratio)
        super().__init__()
        self.vit = vit
        self.masking_ratio = float(masking_ratio)
        self.grid_size = tuple(vit.token_grid(tuple(vit.image_size)))
        num_positions = math.prod(self.grid_size)
        self.mlp_head = nn.Sequential(nn.LayerNorm(vit.embed_dim), nn.Linear(vit.embed_dim, num_positions))

    def context_indices(self, batch_size, num_patches, *, device, noise=None):
        """(b, m), in ascending order, the patches that stay keys and values: the m = n - int(n * masking_ratio) of
        lowest noise."""
        if noise is None:
            noise = torch.rand(batch_size, num_patches, device=device)
        elif noise.shape != (batch_size, num_patches):
            raise ValueError(f"noise must have shape (batch, patches) = {(batch_size, num_patches)}, "
                             f"got {tuple(noise.shape)}")
        return noise.argsort(dim=1)[:, :num_patches - int(num_patches * self.masking_ratio)].sort(dim=1).values

    def context_mask(self, batch_size, num_patches, *, device, noise=None):
        """(b, n), True for the patches that stay keys and values (`context_indices`)."""
        return index_mask(self.context_indices(batch_size, num_patches, device=device, noise=noise), num_patches)

    def logits(self, img, *, noise=None):
        """Position logits of every patch (b, n, n) and the context mask (b, n), True where a patch is a key.
        `noise` (b, n) fixes the mask (the patches of lowest noise are the context)."""
        patches = self.vit.patch_tokens(img)                                          # (b, n, dim), no positions
        grid = tuple(self.vit.token_grid(tuple(img.shape[-2:])))
        if grid != self.grid_size:
            raise ValueError(f"img must be {tuple(self.vit.image_size)} (the ViT's image_size): its positions are "
                             f"the {self.grid_size} grid's classes, got an image of {tuple(img.shape[-2:])}")
        batch, num_patches = patches.shape[:2]
        context = self.context_indices(batch, num_patches, device=img.device, noise=noise)       # (b, m)
        # every layer attends from all n patches to its own tokens of the m context patches, gathered: a boolean
        # mask of them computes the same at the cost of n keys, and its (n, n) maps
        tokens = self.vit.transformer(patches, key_index=context)
        return self.mlp_head(tokens), index_mask(context, num_patches)

    def forward(self, img, *, noise=None):
        logits, _ = self.logits(img, noise=noise)
        batch, num_patches = logits.shape[:2]
        positions = repeat(torch.arange(num_patches, device=img.device), 'n -> (b n)', b=batch)
        return F.cross_entropy(rearrange(logits, 'b n p -> (b n) p'), positions)


def index_mask(indices, size):
    """(b, size), True at the (b, m) `indices`."""
    return torch.zeros(indices.shape[0], size, dtype=torch.bool, device=indices.device).scatter(1, indices, True)


# argument checks

FACE = ('patch_tokens', 'transformer', 'token_grid', 'image_size', 'embed_dim')


def check_arguments(**arguments):
    model, masking_ratio = arguments['vit'], arguments['masking_ratio']     # `vit` is also the core module's name
    missing = [attribute for attribute in FACE if not hasattr(model, attribute)]
    if missing:
        raise TypeError(f"vit must be a ViT or SimpleViT (or a variant with their public face); "
                        f"{type(model).__name__} has no {', '.join(missing)}")
    if vit.probability('masking_ratio', masking_ratio) == 0:
        raise ValueError("masking_ratio must be in (0, 1): the share of patches masked out of the keys, got 0")


def check_vit_arguments(*, num_classes, image_size, patch_size, dim, depth, heads, mlp_dim, channels, dim_head,
                        dropout):
    vit.check_patches(image_size, patch_size)
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                    channels=channels, dim_head=dim_head, dropout=dropout)
    if dim % 4 or dim < 8:
        raise ValueError(f"dim must be a multiple of 4 and at least 8 for the sin-cos position table, got {dim}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's MP3 `ViT`: its attention projects queries (`to_q`) and keys and values (`to_kv`) apart, our
    `to_qkv` is the two stacked; its head is `linear_head`."""
    if not isinstance(model, ViT):
        return None
    plan = {}
    for key, tensor in model.state_dict().items():
        shape = tuple(tensor.shape)
        if key.endswith('.to_qkv.weight'):
            prefix, inner = key.removesuffix('to_qkv.weight'), shape[0] // 3
            plan[key] = ({f'{prefix}to_q.weight': (inner, shape[1]), f'{prefix}to_kv.weight': (2 * inner, shape[1])},
                         lambda q, kv: torch.cat((q, kv)))
        elif key.startswith('mlp_head.'):
            plan[key] = ({'linear_head.' + key.removeprefix('mlp_head.'): shape}, lambda t: t)
        else:
            plan[key] = ({key: shape}, lambda t: t)
    return plan, ('linear_head.1.',)
