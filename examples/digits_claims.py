"""Papers' training claims checked on the digits: the short runs of docs/tokens.md and docs/blocks.md.

    python examples/digits_claims.py patch_merger --seeds 0 1 2 3 4 --epochs 30 --out runs/claims_patch_merger
    python examples/digits_claims.py decorr --seeds 0 1 2 3 4 --epochs 10 --out runs/claims_decorr
    python examples/digits_claims.py residuals --seeds 0 1 2 3 4 --epochs 30 --out runs/claims_residuals
    python examples/digits_claims.py tokens2 --seeds 0 1 2 3 4 --epochs 10 --out runs/claims_tokens2
    python examples/digits_claims.py tokens2 --seeds 0 1 2 3 4 --epochs 30 --out runs/claims30_tokens2
    python examples/digits_claims.py blocks2 --seeds 0 1 2 3 4 --epochs 10 --out runs/claims_blocks2
    python examples/digits_claims.py blocks2 --seeds 0 1 2 3 4 --epochs 30 --out runs/claims30_blocks2
    python examples/digits_claims.py orthog --seeds 0 1 2 3 4 --epochs 10 --out runs/claims_orthog
    python examples/digits_claims.py blocks3 --seeds 0 1 2 3 4 --epochs 10 --out runs/claims_blocks3
    python examples/digits_claims.py blocks3 --seeds 0 1 2 3 4 --epochs 30 --out runs/claims30_blocks3
    python examples/digits_claims.py detpool --seeds 0 1 2 3 4 --epochs 10 --out runs/claims_detpool
    python examples/digits_claims.py detpool --seeds 0 1 2 3 4 --epochs 30 --out runs/claims30_detpool
    python examples/digits_claims.py attnres_blocks --seeds 0 1 2 3 4 --epochs 10 --out runs/claims_attnres_blocks

On scikit-learn's digits at 16 pixels (the training command's data and split, 1,347 training and 450 test images),
with the training command's recipe and epoch loop (`vit_pytorch.training.trials.fit`, the setup of
examples/ats_tokens.py), each seed trains every model of the claim from the same seed and tests it on the 450 test
digits after every epoch. The models are the trainer's small ones (patch 4, so 16 patch tokens; width 64, depth 4,
4 heads of 16, MLP 128):

  patch_merger  "Learning to Merge Tokens in Vision Transformers" (arXiv 2202.12015): fewer tokens at nearly the
                accuracy. A ViT with mean pooling and no cls token (`vit`, pool='mean', patch_norm=True: the layout of
                vit-pytorch's `vit_with_patch_merger`) against the same ViT merging its 16 tokens into K = 8 and
                K = 4 after layer 2 of 4 (halfway, as the paper).
  decorr        "Decorrelation Speeds Up Vision Transformers" (arXiv 2510.14657): faster convergence. vit-pytorch's
                `vit_with_decorr` (the decorrelation objective as an auxiliary loss, no decorrelation matrix) at
                weight 0 and 0.1 (the training command's default, vit-pytorch's example's), and the paper's method
                (`decorr_matrices=True`: a decorrelation matrix before every Linear of the encoder, stepped by its
                own rule after every optimizer step; no auxiliary loss) at the rule's learning rate 1e-4 (decorbp's
                default) and 1e-2, over a short budget; and decorbp's 'normalized' rule (its decorrelation step
                divided by d - 1) at 1e-2 and at 0.63 = 1e-2 x 63 (the standard rule's step at 1e-2 for the
                inputs of width 64), each paired with weight 0 (the table) and with the standard rule at 1e-2.
  residuals     value residuals ("Value Residual Learning", arXiv 2410.17897) and hyper-connections
                ("Hyper-Connections", arXiv 2409.19606): better or faster training at about the same compute.
                `simple_vit` against `simple_vit_with_value_residual` (learned mix, vit-pytorch's default) and
                `simple_vit_with_hyper_connections` (4 streams, no registers, so that only the residuals differ).
  tokens2       token layouts against `simple_vit` (mean pooling, 16 tokens): the specialized cls token
                ("Revisiting [CLS] and Patch Token Interaction", arXiv 2602.08626: better) against the same model with
                each specialized pair tied (SimpleViT with a cls token); the Jumbo CLS token (arXiv 2502.15021: better
                at nearly the same cost; K = 2 with vit-pytorch's jumbo MLP x2, +19% forward FLOPs here, the nearest
                to the +12.6% of Jumbo-S/16 over its SimpleViT at 224 pixels, counted alike); LookupViT
                (arXiv 2407.12753: the accuracy at fewer FLOPs; 4 compressed tokens of 8x8 pixels read 16 lookup
                tokens of 4x4, heavy MLP x2 as SimpleViT's, light MLP x1), beside SimpleViT on patches of 8 (its 4
                tokens alone); JetViT (arXiv 2605.26636: the accuracy at a cheaper attention)
                with linear or 2x2 window attention in every layer against its own full attention (a ViT with mean
                pooling and the patch projection between LayerNorms), trained so from the start (the paper searches
                after training a full-attention model).
  blocks2       residual streams and blocks against `simple_vit`: orthogonal residual updates (arXiv 2505.11881:
                more stable, faster), attention residuals (arXiv 2603.15031: better), AttnRes with DeepCrossAttention
                (arXiv 2502.06785: better), gated attention (arXiv 2505.06708: better, more stable; no registers, with
                and without vit-pytorch's sparsity loss at the training command's weight), U-ViT's long skips
                (arXiv 2209.12152, a diffusion backbone: only a stand-in check that the skips do not hurt a
                classifier; no registers); and LocalViT (arXiv 2104.05707: locality helps, most on small data)
                against the ViT it modifies (`vit`, cls token).
  orthog        orthogonal residual updates (arXiv 2505.11881: more stable, faster) per token (`feature`, the
                paper's ViT update and vit-pytorch's) against `simple_vit`, and per image (`global`, the official
                code's other option: one projection over all the tokens and channels of an image) against them.
  blocks3       modern and normalized blocks against the ViT they modify (`vit`, cls token): ViT-5 (arXiv
                2602.08071: a better modern block; `vit_5`), RvT (rotary positions, RoFormer's RoPE, arXiv
                2104.09864, made axial, in place of the position table, with vit-pytorch's depthwise-convolution
                queries and GEGLU; `rvt`), nViT, the nGPT block (arXiv 2410.01131: faster convergence, everything on
                the unit sphere; `normalized_vit`, its weights renormalised after every optimizer step by the
                epoch loop); and at depth 16, Keel (arXiv 2601.19895: a deep post-LN stack that trains, the
                residual weighted by alpha = the number of sub-layers, 32) against the same stack with
                `keel_residual_scale=1` (plain post-LN, each LN over x + F(LN(x))).
  detpool       DetPool (arXiv 2510.12866: an object-centric representation) on cluttered digits: each 16-pixel
                digit at a random place of a 24-pixel black canvas over 3 pieces (8x8 squares cut at random places)
                of other digits of its set, pasted at random places, the brighter pixel winning (`cluttered`); the
                digit's own pixels above 0.25 are its object mask, given as a second channel (so the training
                shifts move it with the image) that `vit_detpool` takes as `object_mask`, against the same model
                without it (a ViT with mean pooling; 36 patch tokens).
  attnres_blocks  Block AttnRes ("Attention Residuals", arXiv 2603.15031: most of Full AttnRes's gain over the
                plain residual at O(blocks) memory): `simple_vit` against `simple_vit_attn_residual` (Full AttnRes)
                and the same with `block_size` 2 and 4 (4 blocks of one layer, 2 blocks of two layers; 8 branches),
                each block model paired with Full AttnRes.

The table gives the test accuracy after given epochs (mean +- sample std over the seeds), the paired difference to
the first model of the same seed (or to the model `AGAINST` names; then to the one `ALSO_AGAINST` names), the
forward FLOPs per image counted by `vit_pytorch.flops.training_flops` (torch.utils.flop_counter; for the patch
merger also the formula `merger_flops`) and the parameters; for decorr also the test digits' decorrelation loss
(the model's auxiliary loss, of its blocks' normed inputs) and `linear_input_correlation` (of what every Linear of
the encoder multiplies, after its matrix where it has one).

Written to --out: results.json (one record per run, saved as each ends: the same command run again skips the runs
recorded, and refuses other settings in the same --out) and table.md.
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

from vit_pytorch.flops import training_flops
from vit_pytorch.training import loop, registry
from vit_pytorch.training.data import ImageSet, normalise
from vit_pytorch.training.trials import Results, fit, with_statistics
from vit_pytorch.vit_with_decorr import DecorrelatedLinear, Decorrelation


sys.path.insert(0, str(Path(__file__).parent))
import ats_tokens  # noqa: E402  its data and recipe (`digits_plan`), `spread`, `load_average` and `report`

DECORR_WEIGHT = 0.1
DECORR_MATRICES = dict(decorr_matrices=True)
NORMALIZED = dict(DECORR_MATRICES, decorr_matrices_method='normalized')
# decorbp's 'normalized' rule divides the decorrelation step by d - 1: at 1e-2 x 63 its step on the width-64 inputs
# (12 of the encoder's 17 Linears) is the standard rule's at 1e-2
NORMALIZED_LR = 0.63
SPARSITY_WEIGHT = 0.1          # the training command's default --sparsity-aux-loss-weight
TIED_CLS = 'SimpleViT with a cls token (tied)'
JET_FULL = 'JetViT, full attention (FA) in every layer'
POST_LN_16 = 'plain post-LN, depth 16 (Keel alpha = 1)'
ORTHOG_FEATURE = 'orthogonal updates per token (feature)'
CLUTTER_SIZE, CLUTTER_PIECES, PIECE_SIZE, INK = 24, 3, 8, 0.25

# claim -> [(label, registered name, options beyond the trainer's small configuration, training weight of the
# model's auxiliary loss or None)]; the first is the one the others are paired with
CLAIMS = {
    'patch_merger': [
        ('ViT, mean pooling', 'vit', dict(pool='mean', patch_norm=True), None),
        ('PatchMerger 16 -> 8 after layer 2', 'vit_with_patch_merger',
         dict(patch_merge_layer=2, patch_merge_num_tokens=8), None),
        ('PatchMerger 16 -> 4 after layer 2', 'vit_with_patch_merger',
         dict(patch_merge_layer=2, patch_merge_num_tokens=4), None),
    ],
    'decorr': [
        ('decorrelation weight 0', 'vit_with_decorr', {}, 0.0),
        (f'decorrelation weight {DECORR_WEIGHT}', 'vit_with_decorr', {}, DECORR_WEIGHT),
        ('decorrelation matrices, lr 1e-4', 'vit_with_decorr', dict(DECORR_MATRICES, decorr_matrices_lr=1e-4), 0.0),
        ('decorrelation matrices, lr 1e-2', 'vit_with_decorr', dict(DECORR_MATRICES, decorr_matrices_lr=1e-2), 0.0),
        ('normalized matrices, lr 1e-2', 'vit_with_decorr', dict(NORMALIZED, decorr_matrices_lr=1e-2), 0.0),
        (f'normalized matrices, lr {NORMALIZED_LR}', 'vit_with_decorr',
         dict(NORMALIZED, decorr_matrices_lr=NORMALIZED_LR), 0.0),
    ],
    'residuals': [
        ('SimpleViT', 'simple_vit', {}, None),
        ('value residual (learned mix)', 'simple_vit_with_value_residual', {}, None),
        ('hyper-connections (4 streams)', 'simple_vit_with_hyper_connections', dict(num_register_tokens=0), None),
    ],
    'tokens2': [
        ('SimpleViT', 'simple_vit', {}, None),
        (TIED_CLS, 'simple_vit_with_specialized_cls', {}, None),
        ('specialized cls token', 'simple_vit_with_specialized_cls', {}, None),
        ('Jumbo CLS, K = 2, jumbo MLP x2', 'jumbo_vit', dict(jumbo_cls_k=2, jumbo_ff_mult=2), None),
        ('SimpleViT, patches of 8 (4 tokens)', 'simple_vit', dict(patch_size=8), None),
        ('LookupViT, 4 compressed + 16 lookup tokens', 'look_vit', dict(mlp_factor=2, highres_mlp_factor=1), None),
        (JET_FULL, 'jet_vit', dict(window_size=2), None),
        ('JetViT, linear attention (LA) in every layer', 'jet_vit', dict(window_size=2, attn_layers=['LA'] * 4),
         None),
        ('JetViT, 2x2 window attention (WA) in every layer', 'jet_vit',
         dict(window_size=2, attn_layers=['WA'] * 4), None),
    ],
    'blocks2': [
        ('SimpleViT', 'simple_vit', {}, None),
        ('orthogonal residual updates', 'simple_vit_orthog_residual_update', {}, None),
        ('attention residuals (AttnRes)', 'simple_vit_attn_residual', {}, None),
        ('AttnRes with DCA (1 head group)', 'attn_residual_with_dca_simple_vit', {}, None),
        ('gated attention (G1), no registers', 'simple_vit_with_sparse_gating', dict(num_register_tokens=0), None),
        (f'gated attention, sparsity loss {SPARSITY_WEIGHT}', 'simple_vit_with_sparse_gating',
         dict(num_register_tokens=0), SPARSITY_WEIGHT),
        ('U-ViT long skips, no registers', 'simple_uvit', dict(num_register_tokens=0), None),
        ('ViT (cls token)', 'vit', {}, None),
        ('LocalViT', 'local_vit', {}, None),
    ],
    'orthog': [
        ('SimpleViT', 'simple_vit', {}, None),
        (ORTHOG_FEATURE, 'simple_vit_orthog_residual_update', {}, None),
        ('orthogonal updates per image (global)', 'simple_vit_orthog_residual_update',
         dict(orthog_residual_update_kwargs=dict(orthogonal_method='global')), None),
    ],
    'blocks3': [
        ('ViT (cls token)', 'vit', {}, None),
        ('ViT-5', 'vit_5', {}, None),
        ('RvT (rotary positions)', 'rvt', {}, None),
        ('nViT (nGPT block)', 'normalized_vit', {}, None),
        (POST_LN_16, 'vit_with_keel_post_ln', dict(depth=16, keel_residual_scale=1), None),
        ('Keel, depth 16', 'vit_with_keel_post_ln', dict(depth=16), None),
    ],
    'attnres_blocks': [
        ('SimpleViT', 'simple_vit', {}, None),
        ('Full AttnRes', 'simple_vit_attn_residual', {}, None),
        ('Block AttnRes, 4 blocks of 2 branches', 'simple_vit_attn_residual', dict(block_size=2), None),
        ('Block AttnRes, 2 blocks of 4 branches', 'simple_vit_attn_residual', dict(block_size=4), None),
    ],
    'detpool': [
        ('ViT, mean pooling, no mask', 'vit_detpool', dict(channels=1), None),
        ("DetPool, the digit's mask", 'vit_detpool', dict(channels=1), None),
    ],
}

# the model each one is paired with, where it is not the claim's first
AGAINST = {
    'specialized cls token': TIED_CLS,
    'JetViT, linear attention (LA) in every layer': JET_FULL,
    'JetViT, 2x2 window attention (WA) in every layer': JET_FULL,
    'LocalViT': 'ViT (cls token)',
    'Keel, depth 16': POST_LN_16,
    'orthogonal updates per image (global)': ORTHOG_FEATURE,
    'Block AttnRes, 4 blocks of 2 branches': 'Full AttnRes',
    'Block AttnRes, 2 blocks of 4 branches': 'Full AttnRes',
}

# the model each one is paired with as well (a second paired difference in the same cell)
ALSO_AGAINST = {
    'normalized matrices, lr 1e-2': 'decorrelation matrices, lr 1e-2',
    f'normalized matrices, lr {NORMALIZED_LR}': 'decorrelation matrices, lr 1e-2',
}


def merger_flops(*, image_size, patch_size, channels, num_classes, dim, depth, heads, dim_head, mlp_dim,
                 patch_merge_layer=None, patch_merge_num_tokens=None, **_):
    """Multiply-adds x 2 of one image's forward pass through a ViT of mean pooling (square images), merging its
    tokens into `patch_merge_num_tokens` after layer `patch_merge_layer` (None: no merge): the merge is one head
    of width `dim`, K queries over the n normed tokens (scores, then the weighted sum). Norms, softmax, the patch
    norms and the mean are not counted (nor does the counter)."""
    n = (image_size // patch_size) ** 2
    inner = heads * dim_head
    flops = 2 * n * (channels * patch_size ** 2) * dim                       # patch projection
    for layer in range(1, depth + 1):
        flops += 2 * n * dim * 3 * inner + 2 * 2 * heads * n * n * dim_head  # q, k, v; q k^T and attention @ v
        flops += 2 * n * inner * dim + 2 * 2 * n * dim * mlp_dim             # output projection, MLP
        if layer == patch_merge_layer:
            flops += 2 * 2 * patch_merge_num_tokens * n * dim                 # the merge: scores, weighted sum
            n = patch_merge_num_tokens
    return flops + 2 * dim * num_classes                                     # the head


def tied_cls(model):
    """A `simple_vit_with_specialized_cls` model with each specialized pair tied (the cls token's LayerNorm or
    projection is the patches'): SimpleViT with a cls token that classifies, the specialization's control."""
    from vit_pytorch.simple_vit_with_specialized_cls import Specialized
    for module in model.modules():
        if isinstance(module, Specialized):
            module.fns[0] = module.fns[1]
    return model


class MaskChannel(nn.Module):
    """A model of one-channel images, fed two channels: the image, then its object mask (1 on the object, 0 off
    it, normalised with the image by the training images' statistics, so that a shift moves both alike). With
    `use_mask` the mask goes on as `object_mask`, else it is dropped."""

    def __init__(self, model, threshold, use_mask):
        super().__init__()
        self.model, self.threshold, self.use_mask = model, threshold, use_mask

    def forward(self, images):
        object_mask = images[:, 1] > self.threshold if self.use_mask else None
        return self.model(images[:, :1], object_mask=object_mask)


def mask_threshold(data):
    """The mask channel's 0.5 after normalisation."""
    return (0.5 - data.mean[1]) / data.std[1]


# label -> function(model, data) that makes the trained model of the one built
WRAPS = {
    TIED_CLS: lambda model, data: tied_cls(model),
    'ViT, mean pooling, no mask': lambda model, data: MaskChannel(model, mask_threshold(data), use_mask=False),
    "DetPool, the digit's mask": lambda model, data: MaskChannel(model, mask_threshold(data), use_mask=True),
}


def cluttered(images, generator):
    """Two-channel images (n, 2, CLUTTER_SIZE, CLUTTER_SIZE) of one-channel `images` (n, 1, s, s) in [0, 1]: each
    at a random place on a black canvas over CLUTTER_PIECES pieces of other images of the set (PIECE_SIZE squares
    cut at random places, pasted at random places), the brighter pixel winning; then the mask of the image's own
    ink (pixels above INK) at its place."""
    count, _, side, _ = images.shape
    canvas = torch.zeros(count, 2, CLUTTER_SIZE, CLUTTER_SIZE)
    for index in range(count):
        for _ in range(CLUTTER_PIECES):
            other = (index + torch.randint(1, count, (), generator=generator).item()) % count
            y, x = torch.randint(0, side - PIECE_SIZE + 1, (2,), generator=generator).tolist()
            top, left = torch.randint(0, CLUTTER_SIZE - PIECE_SIZE + 1, (2,), generator=generator).tolist()
            window = canvas[index, 0, top:top + PIECE_SIZE, left:left + PIECE_SIZE]
            window.copy_(torch.maximum(window, images[other, 0, y:y + PIECE_SIZE, x:x + PIECE_SIZE]))
        top, left = torch.randint(0, CLUTTER_SIZE - side + 1, (2,), generator=generator).tolist()
        window = canvas[index, 0, top:top + side, left:left + side]
        window.copy_(torch.maximum(window, images[index, 0]))
        canvas[index, 1, top:top + side, left:left + side] = (images[index, 0] > INK).float()
    return canvas


def cluttered_data(data):
    """The digits on cluttered canvases (`cluttered`), the training set's drawn with seed 0, the test set's
    (whose clutter comes from test digits) with seed 1."""
    sets = [ImageSet(cluttered(part.floats(), torch.Generator().manual_seed(seed)), part.labels, part.classes)
            for seed, part in enumerate((data.train, data.test))]
    return with_statistics(*sets)


# claim -> function(data) that gives its data, where it is not the 16-pixel digits
CLAIM_DATA = {'detpool': cluttered_data}


def claim_data(claim, data):
    return CLAIM_DATA[claim](data) if claim in CLAIM_DATA else data


def build(label, name, config, seed, data):
    torch.manual_seed(seed)
    model = registry.build_model(name, **config)
    return WRAPS[label](model, data) if label in WRAPS else model


def configs(claim, data):
    return [registry.model_config(name, options, image_size=data.image_size, channels=data.channels,
                                  num_classes=data.num_classes) for _, name, options, _ in CLAIMS[claim]]


def run(label, name, config, weight, data, plan, seed):
    """Train one model; its record: the last epoch's test accuracy and loss, the test accuracy after every epoch,
    and for the decorrelation model the mean decorrelation loss of the test digits' layer inputs."""
    model = build(label, name, config, seed, data)
    curve = []

    def after_epoch(epoch, model):
        curve.append(loop.evaluate(model, data.test, mean=data.mean, std=data.std)['accuracy'])

    aux = None if not weight else (registry.AUX_LOSSES[name][0], weight)
    record = fit(model, data, plan, seed=seed, device='cpu', title=f'seed {seed} {label}', aux_loss=aux,
                 after_epoch=after_epoch)
    record['curve'] = curve
    if name == 'vit_with_decorr':
        images = normalise(data.test.floats(), data.mean, data.std)
        with torch.no_grad():
            record['test_decorr_loss'] = model.eval()(images, return_decorr_aux_loss=True)[1].item()
        record['test_linear_input_correlation'] = linear_input_correlation(model, images)
    return record


def linear_input_correlation(model, images):
    """How correlated the inputs of the encoder's Linears are on `images`: for each Linear of the patch projection
    and the layers (not the head), after its decorrelation matrix where it has one, the mean squared off-diagonal
    entry of the second moment Z^T Z / N of its N input rows (what the matrices' rule drives to 0); the mean over
    those Linears. Eval mode, no gradient."""
    seen = []

    def keep(_module, inputs, output):
        rows = (output if isinstance(_module, Decorrelation) else inputs[0]).flatten(0, -2).double()
        second = rows.T @ rows / len(rows)
        seen.append(second[~torch.eye(len(second), dtype=torch.bool)].pow(2).mean().item())

    linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)
               and module is not model.mlp_head]
    hooks = [module.decorrelation.register_forward_hook(keep) if isinstance(module, DecorrelatedLinear) else
             module.register_forward_hook(keep) for module in linears]
    try:
        with torch.no_grad():
            model.eval()(images)
    finally:
        for hook in hooks:
            hook.remove()
    return statistics.mean(seen)


