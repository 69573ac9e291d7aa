"""VAT: Vision Action Transformer (vit-pytorch's `vat`).

"VAT: Vision Action Transformer by Unlocking Full Representation of ViT", Li et al., arXiv 2512.06013 (openreview
TalHOvvLZu).
The idea: a policy reads the whole representation trajectory of a ViT, not only its last layer. A short
chunk of learned action tokens runs through its own stack of layers, and layer l cross-attends to the
hidden states of ViT layer `vit_layer_indices[l]` over every view and frame at once; a linear map of the
normed action tokens is the action chunk. Given `actions`, the forward returns the L1 loss
(mean |predicted - given| over batch, chunk and action dimension); otherwise the predicted chunk.

    import torch
    from vit_pytorch.vat import ViT, VAT

    vit = ViT(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=2, mlp_dim=64)
    vat = VAT(vit, dim=32, depth=3, heads=2, dim_head=16, dim_action=2, mlp_dim=64, num_views=2,
              action_chunk_len=3, time_seq_len=4, vit_layer_indices=(0, 1, 2))
    video = torch.randn(5, 2, 3, 4, 32, 32)        # (batch, views, channels, frames, height, width)
    vat(video).shape                               # (5, 3, 2): a chunk of 3 actions of 2 numbers
    loss = vat(video, actions=torch.randn(5, 3, 2))
    loss.backward()

The trajectory of a ViT of depth D holds D + 1 states: index 0 the embedded tokens, index i < D the output of
layer i (the input of layer i + 1), index D the final normed tokens. The tower is our ViT (`vit_pytorch.vit.ViT`
or this module's `ViT`, which adds vit-pytorch's register tokens and output gates); the policy's attention goes
through `vit.attend`, so `vit_pytorch.recorder` records both.

The paper's own code (sellerbubble/VAT @ f34b283, prismatic/models/backbones/vision/vat_modeling.py) is another
architecture: its action tokens run inside the vision tower itself (SigLIP So400m/14 at 224: 1152 wide, 27 layers,
16 heads), each layer giving them their own query and key-value projections (`SeparatedAttention`), not through a
separate policy stack as here and in vit-pytorch. So there are no named configurations with the paper's counts
here; its LIBERO runs take chunks of 8 actions of 7 numbers (prismatic/vla/constants.py).

Where this differs from vit-pytorch 1.26.14 (its checkpoints load with equal outputs all the same, converted):
  - task conditioning (FiLM) scales the tokens by 1 + gamma; vit-pytorch scales by gamma from a zero-initialised
    projection, so its untrained policy multiplies every token by zero at every layer whenever tasks are given.
    Ours starts as the identity (a test checks it); its gamma bias is vit-pytorch's minus one.
  - an image batch (b, c, h, w) is one view of one frame (vit-pytorch's forward fails on it), and inputs of
    another shape, view count or frame count are ValueErrors naming what was expected.
  - this module's `ViT` gives its cls and register tokens position embeddings too (rows that vit-pytorch has
    not: its checkpoints load them as zeros; a learned cls token plus a learned position is one learned token).
"""

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn

from vit_pytorch import vit as core


class FiLM(nn.Module):
    """Feature-wise modulation by a condition: tokens * (1 + gamma) + beta, with (gamma, beta) a linear map of the
    condition (b, dim), zero at initialisation (so the module starts as the identity)."""

    def __init__(self, dim):
        super().__init__()
        self.to_gamma_beta = nn.Sequential(nn.Linear(dim, dim * 2), Rearrange('b (two d) -> two b 1 d', two=2))
        nn.init.zeros_(self.to_gamma_beta[0].weight)
        nn.init.zeros_(self.to_gamma_beta[0].bias)

    def forward(self, tokens, cond):
        gamma, beta = self.to_gamma_beta(cond)
        return tokens * (1 + gamma) + beta


