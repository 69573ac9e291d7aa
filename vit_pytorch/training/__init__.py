"""The training machinery: the model registry, checkpoints, run folders, data sources, optional extras and the
training loop's parts. The commands (`python -m vit_pytorch.train`, `.pretrain`, `.experiments`, `.evaluate`) sit
one tier above and import from here; nothing here imports a command."""
