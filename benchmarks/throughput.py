"""Throughput, memory and model-FLOPs utilisation of vit_pytorch's ViT and SimpleViT.

For each named configuration (ViT-S/16, ViT-B/16) and image size it measures, in one process
and in interleaved rounds (every model once per round, the order rotated each round):

  - inference images/s (eval mode, `torch.inference_mode`) at several batch sizes;
  - training-step images/s (forward, cross-entropy, backward, AdamW step);
  - the machine's fp32 matmul peak, measured in every round, and from it the MFU
    (model FLOP/s over that peak), with model FLOPs counted by `torch.utils.flop_counter`;
  - peak memory of a training step: the peak RSS increase over two steps, each model in a
    fresh subprocess (so that no allocator state leaks between models), with glibc's mmap threshold
    fixed (`MALLOC_MMAP_THRESHOLD`), so that freed buffers leave the resident set;

against two baselines with identical weights (logits checked to agree before timing):

  - `reference`: a plain ViT written below, with explicit softmax attention;
  - `timm`: timm's `vit_*_patch16_224` of the same configuration, when timm is importable.

Our ViT is built in the paper's configuration (patch_norm=False, qkv_bias=True,
norm_eps=1e-6), which is timm's architecture exactly. Medians over rounds are reported, and
each speed ratio is paired: it is taken within a round, so machine-wide slowdowns cancel.
Other sections (`--sections`): `compile`, the torch.compile speed-up over eager, and
`checkpointing`, the training memory that gradient checkpointing saves in a deep ViT.

`--registry` measures models registered in `vit_pytorch.models` instead (or `all` of them),
each at a named configuration of its paper where its module has a constructor for one
(`cait_xxs24_224`, `t2t_vit_14`, CCT-7/3x1 at 32 px, ...) and at ViT-S/16's size otherwise
(`REGISTRY`), with its own input size and training loss (DeiT's distillation loss for
`distillable_vit`). Their FLOPs are counted with explicit attention (`fused=False`), which
the counter sees. Where `REFERENCES` has the reference implementation of a preset (timm's Swin,
...), it runs in the same rounds with our model's weights, and the report gives the paired
ratios and the memory ratio. One model and its reference are measured at a time, and freed (with their optimiser
states and gradients) before the next pair is built, so that a run of the whole registry holds one pair's memory. For models only vit-pytorch has, the reference is vit-pytorch 1.26.14's own
module, imported from $VIT_PYTORCH_SOURCE (its wheel, from `pip download vit-pytorch==1.26.14 --no-deps`, or
the unpacked `vit_pytorch` folder) beside ours. `--tiny` shrinks them to a few milliseconds a step, for tests.
A variant row (`VARIANTS`, measured by name or with `all`) is a registered model with an option of its own that its
preset leaves off, timed against the preset's reference doing the preset's work: `vit_with_decorr:paper`, the
paper's decorrelation matrices, whose training step ends with the matrices' step as the training loop's does,
against vit-pytorch's auxiliary loss. Its ratios are of different work: the table gives no verdict, and the FLOPs
per image of both steps (the matrices' step counted at the training batch) beside them.

`--markdown FILE` writes the registry table for the docs: a row for every registered model with its preset, its
reference (or why there is none: none exists, not installed, not run, failed), the paired ratios ours / reference
with their spread, the memory ratio with its spread over the memory runs, and a verdict read from the ratios as
printed ('>= 1.0', parity where the spread includes 1.0, or below where the whole spread misses, with the docs'
explanation), under the command, machine, CPU capability, load average, memory runs, `--note` and date of each run.
`--markdown-from A.json B.json` measures nothing: it merges the runs' `--json` files in order, a later file's row
replacing an earlier one's, and writes the table again (with `--json`, the merged table, which merges again).
`--budget` sets the table's settings (every registered model, batches 1 and 8, training at 8, 3 rounds, one
thread on the CPU clock, three memory runs each) and prints each pair's expected time once it is counted;
`--shard K/N` measures every N-th model from the K-th, so that N processes fill N cores:

    python benchmarks/throughput.py --budget --shard 1/2 --json a.json & python benchmarks/throughput.py --budget --shard 2/2 --json b.json; wait
    python benchmarks/throughput.py --markdown-from a.json b.json --markdown docs/registry-table.md --json table.json
    python benchmarks/throughput.py --budget --registry swin,levit --json rerun.json   # rows re-measured later
    python benchmarks/throughput.py --markdown-from table.json rerun.json --markdown docs/registry-table.md

    python benchmarks/throughput.py --configs S/16 --image-sizes 224 --json results.json
    PYTHONPATH=. /path/to/venv-with-timm/bin/python benchmarks/throughput.py --configs B/16
    python benchmarks/throughput.py --sections compile,checkpointing
    python benchmarks/throughput.py --registry cait,xcit,cross_vit,t2t,cct --batches 1,8 --rounds 3
    VIT_PYTORCH_SOURCE=vit_pytorch-1.26.14-py3-none-any.whl python benchmarks/throughput.py --registry deepvit

`--device cuda` puts models, inputs and steps on the GPU (synchronised around every timing; memory is then the
peak of allocated device memory), `--bf16` runs every step under bf16 autocast, `--compile` runs every model
through torch.compile; attention is `scaled_dot_product_attention` throughout, which picks its fused kernels on
CUDA. Each works on the CPU as well (the tests run them there).

Timings are wall-clock by default, so they include whatever else the machine is doing; read
the spread columns. On a shared machine, `--threads 1 --clock cpu` times each step by this
process's CPU time instead, which other jobs barely disturb.
"""

import argparse
import contextlib
import copy
import ctypes
import datetime
import gc
import importlib
import importlib.machinery
import importlib.util
import io
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import types

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vit_pytorch import SimpleViT, ViT
from vit_pytorch import models as registry
from vit_pytorch.flops import FLOP_FORMULAS, classification_loss, training_flops   # FLOP_FORMULAS: for the tests

try:
    import timm
except ImportError:
    timm = None

CONFIGS = {
    # width, depth, heads and MLP size from the ViT paper, Table 1 (S from DeiT / "How to train your ViT")
    'S/16': dict(patch_size=16, dim=384, depth=12, heads=6, mlp_dim=1536),
    'B/16': dict(patch_size=16, dim=768, depth=12, heads=12, mlp_dim=3072),
    'L/16': dict(patch_size=16, dim=1024, depth=24, heads=16, mlp_dim=4096),
}
TIMM_NAMES = {'S/16': 'vit_small_patch16_224', 'B/16': 'vit_base_patch16_224', 'L/16': 'vit_large_patch16_224'}
NUM_CLASSES = 1000
SECTIONS = ('throughput', 'compile', 'checkpointing')
MODELS = ('vit', 'reference', 'timm', 'simple_vit', 'simple_reference')
# which model each one is compared with (paired ratios)
BASELINES = {'vit': ('timm', 'reference'), 'simple_vit': ('simple_reference',)}

