"""MAE: masked autoencoders.

"Masked Autoencoders Are Scalable Vision Learners", He et al., arXiv 2111.06377: hide a large
random subset of the patches (75 %), run the encoder on the visible patches only, and let a
light decoder, which gets the encoded visible tokens and a shared mask token at every hidden
position (each with its own position embedding), predict the hidden patches' pixels. The loss is
the mean squared error on the hidden patches only, optionally against each patch normalised by
its own mean and standard deviation (`norm_pix_loss=True`, the paper's best setting). After
pre-training the decoder is thrown away and the encoder is fine-tuned.

    import torch
    from vit_pytorch import ViT
    from vit_pytorch.mae import MAE

    encoder = ViT(image_size=32, patch_size=4, num_classes=10, dim=64, depth=4, heads=4, mlp_dim=128)
    mae = MAE(encoder=encoder, decoder_dim=64, masking_ratio=0.75, decoder_depth=2, decoder_heads=4,
              decoder_dim_head=16)
    images = torch.rand(8, 3, 32, 32)
    loss = mae(images)                                  # MSE on the 48 hidden patches of each image
    loss.backward()
    prediction, mask = mae.predict(images)              # (8, 64, 48) pixels of every patch, (8, 64) True: hidden
    masked, reconstruction = mae.reconstruct(images)    # pictures as the paper's figure 2

The encoder is used only through its public face, the same for `ViT` and `SimpleViT`:
`patch_tokens`, `embed_tokens(patches, grid, indices)` (the visible patches at their positions,
after the prefix tokens), `transformer`, `token_grid`, `num_prefix_tokens`, `patch_size`,
`channels`, `image_size` and `embed_dim`. It works with `ViT` (cls or mean pooling), `SimpleViT`
and the variants that keep that face: registers, QK-norm, DeiT's distillable ViT (its prefix
tokens go through the encoder and the decoder as the cls token does), DeepViT, the parallel ViT.
Not with the small-dataset ViT (its shifted patch tokenization shows each visible token half of
its hidden neighbours) nor with patch dropout while training (it drops visible tokens the
decoder needs; a ValueError says so).

Differences: as the paper's code and Hugging Face's `ViTMAEForPreTraining` (whose outputs these
tests reproduce on a committed fixture), the prefix tokens (cls) go through the decoder, the
decoder's position table is the paper's fixed 2D sin-cos table (`sincos_2d`: frequencies
10000 ** -(i / (d / 4)), column before row, as its util/pos_embed.py; zeros for the prefix rows;
not SimpleViT's table, whose frequencies differ), and `int(n * (1 - masking_ratio))` patches
stay visible; vit-pytorch drops the cls token, learns the decoder's positions and hides
`int(n * masking_ratio)` patches. The decoder (`mae.decoder`, a
`vit.Transformer` of `decoder_depth` pre-norm layers with MLP width 4 x `decoder_dim`, then a
LayerNorm) has vit-pytorch's blocks: no qkv bias, LayerNorm epsilon 1e-5; assign another
`vit.Transformer(...)` to `mae.decoder` for the paper's (qkv bias, epsilon 1e-6).
"""

import torch
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import vit


