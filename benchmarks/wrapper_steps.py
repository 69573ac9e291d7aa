"""The research-long-tail wrappers against vit-pytorch 1.26.14's module of the same name: mp3, levjepa, levjepa_nd,
vat, vaat, vat_siglip, es_vit, lejepa.

For each (`--rows`), at vit-pytorch's README or `__main__` configuration scaled to a 2-core machine (`ROWS`: what
is scaled is said there), on the same inputs (one seeded draw, handed to both):

  - inference at batch 8, where both wrappers have an inference path (the action chunk of the VATs, the cls
    embedding of the LeVJEPAs; MP3 returns only its loss);
  - a training step at batch 8 (the wrapper's loss, backward, AdamW);
  - the training-step memory: the peak RSS increase over two steps, each in a fresh process (`--memory` runs of
    each, ours and the reference's alternating), glibc's mmap threshold fixed as throughput.py fixes it.

Speeds are paired ratios ours / vit-pytorch's over interleaved rounds of CPU time at one thread (throughput.py's
`interleaved` and `paired`: every model once per round, the order rotated, each timing at least `--seconds`); above
1, ours is faster. The memory ratio is ours / vit-pytorch's, run by run; below 1, ours takes less. Where
vit-pytorch's weights load into ours (`load_vit_pytorch`), ours gets them and the outputs are checked equal before
timing; where its module computes another function (`DIFFERENT_FUNCTION`) or cannot run here, the row says so, the
latter with the exception it raised, and where `load_vit_pytorch` refuses its weights (a function ours does not
compute) the row says "not timed" with the loader's reason (ours is still measured). Where ours at the paper's
recipe does more work than vit-pytorch's step (`SAME_WORK`: es_vit, lejepa, whose paper steps take more views with
gradient), `ours` is ours at vit-pytorch's work (the setting that performance.md's step scripts call `ours0` and
`ours_eq`, imported from es_vit_step.py and lejepa_step.py), and the paper's step (`paper`) is timed beside it in the
same rounds and memory runs; the row gives both. vit-pytorch 1.26.14 comes
from $VIT_PYTORCH_SOURCE (its wheel or unpacked folder), as in throughput.py. Run in an environment with
torchvision (vit-pytorch's levjepa imports it) and torchaudio (its vaat does):

    PYTHONPATH=. VIT_PYTORCH_SOURCE=vit_pytorch-1.26.14-py3-none-any.whl python benchmarks/wrapper_steps.py --json rows.json

`--merge docs/wrapper-table.json` puts the rows measured into that table (the other rows kept), each with a record
of its own run (`remeasured`: command, date, machine, load average, `--note`), and prints the merged table.
`--tiny` shrinks every row to a few milliseconds a step (for the tests).
"""
import argparse
import datetime
import json
import os
import shlex
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import throughput  # noqa: E402  (the timing helpers: interleaved, paired, Runner.run, rss_mib, the memory child's environment)

from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch  # noqa: E402

BATCH = 8
ROW_NAMES = ('mp3', 'levjepa', 'levjepa_nd', 'vat', 'vaat', 'vat_siglip', 'es_vit', 'lejepa')

# what each row runs, as vit-pytorch's example has it and as scaled here
CONFIGS = {
    'mp3': "README: ViT 256 px / 8 (1024 patches), width 1024, depth 6, 8 heads, MLP 2048, dropout 0.1, masking "
           "0.75, batch 8; here 128 px / 8 (256 patches), width 512, MLP 1024",
    'levjepa': "__main__: VideoTransformer 8 frames of 96 px / 16, width 256, depth 3, 8 heads, MLP 512; LeVJEPA's "
               "defaults (4 local views of 96 px, 95% of the tokens dropped, K 256); batch 2, here 8",
    'levjepa_nd': "__main__ (3-D): NDTransformer 8 x 64 x 64 / 1 x 16 x 16, width 128, depth 2, 4 heads, MLP 256, "
                  "time causal; noise augmentations (sigma 0.1), 1 target view, 95% dropped; batch 2, here 8",
    'vat': "__main__: ViT 256 px / 32, width 256, depth 4; VAT width 512, depth 9, 8 heads, MLP 2048, 2 views x 4 "
           "frames, 4 tasks, an extra token of 33, chunks of 7 x 20, layers (0,0,1,1,2,2,3,3,4), training with "
           "freeze_vit; batch 2, here 8",
    'vaat': "__main__: ViT 256 px / 32 and AST (patches 16), width 384, depth 4; VAAT as VAT's, AST layers "
            "(1,1,1,2,2,2,3,3,3), 2 audio views; batch 2, here 8 with 1 audio view (with 2, vit-pytorch's VAAT "
            "adds its audio view embedding's row i to batch element i and raises at batch 8; load_vit_pytorch "
            "refuses those weights), and audio of 14,100 samples (its 70,500: 4 x 367 AST patches a view, here "
            "4 x 73)",
    'vat_siglip': "__main__: SigLIP So400m/14 at 224 px (1152 wide, 27 layers, 16 heads, MLP 4304), policy depth 4, "
                  "layers (0,1,26,27), 2 views x 2 frames, 4 tasks, an extra token of 32, chunks of 50 x 32, training "
                  "with freeze_vit; batch 1; here the tower a third as wide and deep (384, 9 layers, 6 heads, MLP "
                  "1536) at 112 px / 14 (64 patches), layers (0,1,8,9), batch 8",
    'es_vit': "README: CvT (stages 64, 192, 384 wide, depths 1, 2, 10), EsViTTrainer at 256 px, projector hidden "
              "256, 4 layers, K 65336, batch 8; here 64 px (benchmarks/es_vit_step.py's), both trainers around our "
              "CvT from the same initial weights, the step with the EMA update",
    'lejepa': "__main__: ViT 256 px / 32 (64 patches), width 1024, depth 6, 8 heads, MLP 2048, projector hidden "
              "256, 4 layers, K 65336, batch 8; here (benchmarks/lejepa_step.py's) 64 px / 8 (64 patches), width "
              "256, MLP 512, both LeJEPAs around our ViT from the same initial weights",
}

