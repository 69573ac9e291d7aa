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

from functools import partial

from vit_pytorch import simple_vit_3d, vit


class SimpleViT(simple_vit_3d.SimpleViT):
    """3D SimpleViT whose attention is fused (`use_flash_attn=True`) or explicit; see the module's docstring.

    `forward_features` returns the encoder's tokens (not normed), (b, f * h * w, dim).
    `num_classes=0` makes `forward` return the pooled embedding (b, dim).
    """

    def __init__(self, *, image_size, image_patch_size, frames, frame_patch_size, num_classes, dim, depth, heads,
                 mlp_dim, channels=3, dim_head=64, use_flash_attn=True):
        check_arguments(use_flash_attn=use_flash_attn)
        # vit-pytorch's flash 3D SimpleViT: the 3D SimpleViT without its final norm
        super().__init__(image_size=image_size, image_patch_size=image_patch_size, frames=frames,
                         frame_patch_size=frame_patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head,
                         transformer=partial(vit.SimpleTransformer, final_norm=False, fused=use_flash_attn))


# argument checks


def check_arguments(*, use_flash_attn):
    """The switch; the 3D SimpleViT's constructor checks the rest."""
    vit.boolean('use_flash_attn', use_flash_attn)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `simple_flash_attn_vit_3d.SimpleViT` has our parameter names and computes the same function."""
    return None