class Attention(core.Attention):
    """Pre-norm attention with a sigmoid gate per head on its output (arXiv 2505.06708, as vit-pytorch's VAT):
    self-attention, or with `cross_attend=True` queries from the tokens and keys and values from a normed
    `context` (b, m, dim_context). The gate is a linear map of the normed tokens, one value per head and token;
    `gated=False` leaves it out (vit-pytorch's SigLIP VAT gates only its cross-attention)."""

    def __init__(self, dim, dim_context=None, heads=8, dim_head=64, dropout=0., cross_attend=False, *,
                 gated=True, qkv_bias=False, norm_eps=1e-5):
        self.dim_context = dim if dim_context is None else dim_context
        super().__init__(dim, heads, dim_head, dropout, qkv_bias=qkv_bias, norm_eps=norm_eps)
        self.cross_attend = cross_attend
        self.context_norm = nn.LayerNorm(self.dim_context, eps=norm_eps) if cross_attend else None
        self.to_out_gates = nn.Sequential(nn.Linear(dim, heads), Rearrange('b n h -> b h n 1'), nn.Sigmoid()) \
            if gated else None

    def build_projections(self, dim, inner_dim, *, bias):
        self.to_q = nn.Linear(dim, inner_dim, bias=bias)
        self.to_kv = nn.Linear(self.dim_context, inner_dim * 2, bias=bias)

    def forward(self, x, context=None):
        if self.cross_attend != (context is not None):
            raise ValueError('a cross-attending layer needs a context, a self-attending one takes none; got '
                             f'cross_attend={self.cross_attend} and context={"a tensor" if context is not None else None}')
        x = self.norm(x)
        keys_from = x if context is None else self.context_norm(context)
        q = rearrange(self.to_q(x), 'b n (h d) -> b h n d', h=self.heads)
        k, v = rearrange(self.to_kv(keys_from), 'b m (kv h d) -> kv b h m d', kv=2, h=self.heads)
        out = self.attend(q, k, v)
        if self.to_out_gates is not None:
            out = out * self.to_out_gates(x)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


def tower_attention(dim, heads, dim_head, dropout, **unused):
    """The tower's self-attention for `vit.Transformer` (which passes the core's options; vit-pytorch's VAT ViT
    has no query/key/value bias and LayerNorms of epsilon 1e-5, the defaults)."""
    return Attention(dim, heads=heads, dim_head=dim_head, dropout=dropout)


class ViT(core.ViT):
    """vit-pytorch's VAT vision tower: our ViT with gated attention and `num_register_tokens` learned register
    tokens (Darcet et al., arXiv 2309.16588) after the cls token. There is always a cls token; `pool='mean'`
    averages the patch tokens only. `forward_features` returns (b, 1 + registers + h * w, dim) after the final norm.
    """

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, pool='cls', channels=3,
                 dim_head=64, dropout=0., emb_dropout=0., num_register_tokens=0):
        check_vit_arguments(**core.arguments(locals()))
        self.extra_tokens = num_register_tokens
        super().__init__(image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
                         heads=heads, mlp_dim=mlp_dim, pool='cls', channels=channels, dim_head=dim_head,
                         dropout=dropout, emb_dropout=emb_dropout, attention=tower_attention)
        self.pool = pool
        registers = torch.randn(num_register_tokens, dim) * 1e-2
        if num_register_tokens:
            self.register_tokens = nn.Parameter(registers)
        else:
            self.register_buffer('register_tokens', registers)      # vit-pytorch's empty key, not an empty parameter

    def prefix_tokens(self, batch_size):
        return repeat(torch.cat((self.cls_token, self.register_tokens)), 'n d -> b n d', b=batch_size)

    def forward_head(self, tokens, pre_logits=False):
        x = tokens[:, self.num_prefix_tokens:].mean(dim=1) if self.pool == 'mean' else tokens[:, 0]
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)


def representation_trajectory(vit, images):
    """The D + 1 token states of our ViT `vit` on `images`: (D + 1, b, n, dim); see the module docstring."""
    tokens = vit.embed(images)
    final, outputs = vit.transformer(tokens, return_layers=True)
    return torch.stack((tokens, *outputs[:-1], final))