# `--registry`: name -> (preset, the module's constructor of that name or None, keyword arguments,
# image size, channels, classes); without a constructor, the module's class at ViT-S/16's size
S16 = dict(image_size=224, patch_size=16, num_classes=NUM_CLASSES, dim=384, depth=12, heads=6, mlp_dim=1536)
class CentreBox(nn.Module):
    """A stand-in object detector for the DetPool preset: the middle half of each side of the image."""

    def forward(self, img):
        height, width = img.shape[-2:]
        mask = torch.zeros(img.shape[0], height, width, dtype=torch.bool, device=img.device)
        mask[:, height // 4:3 * height // 4, width // 4:3 * width // 4] = True
        return mask


REGISTRY = {
    'vit': ('S/16', None, dict(S16, patch_norm=False, qkv_bias=True, norm_eps=1e-6), 224, 3, NUM_CLASSES),
    'simple_vit': ('S/16', None, S16, 224, 3, NUM_CLASSES),
    'cait': ('cait_xxs24_224', 'cait_xxs24_224', {}, 224, 3, NUM_CLASSES),
    'deepvit': ('S/16', None, S16, 224, 3, NUM_CLASSES),
    't2t': ('t2t_vit_14', 't2t_vit_14', {}, 224, 3, NUM_CLASSES),
    # the paper's CIFAR-10 model, CCT-7/3x1: one 3x3 convolution in the tokenizer, learned positions
    'cct': ('cct_7/3x1 (32 px, 10 classes)', 'cct_7',
            dict(img_size=32, kernel_size=3, n_conv_layers=1, num_classes=10, positional_embedding='learnable'),
            32, 3, 10),
    'cross_vit': ('crossvit_tiny_240', 'crossvit_tiny_240', {}, 240, 3, NUM_CLASSES),
    'xcit': ('xcit_tiny_12_p16_224', 'xcit_tiny_12_p16_224', {}, 224, 3, NUM_CLASSES),
    'swin': ('swin_tiny_patch4_window7_224', 'swin_tiny_patch4_window7_224', {}, 224, 3, NUM_CLASSES),
    'swinv2': ('swinv2_tiny_window8_256', 'swinv2_tiny_window8_256', {}, 256, 3, NUM_CLASSES),
    'max_vit': ('maxvit_tiny_tf_224', 'maxvit_tiny_tf_224', {}, 224, 3, NUM_CLASSES),
    'pit': ('pit_ti_224', 'pit_ti_224', {}, 224, 3, NUM_CLASSES),
    # one head: trained with the distillation head, LeViT returns both heads' logits, which plain cross-entropy
    # cannot take (timm's levit_128s averages them unless distilled training is switched on)
    'levit': ('levit_128s, one head', 'levit_128s', dict(distillation=False), 224, 3, NUM_CLASSES),
    'cvt': ('cvt_13', 'cvt_13', {}, 224, 3, NUM_CLASSES),
    'pvt_v2': ('pvt_v2_b0', 'pvt_v2_b0', {}, 224, 3, NUM_CLASSES),
    'twins_svt': ('twins_svt_small', 'twins_svt_small', {}, 224, 3, NUM_CLASSES),
    'nest': ('nest_tiny', 'nest_tiny', {}, 224, 3, NUM_CLASSES),
    'crossformer': ('crossformer_tiny', 'crossformer_tiny', {}, 224, 3, NUM_CLASSES),
    'sep_vit': ('sep_vit_tiny', 'sep_vit_tiny', {}, 224, 3, NUM_CLASSES),
    'scalable_vit': ('scalable_vit_small', 'scalable_vit_small', {}, 224, 3, NUM_CLASSES),
    'mobile_vit': ('mobilevit_xxs (256 px)', 'mobilevit_xxs', {}, 256, 3, NUM_CLASSES),
    'regionvit': ('regionvit_tiny', 'regionvit_tiny', {}, 224, 3, NUM_CLASSES),
    'small_dataset_vit': ('S/16', None, S16, 224, 3, NUM_CLASSES),
    # as many attention and MLP blocks as S/16, in 6 layers of 2 parallel branches
    'parallel_vit': ('S/16, 6 layers x 2 branches', None, dict(S16, depth=6, num_parallel_branches=2), 224, 3, NUM_CLASSES),
    'learnable_memory_vit': ('S/16', None, S16, 224, 3, NUM_CLASSES),
    'distillable_vit': ('deit_small_distilled_patch16_224', 'deit_small_distilled_patch16_224', {}, 224, 3,
                        NUM_CLASSES),
    'simple_vit_with_register_tokens': ('S/16, 4 registers', None, S16, 224, 3, NUM_CLASSES),
    'simple_vit_with_qk_norm': ('S/16', None, S16, 224, 3, NUM_CLASSES),
    'simple_vit_with_patch_dropout': ('S/16, patch dropout 0.5', None, S16, 224, 3, NUM_CLASSES),
    # a (b, c, h, w) batch: one sequence per image, nothing packed
    'na_vit': ('S/16', None, S16, 224, 3, NUM_CLASSES),
    # signals and clips (models.INPUTS): the size is the input's trailing dims; vit-pytorch's README examples
    'vit_1d': ('256 samples / 16, width 1024, depth 6', None, dict(
        seq_len=256, patch_size=16, num_classes=NUM_CLASSES, dim=1024, depth=6, heads=8, mlp_dim=2048), (256,), 3,
        NUM_CLASSES),
    'simple_vit_1d': ('256 samples / 16, width 1024, depth 6', None, dict(
        seq_len=256, patch_size=16, num_classes=NUM_CLASSES, dim=1024, depth=6, heads=8, mlp_dim=2048), (256,), 3,
        NUM_CLASSES),
    'vit_3d': ('16 x 128 px / 2 x 16, width 1024, depth 6', None, dict(
        image_size=128, frames=16, image_patch_size=16, frame_patch_size=2, num_classes=NUM_CLASSES, dim=1024,
        depth=6, heads=8, mlp_dim=2048), (16, 128, 128), 3, NUM_CLASSES),
    'simple_vit_3d': ('16 x 128 px / 2 x 16, width 1024, depth 6', None, dict(
        image_size=128, frames=16, image_patch_size=16, frame_patch_size=2, num_classes=NUM_CLASSES, dim=1024,
        depth=6, heads=8, mlp_dim=2048), (16, 128, 128), 3, NUM_CLASSES),
    'vivit': ('16 x 128 px / 2 x 16, width 1024, 6 + 6 layers', None, dict(
        image_size=128, frames=16, image_patch_size=16, frame_patch_size=2, num_classes=NUM_CLASSES, dim=1024,
        spatial_depth=6, temporal_depth=6, heads=8, mlp_dim=2048), (16, 128, 128), 3, NUM_CLASSES),
    # vit-pytorch's README CCT-14/7x2 at 112 px, not its 224: with attention dropout 0.1, SDPA takes its math
    # kernel in training (no dropout in the CPU flash kernel) and keeps the (6, 1568, 1568) attention maps of each
    # of the 14 layers; at 224 px one clip's training step grew the resident set by 3,185 MiB (ours), so batch 8
    # needs ~25 GiB, over the 24 GiB machine (the run was killed). At 112 px: 392 tokens, 1/16 of those maps
    'cct_3d': ('CCT-14/7x2, 8 x 112 px (224 px: ~25 GiB at batch 8)', None, dict(
        img_size=112, num_frames=8, embedding_dim=384, n_conv_layers=2, frame_kernel_size=3, kernel_size=7, stride=2,
        padding=3, pooling_kernel_size=3, pooling_stride=2, pooling_padding=1, num_layers=14, num_heads=6,
        mlp_ratio=3., num_classes=NUM_CLASSES, positional_embedding='learnable'), (8, 112, 112), 3, NUM_CLASSES),
    # vit-pytorch's infrastructure modules: at their siblings' presets, or vit-pytorch's README example
    'vit_with_patch_dropout': ('S/16, patch dropout 0.25', None, S16, 224, 3, NUM_CLASSES),
    'simple_flash_attn_vit': ('S/16', None, S16, 224, 3, NUM_CLASSES),
    'simple_flash_attn_vit_3d': ('16 x 128 px / 2 x 16, width 1024, depth 6', None, dict(
        image_size=128, frames=16, image_patch_size=16, frame_patch_size=2, num_classes=NUM_CLASSES, dim=1024,
        depth=6, heads=8, mlp_dim=2048), (16, 128, 128), 3, NUM_CLASSES),
    # a (b, c, h, w) batch, every image of the largest size; token dropout 0.1 as in vit-pytorch's README
    'na_vit_nested_tensor': ('256 px / 32, width 1024, depth 6, token dropout 0.1', None, dict(
        image_size=256, patch_size=32, num_classes=NUM_CLASSES, dim=1024, depth=6, heads=16, mlp_dim=2048,
        token_dropout_prob=0.1), 256, 3, NUM_CLASSES),
    'na_vit_nested_tensor_3d': ('8 x 256 px / 2 x 32, width 1024, depth 6, token dropout 0.1', None, dict(
        image_size=256, max_frames=8, patch_size=32, frame_patch_size=2, num_classes=NUM_CLASSES, dim=1024, depth=6,
        heads=16, mlp_dim=2048, token_dropout_prob=0.1), (8, 256, 256), 3, NUM_CLASSES),
    # vit-pytorch's README MaxViT with its 4 registers a block
    'max_vit_with_registers': ('MaxViT 96 wide, depths 2-2-5-2, 4 registers', None, dict(
        num_classes=NUM_CLASSES, dim_conv_stem=64, dim=96, dim_head=32, depth=(2, 2, 5, 2), window_size=7,
        mbconv_expansion_rate=4, mbconv_shrinkage_rate=0.25, dropout=0.1, num_register_tokens=4), 224, 3, NUM_CLASSES),
    # research long tail I (issue 26), at S/16: DetPool with an object in the middle half of each image (its mask
    # from a stand-in detector, so that forward(img) runs the masked attention and pooling in both packages)
    'vit_detpool': ('S/16, an object on 7 x 7 of the 14 x 14 patches', None,
                    dict(S16, mask_generator=CentreBox()), 224, 3, NUM_CLASSES),
    'simple_vit_with_specialized_cls': ('S/16, qkv specialized in 4 of 12 layers', None, S16, 224, 3, NUM_CLASSES),
    'simple_vit_with_fft': ('S/16, Fourier patches of 16: 196 + 196 tokens', None, dict(S16, freq_patch_size=16),
                            224, 3, NUM_CLASSES),
    # S/16's width and depth on 7x7 compressed tokens (patches of 32) reading 14x14 lookup tokens (patches of 16),
    # vit-pytorch's other defaults (a 7x7 patch convolution, MLP factors 4, dropout 0.1)
    'look_vit': ('S/16 wide, 7x7 compressed / 14x14 lookup tokens, depth 12', None, dict(
        image_size=224, num_classes=NUM_CLASSES, dim=384, depth=12, heads=6, dim_head=64, patch_size=32,
        highres_patch_size=16, cross_attn_heads=6, cross_attn_dim_head=64), 224, 3, NUM_CLASSES),
    # the paper's Jumbo-S (K = 6, jumbo MLP 4 times the token) on S/16
    'jumbo_vit': ('S/16, jumbo K 6, jumbo MLP x4', None, dict(S16, jumbo_cls_k=6, jumbo_ff_mult=4), 224, 3,
                  NUM_CLASSES),
    # vit-pytorch's __main__ model (256 px, patches of 32, width 1024) scaled to S/16 at 224: a 14x14 grid
    'simple_vit_with_relative_proj_pos_bias': ('S/16', None, S16, 224, 3, NUM_CLASSES),
    # vit-pytorch's README configurations at ViT-S/16's size: ATS keeps all 196 patches for 3 layers, then at most
    # 128, 64 and 32 for 3 layers each; the PatchMerger merges the 196 into 8 after layer 6, as the README's
    'ats_vit': ('S/16, ATS 196-128-64-32', None,
                dict(S16, max_tokens_per_depth=(196,) * 3 + (128,) * 3 + (64,) * 3 + (32,) * 3), 224, 3, NUM_CLASSES),
    'vit_with_patch_merger': ('S/16, merged into 8 after layer 6', None,
                              dict(S16, patch_merge_layer=6, patch_merge_num_tokens=8), 224, 3, NUM_CLASSES),
    # vit-pytorch's __main__ model (256 px, patches of 8, width 1024, depth 6) scaled to S/16 at 224
    'simple_vit_with_value_residual': ('S/16', None, S16, 224, 3, NUM_CLASSES),
    # vit-pytorch's __main__ model (256 px, patches of 16, learned modulation) scaled to S/16 at 224
    'simple_vit_orthog_residual_update': ('S/16, learned', None, dict(S16, orthog_residual_update_kwargs=dict(learned=True)),
                                          224, 3, NUM_CLASSES),
    # vit-pytorch's defaults (every token of every block's normed input decorrelated) at S/16; the training step adds
    # the loss (AuxiliaryLoss), as the training command does
    'vit_with_decorr': ('S/16, decorrelation loss x 0.1', None, S16, 224, 3, NUM_CLASSES),
    # vit-pytorch's README model (256 px, patches of 16, width 512, depth 6, 4 registers) scaled to S/16 at 224
    'vit_5': ('S/16, 4 registers', None, dict(S16, num_registers=4), 224, 3, NUM_CLASSES),
    # vit-pytorch has no README model for RvT: S/16 at 224 with its defaults (convolutional queries, GEGLU)
    'rvt': ('S/16', None, S16, 224, 3, NUM_CLASSES),
    # vit-pytorch's __main__ model (256 px, patches of 16, width 1024, depth 6) scaled to S/16 at 224
    'normalized_vit': ('S/16', None, S16, 224, 3, NUM_CLASSES),
    # vit-pytorch's __main__ model (256 px, patches of 32, width 1024, depth 6) scaled to S/16 at 224
    'vit_with_keel_post_ln': ('S/16', None, S16, 224, 3, NUM_CLASSES),
    # the paper's LocalViT-S as the official code names it (localvit_small_mlp4_act3_r384: S/16 with 8 heads of 48,
    # qkv bias, LayerNorm eps 1e-6), h-swish without its SE layer (ours has none); a patch embedding without norms
    # (the official convolution). No vit-pytorch reference: its LocalViT runs only when the grid is as wide as dim
    'local_vit': ('LocalViT-S: S/16, 8 heads of 48, qkv bias, no SE', None,
                  dict(S16, heads=8, dim_head=48, qkv_bias=True, norm_eps=1e-6, patch_norm=False), 224, 3,
                  NUM_CLASSES),
    # vit-pytorch's __main__ model (256 px, patches of 32, width 1024, 4 registers, dim_mask 4) scaled to S/16 at 224
    'simple_vit_with_sparse_gating': ('S/16, 4 registers', None, dict(S16, num_register_tokens=4, dim_mask=4), 224, 3,
                                      NUM_CLASSES),
    # vit-pytorch's README inference model (224 px, patches of 16, width 512, depth 6, MLP 3072, windows of 7) at S/16's
    # width and depth, its layers LA, LA, WA, FA, LA, FA twice
    'jet_vit': ('S/16, attention LA LA WA FA LA FA x2, windows 7', None,
                dict(S16, window_size=7, attn_layers=['LA', 'LA', 'WA', 'FA', 'LA', 'FA'] * 2), 224, 3, NUM_CLASSES),
    # vit-pytorch's __main__ model (256 px, patches of 16, width 512, 6 + 5 x 4 + 6 layers, the exit gate) at 224 px
    # and S/16's width: 4 + 4 x 2 + 4 layers run, 12 as S/16
    'looped_vit': ('S/16 wide, 4 + 4 x 2 + 4 layers, exit gate', None, dict(
        image_size=224, patch_size=16, num_classes=NUM_CLASSES, dim=384, heads=6, dim_head=64, mlp_dim=1536,
        pre_loop_depth=4, num_looped_blocks=2, post_loop_depth=4, loop_depth=2, adaptive_loop=True), 224, 3,
        NUM_CLASSES),
    # research long tail III (issue 28). vit-pytorch's __main__ ViTND (4-D occupancy over time, time causal, 1024
    # patches of width 512, depth 6) scaled to S/16: 256 patches of 2 x 4 x 8 x 8, width 384, depth 12
    'vit_nd': ('4-D 8 x 16 x 32 x 32 / 2 x 4 x 8 x 8, S/16 wide, time causal', None, dict(
        ndim=4, input_shape=(8, 16, 32, 32), patch_size=(2, 4, 8, 8), num_classes=NUM_CLASSES, dim=384, depth=12,
        heads=6, mlp_dim=1536, causal_dims=(0,)), (8, 16, 32, 32), 3, NUM_CLASSES),
    # vit-pytorch's __main__ ViViT with MOSS (8 x 256 px, tubelets 2 x 32, width 512, 2 + 2 layers), time causal;
    # mean pooling, since its cls-pooled causal model's logits ignore the video (ours refuses those weights)
    'vivit_with_moss': ('8 x 256 px / 2 x 32, width 512, 2 + 2 layers, causal, mean pool', None, dict(
        image_size=256, image_patch_size=32, frames=8, frame_patch_size=2, num_classes=NUM_CLASSES, dim=512,
        spatial_depth=2, temporal_depth=2, heads=4, mlp_dim=2048, pool='mean', moss_causal=True), (8, 256, 256), 3,
        NUM_CLASSES),
    # vit-pytorch's __main__ model (256 px, patches of 8, width 1024, depth 12, 8 streams) scaled to S/16 at 224
    # with the paper's expansion rate n = 4 and vit-pytorch's 4 registers
    'simple_vit_with_hyper_connections': ('S/16, 4 streams, 4 registers', None, dict(S16, num_residual_streams=4),
                                          224, 3, NUM_CLASSES),
    # vit-pytorch's __main__ model (256 px, patches of 32, width 1024, depth 6) at S's width: 7x7 patches of 32, depth
    # 6 (vit-pytorch's cross-attention over depth projects every earlier output again in each branch: at S/16's 196
    # tokens and depth 12 one training step of it takes minutes here)
    'simple_vit_attn_residual': ('S/32 wide, depth 6', None, dict(S16, patch_size=32, depth=6), 224, 3, NUM_CLASSES),
    # vit-pytorch's multi-way attention residuals at S/16 with two head groups (its __main__ tries 1, 2 and 4)
    'attn_residual_with_dca_simple_vit': ('S/16, 2 head groups', None, dict(S16, head_groups=2), 224, 3,
                                          NUM_CLASSES),
    # vit-pytorch's __main__ model (256 px, patches of 32, width 1024, depth 7) scaled to S/16 at 224, depth 13 as
    # the paper's U-ViT-S (6 shallow, 1 middle, 6 deep blocks), 4 registers
    'simple_uvit': ('S/16, depth 13, 4 registers', None, dict(S16, depth=13), 224, 3, NUM_CLASSES),
    # vit-pytorch's __main__ WWT (256 px, patches of 32, width 256, depth 2, slots 64 / 32 / 16, the four
    # interactions, registers, l1 norm) at 224 px and patches of 16 (196 tokens); its classifier only (no SIGReg, no
    # token or dense heads: the registered forward returns logits)
    'wwt': ('224 px / 16, width 256, depth 2, slots 64 / 32 / 16', None, dict(
        image_size=224, patch_size=16, num_classes=NUM_CLASSES, dim=256, depth=2, num_slots=(64, 32, 16),
        interactions=((0, 1), (0, 2), (1, 2), (2, 3)), heads=4, mlp_dim=512, l1norm_after_tokens_softmax=True,
        num_register_tokens=4, num_register_slots=(4, 4, 2)), 224, 3, NUM_CLASSES),
    # vit-pytorch's __main__ ViTND with rotary positions (5-D, time causal, width 512, depth 6) scaled as 'vit_nd'
    'vit_nd_rotary': ('4-D 8 x 16 x 32 x 32 / 2 x 4 x 8 x 8, S/16 wide, time causal', None, dict(
        ndim=4, input_shape=(8, 16, 32, 32), patch_size=(2, 4, 8, 8), num_classes=NUM_CLASSES, dim=384, depth=12,
        heads=6, mlp_dim=1536, causal_dims=(0,)), (8, 16, 32, 32), 3, NUM_CLASSES),
    # vit-pytorch's __main__ ViTND with PoPE, scaled as 'vit_nd'
    'vit_nd_pope': ('4-D 8 x 16 x 32 x 32 / 2 x 4 x 8 x 8, S/16 wide, time causal', None, dict(
        ndim=4, input_shape=(8, 16, 32, 32), patch_size=(2, 4, 8, 8), num_classes=NUM_CLASSES, dim=384, depth=12,
        heads=6, mlp_dim=1536, causal_dims=(0,)), (8, 16, 32, 32), 3, NUM_CLASSES),
    # the paper's ViT-S encoder (levjepa.CONFIGS['small']: 384 wide, 12 layers, 6 heads of 64, MLP 4 x) on 8 frames
    # of 128 px in patches of 16 (one frame a token): 512 patch tokens, block-causal, a head on the cls token
    'levjepa': ("ViT-S, 8 x 128 px / 16, block-causal", None, dict(
        image_size=128, patch_size=16, frames=8, num_classes=NUM_CLASSES, dim=384, depth=12, heads=6, dim_head=64,
        mlp_dim=1536), (8, 128, 128), 3, NUM_CLASSES),
    # the same widths on levjepa_nd's NDTransformer in tubelets of 2 x 16 x 16: 256 patch tokens, time causal
    'levjepa_nd': ("ViT-S, 8 x 128 px / 2 x 16 x 16, time causal", None, dict(
        ndim=3, input_shape=(8, 128, 128), patch_size=(2, 16, 16), num_classes=NUM_CLASSES, dim=384, depth=12, heads=6,
        dim_head=64, mlp_dim=1536), (8, 128, 128), 3, NUM_CLASSES),
}
# `--tiny`: the training command's small model on 16-pixel gray images, 10 classes (signals of 16 samples, clips
# of the model's frames of 16 pixels)
TINY = dict(image_size=16, channels=1, num_classes=10)


def step_decorrelation(model):
    """What the training loop (`vit_pytorch.training.loop.train_epoch`) does after every optimizer step for a model
    with decorrelation matrices: `update_decorrelation_()` of every module that has one."""
    for module in model.modules():
        if callable(getattr(module, 'update_decorrelation_', None)):
            module.update_decorrelation_()


# variant rows: a registered model with an option of its own that its preset leaves off, a row of the table beside
# the model's (measured by name, and by `--registry all`), timed against the preset's reference doing the preset's
# work: another method, different work. name -> dict(model: the registered name; preset; options: keyword arguments
# added to the preset's, and to the tiny model's; loss: its training loss; after_step: what the training loop does
# after the optimizer's step, or None; reference: what the reference does instead, for the table)
VARIANTS = {
    # the paper's method (decorrelated backpropagation): a matrix before each of the encoder's 49 Linears (the patch
    # projection, 4 in each of the 12 layers), stepped by its rule after every optimizer step as the training loop
    # steps it, on the cross-entropy alone (as examples/digits_claims.py trains the matrices). vit-pytorch has no
    # matrices: its module trains by its own method, the loss of the preset's row
    'vit_with_decorr:paper': dict(
        model='vit_with_decorr', preset="S/16, the paper's decorrelation matrices (lr 1e-4, kappa 1e-3), no loss",
        options=dict(decorr_matrices=True), loss=classification_loss, after_step=step_decorrelation,
        reference="the paper's method against vit-pytorch's method (its decorrelation loss x 0.1; vit-pytorch has "
                  "no matrices): different work"),
}


def table_names():
    """The table's rows in order, what `--registry all` measures: every registered model, each followed by its
    variants."""
    return [row for name in registry.MODELS
            for row in [name] + [variant for variant, v in VARIANTS.items() if v['model'] == name]]


def input_dims(image_size):
    """The trailing dims of a model's input: (side, side) for an int, else as given ((length,), (frames, h, w))."""
    return (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
# `--registry` references, timed beside the preset where their library is importable (not with --tiny):
# name -> (label, builder); the builder gets our model and returns the reference implementation of the
# preset, its random weights loaded into ours through our loader. Logits are checked equal before timing;
# the report's ratio rows are '<name>/<name>:ref'.
REFERENCES = {
    'swin': ('timm swin_tiny_patch4_window7_224', lambda ours: timm_reference('swin_tiny_patch4_window7_224', ours)),
    'swinv2': ('timm swinv2_tiny_window8_256', lambda ours: timm_reference('swinv2_tiny_window8_256', ours)),
    'max_vit': ('timm maxvit_tiny_tf_224', lambda ours: timm_reference('maxvit_tiny_tf_224', ours)),
    'pit': ('timm pit_ti_224', lambda ours: timm_reference('pit_ti_224', ours)),
    'levit': ('timm levit_128s, one head', lambda ours: timm_reference('levit_128s', ours, distilled=False)),
    'cvt': ('Hugging Face CvtForImageClassification (CvT-13)', lambda ours: hf_cvt_reference(ours)),
    'pvt_v2': ('timm pvt_v2_b0', lambda ours: timm_reference('pvt_v2_b0', ours)),
    'twins_svt': ('timm twins_svt_small', lambda ours: timm_reference('twins_svt_small', ours)),
    'nest': ('timm nest_tiny', lambda ours: timm_reference('nest_tiny', ours, drop_path_rate=0.)),
    'vit': ('timm vit_small_patch16_224', lambda ours: timm_reference('vit_small_patch16_224', ours)),
    'cait': ('timm cait_xxs24_224', lambda ours: timm_reference('cait_xxs24_224', ours)),
    'xcit': ('timm xcit_tiny_12_p16_224', lambda ours: timm_reference('xcit_tiny_12_p16_224', ours)),
    'cross_vit': ('timm crossvit_tiny_240', lambda ours: timm_reference('crossvit_tiny_240', ours)),
    'distillable_vit': ('timm deit_small_distilled_patch16_224',
                        lambda ours: timm_reference('deit_small_distilled_patch16_224', ours)),
    # the official code, imported from $VIT_PYTORCH_OFFICIAL/CrossFormer (skipped when that is unset)
    'crossformer': ('official CrossFormer-T (cheerss/CrossFormer)', lambda ours: crossformer_official_reference(ours)),
    # the official code, imported from $VIT_PYTORCH_OFFICIAL/SepViT (skipped when that is unset)
    'sep_vit': ('official SepViT_Tiny (liwei109/SepViT)', lambda ours: sep_vit_official_reference(ours)),
    # the official code, imported from $VIT_PYTORCH_OFFICIAL/ScalableViT (skipped when that is unset)
    'scalable_vit': ('official scalable_vit_small (Yangr116/ScalableViT)',
                     lambda ours: scalable_vit_official_reference(ours)),
    'mobile_vit': ('timm mobilevit_xxs', lambda ours: timm_reference('mobilevit_xxs', ours)),
    # the official code, imported from $VIT_PYTORCH_OFFICIAL/RegionViT (skipped when that is unset)
    'regionvit': ('official regionvit_tiny_224 (IBM/RegionViT)', lambda ours: regionvit_official_reference(ours)),
    # the official code, imported from $VIT_PYTORCH_OFFICIAL/T2T-ViT (skipped when that is unset)
    't2t': ('official T2T-ViT_t-14 (yitu-opensource/T2T-ViT)', lambda ours: t2t_official_reference(ours)),
    # the official code, imported from $VIT_PYTORCH_OFFICIAL/LocalViT (skipped when that is unset)
    'local_vit': ("official LocalViT-S, act 'hs', ours' pre-LN put in (ofsoundof/LocalViT)",
                  lambda ours: local_vit_official_reference(ours)),
    # vit-pytorch 1.26.14, for models only it has: imported from $VIT_PYTORCH_SOURCE (skipped when that is unset),
    # built with the preset's keyword arguments
    'deepvit': ('vit-pytorch 1.26.14 deepvit.DeepViT',
                lambda ours: vit_pytorch_reference('deepvit', 'DeepViT', ours, **REGISTRY['deepvit'][2])),
    'vit_detpool': ('vit-pytorch 1.26.14 vit_detpool.ViTDetPool',
                    lambda ours: vit_pytorch_reference('vit_detpool', 'ViTDetPool', ours,
                                                       **REGISTRY['vit_detpool'][2])),
    'simple_vit_with_specialized_cls': (
        'vit-pytorch 1.26.14 simple_vit_with_specialized_cls.SimpleViT',
        lambda ours: vit_pytorch_reference('simple_vit_with_specialized_cls', 'SimpleViT', ours,
                                           **REGISTRY['simple_vit_with_specialized_cls'][2])),
    'simple_vit_with_fft': ('vit-pytorch 1.26.14 simple_vit_with_fft.SimpleViT',
                            lambda ours: vit_pytorch_reference('simple_vit_with_fft', 'SimpleViT', ours,
                                                               **REGISTRY['simple_vit_with_fft'][2])),
    'look_vit': ('vit-pytorch 1.26.14 look_vit.LookViT',
                 lambda ours: vit_pytorch_reference('look_vit', 'LookViT', ours, **REGISTRY['look_vit'][2])),
    'simple_vit_with_relative_proj_pos_bias': (
        'vit-pytorch 1.26.14 simple_vit_with_relative_proj_pos_bias.SimpleViT',
        lambda ours: vit_pytorch_reference('simple_vit_with_relative_proj_pos_bias', 'SimpleViT', ours,
                                           **REGISTRY['simple_vit_with_relative_proj_pos_bias'][2])),
    'ats_vit': ('vit-pytorch 1.26.14 ats_vit.ViT',
                lambda ours: vit_pytorch_reference('ats_vit', 'ViT', ours, load=False, **REGISTRY['ats_vit'][2])),
    'vit_with_patch_merger': ('vit-pytorch 1.26.14 vit_with_patch_merger.ViT',
                              lambda ours: vit_pytorch_reference('vit_with_patch_merger', 'ViT', ours,
                                                                 **REGISTRY['vit_with_patch_merger'][2])),
    'simple_vit_with_value_residual': (
        'vit-pytorch 1.26.14 simple_vit_with_value_residual.SimpleViT',
        lambda ours: vit_pytorch_reference('simple_vit_with_value_residual', 'SimpleViT', ours,
                                           **REGISTRY['simple_vit_with_value_residual'][2])),
    'simple_vit_orthog_residual_update': (
        'vit-pytorch 1.26.14 simple_vit_orthog_residual_update.SimpleViT',
        lambda ours: vit_pytorch_reference('simple_vit_orthog_residual_update', 'SimpleViT', ours,
                                           **REGISTRY['simple_vit_orthog_residual_update'][2])),
    'vit_with_decorr': ('vit-pytorch 1.26.14 vit_with_decorr.ViT',
                        lambda ours: vit_pytorch_reference('vit_with_decorr', 'ViT', ours,
                                                           **REGISTRY['vit_with_decorr'][2])),
    'vit_5': ('vit-pytorch 1.26.14 vit_5.ViT',
              lambda ours: vit_pytorch_reference('vit_5', 'ViT', ours, **REGISTRY['vit_5'][2])),
    'rvt': ('vit-pytorch 1.26.14 rvt.RvT',
            lambda ours: vit_pytorch_reference('rvt', 'RvT', ours, **REGISTRY['rvt'][2])),
    'normalized_vit': ('vit-pytorch 1.26.14 normalized_vit.nViT',
                       lambda ours: vit_pytorch_reference('normalized_vit', 'nViT', ours,
                                                          **REGISTRY['normalized_vit'][2])),
    'vit_with_keel_post_ln': ('vit-pytorch 1.26.14 vit_with_keel_post_ln.ViT',
                              lambda ours: vit_pytorch_reference('vit_with_keel_post_ln', 'ViT', ours,
                                                                 **REGISTRY['vit_with_keel_post_ln'][2])),
    'simple_vit_with_sparse_gating': (
        'vit-pytorch 1.26.14 simple_vit_with_sparse_gating.SimpleViTWithSparseGating',
        lambda ours: vit_pytorch_reference('simple_vit_with_sparse_gating', 'SimpleViTWithSparseGating', ours,
                                           load=False, **REGISTRY['simple_vit_with_sparse_gating'][2])),
    'jet_vit': ('vit-pytorch 1.26.14 jet_vit.JetViT',
                lambda ours: vit_pytorch_reference('jet_vit', 'JetViT', ours, **REGISTRY['jet_vit'][2])),
    'looped_vit': ('vit-pytorch 1.26.14 looped_vit.LoopedViT',
                   lambda ours: vit_pytorch_reference('looped_vit', 'LoopedViT', ours, **REGISTRY['looped_vit'][2])),
    'simple_vit_with_hyper_connections': (
        'vit-pytorch 1.26.14 simple_vit_with_hyper_connections.SimpleViT',
        lambda ours: vit_pytorch_reference('simple_vit_with_hyper_connections', 'SimpleViT', ours,
                                           **REGISTRY['simple_vit_with_hyper_connections'][2])),
    'simple_vit_attn_residual': (
        'vit-pytorch 1.26.14 simple_vit_attn_residual.SimpleViTAttnResidual',
        lambda ours: vit_pytorch_unloaded('simple_vit_attn_residual', 'SimpleViTAttnResidual',
                                          **REGISTRY['simple_vit_attn_residual'][2])),
    'attn_residual_with_dca_simple_vit': (
        'vit-pytorch 1.26.14 attn_residual_with_dca_simple_vit.SimpleViT',
        lambda ours: vit_pytorch_reference('attn_residual_with_dca_simple_vit', 'SimpleViT', ours,
                                           **REGISTRY['attn_residual_with_dca_simple_vit'][2])),
    'simple_uvit': (
        'vit-pytorch 1.26.14 simple_uvit.SimpleUViT',
        lambda ours: vit_pytorch_unloaded('simple_uvit', 'SimpleUViT', **REGISTRY['simple_uvit'][2])),
    # vit-pytorch's FeedForward takes a multiplier where JumboViT hands it a width (dim * mlp_dim wide): given the
    # multipliers, its feed-forwards are as wide as ours (1536 and 6 * 384 * 4)
    'jumbo_vit': (
        'vit-pytorch 1.26.14 jumbo_vit.JumboViT, multipliers for widths',
        lambda ours: vit_pytorch_unloaded('jumbo_vit', 'JumboViT', **dict(
            S16, mlp_dim=S16['mlp_dim'] / S16['dim'], jumbo_cls_k=6, jumbo_ff_mult=4.5 / (6 * S16['dim'])))),
}
# vit-pytorch 1.26.14's modules that compute our function at the preset's arguments: name -> (module, class)
VIT_PYTORCH_REFERENCES = {
    'simple_vit': ('simple_vit', 'SimpleViT'), 'parallel_vit': ('parallel_vit', 'ViT'),
    'learnable_memory_vit': ('learnable_memory_vit', 'ViT'),
    'simple_vit_with_register_tokens': ('simple_vit_with_register_tokens', 'SimpleViT'),
    'simple_vit_with_patch_dropout': ('simple_vit_with_patch_dropout', 'SimpleViT'),
    'vit_1d': ('vit_1d', 'ViT'), 'simple_vit_1d': ('simple_vit_1d', 'SimpleViT'), 'vit_3d': ('vit_3d', 'ViT'),
    'simple_vit_3d': ('simple_vit_3d', 'SimpleViT'), 'vivit': ('vivit', 'ViViT'), 'cct_3d': ('cct_3d', 'CCT'),
    'vit_with_patch_dropout': ('vit_with_patch_dropout', 'ViT'),
    'simple_flash_attn_vit': ('simple_flash_attn_vit', 'SimpleViT'),
    'simple_flash_attn_vit_3d': ('simple_flash_attn_vit_3d', 'SimpleViT'),
    'na_vit': ('na_vit', 'NaViT'), 'na_vit_nested_tensor': ('na_vit_nested_tensor', 'NaViT'),
    'na_vit_nested_tensor_3d': ('na_vit_nested_tensor_3d', 'NaViT'),
    'vivit_with_moss': ('vivit_with_moss', 'ViViT'),
    'wwt': ('wwt', 'WWT'),
}


def vit_nd_reference(ours):
    """vit-pytorch's causal ViTND at the preset, its random weights copied into `ours` (load_vit_pytorch refuses a
    causal model: vit-pytorch's patches attend to the cls token, ours do not, see DIFFERENT_FUNCTION)."""
    reference_module = vit_pytorch_module('vit_nd')
    if reference_module is None:
        return None
    reference = reference_module.ViTND(**REGISTRY['vit_nd'][2])
    ours.load_state_dict({key: value[0] if key in ('cls_token', 'pos_embedding') else value
                          for key, value in reference.state_dict().items()}, strict=True)
    return reference


REFERENCES['vit_nd'] = ('vit-pytorch 1.26.14 vit_nd.ViTND', vit_nd_reference)
# timm has no CCT: vit-pytorch 1.26.14's cct_7 takes the preset's arguments as ours does (CCT-7/3x1 at 32 px, 3,760,139
# parameters in both), and its weights load into ours
REFERENCES['cct'] = ('vit-pytorch 1.26.14 cct.cct_7', lambda ours: vit_pytorch_reference(
    'cct', 'cct_7', ours, **REGISTRY['cct'][2]))
REFERENCES['vit_nd_rotary'] = ('vit-pytorch 1.26.14 vit_nd_rotary.ViTND', lambda ours: vit_pytorch_reference(
    'vit_nd_rotary', 'ViTND', ours, **REGISTRY['vit_nd_rotary'][2]))
REFERENCES['vit_nd_pope'] = ('vit-pytorch 1.26.14 vit_nd_pope.ViTND', lambda ours: vit_pytorch_reference(
    'vit_nd_pope', 'ViTND', ours, **REGISTRY['vit_nd_pope'][2]))
REFERENCES.update({
    name: (f'vit-pytorch 1.26.14 {module}.{cls}',
           lambda ours, name=name, module=module, cls=cls: vit_pytorch_reference(module, cls, ours,
                                                                                **REGISTRY[name][2]))
    for name, (module, cls) in VIT_PYTORCH_REFERENCES.items()})


# the plain reference: explicit softmax attention, plain torch reshapes, nothing fused


class RefAttention(nn.Module):
    def __init__(self, dim, heads, dim_head, qkv_bias, proj_bias, eps):
        super().__init__()
        self.heads, self.scale = heads, dim_head ** -0.5
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.qkv = nn.Linear(dim, 3 * heads * dim_head, bias=qkv_bias)
        self.proj = nn.Linear(heads * dim_head, dim, bias=proj_bias)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, -1))


