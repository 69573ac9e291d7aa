"""MPP: masked patch prediction, the ViT paper's self-supervised objective.

"An Image is Worth 16x16 Words", Dosovitskiy et al., arXiv 2010.11929, appendix B.1.2: corrupt
50 % of the patch embeddings, each by the learned mask token (80 % of them), by another random
patch's embedding (10 %) or not at all (10 %), as BERT does with words; then predict, from the
encoder's output at each corrupted position, the patch's mean colour with 3 bits per channel (512
classes for RGB) by cross-entropy.

    import torch
    from vit_pytorch import ViT
    from vit_pytorch.mpp import MPP

    model = ViT(image_size=32, patch_size=4, num_classes=10, dim=64, depth=4, heads=4, mlp_dim=128)
    mpp_trainer = MPP.paper(model)                  # the paper's 50 % / 80-10-10 % / 3 bits
    images = torch.rand(8, 3, 32, 32)                               # pixel values in [0, max_pixel_val]
    loss = mpp_trainer(images)
    loss.backward()

The model is used only through its public face (`patch_tokens`, `embed_tokens`, `transformer`,
`token_grid`, `num_prefix_tokens`, `patch_size`, `channels`, `embed_dim`), the same for `ViT` and
`SimpleViT`; it works with the variants that keep that face (registers, QK-norm, DeiT's
distillable ViT, DeepViT, the parallel ViT), not with patch dropout while training.

vit-pytorch's arguments are kept: `transformer`, `patch_size`, `dim`, `channels` (these three
must agree with the model, which knows them, so they may be left out), `output_channel_bits`,
`max_pixel_val`, `mask_prob` (the fraction corrupted: exactly ceil(mask_prob * n) patches of
each image), `replace_prob` (of those, the fraction given the mask token), `random_patch_prob`
(the fraction given another patch), and `mean`/`std` (undo a normalisation of the images
before the targets are computed), in vit-pytorch's positional order and with its defaults (15 %
corrupted, 50 % of them by the mask token, 50 % by another patch, none left unchanged);
`MPP.paper(transformer, ...)` has the paper's (`MPP_PAPER`: 50 %, 80 %, 10 %). Differences: the corruption replaces patch embeddings, as the paper says, not raw
pixels; a random patch comes from any image of the batch; and the proportions are exact
in expectation (vit-pytorch's mask token overwrites some of its random patches).
"""

import math

import torch
import torch.nn.functional as F
from einops import reduce
from torch import nn

from vit_pytorch import vit


# the paper's corruption (appendix B.1.2): half of the patches, 80 % of them masked, 10 % another patch
MPP_PAPER = dict(mask_prob=0.5, replace_prob=0.8, random_patch_prob=0.1)


class MPPLoss(nn.Module):
    """`forward(predicted_patches, target, mask)`: the cross-entropy of the mean-colour classes at the masked patches.

    vit-pytorch's loss block, with its arguments: `predicted_patches` (b, n, 2 ** (bits * channels)) logits,
    `target` the images (b, channels, h, w) (normalised by `mean`/`std`, when given, which are undone),
    `mask` (b, n) True at the patches to predict. A patch's class is its mean colour per channel in
    2 ** output_channel_bits equal bins of [0, max_pixel_val], channel 0 the lowest digit.
    """

    def __init__(self, patch_size, channels, output_channel_bits, max_pixel_val, mean, std):
        super().__init__()
        self.patch_size = vit.positive_pair('patch_size', patch_size)
        self.channels = vit.positive_int('channels', channels)
        self.output_channel_bits = vit.positive_int('output_channel_bits', output_channel_bits)
        self.max_pixel_val = vit.positive_float('max_pixel_val', max_pixel_val)
        if (mean is None) != (std is None):
            raise ValueError("mean and std go together: give both (the images' normalisation) or neither")
        if mean is None:
            self.mean = self.std = None
        else:
            vit.per_channel('mean', mean, channels)
            vit.per_channel('std', std, channels, positive=True)
            self.register_buffer('mean', torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1), persistent=False)
            self.register_buffer('std', torch.tensor(std, dtype=torch.float32).view(-1, 1, 1), persistent=False)

    def target(self, img):
        """Each patch's class (b, n)."""
        if self.mean is not None:
            img = img * self.std + self.mean
        ph, pw = self.patch_size
        colour = reduce(img.clamp(0, self.max_pixel_val), 'b c (h p1) (w p2) -> b (h w) c', 'mean', p1=ph, p2=pw)
        levels = 2 ** self.output_channel_bits
        edges = torch.arange(1, levels, device=img.device) * (self.max_pixel_val / levels)
        bins = torch.bucketize(colour.contiguous(), edges)                            # (b, n, c), 0 .. levels - 1
        return (bins * levels ** torch.arange(img.shape[1], device=img.device)).sum(dim=-1)

    def forward(self, predicted_patches, target, mask):
        return F.cross_entropy(predicted_patches[mask], self.target(target)[mask])


