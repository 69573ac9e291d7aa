"""The position embeddings of the ViT paper's ablation, as a ViT with a `position=` choice.

"An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale", Dosovitskiy et al.,
arXiv 2010.11929, appendix D.4 and table 8: how the patches learn where they are.

  'none'      no positional information: the encoder treats the patches as a set, so permuting
              them permutes its output tokens (it is permutation-equivariant).
  'learned'   one learned vector per token (the core ViT's table; the paper's default, "1-D").
  '2d'        learned and factorised: a row table and a column table of dim / 2 each; a patch's
              embedding is its row's vector concatenated with its column's (the paper's "2-D").
              The prefix (cls) token keeps a learned vector of its own.
  'relative'  no absolute table. In every layer each query also attends to learned embeddings of
              the 1-D offset p_q - p_k between its patch and the key's patch (positions counted
              row-major), with those embeddings as the keys; these logits are added to the
              content logits before the softmax (the paper's "relative positional embeddings").
              One table of 2n - 1 offsets of dim_head per layer, shared by the heads; pairs with
              a prefix token get no relative term.
  'sincos'    the fixed 2-D sin-cos table of SimpleViT (arXiv 2205.01580); not in table 8.

    import torch
    from vit_pytorch.position_embeddings import ViT

    model = ViT(position='2d', image_size=16, patch_size=4, num_classes=10, dim=64, depth=2, heads=4,
                mlp_dim=128, channels=1)
    logits = model(torch.randn(2, 1, 16, 16))                     # (2, 10)
    table = model.pos_embedding_for((4, 4))                        # (1 + 16, 64): cls, then row | column

Each kind plugs into the core through its hooks: the attention builder (`attention=`, for
'relative') and `pos_embedding_for` (for '2d'). `pos_embedding` stays what the core adds to
the tokens where that is a fixed table (zeros for 'none' and 'relative', sin-cos for
'sincos'; not saved, since nothing is learned), and holds the prefix token's learned vector
for '2d'. Only 'learned' and 'none' take `dynamic_image_size=True` ('sincos' is resampled,
not recomputed, at another size, as the core resamples any table). Without it, a smaller or
non-square image gets the top-left sub-grid of the table as in the core ('2d': the first rows
and columns of its two tables), except under 'relative', whose offsets are counted row-major on
the full grid: it takes `image_size` only.
"""

import functools

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import vit
from vit_pytorch.simple_vit import posemb_sincos_2d

KINDS = ('none', 'learned', '2d', 'relative', 'sincos')