class RefMlp(nn.Module):
    def __init__(self, dim, hidden, eps):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(dim, eps=eps), nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(self.norm(x))))


class RefViT(nn.Module):
    """A pre-norm ViT in plain torch; `simple=True` gives SimpleViT's variant of it."""

    def __init__(self, *, image_size, patch_size, dim, depth, heads, mlp_dim, dim_head=64, simple=False):
        super().__init__()
        eps = 1e-5 if simple else 1e-6
        self.patch_size, self.simple = patch_size, simple
        patch_dim, num_patches = 3 * patch_size ** 2, (image_size // patch_size) ** 2
        self.patch_norm = nn.LayerNorm(patch_dim) if simple else nn.Identity()
        self.patch_proj = nn.Linear(patch_dim, dim)
        self.embed_norm = nn.LayerNorm(dim) if simple else nn.Identity()
        if simple:
            self.register_buffer('pos', torch.zeros(num_patches, dim))
        else:
            self.cls = nn.Parameter(torch.zeros(1, dim))
            self.pos = nn.Parameter(torch.zeros(1 + num_patches, dim))
        self.blocks = nn.ModuleList(
            nn.ModuleList([RefAttention(dim, heads, dim_head, not simple, not simple, eps), RefMlp(dim, mlp_dim, eps)])
            for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.head = nn.Linear(dim, NUM_CLASSES)

    def forward(self, img):
        b, c, h, w = img.shape
        p = self.patch_size
        x = img.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1).reshape(b, (h // p) * (w // p), -1)
        x = self.embed_norm(self.patch_proj(self.patch_norm(x)))
        if not self.simple:
            x = torch.cat((self.cls.expand(b, -1, -1), x), dim=1)
        x = x + self.pos
        for attn, mlp in self.blocks:
            x = attn(x) + x
            x = mlp(x) + x
        x = self.norm(x)
        return self.head(x.mean(dim=1) if self.simple else x[:, 0])


# building the models, all with the weights of one source model


def build_ours(kind, config, image_size):
    kwargs = dict(image_size=image_size, num_classes=NUM_CLASSES, dim_head=64, **CONFIGS[config])
    if kind == 'vit':
        # the paper's ViT (= timm's): no patch norms, biased qkv, LayerNorm eps 1e-6
        return ViT(patch_norm=False, qkv_bias=True, norm_eps=1e-6, **kwargs)
    return SimpleViT(**kwargs)


def ref_keys(ours, depth):
    """(our key, reference key) pairs."""
    simple = isinstance(ours, SimpleViT)
    keys = [] if simple else [('cls_token', 'cls'), ('pos_embedding', 'pos')]
    keys += [('to_patch_embedding.2.weight', 'patch_proj.weight'), ('to_patch_embedding.2.bias', 'patch_proj.bias')]
    if simple:
        keys += [(f'to_patch_embedding.{i}.{p}', f'{n}.{p}') for i, n in ((1, 'patch_norm'), (3, 'embed_norm'))
                 for p in ('weight', 'bias')] + [('pos_embedding', 'pos')]
    for i in range(depth):
        ours_, ref = f'transformer.layers.{i}', f'blocks.{i}'
        pairs = [('0.norm', '0.norm'), ('0.to_qkv', '0.qkv'), ('0.to_out' if simple else '0.to_out.0', '0.proj'),
                 ('1.net.0', '1.norm'), ('1.net.1', '1.fc1'), ('1.net.3' if simple else '1.net.4', '1.fc2')]
        for a, b in pairs:
            keys += [(f'{ours_}.{a}.{p}', f'{ref}.{b}.{p}') for p in ('weight', 'bias')]
    keys += [('transformer.norm.weight', 'norm.weight'), ('transformer.norm.bias', 'norm.bias')]
    head = 'linear_head' if simple else 'mlp_head'
    keys += [(f'{head}.weight', 'head.weight'), (f'{head}.bias', 'head.bias')]
    return keys


def timm_keys(depth, patch):
    """(our key, timm key, how to convert our tensor) triples."""
    keys = [('cls_token', 'cls_token', lambda t: t[None]), ('pos_embedding', 'pos_embed', lambda t: t[None]),
            # our patch rows are (p1 p2 c), timm's conv kernel is (c, p1, p2)
            ('to_patch_embedding.2.weight', 'patch_embed.proj.weight',
             lambda t: t.reshape(t.shape[0], patch, patch, 3).permute(0, 3, 1, 2)),
            ('to_patch_embedding.2.bias', 'patch_embed.proj.bias', None)]
    for i in range(depth):
        ours_, ref = f'transformer.layers.{i}', f'blocks.{i}'
        for a, b in (('0.norm', 'norm1'), ('0.to_qkv', 'attn.qkv'), ('0.to_out.0', 'attn.proj'),
                     ('1.net.0', 'norm2'), ('1.net.1', 'mlp.fc1'), ('1.net.4', 'mlp.fc2')):
            keys += [(f'{ours_}.{a}.{p}', f'{ref}.{b}.{p}', None) for p in ('weight', 'bias')]
    keys += [('transformer.norm.weight', 'norm.weight', None), ('transformer.norm.bias', 'norm.bias', None),
             ('mlp_head.weight', 'head.weight', None), ('mlp_head.bias', 'head.bias', None)]
    return keys


def copy_weights(source, target, triples):
    src = {**dict(source.named_parameters()), **dict(source.named_buffers())}
    dst = {**dict(target.named_parameters()), **dict(target.named_buffers())}
    if len(triples) != len(dst):
        raise RuntimeError(f'{len(triples)} keys mapped for a target with {len(dst)} tensors')
    with torch.no_grad():
        for ours, theirs, convert in triples:
            value = src[ours] if convert is None else convert(src[ours])
            if value.shape != dst[theirs].shape:
                raise RuntimeError(f'{ours} {tuple(value.shape)} does not fit {theirs} {tuple(dst[theirs].shape)}')
            dst[theirs].copy_(value)


def family(name):
    return 'simple_vit' if name.startswith('simple') else 'vit'


def build_baseline(kind, config, image_size, source=None):
    """A baseline model; with `source`, carrying the source's weights."""
    cfg = CONFIGS[config]
    if kind == 'timm':
        model = timm.create_model(TIMM_NAMES[config], pretrained=False, img_size=image_size, num_classes=NUM_CLASSES)
        if source is not None:
            copy_weights(source, model, timm_keys(cfg['depth'], cfg['patch_size']))
        return model
    model = RefViT(image_size=image_size, simple=kind == 'simple_reference', **cfg)
    if source is not None:
        present = set(source.state_dict(keep_vars=True)) | {n for n, _ in source.named_buffers()}
        copy_weights(source, model, [(a, b, None) for a, b in ref_keys(source, cfg['depth']) if a in present])
    return model


def build_all(names, config, image_size, seed=0):
    torch.manual_seed(seed)
    # our model of each family needed, then every baseline with that model's weights
    models = {kind: build_ours(kind, config, image_size) for kind in ('vit', 'simple_vit')
              if kind in {family(name) for name in names}}
    for kind in names:
        if kind not in models:
            models[kind] = build_baseline(kind, config, image_size, models[family(kind)])
    # same weights, same function: check before timing anything
    img = torch.randn(2, 3, image_size, image_size)
    with torch.inference_mode():
        for kind, model in models.items():
            model.eval()
            expected = models[family(kind)](img)
            error = (model(img) - expected).abs().max().item()
            if error > 1e-3:
                raise RuntimeError(f'{kind} disagrees with our model by {error:.2e} on the same weights')
    return {kind: models[kind] for kind in names}


# registry models: each with its input and its training loss


class DistillationLoss:
    """DeiT's soft-distillation loss of a `DeiT`, through `DistillWrapper` as in training; of timm's
    `VisionTransformerDistilled` (the reference), the same loss on the two heads it returns in distilled training
    (`set_distilled_training`), so that both steps compute one function.

    The teacher is a linear map of the mean colour, whose cost is negligible, so that the step
    measured is the student's: DeiT's teacher (a RegNetY) is a separate model with its own cost.
    """

    temperature, alpha = 3.0, 0.5

    def __init__(self, channels, num_classes):
        self.teacher = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))

    def __call__(self, model, img, labels):
        from vit_pytorch.distill import DeiT, DistillWrapper

        t, alpha = self.temperature, self.alpha
        if isinstance(model, DeiT):
            return DistillWrapper(teacher=self.teacher, student=model, temperature=t, alpha=alpha)(img, labels)
        model.set_distilled_training(True)          # timm's: (cls logits, distillation logits) in training mode
        with torch.no_grad():
            teacher_logits = self.teacher.eval()(img)
        logits, distill_logits = model(img)
        distill_loss = F.kl_div(F.log_softmax(distill_logits / t, dim=-1), F.log_softmax(teacher_logits / t, dim=-1),
                                reduction='batchmean', log_target=True) * t ** 2
        return (1 - alpha) * F.cross_entropy(logits, labels) + alpha * distill_loss


class AuxiliaryLoss:
    """The training command's loss of a model with an auxiliary loss (registry.AUX_LOSSES): cross-entropy + weight
    x that loss. Ours (the registered class) and vit-pytorch's both return (logits, loss) when asked with the
    forward's keyword (`return_decorr_aux_loss`, `return_loss`)."""

    def __init__(self, keyword, weight=0.1):
        self.keyword, self.weight = keyword, weight

    def __call__(self, model, img, labels):
        logits, auxiliary = model(img, **{self.keyword: True})
        return F.cross_entropy(logits, labels) + self.weight * auxiliary


def timm_reference(timm_name, ours, **kwargs):
    """timm's `timm_name` (random weights; `kwargs` go to timm.create_model), its weights loaded into `ours`
    by vit_pytorch.pretrained.load_timm."""
    from vit_pytorch.pretrained import load_timm

    if timm is None:
        return None
    reference = timm.create_model(timm_name, pretrained=False, num_classes=ours.num_classes, **kwargs)
    load_timm(ours, reference.state_dict())
    return reference



def vit_pytorch_module(module, *, quiet=True):
    """vit-pytorch 1.26.14's `module` (e.g. 'ats_vit'), imported from $VIT_PYTORCH_SOURCE: its wheel
    (`pip download vit-pytorch==1.26.14 --no-deps`) or the unpacked `vit_pytorch` folder; None where that is
    unset or the module needs a library this environment lacks (`quiet=False`: the ImportError is raised).

    Both packages are called `vit_pytorch`, so the reference is imported under that name with ours set aside,
    without running its `__init__` (which imports torchvision), and ours is put back; the reference's modules
    keep what they imported."""
    source = os.environ.get('VIT_PYTORCH_SOURCE')
    if not source:
        return None
    folder = os.path.join(source, 'vit_pytorch') if source.endswith('.whl') else source
    ours = {name: mod for name, mod in sys.modules.items() if name == 'vit_pytorch' or name.startswith('vit_pytorch.')}
    for name in ours:
        del sys.modules[name]
    package = importlib.util.module_from_spec(importlib.machinery.ModuleSpec('vit_pytorch', None, is_package=True))
    package.__path__ = [folder]
    sys.modules['vit_pytorch'] = package
    try:
        return importlib.import_module(f'vit_pytorch.{module}')
    except ImportError:
        if not quiet:
            raise
        return None
    finally:
        for name in [name for name in sys.modules if name == 'vit_pytorch' or name.startswith('vit_pytorch.')]:
            del sys.modules[name]
        sys.modules.update(ours)


def vit_pytorch_reference(module, class_name, ours, *, load=True, **kwargs):
    """vit-pytorch's `module.class_name`, built with the preset's own keyword arguments (`kwargs`: at vit-pytorch's
    import path our call means what vit-pytorch's means), its random weights loaded into `ours` by
    vit_pytorch.pretrained.load_vit_pytorch (`load=False`: not, for a module that computes another function, whose
    checkpoints ours refuses); None where vit_pytorch_module finds no source."""
    from vit_pytorch.pretrained import load_vit_pytorch

    reference_module = vit_pytorch_module(module)
    if reference_module is None:
        return None
    reference = getattr(reference_module, class_name)(**kwargs)
    if load:
        load_vit_pytorch(ours, reference.state_dict())
    return reference


def vit_pytorch_unloaded(module, class_name, **kwargs):
    """vit-pytorch's `module.class_name` with its own random weights, for a module whose function ours does not
    compute (its checkpoints are refused; see DIFFERENT_FUNCTION); None where vit_pytorch_module finds no source."""
    reference_module = vit_pytorch_module(module)
    return None if reference_module is None else getattr(reference_module, class_name)(**kwargs)


def tests_file(name, folder='fixtures'):
    """tests/`folder`/`name`.py (folder '' for tests/ itself) imported as a module, as it runs as a script: with its
    folder on the import path, for the `fixture_tools` or `helpers` it imports (the official references are built
    by the fixture scripts' functions, and their weights mapped by the tests' own key maps)."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, 'tests', folder)
    spec = importlib.util.spec_from_file_location(f'throughput_{name}', os.path.join(folder, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def fixture_script(name):
    return tests_file(name)


def tests_module(name):
    return tests_file(name, folder='')


def crossformer_official_reference(ours):
    """The official CrossFormer-T (github cheerss/CrossFormer @ 7952010, checked out as
    $VIT_PYTORCH_OFFICIAL/CrossFormer), built by tests/fixtures/make_crossformer_fixtures.py's `official_model`
    (no stochastic depth); its random weights loaded into `ours` by vit_pytorch.pretrained.load_official. None
    where VIT_PYTORCH_OFFICIAL is unset."""
    from vit_pytorch.pretrained import load_official

    root = os.environ.get('VIT_PYTORCH_OFFICIAL')
    if root is None:
        return None
    fixtures = fixture_script('make_crossformer_fixtures')
    reference = fixtures.official_model(os.path.join(root, 'CrossFormer'), 'tiny')
    load_official(ours, reference.state_dict())
    return reference


def regionvit_official_reference(ours):
    """The official regionvit_tiny_224 (github IBM/RegionViT @ 77000c2, checked out as $VIT_PYTORCH_OFFICIAL/RegionViT;
    it needs only timm); its random weights loaded into `ours` by vit_pytorch.pretrained.load_official. None where
    VIT_PYTORCH_OFFICIAL is unset."""
    from vit_pytorch.pretrained import load_official

    root = os.environ.get('VIT_PYTORCH_OFFICIAL')
    if root is None:
        return None
    sys.path.insert(0, os.path.join(root, 'RegionViT'))
    try:
        official = importlib.import_module('regionvit.regionvit')
    finally:
        sys.path.pop(0)
    reference = official.regionvit_tiny_224(num_classes=ours.num_classes)
    load_official(ours, reference.state_dict())
    return reference


class HFLogits(nn.Module):
    """A Hugging Face image classifier whose forward returns the logits tensor, as the benchmark's models do."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, img):
        return self.model(pixel_values=img).logits


def hf_cvt_reference(ours):
    """Hugging Face's CvtForImageClassification of CvT-13 (random weights, no stochastic depth, which ours
    does not build), its weights loaded into `ours` by vit_pytorch.pretrained.load_hf."""
    from transformers import CvtConfig, CvtForImageClassification

    from vit_pytorch.pretrained import load_hf

    reference = CvtForImageClassification(CvtConfig(num_labels=ours.num_classes, drop_path_rate=[0.0, 0.0, 0.0]))
    load_hf(ours, reference.state_dict())
    return HFLogits(reference)


def sep_vit_official_reference(ours):
    """The official SepViT_Tiny (github liwei109/SepViT @ 2b420d3, checked out as $VIT_PYTORCH_OFFICIAL/SepViT),
    imported as tests/fixtures/make_sep_vit_fixtures.py imports it (timm 0.3.2's Block signature on timm 1.0.31's
    Block, fvcore stubbed); its random weights loaded into `ours` by vit_pytorch.pretrained.load_official. None
    where VIT_PYTORCH_OFFICIAL is unset."""
    from vit_pytorch.pretrained import load_official

    root = os.environ.get('VIT_PYTORCH_OFFICIAL')
    if root is None:
        return None
    fixtures = fixture_script('make_sep_vit_fixtures')
    reference = fixtures.official_module(os.path.join(root, 'SepViT')).SepViT_Tiny(num_classes=ours.num_classes)
    load_official(ours, reference.state_dict())
    return reference


def scalable_vit_official_reference(ours):
    """The official scalable_vit_small (github Yangr116/ScalableViT @ 8011147, checked out as
    $VIT_PYTORCH_OFFICIAL/ScalableViT), imported as tests/fixtures/make_scalable_vit_fixtures.py imports it; its
    random weights loaded into `ours` by vit_pytorch.pretrained.load_official. None where VIT_PYTORCH_OFFICIAL is
    unset."""
    from vit_pytorch.pretrained import load_official

    root = os.environ.get('VIT_PYTORCH_OFFICIAL')
    if root is None:
        return None
    fixtures = fixture_script('make_scalable_vit_fixtures')
    official = fixtures.official_module(os.path.join(root, 'ScalableViT'))
    reference = fixtures.quiet(official.scalable_vit_small, num_classes=ours.num_classes)
    load_official(ours, reference.state_dict())
    return reference


T2T_OFFICIAL_COMMIT = '0f63dc9558f4d192de926504dbddfa1b3f5db6ca'    # make_t2t_official_fixtures.py's pin


def t2t_official_reference(ours):
    """The official T2T-ViT_t-14 (transformer T2T layers; github yitu-opensource/T2T-ViT @ 0f63dc9, checked out as
    $VIT_PYTORCH_OFFICIAL/T2T-ViT), `models/t2t_vit.py`'s `t2t_vit_t_14` as the fixture script
    tests/fixtures/make_t2t_official_fixtures.py builds its models (random weights; qk_scale unset, so
    head_dim ** -0.5 as ours). Its models/ folder is imported as the package `t2t_vit_official` (not `models`, a
    name other checkouts use too) without its __init__, which imports the SE, dense and ghost variants. ours has
    no loader of official T2T checkpoints (none exists in vit_pytorch.pretrained): the weights go through
    tests/test_t2t_official.py's `official_to_ours`, the key map that test proves against the official code's
    outputs. None where VIT_PYTORCH_OFFICIAL is unset."""
    root = os.environ.get('VIT_PYTORCH_OFFICIAL')
    if root is None:
        return None
    checkout = fixture_script('fixture_tools').official_checkout(
        os.path.join(root, 'T2T-ViT'), 'yitu-opensource/T2T-ViT', T2T_OFFICIAL_COMMIT, importable=False)
    if 't2t_vit_official' not in sys.modules:
        package = types.ModuleType('t2t_vit_official')
        package.__path__ = [os.path.join(checkout, 'models')]
        sys.modules['t2t_vit_official'] = package
    official = importlib.import_module('t2t_vit_official.t2t_vit')
    with contextlib.redirect_stdout(io.StringIO()):      # its T2T module prints which token layer it adopts
        reference = official.t2t_vit_t_14(num_classes=ours.num_classes)
    state = tests_module('test_t2t_official').official_to_ours(reference.state_dict(), 'transformer',
                                                               len(reference.blocks))
    ours.load_state_dict(state, strict=True)
    return reference



LOCAL_VIT_OFFICIAL_COMMIT = 'f49726087006ddbd55eb18a40cf6eebca18e2b8e'    # make_local_vit_official_fixtures.py's pin


def local_vit_official_module(root):
    """models/localvit.py of the official LocalViT (github ofsoundof/LocalViT @ f497260, checked out as
    `root`/LocalViT), imported by tests/fixtures/make_local_vit_official_fixtures.py's `official_module`, with its
    stand-in for timm 0.3.2's VisionTransformer signature (which the official model class calls)."""
    checkout = fixture_script('fixture_tools').official_checkout(
        os.path.join(root, 'LocalViT'), 'ofsoundof/LocalViT', LOCAL_VIT_OFFICIAL_COMMIT, importable=False)
    return fixture_script('make_local_vit_official_fixtures').official_module(checkout)


def local_vit_official_to_ours(state, depth):
    """The state_dict of the official LocalVisionTransformer built by `local_vit_official_reference` (ours' pre-LN
    first in each block's `conv.conv`) as ours' LocalViT (patch_norm=False) takes it: each bias-free convolution
    and the eval-mode BatchNorm after it folded into ours' biased 1x1 / depthwise convolution (tests/test_local_vit.py's
    `folded`, the map that test proves against the official block's outputs); the patch convolution's (c, p1, p2)
    input order as ours' (p1 p2 c) patch vectors."""
    folded = tests_module('test_local_vit').folded
    dim = state['cls_token'].shape[-1]
    ours = {'cls_token': state['cls_token'].reshape(1, dim), 'pos_embedding': state['pos_embed'][0],
            'to_patch_embedding.2.weight': state['patch_embed.proj.weight'].permute(0, 2, 3, 1).reshape(dim, -1),
            'to_patch_embedding.2.bias': state['patch_embed.proj.bias'],
            'transformer.norm.weight': state['norm.weight'], 'transformer.norm.bias': state['norm.bias'],
            'mlp_head.weight': state['head.weight'], 'mlp_head.bias': state['head.bias']}
    for i in range(depth):
        block, attn, ff = f'blocks.{i}', f'transformer.layers.{i}.0', f'transformer.layers.{i}.1'
        for theirs, name in (('norm1', 'norm'), ('attn.qkv', 'to_qkv'), ('attn.proj', 'to_out.0')):
            for kind in ('weight', 'bias'):
                ours[f'{attn}.{name}.{kind}'] = state[f'{block}.{theirs}.{kind}']
        for kind in ('weight', 'bias'):
            ours[f'{ff}.norm.{kind}'] = state[f'{block}.conv.conv.0.norm.{kind}']
        # conv.conv: 0 ours' LayerNorm, then 1x1 conv, BN, h-swish, depthwise 3x3, BN, h-swish, 1x1 conv, BN
        for name, conv, shape in (('expand', 1, (-1, dim)), ('depthwise', 4, None), ('reduce', 7, (dim, -1))):
            weight, bias = folded(state, f'{block}.conv.conv.{conv}', f'{block}.conv.conv.{conv + 1}')
            weight = weight if shape is None else weight.reshape(shape)
            dtype = state[f'{block}.conv.conv.{conv}.weight'].dtype                # folded in float64
            ours[f'{ff}.{name}.weight'], ours[f'{ff}.{name}.bias'] = weight.to(dtype), bias.to(dtype)
    return ours


def local_vit_official_reference(ours):
    """The official LocalViT (github ofsoundof/LocalViT @ f497260, checked out as $VIT_PYTORCH_OFFICIAL/LocalViT),
    its LocalVisionTransformer at the preset, LocalViT-S's shapes (localvit_small_mlp4_act3_r384: width 384, depth
    12, 8 heads, MLP ratio 4, qkv bias, LayerNorm eps 1e-6) with act=2, the official option 'hs' (h-swish, no SE:
    the named models take act=3, an SE layer in each feed-forward, ours' se_reduction, which the preset leaves
    out), and ours' one other
    difference put into it as the fixture script tests/fixtures/make_local_vit_official_fixtures.py puts it: a
    LayerNorm of each token (eps 1e-5, ours' pre-LN) first in each locality feed-forward, which the official block
    feeds the raw stream. Its BatchNorms are folded into ours' convolutions (`local_vit_official_to_ours`): the
    same function in eval mode, where the logits are checked; a training step normalises with the batch's
    statistics, as the official code trains. Its blocks are an nn.Sequential (the official ModuleList under the same
    keys), which timm 1.0.31's forward_features calls in order as timm 0.3.2's loop did. None where
    VIT_PYTORCH_OFFICIAL is unset."""
    from functools import partial

    root = os.environ.get('VIT_PYTORCH_OFFICIAL')
    if root is None:
        return None
    official = local_vit_official_module(root)
    channel_norm = fixture_script('make_local_vit_official_fixtures').ChannelLayerNorm
    reference = official.LocalVisionTransformer(
        patch_size=16, embed_dim=384, depth=12, num_heads=8, mlp_ratio=4, qkv_bias=True, act=2,
        norm_layer=partial(nn.LayerNorm, eps=1e-6), num_classes=ours.num_classes)
    for block in reference.blocks:
        block.conv.conv = nn.Sequential(channel_norm(nn.LayerNorm(reference.embed_dim)), *block.conv.conv)
    reference.blocks = nn.Sequential(*reference.blocks)
    ours.load_state_dict(local_vit_official_to_ours(reference.state_dict(), len(reference.blocks)), strict=True)
    return reference

# references that compute another function than ours by design, timed at the same sizes without the output check
DIFFERENT_FUNCTION = {'ats_vit': "vit-pytorch's ATS draws a random Gumbel-max sample of tokens, ours the paper's "
                                 "deterministic inverse transform sample, at the same token budget",
                      'simple_vit_with_sparse_gating': "vit-pytorch's gates the attention scores by a low-rank "
                                                       "sigmoid(q_mask . k_mask), ours each head's attention output "
                                                       "(the paper's G1 gate)",
                      'vit_nd': "vit-pytorch's causal ViTND lets every patch attend to the cls token (which has read "
                                "later slices), ours does not: the same weights and attention sizes, another mask",
                      'simple_vit_attn_residual': "vit-pytorch mixes the depth outputs by a multi-head cross-attention "
                                                  "with projections, ours by the paper's pseudo-query softmax",
                      'jumbo_vit': "vit-pytorch's JumboViT shares the norm before the jumbo MLP across layers and "
                                   "classifies the mean of the jumbo pieces, ours (the paper's) a norm per layer and "
                                   "the whole jumbo token beside the patch mean",
                      'simple_uvit': "vit-pytorch's long skips carry the shallow blocks' inputs, ours (the paper's) "
                                     "their outputs"}


# references whose training step raises on a CPU unless ATEN_CPU_CAPABILITY=default: vit-pytorch's ViTND takes flex
# attention wherever its compiled kernel runs (AVX2 and up), and flex attention has no CPU backward
FLEX_ATTENTION = ('vit_nd', 'vit_nd_rotary', 'vit_nd_pope')
# registry models with no reference in REFERENCES, and why (the table's reference column says so)
NO_REFERENCE = {
    'small_dataset_vit': "vit-pytorch's shifted patch tokenization shifts by one pixel, the paper's (ours) by half a "
                         "patch diagonally: another function, its weights refused",
    'simple_vit_with_qk_norm': "vit-pytorch's qk-norm SimpleViT is another function (RMS qk-norm with per-head "
                               "gains and no scale, a LayerNorm for a head): its weights refused",
    'max_vit_with_registers': "vit-pytorch's MaxViT with registers is another function than the official MaxViT "
                              "(stem, MBConv, attention): its weights refused",
    'levjepa': "vit-pytorch has no classifier on levjepa's VideoTransformer, and its VideoTransformer stops on a CPU: "
               "its torch.compile'd mask function fails flex attention's create_block_mask (and flex attention has "
               "no CPU backward)",
    'levjepa_nd': "vit-pytorch has no classifier on levjepa_nd's NDTransformer, whose tokens ours gives "
                  "(tests/test_levjepa_nd.py: its fixture); a bare encoder is another workload than a classifier",
}


def reference_workload(workload):
    """The reference implementation of a registry workload's preset, as a workload named '<name>:ref'; None
    where there is none (or its library is not importable, or the workload is tiny)."""
    name = workload['name']
    model_name = VARIANTS[name]['model'] if name in VARIANTS else name
    if model_name not in REFERENCES or workload['preset'] == 'tiny':
        return None
    label, build = REFERENCES[model_name]
    reference = build(workload['model'])
    if reference is None:
        return None
    img = torch.randn(2, workload['channels'], *input_dims(workload['image_size']))
    if model_name not in DIFFERENT_FUNCTION:
        with torch.no_grad():
            expected = reference.eval()(img)
            if model_name == 'vit_with_decorr':             # vit-pytorch's returns (logits, loss) always
                expected = expected[0]
            torch.testing.assert_close(workload['model'].eval()(img), expected, atol=1e-4, rtol=0)
    # a variant's reference trains as the preset's row trains it (its loss, nothing after the optimizer's step)
    step = {} if name not in VARIANTS else dict(
        loss=workload_loss(model_name, workload['channels'], workload['num_classes']), after_step=None)
    return dict(workload, name=f'{name}:ref', preset=label, model=reference,
                params=sum(p.numel() for p in reference.parameters()), **step)


def try_reference(workload, tiny):
    """(reference workload, None), or (None, why there is none) for the table: no reference exists, it is not
    installed, it is not run at --tiny, or it failed to build or to agree with ours (a failure is stated, and the
    other models are still measured)."""
    name = VARIANTS[workload['name']]['model'] if workload['name'] in VARIANTS else workload['name']
    if name not in REFERENCES:
        return None, f'none: {NO_REFERENCE.get(name, "no reference in REFERENCES yet")}'
    if tiny:
        return None, 'not run: references run at the preset, not --tiny'
    if name in FLEX_ATTENTION and DEVICE.type == 'cpu' and os.environ.get('ATEN_CPU_CAPABILITY') != 'default':
        return None, ("not run: vit-pytorch's ViTND attends by flex attention, which has no CPU backward; "
                      "run with ATEN_CPU_CAPABILITY=default (its dense fallback) and merge")
    try:
        reference = reference_workload(workload)
    except ImportError as error:
        return None, f'not installed: {error}'
    except Exception as error:
        return None, f'failed: {type(error).__name__}: {str(error)[:300]}'
    if reference is None:
        label = REFERENCES[name][0]
        needs = ('timm' if label.startswith('timm') else
                 '$VIT_PYTORCH_SOURCE (vit-pytorch 1.26.14\'s wheel)' if label.startswith('vit-pytorch') else
                 '$VIT_PYTORCH_OFFICIAL (the official checkouts)' if label.startswith('official') else label)
        return None, f'not installed: {label} needs {needs} (unset, or its module did not import)'
    return reference, None


def workload_loss(name, channels, num_classes):
    """The training loss of the registered model `name`'s row."""
    return (DistillationLoss(channels, num_classes) if name == 'distillable_vit' else
            AuxiliaryLoss(registry.AUX_LOSSES[name][0]) if name in registry.AUX_LOSSES else classification_loss)


def registry_workload(name, tiny=False):
    """The model registered as `name` at its `REGISTRY` preset (or tiny), with its input, loss and what its training
    step does after the optimizer's (`after_step`; its reference implementation: `reference_workload`). A name of
    VARIANTS is its registered model at the preset with the variant's options, loss and step."""
    variant = VARIANTS.get(name)
    if variant is not None:
        workload = registered_workload(variant['model'], tiny, **variant['options'])
        return dict(workload, name=name, preset='tiny' if tiny else variant['preset'], loss=variant['loss'],
                    after_step=variant['after_step'])
    return registered_workload(name, tiny)


def registered_workload(name, tiny=False, **options):
    """`registry_workload` of a registered model, `options` added to its keyword arguments."""
    if tiny:
        from vit_pytorch.train import model_config

        preset, channels, num_classes = 'tiny', TINY['channels'], TINY['num_classes']
        kwargs = dict(model_config(name, {}, **TINY), **options)
        image_size = TINY['image_size']
        if registry.INPUTS.get(name, '').startswith('signals'):
            image_size = (image_size,)
        elif 'input_shape' in kwargs:        # an N-D model (vit_nd) takes no image size: its own input shape
            image_size = tuple(kwargs['input_shape'])
        elif registry.INPUTS.get(name, '').startswith('clips'):
            frames = next(kwargs[key] for key in ('frames', 'num_frames', 'max_frames') if key in kwargs)
            image_size = (frames, image_size, image_size)
        model = registry.build_model(name, **kwargs)
    else:
        preset, constructor, kwargs, image_size, channels, num_classes = REGISTRY[name]
        kwargs = dict(kwargs, **options)
        if constructor is None:
            model = registry.build_model(name, **kwargs)
        else:
            module = importlib.import_module(registry.MODELS[name].split(':')[0])
            model = getattr(module, constructor)(**kwargs)
    return dict(name=name, preset=preset, model=model, image_size=image_size, channels=channels,
                num_classes=num_classes, loss=workload_loss(name, channels, num_classes), after_step=None,
                params=sum(p.numel() for p in model.parameters()))


# measuring


# `--tiny` runs (the tests' smoke runs: a sample of the registry by default, all of it under -m slow) take the peak
# on 256-wide products: the 2048-wide ones cost about 0.5 s a call, two calls a pair, three quarters of a tiny pair's
# time
TINY_PEAK_SIZE = 256


def matmul_peak(size=2048, repeats=3):
    """Best matmul FLOP/s of a few (size x size) @ (size x size) products on DEVICE, in fp32 (bf16 under
    `--bf16`, 8192 wide on CUDA)."""
    size = 8192 if DEVICE.type == 'cuda' else size
    dtype = AUTOCAST or torch.float32
    a, b = torch.randn(size, size, device=DEVICE, dtype=dtype), torch.randn(size, size, device=DEVICE, dtype=dtype)
    torch.mm(a, b)
    best = float('inf')
    for _ in range(repeats):
        synchronize()
        start = CLOCK()
        torch.mm(a, b)
        synchronize()
        best = min(best, CLOCK() - start)
    return 2 * size ** 3 / best


# wall-clock by default; `--clock cpu` (this process's CPU time) with `--threads 1` keeps the
# comparison steady on a machine shared with other jobs
CLOCK = time.perf_counter
# `--device cuda`: models, inputs and steps on the GPU; `--bf16`: every step under bf16 autocast (the weights in
# fp32); `--compile`: every model through torch.compile (each Runner compiles its own)
DEVICE = torch.device('cpu')
AUTOCAST = None
COMPILE = False


def synchronize():
    if DEVICE.type == 'cuda':
        torch.cuda.synchronize(DEVICE)


def autocast():
    return torch.autocast(DEVICE.type, dtype=AUTOCAST, enabled=AUTOCAST is not None)


def set_device(device, bf16, compile_):
    global DEVICE, AUTOCAST, COMPILE
    DEVICE, AUTOCAST, COMPILE = torch.device(device), torch.bfloat16 if bf16 else None, compile_


class Runner:
    """One model's inference and training step on fixed inputs; `after_step(model)` runs after the optimizer's step
    of each training step (the paper's decorrelation matrices' step, as the training loop takes it)."""

    def __init__(self, model, image_size, batches, train_batch, *, channels=3, num_classes=NUM_CLASSES,
                 loss=classification_loss, after_step=None):
        model.to(DEVICE)
        self.model, self.loss = torch.compile(model) if COMPILE else model, loss
        self.after_step = None if after_step is None else (lambda: after_step(model))
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=DEVICE.type == 'cuda')
        generator = torch.Generator().manual_seed(1)
        self.images = {b: torch.randn(b, channels, *input_dims(image_size), generator=generator).to(DEVICE)
                       for b in sorted(set(batches) | {train_batch})}
        self.labels = torch.randint(0, num_classes, (train_batch,), generator=generator).to(DEVICE)

    def infer(self, batch):
        self.model.eval()
        with torch.inference_mode(), autocast():
            self.model(self.images[batch])

    def train(self, batch):
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = self.loss(self.model, self.images[batch], self.labels)
        loss.backward()
        self.optimizer.step()
        if self.after_step is not None:
            self.after_step()

    def run(self, task, iterations):
        kind, batch = task
        step = self.infer if kind == 'infer' else self.train
        synchronize()
        start = CLOCK()
        for _ in range(iterations):
            step(batch)
        synchronize()
        return batch * iterations / (CLOCK() - start)