# references that compute another function than ours at the same sizes: timed without the output check
DIFFERENT_FUNCTION = {
    'mp3': "vit-pytorch's MP3 gives every layer the first layer's input (the patch embeddings of the unmasked "
           "25%) as keys and values; ours (the paper's) each layer's own tokens of those patches (the ViTs' weights "
           "are the same: their logits are checked equal)",
    'levjepa_nd': "vit-pytorch's LeVJEPAND reads its [sources, targets] batch back as (input, view), so at batch > 1 "
                  "it pulls most inputs' target views to other inputs' sources; ours each to its own (the same "
                  "encoder, weights and work: the embeddings are checked equal)",
    'es_vit': "vit-pytorch's EsViTTrainer L2-normalises each region feature across the tokens (load_vit_pytorch "
              "refuses its weights) and its student sees only the 2 local crops; ours the paper's region loss (the "
              "backbone is the same: its weights are checked equal)",
    'lejepa': "vit-pytorch's LeJEPA takes its targets under no_grad, pairs each local view with the other global "
              "view and leaves the factor N out of SIGReg; ours the paper's loss (its weights load into ours: the "
              "projections and embeddings are checked equal)",
}

# rows where ours at the paper's recipe does more work than vit-pytorch's step: (what `ours` times instead, the same
# work as vit-pytorch's; what the paper's step, `paper`, timed beside it, does)
SAME_WORK = {
    'es_vit': ("timed at vit-pytorch's number of forwards (num_local_crops=0: the student and the teacher each see the "
               "2 global crops; vit-pytorch's student the 2 local ones, its teacher the 2 global ones; "
               "es_vit_step.py's ours0)",
               "the student sees the 2 global and 2 local crops: twice the student's work"),
    'lejepa': ("timed doing vit-pytorch's work with our code (lejepa_step.py's ours_eq: 4 views, our loss on the 2 "
               "global ones with gradient, the 2 local ones projected under no_grad; not a LeJEPA step)",
               "all 4 views with gradient: twice the views with gradient"),
}

# the wrappers of the package (tests/test_conformance.py's WRAPPER_STEPS) without a row here: why
NOT_YET = 'no row yet: not measured against vit-pytorch 1.26.14 in any table'
NO_ROW = {
    'distill_wrapper': "timed in the registry table (docs/registry-table.md): `distillable_vit` trains through "
                       "DistillWrapper's loss",
    'vit_with_decorr': 'a model with its own loss: a row of the registry table (docs/registry-table.md)',
    **dict.fromkeys(('mae', 'simmim', 'mpp', 'dino', 'accept_video_wrapper', 'extractor', 'recorder'), NOT_YET),
}

# rows without an inference path in vit-pytorch's wrapper: why
NO_INFERENCE = {'mp3': "vit-pytorch's MP3 returns only the loss"}


def tiny_or(tiny, full, small):
    return small if tiny else full