class PolicyStack(core.Stack):
    """The action tokens' layers: (FiLM or None, self-attention or None, one cross-attention per context,
    feedforward). Layer l cross-attends with its c-th cross-attention to `contexts[c][l]` in turn (VAT: the ViT's
    states; VAAT: the ViT's, then the AST's), then attends to itself; the state counts the layers run so far."""

    def step(self, entry, x, state, *, contexts, task_emb=None):
        film, self_attn, *cross_attns, ff = entry
        layer = state.get('layer', 0)
        if film is not None and task_emb is not None:
            x = film(x, task_emb)
        for cross_attn, context in zip(cross_attns, contexts):
            x = cross_attn(x, context[layer]) + x
        if self_attn is not None:
            x = self_attn(x) + x
        return ff(x) + x, {'layer': layer + 1}


def embedding_rows(count, dim):
    """`count` learned rows (count, dim) of small random values (frames, views), or None for a single one."""
    return nn.Parameter(torch.randn(count, dim) * 1e-2) if count > 1 else None


class ActionPolicy:
    """What the action transformers (VAT, VAAT, the SigLIP VAT) share: the policy (its learned tokens, its stack,
    the action head and loss, built by `build_policy`), its run over the towers' states (`act`) and the checks of
    their inputs. A subclass sets `num_views`, `time_seq_len` and `is_video`; its blocks are these static methods,
    which the SigLIP VAT overrides."""

    @staticmethod
    def self_attention(dim, heads, dim_head, dropout):
        return Attention(dim, heads=heads, dim_head=dim_head, dropout=dropout)

    @staticmethod
    def cross_attention(dim, dim_context, heads, dim_head, dropout):
        return Attention(dim, dim_context, heads=heads, dim_head=dim_head, dropout=dropout, cross_attend=True)

    @staticmethod
    def feedforward(dim, mlp_dim, dropout):
        return core.FeedForward(dim, mlp_dim, dropout)

    def build_policy(self, dim, context_dims, *, depth, heads, dim_head, dim_action, mlp_dim, dropout, num_tasks,
                     dim_extra_token, num_register_tokens, action_chunk_len, num_advantage_bins, add_self_attn,
                     self_attn_heads, self_attn_dim_head):
        """The learned tokens and embeddings (tasks for FiLM, registers, action positions, advantage bins), the
        `PolicyStack` of `depth` layers with one cross-attention per context width of `context_dims`, the final
        norm, the action head and the extra token's projection."""
        self.num_tasks = num_tasks
        if num_tasks is not None:
            self.task_emb = nn.Parameter(torch.randn(num_tasks, dim) * 1e-2)
        self.register_tokens = nn.Parameter(torch.randn(num_register_tokens, dim) * 1e-2)
        self.action_pos_emb = nn.Parameter(torch.randn(action_chunk_len, dim) * 1e-2)
        self.num_advantage_bins = num_advantage_bins
        if num_advantage_bins > 0:
            self.advantage_emb = nn.Embedding(num_advantage_bins + 1, dim)

        self.transformer = PolicyStack([
            (FiLM(dim) if num_tasks is not None else None,
             self.self_attention(dim, self_attn_heads, self_attn_dim_head, dropout) if add_self_attn else None,
             *(self.cross_attention(dim, dim_context, heads, dim_head, dropout) for dim_context in context_dims),
             self.feedforward(dim, mlp_dim, dropout))
            for _ in range(depth)])
        self.final_norm = nn.LayerNorm(dim)
        self.to_pred_action = nn.Linear(dim, dim_action, bias=False)
        self.dim_extra_token = dim_extra_token
        if dim_extra_token is not None:
            self.to_extra_token = nn.Linear(dim_extra_token, dim)

    def act(self, contexts, *, extra, tasks, advantages, actions, return_hiddens):
        """The policy's run over `contexts` (one (depth, b, n, dim_context) stack of states per cross-attention):
        the predicted chunk, the L1 loss against `actions`, or the chunk and the token states (`predict`)."""
        tokens, start = self.policy_tokens(contexts[0].shape[1], advantages, extra)
        task_emb = self.task_emb[tasks] if tasks is not None else None
        # each layer's state as its own tensor: indexing the stack would make every layer's backward fill a zero
        # gradient of the whole stack and add them up (at vit-pytorch's example configuration 9 tensors of
        # (9, b, 520, 256) and 8 sums of them); unbound, the backward stacks the layers' gradients once
        layers = tuple(context.unbind(0) for context in contexts)
        out, states = self.transformer(tokens, contexts=layers, task_emb=task_emb, return_layers=True)
        return self.predict(out, start, actions=actions, hiddens=(tokens, *states) if return_hiddens else None)

    def policy_tokens(self, batch, advantages, extra):
        """(registers, advantage?, actions, extra?) tokens (b, n, dim), and where the action tokens start."""
        empty = self.action_pos_emb.new_zeros(batch, 0, self.action_pos_emb.shape[-1])
        advantage = empty
        if self.num_advantage_bins > 0 and advantages is not None:
            if isinstance(advantages, int):
                advantages = torch.full((batch,), advantages, device=empty.device, dtype=torch.long)
            advantage = self.advantage_emb(advantages + 1)[:, None]
        extra_token = empty if extra is None else self.to_extra_token(extra)[:, None]
        tokens = torch.cat((repeat(self.register_tokens, 'n d -> b n d', b=batch), advantage,
                            repeat(self.action_pos_emb, 'n d -> b n d', b=batch), extra_token), dim=1)
        return tokens, self.register_tokens.shape[0] + advantage.shape[1]

    def predict(self, out, start, *, actions=None, hiddens=None):
        """The action chunk read from the action tokens of `out`; the L1 loss against `actions` when given, the
        chunk and the stacked `hiddens` when given, else the chunk."""
        pred_action = self.to_pred_action(self.final_norm(out[:, start:start + self.action_pos_emb.shape[0]]))
        if actions is not None:
            # the paper trains with the L1 loss alone
            return F.l1_loss(pred_action, actions)
        return pred_action if hiddens is None else (pred_action, torch.stack(hiddens))

    def check_input(self, video, *, extra, tasks, advantages, actions):
        """The input as (b, v, c, t, h, w), or a ValueError/TypeError saying what was expected."""
        if not isinstance(video, torch.Tensor):
            raise TypeError(f'video_or_image must be a tensor, got {type(video).__name__}')
        layouts = {4: 'b c h w -> b 1 c 1 h w', 5: 'b v c h w -> b v c 1 h w', 6: None}
        if video.ndim not in layouts or (video.ndim == 6) != self.is_video:
            expected = ('(b, views, channels, frames, height, width)' if self.is_video else
                        '(b, views, channels, height, width) or (b, channels, height, width)')
            raise ValueError(f'video_or_image must be {expected} for time_seq_len={self.time_seq_len}, '
                             f'got shape {tuple(video.shape)}')
        video = video if layouts[video.ndim] is None else rearrange(video, layouts[video.ndim])
        b, v, _, t = video.shape[:4]
        if v != self.num_views:
            raise ValueError(f'video_or_image has {v} views, expected num_views={self.num_views}')
        if t != self.time_seq_len:
            raise ValueError(f'video_or_image has {t} frames, expected time_seq_len={self.time_seq_len}')
        if extra is not None and self.dim_extra_token is None:
            raise ValueError('extra was given, but the model was built without dim_extra_token')
        if extra is not None and tuple(extra.shape) != (b, self.dim_extra_token):
            raise ValueError(f'extra must be (b, dim_extra_token) = {(b, self.dim_extra_token)}, '
                             f'got {tuple(extra.shape)}')
        if tasks is not None and self.num_tasks is None:
            raise ValueError('tasks were given, but the model was built without num_tasks')
        if advantages is not None and self.num_advantage_bins == 0:
            raise ValueError('advantages were given, but the model was built with num_advantage_bins=0')
        expected = (b, self.action_pos_emb.shape[0], self.to_pred_action.out_features)
        if actions is not None and tuple(actions.shape) != expected:
            raise ValueError(f'actions must be (b, action_chunk_len, dim_action) = {expected}, '
                             f'got {tuple(actions.shape)}')
        return video


