"""NaViT for videos and volumes, vit-pytorch's `vit_pytorch.na_vit_nested_tensor_3d.NaViT`, run on packed sequences.

NaViT ("Patch n' Pack", Dehghani et al., arXiv 2307.06304) on tubelets: each volume (c, f, h, w),
a video or a CT scan of its own size, is cut into tubelets of `frame_patch_size` frames x `patch_size`
pixels, gets factorised frame, row and column position embeddings, and `num_registers` learned
register tokens ("Vision Transformers Need Registers", Darcet et al., arXiv 2309.16588) before its
tokens; no volume attends to another, and each is pooled by attention over its own tokens (registers
included). vit-pytorch keeps the volumes apart with `torch.nested` jagged tensors; here they are packed
into one sequence as in `vit_pytorch.na_vit_nested_tensor` (which this module extends; see there).

    import torch
    from vit_pytorch.na_vit_nested_tensor_3d import NaViT

    model = NaViT(image_size=256, max_frames=8, patch_size=32, frame_patch_size=2, num_classes=1000,
                  dim=1024, depth=6, heads=16, mlp_dim=2048, token_dropout_prob=0.1)
    volumes = [torch.randn(3, 2, 256, 256), torch.randn(3, 8, 128, 128), torch.randn(3, 4, 128, 256)]
    logits = model(volumes)   # (3, 1000), in input order

The arguments, parameter names and the function are vit-pytorch's (1.26.14), whose checkpoints load
unchanged; the differences beyond it are those of `vit_pytorch.na_vit_nested_tensor`, and
`num_registers=0` is accepted (no registers).
"""

import torch
from einops import rearrange
from torch import nn

from vit_pytorch import na_vit_nested_tensor, vit


class NaViT(na_vit_nested_tensor.PackedNaViT):
    """NaViT on a list of (c, f, h, w) volumes up to `max_frames` x `image_size`, sides divisible by the tubelet.

    `forward_features` returns the packed tokens after the final norm (1, n, dim), the pooling segments and each
    video's slot.
    `num_classes=0` makes `forward` return the pooled embedding (videos, dim).
    """

    input_name = 'volumes'

    def __init__(self, *, image_size, max_frames, patch_size, frame_patch_size, num_classes, dim, depth, heads,
                 mlp_dim, channels=3, dim_head=64, dropout=0., emb_dropout=0., num_registers=4, qk_rmsnorm=True,
                 token_dropout_prob=None):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.max_frames, self.frame_patch_size = max_frames, frame_patch_size
        self.channels, self.token_dropout_prob, self.num_registers = channels, token_dropout_prob, num_registers
        self.num_prefix_tokens = num_registers
        patch_dim = channels * frame_patch_size * self.patch_size[0] * self.patch_size[1]

        self.to_patch_embedding = nn.Sequential(nn.LayerNorm(patch_dim), nn.Linear(patch_dim, dim), nn.LayerNorm(dim))
        self.pos_embed_frame = nn.Parameter(torch.zeros(max_frames // frame_patch_size, dim))
        self.pos_embed_height = nn.Parameter(torch.zeros(self.image_size[0] // self.patch_size[0], dim))
        self.pos_embed_width = nn.Parameter(torch.zeros(self.image_size[1] // self.patch_size[1], dim))
        self.register_tokens = nn.Parameter(torch.zeros(num_registers, dim))
        for table in (self.pos_embed_frame, self.pos_embed_height, self.pos_embed_width, self.register_tokens):
            nn.init.normal_(table, std=0.02)
        self.build_core(dim=dim, depth=depth, heads=heads, dim_head=dim_head, mlp_dim=mlp_dim, dropout=dropout,
                        emb_dropout=emb_dropout, qk_norm=qk_rmsnorm, num_classes=num_classes)

    def item_patches(self, volume):
        """A volume's tubelets (f * h * w, c pf p1 p2), flattened channel first, and their (frame, row, column)."""
        (p1, p2), pf = self.patch_size, self.frame_patch_size
        frames, height, width = volume.shape[-3:]
        patches = rearrange(volume, 'c (f pf) (h p1) (w p2) -> (f h w) (c pf p1 p2)', pf=pf, p1=p1, p2=p2)
        positions = torch.cartesian_prod(*(torch.arange(n, device=volume.device)
                                           for n in (frames // pf, height // p1, width // p2))).reshape(-1, 3)
        return patches, positions

    def position_embedding(self, positions):
        frames, rows, columns = positions.unbind(dim=-1)
        return self.pos_embed_frame[frames] + self.pos_embed_height[rows] + self.pos_embed_width[columns]

    def check_item(self, volume, name):
        na_vit_nested_tensor.check_item(
            volume, name, kind='volume (c, f, h, w)', channels=self.channels,
            patch=(self.frame_patch_size, *self.patch_size), largest=(self.max_frames, *self.image_size),
            dtype=self.pos_embed_height.dtype)


# argument checks


def check_arguments(*, image_size, max_frames, patch_size, frame_patch_size, num_classes, dim, depth, heads, mlp_dim,
                    channels, dim_head, dropout, emb_dropout, num_registers, qk_rmsnorm, token_dropout_prob):
    vit.check_patches(image_size, patch_size)
    vit.positive_int('max_frames', max_frames)
    vit.positive_int('frame_patch_size', frame_patch_size)
    if max_frames % frame_patch_size:
        raise ValueError(f"max_frames {max_frames} must be divisible by frame_patch_size {frame_patch_size}")
    vit.non_negative_int('num_registers', num_registers)
    na_vit_nested_tensor.check_common(num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                                      channels=channels, dim_head=dim_head, dropout=dropout, emb_dropout=emb_dropout,
                                      qk_rmsnorm=qk_rmsnorm, token_dropout_prob=token_dropout_prob)


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's nested-tensor 3D NaViT has our parameter names and computes the same function."""
    return None