def summary(values):
    return dict(median=statistics.median(values), min=min(values), max=max(values), rounds=list(values))


def interleaved(runners, tasks, rounds, seconds, peaks=None, log=print, same_steps=True, measure_peak=None):
    """images/s per task and model over `rounds` rounds; each model runs once per task per round.

    `same_steps=False` sizes each model's timed loop by its own speed (models of unlike cost,
    compared with none): the iterations are then {task: {model: steps}}.
    """
    iterations, expected = {}, 0.
    for task in tasks:
        # one untimed step per model (allocations, kernel selection), which also sizes the timed
        # loop: the same number of steps for every model, from the slowest
        durations = {name: task[1] / runner.run(task, 1) for name, runner in runners.items()}
        if same_steps:
            iterations[task] = max(1, round(seconds / max(durations.values())))
        else:
            iterations[task] = {name: max(1, round(seconds / d)) for name, d in durations.items()}
        expected += rounds * sum(d * (iterations[task] if same_steps else iterations[task][name])
                                 for name, d in durations.items())
    log(f'  one step of each done; {rounds} rounds to go, about {expected / 60:.1f} min (by this clock)')
    steps = lambda task, name: iterations[task] if same_steps else iterations[task][name]
    speeds = {task: {name: [] for name in runners} for task in tasks}
    names = list(runners)
    for r in range(rounds):
        if peaks is not None:
            peaks.append((measure_peak or matmul_peak)())
        order = names[r % len(names):] + names[:r % len(names)]
        for task in tasks:
            for name in order:
                speeds[task][name].append(runners[name].run(task, steps(task, name)))
        log(f'  round {r + 1}/{rounds} done')
    return speeds, iterations


