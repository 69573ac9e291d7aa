"""What-Where Transformer.

"What-Where Transformer: A Slot-Centric Visual Backbone for Concurrent Representation and Localization",
Yoshihashi et al., arXiv 2605.12021: beside the patch tokens the backbone carries levels of learned slots (fewer at
each level: parts, then wholes). In every layer tokens and slots exchange information through one mutual
attention whose logits add a token-slot mask that the layer also updates and hands to the next: a slot's "what" is
its embedding, its "where" the mask over the positions it gathers. Slots gather tokens by a softmax over the slots
(each token's weights over a level's slots sum to 1: the slots compete for it, as in Slot Attention, Locatello et
al., arXiv 2006.15055), so without a position table a slot's "what" does not change when the image moves, while
its "where" moves with the image. The class logits are the mean over the levels of the mean over the slots of the
head's logits; `return_tokens=True` adds a head on the mean patch token, `sigreg_slots` LeJEPA's SIGReg of the
slots, `task_heads` dense heads that read the masks (`AutoencodingHead`).

    import torch
    from vit_pytorch.wwt import WWT

    model = WWT(image_size=64, patch_size=16, num_classes=10, dim=64, depth=2, num_slots=(8, 4), heads=2,
                dim_head=16, mlp_dim=128)
    logits = model(torch.randn(2, 3, 64, 64))                        # (2, 10)
    slots, tokens, masks = model(torch.randn(2, 3, 64, 64), return_embeddings=True)
    # slots: ((2, 8, 64), (2, 4, 64)); masks: per interaction (tokens, level 1), (tokens, level 2): (2, 2, 16, 8), ...

Where it differs from vit-pytorch 1.26.14's `wwt`, whose checkpoints load here (`load_vit_pytorch`) with equal
outputs: the slots' SIGReg is LeJEPA's (`vit_pytorch.sigreg.sigreg_loss`, shared with `vit_pytorch.lejepa`) over all slots of
the batch as one sample, which carries the LeJEPA paper's factor N (the number of samples) that vit-pytorch's
leaves out; the tokens and slots
run as one sequence through a `vit.Stack` (the masks are its layer-to-layer state), so gradient checkpointing,
`forward_intermediates` and the recorder work; bad arguments are errors naming them, not asserts.
"""

from collections import namedtuple

import torch
from einops import rearrange, reduce, repeat
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import sigreg, vit
from vit_pytorch.sigreg import sigreg_loss  # noqa: F401  (vit-pytorch's wwt imports lejepa's sigreg_loss)

WWTReturn = namedtuple('WWTReturn', ['slot_logits', 'token_logits'])
WWTFeatureReturn = namedtuple('WWTFeatureReturn', ['slots', 'tokens', 'masks'])


def mask_mlp(dim, hidden_dim, out_dim, dropout):
    """The mask update's MLP (vit-pytorch's layout, keys 0, 1, 4): bias-free LayerNorm, Linear, GELU, Linear."""
    return nn.Sequential(nn.LayerNorm(dim, bias=False), nn.Linear(dim, hidden_dim), nn.GELU(), nn.Dropout(dropout),
                         nn.Linear(hidden_dim, out_dim), nn.Dropout(dropout))


