"""What every registered model shares, checked once over the registry (`vit_pytorch.models.MODELS`).

CASES is the table: one small configuration and input for every registered name, plus a few named
variants ('vit[pool=mean]') for options that change which parameters a model has or uses. A new model
joins by its registry entry and one row here; later conformance tests (shapes, the face, export) read
the same rows.

Each row is chosen so that every parameter's gradient is non-zero by the mathematics, not by the
rounding of one CPU kernel:
  - every attention sees at least 2 keys: a softmax over one key is 1 whatever the query, so the query
    projection's gradient is exactly zero (a 1x1 map, a window of one token, global keys sub-sampled
    to one, a last stage pooled to a single token);
  - every BatchNorm normalises at least 3 values a channel in training: over 2 values its output is
    +-1 (up to eps) whatever the input, and nothing upstream gets a gradient;
  - no dropout and no drop-path, so nothing is dropped by chance; token dropping (patch dropout) keeps
    a fixed number of tokens, at least 2 an image;
  - every token path reaches the output (the pooling reads the tokens the parameters act on).
"""

import ast
import fnmatch
import importlib
import io
import re
import textwrap
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F

from helpers import digits_batch, fit_fixed_batch, move_off_initialisation, parameters_without_gradient
from vit_pytorch import recorder
from vit_pytorch.models import INPUTS, MODELS, TOKEN_DROPPING, build_model


@dataclass(frozen=True)
class Case:
    """One row of the conformance table.

    kwargs           the keyword arguments of `build_model(name, **kwargs)`
    input            the input's shape: (b, c, h, w) images, (b, c, length) signals or (b, c, frames, h, w)
                     clips; a list of (c, h, w) shapes for a list of images (NaViT)
    forward          keyword arguments of the forward call
    no_gradient      parameter name (a glob pattern) -> why the model's own design gives it no gradient through
                     the output; each pattern must match a parameter
    training_output  the number of tensors the forward returns in training mode, each (b, num_classes), for a
                     model that returns a tuple there (a distillation head's logits too); in eval mode every
                     model returns one (b, num_classes) tensor
    head             keyword arguments of forward_head, for an extra input that the head reads too (an object
                     mask that the pooling follows); `forward_head(forward_features(x, **forward), **head)` is
                     `model(x, **forward)`
    """
    kwargs: dict
    input: tuple
    forward: dict = field(default_factory=dict)
    no_gradient: dict = field(default_factory=dict)
    training_output: int = 1
    head: dict = field(default_factory=dict)

    def make_input(self, generator, batch=None):
        """The row's input; `batch` images (signals, clips) of the row's shape instead of its own count."""
        if isinstance(self.input, list):
            shapes = self.input if batch is None else (self.input * batch)[:batch]
            return [torch.randn(shape, generator=generator) for shape in shapes]
        return torch.randn(self.input if batch is None else (batch, *self.input[1:]), generator=generator)

    @property
    def batch(self):
        return len(self.input) if isinstance(self.input, list) else self.input[0]


def registry_name(case_id):
    """'vit[pool=mean]' -> 'vit'."""
    return case_id.split('[')[0]


VIT = dict(image_size=(16, 24), patch_size=(4, 8), num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32)
IMAGES = (2, 3, 16, 24)               # a 4x3 grid of patches: 12 tokens (13 with a cls token)
DETPOOL_MASK = torch.zeros(2, 16, 24, dtype=torch.bool)     # an object mask of IMAGES, per pixel
DETPOOL_MASK[0, 2:7, 3:20] = True                           # patches: rows 0-1, columns 0-2
DETPOOL_MASK[1, 9:14, 10:12] = True                         # patches: rows 2-3, column 1
VIDEO = dict(image_size=(16, 24), image_patch_size=(4, 8), frames=4, frame_patch_size=2)
CLIPS = (2, 3, 4, 16, 24)             # 2 x 4 x 3 tubelets
LEVJEPA = dict(image_size=(16, 24), patch_size=(4, 8), frames=4, num_classes=5, dim=16, depth=2, heads=2, dim_head=8,
               mlp_dim=32)
LEVJEPA_ND = dict(ndim=3, input_shape=(4, 16, 24), patch_size=(2, 4, 8), num_classes=5, dim=16, depth=2, heads=2,
                  dim_head=8, mlp_dim=32)
SIGNAL = dict(seq_len=24, patch_size=4, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, channels=2)


# why a parameter gets no gradient through the output, by the mathematics of the model's own design
KEY_CONSTANT = 'a bias added to every key of a query alike, which a softmax over the keys ignores'
KEY_BIAS = 'a bias on the keys adds q . b to every key of a query alike, which the softmax ignores'
BEFORE_BATCHNORM = ('a per-channel shift whose every path to the output passes a BatchNorm in training mode, '
                    'which subtracts the batch mean')
SEQUENCE_POOLING = 'sequence pooling is a softmax over the tokens of one linear score, whose bias is the same for all'
CLS_CLASSIFIES = ('the logits read the cls token only; what acts on the patch tokens alone after their last '
                  'attention reaches forward_features, not the logits')
JET_UNUSED = "a JetViT layer runs the one attention its attn_layers entry chooses; the others wait for the search"
MAX_VIT_BEFORE_BATCHNORM = {'conv_stem.0.bias': BEFORE_BATCHNORM, '*.conv.net.0.bias': BEFORE_BATCHNORM}


def twins_stages(dims=(8, 16, 24, 32), heads=(1, 2, 3, 4), depths=(2, 2, 2, 2), windows=(5, 4, 2, 2), ks=(4, 2, 1, 1)):
    kwargs = {}
    for i in range(4):
        kwargs.update({f's{i + 1}_emb_dim': dims[i], f's{i + 1}_heads': heads[i], f's{i + 1}_mlp_mult': 2,
                       f's{i + 1}_depth': depths[i], f's{i + 1}_global_k': ks[i],
                       f's{i + 1}_local_patch_size': windows[i], f's{i + 1}_patch_size': 2})
    return kwargs


WWT_TOKENS = ("the logits read the slots only: the last layer's updates of the patch tokens reach nothing after it "
              "(vit-pytorch's design; its dense task heads read the tokens)")
WWT_NEXT_MASK = "the last layer's next masks reach nothing after it (a task head reads them)"
WWT_LAST_LAYER = {**{f'transformer.layers.1.attns.{i}.{name}.*': WWT_TOKENS for i in (0, 1)
                     for name in ('to_out', 'tokens_gate')},
                  'transformer.layers.1.mlps.0.*': WWT_TOKENS,
                  'transformer.layers.1.attns.*.mlp_mask.*': WWT_NEXT_MASK}

