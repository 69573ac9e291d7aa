"""VAT on a SigLIP vision tower (vit-pytorch's `vat_siglip`).

"VAT: Vision Action Transformer by Unlocking Full Representation of ViT" (arXiv 2512.06013) with the vision
tower of SigLIP ("Sigmoid Loss for Language Image Pre-Training", arXiv 2303.15343; So400m/14 at 224 by
default, PaliGemma's and pi-zero's tower): the policy of `vit_pytorch.vat` (action tokens, layer l
cross-attending to the tower's trajectory state `vit_layer_indices[l]`, the L1 loss when actions are given)
reading a tower whose weights come from a SigLIP checkpoint the user has.

    import torch
    from vit_pytorch.vat_siglip import SigLIPVAT

    vat = SigLIPVAT(dim=32, depth=2, heads=2, dim_head=16, dim_action=2, mlp_dim=64, action_chunk_len=3,
                    siglip_image_size=28, siglip_patch_size=14, siglip_dim=32, siglip_depth=2, siglip_heads=2,
                    siglip_mlp_dim=64)
    # vat.load_siglip('siglip-so400m-patch14-224/model.safetensors')   # a file you have; nothing downloads
    video = torch.randn(2, 1, 3, 28, 28)                   # (batch, views, channels, height, width)
    vat(video).shape                                        # (2, 3, 2)

The tower is our ViT (`vit_pytorch.vit.ViT`) in SigLIP's form: no cls token, a plain patch projection, biased
query/key/value projections, tanh-approximated GELU, LayerNorms of epsilon 1e-6; its trajectory ends with the
post-LayerNorm tokens (SigLIP's last_hidden_state). The policy's blocks are SigLIP-style too (as vit-pytorch's:
biased projections, epsilon 1e-6, a tanh GELU, only the cross-attention gated).

Where this differs from vit-pytorch 1.26.14 (its checkpoints load all the same, converted): `load_siglip` takes
the path of a safetensors file and never downloads (vit-pytorch's fetches google/siglip-so400m-patch14-224 from
the Hugging Face hub when its folder is missing) and refuses a file that is not SigLIP's, naming the key; FiLM,
the input shapes and errors are those of `vit_pytorch.vat`.
"""

import torch
from einops import rearrange

from vit_pytorch import vat
from vit_pytorch import vit as core