def paired(speeds, name, baseline):
    return summary([a / b for a, b in zip(speeds[name], speeds[baseline])])


# memory, in a fresh process per measurement


def rss_mib(field):
    with open('/proc/self/status') as status:
        for line in status:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f'{field} not in /proc/self/status')


def memory_child(spec):
    """Peak RSS increase (MiB) over two training steps, from a state with model, optimizer and batch built (on
    CUDA: the peak of allocated device memory over those steps, less what was allocated before)."""
    torch.set_num_threads(spec['threads'])
    set_device(spec.get('device', 'cpu'), spec.get('bf16', False), spec.get('compile', False))
    torch.manual_seed(0)
    channels, num_classes, loss, after_step = 3, NUM_CLASSES, classification_loss, None
    if 'registry' in spec:
        # the reference is built (and run on two images beside ours) in both children, so that our model's
        # and the reference's training steps start from the same allocator state: measured after a warm-up
        # in one child only, the reference showed ~40 MiB (~20%) less than ours for PiT-Ti and LeViT-128S
        workload = registry_workload(spec['registry'], spec['tiny'])
        if spec.get('reference', False):
            workload = reference_workload(workload)
        else:
            try_reference(workload, spec['tiny'])   # a reference that fails was left out of the rounds too
        model, spec['image_size'] = workload['model'], workload['image_size']
        channels, num_classes, loss = workload['channels'], workload['num_classes'], workload['loss']
        after_step = workload['after_step']
    elif spec['model'] in ('vit', 'simple_vit'):
        model = build_ours(spec['model'], spec['config'], spec['image_size'])
    elif spec['model'] == 'deep_vit':
        model = ViT(image_size=spec['image_size'], num_classes=NUM_CLASSES, patch_norm=False, qkv_bias=True,
                    norm_eps=1e-6, **{**CONFIGS[spec['config']], 'depth': spec['depth']})
    else:
        model = build_baseline(spec['model'], spec['config'], spec['image_size'])
    if spec.get('checkpointing'):
        model.set_grad_checkpointing(True)
    model.train().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=DEVICE.type == 'cuda')
    params = sum(p.numel() for p in model.parameters()) * 4 / 2 ** 20
    uncompiled, model = model, torch.compile(model) if COMPILE else model
    img = torch.randn(spec['batch'], channels, *input_dims(spec['image_size'])).to(DEVICE)
    label = torch.randint(0, num_classes, (spec['batch'],)).to(DEVICE)
    if DEVICE.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(DEVICE)
        before = torch.cuda.memory_allocated(DEVICE) / 2 ** 20
    else:
        before = rss_mib('VmRSS')
    times = []
    for _ in range(2):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            step_loss = loss(model, img, label)
        step_loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step(uncompiled)
        synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(DEVICE) / 2 ** 20 if DEVICE.type == 'cuda' else rss_mib('VmHWM')
    return dict(peak_increase_mib=peak - before, params_mib=params, step_s=times[-1])