class Step:
    """One wrapper's inference and training step on fixed inputs, timed by throughput.py's `Runner.run` (and so by
    its clock and `interleaved` rounds)."""

    run = throughput.Runner.run
    paper = None            # rows of SAME_WORK: the paper's step beside ours (build_row)

    def __init__(self, module, infer, loss, after=None):
        self.module, self.infer_fn, self.loss_fn, self.after = module, infer, loss, after
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=1e-5)

    def infer(self, batch):
        self.module.eval()
        with torch.inference_mode():
            self.infer_fn()

    def train(self, batch):
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        self.loss_fn().backward()
        self.optimizer.step()
        if self.after is not None:          # the EMA teacher's update, where the wrapper has one
            self.after()


# the rows: build(tiny) -> (dict(ours=(module, infer or None, loss[, after]), paper=(...) where SAME_WORK), reference
# builder)


def reference_module(name):
    """vit-pytorch 1.26.14's module `name` from $VIT_PYTORCH_SOURCE (throughput.vit_pytorch_module), its import's
    own exception raised: the row states it."""
    if not os.environ.get('VIT_PYTORCH_SOURCE'):
        raise LookupError("$VIT_PYTORCH_SOURCE (vit-pytorch 1.26.14's wheel or folder) is unset")
    return throughput.vit_pytorch_module(name, quiet=False)


def build_mp3(tiny):
    from vit_pytorch.mp3 import MP3, ViT
    vit_kwargs = tiny_or(tiny, dict(num_classes=1000, image_size=128, patch_size=8, dim=512, depth=6, heads=8,
                                    mlp_dim=1024, dropout=0.1),
                         dict(num_classes=10, image_size=16, patch_size=4, dim=16, depth=1, heads=2, mlp_dim=32,
                              dim_head=8, dropout=0.1))
    images = inputs(lambda g: dict(img=torch.randn(BATCH, 3, vit_kwargs['image_size'], vit_kwargs['image_size'],
                                                   generator=g)))
    ours = MP3(ViT(**vit_kwargs), masking_ratio=0.75)
    row = dict(ours=(ours, None, lambda: ours(images['img'])))

    def reference():
        module = reference_module('mp3')
        theirs = module.MP3(module.ViT(**vit_kwargs), masking_ratio=0.75)
        load_vit_pytorch(ours.vit, theirs.vit.state_dict())
        ours.mlp_head.load_state_dict(theirs.mlp_head.state_dict())
        check_equal(ours.vit, theirs.vit, images['img'])
        return theirs, None, lambda: theirs(images['img'])
    return row, reference


def build_levjepa(tiny):
    from vit_pytorch.levjepa import LeVJEPA, VideoTransformer
    encoder_kwargs = tiny_or(tiny, dict(image_size=96, patch_size=16, frames=8, dim=256, depth=3, heads=8,
                                        mlp_dim=512),
                             dict(image_size=16, patch_size=8, frames=2, dim=16, depth=1, heads=2, mlp_dim=32,
                                  dim_head=12))
    size = encoder_kwargs['image_size']
    learner_kwargs = dict(image_size=size, local_size=size)
    video = inputs(lambda g: dict(video=torch.rand(BATCH, 3, encoder_kwargs['frames'], size, size, generator=g)))
    ours = LeVJEPA(VideoTransformer(**encoder_kwargs), **learner_kwargs)
    row = dict(ours=(ours, lambda: ours(video['video'], return_embedding=True), lambda: ours(video['video'])))

    def reference():
        module = reference_module('levjepa')
        theirs = module.LeVJEPA(module.VideoTransformer(**encoder_kwargs), **learner_kwargs)
        load_vit_pytorch(ours, theirs.state_dict())
        return theirs, lambda: theirs(video['video'], return_embedding=True), lambda: theirs(video['video'])
    return row, reference


def noise_augment(x):
    """vit-pytorch's levjepa_nd example's augmentation: Gaussian noise of sigma 0.1."""
    return x + torch.randn_like(x) * 0.1


def build_levjepa_nd(tiny):
    from vit_pytorch.levjepa_nd import LeVJEPAND, NDTransformer
    encoder_kwargs = tiny_or(tiny, dict(ndim=3, input_shape=(8, 64, 64), patch_size=(1, 16, 16), dim=128, depth=2,
                                        heads=4, mlp_dim=256),
                             dict(ndim=3, input_shape=(2, 8, 8), patch_size=(1, 4, 4), dim=16, depth=1, heads=2,
                                  mlp_dim=32, dim_head=8))
    learner_kwargs = dict(input_shape=encoder_kwargs['input_shape'], augment_src=noise_augment,
                          augment_tgt=noise_augment)
    x = inputs(lambda g: dict(x=torch.randn(BATCH, 3, *encoder_kwargs['input_shape'], generator=g)))
    ours = LeVJEPAND(NDTransformer(**encoder_kwargs), **learner_kwargs)
    row = dict(ours=(ours, lambda: ours(x['x'], return_embedding=True), lambda: ours(x['x'])))

    def reference():
        module = reference_module('levjepa_nd')
        theirs = module.LeVJEPAND(module.NDTransformer(**encoder_kwargs), **learner_kwargs)
        load_vit_pytorch(ours, theirs.state_dict())
        check_equal(ours, theirs, x['x'], return_embedding=True)
        return theirs, lambda: theirs(x['x'], return_embedding=True), lambda: theirs(x['x'])
    return row, reference