class MutualAttention(vit.Attention):
    """Tokens (b, t, dim) and slots (b, s, dim) read each other through one set of logits, q_tokens k_slots^T *
    scale + mask (b, g, heads, t, s); returns (tokens' update, slots' update, the next mask).

    Slots gather the tokens' values by the softmax over the slots (`l1norm_after_tokens_softmax`: then each slot's
    weights normalised over the tokens: a weighted mean); tokens read the slots' values by the softmax over the
    tokens, or (`token_softmax_over_slots`) by an attention of a second query group over the slots. The next mask
    is an MLP of the logits and the updated tokens, per token. The slot-gathering map (b, heads, t, s) passes
    through `attention_probs` (the recorder's map); it is transformed before use, so `fused` stays False.
    """

    def __init__(self, dim, num_slots, heads, dim_head, mlp_dim, dropout=0., l1norm_after_tokens_softmax=False,
                 token_softmax_over_slots=False, project_mask_groups=False, gate_attention=True):
        inner_dim = heads * dim_head
        q_groups = 2 if token_softmax_over_slots else 1
        super().__init__(dim, heads, dim_head, dropout, norm=nn.Identity(),
                         to_qkv=nn.Linear(dim, inner_dim * (q_groups + 1), bias=False),
                         to_out=nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(dropout)))
        self.fused = False
        self.q_groups = q_groups
        self.l1norm_after_tokens_softmax = l1norm_after_tokens_softmax
        self.token_softmax_over_slots = token_softmax_over_slots
        self.project_mask_groups = project_mask_groups and token_softmax_over_slots
        self.mask_groups = 1 if self.project_mask_groups else q_groups
        self.to_k_v_slots = nn.Linear(dim, inner_dim * 2, bias=False)
        self.to_out_slots = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(dropout))
        if self.project_mask_groups:
            self.mask_project = nn.Conv2d(q_groups * heads, heads, 1)
        mask_width = self.mask_groups * heads * num_slots
        self.mlp_mask = mask_mlp(mask_width + dim, mlp_dim, mask_width, dropout)
        self.gate_attention = gate_attention
        if gate_attention:
            self.tokens_gate = nn.Sequential(nn.Linear(dim, heads, bias=False), Rearrange('b n h -> b h n 1'),
                                             nn.Sigmoid())
            self.slots_gate = nn.Sequential(nn.Linear(dim, heads, bias=False), Rearrange('b n h -> b h n 1'),
                                            nn.Sigmoid())

    def forward(self, tokens, slots, mask):
        q_v = rearrange(self.to_qkv(tokens), 'b t (g h d) -> g b h t d', g=self.q_groups + 1, h=self.heads)
        queries, v_tokens = q_v[:-1], q_v[-1]
        k, v_slots = rearrange(self.to_k_v_slots(slots), 'b s (kv h d) -> kv b h s d', kv=2, h=self.heads)
        logits = torch.einsum('g b h t d, b h s d -> b g h t s', queries, k) * self.scale + mask

        where = self.attention_probs(logits[:, 0].softmax(dim=-1))       # each token's weights over the slots
        if self.l1norm_after_tokens_softmax:
            where = where / where.sum(dim=-2, keepdim=True).clamp(min=1e-8)
        slots_out = where.transpose(-1, -2) @ v_tokens
        if self.token_softmax_over_slots:
            # a plain attention of the second query group over the slots, under the same mask
            tokens_out = vit.attend(queries[1], k, v_slots, scale=self.scale, mask=mask[:, -1])
        else:
            tokens_out = logits[:, 0].softmax(dim=-2) @ v_slots
        if self.gate_attention:
            tokens_out = tokens_out * self.tokens_gate(tokens)
            slots_out = slots_out * self.slots_gate(slots)
        tokens_out = self.to_out(rearrange(tokens_out, 'b h t d -> b t (h d)'))
        slots_out = self.to_out_slots(rearrange(slots_out, 'b h s d -> b s (h d)'))

        if self.project_mask_groups:
            logits = rearrange(self.mask_project(rearrange(logits, 'b g h t s -> b (g h) t s')),
                               'b h t s -> b 1 h t s')
        mask_in = torch.cat((rearrange(logits, 'b g h t s -> b t (g h s)'), tokens + tokens_out), dim=-1)
        next_mask = rearrange(self.mlp_mask(mask_in), 'b t (g h s) -> b g h t s', g=self.mask_groups, h=self.heads)
        return tokens_out, slots_out, next_mask


class WWTBlock(nn.Module):
    """One layer over the hierarchy's sequences (patch tokens, then each level of slots, registers first in each):
    every interaction (i, j) runs a `MutualAttention` between the normed sequences i and j, both updates add to
    the sequences, then each sequence's bias-free feed-forward reads (sequence + update) and adds to it."""

    def __init__(self, dim, num_hierarchies, seq_lengths, interactions, heads, dim_head, mlp_dim, dropout=0.,
                 l1norm_after_tokens_softmax=False, token_softmax_over_slots=False, project_mask_groups=False,
                 gate_attention=True):
        super().__init__()
        self.interactions = interactions
        self.attns = nn.ModuleList(MutualAttention(
            dim, seq_lengths[j], heads, dim_head, mlp_dim, dropout,
            l1norm_after_tokens_softmax=l1norm_after_tokens_softmax, token_softmax_over_slots=token_softmax_over_slots,
            project_mask_groups=project_mask_groups, gate_attention=gate_attention) for _, j in interactions)
        self.norms = nn.ModuleList(nn.LayerNorm(dim, bias=False) for _ in range(num_hierarchies))
        self.mlps = nn.ModuleList(vit.FeedForward(dim, mlp_dim, dropout, norm_bias=False)
                                  for _ in range(num_hierarchies))

    def forward(self, sequences, masks):
        normed = [norm(seq) for norm, seq in zip(self.norms, sequences)]
        sequences, next_masks = list(sequences), []
        for mask, (i, j), attn in zip(masks, self.interactions, self.attns):
            tokens_out, slots_out, next_mask = attn(normed[i], normed[j], mask)
            sequences[i] = sequences[i] + tokens_out
            sequences[j] = sequences[j] + slots_out
            next_masks.append(next_mask)
        return [seq + mlp(seq) for seq, mlp in zip(sequences, self.mlps)], tuple(next_masks)