# glibc's malloc threshold, fixed for the memory child: above it, every buffer is its own mapping, returned to the
# system when freed. Left to glibc, the threshold rises to the size of each mapped buffer freed, so that later
# buffers come from the heap, whose freed pages stay resident: the peak RSS then depends on the order of
# allocations, not on the live bytes (PVT v2 b0 read 504 / 419 MiB = 1.20x against timm's with the same profiled
# peak of live tensor bytes, 351.3 MiB in both; with the threshold fixed, 392 / 391 MiB; docs/performance.md)
MALLOC_MMAP_THRESHOLD = 64 * 1024


def memory_child_env():
    """The environment of every memory child, ours and the reference's alike: this one's, the threshold fixed."""
    return dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MALLOC_MMAP_THRESHOLD))


def run_memory_child(script, spec):
    """The JSON object a fresh process of `script` (a benchmark's file) prints last when run with `--memory-child`
    and `spec` (JSON-serialisable), in `memory_child_env()`; a RuntimeError with its standard error if it fails."""
    spec = json.dumps(spec)
    out = subprocess.run([sys.executable, os.path.abspath(script), '--memory-child', spec], capture_output=True,
                         text=True, check=False, env=memory_child_env())
    if out.returncode:
        raise RuntimeError(f'memory child {spec} failed:\n{out.stderr[-2000:]}')
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_memory(spec):
    return run_memory_child(__file__, spec)


# sections


def bench_config(args, config, image_size, log):
    names = [m for m in args.models if m != 'timm' or timm is not None]
    models = build_all(names, config, image_size)
    # timm and the reference compute exactly what our model of the same family does; count
    # on the reference, whose attention is plain matmuls that the counter sees
    flops = {f: training_flops(build_baseline('simple_reference' if f == 'simple_vit' else 'reference',
                                              config, image_size), image_size)
             for f in {family(name) for name in names}}
    runners = {name: Runner(model, image_size, args.batches, args.train_batch) for name, model in models.items()}
    tasks = [('infer', b) for b in args.batches] + ([('train', args.train_batch)] if args.train_batch else [])
    peaks = []
    log(f'{config} @ {image_size}: {", ".join(names)}; tasks {tasks}')
    speeds, iterations = interleaved(runners, tasks, args.rounds, args.seconds, peaks, log)
    peak = summary(peaks)
    result = dict(config=config, image_size=image_size, tokens=(image_size // 16) ** 2, models=names,
                  iterations={f'{k}@{b}': n for (k, b), n in iterations.items()},
                  matmul_peak_flops=peak, flops_per_image={}, speed={}, ratios={}, mfu={}, memory={})
    fill_speeds(result, tasks, speeds, peaks, {name: flops[family(name)] for name in names})
    for name in names:
        for baseline in BASELINES.get(name, ()):
            if baseline in names:
                result['ratios'][f'{name}/{baseline}'] = {
                    f'{k}@{b}': paired(speeds[(k, b)], name, baseline) for k, b in tasks}
    if args.memory and args.train_batch:
        fill_memory(result, args, log, lambda name: dict(model=name, config=config, image_size=image_size))
    return result


def fill_speeds(result, tasks, speeds, peaks, flops):
    """FLOPs per image, speeds and MFU of every model into `result`; `flops`: name -> (train step, forward)."""
    for name, (train_flops, forward_flops) in flops.items():
        result['flops_per_image'][name] = dict(forward=forward_flops, train_step=train_flops)
        for task in tasks:
            key = f'{task[0]}@{task[1]}'
            result['speed'].setdefault(key, {})[name] = summary(speeds[task][name])
            per_image = forward_flops if task[0] == 'infer' else train_flops
            # MFU pairs each round's speed with the same round's matmul peak
            result['mfu'].setdefault(key, {})[name] = summary(
                [s * per_image / p for s, p in zip(speeds[task][name], peaks)])


def fill_memory(result, args, log, spec_of):
    """Training-step memory of every model into `result`, each run in a fresh process."""
    for name in result['models']:
        spec = dict(spec_of(name), batch=args.train_batch, threads=args.threads, device=args.device,
                    bf16=args.bf16, compile=args.compile)
        runs = [measure_memory(spec)['peak_increase_mib'] for _ in range(args.memory)]
        result['memory'][name] = summary(runs)
        log(f'  memory {name}: {statistics.median(runs):.0f} MiB')


# `expected_seconds`: the fraction of the matmul peak a step runs at (ViT-S/16 at one thread: 75-89%, convolutional
# and small models less), and what a memory child costs besides its two training steps (start, imports, building
# our model and the reference)
EXPECTED_MFU, MEMORY_CHILD_S = 0.6, 7.0


def expected_seconds(flops, args, peak):
    """A rough forecast of a registry run's length: each model's and reference's one untimed step and `rounds`
    timings of each task (each at least one step and about `--seconds`), two training steps in each memory child,
    and counting its FLOPs (a forward and a training step on two inputs). `flops`: name -> (training step, forward)
    FLOPs per image; `peak`: FLOP/s."""
    rate = EXPECTED_MFU * peak
    total = 0.
    for train, forward in flops.values():
        total += 2 * (train + forward) / rate
        steps = [b * forward / rate for b in args.batches] + ([args.train_batch * train / rate] if args.train_batch else [])
        total += sum(d + args.rounds * max(d, args.seconds) for d in steps)
        if args.train_batch:
            total += args.memory * (MEMORY_CHILD_S + 2 * args.train_batch * train / rate)
    return total + args.rounds * 2 * 2048 ** 3 * 4 / peak


def release_memory():
    """Collect what the last pair left (reference cycles among modules) and hand glibc's free heap pages back to the
    system, so that each pair starts from about the resident set the first one started from."""
    gc.collect()
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):       # not glibc
        pass


def peak_increase_mib(run):
    """The peak RSS increase (MiB) over `run()`, in a memory child: what is free released first (`release_memory`),
    then the peak (VmHWM) reset to the current resident set through /proc/self/clear_refs."""
    release_memory()
    with open('/proc/self/clear_refs', 'w') as refs:
        refs.write('5')                                      # VmHWM back to the current VmRSS
    before = rss_mib('VmRSS')
    run()
    return rss_mib('VmHWM') - before


def bench_registry(args, log):
    """Speed, FLOPs, MFU and memory of models registered in `vit_pytorch.models`, each at its preset.

    One model and its reference at a time (`bench_pair`): built, timed in paired interleaved rounds, their memory
    children run, and both (with their optimiser states and gradients) freed before the next pair is built, so that
    a run holds one pair's memory however many models it measures. FLOPs are counted with explicit attention.
    """
    torch.manual_seed(0)
    tasks = [('infer', b) for b in args.batches] + ([('train', args.train_batch)] if args.train_batch else [])
    result = dict(config='registry', image_size=None, tokens=None, models=[], failures={}, presets={},
                  references={}, iterations={}, matmul_peak_flops=None, flops_per_image={}, speed={}, ratios={},
                  mfu={}, memory={}, memory_failures={})
    log(f'registry: {", ".join(args.registry)}; tasks {tasks}; one model and its reference at a time')
    peaks, forecast = [], 0.
    for i, name in enumerate(args.registry):
        forecast += bench_pair(name, args, tasks, result, peaks, log)
        release_memory()
        log(f'{i + 1}/{len(args.registry)} done; forecast so far {forecast / 60:.1f} min; resident now '
            f'{rss_mib("VmRSS"):.0f} MiB, peak {rss_mib("VmHWM"):.0f} MiB')
    result['matmul_peak_flops'] = summary(peaks or [matmul_peak()])
    return result


