"""The old import path of `vit_pytorch.training.registry`: everything is re-exported from there."""
from vit_pytorch.training.registry import *  # noqa: F401,F403