def film_as_identity(model):
    """vit-pytorch's FiLM layers of `model` set to the identity (gamma 1, beta 0), ours' initialisation. Its own
    zero gamma multiplies every policy token by 0 before each layer; loaded into ours (gamma = 1 + ours, so our bias
    is -1), AdamW's weight decay moves that bias off -1 by lr x decay a step, so that our tokens are scaled by
    about 5e-7 per layer and, nine layers on, are subnormal floats, on which every matmul runs many times slower
    (docs/performance.md). Timed from the identity, both compute ours' untrained function."""
    for module in model.modules():
        if type(module).__name__ == 'FiLM':
            bias = module.to_gamma_beta[0].bias
            with torch.no_grad():
                bias[:bias.shape[0] // 2] = 1.


def action_inputs(g, *, views, frames, size, tasks, extra, chunk, dim_action, audio=None):
    video = torch.randn(BATCH, views, 3, frames, size, size, generator=g)
    made = dict(video=video, tasks=torch.randint(0, tasks, (BATCH,), generator=g),
                extra=torch.randn(BATCH, extra, generator=g), actions=torch.randn(BATCH, chunk, dim_action, generator=g))
    if audio is not None:
        made['audio'] = torch.randn(BATCH, *audio, generator=g)
    return made


def vat_steps(model, x, audio=False):
    """(inference, loss) of a VAT-like model on inputs `x`: the action chunk; the L1 loss with a frozen tower, as
    vit-pytorch's examples train."""
    first = (x['video'], x['audio']) if audio else (x['video'],)
    infer = lambda: model(*first, tasks=x['tasks'], extra=x['extra'])
    loss = lambda: model(*first, tasks=x['tasks'], extra=x['extra'], actions=x['actions'], freeze_vit=True)
    return infer, loss


def build_vat(tiny):
    from vit_pytorch.vat import VAT, ViT
    vit_kwargs = tiny_or(tiny, dict(image_size=256, patch_size=32, num_classes=1000, dim=256, heads=8, depth=4,
                                    mlp_dim=1024),
                         dict(image_size=16, patch_size=8, num_classes=10, dim=16, heads=2, depth=2, mlp_dim=32,
                              dim_head=8))
    vat_kwargs = tiny_or(tiny, dict(dim=512, depth=9, heads=8, dim_head=64, mlp_dim=2048, dim_action=20,
                                    action_chunk_len=7, time_seq_len=4, num_views=2, num_tasks=4, dim_extra_token=33,
                                    vit_layer_indices=(0, 0, 1, 1, 2, 2, 3, 3, 4)),
                         dict(dim=16, depth=3, heads=2, dim_head=8, mlp_dim=32, dim_action=2, action_chunk_len=3,
                              time_seq_len=2, num_views=2, num_tasks=4, dim_extra_token=5, self_attn_dim_head=8,
                              vit_layer_indices=(0, 1, 2)))
    x = inputs(lambda g: action_inputs(g, views=vat_kwargs['num_views'], frames=vat_kwargs['time_seq_len'],
                                       size=vit_kwargs['image_size'], tasks=vat_kwargs['num_tasks'],
                                       extra=vat_kwargs['dim_extra_token'], chunk=vat_kwargs['action_chunk_len'],
                                       dim_action=vat_kwargs['dim_action']))
    ours = VAT(ViT(**vit_kwargs), **vat_kwargs)
    row = dict(ours=(ours, *vat_steps(ours, x)))

    def reference():
        module = reference_module('vat')
        theirs = module.VAT(module.ViT(**vit_kwargs), **vat_kwargs)
        film_as_identity(theirs)
        load_vit_pytorch(ours, theirs.state_dict())
        check_equal(ours, theirs, x['video'], tasks=x['tasks'], extra=x['extra'])
        return (theirs, *vat_steps(theirs, x))
    return row, reference


def build_vaat(tiny):
    from vit_pytorch.vaat import AST, VAAT, ViT
    width = tiny_or(tiny, 384, 16)
    vit_kwargs = tiny_or(tiny, dict(image_size=256, patch_size=32, num_classes=1000, dim=384, heads=8, depth=4,
                                    mlp_dim=384 * 4),
                         dict(image_size=16, patch_size=8, num_classes=10, dim=width, heads=2, depth=2, mlp_dim=32,
                              dim_head=8))
    ast_kwargs = tiny_or(tiny, dict(dim=384, depth=4, heads=8, num_classes=1000, patch_size=16, mlp_dim=384 * 4),
                         dict(dim=width, depth=2, heads=2, num_classes=10, patch_size=8, mlp_dim=32, dim_head=8))
    vaat_kwargs = tiny_or(tiny, dict(dim=512, depth=9, heads=8, dim_head=64, mlp_dim=2048, dim_action=20,
                                     action_chunk_len=7, time_seq_len=4, num_image_views=2, num_audio_views=1,
                                     num_tasks=4, dim_extra_token=33, vit_layer_indices=(0, 0, 1, 1, 2, 2, 3, 3, 4),
                                     ast_layer_indices=(1, 1, 1, 2, 2, 2, 3, 3, 3)),
                          dict(dim=16, depth=3, heads=2, dim_head=8, mlp_dim=32, dim_action=2, action_chunk_len=3,
                               time_seq_len=2, num_image_views=2, num_audio_views=1, num_tasks=4, dim_extra_token=5,
                               self_attn_dim_head=8, vit_layer_indices=(0, 1, 2), ast_layer_indices=(1, 2, 2)))
    samples = tiny_or(tiny, 14_100, 400)
    x = inputs(lambda g: action_inputs(g, views=vaat_kwargs['num_image_views'], frames=vaat_kwargs['time_seq_len'],
                                       size=vit_kwargs['image_size'], tasks=vaat_kwargs['num_tasks'],
                                       extra=vaat_kwargs['dim_extra_token'], chunk=vaat_kwargs['action_chunk_len'],
                                       dim_action=vaat_kwargs['dim_action'],
                                       audio=(vaat_kwargs['num_audio_views'], samples)))
    ours = VAAT(ViT(**vit_kwargs), AST(**ast_kwargs), **vaat_kwargs)
    row = dict(ours=(ours, *vat_steps(ours, x, audio=True)))

    def reference():
        module = reference_module('vaat')
        theirs = module.VAAT(module.ViT(**vit_kwargs), module.AST(**ast_kwargs), **vaat_kwargs)
        film_as_identity(theirs)
        load_vit_pytorch(ours, theirs.state_dict())
        check_equal(ours, theirs, x['video'], x['audio'], tasks=x['tasks'], extra=x['extra'])
        return (theirs, *vat_steps(theirs, x, audio=True))
    return row, reference


def build_vat_siglip(tiny):
    from vit_pytorch.vat_siglip import SigLIPVAT
    kwargs = tiny_or(tiny, dict(num_tasks=4, dim_extra_token=32, time_seq_len=2, num_views=2, depth=4,
                                vit_layer_indices=(0, 1, 8, 9), siglip_image_size=112, siglip_patch_size=14,
                                siglip_dim=384, siglip_depth=9, siglip_heads=6, siglip_mlp_dim=1536),
                     dict(num_tasks=4, dim_extra_token=5, time_seq_len=2, num_views=2, depth=2, dim=16, heads=2,
                          dim_head=8, mlp_dim=32, dim_action=2, action_chunk_len=3, self_attn_dim_head=8,
                          vit_layer_indices=(0, 2), siglip_image_size=28, siglip_patch_size=14, siglip_dim=16,
                          siglip_depth=2, siglip_heads=2, siglip_mlp_dim=32))
    chunk, dim_action = kwargs.get('action_chunk_len', 50), kwargs.get('dim_action', 32)
    x = inputs(lambda g: action_inputs(g, views=kwargs['num_views'], frames=kwargs['time_seq_len'],
                                       size=kwargs['siglip_image_size'], tasks=kwargs['num_tasks'],
                                       extra=kwargs['dim_extra_token'], chunk=chunk, dim_action=dim_action))
    ours = SigLIPVAT(**kwargs)
    row = dict(ours=(ours, *vat_steps(ours, x)))

    def reference():
        module = reference_module('vat_siglip')
        theirs = module.SigLIPVAT(**kwargs)
        film_as_identity(theirs)
        load_vit_pytorch(ours, theirs.state_dict())
        check_equal(ours, theirs, x['video'], tasks=x['tasks'], extra=x['extra'])
        return (theirs, *vat_steps(theirs, x))
    return row, reference


def build_es_vit(tiny):
    import es_vit_step          # benchmarks/es_vit_step.py (on the path above): the row reuses its trainers
    cvt = tiny_or(tiny, es_vit_step.README, dict(
        num_classes=10, s1_emb_dim=8, s1_emb_kernel=3, s1_emb_stride=2, s1_proj_kernel=3, s1_kv_proj_stride=2,
        s1_heads=1, s1_depth=1, s2_emb_dim=16, s2_emb_kernel=3, s2_emb_stride=2, s2_proj_kernel=3, s2_kv_proj_stride=2,
        s2_heads=2, s2_depth=1, s3_emb_dim=16, s3_emb_kernel=3, s3_emb_stride=2, s3_proj_kernel=3, s3_kv_proj_stride=2,
        s3_heads=2, s3_depth=1, dropout=0.))
    head = tiny_or(tiny, es_vit_step.HEAD, dict(projection_hidden_size=16, projection_layers=2, num_classes_K=32))
    size = tiny_or(tiny, 64, 32)
    images = inputs(lambda g: dict(img=torch.rand(BATCH, 3, size, size, generator=g)))
    steps = lambda learner: (learner, lambda: learner(images['img'], return_embedding=True),
                             lambda: learner(images['img']), learner.update_moving_average)
    ours, paper = (es_vit_step.build(which, size, cvt, head) for which in ('ours0', 'ours'))
    row = dict(ours=steps(ours), paper=steps(paper))

    def reference():
        theirs = es_vit_step.build('theirs', size, cvt, head, reference=reference_module('es_vit'))
        # the same initial weights (not buffers: vit-pytorch's constructor runs a forward, which moves the batch
        # norms' running statistics)
        for learner in (ours, paper):
            weights = dict(learner.student.net.named_parameters())
            for key, value in theirs.student_encoder.net.named_parameters():
                torch.testing.assert_close(weights[key], value, atol=0, rtol=0)
        return steps(theirs)
    return row, reference


def build_lejepa(tiny):
    import lejepa_step          # benchmarks/lejepa_step.py: the row reuses its learners
    net = tiny_or(tiny, lejepa_step.NET, dict(image_size=16, patch_size=8, num_classes=10, dim=16, depth=1, heads=2,
                                              dim_head=8, mlp_dim=32))
    learner = tiny_or(tiny, lejepa_step.LEARNER, dict(image_size=16, projection_hidden_size=16, projection_layers=2,
                                                      num_classes_K=32))
    images = inputs(lambda g: dict(img=torch.rand(BATCH, 3, net['image_size'], net['image_size'], generator=g)))
    built = {mode: lejepa_step.learner_of(mode, net, learner) for mode in ('ours_eq', 'ours')}
    steps = {mode: (model, lambda model=model: model(images['img'], return_embedding=True),
                    lambda loss_of=loss_of: loss_of(images['img'])) for mode, (model, loss_of) in built.items()}
    row = dict(ours=steps['ours_eq'], paper=steps['ours'])

    def reference():
        theirs, loss_of = lejepa_step.learner_of('theirs', net, learner, reference=reference_module('lejepa'))
        for ours, _ in built.values():
            load_vit_pytorch(ours, theirs.state_dict())
        ours = built['ours_eq'][0]
        # theirs normalises in its augmentation, ours (given mean and std, as lejepa_step.py) in its embedding
        with torch.no_grad():
            torch.testing.assert_close(ours.eval()(images['img'], return_embedding=True),
                                       theirs.eval()(ours.normalise(images['img']), return_embedding=True),
                                       atol=1e-4, rtol=0)
        return theirs, lambda: theirs(images['img'], return_embedding=True), lambda: loss_of(images['img'])
    return row, reference


BUILDERS = dict(mp3=build_mp3, levjepa=build_levjepa, levjepa_nd=build_levjepa_nd, vat=build_vat, vaat=build_vaat,
                vat_siglip=build_vat_siglip, es_vit=build_es_vit, lejepa=build_lejepa)


def inputs(make):
    """The row's inputs, drawn once from a seeded generator; both wrappers read these same tensors."""
    return make(torch.Generator().manual_seed(1))


def check_equal(ours, theirs, *args, **kwargs):
    """Ours and vit-pytorch's (its weights loaded into ours) give the same output in eval mode on the row's input."""
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(*args, **kwargs), theirs.eval()(*args, **kwargs), atol=1e-4, rtol=0)