def vision_contexts(vit, video, layer_indices, *, time_pos_emb, view_emb, freeze_vit):
    """The ViT states each policy layer reads: (depth, b, views * frames * tokens, vit_dim), with the frame and
    view embeddings added."""
    b, v, _, t = video.shape[:4]
    with torch.no_grad() if freeze_vit else nullcontext():
        trajectory = representation_trajectory(vit, rearrange(video, 'b v c t h w -> (b v t) c h w'))
    hiddens = rearrange(trajectory[layer_indices], 'l (b v t) n d -> l b v t n d', b=b, v=v, t=t)
    if time_pos_emb is not None:
        hiddens = hiddens + rearrange(time_pos_emb, 't d -> t 1 d')
    if view_emb is not None:
        hiddens = hiddens + rearrange(view_emb, 'v d -> v 1 1 d')
    return rearrange(hiddens, 'l b v t n d -> l b (v t n) d')


class VAT(ActionPolicy, nn.Module):
    """Multi-view images or videos to a chunk of actions; see the module docstring.

    forward(video_or_image, *, extra=None, tasks=None, advantages=None, actions=None, return_hiddens=False,
    freeze_vit=False):
      video_or_image  (b, v, c, t, h, w) with `time_seq_len` > 1; else (b, v, c, h, w) or (b, c, h, w) (one view)
      extra           (b, dim_extra_token): one more token (the robot's state), with `dim_extra_token`
      tasks           (b,) task ids, with `num_tasks`: FiLM before each layer
      advantages      (b,) or an int in [-1, num_advantage_bins): a token; -1 is "no advantage" (its own embedding)
      actions         (b, action_chunk_len, dim_action): then the L1 loss is returned
    Returns (b, action_chunk_len, dim_action), with `return_hiddens` also the policy's token states
    (depth + 1, b, tokens, dim) in the order registers, advantage, actions, extra.
    """

    def __init__(self, vit, *, dim, depth, heads, dim_head, dim_action, mlp_dim, num_views=None, num_tasks=None,
                 dim_extra_token=None, num_register_tokens=4, action_chunk_len=7, time_seq_len=1, dropout=0.,
                 add_self_attn=True, self_attn_heads=4, self_attn_dim_head=32, vit_layer_indices=None,
                 num_advantage_bins=0):
        if isinstance(vit, dict):
            vit = ViT(**vit)
        check_arguments(**core.arguments(locals()))
        super().__init__()
        self.vit = vit
        vit_dim = vit.embed_dim
        vit_layer_indices = tuple(range(depth)) if vit_layer_indices is None else tuple(vit_layer_indices)
        self.register_buffer('layer_indices', torch.tensor(vit_layer_indices), persistent=False)

        self.time_seq_len, self.is_video = time_seq_len, time_seq_len > 1
        self.time_pos_emb = embedding_rows(time_seq_len, vit_dim)
        self.num_views = 1 if num_views is None else num_views
        self.view_emb = embedding_rows(self.num_views, vit_dim)
        self.build_policy(dim, (vit_dim,), depth=depth, heads=heads, dim_head=dim_head, dim_action=dim_action,
                          mlp_dim=mlp_dim, dropout=dropout, num_tasks=num_tasks, dim_extra_token=dim_extra_token,
                          num_register_tokens=num_register_tokens, action_chunk_len=action_chunk_len,
                          num_advantage_bins=num_advantage_bins, add_self_attn=add_self_attn,
                          self_attn_heads=self_attn_heads, self_attn_dim_head=self_attn_dim_head)

    def forward(self, video_or_image, *, extra=None, tasks=None, advantages=None, actions=None,
                return_hiddens=False, freeze_vit=False):
        video = self.check_input(video_or_image, extra=extra, tasks=tasks, advantages=advantages, actions=actions)
        # each policy layer's keys and values: (depth, b, views * frames * tokens, vit_dim)
        contexts = vision_contexts(self.vit, video, self.layer_indices, time_pos_emb=self.time_pos_emb,
                                   view_emb=self.view_emb, freeze_vit=freeze_vit)
        return self.act((contexts,), extra=extra, tasks=tasks, advantages=advantages, actions=actions,
                        return_hiddens=return_hiddens)

