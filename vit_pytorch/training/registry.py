"""Every model of the package by name, for the trainer and for checkpoints.

`build_model('vit', image_size=32, patch_size=4, num_classes=10, dim=64, depth=4, heads=4,
mlp_dim=128)` builds `vit_pytorch.vit.ViT`; a named configuration of the ViT paper such as
'S/16' or 'B/16' goes through `vit_pytorch.pretrained.vit`. Modules are imported only when
their model is built, so a name costs nothing until it is used. A checkpoint stores the name
and the keyword arguments, which is all it takes to build the model again.

    from vit_pytorch.models import build_model

    model = build_model('simple_vit', image_size=32, patch_size=4, num_classes=10,
                        dim=64, depth=2, heads=4, mlp_dim=128)
"""

import importlib
import inspect
import re

# name -> "module:Class"; the module is imported on first use
MODELS = {
    'vit': 'vit_pytorch.vit:ViT',
    'simple_vit': 'vit_pytorch.simple_vit:SimpleViT',
    'cait': 'vit_pytorch.cait:CaiT',
    'deepvit': 'vit_pytorch.deepvit:DeepViT',
    't2t': 'vit_pytorch.t2t:T2TViT',
    'cct': 'vit_pytorch.cct:CCT',
    'cross_vit': 'vit_pytorch.cross_vit:CrossViT',
    'xcit': 'vit_pytorch.xcit:XCiT',
    'small_dataset_vit': 'vit_pytorch.vit_for_small_dataset:ViT',
    'parallel_vit': 'vit_pytorch.parallel_vit:ViT',
    'learnable_memory_vit': 'vit_pytorch.learnable_memory_vit:ViT',
    'distillable_vit': 'vit_pytorch.deit:DeiT',
    'simple_vit_with_register_tokens': 'vit_pytorch.simple_vit_with_register_tokens:SimpleViT',
    'simple_vit_with_qk_norm': 'vit_pytorch.simple_vit_with_qk_norm:SimpleViT',
    'simple_vit_with_patch_dropout': 'vit_pytorch.simple_vit_with_patch_dropout:SimpleViT',
    'swin': 'vit_pytorch.swin:SwinTransformer',
    'swinv2': 'vit_pytorch.swin:SwinTransformerV2',
    'max_vit': 'vit_pytorch.max_vit:MaxViT',
    'pit': 'vit_pytorch.pit:PiT',
    'levit': 'vit_pytorch.levit:LeViT',
    'cvt': 'vit_pytorch.cvt:CvT',
    'pvt_v2': 'vit_pytorch.pvt_v2:PyramidVisionTransformerV2',
    'twins_svt': 'vit_pytorch.twins_svt:TwinsSVT',
    'nest': 'vit_pytorch.nest:NesT',
    'crossformer': 'vit_pytorch.crossformer:CrossFormer',
    'sep_vit': 'vit_pytorch.sep_vit:SepViT',
    'scalable_vit': 'vit_pytorch.scalable_vit:ScalableViT',
    'regionvit': 'vit_pytorch.regionvit:RegionViT',
    'mobile_vit': 'vit_pytorch.mobile_vit:RegisteredMobileViT',
    'na_vit': 'vit_pytorch.na_vit:NaViT',
    'vit_1d': 'vit_pytorch.vit_1d:ViT',
    'simple_vit_1d': 'vit_pytorch.simple_vit_1d:SimpleViT',
    'vit_3d': 'vit_pytorch.vit_3d:ViT',
    'simple_vit_3d': 'vit_pytorch.simple_vit_3d:SimpleViT',
    'vivit': 'vit_pytorch.vivit:ViViT',
    'cct_3d': 'vit_pytorch.cct_3d:CCT',
    # vit-pytorch's infrastructure modules, at its import paths
    'vit_with_patch_dropout': 'vit_pytorch.vit_with_patch_dropout:ViT',
    'simple_flash_attn_vit': 'vit_pytorch.simple_flash_attn_vit:SimpleViT',
    'simple_flash_attn_vit_3d': 'vit_pytorch.simple_flash_attn_vit_3d:SimpleViT',
    'na_vit_nested_tensor': 'vit_pytorch.na_vit_nested_tensor:NaViT',
    'na_vit_nested_tensor_3d': 'vit_pytorch.na_vit_nested_tensor_3d:NaViT',
    'max_vit_with_registers': 'vit_pytorch.max_vit_with_registers:MaxViT',
    # research long tail: fewer and better tokens (issue 26)
    'vit_detpool': 'vit_pytorch.vit_detpool:ViTDetPool',
    'simple_vit_with_specialized_cls': 'vit_pytorch.simple_vit_with_specialized_cls:SimpleViT',
    'simple_vit_with_fft': 'vit_pytorch.simple_vit_with_fft:SimpleViT',
    'look_vit': 'vit_pytorch.look_vit:LookViT',
    'jumbo_vit': 'vit_pytorch.jumbo_vit:JumboViT',
    'simple_vit_with_relative_proj_pos_bias': 'vit_pytorch.simple_vit_with_relative_proj_pos_bias:SimpleViT',
    'ats_vit': 'vit_pytorch.ats_vit:ViT',
    'vit_with_patch_merger': 'vit_pytorch.vit_with_patch_merger:ViT',
    # research long tail: the block and the residual stream (issue 27)
    'simple_vit_with_value_residual': 'vit_pytorch.simple_vit_with_value_residual:SimpleViT',
    'simple_vit_orthog_residual_update': 'vit_pytorch.simple_vit_orthog_residual_update:SimpleViT',
    # research long tail I, wired into the trainer: its decorrelation loss (AUX_LOSSES)
    'vit_with_decorr': 'vit_pytorch.vit_with_decorr:RegisteredViT',
    # research long tail II: rotary positions (issue 27)
    'vit_5': 'vit_pytorch.vit_5:ViT',
    'rvt': 'vit_pytorch.rvt:RvT',
    # research long tail II: the norm and the feed-forward (issue 27)
    'normalized_vit': 'vit_pytorch.normalized_vit:nViT',
    'vit_with_keel_post_ln': 'vit_pytorch.vit_with_keel_post_ln:ViT',
    'local_vit': 'vit_pytorch.local_vit:LocalViT',
    # research long tail II: the attention and the loop (issue 27)
    'simple_vit_with_sparse_gating': 'vit_pytorch.simple_vit_with_sparse_gating:SimpleViTWithSparseGating',
    'jet_vit': 'vit_pytorch.jet_vit:JetViT',
    'looped_vit': 'vit_pytorch.looped_vit:LoopedViT',
    # research long tail: beyond classification (issue 28)
    'vit_nd': 'vit_pytorch.vit_nd:ViTND',
    'vivit_with_moss': 'vit_pytorch.vivit_with_moss:ViViT',
    # research long tail II: the residual stream across layers (issue 27)
    'simple_vit_with_hyper_connections': 'vit_pytorch.simple_vit_with_hyper_connections:SimpleViT',
    'simple_vit_attn_residual': 'vit_pytorch.simple_vit_attn_residual:SimpleViTAttnResidual',
    'attn_residual_with_dca_simple_vit': 'vit_pytorch.attn_residual_with_dca_simple_vit:SimpleViT',
    'simple_uvit': 'vit_pytorch.simple_uvit:SimpleUViT',
    # research long tail III: slots (issue 28)
    'wwt': 'vit_pytorch.wwt:WWT',
    # research long tail III: N-D positions (issue 28)
    'vit_nd_rotary': 'vit_pytorch.vit_nd_rotary:ViTND',
    'vit_nd_pope': 'vit_pytorch.vit_nd_pope:ViTND',
    # research long tail III: LeVJEPA's encoders, which drop tokens in training (issue 28)
    'levjepa': 'vit_pytorch.levjepa:VideoTransformerClassifier',
    'levjepa_nd': 'vit_pytorch.levjepa_nd:NDTransformerClassifier',
}