class RelativeAttention(vit.Attention):
    """The core attention plus the paper's 1-D relative term between patches.

    logits[i, j] = q_i . k_j * scale + q_i . r[p_i - p_j] * scale for patches i, j, where r holds a
    learned embedding per offset (2 * num_patches - 1 of them, dim_head wide, shared by the heads).
    """

    def __init__(self, dim, heads=8, dim_head=64, dropout=0., *, num_patches, num_prefix_tokens, **kwargs):
        super().__init__(dim, heads, dim_head, dropout, **kwargs)
        self.num_prefix_tokens = num_prefix_tokens
        self.relative_embedding = nn.Parameter(torch.zeros(2 * num_patches - 1, dim_head))
        nn.init.trunc_normal_(self.relative_embedding, std=0.02)
        positions = torch.arange(num_patches)
        # the row of r that each (query, key) pair of patches reads: p_q - p_k, shifted to start at 0
        self.register_buffer('offset_index', positions[:, None] - positions[None, :] + num_patches - 1,
                             persistent=False)

    def relative_logits(self, q):
        """The relative term of the attention logits for queries q (b, heads, prefix + n, dim_head):
        (b, heads, prefix + n, prefix + n), zero in the rows and columns of prefix tokens."""
        prefix = self.num_prefix_tokens
        logits = q[:, :, prefix:] @ self.relative_embedding.T * self.scale          # (b, h, n, 2n - 1)
        index = repeat(self.offset_index, 'i j -> b h i j', b=q.shape[0], h=q.shape[1])
        logits = logits.gather(-1, index)                                             # (b, h, n, n)
        return F.pad(logits, (prefix, 0, prefix, 0))

    def forward(self, x):
        q, k, v = self.qkv(x)
        out = self.attend(q, k, v, mask=self.relative_logits(q).to(q.dtype))
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class ViT(vit.ViT):
    """The core ViT with the position embedding `position` (one of KINDS); other arguments are the core's."""

    def __init__(self, *, image_size, patch_size, dim, position='learned', **kwargs):
        check_arguments(image_size=image_size, patch_size=patch_size, dim=dim, position=position, **kwargs)
        num_prefix_tokens = (1 if kwargs.get('pool', 'cls') == 'cls' else 0) + self.extra_tokens
        if position == 'relative':
            height, width = vit.patch_grid(vit.pair(image_size), vit.pair(patch_size))
            kwargs['attention'] = functools.partial(RelativeAttention, num_patches=height * width,
                                                    num_prefix_tokens=num_prefix_tokens)
        super().__init__(image_size=image_size, patch_size=patch_size, dim=dim, **kwargs)
        self.position = position
        if position == 'learned':
            return
        height, width = self.grid_size
        del self.pos_embedding                                        # the core's learned table
        if position == '2d':
            self.row_embedding = nn.Parameter(torch.zeros(height, dim // 2))
            self.column_embedding = nn.Parameter(torch.zeros(width, dim // 2))
            learned = [self.row_embedding, self.column_embedding]
            if num_prefix_tokens:
                self.pos_embedding = nn.Parameter(torch.zeros(num_prefix_tokens, dim))   # the cls token's own
                learned.append(self.pos_embedding)
            else:
                self.register_buffer('pos_embedding', torch.zeros(0, dim))   # no empty parameter
            vit.init_tokens(*learned, patch_norm=kwargs.get('patch_norm', True))
            return
        table = torch.zeros(num_prefix_tokens + height * width, dim)
        if position == 'sincos':
            table[num_prefix_tokens:] = posemb_sincos_2d(height, width, dim)
        self.register_buffer('pos_embedding', table, persistent=False)   # fixed: nothing to learn or save

    def patch_tokens(self, img):
        if self.position == 'relative':
            vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size)
        return super().patch_tokens(img)

    def pos_embedding_for(self, grid):
        """What is added to the tokens for an (h, w) patch grid: (prefix + h * w, dim)."""
        if self.position != '2d':
            return super().pos_embedding_for(grid)
        rows, columns = self.row_embedding[:grid[0]], self.column_embedding[:grid[1]]
        patches = torch.cat((repeat(rows, 'h d -> h w d', w=grid[1]), repeat(columns, 'w d -> h w d', h=grid[0])),
                            dim=-1)
        return torch.cat((self.pos_embedding, rearrange(patches, 'h w d -> (h w) d')))


# ---------------------------------------------------------------------------------------------
# Argument checks


def check_arguments(*, image_size, patch_size, dim, position, dynamic_image_size=False, attention=None, **others):
    if position not in KINDS:
        raise ValueError(f"position must be one of {KINDS}, got {position!r}")
    vit.positive_int('dim', dim)
    if position == '2d' and dim % 2:
        raise ValueError(f"dim must be even for position='2d' (half for the rows, half for the columns), got {dim}")
    if position == 'sincos' and (dim % 4 or dim < 8):
        raise ValueError(f"dim must be a multiple of 4 and at least 8 for position='sincos', got {dim}")
    if dynamic_image_size and position in ('2d', 'relative'):
        raise ValueError(f"dynamic_image_size=True needs position 'learned', 'none' or 'sincos'; "
                         f"position={position!r} is built for one patch grid")
    if attention is not None and position == 'relative':
        raise ValueError("attention cannot be given with position='relative', which builds its own attention")
    vit.check_patches(image_size, patch_size)
