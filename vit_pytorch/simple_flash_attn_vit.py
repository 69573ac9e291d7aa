"""SimpleViT with a switch for fused attention: vit-pytorch's `vit_pytorch.simple_flash_attn_vit.SimpleViT`.

"Better plain ViT baselines for ImageNet-1k", Beyer, Zhai and Kolesnikov, arXiv 2205.01580, with
vit-pytorch's `use_flash` switch: True runs attention through `scaled_dot_product_attention`
("FlashAttention", Dao et al., arXiv 2205.14135, is one of its kernels; PyTorch picks the kernel for
the device and dtype), False forms the attention matrix explicitly. Here both are the two paths of
the package's one attention primitive, `vit_pytorch.vit.attend`: `use_flash` sets each attention
module's `fused` flag, which every model of the package already has (fused is the default
everywhere, so `vit_pytorch.simple_vit.SimpleViT` is already "flash"). Both give the same function.

    import torch
    from vit_pytorch.simple_flash_attn_vit import SimpleViT

    model = SimpleViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16,
                      mlp_dim=2048, use_flash=True)
    logits = model(torch.randn(2, 3, 256, 256))   # (2, 1000)

The arguments, parameter names and the function are vit-pytorch's (1.26.14), whose checkpoints load
unchanged. That model differs from `vit_pytorch.simple_vit.SimpleViT` (and from the paper's, whose
encoder ends with a LayerNorm before the pooling) in one place: the encoder has no final norm and the
head is a LayerNorm and a Linear applied to the mean of the tokens. Beyond vit-pytorch: its
`use_flash=False` path raises inside einops (1.26.14), ours computes the same function as True;
vit-pytorch picks SDPA kernels per GPU with the deprecated `torch.backends.cuda.sdp_kernel`, ours leaves
the choice to PyTorch; `num_classes=0` makes `forward` return the pooled, normed embedding (b, dim).
"""

from torch import nn

from vit_pytorch import simple_vit, vit


class SimpleViT(vit.TokenFace, vit.NormedHead, nn.Module):
    """SimpleViT whose attention is fused (`use_flash=True`) or explicit; see the module's docstring.

    `forward_features` returns the encoder's tokens (not normed), (b, h * w, dim).
    `num_classes=0` makes `forward` return the pooled embedding after the head's norm, (b, dim).
    """

    num_prefix_tokens = 0
    head_name = 'linear_head'

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 use_flash=True):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.grid_size = self.token_grid(self.image_size)
        self.channels, self.num_classes, self.embed_dim = channels, num_classes, dim

        self.to_patch_embedding = vit.PatchEmbedding(channels=channels, patch_size=self.patch_size, dim=dim)
        # fixed, so not saved; a buffer so that it follows .to(device)
        self.register_buffer('pos_embedding', simple_vit.posemb_sincos_2d(*self.grid_size, dim), persistent=False)
        self.transformer = vit.SimpleTransformer(dim, depth, heads, dim_head, mlp_dim, final_norm=False,
                                                 fused=use_flash)
        self.to_latent = nn.Identity()
        self.num_features = dim
        self.linear_head = vit.normed_head(dim, num_classes)

    def token_grid(self, image_size):
        """The (h, w) grid of patch tokens for images of `image_size` (h, w)."""
        return image_size[0] // self.patch_size[0], image_size[1] // self.patch_size[1]

    def embed(self, img):
        """Patch tokens with their sin-cos positions: (b, h * w, dim); any size divisible by the patch."""
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, dtype=self.pos_embedding.dtype)
        grid = self.token_grid(img.shape[-2:])
        positions = self.pos_embedding if grid == self.grid_size else \
            simple_vit.posemb_sincos_2d(*grid, self.embed_dim, device=img.device)
        return self.to_patch_embedding(img) + positions.to(img.dtype)

    def forward_features(self, img):
        """The encoder's tokens (not normed): (b, h * w, dim)."""
        return self.transformer(self.embed(img))

    def pooled(self, tokens):
        """The mean of the tokens: (b, dim), before the head's LayerNorm and Linear."""
        return self.to_latent(tokens.mean(dim=1))

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dim_head,
                    use_flash):
    simple_vit.check_arguments(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim,
                               depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                               attention=None)
    vit.boolean('use_flash', use_flash)
    if dim % 4 or dim < 8:
        raise ValueError(f"dim must be a multiple of 4 and at least 8 for the sin-cos position table, got {dim}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `simple_flash_attn_vit.SimpleViT` has our parameter names and computes the same function."""
    return None
