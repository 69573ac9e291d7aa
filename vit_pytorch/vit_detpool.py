"""ViT with detection pooling (DetPool): attend and pool over an object's patches only.

"Learning to Grasp Anything by Playing with Random Toys", Niu, Sharma, Shi et al., ICLR 2026
(openreview NZDaMcpXZm, arXiv 2510.12866), table 1: a grasping policy generalises from toys built of four
shape primitives to real objects when its visual representation is object-centric. DetPool makes it so:
given the target object's mask, every token attends only to the object's patches (and the cls token),
and the representation is the mean of the object's patch tokens; the rest of the image cannot reach it.

`object_mask` (True: the object) is per pixel (b, h, w), a patch holding the object where any of its
pixels does, or per patch, (b, h / ph, w / pw) or (b, patches). Without a mask the model is a plain ViT
with mean pooling, or it asks its `mask_generator` (a frozen module, run without gradients in eval mode,
such as a detector's segmenter) for one.

    import torch
    from vit_pytorch.vit_detpool import ViTDetPool

    model = ViTDetPool(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16,
                       mlp_dim=2048, dropout=0.1, emb_dropout=0.1)
    img = torch.randn(1, 3, 256, 256)
    object_mask = torch.zeros(1, 256, 256, dtype=torch.bool)
    object_mask[:, 64:160, 96:192] = True                 # the object's pixels
    logits = model(img, object_mask=object_mask)          # (1, 1000)

As in vit-pytorch's module, the cls token (without a position) takes part in attention but not in the
pooling. Unlike it, images must be of `image_size` (vit-pytorch adds the first rows of its position table
to a smaller image's patches, which are not their places), and a mask that holds no patch of an image is
refused by name (vit-pytorch returns the head's bias for it).
"""

import torch
from einops import rearrange, reduce, repeat
from torch import nn

from vit_pytorch import vit
from vit_pytorch.vit import pair