CASES = {
    'vit': Case(VIT, IMAGES),
    'vit[pool=mean]': Case(dict(VIT, pool='mean'), IMAGES),
    'simple_vit': Case(VIT, IMAGES),
    # LayerScale starts at 0.1 (the paper's value below depth 18), so every branch reaches the output
    'cait': Case(dict(VIT, cls_depth=2), IMAGES, no_gradient={'*.mix_heads_pre_attn.bias': KEY_CONSTANT}),
    'deepvit': Case(VIT, IMAGES),
    'deepvit[pool=mean]': Case(dict(VIT, pool='mean'), IMAGES),
    # two soft splits: 16x24 -> 4x6 -> 2x3 tokens
    't2t': Case(dict(image_size=(16, 24), num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32,
                     t2t_layers=((7, 4), (3, 2)), token_dim=8), IMAGES),
    # two convolutions and poolings of stride 1: 16x24 tokens
    **{f'cct[positional_embedding={embedding}]' if embedding != 'learnable' else 'cct': Case(
        dict(img_size=(16, 24), embedding_dim=16, n_conv_layers=2, kernel_size=3, stride=1, padding=1,
             pooling_kernel_size=3, pooling_stride=1, pooling_padding=1, num_layers=2, num_heads=2, mlp_ratio=2.0,
             num_classes=5, positional_embedding=embedding, attention_dropout=0.0, stochastic_depth_rate=0.0),
        IMAGES, no_gradient={'pool.attention_pool.bias': SEQUENCE_POOLING})
        for embedding in ('learnable', 'sine', 'none')},
    # small patches 4x4 (4x6 grid), large 8x8 (2x3 grid): each branch's cls token attends to the other's 7 tokens
    'cross_vit': Case(dict(image_size=(16, 24), num_classes=5, sm_dim=16, lg_dim=24, sm_patch_size=4, sm_enc_depth=1,
                           sm_enc_heads=2, sm_enc_mlp_dim=32, sm_enc_dim_head=8, lg_patch_size=8, lg_enc_depth=2,
                           lg_enc_heads=2, lg_enc_mlp_dim=32, lg_enc_dim_head=8, cross_attn_depth=1,
                           cross_attn_heads=2, cross_attn_dim_head=8, depth=2, dropout=0.0, emb_dropout=0.0),
                      IMAGES),
    # LayerScale starts at 1.0 in the paper's rule below depth 18 as well; cross-covariance attention over 8 channels
    'xcit': Case(dict(VIT, patch_size=4, cls_depth=2), IMAGES),
    'small_dataset_vit': Case(VIT, IMAGES),
    'small_dataset_vit[pool=mean]': Case(dict(VIT, pool='mean'), IMAGES),
    'parallel_vit': Case(VIT, IMAGES),
    'learnable_memory_vit': Case(VIT, IMAGES),
    # in training the forward returns (logits, distillation logits): both heads get a gradient
    'distillable_vit': Case(VIT, IMAGES, training_output=2),
    'simple_vit_with_register_tokens': Case(dict(VIT, num_register_tokens=2), IMAGES),
    'simple_vit_with_qk_norm': Case(VIT, IMAGES),
    # the default patch_dropout=0.5 keeps 6 of the 12 patches in training (a fixed count, at random places)
    'simple_vit_with_patch_dropout': Case(VIT, IMAGES),
    # 8x8 patches of 2: windows of 4x4 on maps 8x8, 4x4 (one window, shifts off), 2x2
    'swin': Case(dict(img_size=(16, 16), patch_size=2, num_classes=5, embed_dim=8, depths=(2, 2, 2), num_heads=(2, 2, 4),
                      window_size=4, drop_path_rate=0.0), (2, 3, 16, 16)),
    'swinv2': Case(dict(img_size=(16, 16), patch_size=2, num_classes=5, embed_dim=8, depths=(2, 2, 2),
                        num_heads=(2, 2, 4), window_size=4, drop_path_rate=0.0), (2, 3, 16, 16)),
    # 32x48 images: stage maps 4x6, 2x3; windows and grid of 2x3 tokens (6 keys); BatchNorm over 2 x 8 x 12
    # values a channel in the stem
    'max_vit': Case(dict(num_classes=5, dim=8, depth=(1, 2), dim_head=4, dim_conv_stem=8, window_size=(2, 3),
                         dropout=0.0), (2, 3, 32, 48), no_gradient=MAX_VIT_BEFORE_BATCHNORM),
    'max_vit[num_register_tokens=2]': Case(dict(num_classes=5, dim=8, depth=(1, 2), dim_head=4, dim_conv_stem=8,
                                                window_size=(2, 3), dropout=0.0, num_register_tokens=2),
                                           (2, 3, 32, 48), no_gradient=MAX_VIT_BEFORE_BATCHNORM),
    # patches of 4 every 2 pixels: grids 7x11, then 4x6
    'pit': Case(dict(image_size=(16, 24), patch_size=4, num_classes=5, dim=8, depth=(1, 2), heads=(2, 4), dim_head=4,
                     mlp_dim=16), IMAGES),
    # 48x64 images: maps 3x4 then 2x2; every BatchNorm normalises over at least 4 x 4 values a channel
    'levit': Case(dict(image_size=(48, 64), num_classes=5, dim=(16, 24), depth=(1, 2), heads=(2, 3), mlp_mult=2,
                       stages=2, dim_key=4, dim_value=8, num_distill_classes=5), (4, 3, 48, 64), training_output=2,
                  no_gradient={'*.to_out.1.norm.bias': BEFORE_BATCHNORM, 'subsamples.*.ff.3.norm.bias': BEFORE_BATCHNORM,
                               'transformers.*.layers.*.1.3.norm.bias': BEFORE_BATCHNORM,
                               'to_patch_embedding.6.1.bias': BEFORE_BATCHNORM}),
    # 40x56 images: maps 10x14, 5x7, 3x4; keys sub-sampled by 2 (at least 2x2); BatchNorms over 2 x 12 values or more
    'cvt': Case(dict(num_classes=5, s1_emb_dim=8, s1_depth=1, s1_mlp_mult=2, s2_emb_dim=16, s2_heads=2, s2_depth=1,
                     s2_mlp_mult=2, s3_emb_dim=24, s3_heads=3, s3_depth=2, s3_mlp_mult=2), (2, 3, 40, 56),
                no_gradient={'*.to_k_conv.1.bias': KEY_BIAS}),
    'cvt[cls_token=True]': Case(
        dict(num_classes=5, s1_emb_dim=8, s1_depth=1, s1_mlp_mult=2, s2_emb_dim=16, s2_heads=2, s2_depth=1,
             s2_mlp_mult=2, s3_emb_dim=24, s3_heads=3, s3_depth=2, s3_mlp_mult=2, cls_token=True, qkv_bias=True),
        (2, 3, 40, 56),
        # the last stage's cls key comes from to_k, not the convolution: there its bias differs between keys
        no_gradient={'transformers.[01].*.to_k_conv.1.bias': KEY_BIAS, '*.to_k.bias': KEY_BIAS,
                     'transformers.2.layers.1.0.to_q_conv.*': "the logits read the cls token only, and the last "
                     "layer's patch queries (this convolution) reach only the patch tokens"}),
    # 32x24 images: maps 8x6 (keys reduced 2x2 to 4x3), 4x3
    'pvt_v2': Case(dict(num_classes=5, depths=(1, 2), embed_dims=(8, 16), num_heads=(1, 2), sr_ratios=(2, 1),
                        mlp_ratios=(2, 2)), (2, 3, 32, 24)),
    'pvt_v2[linear=True]': Case(dict(num_classes=5, depths=(1, 2), embed_dims=(8, 16), num_heads=(1, 2),
                                     sr_ratios=(2, 1), mlp_ratios=(2, 2), linear=True), (2, 3, 32, 24)),
    # 32x48 images, patches of 2: maps 16x24, 8x12, 4x6, 2x3 (the last has 2x2 windows and 6 global keys; a 1x1
    # last map would leave each attention one key)
    'twins_svt': Case(dict(num_classes=5, **twins_stages()), (2, 3, 32, 48)),
    # 32x32 images, patches of 4: maps 8x8 (16 blocks of 2x2), 4x4 (4 blocks), 2x2 (one block of 4 tokens)
    'nest': Case(dict(image_size=32, patch_size=4, num_classes=5, dim=8, heads=1, num_hierarchies=3,
                      block_repeats=(2, 1, 2), mlp_mult=2), (2, 3, 32, 32)),
    # 32x48 images: maps 16x24, 8x12, 4x6; SDA groups of 3, 3, 4 (the last map one group of 24 tokens), LDA groups
    # of 2x2 spread over each map
    'crossformer': Case(dict(num_classes=5, dim=(48, 64, 96), depth=(1, 1, 1), heads=(1, 2, 2),
                             local_window_size=(3, 3, 4), global_window_size=2,
                             cross_embed_kernel_sizes=((2, 4, 8), (2, 4), (2, 4)), cross_embed_strides=(2, 2, 2),
                             mlp_mult=2), (2, 3, 32, 48),
                        no_gradient={'*.position_bias.9.bias': KEY_CONSTANT,
                                     # a ReLU-MLP's last hidden bias reaches the bias table only through channels
                                     # whose ReLU switches between offsets; in this block, at these weights, none does
                                     'stages.0.blocks.layers.0.0.fn.position_bias.7.bias': 'shifts every offset alike '
                                     'through each channel, whose ReLU is on (or off) at every offset here'}),
    # 64x64 images: maps 16x16, 8x8, 4x4, 2x2; windows of 2x2 (4 tokens), grouped windows of 4x4 capped at the map
    'sep_vit': Case(dict(num_classes=5, image_size=64, dim=8, depth=(1, 2, 2, 1), heads=(1, 2, 2, 4), window_size=2,
                         grouped_window_size=4, ff_mult=2), (2, 3, 64, 64)),
    # 32x32 images: maps 8x8, 4x4, 2x2; IWSA windows of 2x2, SSA keys reduced to 4x4, 2x2, 2x2
    'scalable_vit': Case(dict(num_classes=5, dim=4, depth=(2, 2, 1), heads=(1, 2, 2), reduction_factor=(2, 2, 1),
                              window_size=(2, 2, 2), ssa_dim_key=(5, 8, 8), ff_expansion_factor=2,
                              head_hidden_dim=16), (2, 3, 32, 32), no_gradient={'*.to_k.bias': KEY_BIAS}),
    # 32x32 images: local maps 8x8, 4x4 and regional 2x2... 4x4, 2x2 (windows of 2x2 local tokens)
    'regionvit': Case(dict(dim=(16, 32), depth=(1, 2), window_size=2, num_classes=5, dim_head=8, mlp_mult=2),
                      (2, 3, 32, 32),
                      no_gradient={'stages.1.transformer.layers.1.attention.relative_position_bias':
                                   "the logits read the last stage's regional tokens only; the last block's bias "
                                   'between local tokens reaches the local maps, not the logits '
                                   '(tests/test_regionvit.py checks it reaches them)'}),
    'regionvit[tokenize_local_3_conv=False]': Case(
        dict(dim=(16, 32), depth=(1, 2), window_size=2, num_classes=5, dim_head=8, mlp_mult=2,
             tokenize_local_3_conv=False), (2, 3, 32, 32),
        no_gradient={'stages.1.transformer.layers.1.attention.relative_position_bias':
                     "the logits read the last stage's regional tokens only (as in 'regionvit')"}),
    # 40x72 images: MobileViT blocks on maps 5x9, 3x5, 2x3 (2x2 patches, the maps rounded up to whole patches:
    # attention over 15, 6 and 2 patches; a 2x2 last map would leave one key); every BatchNorm over at least
    # 2 x 2 x 3 values a channel
    'mobile_vit': Case(dict(image_size=(40, 72), dims=(8, 16, 24), widths=(8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 32),
                            num_classes=5, expansion=2, depths=(1, 2, 1)), (2, 3, 40, 72),
                       no_gradient={'stages.1.*.net.7.bias': BEFORE_BATCHNORM, 'stages.0.0.net.7.bias': BEFORE_BATCHNORM,
                                    '*.transformer.norm.bias': BEFORE_BATCHNORM}),
    # a batch as one tensor; packing and token dropout: tests/test_na_vit.py
    'na_vit': Case(dict(image_size=(32, 48), patch_size=8, num_classes=5, dim=16, depth=2, heads=2, dim_head=8,
                        mlp_dim=32), IMAGES),
    'na_vit[list]': Case(dict(image_size=(32, 48), patch_size=8, num_classes=5, dim=16, depth=2, heads=2, dim_head=8,
                              mlp_dim=32), [(3, 32, 48), (3, 8, 16), (3, 24, 8), (3, 16, 16)]),
    'vit_1d': Case(SIGNAL, (2, 2, 24)),
    'simple_vit_1d': Case(SIGNAL, (2, 2, 24)),
    'vit_3d': Case(dict(VIDEO, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32), CLIPS),
    'vit_3d[pool=mean]': Case(dict(VIDEO, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32,
                                   pool='mean'), CLIPS),
    'simple_vit_3d': Case(dict(VIDEO, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32), CLIPS),
    **{f'vivit[variant={variant},pool={pool}]' if (variant, pool) != ('factorized_encoder', 'cls') else 'vivit': Case(
        dict(VIDEO, num_classes=5, dim=16, spatial_depth=2, temporal_depth=2, heads=2, dim_head=8, mlp_dim=32,
             variant=variant, pool=pool), CLIPS)
       for variant in ('factorized_encoder', 'factorized_self_attention') for pool in ('cls', 'mean')},
    'cct_3d': Case(dict(img_size=(16, 24), num_frames=4, embedding_dim=16, n_conv_layers=1, kernel_size=3, stride=1,
                        padding=1, num_layers=2, num_heads=2, mlp_ratio=2.0, num_classes=5,
                        positional_embedding='learnable', attention_dropout=0.0, stochastic_depth_rate=0.0), CLIPS,
                   no_gradient={'pool.attention_pool.bias': SEQUENCE_POOLING}),
    # vit-pytorch's infrastructure modules; the default patch_dropout=0.25 keeps 9 of the 12 patches in training
    'vit_with_patch_dropout': Case(VIT, IMAGES),
    'vit_with_patch_dropout[pool=mean]': Case(dict(VIT, pool='mean'), IMAGES),
    'simple_flash_attn_vit': Case(VIT, IMAGES),
    'simple_flash_attn_vit[use_flash=False]': Case(dict(VIT, use_flash=False), IMAGES),
    'simple_flash_attn_vit_3d': Case(dict(VIDEO, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32),
                                     CLIPS),
    # a list of images as vit-pytorch's nested tensors take them: 4x6, 1x2, 3x1 and 2x2 patches, each its own sequence
    'na_vit_nested_tensor': Case(dict(image_size=(32, 48), patch_size=8, num_classes=5, dim=16, depth=2, heads=2,
                                      dim_head=8, mlp_dim=32), [(3, 32, 48), (3, 8, 16), (3, 24, 8), (3, 16, 16)]),
    # volumes of 2 x 4 x 3, 1 x 2 x 1 and 2 x 1 x 2 tubelets, each after 2 registers
    'na_vit_nested_tensor_3d': Case(dict(image_size=(16, 24), max_frames=4, patch_size=(4, 8), frame_patch_size=2,
                                         num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32,
                                         num_registers=2), [(3, 4, 16, 24), (3, 2, 8, 8), (3, 4, 4, 16)]),
    # as 'max_vit[num_register_tokens=2]', through vit-pytorch's path
    'max_vit_with_registers': Case(dict(num_classes=5, dim=8, depth=(1, 2), dim_head=4, dim_conv_stem=8,
                                        window_size=(2, 3), dropout=0.0, num_register_tokens=2),
                                   (2, 3, 32, 48), no_gradient=MAX_VIT_BEFORE_BATCHNORM),
    # research long tail I (issue 26). DetPool without a mask is a mean-pooled ViT; with one (an extra input of
    # forward and forward_head), per pixel, the first image's object covers 6 of its 12 patches, the second's 2
    'vit_detpool': Case(VIT, IMAGES),
    'vit_detpool[use_cls_token=False]': Case(dict(VIT, use_cls_token=False), IMAGES),
    'vit_detpool[object_mask]': Case(VIT, IMAGES, forward=dict(object_mask=DETPOOL_MASK),
                                     head=dict(object_mask=DETPOOL_MASK)),
    # depth 3: the first layer's qkv specialized (depth // 3); the cls token classifies
    'simple_vit_with_specialized_cls': Case(
        dict(VIT, depth=3), IMAGES,
        no_gradient={'transformer.norm.fns.1.*': CLS_CLASSIFIES,
                     'transformer.layers.2.1.norm.fns.1.*': "the last feed-forward's norm of the patch tokens: " +
                     CLS_CLASSIFIES}),
    # Fourier patches of 8 x 8 frequencies: 2 x 3 Fourier tokens before the 4 x 3 patch tokens
    'simple_vit_with_fft': Case(dict(VIT, freq_patch_size=8), IMAGES),
    # 2x3 compressed tokens of 8x8 pixels read 4x6 lookup tokens of 4x4 pixels
    'look_vit': Case(dict(image_size=(16, 24), patch_size=8, highres_patch_size=4, num_classes=5, dim=16, depth=2,
                          heads=2, dim_head=8, cross_attn_heads=2, cross_attn_dim_head=8, patch_conv_kernel_size=3,
                          dropout=0.), IMAGES),
    # a jumbo token of 2 x 16 channels before the 12 patch tokens
    'jumbo_vit': Case(dict(VIT, jumbo_cls_k=2), IMAGES),
    # a 4x3 grid: offsets -3..3 and -2..2 read the banks; max_dist=3 leaves the offsets of 3 rows without a bias
    'simple_vit_with_relative_proj_pos_bias': Case(dict(VIT, num_distance_basis=4), IMAGES),
    'simple_vit_with_relative_proj_pos_bias[max_dist=3]': Case(dict(VIT, num_distance_basis=4, max_dist=3), IMAGES),
    # ATS keeps at most 8, then 4 of the 12 patches (its token count depends on the image, in fixed slots)
    'ats_vit': Case(dict(VIT, max_tokens_per_depth=(8, 4)), IMAGES),
    # a plain first layer, then the official code's rule: the second samples 12 points over its 12 patches
    'ats_vit[always_sample]': Case(dict(VIT, max_tokens_per_depth=(None, 12), always_sample=True), IMAGES),
    # the 12 patch tokens merged into 4 after the first layer: the second attends over 4
    'vit_with_patch_merger': Case(dict(VIT, patch_merge_layer=1, patch_merge_num_tokens=4), IMAGES),
    # the second layer mixes its values with the first's: learned per token and head, or fixed as the paper's 0.5
    'simple_vit_with_value_residual': Case(VIT, IMAGES),
    'simple_vit_with_value_residual[value_residual_mix=0.5]': Case(dict(VIT, value_residual_mix=0.5), IMAGES),
    # each branch adds its part orthogonal to the stream (in float64), or both parts modulated (learned); per token,
    # or per image over all 12 tokens and 16 channels (global)
    'simple_vit_orthog_residual_update': Case(VIT, IMAGES),
    'simple_vit_orthog_residual_update[learned]': Case(
        dict(VIT, orthog_residual_update_kwargs=dict(learned=True)), IMAGES),
    'simple_vit_orthog_residual_update[global]': Case(
        dict(VIT, orthog_residual_update_kwargs=dict(orthogonal_method='global')), IMAGES),
    # the registered class returns the logits alone unless asked for its loss (the trainer asks: AUX_LOSSES)
    'vit_with_decorr': Case(VIT, IMAGES),
    # a cls token, 2 registers and the 4x3 patches; every token but the cls token turned by its rotary angles; the
    # LayerScales start at 0.1, not the paper's 1e-4 (which leaves the cls token's output 4e-4 from constant at init)
    'vit_5': Case(dict(VIT, num_registers=2, layer_scale_init=0.1), IMAGES),
    # no position table: the 4x3 grid's rotary angles; convolutional queries and GEGLU, or linear queries and GELU
    'rvt': Case(dict(VIT, image_size=24), IMAGES,
                no_gradient={'transformer.layers.1.0.to_q.conv.*': "the last layer's queries of the patch tokens: " +
                             CLS_CLASSIFIES}),
    'rvt[plain]': Case(dict(VIT, image_size=24, use_ds_conv=False, use_glu=False), IMAGES),
    # every hidden state and weight vector on the unit sphere; the SwiGLU 21 wide (int(32 * 2 / 3))
    'normalized_vit': Case(VIT, IMAGES),
    # 4 sub-layers: a pre-LN residual, then three LN(4 x + F(x)); cls and mean pooling
    'vit_with_keel_post_ln': Case(VIT, IMAGES),
    'vit_with_keel_post_ln[pool=mean]': Case(dict(VIT, pool='mean'), IMAGES),
    # the 12 patch tokens' feed-forward convolves their 4x3 grid; the cls token bypasses it
    'local_vit': Case(VIT, IMAGES, no_gradient={
        'transformer.layers.1.1.*': "the last feed-forward changes only the patch tokens, and the head reads the cls "
                                    "token, which bypasses it (the paper's design, as vit-pytorch's)"}),
    # with the official 'hs+se' squeeze-excitation (32 // 4 = 8 wide) after the depthwise convolution
    'local_vit[se_reduction=4]': Case(dict(VIT, se_reduction=4), IMAGES, no_gradient={
        'transformer.layers.1.1.*': "the last feed-forward changes only the patch tokens, and the head reads the cls "
                                    "token, which bypasses it (the paper's design, as vit-pytorch's)"}),
    # the G1 gate on each head's attention output; forward(img) gives the logits (return_loss=True adds the loss)
    'simple_vit_with_sparse_gating': Case(dict(VIT, num_register_tokens=2), IMAGES),
    # one layer of each kind on a 4x6 grid (windows of 2x2: 4 keys); a layer's two other attentions do not run
    'jet_vit': Case(dict(VIT, patch_size=4, window_size=2, depth=3, attn_layers=['LA', 'WA', 'FA']), IMAGES,
                    no_gradient={f'transformer.layers.{layer}.0.options.{kind}.*': JET_UNUSED
                                 for layer, kinds in enumerate((('WA', 'FA'), ('LA', 'FA'), ('WA', 'LA')))
                                 for kind in kinds}),
    # one pre-loop layer, one looped layer run twice, one post-loop layer; the cls token classifies
    'looped_vit': Case(dict({key: value for key, value in VIT.items() if key != 'depth'}, pre_loop_depth=1,
                            num_looped_blocks=1, post_loop_depth=1, loop_depth=2), IMAGES),
    # research long tail III (issue 28). The clips as a 3-D input of 2 x 4 x 3 tubelets, or with time causal
    'vit_nd': Case(dict(ndim=3, input_shape=(4, 16, 24), patch_size=(2, 4, 8), num_classes=5, dim=16, depth=2, heads=2,
                        dim_head=8, mlp_dim=32), CLIPS),
    'vit_nd[causal_dims=0]': Case(dict(ndim=3, input_shape=(4, 16, 24), patch_size=(2, 4, 8), num_classes=5, dim=16,
                                       depth=2, heads=2, dim_head=8, mlp_dim=32, causal_dims=0), CLIPS),
    # MOSS over each of the 2 slices' 4 x 3 patch tokens; time causal (the default), or not with mean pooling
    'vivit_with_moss': Case(dict(VIDEO, num_classes=5, dim=16, spatial_depth=2, temporal_depth=2, heads=2, dim_head=8,
                                 mlp_dim=32, moss_hidden_dim=8), CLIPS),
    'vivit_with_moss[pool=mean,moss_causal=False]': Case(
        dict(VIDEO, num_classes=5, dim=16, spatial_depth=2, temporal_depth=2, heads=2, dim_head=8, mlp_dim=32,
             moss_hidden_dim=8, pool='mean', moss_causal=False), CLIPS),
    # three hyper-connected streams around each branch and two registers; dynamic, or the paper's static connections
    'simple_vit_with_hyper_connections': Case(dict(VIT, num_residual_streams=3, num_register_tokens=2), IMAGES),
    'simple_vit_with_hyper_connections[dynamic=False]': Case(
        dict(VIT, num_residual_streams=3, num_register_tokens=2, dynamic=False), IMAGES),
    # every branch reads a softmax over depth of the outputs before it: a learned pseudo-query, or the latest output
    'simple_vit_attn_residual': Case(VIT, IMAGES),
    'simple_vit_attn_residual[learned_query=False]': Case(dict(VIT, learned_query=False), IMAGES),
    # Block AttnRes: the softmax over blocks of 2 branches (the tokens, one layer's summed outputs) and a partial sum
    'simple_vit_attn_residual[block_size=2]': Case(dict(VIT, block_size=2), IMAGES),
    # separate query, key and value depth mixes, shared by the heads or one per group of heads and MLP head
    'attn_residual_with_dca_simple_vit': Case(VIT, IMAGES),
    'attn_residual_with_dca_simple_vit[head_groups=2]': Case(dict(VIT, head_groups=2, ffn_heads=2), IMAGES),
    # depth 3: block 0's output reaches block 2 through its skip Linear around the middle block; two registers
    'simple_uvit': Case(dict(VIT, depth=3, num_register_tokens=2), IMAGES),
    # the 12 patch tokens read by 4 part slots and 2 whole slots, with registers; or tokens reading the slots by a
    # second query group, three levels and the level-to-level interactions, the mask groups projected
    'wwt': Case(dict(VIT, num_slots=(4, 2), num_register_tokens=1, num_register_slots=1), IMAGES,
                no_gradient=WWT_LAST_LAYER),
    'wwt[token_softmax_over_slots]': Case(dict(VIT, num_slots=(4, 3, 2), interactions=((0, 1), (0, 2), (1, 2), (2, 3)),
                                               token_softmax_over_slots=True, project_mask_groups=True,
                                               l1norm_after_tokens_softmax=True, num_register_tokens=1,
                                               num_register_slots=1), IMAGES,
                                          no_gradient=dict(WWT_LAST_LAYER, **{
                                              'transformer.layers.1.attns.*.mask_project.*': WWT_NEXT_MASK})),
    # rotary N-D positions, no cls token: all, or with time causal and a quarter of the frequencies 0
    'vit_nd_rotary': Case(dict(ndim=3, input_shape=(4, 16, 24), patch_size=(2, 4, 8), num_classes=5, dim=16, depth=2,
                               heads=2, dim_head=8, mlp_dim=32), CLIPS),
    'vit_nd_rotary[causal_dims=0]': Case(dict(ndim=3, input_shape=(4, 16, 24), patch_size=(2, 4, 8), num_classes=5,
                                              dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, causal_dims=0,
                                              rope_p_zero_freqs=0.25), CLIPS),    # PoPE: all, or with time causal and the learned phase offset started uniform
    'vit_nd_pope': Case(dict(ndim=3, input_shape=(4, 16, 24), patch_size=(2, 4, 8), num_classes=5, dim=16, depth=2,
                             heads=2, dim_head=8, mlp_dim=32), CLIPS),
    'vit_nd_pope[causal_dims=0]': Case(dict(ndim=3, input_shape=(4, 16, 24), patch_size=(2, 4, 8), num_classes=5,
                                            dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, causal_dims=0,
                                            pope_init_learned_bias_uniform=True), CLIPS),
    # LeVJEPA's encoder with a head on its cls token: 4 frames of 4 x 3 patches (48 patch tokens), block-causal; in
    # training, half of them dropped (24 kept, the forward's drop_ratio); or every token attending to every other
    'levjepa': Case(LEVJEPA, CLIPS),
    'levjepa[drop_ratio=0.5]': Case(LEVJEPA, CLIPS, forward=dict(drop_ratio=0.5)),
    'levjepa[block_causal=False]': Case(dict(LEVJEPA, block_causal=False), CLIPS),
    # levjepa_nd's N-D encoder on the clips in tubelets of 2 x 4 x 8 (2 x 4 x 3 = 24 patch tokens), time causal; half
    # of them dropped in training; or no causal dimension
    'levjepa_nd': Case(LEVJEPA_ND, CLIPS),
    'levjepa_nd[drop_ratio=0.5]': Case(LEVJEPA_ND, CLIPS, forward=dict(drop_ratio=0.5)),
    'levjepa_nd[causal_dims=()]': Case(dict(LEVJEPA_ND, causal_dims=()), CLIPS),
}