# models with an auxiliary loss that the training command adds to the cross-entropy: name -> (the forward's
# keyword that makes it return (logits, loss), the training command's option that weights the loss)
AUX_LOSSES = {
    'vit_with_decorr': ('return_decorr_aux_loss', 'decorr_aux_loss_weight'),
    'simple_vit_with_sparse_gating': ('return_loss', 'sparsity_aux_loss_weight'),
}

# models that return an auxiliary loss as their last output whenever they are built to compute one (their forward
# has no keyword for it), which the training command then adds to the cross-entropy as AUX_LOSSES': name -> (the
# model's attribute, set from its option of that name, that is None, False or all False without the loss; the
# training command's option that weights the loss)
BUILT_AUX_LOSSES = {
    'wwt': ('sigreg_slots', 'sigreg_loss_weight'),                  # the slots' SIGReg
}

# models whose training loss is their own function of all their outputs, in place of the cross-entropy of the
# logits: name -> (the forward's keyword that returns every output, the training command's switch that trains on
# the loss); `model.training_loss(outputs, targets, label_smoothing=...)` is the batch's mean loss and `outputs[-1]`
# the logits that the model predicts with (the ones evaluated and counted for the training accuracy)
OWN_LOSSES = {
    'looped_vit': ('return_all_logits', 'deep_supervision'),        # every loop's logits, deep supervision
}
# the model options that shape only that loss: given without the switch they would do nothing, so they are refused
OWN_LOSS_OPTIONS = {
    'looped_vit': ('deep_supervision_weighting', 'adaptive_loop'),    # adaptive_loop: the exit gate, which only
}                                                                      # the own loss trains (OWN_LOSS_TERMS)
# terms of a model's own loss that a training-command option weights, on when the built model has the part they
# train: name -> dict(part: the model's attribute, None without the part; keyword: the forward's keyword that adds
# the term's outputs, so that the forward returns (outputs, term outputs); output: training_loss's keyword that
# takes them; weight: the option, passed to training_loss under its own name)
OWN_LOSS_TERMS = {
    'looped_vit': dict(part='exit_gate', keyword='return_exit_benefits', output='exit_benefits',
                       weight='exit_gate_loss_weight'),                 # the exit gate's regression
}