class SigLIPVAT(vat.VAT):
    """VAT with a SigLIP tower built from the `siglip_*` arguments; forward and returns as `vit_pytorch.vat.VAT`."""

    def __init__(self, *, dim=512, depth=27, heads=8, dim_head=64, dim_action=32, mlp_dim=2048, num_views=1,
                 num_tasks=None, dim_extra_token=None, num_register_tokens=4, action_chunk_len=50, time_seq_len=1,
                 dropout=0., add_self_attn=True, self_attn_heads=4, self_attn_dim_head=32, vit_layer_indices=None,
                 num_advantage_bins=0, siglip_image_size=224, siglip_patch_size=14, siglip_dim=1152, siglip_depth=27,
                 siglip_heads=16, siglip_mlp_dim=4304, siglip_norm_eps=1e-6):
        check_arguments(**core.arguments(locals()))
        tower = core.ViT(image_size=siglip_image_size, patch_size=siglip_patch_size, num_classes=0, dim=siglip_dim,
                         depth=siglip_depth, heads=siglip_heads, mlp_dim=siglip_mlp_dim, pool='mean',
                         dim_head=siglip_dim // siglip_heads, patch_norm=False, qkv_bias=True,
                         norm_eps=siglip_norm_eps, gelu_approximate='tanh')
        super().__init__(tower, dim=dim, depth=depth, heads=heads, dim_head=dim_head, dim_action=dim_action,
                         mlp_dim=mlp_dim, num_views=num_views, num_tasks=num_tasks, dim_extra_token=dim_extra_token,
                         num_register_tokens=num_register_tokens, action_chunk_len=action_chunk_len,
                         time_seq_len=time_seq_len, dropout=dropout, add_self_attn=add_self_attn,
                         self_attn_heads=self_attn_heads, self_attn_dim_head=self_attn_dim_head,
                         vit_layer_indices=vit_layer_indices, num_advantage_bins=num_advantage_bins)

    @staticmethod
    def self_attention(dim, heads, dim_head, dropout):
        return vat.Attention(dim, heads=heads, dim_head=dim_head, dropout=dropout, gated=False, qkv_bias=True,
                             norm_eps=1e-6)

    @staticmethod
    def cross_attention(dim, dim_context, heads, dim_head, dropout):
        return vat.Attention(dim, dim_context, heads=heads, dim_head=dim_head, dropout=dropout, cross_attend=True,
                             qkv_bias=True, norm_eps=1e-6)

    @staticmethod
    def feedforward(dim, mlp_dim, dropout):
        return core.FeedForward(dim, mlp_dim, None, norm_eps=1e-6, gelu_approximate='tanh')

    def load_siglip(self, path):
        """Copy a SigLIP vision tower into `self.vit` from the safetensors file at `path` (Hugging Face's
        SiglipVisionModel / SiglipModel `model.safetensors`, keys under `vision_model.`, or a PaliGemma / pi-zero
        file with its tower under `...vision_tower.vision_model.`); returns self. Every shape is checked before
        anything is copied; a missing or unreadable file, or one without such a tower, is a CheckpointError."""
        from vit_pytorch.pretrained import CheckpointError

        tensors = read_safetensors(path)
        prefix = next((p for p in SIGLIP_PREFIXES if f'{p}embeddings.patch_embedding.weight' in tensors), None)
        if prefix is None:
            raise CheckpointError(f"{path}: no SigLIP vision tower in it (no key ending in "
                                  f"'embeddings.patch_embedding.weight' under {', '.join(map(repr, SIGLIP_PREFIXES))})")
        state = self.vit.state_dict()
        converted = {}
        for ours, (theirs, convert) in siglip_plan(len(self.vit.transformer.layers), prefix).items():
            missing = [key for key in theirs if key not in tensors]
            if missing:
                raise CheckpointError(f"{path}: missing SigLIP key {missing[0]} (for {ours})")
            tensor = convert(*(tensors[key] for key in theirs))
            if tuple(tensor.shape) != tuple(state[ours].shape):
                raise CheckpointError(f"{path}: {', '.join(theirs)} gives {ours} of shape {tuple(tensor.shape)}, "
                                      f"the tower's is {tuple(state[ours].shape)} (build it with that file's sizes)")
            converted[ours] = tensor
        self.vit.load_state_dict({**state, **converted}, strict=True)
        return self


# SigLIP's tower in the files people have: Hugging Face's SigLIP, PaliGemma / pi-zero's
SIGLIP_PREFIXES = ('vision_model.', 'paligemma_with_expert.paligemma.model.vision_tower.vision_model.',
                   'vision_tower.vision_model.', '')


def siglip_plan(depth, prefix):
    """Our tower's key -> (SigLIP keys it is made from, the conversion)."""
    def same(*keys):
        return (tuple(prefix + key for key in keys), lambda tensor: tensor)

    def cat(*keys):
        return (tuple(prefix + key for key in keys), lambda *tensors: torch.cat(tensors))

    plan = {
        # the convolution's kernel (dim, c, p, p) is a Linear on patches flattened as (p p c)
        'to_patch_embedding.2.weight': ((prefix + 'embeddings.patch_embedding.weight',),
                                        lambda w: rearrange(w, 'd c h w -> d (h w c)')),
        'to_patch_embedding.2.bias': same('embeddings.patch_embedding.bias'),
        'pos_embedding': same('embeddings.position_embedding.weight'),
        'transformer.norm.weight': same('post_layernorm.weight'),
        'transformer.norm.bias': same('post_layernorm.bias'),
    }
    for i in range(depth):
        ours, theirs = f'transformer.layers.{i}.', f'encoder.layers.{i}.'
        for part in ('weight', 'bias'):
            plan.update({
                f'{ours}0.norm.{part}': same(f'{theirs}layer_norm1.{part}'),
                f'{ours}0.to_qkv.{part}': cat(*(f'{theirs}self_attn.{x}_proj.{part}' for x in 'qkv')),
                f'{ours}0.to_out.0.{part}': same(f'{theirs}self_attn.out_proj.{part}'),
                f'{ours}1.net.0.{part}': same(f'{theirs}layer_norm2.{part}'),
                f'{ours}1.net.1.{part}': same(f'{theirs}mlp.fc1.{part}'),
                f'{ours}1.net.4.{part}': same(f'{theirs}mlp.fc2.{part}'),
            })
    return plan