class WWTStack(vit.Stack):
    """The layers over one sequence (b, n, dim): the slot levels (each its registers, then its slots), the register
    tokens, then the patches; each layer splits it into the hierarchy's sequences and joins them again. The
    token-slot masks are the stack's state: the first layer starts from zero masks, each layer leaves the next its
    masks (`state['masks']`, per interaction (b, g, heads, n_i, n_j), registers included). The last layer also
    leaves its sequences unjoined (`state['sequences']`, as `split` lays them out): read from there, a sequence
    nothing reads after the stack (the patch tokens, for the slots' logits) gets no gradient, where the split of the
    join would carry zeros back through the last layer (the tokens' feed-forward, their attention outputs and gates;
    vit-pytorch's graph has none there either)."""

    def __init__(self, layers, *, seq_lengths, interactions, mask_shape):
        super().__init__(layers)
        self.seq_lengths, self.interactions, self.mask_shape = seq_lengths, interactions, mask_shape

    def split(self, x):
        """(b, n, dim) -> [patch tokens with their registers, level 1 slots with theirs, ...]."""
        *slots, tokens = x.split((*self.seq_lengths[1:], self.seq_lengths[0]), dim=1)
        return [tokens, *slots]

    def step(self, entry, x, state, **kwargs):
        masks = state.get('masks')
        if masks is None:
            masks = tuple(x.new_zeros(x.shape[0], *self.mask_shape, self.seq_lengths[i], self.seq_lengths[j])
                          for i, j in self.interactions)
        sequences, masks = entry(self.split(x), masks)
        tokens, *slots = sequences
        # the last layer's sequences as they are, for `WWT.forward`; the others' only in their join, so that no
        # layer's sequences are held beside it
        last = {'sequences': tuple(sequences)} if entry is self.layers[-1] else {}
        return torch.cat((*slots, tokens), dim=1), {'masks': masks, **last}