# models whose input is not a batch of images (b, c, h, w): name -> what they take (`--data ucr:NAME` gives
# signals, `--data clips:TASK` clips); `image_size` is then the signal's length, or the side of a clip's frames
INPUTS = {
    'vit_1d': 'signals (b, c, length)',
    'simple_vit_1d': 'signals (b, c, length)',
    'vit_3d': 'clips (b, c, frames, h, w)',
    'simple_vit_3d': 'clips (b, c, frames, h, w)',
    'vivit': 'clips (b, c, frames, h, w)',
    'cct_3d': 'clips (b, c, frames, h, w)',
    'simple_flash_attn_vit_3d': 'clips (b, c, frames, h, w)',
    'na_vit_nested_tensor_3d': 'clips (b, c, frames, h, w)',
    'vit_nd': 'clips (b, c, frames, h, w)',    # any (b, c, *input_shape); the trainer's clips are its 3-D input
    'vivit_with_moss': 'clips (b, c, frames, h, w)',
    'vit_nd_rotary': 'clips (b, c, frames, h, w)',    # as vit_nd
    'vit_nd_pope': 'clips (b, c, frames, h, w)',    # as vit_nd
    'levjepa': 'clips (b, c, frames, h, w)',        # any number of frames; h and w multiples of the patch
    'levjepa_nd': 'clips (b, c, frames, h, w)',     # any (b, c, *input_shape); the clips as its 3-D input
}

# models whose forward_features keeps only a random share of the patch tokens in training when given a keyword (in
# eval mode every token): name -> that keyword, a fraction of the patch tokens to drop (the pre-training command's
# --drop-ratio passes it through)
TOKEN_DROPPING = {
    'levjepa': 'drop_ratio',
    'levjepa_nd': 'drop_ratio',
}