def build(case_id):
    """The model of a row, seeded, in training mode, and the row's input."""
    torch.manual_seed(0)
    model = build_model(registry_name(case_id), **CASES[case_id].kwargs).train()
    return model, CASES[case_id].make_input(torch.Generator().manual_seed(1))


def test_the_table_covers_every_registered_model():
    assert {registry_name(case_id) for case_id in CASES} == set(MODELS)


@pytest.mark.parametrize('case_id', sorted(CASES))
def test_a_new_models_output_depends_on_its_input(case_id):
    """A zero-initialised head (as `reset_classifier` gives) would make the output 0 for every input, and every
    parameter upstream of it get no gradient: a new model's head is not zero-initialised."""
    model, x = build(case_id)
    outputs = []
    for img in (x, CASES[case_id].make_input(torch.Generator().manual_seed(2))):
        torch.manual_seed(3)                   # the same token dropping for both
        with torch.no_grad():
            out = model(img, **CASES[case_id].forward)
        outputs.append(torch.cat([o.flatten() for o in out]) if isinstance(out, tuple) else out.flatten())
    first, second = outputs
    assert (first - second).abs().max() > 1e-3 * first.abs().max()


@pytest.mark.parametrize('case_id', sorted(CASES))
def test_every_parameter_gets_a_gradient(case_id):
    """At a generic point of parameter space: every parameter is moved off its initialisation first (fixed noise).
    An initialisation is a special point: a LayerScale, BatchNorm weight (LeViT) or post-norm (Swin V2) at zero
    gives everything inside its branch no gradient, and small weights make every softmax near uniform, which
    shrinks the query and key gradients to ~1e-7 of the head's (measured); neither says anything about the graph."""
    model, x = build(case_id)
    move_off_initialisation(model)
    case = CASES[case_id]
    names = [name for name, _ in model.named_parameters()]
    assert [pattern for pattern in case.no_gradient if not fnmatch.filter(names, pattern)] == []
    missing = parameters_without_gradient(model, model(x, **case.forward))
    assert [name for name in missing if not any(fnmatch.fnmatch(name, p) for p in case.no_gradient)] == []


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def case_table(exempt=None, slow=False):
    """`parametrize` over every row; `exempt` maps a row (or a registry name: all its rows) to why the test does
    not apply to it, and those rows are skipped with that reason."""
    exempt = exempt or {}
    marks = [pytest.mark.slow] if slow else []
    params = []
    for case_id in sorted(CASES):
        reason = exempt.get(case_id, exempt.get(registry_name(case_id)))
        params.append(pytest.param(case_id, marks=marks + ([pytest.mark.skip(reason=reason)] if reason else []),
                                   id=case_id))
    return pytest.mark.parametrize('case_id', params)