class MAE(nn.Module):
    """`forward(img)` returns the loss; `predict` the pixels of every patch and the mask."""

    def __init__(self, *, encoder, decoder_dim, masking_ratio=0.75, decoder_depth=1, decoder_heads=8,
                 decoder_dim_head=64, norm_pix_loss=False):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.encoder = encoder
        self.masking_ratio = float(masking_ratio)
        self.norm_pix_loss = norm_pix_loss
        patch_dim = encoder.channels * encoder.patch_size[0] * encoder.patch_size[1]

        self.enc_to_dec = nn.Linear(encoder.embed_dim, decoder_dim) if encoder.embed_dim != decoder_dim \
            else nn.Identity()
        self.mask_token = nn.Parameter(torch.zeros(decoder_dim))
        nn.init.normal_(self.mask_token, std=0.02)
        # fixed, as the paper's; kept for the encoder's training grid, made for any other grid on the fly
        self.grid_size = encoder.token_grid(encoder.image_size)
        self.register_buffer('decoder_pos_embedding', decoder_table(encoder.num_prefix_tokens, self.grid_size,
                                                                    decoder_dim), persistent=False)
        self.decoder = vit.Transformer(decoder_dim, decoder_depth, decoder_heads, decoder_dim_head, decoder_dim * 4)
        self.to_pixels = nn.Linear(decoder_dim, patch_dim)

    def decoder_positions(self, grid):
        """The decoder's position table for an (h, w) grid: (prefix + h * w, decoder_dim)."""
        if tuple(grid) == self.grid_size:
            return self.decoder_pos_embedding
        return decoder_table(self.encoder.num_prefix_tokens, grid, self.decoder_pos_embedding.shape[-1],
                             device=self.decoder_pos_embedding.device)

    def patchify(self, img):
        """(b, c, h, w) -> (b, patches, ph * pw * c): each patch's pixels, in the order of the patch embedding."""
        ph, pw = self.encoder.patch_size
        return rearrange(img, 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=ph, p2=pw)

    def unpatchify(self, patches, grid):
        ph, pw = self.encoder.patch_size
        return rearrange(patches, 'b (h w) (p1 p2 c) -> b c (h p1) (w p2)', h=grid[0], p1=ph, p2=pw)

    def random_mask(self, batch_size, num_patches, *, device, noise=None):
        """(visible indices (b, keep), mask (b, n), True where hidden): the `keep` patches of lowest noise stay."""
        keep = int(num_patches * (1 - self.masking_ratio))
        if keep < 1:
            raise ValueError(f"masking_ratio {self.masking_ratio} hides all {num_patches} patches of these images; "
                             f"lower it or use smaller patches")
        if noise is None:
            noise = torch.rand(batch_size, num_patches, device=device)
        elif noise.shape != (batch_size, num_patches):
            raise ValueError(f"noise must have shape (batch, patches) = {(batch_size, num_patches)}, "
                             f"got {tuple(noise.shape)}")
        visible = noise.argsort(dim=1)[:, :keep]                                          # (b, keep)
        mask = torch.ones(batch_size, num_patches, dtype=torch.bool, device=device).scatter(1, visible, False)
        return visible, mask

    def predict(self, img, *, noise=None):
        """Predicted pixels of every patch (b, n, ph * pw * c) and the mask (b, n), True where hidden.

        `noise` (b, n) fixes the mask (the patches of lowest noise stay visible), as Hugging Face's `noise=`.
        """
        encoder, prefix = self.encoder, self.encoder.num_prefix_tokens
        patches = encoder.patch_tokens(img)                                                # (b, n, dim)
        batch_size, num_patches, dim = patches.shape
        grid = encoder.token_grid(img.shape[-2:])
        visible, mask = self.random_mask(batch_size, num_patches, device=img.device, noise=noise)
        tokens = encoder.embed_tokens(patches.gather(1, repeat(visible, 'b k -> b k d', d=dim)), grid,
                                      indices=visible)                                     # (b, prefix + keep, dim)
        if tokens.shape[1] != prefix + visible.shape[1]:
            raise ValueError(f"the encoder's embed_tokens returned {tokens.shape[1]} tokens for {prefix} prefix tokens "
                             f"and {visible.shape[1]} visible patches (does it drop patches in training, as patch "
                             f"dropout does?); MAE's decoder needs every visible token")
        encoded = self.enc_to_dec(encoder.transformer(tokens))                              # (b, prefix + keep, dd)

        # every hidden cell gets the mask token, every visible cell its encoded token
        cells = repeat(self.mask_token, 'd -> b n d', b=batch_size, n=num_patches).to(encoded.dtype)
        cells = cells.scatter(1, repeat(visible, 'b k -> b k d', d=encoded.shape[-1]), encoded[:, prefix:])
        x = torch.cat((encoded[:, :prefix], cells), dim=1) + self.decoder_positions(grid).to(encoded.dtype)
        return self.to_pixels(self.decoder(x)[:, prefix:]), mask

    def target(self, img):
        """What the decoder learns to predict: each patch's pixels, normalised per patch if `norm_pix_loss`."""
        patches = self.patchify(img)
        if not self.norm_pix_loss:
            return patches
        mean, var = patches.mean(dim=-1, keepdim=True), patches.var(dim=-1, keepdim=True)
        return (patches - mean) / (var + 1e-6).sqrt()

    def loss(self, prediction, target, mask):
        """Mean squared error per patch, averaged over the hidden patches only."""
        per_patch = (prediction - target).pow(2).mean(dim=-1)                             # (b, n)
        return (per_patch * mask).sum() / mask.sum()

    def forward(self, img, *, noise=None):
        prediction, mask = self.predict(img, noise=noise)
        return self.loss(prediction, self.target(img), mask)

    @torch.no_grad()
    def reconstruct(self, img, *, noise=None):
        """(masked images, reconstructions), each (b, c, h, w), as the paper's figure 2.

        Hidden patches are zero in the first; the second shows the prediction on the hidden patches
        and the input on the visible ones. With `norm_pix_loss` the predictions are brought back to
        each hidden patch's own mean and standard deviation, as the paper's visualisation does.
        """
        prediction, mask = self.predict(img, noise=noise)
        patches = self.patchify(img)
        if self.norm_pix_loss:
            mean, var = patches.mean(dim=-1, keepdim=True), patches.var(dim=-1, keepdim=True)
            prediction = prediction * (var + 1e-6).sqrt() + mean
        grid = self.encoder.token_grid(img.shape[-2:])
        hidden = mask[..., None]
        masked = self.unpatchify(patches.masked_fill(hidden, 0.), grid)
        reconstruction = self.unpatchify(torch.where(hidden, prediction.to(patches.dtype), patches), grid)
        return masked, reconstruction