# the trainer's default sizes for a model whose arguments are not the ViT's (multi-scale models): name ->
# keyword arguments for small images (16 to 32 pixels); image size, channels and classes come from the data
SMALL_CONFIGS = {
    'swin': dict(patch_size=2, embed_dim=32, depths=(2, 2, 2), num_heads=(2, 4, 8), window_size=4),
    'swinv2': dict(patch_size=2, embed_dim=32, depths=(2, 2, 2), num_heads=(2, 4, 8), window_size=4),
    # 16 and 32 pixels: stage maps 4 and 2 (8 and 4), both divisible by the 2x2 window
    'max_vit': dict(dim=32, depth=(2, 2), dim_head=16, dim_conv_stem=32, window_size=2),
    'max_vit_with_registers': dict(dim=32, depth=(2, 2), dim_head=16, dim_conv_stem=32, window_size=2,
                                   num_register_tokens=2),
    # 16 to 32 pixels (divisible by 4): patches of 4 every 2 pixels, grids 7 -> 4 -> 2 at 16 pixels
    'pit': dict(patch_size=4, dim=32, depth=(1, 1, 1), heads=(2, 4, 8), dim_head=16, mlp_dim=(64, 128, 256)),
    # 16 or 32 pixels (the stem divides by 16): grids 1 or 2, then 1
    'levit': dict(dim=(32, 48), depth=1, heads=(2, 3), mlp_mult=2, stages=2, dim_key=8, dim_value=16),
    # any size: embeddings of stride 2, grids 8 -> 4 -> 2 at 16 pixels; the cls token classifies
    'cvt': dict(s1_emb_dim=32, s1_emb_kernel=3, s1_emb_stride=2, s1_mlp_mult=2, s2_emb_dim=64, s2_heads=2,
                s2_depth=1, s2_mlp_mult=2, s3_emb_dim=128, s3_heads=4, s3_depth=2, s3_mlp_mult=2, cls_token=True,
                qkv_bias=True),
    # any size: maps 4, 2, 1 at 16 pixels (8, 4, 2 at 32); the first stage's keys reduced 2x2
    'pvt_v2': dict(depths=(1, 1, 1), embed_dims=(32, 64, 128), num_heads=(1, 2, 4), sr_ratios=(2, 1, 1),
                   mlp_ratios=(4, 4, 4)),
    # any size: patches of 2, maps 8, 4, 2, 1 at 16 pixels; windows 4, 2, 2, 1, global keys sub-sampled 2, 2, 1, 1
    'twins_svt': dict(s1_emb_dim=32, s1_patch_size=2, s1_local_patch_size=4, s1_global_k=2, s1_depth=2,
                      s2_emb_dim=64, s2_patch_size=2, s2_local_patch_size=2, s2_global_k=2, s2_depth=2,
                      s3_emb_dim=64, s3_patch_size=2, s3_local_patch_size=2, s3_global_k=1, s3_depth=2,
                      s4_emb_dim=128, s4_patch_size=2, s4_local_patch_size=1, s4_global_k=1, s4_depth=1),
    # 16 to 32 pixels (divisible by 8): patches of 2, 16 / 4 / 1 blocks of 2x2 tokens at 16 pixels (4x4 at 32)
    'nest': dict(patch_size=2, dim=32, heads=2, num_hierarchies=3, block_repeats=(1, 1, 2)),
    # 16 to 32 pixels (divisible by 8): embeddings of stride 2 (kernels 2, 4, 8, then 2, 4), maps 8, 4, 2 at 16 pixels;
    # one (SDA, LDA) pair a stage: SDA groups of 4, 2, 2 (one group once a map is no larger), LDA groups of 2, 2, 1
    # spread over the map (every map of a size divisible by 8 is even in the first two stages)
    'crossformer': dict(dim=(32, 64, 128), depth=(1, 1, 1), local_window_size=(4, 2, 2), global_window_size=(2, 2, 1),
                        cross_embed_kernel_sizes=((2, 4, 8), (2, 4), (2, 4)), cross_embed_strides=(2, 2, 2)),
    # 16 or 32 pixels (square, maps 4, 2, 1, 1 or 8, 4, 2, 1): windows of 2x2, grouped windows of 4x4, each capped
    # at the map (one window there: global attention)
    'sep_vit': dict(dim=32, depth=(1, 2, 2, 1), heads=(1, 2, 4, 8), window_size=2, grouped_window_size=4),
    # 16 or 32 pixels (maps 4, 2, 1 or 8, 4, 2): IWSA windows of 2x2, then the whole map; SSA keys from 2x2 cells in the
    # first two stages, 40 wide a head (the paper's r_c = 1.25); a head of hidden width 256 (4096 in the paper's)
    'scalable_vit': dict(dim=32, depth=(2, 2, 2), heads=(1, 2, 4), reduction_factor=(2, 2, 1), window_size=(2, 2, None),
                         ssa_dim_key=(40, 40, 32), head_hidden_dim=256),
    # even sizes: local patches of 2 (tokens 8, 4, 2 at 16 pixels), windows of 2x2 local tokens under each
    # regional token (regional maps 4, 2, 1), 16 channels a head; the three-convolution stem needs patches of 4
    'regionvit': dict(dim=(32, 64, 128), depth=(1, 1, 2), window_size=2, local_patch_size=2,
                      tokenize_local_3_conv=False, dim_head=16, mlp_mult=2),
    # any size (the strides 2, 1, 2, 2, 2, 2 give maps of 2, 1, 1 in the MobileViT blocks at 16 pixels, 4, 2, 1 at
    # 32): patches of 1 x 1, so each block attends over its whole map rather than over one pixel of every 2x2 patch;
    # `widths` is vit-pytorch's `channels` (the registered class takes `channels` as the images', as all others do)
    'mobile_vit': dict(dims=(32, 48, 64), widths=(16, 16, 24, 24, 32, 32, 48, 48, 64, 64, 128), expansion=2,
                       depths=(1, 1, 1), patch_size=1),
    # signals whose length divides by 8 (the UCR sets' default lengths): 8 samples a patch
    'vit_1d': dict(patch_size=8, dim=64, depth=4, heads=4, dim_head=16, mlp_dim=128),
    'simple_vit_1d': dict(patch_size=8, dim=64, depth=4, heads=4, dim_head=16, mlp_dim=128),
    # clips of 8 frames of 16 or 32 pixels: tubelets of 2 frames x 8 x 8 pixels (4 x 4 x 4 tokens at 32 pixels)
    'vit_3d': dict(frames=8, image_patch_size=8, frame_patch_size=2, dim=64, depth=4, heads=4, dim_head=16,
                   mlp_dim=128),
    'simple_vit_3d': dict(frames=8, image_patch_size=8, frame_patch_size=2, dim=64, depth=4, heads=4, dim_head=16,
                          mlp_dim=128),
    'simple_flash_attn_vit_3d': dict(frames=8, image_patch_size=8, frame_patch_size=2, dim=64, depth=4, heads=4,
                                     dim_head=16, mlp_dim=128),
    # clips of up to 8 frames of up to 32 pixels (image_size is the largest), tubelets of 2 frames x 8 x 8 pixels
    'na_vit_nested_tensor_3d': dict(max_frames=8, patch_size=8, frame_patch_size=2, dim=64, depth=4, heads=4,
                                    dim_head=16, mlp_dim=128, num_registers=2),
    # the factorised encoder: 3 spatial layers on each time slice, 1 temporal layer on their cls tokens
    'vivit': dict(frames=8, image_patch_size=8, frame_patch_size=2, dim=64, spatial_depth=3, temporal_depth=1,
                  heads=4, dim_head=16, mlp_dim=128),
    # one 3D convolution of stride (2, 4, 4), then pooling of stride (1, 2, 2): 4 x 4 x 4 tokens at 32 pixels
    'cct_3d': dict(num_frames=8, embedding_dim=64, n_conv_layers=1, frame_kernel_size=3, frame_stride=2,
                   kernel_size=7, stride=4, padding=3, pooling_kernel_size=3, pooling_stride=2, pooling_padding=1,
                   num_layers=4, num_heads=4, mlp_ratio=2.0),
    # 16 to 32 pixels (divisible by 4): Fourier patches of 4 x 4 frequencies, as many Fourier tokens as patch tokens
    'simple_vit_with_fft': dict(patch_size=4, freq_patch_size=4, dim=64, depth=4, heads=4, dim_head=16, mlp_dim=128),
    # 16 to 32 pixels (divisible by 8): 4 to 16 compressed tokens of 8x8 pixels read 16 to 64 lookup tokens of 4x4
    'look_vit': dict(patch_size=8, highres_patch_size=4, dim=64, depth=4, heads=4, dim_head=16, cross_attn_heads=4,
                     cross_attn_dim_head=16, patch_conv_kernel_size=3, dropout=0.),
    # 16 to 64 patches of 4 pixels (16 to 32-pixel images): the layers keep at most 32, 16, 8 and 4 of them
    'ats_vit': dict(patch_size=4, dim=64, depth=4, heads=4, dim_head=16, mlp_dim=128, max_tokens_per_depth=(32, 16, 8, 4)),
    # 1 + 2 x 3 + 1 layers run (4 with their own weights): SMALL_MODEL's depth 4 and compute 8
    'looped_vit': dict(patch_size=4, dim=64, heads=4, dim_head=16, mlp_dim=128, pre_loop_depth=1, num_looped_blocks=2,
                       post_loop_depth=1, loop_depth=3),
    # the default clips (8 frames of 32 pixels) as a 3-D input, time causal: tubelets of 2 x 8 x 8, 4 x 4 x 4 tokens
    # (input_shape is fixed: it takes no image_size, so another --image-size needs --input-shape '(8, 16, 16)')
    'vit_nd': dict(ndim=3, input_shape=(8, 32, 32), patch_size=(2, 8, 8), dim=64, depth=4, heads=4, dim_head=16,
                   mlp_dim=128, causal_dims=(0,)),
    # as 'vivit', with MOSS over each slice's 4 x 4 patch tokens (2 x 2 at 16 pixels), time causal (the default)
    'vivit_with_moss': dict(frames=8, image_patch_size=8, frame_patch_size=2, dim=64, spatial_depth=3,
                            temporal_depth=1, heads=4, dim_head=16, mlp_dim=128, moss_hidden_dim=16),
    # SMALL_MODEL with 4 hyper-connected residual streams (num_residual_streams has no default) and 4 registers
    'simple_vit_with_hyper_connections': dict(patch_size=4, dim=64, depth=4, heads=4, dim_head=16, mlp_dim=128,
                                              num_residual_streams=4),
    # patches of 4 (16 to 64 tokens at 16 to 32 pixels) read by 8 part slots and 4 whole slots
    'wwt': dict(patch_size=4, dim=64, depth=4, heads=4, dim_head=16, mlp_dim=128, num_slots=(8, 4)),
    # as 'vit_nd', with rotary positions in place of the position table
    'vit_nd_rotary': dict(ndim=3, input_shape=(8, 32, 32), patch_size=(2, 8, 8), dim=64, depth=4, heads=4, dim_head=16,
                          mlp_dim=128, causal_dims=(0,)),
    # as 'vit_nd', with polar positions (PoPE)
    'vit_nd_pope': dict(ndim=3, input_shape=(8, 32, 32), patch_size=(2, 8, 8), dim=64, depth=4, heads=4, dim_head=16,
                        mlp_dim=128, causal_dims=(0,)),
    # the default clips (8 frames of 32 pixels) in patches of one frame x 8 x 8 pixels (LeVJEPA's encoder has no
    # tubelets): 8 x 4 x 4 = 128 patch tokens after the cls token, block-causal along the frames
    'levjepa': dict(frames=8, patch_size=8, dim=64, depth=4, heads=4, dim_head=16, mlp_dim=128),
    # as 'vit_nd': the default clips as a 3-D input in tubelets of 2 x 8 x 8, 4 x 4 x 4 = 64 patch tokens, time causal
    'levjepa_nd': dict(ndim=3, input_shape=(8, 32, 32), patch_size=(2, 8, 8), dim=64, depth=4, heads=4, dim_head=16,
                       mlp_dim=128, causal_dims=(0,)),
}

