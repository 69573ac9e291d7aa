"""ViT with a PatchMerger: vit-pytorch's `vit_pytorch.vit_with_patch_merger`.

"Learning to Merge Tokens in Vision Transformers", Renggli et al., arXiv 2202.12015: between two
layers, a PatchMerger turns the N tokens into K: K learned queries each take a softmax-weighted
average of the (normed) tokens, a softmax over the N tokens. The layers after it attend over K
tokens instead of N, and since each output is a weighted sum over the whole set, the merge does
not depend on the tokens' order. The paper merges halfway through the encoder (vit-pytorch's default).

    import torch
    from vit_pytorch.vit_with_patch_merger import PatchMerger, ViT

    model = ViT(image_size=64, patch_size=8, num_classes=10, dim=64, depth=4, heads=4, mlp_dim=128,
                patch_merge_layer=2, patch_merge_num_tokens=8)    # 64 tokens in layers 1-2, 8 after
    logits = model(torch.randn(2, 3, 64, 64))                    # (2, 10)
    merged = PatchMerger(dim=64, num_tokens_out=8)(torch.randn(2, 100, 64))   # (2, 8, 64)

The arguments, parameter names and the function are vit-pytorch's (1.26.14), whose checkpoints load
unchanged (`load_state_dict`, or `vit_pytorch.pretrained.load_vit_pytorch`; a test checks the outputs
on a fixture vit-pytorch wrote). As there, the model has no cls token: it averages the final normed
tokens; its position table has one row more than there are patches, which nothing reads (kept for
those checkpoints). Where ours differs: a `patch_merge_layer` outside 1..depth is refused
(vit-pytorch silently never merges for 0 or more than depth).
"""

import math

import torch
from einops import rearrange, repeat
from einops.layers.torch import Reduce
from torch import nn

from vit_pytorch import vit


class PatchMerger(nn.Module):
    """(b, n, dim) -> (b, num_tokens_out, dim): each learned query's softmax-weighted average of the normed tokens.

    The weights are softmax(queries . LayerNorm(x) / sqrt(dim)) over the n tokens, computed by `vit.attend` with
    the normed tokens as keys and values (one head); `fused` and `attention_probs` let the recorder see the map
    (b, 1, num_tokens_out, n).
    """

    def __init__(self, dim, num_tokens_out):
        check_merger_arguments(dim=dim, num_tokens_out=num_tokens_out)
        super().__init__()
        self.scale = dim ** -0.5
        self.fused = True
        self.norm = nn.LayerNorm(dim)
        self.queries = nn.Parameter(torch.randn(num_tokens_out, dim))
        self.attention_probs = nn.Identity()

    def forward(self, x):
        if x.ndim != 3 or x.shape[-1] != self.queries.shape[-1]:
            raise ValueError(f"PatchMerger takes tokens (batch, tokens, {self.queries.shape[-1]}), got "
                             f"{tuple(x.shape)}")
        x = rearrange(self.norm(x), 'b n d -> b 1 n d')
        queries = repeat(self.queries, 'k d -> b 1 k d', b=x.shape[0])
        merged = vit.attend(queries, x, x, scale=self.scale, fused=self.fused, probs=self.attention_probs)
        return rearrange(merged, 'b 1 k d -> b k d')


class Transformer(vit.Stack):
    """vit-pytorch's encoder with a PatchMerger after layer `patch_merge_layer` (counted from 1; default depth // 2),
    then a LayerNorm."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0., patch_merge_layer=None,
                 patch_merge_num_tokens=8):
        super().__init__([(vit.Attention(dim, heads, dim_head, dropout), vit.FeedForward(dim, mlp_dim, dropout))
                          for _ in range(depth)], norm=nn.LayerNorm(dim))
        self.patch_merge_layer_index = (depth // 2 if patch_merge_layer is None else patch_merge_layer) - 1
        self.patch_merger = PatchMerger(dim=dim, num_tokens_out=patch_merge_num_tokens)

    def step(self, entry, x, state):
        x = self.layer(entry, x)
        if entry is self.layers[self.patch_merge_layer_index]:
            x = self.patch_merger(x)
        return x, {}


class ViT(vit.TokenFace, nn.Module):
    """ViT whose tokens are merged into `patch_merge_num_tokens` after layer `patch_merge_layer`; see the module's
    docstring.

    `forward_features` returns the final normed tokens, (b, patch_merge_num_tokens, dim) (the merge layer's block
    output and every later one have that many tokens, the earlier ones h * w); `forward_head` averages them.
    `num_classes=0` makes `forward` return that average, (b, dim).
    """

    num_prefix_tokens = 0

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, patch_merge_layer=None,
                 patch_merge_num_tokens=8, channels=3, dim_head=64, dropout=0., emb_dropout=0.):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.channels, self.num_classes, self.embed_dim, self.num_features = channels, num_classes, dim, dim

        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim)
        # vit-pytorch's table has a row for a cls token the model does not have
        self.pos_embedding = nn.Parameter(torch.randn(1, math.prod(self.grid_size) + 1, dim))
        self.dropout = nn.Dropout(emb_dropout)
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout, patch_merge_layer,
                                       patch_merge_num_tokens)
        self.mlp_head = nn.Sequential(Reduce('b n d -> b d', 'mean'),
                                      *([nn.Linear(dim, num_classes)] if num_classes > 0 else []))

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def forward_features(self, img):
        """The final normed tokens after the merge: (b, patch_merge_num_tokens, dim)."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.pos_embedding.dtype)
        x = self.to_patch_embedding(img)
        x = self.dropout(x + self.pos_embedding[:, :x.shape[1]])
        return self.transformer(x)

    def forward_head(self, tokens, pre_logits=False):
        """The mean of the tokens (b, dim), or the logits."""
        x = self.mlp_head[0](tokens)
        return x if pre_logits or self.num_classes == 0 else self.mlp_head[1](x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the mean token)."""
        vit.non_negative_int('num_classes', num_classes)
        self.num_classes = num_classes
        head = [vit.zero_linear(self.embed_dim, num_classes, like=self.pos_embedding)] if num_classes > 0 else []
        self.mlp_head = nn.Sequential(self.mlp_head[0], *head)

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_merger_arguments(*, dim, num_tokens_out):
    vit.positive_int('dim', dim)
    vit.positive_int('num_tokens_out', num_tokens_out)


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, patch_merge_layer,
                    patch_merge_num_tokens, channels, dim_head, dropout, emb_dropout):
    vit.check_patches(image_size, patch_size)
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                    channels=channels, dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout)
    vit.positive_int('patch_merge_num_tokens', patch_merge_num_tokens)
    layer = depth // 2 if patch_merge_layer is None else vit.positive_int('patch_merge_layer', patch_merge_layer)
    if not 1 <= layer <= depth:
        raise ValueError(f"patch_merge_layer must be a layer of the encoder, 1 to depth={depth} (None: depth // 2), "
                         f"got {patch_merge_layer if patch_merge_layer is not None else layer}"
                         + (" (depth // 2 is 0 for depth 1: pass patch_merge_layer=1)" if patch_merge_layer is None
                            else ''))


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `vit_with_patch_merger.ViT` has our parameter names and computes the same function."""
    return None