def build_row(name, tiny, probe=True):
    """(ours step, reference step or None, why there is no reference or None): the reference's failure to build,
    agree, or (with `probe`) take one step of each task is caught and stated with its exception; `load_vit_pytorch`
    refusing its weights (a CheckpointError: a function ours does not compute) is stated as such."""
    torch.manual_seed(0)
    row, reference = BUILDERS[name](tiny)
    ours = Step(*row['ours'])
    if 'paper' in row:
        ours.paper = Step(*row['paper'])
    try:
        theirs = Step(*reference())
    except CheckpointError as error:
        return ours, None, f'not timed: load_vit_pytorch refuses its weights: {str(error)[:300]}'
    except Exception as error:                               # noqa: BLE001  (stated in the row, not fatal)
        return ours, None, f'cannot run here: importing or building it raised {type(error).__name__}: {str(error)[:300]}'
    failures = []
    probes = [('inference', theirs.infer)] if theirs.infer_fn is not None else []
    for task, fn in (probes + [('training', theirs.train)]) if probe else []:
        try:
            fn(BATCH)
        except Exception as error:                           # noqa: BLE001
            failures.append(f'its {task} raised {type(error).__name__}: {str(error).splitlines()[0][:300]}')
    if failures:
        return ours, None, 'cannot run here: ' + '; '.join(failures)
    return ours, theirs, None


