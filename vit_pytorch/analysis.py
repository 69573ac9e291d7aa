"""Analyses of a ViT's attention and embeddings, as plain functions on tensors.

The quantities of Figure 7 of the ViT paper ("An Image is Worth 16x16 Words", Dosovitskiy
et al., arXiv 2010.11929): principal components of the patch-embedding filters (left),
cosine similarity of the position embeddings (centre), mean attention distance per head
and layer (right); and attention rollout (Abnar and Zuidema, "Quantifying Attention Flow
in Transformers", arXiv 2005.00928), the paper's Figure 6.

Tokens follow the layout reported by `vit_pytorch.recorder`: `num_prefix_tokens` prefix
tokens (cls, registers) first, then the patches of an (h, w) grid in row-major order.

    import torch
    from vit_pytorch import ViT
    from vit_pytorch.recorder import Recorder
    from vit_pytorch import analysis

    model = ViT(image_size=32, patch_size=8, num_classes=10, dim=64, depth=3, heads=4, mlp_dim=128).eval()
    recorder = Recorder(model)
    logits, attns = recorder(torch.randn(2, 3, 32, 32))                  # (2, 3, 4, 17, 17)
    layout = dict(grid=recorder.grid, num_prefix_tokens=recorder.num_prefix_tokens)
    rollout = analysis.attention_rollout(attns)                            # (2, 17, 17)
    heatmap = analysis.to_patch_grid(rollout[:, 0], **layout)             # (2, 4, 4): cls row
    last = analysis.cls_attention(attns, **layout)                        # (2, 4 heads, 4, 4)
    distance = analysis.mean_attention_distance(attns, patch_size=8, **layout)   # (2, 3, 4) pixels
    similarity = analysis.position_embedding_similarity(model.pos_embedding, **layout)  # (4, 4, 4, 4)
    components, explained = analysis.patch_embedding_components(analysis.patch_filters(model))
"""

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from vit_pytorch.vit import pair

__all__ = ['attention_rollout', 'to_patch_grid', 'cls_attention', 'mean_attention_distance',
           'position_embedding_similarity', 'patch_filters', 'patch_embedding_components']


def _stacked(attns):
    """(b, layers, heads, n, n) from that tensor or from a list of (b, heads, n, n)."""
    if isinstance(attns, (list, tuple)):
        shapes = {tuple(attn.shape) for attn in attns}
        if len(shapes) != 1:
            raise ValueError(
                f"attns must be maps of one shape to stack, got shapes {sorted(shapes)}; select the layers "
                f"that share one token sequence"
            )
        attns = rearrange(list(attns), 'layers b h i j -> b layers h i j')
    if not isinstance(attns, torch.Tensor) or attns.ndim != 5 or attns.shape[-1] != attns.shape[-2]:
        shape = tuple(attns.shape) if isinstance(attns, torch.Tensor) else type(attns).__name__
        raise ValueError(f"attns must have shape (b, layers, heads, n, n), got {shape}")
    return attns


def _check_layout(grid, num_prefix_tokens, num_tokens):
    if grid is None:
        raise ValueError("grid is None: the token layout is unknown; pass the (h, w) patch grid")
    height, width = pair(grid)
    if num_prefix_tokens + height * width != num_tokens:
        raise ValueError(
            f"{num_tokens} tokens do not match grid {(height, width)} with {num_prefix_tokens} prefix tokens "
            f"({num_prefix_tokens} + {height} * {width} = {num_prefix_tokens + height * width})"
        )
    return height, width


def attention_rollout(attns, *, residual=True):
    """Attention rollout: how much each output token draws on each input token, (b, n, n).

    Heads are averaged; with `residual=True` the skip connection is modelled as in the
    paper, A' = (A + I) / 2 (rows renormalised), and the layers are multiplied from the
    first: rollout = A'_L ... A'_2 A'_1. Row `i` is token i at the output, column `j` token
    j at the input.
    """
    attns = _stacked(attns)
    layers = attns.mean(dim=2)                                      # (b, layers, n, n)
    if residual:
        eye = torch.eye(layers.shape[-1], dtype=layers.dtype, device=layers.device)
        layers = (layers + eye) / 2
        layers = layers / layers.sum(dim=-1, keepdim=True)
    rollout = layers[:, 0]
    for layer in layers.unbind(dim=1)[1:]:
        rollout = layer @ rollout
    return rollout


def to_patch_grid(weights, *, grid, num_prefix_tokens=0):
    """Per-token weights (..., n) laid on the patch grid (..., h, w), prefix tokens dropped."""
    height, width = _check_layout(grid, num_prefix_tokens, weights.shape[-1])
    return rearrange(weights[..., num_prefix_tokens:], '... (h w) -> ... h w', h=height, w=width)


def cls_attention(attns, *, grid, num_prefix_tokens=1, layer=-1):
    """Attention of the first (cls) token to every patch in one layer (the last by default): (b, heads, h, w)."""
    if num_prefix_tokens < 1:
        raise ValueError(f"num_prefix_tokens must be at least 1 for a cls token, got {num_prefix_tokens}; "
                         f"for mean-pooled models use attention_rollout(...).mean(dim=1)")
    attns = _stacked(attns)
    return to_patch_grid(attns[:, layer, :, 0], grid=grid, num_prefix_tokens=num_prefix_tokens)


