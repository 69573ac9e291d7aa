"""3D SimpleViT with a switch for fused attention: vit-pytorch's `vit_pytorch.simple_flash_attn_vit_3d.SimpleViT`.

SimpleViT ("Better plain ViT baselines for ImageNet-1k", arXiv 2205.01580) on tubelets of a video
or volume, with vit-pytorch's `use_flash_attn` switch: True runs attention through
`scaled_dot_product_attention` (FlashAttention, arXiv 2205.14135, among its kernels), False forms
the attention matrix. Both are the two paths of the package's one attention primitive,
`vit_pytorch.vit.attend` (each attention module's `fused` flag), and give the same function.

    import torch
    from vit_pytorch.simple_flash_attn_vit_3d import SimpleViT

    model = SimpleViT(image_size=128, image_patch_size=16, frames=16, frame_patch_size=2,
                      num_classes=1000, dim=1024, depth=6, heads=8, mlp_dim=2048, use_flash_attn=True)
    logits = model(torch.randn(2, 3, 16, 128, 128))   # (2, 1000)

The arguments, parameter names and the function are vit-pytorch's (1.26.14), whose checkpoints load
unchanged. That model differs from `vit_pytorch.simple_vit_3d.SimpleViT` (and from the paper's, whose
encoder ends with a LayerNorm) in one place: there is no final norm at all; the head is a Linear on
the mean of the tokens. Beyond vit-pytorch: its `use_flash_attn=False` path raises inside einops
(1.26.14), ours computes the same function; other clip sizes divisible by the tubelet work;
`num_classes=0` makes `forward` return the pooled embedding (b, dim).
"""

from torch import nn

from vit_pytorch import simple_vit_3d, vit


class SimpleViT(vit.TokenFace, nn.Module):
    """3D SimpleViT whose attention is fused (`use_flash_attn=True`) or explicit; see the module's docstring.

    `forward_features` returns the encoder's tokens (not normed), (b, f * h * w, dim).
    `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    """

    num_prefix_tokens = 0

    def __init__(self, *, image_size, image_patch_size, frames, frame_patch_size, num_classes, dim, depth, heads,
                 mlp_dim, channels=3, dim_head=64, use_flash_attn=True):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(image_patch_size)
        self.frames, self.frame_patch_size = frames, frame_patch_size
        self.grid_size = self.token_grid((frames, *self.image_size))
        self.channels, self.num_classes, self.embed_dim = channels, num_classes, dim

        self.to_patch_embedding = vit.TubeletEmbedding(channels=channels, patch_size=self.patch_size,
                                                       frame_patch_size=frame_patch_size, dim=dim)
        # fixed, so not saved; a buffer so that it follows .to(device)
        self.register_buffer('pos_embedding', simple_vit_3d.posemb_sincos_3d(*self.grid_size, dim), persistent=False)
        self.transformer = vit.SimpleTransformer(dim, depth, heads, dim_head, mlp_dim, final_norm=False,
                                                 fused=use_flash_attn)
        self.to_latent = nn.Identity()
        self.num_features = dim
        self.linear_head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def token_grid(self, size):
        """The (frames, h, w) tubelet grid for videos of `size` (frames, h, w)."""
        return vit.tubelet_grid(size, patch_size=self.patch_size, frame_patch_size=self.frame_patch_size)

    def embed(self, video):
        """Tubelet tokens with their sin-cos positions: (b, f * h * w, dim); any size divisible by the tubelet."""
        vit.check_video(video, channels=self.channels, patch_size=self.patch_size,
                        frame_patch_size=self.frame_patch_size, dtype=self.pos_embedding.dtype)
        grid = tuple(self.token_grid(video.shape[2:]))
        positions = self.pos_embedding if grid == tuple(self.grid_size) else \
            simple_vit_3d.posemb_sincos_3d(*grid, self.embed_dim, device=video.device)
        return self.to_patch_embedding(video) + positions.to(video.dtype)

    def forward_features(self, video):
        """The encoder's tokens (not normed): (b, f * h * w, dim)."""
        return self.transformer(self.embed(video))

    def forward_head(self, tokens, pre_logits=False):
        """Mean of the tokens, then the head."""
        x = self.to_latent(tokens.mean(dim=1))
        return x if pre_logits else self.linear_head(x)

    def forward(self, video):
        return self.forward_head(self.forward_features(video))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0: forward returns the pooled embedding)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.pos_embedding,
                       name='linear_head', removed=nn.Identity())

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, image_size, image_patch_size, frames, frame_patch_size, num_classes, dim, depth, heads,
                    mlp_dim, channels, dim_head, use_flash_attn):
    simple_vit_3d.check_arguments(image_size=image_size, image_patch_size=image_patch_size, frames=frames,
                                  frame_patch_size=frame_patch_size, num_classes=num_classes, dim=dim, depth=depth,
                                  heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head)
    vit.boolean('use_flash_attn', use_flash_attn)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `simple_flash_attn_vit_3d.SimpleViT` has our parameter names and computes the same function."""
    return None