@pytest.mark.parametrize('name', sorted(TOKEN_DROPPING))
def test_a_declared_token_dropping_keyword_drops_patches_in_training_only(name):
    """The registry's TOKEN_DROPPING keyword of forward_features keeps the prefix tokens and max(1, int(n * (1 -
    ratio))) of the n patch tokens in training (n counted in eval mode), and every token in eval mode."""
    model, x = build(name)
    keyword = {TOKEN_DROPPING[name]: 0.75}
    with torch.no_grad():
        every = model.eval().forward_features(x).shape[1]
        patches = every - model.num_prefix_tokens
        assert model.forward_features(x, **keyword).shape[1] == every
        assert model.train().forward_features(x, **keyword).shape[1] == model.num_prefix_tokens + max(1, int(
            patches * 0.25))


def test_every_registered_name_has_a_row_of_its_own():
    """The export sweep and the docstring examples take the row named like the model: every name has one."""
    assert set(MODELS) <= set(CASES)


# output shapes


@case_table()
def test_output_has_one_row_per_input_and_one_column_per_class(case_id):
    model, x = build(case_id)
    case = CASES[case_id]
    expected = (case.batch, case.kwargs['num_classes'])
    training = as_tuple(model(x, **case.forward))
    assert [tuple(out.shape) for out in training] == [expected] * case.training_output
    with torch.no_grad():
        assert model.eval()(x, **case.forward).shape == expected