def _patch_distances(grid, patch_size, device):
    """(h w, h w) distances in pixels between patch centres."""
    (height, width), (patch_height, patch_width) = pair(grid), pair(patch_size)
    rows, cols = torch.meshgrid(torch.arange(height, device=device), torch.arange(width, device=device),
                                indexing='ij')
    centres = torch.stack((rows.flatten() * patch_height, cols.flatten() * patch_width), dim=-1).double()
    return torch.cdist(centres, centres)


def mean_attention_distance(attns, *, grid, num_prefix_tokens=0, patch_size=1):
    """Mean attention distance per head and layer (the paper's Figure 7, right): (b, layers, heads).

    For every query patch, the distance to each key patch weighted by the attention, averaged
    over query patches: the "receptive field size" of a head. Only patch-to-patch attention
    counts; its rows are renormalised to sum to one, so attention on prefix tokens neither
    shortens nor lengthens the distance. Distances are in pixels for `patch_size` (an int or
    (h, w)); the default 1 measures them in patches.
    """
    attns = _stacked(attns)
    _check_layout(grid, num_prefix_tokens, attns.shape[-1])
    patches = attns[..., num_prefix_tokens:, num_prefix_tokens:].double()
    patches = patches / patches.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    distances = _patch_distances(grid, patch_size, attns.device)
    return (patches * distances).sum(dim=-1).mean(dim=-1).to(attns.dtype)


def position_embedding_similarity(pos_embedding, *, grid, num_prefix_tokens=0):
    """Cosine similarity between the position embeddings of all patch pairs (Figure 7, centre): (h, w, h, w).

    `pos_embedding` is the (prefix + h * w, dim) table (a leading batch axis of 1 is accepted);
    entry [i, j] is the (h, w) map of how similar patch (i, j)'s embedding is to every other.
    """
    table = pos_embedding.detach()
    if table.ndim == 3 and table.shape[0] == 1:
        table = table[0]
    if table.ndim != 2:
        raise ValueError(f"pos_embedding must have shape (n, dim), got {tuple(pos_embedding.shape)}")
    height, width = _check_layout(grid, num_prefix_tokens, table.shape[0])
    table = F.normalize(table[num_prefix_tokens:].double(), dim=-1)
    similarity = table @ table.T
    return rearrange(similarity, '(h1 w1) (h2 w2) -> h1 w1 h2 w2', h1=height, w1=width, h2=height, w2=width).to(
        pos_embedding.dtype)


def patch_filters(model):
    """The patch-embedding filters of `model` as (dim, channels, patch_h, patch_w).

    Taken from the first Linear or Conv2d of `model.to_patch_embedding` (or the module itself).
    A Linear reads patches flattened as (p1 p2 c), as our models do, and needs the model's
    `patch_size` and `channels`; the scale of a LayerNorm right before it (Dual PatchNorm)
    is folded into the filters, since it multiplies every pixel before the projection.
    """
    embedding = getattr(model, 'to_patch_embedding', None)
    if not isinstance(embedding, nn.Module):
        raise ValueError(f"{type(model).__name__} has no `to_patch_embedding` module to take filters from")
    modules = list(embedding.modules())
    for position, module in enumerate(modules):
        if isinstance(module, nn.Conv2d):
            return module.weight.detach()
        if isinstance(module, nn.Linear):
            weight = module.weight.detach()
            before = modules[position - 1] if position else None
            if isinstance(before, nn.LayerNorm) and before.weight is not None:
                weight = weight * before.weight.detach()
            (patch_height, patch_width), channels = pair(model.patch_size), model.channels
            return rearrange(weight, 'd (p1 p2 c) -> d c p1 p2', p1=patch_height, p2=patch_width, c=channels)
    raise ValueError(f"{type(model).__name__}.to_patch_embedding has no Linear or Conv2d projection")


def patch_embedding_components(filters, *, num_components=28):
    """Principal components of the patch-embedding filters (Figure 7, left).

    `filters` is (dim, channels, patch_h, patch_w); each of the `dim` filters is one sample.
    Returns the first `num_components` components as (k, channels, patch_h, patch_w) (unit
    norm, sign fixed so that the largest entry is positive) and the fraction of the variance
    each explains, (k,). k is at most min(dim, channels * patch_h * patch_w).
    """
    if filters.ndim != 4:
        raise ValueError(f"filters must have shape (dim, channels, patch_h, patch_w), got {tuple(filters.shape)}")
    samples = rearrange(filters.detach().double(), 'd c p1 p2 -> d (c p1 p2)')
    samples = samples - samples.mean(dim=0)
    _, singular, components = torch.linalg.svd(samples, full_matrices=False)
    k = min(num_components, components.shape[0])
    components = components[:k]
    peak = components.gather(1, components.abs().argmax(dim=1, keepdim=True))
    components = components * peak.sign()
    explained = singular.square() / singular.square().sum()
    shape = dict(c=filters.shape[1], p1=filters.shape[2], p2=filters.shape[3])
    return (rearrange(components, 'k (c p1 p2) -> k c p1 p2', **shape).to(filters.dtype),
            explained[:k].to(filters.dtype))
