from vit_pytorch.vit import ViT
from vit_pytorch.simple_vit import SimpleViT

__all__ = ['ViT', 'SimpleViT', 'MAE', 'Dino', 'LoopedViT']
__version__ = '0.1.0'

# vit-pytorch's README imports these from the package; loaded on first use so `import vit_pytorch` stays light
_LAZY = {'MAE': 'vit_pytorch.mae', 'Dino': 'vit_pytorch.dino', 'LoopedViT': 'vit_pytorch.looped_vit'}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vit_pytorch' has no attribute {name!r}")