# gradient checkpointing

def forward_backward(model, x, case, seed=3):
    torch.manual_seed(seed)                    # the same token dropping both times
    outputs = as_tuple(model(x, **case.forward))
    sum((out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum() for out in outputs).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return [out.detach() for out in outputs], grads


def forward_calls_during_backward(model, x, case):
    """How many module forwards run inside the backward pass: recomputation is what checkpointing is."""
    calls, in_backward = [0], [False]
    hooks = [module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + in_backward[0]))
             for module in model.modules()]
    try:
        outputs = as_tuple(model(x, **case.forward))
        in_backward[0] = True
        sum(out.sum() for out in outputs).backward()
    finally:
        for hook in hooks:
            hook.remove()
    model.zero_grad(set_to_none=True)
    return calls[0]


@case_table()
def test_gradient_checkpointing_recomputes_and_gives_the_same_outputs_and_gradients(case_id):
    model, x = build(case_id)
    move_off_initialisation(model)
    case = CASES[case_id]
    plain_outputs, plain_grads = forward_backward(model, x, case)
    assert forward_calls_during_backward(model, x, case) == 0
    model.set_grad_checkpointing(True)
    assert forward_calls_during_backward(model, x, case) > 0
    outputs, grads = forward_backward(model, x, case)
    # the recomputation runs the same kernels on the same values: equal up to the order of the gradient sums
    for out, plain in zip(outputs, plain_outputs):
        torch.testing.assert_close(out, plain, rtol=0, atol=0)
    assert grads.keys() == plain_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=1e-5, atol=1e-7, msg=name)


# state_dict round trip and the empty batch


@case_table()
def test_strict_state_dict_round_trip_into_a_fresh_model_gives_identical_outputs(case_id):
    source, x = build(case_id)
    move_off_initialisation(source)
    torch.manual_seed(1)
    fresh = build_model(registry_name(case_id), **CASES[case_id].kwargs)
    forward = CASES[case_id].forward
    with torch.no_grad():
        expected = source.eval()(x, **forward)
        assert not torch.equal(fresh.eval()(x, **forward), expected)     # the load is what makes them equal
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    fresh.load_state_dict(torch.load(buffer, weights_only=True), strict=True)
    with torch.no_grad():
        assert torch.equal(fresh(x, **forward), expected)


EMPTY_BATCH = {'na_vit[list]': 'an empty list of images has no size to pack; NaViT refuses it',
               'vit_detpool[object_mask]': "its object_mask is a batch of 2 (row 'vit_detpool' takes the empty batch)",
               'na_vit_nested_tensor': 'an empty list of images has no size to pack; it refuses it by name',
               'na_vit_nested_tensor_3d': 'an empty list of volumes has no size to pack; it refuses it by name'}


@case_table(exempt=EMPTY_BATCH)
def test_empty_batch_gives_an_empty_output_and_zero_gradients(case_id):
    model, _ = build(case_id)
    case = CASES[case_id]
    x = case.make_input(torch.Generator().manual_seed(1), batch=0)
    outputs = as_tuple(model(x, **case.forward))
    assert [tuple(out.shape) for out in outputs] == [(0, case.kwargs['num_classes'])] * case.training_output
    sum(out.sum() for out in outputs).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is None or not parameter.grad.any(), name
    with torch.no_grad():
        assert model.eval()(x, **case.forward).shape == (0, case.kwargs['num_classes'])


# the module docstring's example


def docstring_example(module):
    """The indented code blocks of a module docstring that start with an import, joined (later blocks use earlier
    names)."""
    blocks, block = [], []
    for line in (module.__doc__ or '').splitlines():
        if line.startswith('    ') or (block and not line.strip()):
            block.append(line)
        elif block:
            blocks.append(textwrap.dedent('\n'.join(block)).strip())
            block = []
    if block:   # a docstring that ends with its example
        blocks.append(textwrap.dedent('\n'.join(block)).strip())
    return '\n\n'.join(b for b in blocks if b.startswith(('import ', 'from ')))


def model_module(name):
    return importlib.import_module(MODELS[name].split(':')[0])


# the module docstrings that show no example (every registered model's has one; a new model without one must say
# why here)
NO_EXAMPLE = set()


def test_the_models_without_a_docstring_example_are_the_declared_ones():
    assert {name for name in MODELS if not docstring_example(model_module(name))} == NO_EXAMPLE


@pytest.mark.slow                 # the examples build the papers' sizes: 4-90 s each on 2 cores
@pytest.mark.parametrize('name', sorted(set(MODELS) - NO_EXAMPLE))
def test_the_module_docstring_example_runs(name):
    # every example states the shape of what it computes in a comment (`logits = model(x)   # (2, 1000)`): each
    # stated shape is checked right after its statement
    code = checked_example(docstring_example(model_module(name)))
    assert 'assert ' in code, 'the example states no shape of its results'
    exec(compile(code, f'{MODELS[name]} docstring', 'exec'), {})


STATED = re.compile(r'^\s*([A-Za-z_][\w, ]*?)\s*=[^#]*#\s*((?:\(\d+(?:, \d+)*\)(?:,\s*|\s+and\s+)?)+)')


def checked_example(code):
    """`code` with `assert tuple(name.shape) == shape` after each statement whose line states its targets' shapes
    (`a, b = ...   # (2, 10), (2, 8)`: the shapes in order, as many as are stated; one name with several shapes is
    a list of tensors of those shapes)."""
    lines = code.splitlines()
    ends = {node.lineno: node.end_lineno for node in ast.parse(code).body}
    checks = {}
    for number, line in enumerate(lines, 1):
        stated = STATED.match(line)
        if stated and number in ends:
            names = [n.strip() for n in stated.group(1).split(',')]
            shapes = re.findall(r'\((\d+(?:, \d+)*)\)', stated.group(2))
            if len(names) == 1 and len(shapes) > 1:      # one name, a list of tensors: the shape of each
                checks[ends[number]] = [f'assert [tuple(t.shape) for t in {names[0]}] == [{"), (".join(shapes).join("()")}]']
            else:
                checks[ends[number]] = [f'assert tuple({n}.shape) == ({s},), ({n!r}, tuple({n}.shape))'
                                        for n, s in zip(names, shapes) if n != '_']
    return '\n'.join(line + ''.join('\n' + check for check in checks.get(number, []))
                     for number, line in enumerate(lines, 1))


# torch.compile


@case_table(slow=True)
def test_compiles_as_one_graph_forward_and_backward_and_matches_eager(case_id):
    # a fresh compiler: a code object shared by many models (ViT.forward) otherwise reaches dynamo's recompile limit
    # after eight rows in one process, and a row compiled after another of the same class is traced with the shapes
    # dynamo marked dynamic then
    torch.compiler.reset()
    model, x = build(case_id)
    model.eval()                                   # no token dropping: the same output both ways
    forward = CASES[case_id].forward
    compiled = torch.compile(model, fullgraph=True, backend='eager')
    out = compiled(x, **forward)
    out.sum().backward()
    # a parameter the row declares without gradient by design may not be reached at all (JetViT's unchosen attentions)
    declared = CASES[case_id].no_gradient
    assert [name for name, p in model.named_parameters()
            if p.grad is None and not any(fnmatch.fnmatch(name, pattern) for pattern in declared)] == []
    with torch.no_grad():
        torch.testing.assert_close(out.detach(), model(x, **forward))


# learning: a tiny model fits a fixed batch of real digits

# the digits are images: the signal and clip models fit their own data in tests/test_train_kinds.py
NOT_IMAGES = {case_id: 'takes ' + INPUTS[registry_name(case_id)] for case_id in CASES if registry_name(case_id) in INPUTS}


@case_table(exempt=dict(NOT_IMAGES, **{'na_vit[list]': "NaViT fits the same batch as one tensor (row 'na_vit')",
                                       'vit_detpool[object_mask]': 'its object_mask is a batch of 2, not of 32'}),
            slow=True)