def sincos_2d(height, width, dim, temperature=10000, device=None):
    """The MAE paper's fixed 2D sin-cos table, (height * width, dim), rows in row-major grid order.

    A quarter of the channels each holds sin(x w), cos(x w), sin(y w), cos(y w) for column x and
    row y, with frequencies w = temperature ** -(i / (dim / 4)), i = 0 .. dim / 4 - 1: the paper's
    util/pos_embed.py, and Hugging Face's ViTMAE once its halves are swapped back as its code does.
    SimpleViT's `posemb_sincos_2d` has vit-pytorch's w = temperature ** -(i / (dim / 4 - 1)).
    Computed in float64 as the paper's numpy code (float32 on MPS, which has no float64).
    """
    work = torch.float32 if torch.device(device or 'cpu').type == 'mps' else torch.float64
    y, x = torch.meshgrid(torch.arange(height, dtype=work, device=device),
                          torch.arange(width, dtype=work, device=device), indexing='ij')
    omega = temperature ** -(torch.arange(dim // 4, dtype=work, device=device) / (dim // 4))   # (dim / 4,)
    x = rearrange(x, 'h w -> (h w) 1') * omega                                          # (h * w, dim / 4)
    y = rearrange(y, 'h w -> (h w) 1') * omega
    return torch.cat((x.sin(), x.cos(), y.sin(), y.cos()), dim=1).float()


def decoder_table(num_prefix_tokens, grid, dim, device=None):
    """Zeros for the prefix tokens, then the paper's 2D sin-cos table of the (h, w) grid: (prefix + h * w, dim)."""
    table = sincos_2d(*grid, dim, device=device)
    return torch.cat((table.new_zeros(num_prefix_tokens, dim), table))


# argument checks

FACE = ('patch_tokens', 'embed_tokens', 'transformer', 'token_grid', 'num_prefix_tokens', 'patch_size', 'channels',
        'image_size', 'embed_dim')


def check_arguments(*, encoder, decoder_dim, masking_ratio, decoder_depth, decoder_heads, decoder_dim_head,
                    norm_pix_loss):
    missing = [attribute for attribute in FACE if not hasattr(encoder, attribute)]
    if missing:
        raise TypeError(f"encoder must be a ViT or SimpleViT (or a variant with their public face); "
                        f"{type(encoder).__name__} has no {', '.join(missing)}")
    for name, value in dict(decoder_dim=decoder_dim, decoder_depth=decoder_depth, decoder_heads=decoder_heads,
                            decoder_dim_head=decoder_dim_head).items():
        vit.positive_int(name, value)
    if decoder_dim % 4:
        raise ValueError(f"decoder_dim must be a multiple of 4 (the decoder's 2D sin-cos positions), got {decoder_dim}")
    if vit.probability('masking_ratio', masking_ratio) == 0:
        raise ValueError("masking_ratio must be in (0, 1): the fraction of patches hidden from the encoder, got 0")
    vit.boolean('norm_pix_loss', norm_pix_loss)
