"""The old import path of `vit_pytorch.training.ucr`: everything is re-exported from there."""
from vit_pytorch.training.ucr import *  # noqa: F401,F403