class ViTDetPool(vit.TokenFace, nn.Module):
    """ViT whose tokens attend to, and whose pooling reads, only the patches of `object_mask`.

    `forward_features(img, object_mask=None)` returns all tokens after the final norm, (b, prefix + h * w, dim),
    the cls token first when `use_cls_token`. `forward_head(tokens, pre_logits=False, object_mask=None)` takes
    the mask again (the one `forward` used: with a `mask_generator`, `model.object_mask(img)`). `num_classes=0`
    makes `forward` return all tokens, as in vit-pytorch; `forward_head(tokens, pre_logits=True, ...)` gives the
    pooled embedding (b, dim).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, use_cls_token=True,
                 channels=3, dim_head=64, dropout=0., emb_dropout=0., mask_generator=None):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = pair(image_size), pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.channels, self.num_classes, self.embed_dim, self.num_features = channels, num_classes, dim, dim
        self.use_cls_token = use_cls_token
        self.num_prefix_tokens = int(use_cls_token)

        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim)
        if use_cls_token:
            self.cls_token = nn.Parameter(torch.randn(dim) * 1e-2)              # vit-pytorch's initialisation
        self.pos_embedding = nn.Parameter(torch.randn(self.grid_size[0] * self.grid_size[1], dim) * 1e-2)
        self.dropout = nn.Dropout(emb_dropout)
        self.transformer = vit.Transformer(dim, depth, heads, dim_head, mlp_dim, dropout)
        self.to_latent = nn.Identity()
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else None
        self.mask_generator = mask_generator
        self.train()                                   # puts a generator given in training mode into eval mode

    def train(self, mode=True):
        """Training mode for the model; the mask generator stays in eval mode (it is frozen)."""
        super().train(mode)
        if self.mask_generator is not None:
            self.mask_generator.eval()
        return self

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def object_mask(self, img):
        """The mask generator's object mask for the images (computed without gradients), or None without one."""
        self.check_images(img)
        if self.mask_generator is None:
            return None
        with torch.no_grad():
            return self.mask_generator(img)

    def check_images(self, img):
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.pos_embedding.dtype)

    def patch_mask(self, object_mask, batch):
        """A pixel or patch `object_mask` as (batch, h * w) booleans, checked."""
        grid, pixels = self.grid_size, self.image_size
        check_object_mask(object_mask, batch, pixels, grid)
        if object_mask.ndim == 3 and tuple(object_mask.shape[1:]) == pixels:     # a patch holds any pixel's object
            mask = reduce(object_mask, 'b (h p1) (w p2) -> b (h w)', 'max', p1=self.patch_size[0],
                          p2=self.patch_size[1])
        else:
            mask = rearrange(object_mask, 'b ... -> b (...)')
        if not torch.compiler.is_compiling():          # a data-dependent check: eager mode only
            check_every_image_has_an_object(mask)
        return mask

    def forward_features(self, img, object_mask=None):
        """All tokens after the final norm, (b, prefix + h * w, dim); attention reads the object's patches only."""
        self.check_images(img)
        object_mask = self.object_mask(img) if object_mask is None else object_mask
        mask = None if object_mask is None else self.patch_mask(object_mask, img.shape[0])     # (b, h * w)
        x = self.to_patch_embedding(img) + self.pos_embedding                        # (b, h * w, dim)
        if self.use_cls_token:
            x = torch.cat((repeat(self.cls_token, 'd -> b 1 d', b=x.shape[0]), x), dim=1)
        x = self.dropout(x)
        if mask is None:
            return self.transformer(x)
        if self.use_cls_token:                         # every token may read the cls token
            mask = torch.cat((mask.new_ones(mask.shape[0], 1), mask), dim=1)
        return self.transformer(x, mask=rearrange(mask, 'b j -> b 1 1 j'))

    def forward_head(self, tokens, pre_logits=False, object_mask=None):
        """The mean of the object's patch tokens (every patch's without a mask), then the head."""
        patches = tokens[:, self.num_prefix_tokens:]                                 # (b, h * w, dim)
        if object_mask is None:
            pooled = patches.mean(dim=1)
        else:
            mask = rearrange(self.patch_mask(object_mask, tokens.shape[0]), 'b n -> b n 1')
            pooled = patches.masked_fill(~mask, 0.).sum(dim=1) / mask.sum(dim=1)
        x = self.to_latent(pooled)
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, img, object_mask=None):
        object_mask = self.object_mask(img) if object_mask is None else object_mask
        tokens = self.forward_features(img, object_mask)
        return tokens if self.mlp_head is None else self.forward_head(tokens, object_mask=object_mask)

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it: forward returns the tokens)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.pos_embedding)

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, use_cls_token, channels,
                    dim_head, dropout, emb_dropout, mask_generator):
    vit.check_patches(image_size, patch_size)
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                    channels=channels, dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout)
    vit.boolean('use_cls_token', use_cls_token)
    if mask_generator is not None and not isinstance(mask_generator, nn.Module):
        raise TypeError(f"mask_generator must be a torch.nn.Module that maps images to object masks, or None, "
                        f"got {type(mask_generator).__name__}")


def check_object_mask(object_mask, batch, pixels, grid):
    """A boolean tensor of one of the three shapes a mask may take."""
    shapes = [(batch, *pixels), (batch, *grid), (batch, grid[0] * grid[1])]
    expected = f"(b, h, w) pixels {shapes[0]}, (b, h / ph, w / pw) patches {shapes[1]} or (b, patches) {shapes[2]}"
    if not isinstance(object_mask, torch.Tensor) or object_mask.dtype != torch.bool:
        got = f"dtype {object_mask.dtype}" if isinstance(object_mask, torch.Tensor) else type(object_mask).__name__
        raise TypeError(f"object_mask must be a boolean tensor (True: the object) of shape {expected}, got {got}")
    if tuple(object_mask.shape) not in shapes:
        raise ValueError(f"object_mask must have shape {expected}, got {tuple(object_mask.shape)}")


def check_every_image_has_an_object(mask):
    empty = (~mask.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"object_mask holds no patch of image(s) {empty}: there is nothing to attend to and pool "
                         f"(pass a mask with at least one True pixel or patch for each image)")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's ViTDetPool has our parameter names and computes the same function on images of its
    image_size with masks that hold a patch of each image."""
    return None
