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

import fnmatch
from dataclasses import dataclass, field

import pytest
import torch

from helpers import move_off_initialisation, parameters_without_gradient
from vit_pytorch.models import MODELS, build_model


@dataclass(frozen=True)
class Case:
    """One row of the conformance table.

    kwargs           the keyword arguments of `build_model(name, **kwargs)`
    input            the input's shape: (b, c, h, w) images, (b, c, length) signals or (b, c, frames, h, w)
                     clips; a list of (c, h, w) shapes for a list of images (NaViT)
    forward          keyword arguments of the forward call
    no_gradient      parameter name (a glob pattern) -> why the model's own design gives it no gradient through
                     the output; each pattern must match a parameter
    """
    kwargs: dict
    input: tuple
    forward: dict = field(default_factory=dict)
    no_gradient: dict = field(default_factory=dict)

    def make_input(self, generator):
        if isinstance(self.input, list):
            return [torch.randn(shape, generator=generator) for shape in self.input]
        return torch.randn(self.input, generator=generator)


def registry_name(case_id):
    """'vit[pool=mean]' -> 'vit'."""
    return case_id.split('[')[0]


VIT = dict(image_size=(16, 24), patch_size=(4, 8), num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32)
IMAGES = (2, 3, 16, 24)               # a 4x3 grid of patches: 12 tokens (13 with a cls token)
VIDEO = dict(image_size=(16, 24), image_patch_size=(4, 8), frames=4, frame_patch_size=2)
CLIPS = (2, 3, 4, 16, 24)             # 2 x 4 x 3 tubelets
SIGNAL = dict(seq_len=24, patch_size=4, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, channels=2)


# why a parameter gets no gradient through the output, by the mathematics of the model's own design
KEY_CONSTANT = 'a bias added to every key of a query alike, which a softmax over the keys ignores'
KEY_BIAS = 'a bias on the keys adds q . b to every key of a query alike, which the softmax ignores'
BEFORE_BATCHNORM = ('a per-channel shift whose every path to the output passes a BatchNorm in training mode, '
                    'which subtracts the batch mean')
SEQUENCE_POOLING = 'sequence pooling is a softmax over the tokens of one linear score, whose bias is the same for all'
MAX_VIT_BEFORE_BATCHNORM = {'conv_stem.0.bias': BEFORE_BATCHNORM, '*.conv.net.0.bias': BEFORE_BATCHNORM}


def twins_stages(dims=(8, 16, 24, 32), heads=(1, 2, 3, 4), depths=(2, 2, 2, 2), windows=(5, 4, 2, 2), ks=(4, 2, 1, 1)):
    kwargs = {}
    for i in range(4):
        kwargs.update({f's{i + 1}_emb_dim': dims[i], f's{i + 1}_heads': heads[i], f's{i + 1}_mlp_mult': 2,
                       f's{i + 1}_depth': depths[i], f's{i + 1}_global_k': ks[i],
                       f's{i + 1}_local_patch_size': windows[i], f's{i + 1}_patch_size': 2})
    return kwargs


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
    'distillable_vit': Case(VIT, IMAGES),
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
                       stages=2, dim_key=4, dim_value=8, num_distill_classes=5), (4, 3, 48, 64),
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
    # 32x48 images: maps 16x24, 8x12, 4x6; groups of 3, 3, 4 (the last map one group of 24 tokens)
    'crossformer': Case(dict(num_classes=5, dim=(48, 64, 96), depth=(2, 2, 2), heads=(1, 2, 2),
                             local_window_size=(3, 3, 4), interval=(2, 2, 1),
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
    # 40x56 images: MobileViT blocks on maps 5x7, 3x4, 2x2 (2x2 patches: attention over 4+ patches); every
    # BatchNorm over at least 2 x 2 x 2 values a channel
    'mobile_vit': Case(dict(image_size=(40, 56), dims=(8, 16, 24), widths=(8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 32),
                            num_classes=5, expansion=2, depths=(1, 2, 1)), (2, 3, 40, 56),
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