def test_a_tiny_model_fits_a_fixed_batch_of_real_digits(case_id):
    """32 real handwritten digits, resized to the row's image size: every label predicted after at most 300
    steps of AdamW. A model whose gradient or head is wrong stays near 10% (the share of one digit)."""
    case = CASES[case_id]
    x = case.make_input(torch.Generator().manual_seed(1))
    ten_classes = {key: 10 for key in ('num_classes', 'num_distill_classes') if key in case.kwargs}
    torch.manual_seed(0)
    model = build_model(registry_name(case_id), **dict(case.kwargs, **ten_classes)).train()
    digits, labels = digits_batch(32)
    like = x[0] if isinstance(x, list) else x[0, ...]        # a row that takes a list of images: 32 of its first's
    images = F.interpolate(digits, size=like.shape[-2:], mode='nearest').expand(-1, like.shape[0], -1, -1).contiguous()
    images = list(images) if isinstance(x, list) else images
    classify = (lambda img: as_tuple(model(img, **case.forward))[0])
    accuracy, steps = fit_fixed_batch(Classifier(classify, model), images, labels)
    assert accuracy == 1.0, f'{accuracy:.2f} after {steps} steps'


class Classifier(torch.nn.Module):
    """The first output of a model that returns a tuple in training (its class logits), for the training loop."""

    def __init__(self, classify, model):
        super().__init__()
        self.model, self.classify = model, classify

    def forward(self, img):
        return self.classify(img)


# the wrappers: self-supervised learners, distillation, video, the recorder and the extractor, each around a
# tiny ViT. A new wrapper joins by its row: how to build it, and one training step's loss.


# two views of two frames, tasks, advantages and an extra token, the policy reading every state of the tower
VAT_POLICY = dict(dim=16, depth=3, heads=2, dim_head=8, dim_action=2, mlp_dim=32, num_views=2, num_tasks=2,
                  dim_extra_token=3, num_register_tokens=2, action_chunk_len=3, time_seq_len=2, self_attn_heads=2,
                  self_attn_dim_head=8, vit_layer_indices=(0, 1, 2), num_advantage_bins=2)


def tiny_vit():
    from vit_pytorch import ViT
    return ViT(**VIT)


def wrapped_images(batch=2):
    return torch.randn(batch, *IMAGES[1:], generator=torch.Generator().manual_seed(1))


def weighted(out):
    """A loss that reads every element of `out` (a tensor or a tuple of them) with its own weight."""
    return sum((t * torch.linspace(-1, 1, t.numel()).reshape(t.shape)).sum() for t in as_tuple(out)
               if t.is_floating_point())


def build_wrapper(name):
    from vit_pytorch.accept_video_wrapper import AcceptVideoWrapper
    from vit_pytorch.cvt import CvT
    from vit_pytorch.dino import Dino
    from vit_pytorch.distill import DeiT, DistillWrapper
    from vit_pytorch.lejepa import LeJEPA
    from vit_pytorch.levjepa import LeVJEPA, VideoTransformer
    from vit_pytorch.levjepa_nd import LeVJEPAND, NDTransformer
    from vit_pytorch.es_vit import EsViTTrainer
    from vit_pytorch.mae import MAE
    from vit_pytorch.mp3 import MP3
    from vit_pytorch.mp3 import ViT as MP3ViT
    from vit_pytorch.mpp import MPP
    from vit_pytorch.recorder import Extractor, Recorder
    from vit_pytorch.simmim import SimMIM
    from vit_pytorch.vat import VAT
    from vit_pytorch.vat import ViT as VATViT
    from vit_pytorch.vaat import AST, VAAT
    from vit_pytorch.vat_siglip import SigLIPVAT
    from vit_pytorch.vit_with_decorr import ViT as ViTWithDecorr

    torch.manual_seed(0)
    return {
        'mae': lambda: MAE(encoder=tiny_vit(), decoder_dim=16, decoder_depth=1, decoder_heads=2, decoder_dim_head=8),
        'simmim': lambda: SimMIM(encoder=tiny_vit()),
        'mpp': lambda: MPP(transformer=tiny_vit()),
        'dino': lambda: Dino(tiny_vit(), image_size=(16, 24), projection_hidden_size=32, num_classes_K=64,
                             bottleneck_dim=16),
        'distill_wrapper': lambda: DistillWrapper(teacher=tiny_vit(), student=DeiT(**VIT)),
        'accept_video_wrapper': lambda: AcceptVideoWrapper(tiny_vit()),
        'extractor': lambda: Extractor(tiny_vit()),
        'recorder': lambda: Recorder(tiny_vit()),
        'vit_with_decorr': lambda: ViTWithDecorr(**VIT),
        'mp3': lambda: MP3(MP3ViT(**VIT), 0.5),
        'lejepa': lambda: LeJEPA(tiny_vit(), image_size=(16, 24), projection_hidden_size=32, num_classes_K=16,
                                 sigreg_loss_kwargs=dict(num_slices=32)),
        'levjepa': lambda: LeVJEPA(VideoTransformer(image_size=(16, 24), patch_size=8, frames=2, dim=16, depth=2,
                                                    heads=2, dim_head=8, mlp_dim=32),
                                   (16, 24), local_size=(8, 16), num_local_views=2, num_classes_K=8,
                                   projection_hidden=16, drop_ratio=0.5, sigreg_loss_kwargs=dict(num_proj=16)),
        'levjepa_nd': lambda: LeVJEPAND(NDTransformer(ndim=2, input_shape=(8, 12), patch_size=(2, 4), dim=16, depth=2,
                                                      heads=2, dim_head=8, mlp_dim=32, channels=2),
                                        input_shape=(8, 12), augment_tgt=lambda x: x.flip(-1), num_classes_K=8,
                                        projection_hidden=16, drop_ratio=0.5, sigreg_loss_kwargs=dict(num_proj=16)),
        # crops of 32 x 48: CvT's last stage is then 4 x 6 with 2 x 3 keys (at 16 x 24 it has one key, and a softmax
        # over one key gives its queries and keys no gradient)
        'es_vit': lambda: EsViTTrainer(CvT(**CASES['cvt'].kwargs), image_size=(32, 48), hidden_layer='layers',
                                       projection_hidden_size=32, num_classes_K=64, bottleneck_dim=16),
        'vat': lambda: VAT(VATViT(**VIT, num_register_tokens=1), **VAT_POLICY),
        'vat_siglip': lambda: SigLIPVAT(**VAT_POLICY, siglip_image_size=16, siglip_patch_size=8, siglip_dim=16,
                                        siglip_depth=2, siglip_heads=2, siglip_mlp_dim=32),
        'vaat': lambda: VAAT(VATViT(**VIT, num_register_tokens=1), AST(dim=16, depth=2, mlp_dim=32, patch_size=8,
                                                                        dim_head=8, heads=2, num_classes=3),
                             **{('num_image_views' if key == 'num_views' else key): value
                                for key, value in VAT_POLICY.items()}, num_audio_views=2, ast_layer_indices=(0, 1, 2)),
    }[name]()


WRAPPER_STEPS = {
    'mae': lambda wrapper: wrapper(wrapped_images()),
    'simmim': lambda wrapper: wrapper(wrapped_images()),
    'mpp': lambda wrapper: wrapper(wrapped_images()),
    'dino': lambda wrapper: wrapper(wrapped_images()),
    'distill_wrapper': lambda wrapper: wrapper(wrapped_images(), torch.tensor([1, 3])),
    'accept_video_wrapper': lambda wrapper: weighted(wrapper(torch.randn(2, 3, 4, 16, 24))),
    'extractor': lambda wrapper: weighted(wrapper(wrapped_images())),
    'recorder': lambda wrapper: weighted(wrapper(wrapped_images())),
    # in training the forward returns (logits, decorrelation loss), and a step adds them
    'vit_with_decorr': lambda wrapper: (lambda logits, loss: weighted(logits) + loss)(*wrapper(wrapped_images())),
    'mp3': lambda wrapper: wrapper(wrapped_images()),
    'lejepa': lambda wrapper: wrapper(wrapped_images().sigmoid()),
    'levjepa': lambda wrapper: wrapper(torch.rand(2, 3, 2, 16, 24, generator=torch.Generator().manual_seed(1))),
    'levjepa_nd': lambda wrapper: wrapper(torch.randn(2, 2, 8, 12, generator=torch.Generator().manual_seed(1))),
    'es_vit': lambda wrapper: wrapper(wrapped_images()),
    # an action model, not a classifier (the registry holds classifiers): its loss when actions are given
    'vat': lambda wrapper: wrapper(torch.randn(2, 2, 3, 2, 16, 24), actions=torch.randn(2, 3, 2),
                                   tasks=torch.tensor([0, 1]), advantages=torch.tensor([-1, 1]),
                                   extra=torch.randn(2, 3)),
    'vat_siglip': lambda wrapper: wrapper(torch.randn(2, 2, 3, 2, 16, 16), actions=torch.randn(2, 3, 2),
                                          tasks=torch.tensor([0, 1]), advantages=torch.tensor([-1, 1]),
                                          extra=torch.randn(2, 3)),
    'vaat': lambda wrapper: wrapper(torch.randn(2, 2, 3, 2, 16, 24), torch.randn(2, 2, 300),
                                    actions=torch.randn(2, 3, 2), tasks=torch.tensor([0, 1]),
                                    advantages=torch.tensor([-1, 1]), extra=torch.randn(2, 3)),
}

# parameter (glob) -> why the wrapper's own design gives it no gradient from its loss
PRETRAINING = "the pretraining loss reads the encoder's tokens; the classification head comes after them"
WRAPPER_NO_GRADIENT = {
    'distill_wrapper': {'teacher.*': 'the teacher is frozen: it only gives the soft targets'},
    'mae': {'encoder.mlp_head.*': PRETRAINING},
    'simmim': {'encoder.mlp_head.*': PRETRAINING},
    'mpp': {'transformer.mlp_head.*': PRETRAINING},
    'dino': {'student.net.mlp_head.*': "the projection reads the student's latent (hidden_layer='to_latent'), "
                                       'before its classification head'},
    'mp3': {'vit.mlp_head.*': PRETRAINING},
    'lejepa': {'net.mlp_head.*': "the projector reads the network's pre-logits embedding, before its head"},
    'es_vit': {pattern: "the region tokens are the last stage's map (forward_intermediates), before the final norm "
                        'and the classification head' for pattern in ('student.net.norm.*', 'student.net.mlp_head.*')},
    'vat': {'vit.mlp_head.*': "the policy reads the tower's token states; its classification head comes after them"},
    'vaat': {'vit.mlp_head.*': "the policy reads the towers' token states; their classification heads come after",
             'ast.mlp_head.*': "the policy reads the towers' token states; their classification heads come after"},
}