# measuring


def measure_row(name, args, log):
    """One row: paired interleaved rounds of ours and vit-pytorch's (or ours alone), then the memory children."""
    ours, theirs, missing = build_row(name, args.tiny)
    log(f'{name}: reference {"built" if theirs else missing}')
    runners = {'ours': ours} if theirs is None else {'ours': ours, 'reference': theirs}
    if ours.paper is not None:                   # SAME_WORK: the paper's step in the same rounds
        runners['paper'] = ours.paper
    tasks = ([] if ours.infer_fn is None or (theirs is not None and theirs.infer_fn is None) else [('infer', BATCH)])
    tasks.append(('train', BATCH))
    speeds, _ = throughput.interleaved(runners, tasks, args.rounds, args.seconds, log=log, same_steps=False)
    result = dict(config=CONFIGS[name], reference_missing=missing, different_function=DIFFERENT_FUNCTION.get(name),
                  no_inference=NO_INFERENCE.get(name), speed={}, ratios={}, memory={}, memory_ratio=None)
    if 'paper' in runners:
        result['same_work'], work = SAME_WORK[name]
        result['paper'] = dict(work=work, ratios={}, memory_ratio=None)   # its speeds, memory: speed/memory's 'paper'
    for kind, batch in tasks:
        key = f'{kind}@{batch}'
        result['speed'][key] = {who: throughput.summary(speeds[(kind, batch)][who]) for who in runners}
        if theirs is not None:
            result['ratios'][key] = throughput.paired(speeds[(kind, batch)], 'ours', 'reference')
            if 'paper' in runners and kind == 'train':   # its inference is ours' (the same path and weights)
                result['paper']['ratios'][key] = throughput.paired(speeds[(kind, batch)], 'paper', 'reference')
    del ours, theirs, runners
    throughput.release_memory()
    if args.memory:
        runs = {who: [] for who in ('ours', 'reference', 'paper') if who in result['speed']['train@8']}
        for _ in range(args.memory):
            for who in runs:              # alternating: run i of each is a pair in time
                runs[who].append(memory_run(name, who, args.tiny))
        result['memory'] = {who: throughput.summary(values) for who, values in runs.items()}
        for who, into in (('ours', result), ('paper', result.get('paper'))):
            if who in runs and 'reference' in runs:
                into['memory_ratio'] = throughput.summary([a / b for a, b in zip(runs[who], runs['reference'])])
    return result


