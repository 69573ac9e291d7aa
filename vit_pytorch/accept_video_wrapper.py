"""Run any image model on videos, frame by frame.

`AcceptVideoWrapper(image_net)` takes a video (b, c, frames, h, w), runs `image_net` on all
b * frames frames as one batch, and gives its outputs back with a time axis: an output of shape
(b * frames, ...) becomes (b, frames, ...). Outputs may be a tensor or a nested tuple, list or
dict of them (a scalar such as an auxiliary loss is passed through). Optionally a learned time
embedding is added to one output (`add_time_pos_emb`, with `dim_emb` and `time_seq_len`), after an
optional projection to `proj_embed_to_dim`. The name and arguments are vit-pytorch's
(`vit_pytorch.accept_video_wrapper.AcceptVideoWrapper`), and its checkpoints load with
`load_state_dict` where the image model's keys agree (e.g. a `vit_pytorch.ViT`).

    import torch
    from vit_pytorch import ViT
    from vit_pytorch.accept_video_wrapper import AcceptVideoWrapper

    image_net = ViT(image_size=64, patch_size=16, num_classes=0, dim=128, depth=2, heads=4, mlp_dim=256)
    video_net = AcceptVideoWrapper(image_net, add_time_pos_emb=True, dim_emb=128, time_seq_len=16,
                                   proj_embed_to_dim=64)
    tokens = video_net(torch.randn(2, 3, 8, 64, 64))   # (2, 8, 17, 64): per frame, time embedded

Known differences from vit-pytorch: MOSS (its `moss=` option, a separate paper's module) is not
offered and refused by name; `eval_with_no_grad=True` puts the image model in eval mode for the
call and restores its mode afterwards (vit-pytorch leaves it in eval mode).
"""

from contextlib import nullcontext

import torch
from einops import rearrange
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from vit_pytorch import vit


class AcceptVideoWrapper(nn.Module):
    """`image_net` applied to every frame; outputs (b * frames, ...) come back as (b, frames, ...).

    forward_function        the name of the image model's method to call ('forward').
    add_time_pos_emb        add a learned (time_seq_len, dim) embedding to output `output_pos_add_pos_emb`
                            (the position in the flattened outputs) along its time axis; its last axis
                            is the feature axis, or its third when `embed_is_channel_first` (a feature map
                            (b, frames, d, h, w)).
    proj_embed_to_dim       project that output from `dim_emb` to this width first (a Linear).
    patch_size              kept for vit-pytorch's API (read from `image_net.patch_size` when not given).
    """

    def __init__(self, image_net, forward_function='forward', add_time_pos_emb=False, dim_emb=None,
                 time_seq_len=None, embed_is_channel_first=False, output_pos_add_pos_emb=0, proj_embed_to_dim=None,
                 patch_size=None, moss=None):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_net = image_net
        self.forward_function = forward_function
        self.add_time_pos_emb = add_time_pos_emb
        self.embed_is_channel_first = embed_is_channel_first
        self.output_pos_add_pos_emb = output_pos_add_pos_emb
        self.patch_size = getattr(image_net, 'patch_size', None) if patch_size is None else patch_size
        self.time_seq_len = time_seq_len
        self.embed_proj = nn.Linear(dim_emb, proj_embed_to_dim) if proj_embed_to_dim is not None else None
        if add_time_pos_emb:
            self.pos_emb = nn.Parameter(torch.randn(time_seq_len, proj_embed_to_dim or dim_emb) * 1e-2)

    def forward(self, video, eval_with_no_grad=False, forward_kwargs=None):
        check_video(video, time_seq_len=self.time_seq_len if self.add_time_pos_emb else None)
        frames = video.shape[2]
        images = rearrange(video, 'b c t h w -> (b t) c h w')
        function = getattr(self.image_net, self.forward_function)
        training = self.image_net.training
        if eval_with_no_grad:
            self.image_net.eval()
        try:
            with torch.no_grad() if eval_with_no_grad else nullcontext():
                outputs = function(images, **(forward_kwargs or {}))
        finally:
            self.image_net.train(training)

        leaves, spec = tree_flatten(outputs)
        leaves = [rearrange(leaf, '(b t) ... -> b t ...', t=frames)
                  if isinstance(leaf, torch.Tensor) and leaf.numel() > 1 else leaf for leaf in leaves]
        if self.embed_proj is not None or self.add_time_pos_emb:
            position = self.output_pos_add_pos_emb
            if not -len(leaves) <= position < len(leaves) or not isinstance(leaves[position], torch.Tensor):
                raise ValueError(f"output_pos_add_pos_emb={position} does not point at a tensor output: the image "
                                 f"model gave {len(leaves)} output(s)")
            leaves[position] = self.embed(leaves[position])
        return tree_unflatten(leaves, spec)

    def embed(self, x):
        """Project (b, frames, ..., dim_emb) and add the time embedding along the frame axis."""
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        if self.add_time_pos_emb:
            time = self.pos_emb[:x.shape[1]]                                   # (frames, d)
            extra = x.ndim - 3                                                 # axes besides (b, frames, d)
            if self.embed_is_channel_first:
                time = time.reshape(1, *time.shape, *(1,) * extra)             # (1, frames, d, 1, ...)
            else:
                time = time.reshape(1, time.shape[0], *(1,) * extra, time.shape[1])   # (1, frames, 1, ..., d)
            x = x + time
        return x