# argument checks


def check_vit_arguments(*, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, pool, channels,
                        dim_head, dropout, emb_dropout, num_register_tokens):
    core.non_negative_int('num_register_tokens', num_register_tokens)
    if pool not in ('cls', 'mean'):
        raise ValueError(f"pool must be 'cls' or 'mean', got {pool!r}")


def layer_indices(name, value, depth):
    """Refuse a `value` that is not a sequence of layer indices (a bare number, a string), naming `name`."""
    if isinstance(value, (str, bytes)) or not hasattr(value, '__iter__'):
        raise TypeError(f'{name} must be a tuple of {depth} ints (one index of the trajectory per layer), got '
                        f'{value!r} ({type(value).__name__})')


def check_arguments(*, vit, dim, depth, heads, dim_head, dim_action, mlp_dim, num_views, num_tasks,
                    dim_extra_token, num_register_tokens, action_chunk_len, time_seq_len, dropout, add_self_attn,
                    self_attn_heads, self_attn_dim_head, vit_layer_indices, num_advantage_bins):
    if not isinstance(vit, core.ViT):
        raise TypeError(f'vit must be a vit_pytorch ViT (vit_pytorch.vit.ViT or vit_pytorch.vat.ViT) or a dict of '
                        f'its arguments, got {type(vit).__name__}')
    for name, value in dict(dim=dim, depth=depth, heads=heads, dim_head=dim_head, dim_action=dim_action,
                            mlp_dim=mlp_dim, action_chunk_len=action_chunk_len, time_seq_len=time_seq_len,
                            self_attn_heads=self_attn_heads, self_attn_dim_head=self_attn_dim_head).items():
        core.positive_int(name, value)
    for name, value in dict(num_views=num_views, num_tasks=num_tasks, dim_extra_token=dim_extra_token).items():
        if value is not None:
            core.positive_int(name, value)
    core.non_negative_int('num_register_tokens', num_register_tokens)
    core.non_negative_int('num_advantage_bins', num_advantage_bins)
    core.probability('dropout', dropout)
    core.boolean('add_self_attn', add_self_attn)
    vit_depth = len(vit.transformer.layers)
    if vit_layer_indices is None:
        if vit_depth != depth:
            raise ValueError(f'depth={depth} differs from the ViT depth {vit_depth}: pass vit_layer_indices, '
                             f'one index of the ViT trajectory (0 to {vit_depth}) per VAT layer')
        return
    layer_indices('vit_layer_indices', vit_layer_indices, depth)
    indices = tuple(vit_layer_indices)
    if len(indices) != depth or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= vit_depth
                                        for i in indices):
        raise ValueError(f'vit_layer_indices must be {depth} ints (one per VAT layer) in 0..{vit_depth} (the '
                         f'ViT trajectory: embeddings, each layer, the final norm), got {vit_layer_indices!r}')


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `vat.ViT` and `vat.VAT`: the same names but for the policy's stack (`layers.*` is our
    `transformer.layers.*`), its (dim,) cls token (ours (1, dim)), its position table without prefix rows (ours
    with them, zeros) and its FiLM's gamma bias (ours is it minus one: ours scales by 1 + gamma)."""
    state = model.state_dict()
    plan = {}
    for ours, tensor in state.items():
        theirs = ours.replace('transformer.layers.', 'layers.', 1) if ours.startswith('transformer.layers.') \
            else ours
        if ours.endswith('cls_token'):
            plan[ours] = ({theirs: tuple(tensor.shape[1:])}, lambda t: t[None])
        elif ours.endswith('pos_embedding'):
            prefix = tensor.shape[0] - model_of(model, ours).grid_size[0] * model_of(model, ours).grid_size[1]
            plan[ours] = ({theirs: (tensor.shape[0] - prefix, tensor.shape[1])},
                          lambda t, prefix=prefix: torch.cat((t.new_zeros(prefix, t.shape[1]), t)))
        elif ours.endswith('to_gamma_beta.0.bias'):
            plan[ours] = ({theirs: tuple(tensor.shape)}, film_bias_from_vit_pytorch)
        else:
            plan[ours] = ({theirs: tuple(tensor.shape)}, lambda t: t)
    return plan, ('vit.mlp_head.',) if isinstance(model, VAT) else ('mlp_head.',)


def film_bias_from_vit_pytorch(bias):
    """vit-pytorch's FiLM bias (gamma's, then beta's) as ours: gamma's minus one (ours scales by 1 + gamma)."""
    return torch.cat((bias[:bias.shape[0] // 2] - 1, bias[bias.shape[0] // 2:]))


def model_of(model, key):
    """The ViT that holds the position table `key` of `model` (the model itself or its tower)."""
    return model.vit if key.startswith('vit.') else model
