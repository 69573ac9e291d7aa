"""MaxViT with register tokens: vit-pytorch's `vit_pytorch.max_vit_with_registers.MaxViT`.

"MaxViT: Multi-Axis Vision Transformer", Tu et al., arXiv 2204.01697, with registers ("Vision
Transformers Need Registers", Darcet et al., arXiv 2309.16588): each block has `num_register_tokens`
learned tokens that join every window of its block attention, and their mean over the windows joins
every window of its grid attention; they are dropped after it. This is `vit_pytorch.max_vit.MaxViT`
with vit-pytorch's arguments and its default of 4 registers (see `MaxViTBlock` there).

    import torch
    from vit_pytorch.max_vit_with_registers import MaxViT

    model = MaxViT(num_classes=1000, dim_conv_stem=64, dim=96, dim_head=32, depth=(2, 2, 5, 2),
                   window_size=7, mbconv_expansion_rate=4, mbconv_shrinkage_rate=0.25, dropout=0.1,
                   num_register_tokens=4)
    logits = model(torch.randn(1, 3, 224, 224))   # (1, 1000)

As `vit_pytorch.max_vit` says, the network is the official (TensorFlow) MaxViT, as the paper's code and
timm's `maxvit_*_tf_*` hold it; vit-pytorch's MaxViT, with the same keyword arguments, builds another
network (its stem, MBConv, position table and head differ), so its checkpoints are refused with what
differs (`vit_pytorch.pretrained.load_vit_pytorch`). The options beyond vit-pytorch's are max_vit's.
"""

from vit_pytorch import max_vit


class MaxViT(max_vit.MaxViT):
    """`vit_pytorch.max_vit.MaxViT` with 4 register tokens per block by default.

    `forward_features` returns the last stage's map (b, c, h, w), as `max_vit.MaxViT`.
    `num_classes=0` makes `forward` return the pooled embedding (b, num_features).
    """

    def __init__(self, *, num_classes, dim, depth, dim_head=32, dim_conv_stem=None, window_size=7,
                 mbconv_expansion_rate=4, mbconv_shrinkage_rate=0.25, dropout=0.1, channels=3, num_register_tokens=4,
                 layer_dropout=0., pre_logits=True):
        super().__init__(num_classes=num_classes, dim=dim, depth=depth, dim_head=dim_head, dim_conv_stem=dim_conv_stem,
                         window_size=window_size, mbconv_expansion_rate=mbconv_expansion_rate,
                         mbconv_shrinkage_rate=mbconv_shrinkage_rate, dropout=dropout, channels=channels,
                         num_register_tokens=num_register_tokens, layer_dropout=layer_dropout, pre_logits=pre_logits)