def read_safetensors(path):
    """{key: tensor} of a safetensors file (never a pickle), or a CheckpointError naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from vit_pytorch.pretrained import CheckpointError

    try:
        return load_file(path)
    except (OSError, SafetensorError) as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from error


# argument checks


def check_arguments(*, dim, depth, heads, dim_head, dim_action, mlp_dim, num_views, num_tasks, dim_extra_token,
                    num_register_tokens, action_chunk_len, time_seq_len, dropout, add_self_attn, self_attn_heads,
                    self_attn_dim_head, vit_layer_indices, num_advantage_bins, siglip_image_size, siglip_patch_size,
                    siglip_dim, siglip_depth, siglip_heads, siglip_mlp_dim, siglip_norm_eps):
    for name, value in dict(siglip_dim=siglip_dim, siglip_depth=siglip_depth, siglip_heads=siglip_heads,
                            siglip_mlp_dim=siglip_mlp_dim).items():
        core.positive_int(name, value)
    core.positive_float('siglip_norm_eps', siglip_norm_eps)
    image = core.positive_pair('siglip_image_size', siglip_image_size)
    patch = core.positive_pair('siglip_patch_size', siglip_patch_size)
    if any(side % step for side, step in zip(image, patch)):
        raise ValueError(f'siglip_image_size={siglip_image_size!r} must be divisible by siglip_patch_size='
                         f'{siglip_patch_size!r}')
    if siglip_dim % siglip_heads:
        raise ValueError(f'siglip_dim={siglip_dim} must be divisible by siglip_heads={siglip_heads} '
                         f'(SigLIP heads are siglip_dim // siglip_heads wide)')


# loading checkpoints


# our tower layer's modules -> vit-pytorch's SigLIP's (attention, then its feedforward Sequential)
TOWER_LAYER_NAMES = {'0.norm': '0.norm', '0.to_out.0': '0.to_out.0', '1.net.0': '1.0', '1.net.1': '1.1', '1.net.4': '1.3'}


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `vat_siglip.SigLIPVAT`: its tower's keys are SigLIP's in vit-pytorch's names (separate query
    and key/value projections, our fused `to_qkv`); the policy's as `vit_pytorch.vat`'s (its `norm_context` is our
    `context_norm`; its FiLM gamma bias is ours plus one)."""
    state = model.state_dict()
    shapes = {key: tuple(tensor.shape) for key, tensor in state.items()}
    plan = {}
    tower = {'vit.to_patch_embedding.2.': 'vit.to_patch_embed.1.', 'vit.pos_embedding': 'vit.pos_embed',
             'vit.transformer.norm.': 'vit.norm.'}
    for ours, shape in shapes.items():
        if ours.startswith('vit.'):
            continue
        # its policy's feedforward is a bare Sequential: our `3.net.i` is its `3.i`
        theirs = ours.replace('transformer.layers.', 'layers.', 1).replace('.context_norm.', '.norm_context.') \
            .replace('.3.net.', '.3.')
        if ours.endswith('to_gamma_beta.0.bias'):
            plan[ours] = ({theirs: shape}, vat.film_bias_from_vit_pytorch)
        else:
            plan[ours] = ({theirs: shape}, lambda t: t)
    for ours, shape in shapes.items():
        if not ours.startswith('vit.'):
            continue
        if ours == 'vit.cls_token':      # our empty cls token of mean pooling: vit-pytorch's SigLIP has none
            plan[ours] = ({}, lambda empty=state[ours]: empty.clone())
            continue
        renamed = next((ours.replace(a, b, 1) for a, b in tower.items() if ours.startswith(a)), None)
        if renamed is not None:
            plan[ours] = ({renamed: shape}, lambda t: t)
            continue
        layer, _, rest = ours.removeprefix('vit.transformer.layers.').partition('.')
        theirs = f'vit.layers.{layer}.'
        if rest.startswith('0.to_qkv.'):
            part = rest.rsplit('.', 1)[1]
            inner = shape[0] // 3
            plan[ours] = ({f'{theirs}0.to_q.{part}': (inner, *shape[1:]), f'{theirs}0.to_kv.{part}': (2 * inner,
                                                                                                    *shape[1:])},
                          lambda q, kv: torch.cat((q, kv)))
        else:
            module, part = rest.rsplit('.', 1)
            plan[ours] = ({theirs + TOWER_LAYER_NAMES[module] + '.' + part: shape}, lambda t: t)
    return plan, ()