def memory_run(name, who, tiny):
    return throughput.run_memory_child(__file__, dict(row=name, who=who, tiny=tiny))['peak_increase_mib']


def memory_child(spec):
    """Peak RSS increase (MiB) over two training steps of one wrapper, from a state with both wrappers (and the
    paper's step of SAME_WORK's rows), their optimisers and the inputs built (so that ours and the reference start
    from the same allocator state), the peak reset (/proc/self/clear_refs) after building: loading and checking do
    not count."""
    torch.set_num_threads(1)
    ours, theirs, _ = build_row(spec['row'], spec['tiny'], probe=False)
    step = dict(ours=ours, reference=theirs, paper=ours.paper)[spec['who']]
    def two_steps():
        for _ in range(2):
            step.train(BATCH)

    return throughput.peak_increase_mib(two_steps)


# report


def ratio_cell(row, key):
    if key in row['ratios']:
        return throughput.spread(row['ratios'][key], '{:.2f}')
    if key == 'infer@8' and row['no_inference']:
        return f"- ({row['no_inference']})"
    return '-'


def memory_cell(memory, ratio, who):
    mib = ' / '.join(f"{memory[w]['median']:.0f}" for w in (who, 'reference') if w in memory) or '-'
    if ratio:
        mib += f" = {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})"
    return mib


