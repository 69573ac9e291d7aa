"""Embeddings out of a model, with vit-pytorch's `vit_pytorch.extractor.Extractor` API.

`Extractor(vit)(img)` runs the model and returns `(logits, embeddings)`: the output of one of
its modules (by default the child named 'transformer', i.e. all tokens after the encoder), caught
by a forward hook. The arguments, their order and defaults, and the return values are
vit-pytorch's (1.26.14):

  device                  where the embeddings are moved (None: the input's device)
  layer                   the module whose output is taken (overrides `layer_name`)
  layer_name              the name of that module in the model ('transformer'); a dotted path
                          such as 'transformer.layers.2' works too
  layer_save_input        take the module's positional inputs instead (a tuple, as in vit-pytorch)
  return_embeddings_only  return the embeddings alone (also a keyword of `forward`)
  detach                  clone and detach the embeddings (False: keep them in the graph)

A tuple output is kept whole: CrossViT's `multi_scale_encoder` gives both branches
(small tokens, large tokens). The hook is registered on the first call and stays until `eject()`,
which removes it and hands back the model.

    import torch
    from vit_pytorch import ViT
    from vit_pytorch.extractor import Extractor

    model = ViT(image_size=32, patch_size=8, num_classes=10, dim=64, depth=2, heads=4, mlp_dim=128)
    extractor = Extractor(model)
    logits, embeddings = extractor(torch.randn(2, 3, 32, 32))   # (2, 10), (2, 17, 64)
    model = extractor.eject()

Differences from vit-pytorch: a missing `layer_name` is a ValueError naming the model's children
(vit-pytorch asserts), and a call after `eject()` is a RuntimeError. `vit_pytorch.recorder.Extractor`
is the package's own, context-manager form (it reads `forward_features` by default).
"""

from torch import nn

from vit_pytorch import vit as core   # `vit` is vit-pytorch's name for the model argument


def apply(function, value):
    """`function` on a tensor, or on each tensor of a tuple (kept a tuple)."""
    return tuple(map(function, value)) if isinstance(value, tuple) else function(value)


class Extractor(nn.Module):
    """Hook one module of `vit` and return its output (or input) beside the model's output."""

    def __init__(self, vit, device=None, layer=None, layer_name='transformer', layer_save_input=False,
                 return_embeddings_only=False, detach=True):
        check_arguments(**core.arguments(locals()))
        super().__init__()
        self.vit = vit
        self.device = device
        self.layer = layer
        self.layer_name = layer_name
        self.layer_save_input = layer_save_input
        self.return_embeddings_only = return_embeddings_only
        self.detach = detach
        self.latents = None
        self.hooks = []
        self.ejected = False

    def hooked_layer(self):
        if self.layer is not None:
            return self.layer
        modules = dict(self.vit.named_modules())
        if self.layer_name not in modules:
            children = ', '.join(name for name, _ in self.vit.named_children())
            raise ValueError(f"layer_name {self.layer_name!r} is not a module of {type(self.vit).__name__}; pass "
                             f"layer=<module> or one of its module names (children: {children})")
        return modules[self.layer_name]

    def keep(self, module, inputs, output):
        latents = inputs if self.layer_save_input else output
        self.latents = apply(lambda t: t.clone().detach(), latents) if self.detach else latents

    def eject(self):
        """Remove the hook and hand back the model; this extractor cannot be used again."""
        self.ejected = True
        for hook in self.hooks:
            hook.remove()
        self.hooks.clear()
        return self.vit

    def clear(self):
        self.latents = None

    def forward(self, img, return_embeddings_only=False):
        if self.ejected:
            raise RuntimeError("this Extractor has been ejected (eject() removed its hook); wrap the model in a "
                               "new Extractor")
        self.clear()
        if not self.hooks:
            self.hooks.append(self.hooked_layer().register_forward_hook(self.keep))
        output = self.vit(img)
        device = img.device if self.device is None else self.device
        latents = apply(lambda t: t.to(device), self.latents)
        return latents if return_embeddings_only or self.return_embeddings_only else (output, latents)


# argument checks


def check_arguments(*, vit, device, layer, layer_name, layer_save_input, return_embeddings_only, detach):
    if not isinstance(vit, nn.Module):
        raise TypeError(f"vit must be a torch.nn.Module, got {type(vit).__name__}")
    if layer is not None and not isinstance(layer, nn.Module):
        raise TypeError(f"layer must be a torch.nn.Module inside the model, got {type(layer).__name__}")
    if layer is None and not isinstance(layer_name, str):
        raise TypeError(f"layer_name must be the name of a module of the model, got {layer_name!r}")
    for name, value in dict(layer_save_input=layer_save_input, return_embeddings_only=return_embeddings_only,
                            detach=detach).items():
        core.boolean(name, value)