class WWT(vit.TokenFace, nn.Module):
    """What-Where Transformer (vit-pytorch's `wwt.WWT`, its arguments and return values).

    `forward_features(img)` is the one sequence the layers run over, (b, n, dim): for each level of slots its
    register slots then its slots, the register tokens, then the patch tokens (the last token_grid's h * w;
    `num_prefix_tokens` counts everything before them). `forward_head(features, pre_logits=True)` is the mean over
    the levels of the mean over each level's slots (registers left out) of the head's LayerNorm, (b, dim); the
    logits are its Linear, the same as vit-pytorch's mean of the slots' logits. `num_classes=0` makes `forward`
    return that pooled, normed embedding. `forward(img, return_embeddings=True)` gives
    `WWTFeatureReturn(slots, tokens, masks)` (tokens only with `return_tokens`; the masks per interaction without
    registers, (b, heads, n_i, n_j), or (b, 2, heads, n_i, n_j) with `token_softmax_over_slots` and no
    `project_mask_groups`). Otherwise the logits (`WWTReturn(slot_logits, token_logits)` with `return_tokens`),
    then, as a tuple, each task head's output, then the SIGReg loss when `sigreg_slots` asks for one. Recorded
    maps: per layer and interaction the slot-gathering softmax, (b, heads, n_i, n_j) with registers.
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, num_slots, sigreg_slots=None,
                 interactions=None, heads=8, dim_head=64, mlp_dim=None, channels=3, dropout=0., return_tokens=False,
                 l1norm_after_tokens_softmax=False, token_softmax_over_slots=False, project_mask_groups=False,
                 gate_attention=True, num_register_tokens=0, num_register_slots=0, task_heads=()):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        num_slots = num_slots if isinstance(num_slots, tuple) else (num_slots,)
        levels = len(num_slots)
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.channels, self.num_classes, self.embed_dim = channels, num_classes, dim
        grid = vit.patch_grid(self.image_size, self.patch_size)
        patch_dim = channels * self.patch_size[0] * self.patch_size[1]
        mlp_dim = dim * 4 if mlp_dim is None else mlp_dim

        self.to_patch_embedding = nn.Sequential(
            Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=self.patch_size[0], p2=self.patch_size[1]),
            nn.LayerNorm(patch_dim, bias=False), nn.Linear(patch_dim, dim), nn.LayerNorm(dim, bias=False))
        self.pos_embedding = nn.Parameter(torch.randn(grid[0] * grid[1], dim))
        self.slots = nn.ParameterList(nn.Parameter(torch.randn(n, dim)) for n in num_slots)
        num_register_slots = num_register_slots if isinstance(num_register_slots, tuple) else \
            (num_register_slots,) * levels
        self.register_tokens = nn.Parameter(torch.randn(num_register_tokens, dim))
        self.register_slots = nn.ParameterList(nn.Parameter(torch.randn(n, dim)) for n in num_register_slots)
        self.num_regs = (num_register_tokens, *num_register_slots)
        self.sigreg_slots = None if sigreg_slots is None else \
            (sigreg_slots if isinstance(sigreg_slots, tuple) else (sigreg_slots,) * levels)
        self.interactions = tuple(((0, i + 1) for i in range(levels)) if interactions is None else
                                  (tuple(pair) for pair in interactions))
        self.token_softmax_over_slots = token_softmax_over_slots
        self.project_mask_groups = project_mask_groups and token_softmax_over_slots
        mask_groups = 1 if self.project_mask_groups else (2 if token_softmax_over_slots else 1)
        self.seq_lengths = (grid[0] * grid[1] + num_register_tokens,
                            *(s + r for s, r in zip(num_slots, num_register_slots)))
        self.transformer = WWTStack([WWTBlock(
            dim, levels + 1, self.seq_lengths, self.interactions, heads, dim_head, mlp_dim, dropout,
            l1norm_after_tokens_softmax=l1norm_after_tokens_softmax, token_softmax_over_slots=token_softmax_over_slots,
            project_mask_groups=project_mask_groups, gate_attention=gate_attention) for _ in range(depth)],
            seq_lengths=self.seq_lengths, interactions=self.interactions, mask_shape=(mask_groups, heads))
        self.mlp_head = nn.Sequential(nn.LayerNorm(dim, bias=False),
                                      *([nn.Linear(dim, num_classes)] if num_classes > 0 else []))
        self.task_heads = nn.ModuleList((task_heads,) if isinstance(task_heads, nn.Module) else task_heads)
        self.return_tokens = return_tokens
        if return_tokens:
            self.mlp_head_tokens = nn.Sequential(nn.LayerNorm(dim, bias=False), nn.Linear(dim, num_classes))

    @property
    def num_features(self):
        return self.embed_dim

    @property
    def num_prefix_tokens(self):
        return sum(self.seq_lengths[1:]) + self.num_regs[0]

    def token_grid(self, image_size):
        return vit.patch_grid(image_size, self.patch_size)

    def embed(self, img):
        vit.check_images(img, channels=self.channels, patch_size=self.patch_size, image_size=self.image_size,
                         dtype=self.pos_embedding.dtype)
        b = img.shape[0]
        tokens = self.to_patch_embedding(img) + self.pos_embedding
        slots = [repeat(torch.cat((registers, slots)), 'n d -> b n d', b=b)
                 for registers, slots in zip(self.register_slots, self.slots)]
        return torch.cat((*slots, repeat(self.register_tokens, 'n d -> b n d', b=b), tokens), dim=1)

    def forward_features(self, img):
        return self.transformer(self.embed(img))

    def hierarchy(self, features):
        """(patch tokens, level 1 slots, ...) of the features (or of the stack's sequences), registers left out."""
        sequences = self.transformer.split(features) if torch.is_tensor(features) else features
        return tuple(seq[:, regs:] for seq, regs in zip(sequences, self.num_regs))

    def forward_head(self, features, pre_logits=False):
        _, *slots = self.hierarchy(features)
        pooled = sum(reduce(self.mlp_head[0](level), 'b s d -> b d', 'mean') for level in slots) / len(slots)
        return pooled if pre_logits or self.num_classes == 0 else self.mlp_head[1](pooled)

    def forward(self, img, return_embeddings=False):
        # the last layer's sequences, not their join: the unread patch tokens then get no gradient (WWTStack)
        _, state = self.transformer(self.embed(img), return_state=True)
        features = state['sequences']
        tokens, *slots = self.hierarchy(features)
        masks = []
        for mask, (i, j) in zip(state['masks'], self.interactions):
            mask = mask[..., self.num_regs[i]:, self.num_regs[j]:]
            masks.append(mask[:, 0] if mask.shape[1] == 1 else mask)
        if return_embeddings:
            return WWTFeatureReturn(tuple(slots), tokens if self.return_tokens else None, masks)
        out = self.forward_head(features)
        if self.return_tokens:
            out = WWTReturn(out, self.mlp_head_tokens(tokens).mean(dim=1))
        returned = (out, *(head((tokens, *slots), masks, self.interactions) for head in self.task_heads))
        if self.sigreg_slots is not None and any(self.sigreg_slots):
            # every slot of the batch is one sample of the embedding distribution, as in vit-pytorch
            returned += (sum(sigreg.sigreg_loss(rearrange(level, 'b s d -> (b s) d'))
                             for level, compute in zip(slots, self.sigreg_slots) if compute),)
        return returned if len(returned) > 1 else out

    def reset_classifier(self, num_classes):
        """A new zero-initialised Linear (with bias, as vit-pytorch's) after the kept LayerNorm; 0: `forward`
        returns the pooled, normed embedding. The token head, with `return_tokens`, stays as it is."""
        vit.non_negative_int('num_classes', num_classes)
        self.num_classes = num_classes
        norm = self.mlp_head[0]
        linear = [vit.zero_linear(self.embed_dim, num_classes, like=norm.weight)] if num_classes > 0 else []
        self.mlp_head = nn.Sequential(norm, *linear)

    def set_grad_checkpointing(self, enable=True):
        self.transformer.grad_checkpointing = enable


class AutoencodingHead(nn.Module):
    """vit-pytorch's dense head over WWT's hierarchy: along each pathway (levels, e.g. (3, 2, 0): the level 3 slots
    to the patch tokens through level 2) the features of its first level are carried hop by hop, each hop a
    softmax over the source level of the interaction's mask (mean over heads and groups); ending at the patch
    tokens lays them on the grid, (b, h, w, dim) or (`channel_first`) (b, dim, h, w), then `decoder`. The default
    pathways go from each level that interacts with the patch tokens straight to them. One pathway's map, or a
    tuple of them."""

    def __init__(self, *, image_size, patch_size, decoder=None, pathways=None, patch_pathway_id=0,
                 channel_first=False):
        super().__init__()
        for pathway in pathways or ():
            steps = [target < source for source, target in zip(pathway[:-1], pathway[1:])]
            if len(pathway) < 2 or len(set(steps)) != 1:
                raise ValueError(f"pathways must each run strictly up or strictly down the levels, got {pathway!r}")
        self.pathways = None if pathways is None else tuple(tuple(pathway) for pathway in pathways)
        self.patch_pathway_id = patch_pathway_id
        grid = vit.patch_grid(vit.pair(image_size), vit.pair(patch_size))
        self.to_spatial = Rearrange('b (h w) d -> b d h w' if channel_first else 'b (h w) d -> b h w d',
                                    h=grid[0], w=grid[1])
        self.decoder = nn.Identity() if decoder is None else decoder

    def forward(self, hierarchy_features, masks, interactions):
        masks = {interaction: reduce(mask, 'b ... t s -> b t s', 'mean')         # the mean over heads and groups
                 for mask, interaction in zip(masks, interactions)}
        pathways = self.pathways or tuple((j, self.patch_pathway_id) for i, j in interactions
                                          if i == self.patch_pathway_id)
        if not pathways:
            raise ValueError(f"no interaction of the model reaches patch_pathway_id={self.patch_pathway_id}: "
                             f"interactions {interactions!r}; pass pathways=")
        maps = []
        for pathway in pathways:
            features = hierarchy_features[pathway[0]]
            for source, target in zip(pathway[:-1], pathway[1:]):
                interaction = (min(source, target), max(source, target))
                if interaction not in masks:
                    raise ValueError(f"pathway {pathway!r} needs the interaction {interaction!r}, which the model "
                                     f"does not have (interactions {interactions!r})")
                mask = masks[interaction] if target < source else masks[interaction].transpose(-1, -2)
                features = mask.softmax(dim=-1) @ features
            if pathway[-1] == self.patch_pathway_id:
                features = self.to_spatial(features)
            maps.append(self.decoder(features))
        return maps[0] if len(maps) == 1 else tuple(maps)


# argument checks


def levels_tuple(name, value, levels, check):
    """`value` one per level of slots: an int (bool) for all or a tuple of `levels`, each passing `check`."""
    values = value if isinstance(value, tuple) else (value,) * levels
    if len(values) != levels:
        raise ValueError(f"{name} must be one value or a tuple of one per level of slots ({levels}), got {value!r}")
    for item in values:
        check(name, item)
    return values


def check_arguments(*, image_size, patch_size, num_classes, dim, depth, num_slots, sigreg_slots, interactions, heads,
                    dim_head, mlp_dim, channels, dropout, return_tokens, l1norm_after_tokens_softmax,
                    token_softmax_over_slots, project_mask_groups, gate_attention, num_register_tokens,
                    num_register_slots, task_heads):
    vit.check_patches(image_size, patch_size)
    vit.check_transformer_arguments(num_classes=num_classes, dim=dim, depth=depth, heads=heads,
                                    mlp_dim=dim * 4 if mlp_dim is None else mlp_dim, channels=channels,
                                    dim_head=dim_head, dropout=dropout)
    if not isinstance(num_slots, (int, tuple)) or isinstance(num_slots, bool) or num_slots == ():
        raise TypeError(f"num_slots must be an int or a tuple of ints (slots per level), got {num_slots!r}")
    num_slots = num_slots if isinstance(num_slots, tuple) else (num_slots,)
    for count in num_slots:
        vit.positive_int('num_slots', count)
    if any(finer <= coarser for finer, coarser in zip(num_slots, num_slots[1:])):
        raise ValueError(f"num_slots must strictly decrease from level to level (a part-whole hierarchy), "
                         f"got {num_slots!r}")
    levels = len(num_slots)
    if sigreg_slots is not None:
        levels_tuple('sigreg_slots', sigreg_slots, levels, vit.boolean)
    levels_tuple('num_register_slots', num_register_slots, levels, vit.non_negative_int)
    vit.non_negative_int('num_register_tokens', num_register_tokens)
    for name, value in dict(return_tokens=return_tokens, l1norm_after_tokens_softmax=l1norm_after_tokens_softmax,
                            token_softmax_over_slots=token_softmax_over_slots, project_mask_groups=project_mask_groups,
                            gate_attention=gate_attention).items():
        vit.boolean(name, value)
    if interactions is not None:
        pairs = [tuple(pair) if isinstance(pair, (tuple, list)) else pair for pair in interactions]
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(i, int) for i in pair)
                    and 0 <= pair[0] < pair[1] <= levels):
                raise ValueError(f"interactions must be pairs (i, j) of levels 0 <= i < j <= {levels} (0 the patch "
                                 f"tokens), got {pair!r} in {interactions!r}")
        if len(set(pairs)) != len(pairs):
            raise ValueError(f"interactions must be distinct, got {interactions!r}")
    modules = (task_heads,) if isinstance(task_heads, nn.Module) else task_heads
    if not isinstance(modules, (tuple, list)) or not all(isinstance(head, nn.Module) for head in modules):
        raise TypeError(f"task_heads must be an nn.Module or a tuple or list of them, got {task_heads!r}")


# loading checkpoints

VIT_PYTORCH_RENAMES = (
    (r'layers\.(\d+)\.attns\.(\d+)\.to_q_v_tokens\.', r'transformer.layers.\1.attns.\2.to_qkv.'),
    (r'layers\.(\d+)\.attns\.(\d+)\.to_out_tokens\.', r'transformer.layers.\1.attns.\2.to_out.'),
    (r'layers\.(\d+)\.mlps\.(\d+)\.', r'transformer.layers.\1.mlps.\2.net.'),
    (r'layers\.', r'transformer.layers.'),
)


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `WWT`: its layers under our `transformer`, each attention's token projections named as the core
    Attention's (`to_qkv`, `to_out`), the feed-forwards' Sequential inside `net`."""
    plan, _ = vit.renamed_plan(model, keys, VIT_PYTORCH_RENAMES)
    return plan, ('mlp_head.', 'mlp_head_tokens.')