# references that torch's FLOP counter cannot run, counted as ours: vit-pytorch's nested-tensor NaViTs pack the
# tokens into jagged nested tensors, and under FlopCounterMode their first Linear raises (torch 2.14.1: "Multiple
# dispatch failed for aten.sym_is_contiguous"; no handler for a nested tensor). reference_workload has checked that
# they compute our function on the same sizes, so they take our FLOPs; the count feeds only the forecast and MFU
COUNTED_AS_OURS = ('na_vit_nested_tensor', 'na_vit_nested_tensor_3d')


def counted_as_ours(reference, ours_flops, log):
    """`ours_flops` for a COUNTED_AS_OURS reference, once it has taken a training step (batch 2) outside the
    counter: a reference that cannot train still fails here, as count() would."""
    model = reference['model'].train()
    img = torch.randn(2, reference['channels'], *input_dims(reference['image_size']))
    reference['loss'](model, img, torch.randint(0, reference['num_classes'], (2,))).backward()
    model.zero_grad(set_to_none=True)
    log(f"{reference['name']}: FLOPs counted as ours (the FLOP counter cannot run nested tensors)")
    return ours_flops


def after_step_flops(workload, batch):
    """FLOPs per image of what the workload's training step does after the optimizer's (`after_step`; 0 without
    one), counted after a training forward of `batch` inputs: the decorrelation matrices' rule reads that forward's
    rows, and its cost per image depends on the batch (Z^T Z grows with the b n rows, C R does not)."""
    if workload['after_step'] is None or not batch:
        return 0.
    model = copy.deepcopy(workload['model']).train()
    img = torch.randn(batch, workload['channels'], *input_dims(workload['image_size']))
    labels = torch.randint(0, workload['num_classes'], (batch,))
    with torch.no_grad():
        workload['loss'](model, img, labels)
    with FlopCounterMode(display=False) as counter:
        workload['after_step'](model)
    return counter.get_total_flops() / batch


def bench_pair(name, args, tasks, result, peaks, log):
    """One registered model and its reference (where there is one) into `result`: speeds in paired interleaved
    rounds (each model times as many steps as fill `--seconds` for it), their ratios, then `--memory` fresh-process
    memory runs of each, ours and the reference's alternating. A preset that fails to build, count or time is
    recorded in result['failures'] and the caller goes on with the next model. Everything built here is freed on
    return; returns the forecast seconds of the pair (`expected_seconds`), 0 where it failed to build."""
    after = {}

    def count(w):
        train, forward = training_flops(w['model'], w['image_size'], channels=w['channels'],
                                        num_classes=w['num_classes'], loss=w['loss'])
        after[w['name']] = after_step_flops(w, args.train_batch)
        return train + after[w['name']], forward

    try:
        workload = registry_workload(name, args.tiny)
        flops = {name: count(workload)}
    except Exception as error:
        result['failures'][name] = f'{type(error).__name__}: {error}'
        log(f'{name}: failed to build or count: {result["failures"][name]}')
        return 0.
    # the reference implementation, timed in the same rounds; why there is none goes into the table
    reference, missing = try_reference(workload, args.tiny)
    if reference is not None:
        try:            # a reference that cannot take the training step (or be counted) is stated, not fatal
            flops[reference['name']] = count(reference) if name not in COUNTED_AS_OURS else \
                counted_as_ours(reference, flops[name], log)
        except Exception as error:
            missing = f'failed: its training step: {type(error).__name__}: {str(error)[:300]}'
            log(f'{name}: reference failed in its training step: {missing}')
            reference = None
    if missing:
        result['references'][name] = missing
    workloads = {w['name']: w for w in (workload, reference) if w is not None}
    del workload, reference
    runners = {n: Runner(w['model'], w['image_size'], args.batches, args.train_batch, channels=w['channels'],
                         num_classes=w['num_classes'], loss=w['loss'], after_step=w['after_step'])
               for n, w in workloads.items()}
    measure_peak = (lambda: matmul_peak(TINY_PEAK_SIZE)) if args.tiny else matmul_peak
    pair_peaks = [measure_peak()]
    forecast = expected_seconds(flops, args, pair_peaks[0])
    log(f'{" and ".join(workloads)}: expected {forecast / 60:.1f} min (rough: the MFU differs between models)')
    pair_peaks = []
    try:
        speeds, iterations = interleaved(runners, tasks, args.rounds, args.seconds, pair_peaks, log, same_steps=False,
                                         measure_peak=measure_peak)
    except Exception as error:
        result['failures'][name] = f'its timing: {type(error).__name__}: {str(error)[:300]}'
        log(f'{name}: failed while timed: {result["failures"][name]}')
        return forecast
    peaks += pair_peaks
    result['models'] += list(workloads)
    for n, w in workloads.items():
        result['presets'][n] = {k: w[k] for k in ('preset', 'image_size', 'channels', 'num_classes', 'params')}
    for (k, b), steps in iterations.items():
        result['iterations'].setdefault(f'{k}@{b}', {}).update(steps)
    fill_speeds(result, tasks, speeds, pair_peaks, flops)
    for n, value in after.items():
        if value:
            result['flops_per_image'][n]['after_step'] = value
    if f'{name}:ref' in workloads:
        result['ratios'][f'{name}/{name}:ref'] = {f'{k}@{b}': paired(speeds[(k, b)], name, f'{name}:ref')
                                                  for k, b in tasks}
    names = list(workloads)
    # the models, their optimisers and gradients go before the memory children start (they rebuild both)
    del runners, workloads
    release_memory()
    if args.memory and args.train_batch:
        runs = {n: [] for n in names}
        try:
            for _ in range(args.memory):
                for n in names:         # ours and the reference alternate: run i of each is a pair in time
                    spec = dict(registry=name, tiny=args.tiny, reference=n.endswith(':ref'), batch=args.train_batch,
                                threads=args.threads, device=args.device, bf16=args.bf16, compile=args.compile)
                    runs[n].append(measure_memory(spec)['peak_increase_mib'])
        except RuntimeError as error:
            result['memory_failures'][name] = str(error)[-300:]
            log(f'{name}: a memory run failed: {result["memory_failures"][name]}')
            return forecast
        for n in names:
            result['memory'][n] = summary(runs[n])
            log(f'  memory {n}: {statistics.median(runs[n]):.0f} MiB over {args.memory} run(s)')
    return forecast


def bench_compile(args, log):
    """torch.compile speed-up over eager for our models (inference and a training step)."""
    config, image_size = args.configs[0], args.image_sizes[0]
    results = {}
    for kind in ('vit', 'simple_vit'):
        if kind not in args.models:
            continue
        torch.manual_seed(0)
        eager = build_ours(kind, config, image_size)
        compiled = torch.compile(copy.deepcopy(eager), fullgraph=True)
        runners = {'eager': Runner(eager, image_size, [args.compile_batch], args.compile_batch),
                   'compiled': Runner(compiled, image_size, [args.compile_batch], args.compile_batch)}
        tasks = [('infer', args.compile_batch), ('train', args.compile_batch)]
        start = time.perf_counter()
        for task in tasks:
            runners['compiled'].run(task, 1)
        compile_s = time.perf_counter() - start
        log(f'compile {kind} {config} @ {image_size}: compiled in {compile_s:.0f} s')
        speeds, _ = interleaved(runners, tasks, args.rounds, args.seconds, log=log)
        results[kind] = dict(config=config, image_size=image_size, batch=args.compile_batch, compile_s=compile_s,
                             speed={f'{k}@{b}': {n: summary(speeds[(k, b)][n]) for n in runners} for k, b in tasks},
                             speedup={f'{k}@{b}': paired(speeds[(k, b)], 'compiled', 'eager') for k, b in tasks})
    return results


def bench_checkpointing(args, log):
    """Training-step memory of a deep ViT with and without gradient checkpointing."""
    config, image_size = args.configs[0], args.image_sizes[0]
    base = dict(model='deep_vit', config=config, depth=args.checkpoint_depth, image_size=image_size,
                batch=args.train_batch or 8, threads=args.threads)
    result = dict(config=config, depth=args.checkpoint_depth, image_size=image_size, batch=base['batch'])
    for label, flag in (('off', False), ('on', True)):
        runs = [measure_memory({**base, 'checkpointing': flag}) for _ in range(max(1, args.memory))]
        result[label] = dict(peak_increase_mib=summary([r['peak_increase_mib'] for r in runs]),
                             step_s=summary([r['step_s'] for r in runs]), params_mib=runs[0]['params_mib'])
        log(f'checkpointing {label}: {result[label]["peak_increase_mib"]["median"]:.0f} MiB')
    result['saved_mib'] = result['off']['peak_increase_mib']['median'] - result['on']['peak_increase_mib']['median']
    return result


# report


def spread(s, fmt='{:.1f}'):
    return f'{fmt.format(s["median"])} ({fmt.format(s["min"])}-{fmt.format(s["max"])})'


def table(rows, header):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: '  '.join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return '\n'.join([line(header), line(['-' * w for w in widths])] + [line(r) for r in rows])


def report(results):
    out = []
    m = results['machine']
    out.append(f"{m['cpu']}, {m['threads']} threads, {m['clock']} clock, torch {m['torch']}, timm {m['timm'] or 'not installed'}; "
               f"{'bf16 autocast' if m.get('bf16') else 'fp32'}{', compiled' if m.get('compile') else ''}"
               f"{', on ' + m['gpu'] if m.get('gpu') else ''}; medians over rounds (min-max)")
    for r in results['configs']:
        peak = r['matmul_peak_flops']
        presets = r.get('presets')
        where = ('registry models, each at its preset' if presets else
                 f"{r['config']} @ {r['image_size']} px ({r['tokens']} patches)")
        out.append(f"\n{where}; "
                   f"fp32 matmul peak {spread({k: v / 1e9 for k, v in peak.items() if k != 'rounds'}, '{:.0f}')} GFLOP/s")
        keys = list(r['speed'])
        header = (['model'] + (['preset', 'px', 'Mparams'] if presets else []) + ['GFLOP/img']
                  + [f'{k} img/s' for k in keys] + [f'MFU {keys[-1]}', 'train MiB'])
        rows = []
        for name in r['models']:
            mem = r['memory'].get(name)
            p = presets[name] if presets else None
            rows.append([name] + ([p['preset'], p['image_size'], f"{p['params'] / 1e6:.2f}"] if p else [])
                        + [f"{r['flops_per_image'][name]['forward'] / 1e9:.2f}"]
                        + [spread(r['speed'][k][name]) for k in keys]
                        + [f"{r['mfu'][keys[-1]][name]['median']:.0%}", f"{mem['median']:.0f}" if mem else '-'])
        out.append(table(rows, header))
        for name, error in r.get('failures', {}).items():
            out.append(f'{name} not measured: {error}')
        if r['ratios']:
            rows = []
            for pair, ratios in r['ratios'].items():
                mems = pair.split('/')
                mem = (f"{r['memory'][mems[0]]['median'] / r['memory'][mems[1]]['median']:.2f}"
                       if all(x in r['memory'] for x in mems) else '-')
                rows.append([pair] + [spread(ratios[k], '{:.2f}') for k in keys] + [mem])
            out.append('\npaired speed ratios (same round), and memory ratio:')
            out.append(table(rows, ['ratio'] + keys + ['train MiB']))
    for kind, c in results.get('compile', {}).items():
        out.append(f"\ntorch.compile {kind} {c['config']} @ {c['image_size']}, batch {c['batch']} "
                   f"(compile {c['compile_s']:.0f} s): speed-up "
                   + ', '.join(f"{k} {spread(v, '{:.2f}')}x" for k, v in c['speedup'].items()))
    c = results.get('checkpointing')
    if c:
        out.append(f"\ngradient checkpointing, ViT {c['config']} width, depth {c['depth']}, {c['image_size']} px, "
                   f"batch {c['batch']}: training-step peak {c['off']['peak_increase_mib']['median']:.0f} MiB -> "
                   f"{c['on']['peak_increase_mib']['median']:.0f} MiB (saves {c['saved_mib']:.0f} MiB; step "
                   f"{c['off']['step_s']['median']:.1f} s -> {c['on']['step_s']['median']:.1f} s)")
    return '\n'.join(out)


# the registry table (`--markdown`, `--markdown-from`): one row per registered model, from one run's results or
# from several runs merged (a later run's row replaces an earlier one's), as markdown for the docs and as JSON

# rows below 1.0x whose reason the docs give: name -> link, relative to docs/
BELOW_EXPLAINED = {
    'swin': 'performance.md#benchmarking-the-variants---registry',
    'levit': 'performance.md#benchmarking-the-variants---registry',
    # by design: ours keeps K static slots a sampling layer and masks duplicates; vit-pytorch drops them and pads
    'ats_vit': 'performance.md#long-tail-rows-below-10x-issues-26-27',
    # by design: vit-pytorch's nested tensors leave 9 parameter tensors without gradients; ours trains them
    'na_vit_nested_tensor': 'performance.md#rows-below-10x-re-measured-issue-29',
}


def registry_table(results):
    """{'runs': [command, date, machine, load average of each run], 'tasks': ['infer@1', ...], 'rows': {name: row}}
    of a run's results (the registry section's models), or the merged table a `--markdown-from --json` file holds.
    A row: its run (index into runs), preset, reference (label or None), why there is none, the paired ratios
    ours / reference per task, speeds, memory of both and their ratio, and the failure where ours was not measured."""
    if 'registry_table' in results:
        return results['registry_table']
    run = {key: results.get(key) for key in ('command', 'date', 'machine', 'load_average', 'memory_runs', 'note')}
    rows, tasks = {}, []
    for r in results['configs']:
        if r['config'] != 'registry':
            continue
        tasks += [task for task in r['speed'] if task not in tasks]
        for name in [n for n in r['models'] if not n.endswith(':ref')] + list(r['failures']):
            ref = f'{name}:ref'
            measured = ref in r['models']
            memory = {who: r['memory'][key] for who, key in (('ours', name), ('reference', ref)) if key in r['memory']}
            ratio = None
            if len(memory) == 2:
                ratio = summary([a / b for a, b in zip(memory['ours']['rounds'], memory['reference']['rounds'])])
            rows[name] = dict(
                run=0, preset=r['presets'][name]['preset'] if name in r['presets'] else None,
                params=r['presets'][name]['params'] if name in r['presets'] else None,
                reference=r['presets'][ref]['preset'] if measured else None,
                reference_missing=None if measured else r.get('references', {}).get(name, 'not recorded by this run'),
                ratios={task: s for task, s in r['ratios'].get(f'{name}/{ref}', {}).items()},
                speed={task: {who: r['speed'][task][key] for who, key in (('ours', name), ('reference', ref))
                              if key in r['speed'][task]} for task in r['speed']},
                memory=memory, memory_ratio=ratio, failure=r['failures'].get(name),
                flops={who: r['flops_per_image'][key] for who, key in (('ours', name), ('reference', ref))
                       if key in r.get('flops_per_image', {})})
    return dict(runs=[run], tasks=tasks, rows=rows)


def merge_tables(tables):
    """One table of several, in order: a model's row comes from the last table that has it; runs that no row
    comes from any more are dropped."""
    runs, rows, tasks = [], {}, []
    for table in tables:
        offset = len(runs)
        runs += table['runs']
        tasks += [task for task in table['tasks'] if task not in tasks]
        rows.update({name: dict(row, run=row['run'] + offset) for name, row in table['rows'].items()})
    used = sorted({row['run'] for row in rows.values()})
    index = {old: new for new, old in enumerate(used)}
    return dict(runs=[runs[i] for i in used], tasks=tasks,
                rows={name: dict(row, run=index[row['run']]) for name, row in rows.items()})


