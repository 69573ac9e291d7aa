from vit_pytorch.vit import ViT
from vit_pytorch.simple_vit import SimpleViT

__all__ = ['ViT', 'SimpleViT']
__version__ = '0.1.0'