# argument checks


def check_arguments(*, image_net, forward_function, add_time_pos_emb, dim_emb, time_seq_len, embed_is_channel_first,
                    output_pos_add_pos_emb, proj_embed_to_dim, patch_size, moss):
    if not isinstance(image_net, nn.Module):
        raise TypeError(f"image_net must be an nn.Module that takes (b, c, h, w) images, got "
                        f"{type(image_net).__name__}")
    if not isinstance(forward_function, str) or not callable(getattr(image_net, forward_function, None)):
        raise ValueError(f"forward_function must name a method of image_net ({type(image_net).__name__}), got "
                         f"{forward_function!r}")
    vit.boolean('add_time_pos_emb', add_time_pos_emb)
    vit.boolean('embed_is_channel_first', embed_is_channel_first)
    if isinstance(output_pos_add_pos_emb, bool) or not isinstance(output_pos_add_pos_emb, int):
        raise TypeError(f"output_pos_add_pos_emb must be an int (a position in the outputs), got "
                        f"{output_pos_add_pos_emb!r}")
    for name, value in dict(dim_emb=dim_emb, time_seq_len=time_seq_len, proj_embed_to_dim=proj_embed_to_dim).items():
        if value is not None:
            vit.positive_int(name, value)
    if proj_embed_to_dim is not None and dim_emb is None:
        raise ValueError("dim_emb (the width of the output to project) must be given with proj_embed_to_dim")
    if add_time_pos_emb and (dim_emb is None or time_seq_len is None):
        raise ValueError("add_time_pos_emb=True needs dim_emb (the output's width) and time_seq_len (the most "
                         "frames a video may have)")
    if patch_size is not None:
        vit.positive_pair('patch_size', patch_size)
    if moss is not None:
        raise ValueError("moss (MOSS, the self-similarity module of vit-pytorch's vivit_with_moss) is not offered "
                         "here; leave it None")


def check_video(video, *, time_seq_len=None):
    if not isinstance(video, torch.Tensor):
        raise TypeError(f"video must be a torch.Tensor of shape (b, c, frames, h, w), got {type(video).__name__}")
    if video.ndim != 5:
        raise ValueError(f"video must have shape (b, c, frames, h, w) (time is dimension 2), got a {video.ndim}-d "
                         f"tensor of shape {tuple(video.shape)}")
    if time_seq_len is not None and video.shape[2] > time_seq_len:
        raise ValueError(f"video has {video.shape[2]} frames, more than time_seq_len={time_seq_len} time "
                         f"embeddings")


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's wrapper has our names (image_net.*, embed_proj.*, pos_emb): its checkpoints load where the
    image model's keys agree with vit-pytorch's."""
    return None