def reference_cell(name, row):
    """What the reference is: missing (why), another function, and for SAME_WORK's rows what ours times and the
    paper's step's ratios (training speed, memory)."""
    cell = row['reference_missing'] or f'`{name}`' + (
        f" (another function: {row['different_function']})" if row['different_function'] else '')
    if row.get('same_work'):
        paper = row['paper']
        train = throughput.spread(paper['ratios']['train@8'], '{:.2f}') if 'train@8' in paper['ratios'] else '-'
        cell += (f"; like for like, ours is {row['same_work']}; the paper's step ({paper['work']}): train@8 {train}, "
                 f"train MiB {memory_cell(row['memory'], paper['memory_ratio'], 'paper')}")
    return cell


def markdown(results):
    lines = ['| wrapper | configuration | vit-pytorch 1.26.14 | infer@8 | train@8 | train MiB, ours / vit-pytorch | '
             'ours samples/s (infer@8, train@8) |', '|---|---|---|---|---|---|---|']
    for name, row in results['rows'].items():
        reference = reference_cell(name, row)
        mib = memory_cell(row['memory'], row['memory_ratio'], 'ours')
        ours = ', '.join(f"{row['speed'][k]['ours']['median']:.2f}" if k in row['speed'] else '-'
                         for k in ('infer@8', 'train@8'))
        cells = [f'`{name}`', row['config'], reference, ratio_cell(row, 'infer@8'), ratio_cell(row, 'train@8'), mib,
                 ours]
        lines.append('| ' + ' | '.join(str(c).replace('|', '/') for c in cells) + ' |')
    return '\n'.join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rows', default=','.join(ROW_NAMES), help=f'comma-separated, of {ROW_NAMES}')
    parser.add_argument('--rounds', type=int, default=3, help='interleaved rounds')
    parser.add_argument('--seconds', type=float, default=0.25, help='target length of one timing (at least a step)')
    parser.add_argument('--memory', type=int, default=3, help='fresh-process memory runs of each wrapper (0: none)')
    parser.add_argument('--tiny', action='store_true', help='every row at a few milliseconds a step (for tests)')
    parser.add_argument('--json', help='write the results to this file')
    parser.add_argument('--merge', metavar='TABLE_JSON',
                        help="put the measured rows into this table (docs/wrapper-table.json), each with a "
                             "'remeasured' record of this run (command, date, machine, load); the table's other rows "
                             "and its top-level fields are kept; the merged table's markdown is printed")
    parser.add_argument('--note', default='', help="the 'remeasured' records' note (what was measured, where)")
    parser.add_argument('--memory-child', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.rows = [r for r in args.rows.split(',') if r]
    for name in args.rows:
        if name not in BUILDERS:
            parser.error(f'unknown row {name!r}; choose from {ROW_NAMES}')
    return args


def main(argv=None, log=None):
    args = parse_args(argv)
    if args.memory_child:
        print(json.dumps(dict(peak_increase_mib=memory_child(json.loads(args.memory_child)))))
        return None
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    clock, throughput.CLOCK = throughput.CLOCK, time.process_time        # CPU time of this process
    try:
        results = dict(command=shlex.join(['python', 'benchmarks/wrapper_steps.py'] + (sys.argv[1:] if argv is None
                                                                                       else list(argv))),
                       date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                       machine=throughput.machine(1, 'cpu'), load_average=dict(start=os.getloadavg()),
                       rounds=args.rounds, memory_runs=args.memory, rows={})
        for name in args.rows:
            results['rows'][name] = measure_row(name, args, log)
        results['load_average']['end'] = os.getloadavg()
    finally:
        throughput.CLOCK = clock
        torch.set_num_threads(threads)
    m = results['machine']
    print(f"{results['date']}; {m['cpu']}, 1 thread, CPU time, torch {m['torch']}, CPU capability "
          f"{m['cpu_capability']}; load average (1 min) {results['load_average']['start'][0]:.2f} -> "
          f"{results['load_average']['end'][0]:.2f}; {args.rounds} rounds, {args.memory} memory run(s) each")
    print(markdown(results))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=1)
    if args.merge:
        with open(args.merge) as f:
            table = merge(json.load(f), results, args.note)
        with open(args.merge, 'w') as f:
            json.dump(table, f, indent=1)
            f.write('\n')
        print(f'\nmerged into {args.merge}:')
        print(markdown(table))
    return results


def merge(table, results, note):
    """`table` (a full run's results) with `results`' rows put in place of its rows of those names (new rows after
    the others), each with a 'remeasured' record of `results`' run; its other rows and top-level fields kept."""
    record = {key: results[key] for key in ('command', 'date', 'machine', 'load_average', 'rounds', 'memory_runs')}
    rows = dict(table['rows'])
    for name, row in results['rows'].items():
        rows[name] = dict(row, remeasured=dict(record, note=note))
    return dict(table, rows=rows)


if __name__ == '__main__':
    main()
