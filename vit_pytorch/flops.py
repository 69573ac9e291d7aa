"""FLOPs of a model's training step and forward pass, counted by `torch.utils.flop_counter`.

The counter sees the matrix products of attention only on the explicit path, so the count runs
on a copy of the model with every attention module's `fused` switched off. A convolution's
backward is counted as each gradient it computes costing one forward (torch's own formula
counts a grouped convolution's weight gradient `groups` times over).

    from vit_pytorch import ViT
    from vit_pytorch.flops import training_flops

    model = ViT(image_size=32, patch_size=8, num_classes=10, dim=64, depth=2, heads=2, mlp_dim=128)
    train_step, forward = training_flops(model, 32, num_classes=10)   # FLOPs per image
"""

import copy

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

__all__ = ['explicit_attention', 'conv_backward_flops', 'FLOP_FORMULAS', 'training_flops']


def explicit_attention(model):
    """`model` with every attention module on its explicit path (the flop counter misses fused attention)."""
    for module in model.modules():
        if isinstance(getattr(module, 'fused', None), bool):
            module.fused = False
    return model


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                        _output_padding, _groups, output_mask, out_shape=None, **kwargs):
    """A convolution's backward: each gradient asked for costs what the forward does.

    torch's own formula ignores `groups` in the weight gradient, which counts a depthwise
    convolution's backward about `groups` times over (XCiT's local patch interaction).
    """
    return conv_flop_count(x_shape, w_shape, grad_out_shape, transposed) * (bool(output_mask[0]) + bool(output_mask[1]))


FLOP_FORMULAS = {torch.ops.aten.convolution_backward: conv_backward_flops}


def classification_loss(model, img, labels):
    return F.cross_entropy(model(img), labels)


def training_flops(model, image_size, *, channels=3, num_classes=1000, loss=classification_loss):
    """FLOPs of one training step (forward + loss + backward) per image, and of an inference forward alone.

    `image_size` is an int (square images) or the input's sizes after the channels: a signal's
    (length,), a clip's (frames, h, w). `loss(model, img, labels)` is the step's loss (default:
    cross-entropy of the logits). Counted on two inputs and halved: a BatchNorm cannot train on
    one value per channel (LeViT's head).
    """
    sizes = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    img = torch.randn(2, channels, *sizes)
    label = torch.randint(0, num_classes, (2,))
    model = explicit_attention(copy.deepcopy(model)).eval()
    # with autograd on: under no_grad, the counter's module tracker rejects a parameter's view
    # (CaiT's expanded cls token); the forward's FLOPs are the same either way
    with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as counter:
        model(img)
    forward = counter.get_total_flops()
    model.train()
    with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as counter:
        loss(model, img, label).backward()
    return counter.get_total_flops() / 2, forward / 2
