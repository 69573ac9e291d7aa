"""1D ViT: the Vision Transformer on signals and time series.

The ViT of "An Image is Worth 16x16 Words", Dosovitskiy et al., arXiv 2010.11929, with patches cut
along one axis: a signal (b, channels, seq_len) becomes seq_len / patch_size tokens, each the
linear embedding of `patch_size` consecutive samples of every channel, with a learned position
embedding and a cls token, through the plain pre-norm encoder. The arguments and the function are
vit-pytorch's (`vit_pytorch.vit_1d.ViT`), whose checkpoints load through
`vit_pytorch.pretrained.load_vit_pytorch` (its head LayerNorm is our final norm: the same function
on the cls token).

    import torch
    from vit_pytorch.vit_1d import ViT

    model = ViT(seq_len=256, patch_size=16, num_classes=1000, dim=1024, depth=6, heads=8,
                mlp_dim=2048, dropout=0.1, emb_dropout=0.1)
    logits = model(torch.randn(4, 3, 256))   # (4, 1000)

Known differences from vit-pytorch: a signal must have the model's length (vit-pytorch slices its
position table for shorter ones); the position table and cls token start at the patch tokens'
scale (`vit.init_tokens`); `num_classes=0` returns the tokens, as the core ViT does. Patches are
flattened as (p c); tokens are in time order, the cls token first.
"""

import torch
from einops import repeat
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit


class PatchEmbedding1d(nn.Sequential):
    """(b, c, n * p) -> (b, n, dim): `patch_size` consecutive samples of every channel, flattened as (p c),
    projected between two LayerNorms (Dual PatchNorm, as vit-pytorch's 1D models do)."""

    def __init__(self, *, channels, patch_size, dim):
        patch_dim = channels * patch_size
        super().__init__(
            Rearrange('b c (n p) -> b n (p c)', p=patch_size),
            nn.LayerNorm(patch_dim),
            nn.Linear(patch_dim, dim),
            nn.LayerNorm(dim),
        )


class ViT(vit.TokenFace, nn.Module):
    """ViT over patches of a signal, read from a cls token; `num_classes=0` makes `forward` return all
    tokens after the final norm, (b, 1 + seq_len / patch_size, dim).

    `forward_features` returns all tokens after the final norm, (b, 1 + n, dim).
    """

    num_prefix_tokens = 1

    def __init__(self, *, seq_len, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dim_head=64,
                 dropout=0., emb_dropout=0.):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.seq_len, self.patch_size, self.channels, self.num_classes = seq_len, patch_size, channels, num_classes
        self.to_patch_embedding = PatchEmbedding1d(channels=channels, patch_size=patch_size, dim=dim)
        self.cls_token = nn.Parameter(torch.zeros(1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1 + seq_len // patch_size, dim))
        vit.init_tokens(self.pos_embedding, self.cls_token, patch_norm=True)
        self.dropout = nn.Dropout(emb_dropout)
        self.transformer = vit.Transformer(dim, depth, heads, dim_head, mlp_dim, dropout)
        self.num_features = dim
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes > 0 else None

    def embed(self, series):
        """cls token and patch tokens with their position embeddings: (b, 1 + n, dim)."""
        check_series(series, channels=self.channels, seq_len=self.seq_len, dtype=self.pos_embedding.dtype)
        x = self.to_patch_embedding(series)
        x = torch.cat((repeat(self.cls_token, 'n d -> b n d', b=x.shape[0]), x), dim=1)
        return self.dropout(x + self.pos_embedding)

    def forward_features(self, series):
        """All tokens after the final norm: (b, 1 + n, dim)."""
        return self.transformer(self.embed(series))

    def forward_head(self, tokens, pre_logits=False):
        x = tokens[:, 0]
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, series):
        tokens = self.forward_features(series)
        return tokens if self.mlp_head is None else self.forward_head(tokens)

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.pos_embedding)

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


# argument checks


def check_arguments(*, seq_len, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dim_head, dropout,
                    emb_dropout):
    check_length(seq_len=seq_len, patch_size=patch_size)
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                    channels=channels, dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout)


def check_length(*, seq_len, patch_size):
    vit.positive_int('seq_len', seq_len)
    vit.positive_int('patch_size', patch_size)
    if seq_len % patch_size:
        raise ValueError(f"seq_len ({seq_len}) must be divisible by patch_size ({patch_size}); pad or crop the "
                         f"signals to a multiple, e.g. {seq_len + (-seq_len) % patch_size}")


def check_series(series, *, channels, seq_len=None, patch_size=None, dtype=None):
    """Validate a (b, channels, length) batch: `seq_len` when the model needs that length, else a length
    divisible by `patch_size`; `dtype` is required outside autocast."""
    if not isinstance(series, torch.Tensor):
        hint = "; convert a numpy array with torch.from_numpy(array).float()" \
            if type(series).__module__ == 'numpy' else ''
        raise TypeError(f"series must be a torch.Tensor of shape (b, channels, length), got "
                        f"{type(series).__name__}{hint}")
    if not series.is_floating_point():
        raise TypeError(f"series must be a floating point tensor, got dtype {series.dtype}; convert with "
                        f"series.float()")
    if dtype is not None and series.dtype != dtype and not torch.is_autocast_enabled(series.device.type):
        raise TypeError(f"series has dtype {series.dtype} but the model's parameters are {dtype}; convert with "
                        f"series.to({dtype}) or run the model under torch.autocast")
    if series.ndim != 3:
        hint = " (one signal? add a batch dimension with series.unsqueeze(0))" if series.ndim == 2 else ""
        raise ValueError(f"series must have shape (b, channels, length), got a {series.ndim}-d tensor of shape "
                         f"{tuple(series.shape)}{hint}")
    if series.shape[1] != channels:
        raise ValueError(f"series must have {channels} channels (dim 1), got shape {tuple(series.shape)}")
    length = series.shape[2]
    if seq_len is not None and length != seq_len:
        raise ValueError(f"series must have length {seq_len} (the model's seq_len), got {length}")
    if patch_size is not None and (length < patch_size or length % patch_size):
        raise ValueError(f"series length {length} must be a positive multiple of patch_size {patch_size}")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's 1D ViT: our names, except that its head is (LayerNorm, Linear) on the cls token, where
    ours is a final LayerNorm of all tokens (the same function on the cls token) and a Linear; its cls
    token is (dim,) and its position table has a leading batch axis."""
    state = model.state_dict()
    dim = state['pos_embedding'].shape[-1]
    plan = {'cls_token': ({'cls_token': (dim,)}, lambda t: t[None]),
            'pos_embedding': ({'pos_embedding': (1, *state['pos_embedding'].shape)}, lambda t: t[0])}
    theirs_of = {'transformer.norm.': 'mlp_head.0.', 'mlp_head.': 'mlp_head.1.'}
    for key, tensor in state.items():
        if key not in plan:
            prefix = next((p for p in theirs_of if key.startswith(p)), None)
            source = theirs_of[prefix] + key[len(prefix):] if prefix else key
            plan[key] = ({source: tuple(tensor.shape)}, lambda t: t)
    return plan, ('mlp_head.1.',)