def printed(value):
    """A ratio as the table prints it (two decimals): the verdict reads what the reader reads, so that a memory
    ratio of 1066 / 1062 MiB = 1.004, printed 1.00, is not a miss."""
    return float(f'{value:.2f}')


def verdict(name, row):
    """From the printed ratios and their spreads (min-max over rounds, over memory runs): '>= 1.0' (every speed
    ratio at least 1.00 and memory at most 1.00), 'parity (spread includes 1.0)' (each one that misses has 1.00
    within its spread), or 'below (...)' naming the ratios whose whole spread misses (a speed ratio whose max is
    below 1.00, a memory ratio whose min is above 1.00), with the docs' explanation where BELOW_EXPLAINED has one."""
    if row['failure']:
        return 'not measured'
    if not row['ratios']:
        return '-'
    misses = [(f'{task} {s["median"]:.2f}', printed(s['max']) >= 1.0) for task, s in row['ratios'].items()
              if printed(s['median']) < 1.0]
    memory = row['memory_ratio']
    if memory and printed(memory['median']) > 1.0:
        misses.append((f'memory {memory["median"]:.2f}', printed(memory['min']) <= 1.0))
    if not misses:
        return '>= 1.0'
    if all(within for _, within in misses):
        return 'parity (spread includes 1.0)'
    below = ', '.join(label for label, within in misses if not within)
    link = BELOW_EXPLAINED.get(name)
    return f'below ({below}): see [{link}]({link})' if link else f'below ({below}): not explained yet'


def describe_run(number, run):
    m, load = run['machine'] or {}, run.get('load_average') or {}
    loads = ' -> '.join(f'{load[k][0]:.2f}' for k in ('start', 'end') if k in load) or 'not recorded'
    return (f"- run {number}: `{run['command']}` on {run['date']}; {m.get('cpu')}, {m.get('threads')} threads, "
            f"{m.get('clock')} clock, torch {m.get('torch')}, timm {m.get('timm') or 'not installed'}, "
            f"CPU capability {m.get('cpu_capability', 'not recorded')}"
            f"{', bf16 autocast' if m.get('bf16') else ''}{', compiled' if m.get('compile') else ''}"
            f"{', on ' + m['gpu'] if m.get('gpu') else ''}; load average (1 min) {loads}"
            + (f"; {run['memory_runs']} memory run(s) of each model" if run.get('memory_runs') is not None else '')
            + (f"; {run['note']}" if run.get('note') else ''))


def variant_reference(name, row):
    """A variant row's reference cell: the reference, what it does instead (different work) and the FLOPs per image
    of both steps (`vit_pytorch.flops` with explicit attention; a training step with what follows the optimizer's
    step, counted at the training batch), so that the ratios can be read against the extra work."""
    cell = f"{row['reference']}: {VARIANTS[name]['reference']}"
    flops = row.get('flops') or {}
    if len(flops) == 2:
        ours, theirs = flops['ours'], flops['reference']
        after = (f" (of which {ours['after_step'] / 1e9:.1f} after the optimizer's step)"
                 if ours.get('after_step') else '')
        cell += (f"; GFLOP per image, ours against the reference's: a training step {ours['train_step'] / 1e9:.1f}"
                 f"{after} against {theirs['train_step'] / 1e9:.1f} = {ours['train_step'] / theirs['train_step']:.2f}x, "
                 f"a forward {ours['forward'] / 1e9:.1f} against {theirs['forward'] / 1e9:.1f} = "
                 f"{ours['forward'] / theirs['forward']:.2f}x")
    return cell


def markdown_table(table):
    """The docs' table: a row for every registered model, each followed by its variant rows (and any other row in
    the table), in registry order. A variant row (VARIANTS) is another method than its reference's: its ratios are
    of different work, and it has no verdict."""
    names = table_names()
    names += [name for name in table['rows'] if name not in names]
    tasks = table['tasks']
    header = ['model', 'preset', 'reference'] + tasks + ['train MiB, ours / reference', 'verdict', 'run']
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    counts = {}
    for name in names:
        row = table['rows'].get(name)
        if row is None:
            cells, kind = ['-', 'not measured in these runs'] + ['-'] * len(tasks) + ['-', 'not measured', '-'], 'absent'
        else:
            reference = row['reference'] or row['reference_missing']
            if row['reference'] and name in DIFFERENT_FUNCTION:
                reference += ' (computes another function at the same sizes: see DIFFERENT_FUNCTION)'
            if row['reference'] and name in VARIANTS:
                reference = variant_reference(name, row)
            ratios = [spread(row['ratios'][t], '{:.2f}') if t in row['ratios'] else '-' for t in tasks]
            memory = row['memory']
            mib = ' / '.join(f"{memory[w]['median']:.0f}" for w in ('ours', 'reference') if w in memory) or '-'
            if row['memory_ratio']:
                ratio = row['memory_ratio']
                mib += f" = {ratio['median']:.2f}" + (f" ({ratio['min']:.2f}-{ratio['max']:.2f})"
                                                        if len(ratio['rounds']) > 1 else '')
            kind = verdict(name, row)
            if name in VARIANTS and kind not in ('-', 'not measured'):
                kind = 'different work (no verdict)'
            cells = ([row['preset'] or '-', reference] + ratios + [mib, kind if not row['failure'] else
                                                                   f"not measured: {row['failure']}", str(row['run'] + 1)])
        if name not in VARIANTS:
            counts[kind.split(' ')[0]] = counts.get(kind.split(' ')[0], 0) + 1
        if name not in registry.MODELS and name not in VARIANTS:
            name += ' (not registered now)'
        lines.append('| ' + ' | '.join([f'`{name}`'] + [str(c).replace('|', '/') for c in cells]) + ' |')
    variants = [name for name in names if name in VARIANTS]
    summary_line = (f"{len(names) - len(variants)} models: {counts.get('>=', 0)} at or above 1.0x, "
                    f"{counts.get('parity', 0)} at parity (spread includes 1.0), {counts.get('below', 0)} below, "
                    f"{counts.get('-', 0)} without a reference measured, "
                    f"{counts.get('not', 0) + counts.get('absent', 0)} not measured"
                    + (f"; and {len(variants)} variant row(s), another method than its reference's (different work, "
                       f"no verdict): {', '.join(f'`{name}`' for name in variants)}." if variants else '.'))
    intro = ['Paired speed ratios ours / reference (each round times both; median (min-max) over rounds; above 1: '
             'ours is faster) and the training-step memory (peak RSS increase over two steps, a fresh process each; '
             'below 1: ours takes less). Made by:', '']
    intro += [describe_run(i + 1, run) for i, run in enumerate(table['runs'])]
    return '\n'.join(intro + ['', summary_line, ''] + lines) + '\n'


def write_table(table, markdown_path, json_path):
    """The table as markdown (to `markdown_path`, or stdout) and, with `json_path`, as a JSON file that
    `--markdown-from` reads and merges again."""
    text = markdown_table(table)
    if markdown_path:
        with open(markdown_path, 'w') as f:
            f.write(text)
    else:
        print(text)
    if json_path:
        with open(json_path, 'w') as f:
            json.dump(dict(registry_table=table), f, indent=1)


def machine(threads, clock, device='cpu'):
    cpu = platform.processor() or platform.machine()
    try:
        out = subprocess.run(['lscpu'], capture_output=True, text=True, check=True).stdout
        fields = dict(line.split(':', 1) for line in out.splitlines() if ':' in line)
        cpu = f"{fields['Model name'].strip()}, {fields['CPU(s)'].strip()} cores"
    except (OSError, subprocess.CalledProcessError, KeyError):
        pass
    gpu = torch.cuda.get_device_name(device) if torch.device(device).type == 'cuda' else None
    return dict(cpu=cpu, gpu=gpu, threads=threads, clock=clock, torch=torch.__version__,
                cpu_capability=torch.backends.cpu.get_cpu_capability(),
                timm=timm.__version__ if timm else None, python=platform.python_version())


# `--budget`: the settings of the docs' registry table (paired rounds at one thread on CPU time, each timing at
# least one step, three fresh-process memory runs of each model and reference, alternating, for a spread)
BUDGET_ARGS = ['--registry', 'all', '--batches', '1,8', '--train-batch', '8', '--rounds', '3', '--seconds', '0.25',
               '--memory', '3', '--threads', '1', '--clock', 'cpu']


def shard(names, spec, parser):
    """The K-th of N interleaved slices of `names` (`spec`: 'K/N', 1 <= K <= N)."""
    try:
        k, n = (int(x) for x in spec.split('/'))
    except ValueError:
        parser.error(f'--shard: expected K/N (e.g. 1/2), got {spec!r}')
    if not 1 <= k <= n:
        parser.error(f'--shard: expected 1 <= K <= N, got {spec!r}')
    return names[k - 1::n]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(',') if x]
    names = lambda s: [x for x in s.split(',') if x]
    parser.add_argument('--configs', type=names, default=['S/16'], help=f'comma-separated, of {list(CONFIGS)}')
    parser.add_argument('--image-sizes', type=ints, default=[224], help='comma-separated, e.g. 224,384')
    parser.add_argument('--models', type=names, default=list(MODELS), help=f'comma-separated, of {MODELS}')
    parser.add_argument('--batches', type=ints, default=[1, 8, 32], help='inference batch sizes')
    parser.add_argument('--train-batch', type=int, default=8, help='training-step batch size (0: no training)')
    parser.add_argument('--rounds', type=int, default=5, help='interleaved rounds')
    parser.add_argument('--seconds', type=float, default=0.5, help='target length of one timing')
    parser.add_argument('--memory', type=int, default=3,
                        help='fresh-process memory runs per model (0: none); the memory ratio\'s spread is over them')
    parser.add_argument('--sections', type=names, default=None,
                        help='comma-separated, of throughput (speed, MFU, memory per model), compile '
                             '(torch.compile speed-up over eager), checkpointing (memory saved in a deep ViT); '
                             'default throughput, or none when --registry is given')
    variants = ', '.join(f'{name} ({variant["preset"]})' for name, variant in VARIANTS.items())
    parser.add_argument('--registry', type=names, default=[],
                        help=f'comma-separated models of vit_pytorch.models or variant rows, or all (every row), '
                             f'each at its preset: {", ".join(f"{n} ({v[0]})" for n, v in REGISTRY.items())}; '
                             f'variant rows: {variants}')
    parser.add_argument('--shard', metavar='K/N',
                        help='measure the K-th of N interleaved slices of the --registry list (every N-th model '
                             'from the K-th): N processes of --threads 1 --clock cpu run side by side on N cores, '
                             'and --markdown-from merges their JSON files')
    parser.add_argument('--budget', action='store_true',
                        help='the registry table\'s settings (' + ' '.join(BUDGET_ARGS) + '), any of them '
                             'overridden by giving it; prints each pair\'s expected time once it is counted')
    parser.add_argument('--note', help='a line about the machine for the table\'s header (e.g. what else runs on '
                                       'it), kept with the run')
    parser.add_argument('--tiny', action='store_true',
                        help=f'registry models at the training command\'s small size on {TINY["image_size"]}-pixel '
                             f'images with {TINY["channels"]} channel (a few ms a step; for tests)')
    parser.add_argument('--compile-batch', type=int, default=8)
    parser.add_argument('--checkpoint-depth', type=int, default=24, help='depth of the ViT for the checkpointing section')
    parser.add_argument('--threads', type=int, default=torch.get_num_threads())
    parser.add_argument('--clock', choices=('wall', 'cpu'), default='wall',
                        help='time steps by the wall clock, or by this process\'s CPU time (on a busy '
                             'machine, with --threads 1)')
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu',
                        help='where models and inputs live (cuda: synchronised around every timing; memory is '
                             'the peak of allocated device memory)')
    parser.add_argument('--bf16', action='store_true', help='every step under bf16 autocast (weights in fp32)')
    parser.add_argument('--compile', action='store_true', help='every model through torch.compile')
    parser.add_argument('--json', help='write the results to this JSON file (with --markdown-from: the merged table)')
    parser.add_argument('--markdown', help='write the registry table (a row per registered model: ratios to its '
                                           'reference, memory, verdict) to this markdown file')
    parser.add_argument('--markdown-from', nargs='+', metavar='JSON',
                        help='measure nothing: the registry table of these --json files (runs, or tables written '
                             'by --markdown-from --json), merged in order, a later file\'s row replacing an '
                             'earlier one\'s; to --markdown (or stdout) and --json')
    parser.add_argument('--memory-child', help=argparse.SUPPRESS)
    if '--budget' in (sys.argv[1:] if argv is None else argv):
        # the budget's settings come first, so that any given on the command line replace them
        args = parser.parse_args(BUDGET_ARGS + list(sys.argv[1:] if argv is None else argv))
    else:
        args = parser.parse_args(argv)
    if args.device == 'cuda' and args.clock == 'cpu':
        parser.error('--clock cpu times this process on the CPU, not the GPU: use the wall clock with --device cuda')
    if args.device == 'cuda' and not torch.cuda.is_available():
        parser.error('--device cuda: torch sees no CUDA device here')
    if args.sections is None:
        args.sections = [] if args.registry else ['throughput']
    if args.registry == ['all']:
        args.registry = table_names()
    if args.shard:
        args.registry = shard(args.registry, args.shard, parser)
    for name in args.registry:
        if name not in registry.MODELS and name not in VARIANTS:
            parser.error(f'unknown registry model {name!r}; choose from {list(registry.MODELS)}, a variant row of '
                         f'{list(VARIANTS)}, or all')
        if VARIANTS.get(name, dict(model=name))['model'] not in REGISTRY and not args.tiny:
            parser.error(f'registry model {name!r} has no preset in REGISTRY yet; add one (or use --tiny)')
    for name in args.configs:
        if name not in CONFIGS:
            parser.error(f'unknown config {name!r}; choose from {list(CONFIGS)}')
    for name in args.sections:
        if name not in SECTIONS:
            parser.error(f'unknown section {name!r}; choose from {SECTIONS}')
    for name in args.models:
        if name not in MODELS:
            parser.error(f'unknown model {name!r}; choose from {MODELS}')
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(json.loads(args.memory_child))))
        return
    if args.markdown_from:
        tables = []
        for path in args.markdown_from:
            with open(path) as f:
                tables.append(registry_table(json.load(f)))
        write_table(merge_tables(tables), args.markdown, args.json)
        return 0
    torch.set_num_threads(args.threads)
    set_device(args.device, args.bf16, args.compile)
    global CLOCK
    CLOCK = time.process_time if args.clock == 'cpu' else time.perf_counter
    log = lambda msg: print(msg, file=sys.stderr, flush=True)
    results = dict(machine=dict(machine(args.threads, args.clock, args.device), bf16=args.bf16, compile=args.compile), command=shlex.join(['python', 'benchmarks/throughput.py'] + sys.argv[1:]),
                   date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'), configs=[],
                   load_average=dict(start=os.getloadavg()), memory_runs=args.memory, note=args.note)
    if 'throughput' in args.sections:
        for config in args.configs:
            for image_size in args.image_sizes:
                results['configs'].append(bench_config(args, config, image_size, log))
    if args.registry:
        results['configs'].append(bench_registry(args, log))
    if 'compile' in args.sections:
        results['compile'] = bench_compile(args, log)
    if 'checkpointing' in args.sections:
        results['checkpointing'] = bench_checkpointing(args, log)
    results['load_average']['end'] = os.getloadavg()
    print(report(results))
    if args.markdown:
        write_table(registry_table(results), args.markdown, None)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=1)
    return 1 if any(r.get('failures') for r in results['configs']) else 0


if __name__ == '__main__':
    sys.exit(main())
