"""The old import path of `vit_pytorch.training.checkpoints`: everything is re-exported from there."""
from vit_pytorch.training.checkpoints import *  # noqa: F401,F403