# 'Ti/16', 'S/16', 'B/32', ...: the paper's table, built by vit_pytorch.pretrained.vit
NAMED_CONFIG = re.compile(r'[A-Za-z]+/\d+')


def is_named_config(name):
    return isinstance(name, str) and NAMED_CONFIG.fullmatch(name) is not None


def known_names():
    return sorted(MODELS) + ["a named ViT configuration such as 'S/16' or 'B/16'"]


def _unknown(name, reason=''):
    return ValueError(f"unknown model name {name!r}{reason}; known names: {', '.join(known_names())}")


def model_class(name):
    """The class registered under `name` (imported now), or a ValueError listing the known names."""
    if not isinstance(name, str) or name not in MODELS:
        raise _unknown(name)
    module_name, class_name = MODELS[name].split(':')
    return getattr(importlib.import_module(module_name), class_name)


def _keywords(cls):
    """Keyword arguments of `cls(...)`, following **kwargs into base classes; None when they stay open."""
    names = set()
    for klass in cls.__mro__:
        if '__init__' not in vars(klass) or klass is object:
            continue
        signature = inspect.signature(klass.__init__)
        names |= {p.name for p in signature.parameters.values()
                  if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != 'self'}
        if not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
            return names
    return None


def parameters(name):
    """Names of the keyword arguments that build `name`, or None when its constructor takes any."""
    if is_named_config(name):
        from vit_pytorch.vit import ViT
        return _keywords(ViT) | {'image_size', 'num_classes'}
    return _keywords(model_class(name))


