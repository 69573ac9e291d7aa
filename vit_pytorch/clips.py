"""The old import path of `vit_pytorch.training.clips`: everything is re-exported from there."""
from vit_pytorch.training.clips import *  # noqa: F401,F403