class MPP(nn.Module):
    """`forward(img)` returns the cross-entropy of the mean-colour classes at the corrupted patches."""

    def __init__(self, transformer, patch_size=None, dim=None, output_channel_bits=3, channels=None,
                 max_pixel_val=1.0, mask_prob=0.15, replace_prob=0.5, random_patch_prob=0.5, mean=None, std=None):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.transformer = transformer
        self.output_channel_bits = output_channel_bits
        self.max_pixel_val = float(max_pixel_val)
        self.mask_prob, self.replace_prob, self.random_patch_prob = mask_prob, replace_prob, random_patch_prob
        self.loss = MPPLoss(transformer.patch_size, transformer.channels, output_channel_bits, max_pixel_val,
                            mean, std)
        self.mask_token = nn.Parameter(torch.zeros(transformer.embed_dim))
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        self.to_bits = nn.Linear(transformer.embed_dim, 2 ** (output_channel_bits * transformer.channels))

    def corrupt(self, patches):
        """(corrupted tokens (b, n, d), chosen (b, n)): ceil(mask_prob * n) chosen patches of each image, each
        given the mask token (replace_prob), another patch of the batch (random_patch_prob) or left as it is."""
        batch_size, num_patches, _ = patches.shape
        num_chosen = math.ceil(self.mask_prob * num_patches)
        order = torch.rand(batch_size, num_patches, device=patches.device).argsort(dim=1)
        chosen = torch.zeros(batch_size, num_patches, dtype=torch.bool, device=patches.device).scatter(
            1, order[:, :num_chosen], True)
        fate = torch.rand(batch_size, num_patches, device=patches.device)
        masked = chosen & (fate < self.replace_prob)
        randomised = chosen & (fate >= self.replace_prob) & (fate < self.replace_prob + self.random_patch_prob)
        pool = patches.flatten(0, 1)                                                   # every patch of the batch
        random_patches = pool[torch.randint(len(pool), (batch_size, num_patches), device=patches.device)]
        corrupted = torch.where(randomised[..., None], random_patches, patches)
        return torch.where(masked[..., None], self.mask_token.to(patches.dtype), corrupted), chosen

    @classmethod
    def paper(cls, transformer, **overrides):
        """MPP with the paper's proportions (`MPP_PAPER`); other arguments as for `MPP`."""
        return cls(transformer, **{**MPP_PAPER, **overrides})

    def target(self, img):
        """Each patch's class (b, n): its mean colour per channel in 2**bits bins, channel 0 the lowest digit."""
        return self.loss.target(img)

    def forward(self, img):
        model, prefix = self.transformer, self.transformer.num_prefix_tokens
        patches = model.patch_tokens(img)
        corrupted, chosen = self.corrupt(patches)
        tokens = model.embed_tokens(corrupted, model.token_grid(img.shape[-2:]))
        if tokens.shape[1] != prefix + patches.shape[1]:
            raise ValueError(f"the model's embed_tokens returned {tokens.shape[1]} tokens for {prefix} prefix tokens "
                             f"and {patches.shape[1]} patches (does it drop patches in training, as patch dropout "
                             f"does?); MPP predicts every corrupted patch from its own token")
        logits = self.to_bits(model.transformer(tokens)[:, prefix:])                   # (b, n, classes)
        return self.loss(logits, img, chosen)


# argument checks

FACE = ('patch_tokens', 'embed_tokens', 'transformer', 'token_grid', 'num_prefix_tokens', 'patch_size', 'channels',
        'embed_dim')


def check_arguments(*, transformer, patch_size, dim, output_channel_bits, channels, max_pixel_val, mask_prob,
                    replace_prob, random_patch_prob, mean, std):
    missing = [attribute for attribute in FACE if not hasattr(transformer, attribute)]
    if missing:
        raise TypeError(f"transformer must be a ViT or SimpleViT (or a variant with their public face); "
                        f"{type(transformer).__name__} has no {', '.join(missing)}")
    for name, given, actual in [('patch_size', patch_size, transformer.patch_size), ('dim', dim, transformer.embed_dim),
                                ('channels', channels, transformer.channels)]:
        if given is not None and (vit.pair(given) if name == 'patch_size' else given) != actual:
            raise ValueError(f"{name}={given!r} disagrees with the transformer's {actual!r}; leave it out")
    vit.positive_int('output_channel_bits', output_channel_bits)
    if output_channel_bits * transformer.channels > 16:
        raise ValueError(f"output_channel_bits={output_channel_bits} for {transformer.channels} channels gives "
                         f"2**{output_channel_bits * transformer.channels} classes; use fewer bits")
    vit.positive_float('max_pixel_val', max_pixel_val)
    if vit.probability('mask_prob', mask_prob) == 0:
        raise ValueError("mask_prob must be in (0, 1): the fraction of patches corrupted and predicted, got 0")
    for name, value in dict(replace_prob=replace_prob, random_patch_prob=random_patch_prob).items():
        vit.fraction(name, value, ' (a probability)')
    if replace_prob + random_patch_prob > 1:
        raise ValueError(f"replace_prob + random_patch_prob must be at most 1 (the rest stay unchanged), "
                         f"got {replace_prob} + {random_patch_prob}")
    # mean and std are MPPLoss's to check
