"""The old import path of `vit_pytorch.training.run_folder`: everything is re-exported from there."""
from vit_pytorch.training.run_folder import *  # noqa: F401,F403