def shown_epochs(epochs):
    """The epochs the table shows: 1, 2, 5, a quarter, half and all of them (those within the run)."""
    return sorted({epoch for epoch in (1, 2, 5, epochs // 4, epochs // 2, epochs) if 1 <= epoch <= epochs})


def table(claim, results, data, seeds, epochs):
    """The table's markdown lines from the records of `seeds`."""
    models = CLAIMS[claim]
    records = [{run['seed']: run for run in results.runs if run['setting'] == label} for label, *_ in models]
    shown = shown_epochs(epochs)
    header = ['model', *(f'test accuracy, epoch {epoch}' for epoch in shown),
              f'paired difference, epoch {epochs}', 'forward MFLOPs / image', 'parameters']
    if claim == 'decorr':
        header += ['test decorrelation loss', "test correlation of the Linears' inputs"]
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    first = {label: index for index, (label, *_) in enumerate(models)}
    for index, ((label, name, _, _), config, by_seed) in enumerate(zip(models, configs(claim, data), records)):
        against = records[first[AGAINST.get(label, models[0][0])]]
        cells = [label]
        for epoch in shown:
            cells.append('{:.2f} +- {:.2f}%'.format(*ats_tokens.spread([by_seed[seed]['curve'][epoch - 1]
                                                                        for seed in seeds])))
        differences = [by_seed[seed]['test_accuracy'] - against[seed]['test_accuracy'] for seed in seeds]
        cells.append('' if index == 0 else '{:+.2f} +- {:.2f} points'.format(*ats_tokens.spread(differences))
                     + (f' (vs {AGAINST[label]})' if label in AGAINST else ''))
        if label in ALSO_AGAINST:
            also = records[first[ALSO_AGAINST[label]]]
            cells[-1] += '; {:+.2f} +- {:.2f} points'.format(*ats_tokens.spread(
                [by_seed[seed]['test_accuracy'] - also[seed]['test_accuracy'] for seed in seeds]))
            cells[-1] += f' (vs {ALSO_AGAINST[label]})'
        model = build(label, name, config, 0, data)
        counted = training_flops(model, data.image_size, channels=data.channels, num_classes=data.num_classes)[1]
        flops = f'{counted / 1e6:.2f}'
        if claim == 'patch_merger':
            flops += f' (formula {merger_flops(**config) / 1e6:.2f})'
        cells += [flops, f'{sum(parameter.numel() for parameter in model.parameters()):,}']
        if claim == 'decorr':
            cells += ['{:.4f} +- {:.4f}'.format(*statistics_of([by_seed[seed][key] for seed in seeds]))
                      for key in ('test_decorr_loss', 'test_linear_input_correlation')]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return lines


def statistics_of(values):
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('claim', choices=sorted(CLAIMS))
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--epochs', type=int, default=30)
    parser.add_argument('--out', type=Path, default=None, help='default: runs/claims_<claim>')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--quiet', action='store_true', help="no progress bars")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = args.out or Path(f'runs/claims_{args.claim}')

    data, recipe, plan = ats_tokens.digits_plan(args.epochs, args.quiet)
    data = claim_data(args.claim, data)
    settings = dict(epochs=args.epochs, recipe=recipe, models=[[label, name, options, weight] for label, name,
                                                               options, weight in CLAIMS[args.claim]],
                    configs=configs(args.claim, data))
    if args.claim in CLAIM_DATA:
        settings['data'] = dict(image_size=CLUTTER_SIZE, pieces=CLUTTER_PIECES, piece_size=PIECE_SIZE, ink=INK)
    results = Results(out, f'digits_claims {args.claim}', settings)
    if results.differences:
        raise SystemExit(f"{out} holds runs of other settings: {'; '.join(results.differences)}; use another --out")

    started = ats_tokens.clock()
    for seed in args.seeds:
        for (label, name, _, weight), config in zip(CLAIMS[args.claim], configs(args.claim, data)):
            results.run(dict(seed=seed, setting=label),
                        lambda: run(label, name, config, weight, data, plan, seed),
                        quiet=args.quiet, label=f'seed {seed} {label}')
    return ats_tokens.report(table(args.claim, results, data, args.seeds, args.epochs), out, started)


if __name__ == '__main__':
    main()