@pytest.mark.parametrize('name', sorted(WRAPPER_STEPS))
def test_one_wrapper_step_gives_a_finite_loss_and_every_trainable_parameter_a_gradient(name):
    wrapper = build_wrapper(name).train()
    move_off_initialisation(wrapper)
    loss = WRAPPER_STEPS[name](wrapper)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    exempt = WRAPPER_NO_GRADIENT.get(name, {})
    missing = [n for n, p in wrapper.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert [n for n in missing if not any(fnmatch.fnmatch(n, pattern) for pattern in exempt)] == []


@pytest.mark.parametrize('name', sorted(WRAPPER_STEPS))
def test_wrapper_state_dict_round_trip_is_strict_and_exact(name):
    source = move_off_initialisation(build_wrapper(name))
    torch.manual_seed(1)
    fresh = build_wrapper(name)
    fresh.load_state_dict(source.state_dict(), strict=True)
    assert source.state_dict().keys() == fresh.state_dict().keys()
    for key, value in source.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


# ---------------------------------------------------------------------------------------------
# the face contract
#
# Every registered model has one face, whatever its forward_features layout (which follows each reference:
# timm's Swin is (b, h, w, c), vit-pytorch's ViT (b, 1 + n, dim)):
#   - `forward_head(forward_features(x), pre_logits=True)` is (b, num_features), and
#     `forward_head(forward_features(x))` is `model(x)`;
#   - `reset_classifier(n)` gives a zero-initialised head of n outputs, `reset_classifier(0)` the model that
#     `num_classes=0` builds (the same parameters, the same output);
#   - `forward_intermediates(x)` is a method, one output per `feature_info` entry, with its channels (and, for maps of
#     images, its stride);
#   - the class docstring says what forward_features returns and what num_classes=0 makes forward return.

FACE_ROWS = {
    # the vit-pytorch infrastructure modules, when the table above has no row for them
    'vit_with_patch_dropout': Case(dict(VIT, patch_dropout=0.5), IMAGES),
    'simple_flash_attn_vit': Case(VIT, IMAGES),
    'simple_flash_attn_vit_3d': Case(dict(VIDEO, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32),
                                     CLIPS),
    'na_vit_nested_tensor': Case(dict(VIT, image_size=16, patch_size=4), [(3, 16, 8), (3, 8, 8), (3, 16, 16)]),
    'na_vit_nested_tensor_3d': Case(dict(image_size=16, max_frames=4, patch_size=4, frame_patch_size=2, num_classes=5,
                                         dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32),
                                    [(3, 4, 16, 8), (3, 2, 8, 8)]),
    'max_vit_with_registers': Case(dict(num_classes=5, dim=8, depth=(1, 2), dim_head=4, dim_conv_stem=8,
                                        window_size=(2, 3), dropout=0.0, num_register_tokens=2), (2, 3, 32, 48)),
}
FACE_CASES = {**{name: case for name, case in FACE_ROWS.items() if name not in CASES}, **CASES}


def build_face(case_id, **changes):
    """The model of a row in eval mode (seeded; `changes` to its arguments) and the row's input."""
    case = FACE_CASES[case_id]
    torch.manual_seed(0)
    model = build_model(registry_name(case_id), **{**case.kwargs, **changes}).eval()
    return model, case.make_input(torch.Generator().manual_seed(1))


def batch_size(x):
    return len(x) if isinstance(x, list) else x.shape[0]


def run(fn, *args, **kwargs):
    torch.manual_seed(3)                      # the same token dropping (patch dropout in eval is off; NaViT's too)
    with torch.no_grad():
        return fn(*args, **kwargs)


def test_the_face_table_covers_every_registered_model():
    assert {registry_name(case_id) for case_id in FACE_CASES} == set(MODELS)


@pytest.mark.parametrize('case_id', sorted(FACE_CASES))
def test_pre_logits_are_num_features_wide(case_id):
    model, x = build_face(case_id)
    case = FACE_CASES[case_id]
    pooled = run(lambda: model.forward_head(model.forward_features(x, **case.forward), pre_logits=True, **case.head))
    assert pooled.shape == (batch_size(x), model.num_features)


@pytest.mark.parametrize('case_id', sorted(FACE_CASES))
def test_forward_is_forward_head_of_forward_features(case_id):
    model, x = build_face(case_id)
    forward, head = FACE_CASES[case_id].forward, FACE_CASES[case_id].head
    torch.testing.assert_close(run(lambda: model.forward_head(model.forward_features(x, **forward), **head)),
                               run(model, x, **forward), rtol=0, atol=0)


@pytest.mark.parametrize('case_id', sorted(FACE_CASES))
def test_reset_classifier_gives_a_zero_head_of_the_new_size(case_id):
    model, x = build_face(case_id)
    model.reset_classifier(7)
    out = run(model, x, **FACE_CASES[case_id].forward)
    assert model.num_classes == 7
    assert out.shape == (batch_size(x), 7)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize('case_id', sorted(FACE_CASES))
def test_reset_classifier_to_0_is_the_model_built_with_num_classes_0(case_id):
    model, x = build_face(case_id)
    model.reset_classifier(0)
    # LeViT's distillation head classifies into num_classes too: without classes it has none
    distilling = {'num_distill_classes': None} if 'num_distill_classes' in FACE_CASES[case_id].kwargs else {}
    headless, _ = build_face(case_id, num_classes=0, **distilling)
    headless.load_state_dict(model.state_dict())      # strict: the same parameters and buffers
    assert model.num_classes == 0
    forward = FACE_CASES[case_id].forward
    out = run(model, x, **forward)
    # without classes the forward returns the pooled embedding (b, num_features), never an empty (b, 0) tensor as
    # vit-pytorch's SimpleViT does; or, where vit-pytorch's class returns its tokens there (its ViT family), those:
    # forward_features' tokens, num_features wide (CrossViT's: both branches' tokens)
    if isinstance(out, tuple):
        for ours, its in zip(out, run(model.forward_features, x, **forward), strict=True):
            torch.testing.assert_close(ours, its, rtol=0, atol=0)
        return
    if out.ndim == 2:
        assert out.shape == (batch_size(x), model.num_features)
    else:
        assert out.shape[0] == batch_size(x) and out.shape[-1] == model.num_features
        torch.testing.assert_close(out, run(model.forward_features, x, **forward), rtol=0, atol=0)
    torch.testing.assert_close(out, run(headless, x, **forward), rtol=0, atol=0)


@pytest.mark.parametrize('case_id', sorted(FACE_CASES))
def test_forward_intermediates_match_feature_info(case_id):
    model, x = build_face(case_id)
    assert 'forward_intermediates' in dir(type(model))
    info = model.feature_info
    outputs = run(model.forward_intermediates, x)
    assert len(outputs) == len(info)
    for output, entry in zip(outputs, info):
        model.get_submodule(entry['module'])
        if output.ndim == 4 and not isinstance(x, list) and x.ndim == 4:    # a map of an image batch
            assert output.shape[1] == entry['num_chs']
            # a stride: within one cell of the image's size / reduction (PiT's unpadded patch convolution loses one)
            for side, size in zip(output.shape[-2:], x.shape[-2:]):
                assert abs(side - size / entry['reduction']) <= 1
        else:
            assert output.shape[-1] == entry['num_chs']


@pytest.mark.parametrize('case_id', sorted(FACE_CASES))
def test_forward_intermediates_take_indices(case_id):
    model, x = build_face(case_id)
    every = run(model.forward_intermediates, x)
    last = run(model.forward_intermediates, x, indices=1)
    assert len(last) == 1
    torch.testing.assert_close(last[0], every[-1], rtol=0, atol=0)
    chosen = run(model.forward_intermediates, x, indices=[0, -1])      # a list: positions, negative from the end
    assert len(chosen) == 2
    torch.testing.assert_close(chosen[0], every[0], rtol=0, atol=0)
    torch.testing.assert_close(chosen[1], every[-1], rtol=0, atol=0)


@pytest.mark.parametrize('name', sorted(MODELS))
def test_the_class_docstring_states_the_layout_and_num_classes_0(name):
    module_name, class_name = MODELS[name].split(':')
    doc = getattr(importlib.import_module(module_name), class_name).__doc__ or ''
    assert 'forward_features' in doc and 'num_classes=0' in doc


@pytest.mark.parametrize('case_id', sorted(FACE_CASES))
def test_the_recorders_forward_intermediates_is_the_models_method(case_id):
    model, x = build_face(case_id)
    for ours, its in zip(run(recorder.forward_intermediates, model, x), run(model.forward_intermediates, x), strict=True):
        torch.testing.assert_close(ours, its, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# forward_features' layout, as the class docstring declares it
#
# The declared layout is the first shape after `forward_features` in the class docstring: a parenthesised tuple
# whose first entry is `b` (the batch), `1` (NaViT's packed sequence) or `sequences` (NaViT's packed sequences).
# A tuple output (CrossViT's two branches) declares one shape per element, in order. The number of entries
# gives the kind: (b, width) a vector, (b, n, width) tokens, (b, width, h, w) maps, (b, h, w, width)
# channels-last maps (the entry after `b` is the map's height, `h...`). The width expression is evaluated over
# the row's arguments, the constructor's defaults, `num_features` (`width` and `c` name it too) and `stages`
# (the length of a tuple `depth`); `^` is a power. A token count with a leading `k +` declares at least k prefix tokens; a plain product of the grid
# (`h * w`, `prod(grid)`), with no `+`, declares none.

SHAPE_START = re.compile(r'\((?=(?:b|1|sequences),)')


def declared_shapes(doc):
    """Every parenthesised shape after the first `forward_features` of `doc`, as lists of entry strings."""
    text, shapes = doc[doc.index('forward_features'):], []
    for match in SHAPE_START.finditer(text):
        depth, entries, entry = 0, [], ''
        for char in text[match.start() + 1:]:
            if char == '(':
                depth += 1
            elif char == ')':
                if depth == 0:
                    break
                depth -= 1
            if char == ',' and depth == 0:
                entries.append(' '.join(entry.split()))
                entry = ''
            else:
                entry += char
        shapes.append(entries + [' '.join(entry.split())])
    return shapes


def model_class(name):
    module_name, class_name = MODELS[name].split(':')
    return getattr(importlib.import_module(module_name), class_name)


def feature_tensors(out):
    """The tensors forward_features returns: one, a tuple's (NaViT's packed tokens: the first only), or
    `PackedTokens.tokens`."""
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, 'tokens'):
        return [out.tokens]
    if isinstance(out[1], torch.Tensor) and out[1].ndim == 3:
        return list(out)                      # a pair of token tensors (CrossViT)
    return [out[0]]                           # packed tokens, then their layout


def width_of(expression, model, case):
    import inspect
    namespace = {name: parameter.default for name, parameter in inspect.signature(type(model)).parameters.items()
                 if parameter.default is not inspect.Parameter.empty}
    namespace.update(case.kwargs, num_features=model.num_features, width=model.num_features, c=model.num_features)
    if isinstance(namespace.get('depth'), (tuple, list)):
        namespace['stages'] = len(namespace['depth'])
    return eval(expression.replace('^', '**'), {}, namespace)


def check_layout(shape, tensor, model, case, x):
    kind = {2: 'vector', 3: 'tokens', 4: 'channels-last' if shape[1].startswith('h') else 'maps'}[len(shape)]
    assert tensor.ndim == len(shape), (shape, tuple(tensor.shape))
    batch = {'b': batch_size(x), '1': 1}.get(shape[0])
    if batch is not None:
        assert tensor.shape[0] == batch, (shape, tuple(tensor.shape))
    channel_axis = {'vector': 1, 'tokens': 2, 'maps': 1, 'channels-last': 3}[kind]
    assert tensor.shape[channel_axis] == width_of(shape[channel_axis], model, case), (shape, tuple(tensor.shape))
    if kind == 'tokens':
        count = shape[1]
        leading = re.match(r'(\d+) \+', count)
        if leading:
            assert model.num_prefix_tokens >= int(leading.group(1)), (shape, model.num_prefix_tokens)
            assert tensor.shape[1] > int(leading.group(1))
        elif '+' not in count and ('*' in count or 'prod(' in count):
            assert model.num_prefix_tokens == 0, (shape, model.num_prefix_tokens)


# a multi-stage model whose forward_features is not laid on its last stage's map
NOT_ON_THE_LAST_MAP = {'regionvit': "forward_features holds the regional tokens, on a grid a window coarser than the "
                                    "last stage's local map that forward_intermediates returns"}


@pytest.mark.parametrize('case_id', sorted(FACE_CASES))
def test_forward_features_has_the_layout_its_class_docstring_declares(case_id):
    """And, for a multi-stage model (its last intermediate a map of the image batch, whose stride
    test_forward_intermediates_match_feature_info checks), forward_features lies on that map: prefix + h * w
    tokens, or the map's (h, w)."""
    model, x = build_face(case_id)
    case = FACE_CASES[case_id]
    tensors = feature_tensors(run(model.forward_features, x, **case.forward))
    shapes = declared_shapes(model_class(registry_name(case_id)).__doc__)
    assert len(shapes) >= len(tensors), shapes
    for shape, tensor in zip(shapes, tensors):
        check_layout(shape, tensor, model, case, x)
    last = run(model.forward_intermediates, x)[-1]
    if isinstance(x, list) or x.ndim != 4 or last.ndim != 4 or registry_name(case_id) in NOT_ON_THE_LAST_MAP:
        return
    features, grid = tensors[0], tuple(last.shape[-2:])
    if features.ndim == 3:
        assert features.shape[1] == model.num_prefix_tokens + grid[0] * grid[1]
    else:
        assert grid in (tuple(features.shape[-2:]), tuple(features.shape[1:3]))


# ---------------------------------------------------------------------------------------------
# forward_intermediates refuses out-of-range indices by name, before it runs the model


@pytest.mark.parametrize('case_id', sorted(FACE_CASES))
def test_forward_intermediates_refuse_out_of_range_indices_before_running_the_model(case_id):
    model, x = build_face(case_id)
    count = len(model.feature_info)
    ran = []
    for module in model.modules():
        module.register_forward_pre_hook(lambda module, args: ran.append(type(module).__name__))
    valid_range = rf'(1 <= n <= {count}\b|\[-{count}, {count}\))'
    # an int past the count, 0 and a negative int (n counts the last n), a list entry past the end, one before
    # the start, a valid entry beside one past the end
    for indices in (count + 1, 0, -1, [count], [-count - 1], [0, count + 3]):
        with pytest.raises(ValueError, match=rf'indices.*{valid_range}'):
            run(model.forward_intermediates, x, indices=indices)
    assert ran == []


# ---------------------------------------------------------------------------------------------
# the wrappers' frozen parts: a frozen backbone, an EMA teacher, a distillation teacher


VAT_FROZEN = "the vision tower runs under no_grad with freeze_vit=True; its parameters keep requires_grad"
FREEZE_STEPS = {
    # row -> (wrapper, its training loss)
    **{name: (name, step) for name, step in WRAPPER_STEPS.items()},
    'vat[freeze_vit]': ('vat', lambda wrapper: wrapper(torch.randn(2, 2, 3, 2, 16, 24), actions=torch.randn(2, 3, 2),
                                                       tasks=torch.tensor([0, 1]), advantages=torch.tensor([-1, 1]),
                                                       extra=torch.randn(2, 3), freeze_vit=True)),
    'vat_siglip[freeze_vit]': ('vat_siglip', lambda wrapper: wrapper(
        torch.randn(2, 2, 3, 2, 16, 16), actions=torch.randn(2, 3, 2), tasks=torch.tensor([0, 1]),
        advantages=torch.tensor([-1, 1]), extra=torch.randn(2, 3), freeze_vit=True)),
    'vaat[freeze_vit,freeze_ast]': ('vaat', lambda wrapper: wrapper(
        torch.randn(2, 2, 3, 2, 16, 24), torch.randn(2, 2, 300), actions=torch.randn(2, 3, 2),
        tasks=torch.tensor([0, 1]), advantages=torch.tensor([-1, 1]), extra=torch.randn(2, 3), freeze_vit=True,
        freeze_ast=True)),
}
# row -> the frozen parameters (glob patterns); each must match a parameter
FROZEN = {
    'dino': ['teacher.*'],
    'es_vit': ['teacher.*'],
    'distill_wrapper': ['teacher.*'],
    'vat[freeze_vit]': ['vit.*'],
    'vat_siglip[freeze_vit]': ['vit.*'],
    'vaat[freeze_vit,freeze_ast]': ['vit.*', 'ast.*'],
}
# rows whose freeze is the forward's (no_grad); every other frozen parameter has requires_grad off
FROZEN_BY_FORWARD = {'vat[freeze_vit]': VAT_FROZEN, 'vat_siglip[freeze_vit]': VAT_FROZEN,
                     'vaat[freeze_vit,freeze_ast]': VAT_FROZEN}


@pytest.mark.parametrize('row', sorted(FREEZE_STEPS))
def test_one_adamw_step_leaves_frozen_parameters_bit_identical_and_moves_the_trainable_ones(row):
    name, step = FREEZE_STEPS[row]
    wrapper = move_off_initialisation(build_wrapper(name).train())
    named = dict(wrapper.named_parameters())
    patterns = FROZEN.get(row, [])
    assert [pattern for pattern in patterns if not fnmatch.filter(named, pattern)] == []
    frozen = {n for n in named if any(fnmatch.fnmatch(n, pattern) for pattern in patterns)}
    # a parameter with requires_grad off is a declared frozen one, and a declared frozen one (but those the
    # forward freezes) has requires_grad off
    assert {n for n, p in named.items() if not p.requires_grad} == (set() if row in FROZEN_BY_FORWARD else frozen)
    before = {n: p.detach().clone() for n, p in named.items()}
    torch.manual_seed(4)
    step(wrapper).backward()
    assert [n for n in sorted(frozen) if named[n].grad is not None] == []
    torch.optim.AdamW(wrapper.parameters(), lr=1e-2, weight_decay=0.1).step()
    assert [n for n in sorted(frozen) if not torch.equal(named[n], before[n])] == []
    exempt = WRAPPER_NO_GRADIENT.get(name, {}) if row == name else {}
    trainable = [n for n in named if n not in frozen and not any(fnmatch.fnmatch(n, p) for p in exempt)]
    assert trainable and [n for n in trainable if torch.equal(named[n], before[n])] == []
