"""SimMIM: simple masked image modelling.

"SimMIM: A Simple Framework for Masked Image Modeling", Xie et al., arXiv 2111.09886: replace a
random subset of the patch embeddings by a learned mask token before the position embeddings are
added, run the whole encoder on every token, and predict each hidden patch's raw pixels from its
output token with one linear layer; the loss is the L1 distance on the hidden pixels only.
Unlike MAE the encoder sees every position (the hidden ones as mask tokens) and there is no decoder.

    import torch
    from vit_pytorch import ViT
    from vit_pytorch.simmim import SimMIM

    encoder = ViT(image_size=32, patch_size=4, num_classes=10, dim=64, depth=4, heads=4, mlp_dim=128)
    mim = SimMIM(encoder=encoder, masking_ratio=0.5)
    images = torch.rand(8, 3, 32, 32)
    loss = mim(images)                                  # L1 on the pixels of the 32 hidden patches of each image
    loss.backward()
    prediction, mask = mim.predict(images)              # (8, 64, 48) pixels of every patch, (8, 64) True: hidden
    masked, reconstruction = mim.reconstruct(images)    # (8, 3, 32, 32) each

The encoder is used only through its public face, the same for `ViT` and `SimpleViT`:
`patch_tokens`, `embed_tokens`, `transformer`, `token_grid`, `num_prefix_tokens`, `patch_size`,
`channels` and `embed_dim`. It works with `ViT` (cls or mean pooling), `SimpleViT` and the variants
that keep that face (registers, QK-norm, DeiT's distillable ViT, DeepViT, the parallel ViT); not
with patch dropout while training (a ValueError says why), nor with the small-dataset ViT, whose
shifted patch tokenization shows each token half of its hidden neighbours.

Differences: the loss is the mean absolute error over the hidden pixel values, as the paper's code
and Hugging Face's `ViTForMaskedImageModeling` (whose reconstruction and loss the tests reproduce on
a committed fixture; its 1x1 convolution and pixel shuffle are this linear head with its rows in
another order); vit-pytorch divides that mean once more by the number of hidden patches, and leaves
the cls token out of the encoder. The mask hides patches of the model's patch size (the paper also
masks 32-pixel blocks of 16-pixel patches); `masking_ratio` defaults to vit-pytorch's 0.5 (the
paper's ViT uses 0.6). `forward(img, mask=...)` takes a given mask, Hugging Face's `bool_masked_pos`.
"""

import torch
from einops import rearrange
from torch import nn

from vit_pytorch import vit


class SimMIM(nn.Module):
    """`forward(img)` returns the loss; `predict` the pixels of every patch and the mask."""

    def __init__(self, *, encoder, masking_ratio=0.5):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.encoder = encoder
        self.masking_ratio = float(masking_ratio)
        patch_dim = encoder.channels * encoder.patch_size[0] * encoder.patch_size[1]
        self.mask_token = nn.Parameter(torch.zeros(encoder.embed_dim))
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        self.to_pixels = nn.Linear(encoder.embed_dim, patch_dim)

    def patchify(self, img):
        """(b, c, h, w) -> (b, patches, ph * pw * c): each patch's pixels, in the order of the patch embedding."""
        ph, pw = self.encoder.patch_size
        return rearrange(img, 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=ph, p2=pw)

    def unpatchify(self, patches, grid):
        ph, pw = self.encoder.patch_size
        return rearrange(patches, 'b (h w) (p1 p2 c) -> b c (h p1) (w p2)', h=grid[0], p1=ph, p2=pw)

    def random_mask(self, batch_size, num_patches, *, device):
        """(b, n) booleans, True on `int(n * masking_ratio)` random patches of each image."""
        hidden = int(num_patches * self.masking_ratio)
        if hidden < 1:
            raise ValueError(f"masking_ratio {self.masking_ratio} hides none of the {num_patches} patches of these "
                             f"images; raise it or use smaller patches")
        chosen = torch.rand(batch_size, num_patches, device=device).argsort(dim=1)[:, :hidden]
        return torch.zeros(batch_size, num_patches, dtype=torch.bool, device=device).scatter(1, chosen, True)

    def predict(self, img, *, mask=None):
        """Predicted pixels of every patch (b, n, ph * pw * c) and the mask (b, n), True where hidden."""
        encoder, prefix = self.encoder, self.encoder.num_prefix_tokens
        patches = encoder.patch_tokens(img)                                                # (b, n, dim)
        batch_size, num_patches, _ = patches.shape
        if mask is None:
            mask = self.random_mask(batch_size, num_patches, device=img.device)
        elif mask.shape != (batch_size, num_patches) or mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor of shape (batch, patches) = {(batch_size, num_patches)}, "
                             f"got {mask.dtype} {tuple(mask.shape)}")
        patches = torch.where(mask[..., None], self.mask_token.to(patches.dtype), patches)
        tokens = encoder.embed_tokens(patches, encoder.token_grid(img.shape[-2:]))
        if tokens.shape[1] != prefix + num_patches:
            raise ValueError(f"the encoder's embed_tokens returned {tokens.shape[1]} tokens for {prefix} prefix tokens "
                             f"and {num_patches} patches (does it drop patches in training, as patch dropout does?); "
                             f"SimMIM predicts every hidden patch from its own token")
        return self.to_pixels(encoder.transformer(tokens)[:, prefix:]), mask

    def loss(self, prediction, img, mask):
        """Mean absolute error over the pixel values of the hidden patches."""
        per_patch = (prediction - self.patchify(img)).abs().mean(dim=-1)                 # (b, n)
        return (per_patch * mask).sum() / mask.sum()

    def forward(self, img, *, mask=None):
        prediction, mask = self.predict(img, mask=mask)
        return self.loss(prediction, img, mask)

    @torch.no_grad()
    def reconstruct(self, img, *, mask=None):
        """(masked images, reconstructions), each (b, c, h, w): hidden patches zero in the first, predicted in
        the second (which shows the input on the visible patches)."""
        prediction, mask = self.predict(img, mask=mask)
        patches, grid = self.patchify(img), self.encoder.token_grid(img.shape[-2:])
        hidden = mask[..., None]
        return (self.unpatchify(patches.masked_fill(hidden, 0.), grid),
                self.unpatchify(torch.where(hidden, prediction.to(patches.dtype), patches), grid))


# argument checks

FACE = ('patch_tokens', 'embed_tokens', 'transformer', 'token_grid', 'num_prefix_tokens', 'patch_size', 'channels',
        'embed_dim')


def check_arguments(*, encoder, masking_ratio):
    missing = [attribute for attribute in FACE if not hasattr(encoder, attribute)]
    if missing:
        raise TypeError(f"encoder must be a ViT or SimpleViT (or a variant with their public face); "
                        f"{type(encoder).__name__} has no {', '.join(missing)}")
    if vit.probability('masking_ratio', masking_ratio) == 0:
        raise ValueError("masking_ratio must be in (0, 1): the fraction of patches replaced by the mask token, got 0")
