"""SimpleViT with register tokens.

"Vision Transformers Need Registers", Darcet, Oquab, Mairal and Bojanowski, arXiv 2309.16588:
large ViTs repurpose a few uninformative patch tokens as scratch space for global computation,
which leaves high-norm artefacts in their attention maps; a few extra learned tokens
("registers") take over that role. They enter the transformer with the patch tokens, take part
in attention like any token, and are discarded at the output.

Here the registers (learned, without position embedding) come first in the sequence;
`forward_features` returns them with the patch tokens, and `forward_head` drops them before
the mean pooling. Everything else is `vit_pytorch.simple_vit.SimpleViT`.

    import torch
    from vit_pytorch.simple_vit_with_register_tokens import SimpleViT

    model = SimpleViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6,
                      heads=16, mlp_dim=2048, num_register_tokens=4)
    logits = model(torch.randn(1, 3, 256, 256))           # (1, 1000)
    tokens = model.forward_features(torch.randn(1, 3, 256, 256))
    registers, patches = tokens[:, :4], tokens[:, 4:]     # (1, 4, 1024), (1, 64, 1024)
"""

from torch import nn

from vit_pytorch import simple_vit, vit


class SimpleViT(simple_vit.Registers, simple_vit.SimpleViT):
    """SimpleViT with `num_register_tokens` registers; `num_classes=0` returns the pooled embedding.

    `forward_features` returns all tokens after the final norm, (b, registers + h * w, dim).
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim,
                 num_register_tokens=4, channels=3, dim_head=64):
        vit.positive_int('num_register_tokens', num_register_tokens)
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim,
                         depth=depth, heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head)
        self.add_registers(num_register_tokens, dim, lambda tokens: nn.init.trunc_normal_(tokens, std=0.02))
