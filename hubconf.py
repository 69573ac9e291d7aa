"""torch.hub entry points: the ViT paper's models by name, and the model classes.

    import torch

    model = torch.hub.load('/path/to/this/repo', 'vit_base_patch16_224', source='local')
    small = torch.hub.load('/path/to/this/repo', 'vit_small_patch16_224', source='local', num_classes=10)
    tiny = torch.hub.load('/path/to/this/repo', 'vit', 'Ti/16', source='local', image_size=32, num_classes=10)

Every entry builds a model with fresh random weights; nothing is downloaded. `pretrained=True`
is refused: load a checkpoint you have with `vit_pytorch.pretrained.load_timm`, `load_hf` or
`load_jax`. Keyword arguments are those of `vit_pytorch.ViT` (the named models fix the
variant's sizes and image size).
"""

import functools as _functools

from vit_pytorch import pretrained as _pretrained
from vit_pytorch.simple_vit import SimpleViT
from vit_pytorch.vit import ViT

dependencies = ['torch', 'einops']


def _no_download(build):
    @_functools.wraps(build)
    def entry(*args, pretrained=False, **kwargs):
        if pretrained:
            raise ValueError(
                f"pretrained={pretrained!r}: {build.__name__} from torch.hub builds the model only and never "
                f"downloads weights; build it, then load a checkpoint you have with "
                f"vit_pytorch.pretrained.load_timm, load_hf or load_jax"
            )
        return build(*args, **kwargs)
    return entry


vit = _no_download(_pretrained.vit)

# vit_tiny_patch16_224, ..., vit_base_patch16_224, ...: every named model of vit_pytorch.pretrained
for _name in _pretrained.__all__:
    if _name.startswith('vit_') and callable(getattr(_pretrained, _name)):
        globals()[_name] = _no_download(getattr(_pretrained, _name))