def build_model(name, **kwargs):
    """Build the model registered under `name` with `kwargs`; a name like 'B/16' builds that paper ViT."""
    if is_named_config(name):
        from vit_pytorch.pretrained import vit
        return vit(name, **kwargs)
    return model_class(name)(**kwargs)


# the trainer's settings: the model size used when the command line does not set it, and the data's sizes

# the model size used when the command line does not set it (only the keys the model accepts)
# patch_norm=False: a LayerNorm over one small gray patch (16 pixels) removes its brightness and contrast,
# most of what it says (digits, seeds 0-2, 50 epochs: 98.7/97.6/96.9% with it, 98.4/99.6/98.7% without)
SMALL_MODEL = dict(patch_size=4, dim=64, depth=4, heads=4, dim_head=16, mlp_dim=128, patch_norm=False,
                   cls_depth=2, sm_dim=64, lg_dim=128, sm_patch_size=2, lg_patch_size=4, sm_enc_heads=4, lg_enc_heads=4,
                   sm_enc_mlp_dim=128, lg_enc_mlp_dim=256, sm_enc_dim_head=16, lg_enc_dim_head=16,
                   lg_enc_depth=2, cross_attn_depth=1, cross_attn_heads=4, cross_attn_dim_head=16)

# the trainer's settings under a model's own argument names, one entry per model that keeps its reference's
# names (CCT its paper code's, Swin and PVT v2 timm's, the 1-D ViTs `seq_len`); every other model takes
# image_size, channels, num_classes, dim, depth and heads
ARGUMENT_NAMES = {
    'cct': dict(image_size='img_size', channels='n_input_channels', dim='embedding_dim', depth='num_layers',
                heads='num_heads'),
    'cct_3d': dict(image_size='img_size', channels='n_input_channels'),
    'swin': dict(image_size='img_size', channels='in_chans'),
    'swinv2': dict(image_size='img_size', channels='in_chans'),
    'pvt_v2': dict(channels='in_chans'),
    'vit_1d': dict(image_size='seq_len'),
    'simple_vit_1d': dict(image_size='seq_len'),
}


def model_config(name, kwargs, *, image_size, channels, num_classes):
    """The keyword arguments that build `name` for this data: defaults, data-given sizes, then the user's.
    A setting `name` does not accept (under its own name, ARGUMENT_NAMES) is left out."""
    accepted = parameters(name)
    spelling = ARGUMENT_NAMES.get(name, {})
    defaults = {} if is_named_config(name) else dict(SMALL_CONFIGS.get(name, SMALL_MODEL))
    defaults.update(image_size=image_size, channels=channels, num_classes=num_classes)
    config = {spelling.get(key, key): value for key, value in defaults.items()}
    if accepted is not None:
        config = {key: value for key, value in config.items() if key in accepted}
    return {**config, **kwargs}
