"""MobileViT: a light-weight, general-purpose, mobile-friendly vision transformer.

"MobileViT: Light-weight, General-purpose, and Mobile-friendly Vision Transformer", Mehta and
Rastegari, arXiv 2110.02178: a MobileNetV2 whose last three stages each end in a MobileViT
block. The block models local structure with a 3x3 convolution, projects to the transformer's
width, cuts the map into p x p patches and lets the pixels at the same position of every patch
attend to each other (global structure), folds the result back, projects it and fuses it with
the block's input by another 3x3 convolution: convolutions that see the whole image.

    import torch
    from vit_pytorch.mobile_vit import MobileViT, mobilevit_xxs

    model = MobileViT(image_size=(256, 256), dims=[96, 120, 144],
                      channels=[16, 32, 48, 48, 64, 64, 80, 80, 96, 96, 384], num_classes=1000)
    logits = model(torch.randn(1, 3, 256, 256))   # (1, 1000); MobileViT-XS, 2,317,848 parameters

    paper_model = mobilevit_xxs()                 # MobileViT-XXS, 1,272,024 parameters

`channels` lists the widths: the stem, the first inverted residual, the two of the second stage,
then for each MobileViT stage the inverted residual's and the MobileViT block's, and last the
final 1x1 convolution's. The architecture is the official one (apple/ml-cvnets, as timm's
`mobilevit_*` hold it; their checkpoints load with `vit_pytorch.pretrained.load_timm`).
vit-pytorch's MobileViT takes the same keyword arguments but computes another function (see
`vit_pytorch_plan`), so its checkpoints are refused with what differs. Any image size works: a
map whose sides the patch size does not divide is resized (bilinear) to the next multiple
around the transformer and back, as in the reference; `image_size` is checked and kept for
vit-pytorch's signature only. vit-pytorch reads the input channels as 3; here `in_chans` (timm's name,
under which the training command passes the data's channels).
"""

import math

import torch
import torch.nn.functional as F
from einops import rearrange, reduce
from torch import nn

from vit_pytorch import vit

NORM_EPS = 1e-5

# helpers


class FeedForward(vit.FeedForward):
    """vit-pytorch's mobile_vit.FeedForward(dim, hidden_dim, dropout=0.): the core MLP with SiLU."""

    def __init__(self, dim, hidden_dim, dropout=0.):
        super().__init__(dim, hidden_dim, dropout, activation=nn.SiLU())



def conv_bn_act(dim_in, dim_out, kernel_size=1, stride=1, *, groups=1):
    """Convolution without bias, BatchNorm, SiLU."""
    return nn.Sequential(
        nn.Conv2d(dim_in, dim_out, kernel_size, stride, padding=kernel_size // 2, groups=groups, bias=False),
        nn.BatchNorm2d(dim_out, eps=NORM_EPS),
        nn.SiLU(),
    )


# classes


class InvertedResidual(nn.Module):
    """MobileNetV2's block (arXiv 1801.04381): 1x1 expansion to `expansion * dim_in`, depthwise 3x3
    (with the stride), linear 1x1 projection; plus the input when the shapes agree."""

    def __init__(self, dim_in, dim_out, stride=1, expansion=4):
        super().__init__()
        hidden_dim = int(dim_in * expansion)
        self.net = nn.Sequential(
            *conv_bn_act(dim_in, hidden_dim),
            *conv_bn_act(hidden_dim, hidden_dim, 3, stride, groups=hidden_dim),
            nn.Conv2d(hidden_dim, dim_out, 1, bias=False),
            nn.BatchNorm2d(dim_out, eps=NORM_EPS),
        )
        self.residual = stride == 1 and dim_in == dim_out

    def forward(self, x):
        out = self.net(x)
        return out + x if self.residual else out


class MobileViTBlock(nn.Module):
    """Local 3x3 convolution, 1x1 projection to `dim`, a transformer across patches, projection back,
    and a 3x3 fusion with the input (section 3.1, Figure 1b). (b, dim_in, h, w) -> (b, dim_out, h, w).

    The transformer's sequences are the pixels at one position (i, j) of every p x p patch:
    (b * ph * pw, ceil(h / ph) * ceil(w / pw), dim), the patches in raster order. A map whose
    sides the patch does not divide is resized (bilinear) to the next multiple and back.
    """

    def __init__(self, dim_in, dim_out, dim, depth, *, heads=4, mlp_ratio=2., kernel_size=3, patch_size=(2, 2)):
        super().__init__()
        self.patch_size = patch_size
        self.conv_local = conv_bn_act(dim_in, dim_in, kernel_size)
        self.to_tokens = nn.Conv2d(dim_in, dim, 1, bias=False)
        dim_head = dim // heads
        self.transformer = vit.Stack([
            (vit.Attention(dim, heads, dim_head, qkv_bias=True, norm_eps=NORM_EPS,
                           to_out=nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(0.))),
             # vit-pytorch holds the MLP as a bare Sequential (keys 0, 1, 4)
             vit.FeedForward(dim, int(dim * mlp_ratio), norm_eps=NORM_EPS, activation=nn.SiLU()).net)
            for _ in range(depth)
        ], norm=nn.LayerNorm(dim, eps=NORM_EPS))
        self.to_channels = conv_bn_act(dim, dim_out)
        self.fusion = conv_bn_act(dim_in + dim_out, dim_out, kernel_size)

    def forward(self, x):
        shortcut = x
        x = self.to_tokens(self.conv_local(x))
        height, width = x.shape[-2:]
        ph, pw = self.patch_size
        size = (math.ceil(height / ph) * ph, math.ceil(width / pw) * pw)
        resized = size != (height, width)
        if resized:
            x = F.interpolate(x, size=size, mode='bilinear', align_corners=False)
        x = rearrange(x, 'b d (nh ph) (nw pw) -> (b ph pw) (nh nw) d', ph=ph, pw=pw)
        x = self.transformer(x)
        x = rearrange(x, '(b ph pw) (nh nw) d -> b d (nh ph) (nw pw)', ph=ph, pw=pw, nh=size[0] // ph)
        if resized:
            x = F.interpolate(x, size=(height, width), mode='bilinear', align_corners=False)
        return self.fusion(torch.cat((shortcut, self.to_channels(x)), dim=1))


class MobileViT(nn.Module):
    """MobileViT with vit-pytorch's keyword arguments; the official architecture.

    A 3x3 stride-2 stem, five stages (the strides 1, 2, 2, 2, 2; the last three end in a
    MobileViT block of width dims[i] and depths[i] layers), a 1x1 convolution to channels[-1],
    average pooling and a Linear classifier. `num_classes=0` makes `forward` return the pooled
    embedding (b, channels[-1]), as timm does.

    vit-pytorch's arguments may be positional, in its order; the options beyond them are keyword-only.
    Options beyond vit-pytorch's API (the defaults are the paper's):
      in_chans     input channels (vit-pytorch: always 3; timm's name).
      heads        attention heads of every transformer, of width dims[i] / heads.
      mlp_ratio    MLP width over the transformer width.

    Recorder layout: one map per transformer layer, in order, (b * ph * pw, heads, n, n) with
    n = ceil(h / ph) * ceil(w / pw) patches of that block's map, as `MobileViTBlock` lays them out.
    """

    num_prefix_tokens = 0

    def __init__(self, image_size, dims, channels, num_classes, expansion=4, kernel_size=3, patch_size=(2, 2),
                 depths=(2, 4, 3), *, in_chans=3, heads=4, mlp_ratio=2.):
        check_arguments(**vit.arguments(locals()))
        super().__init__()
        self.image_size, self.patch_size = vit.pair(image_size), vit.pair(patch_size)
        self.in_chans, self.num_classes = in_chans, num_classes
        c = list(channels)

        def transformer_stage(i):
            return nn.Sequential(
                InvertedResidual(c[3 + 2 * i], c[4 + 2 * i], 2, expansion),
                MobileViTBlock(c[4 + 2 * i], c[5 + 2 * i], dims[i], depths[i], heads=heads, mlp_ratio=mlp_ratio,
                               kernel_size=kernel_size, patch_size=self.patch_size),
            )

        self.conv1 = conv_bn_act(in_chans, c[0], 3, 2)
        self.stages = nn.ModuleList([
            nn.Sequential(InvertedResidual(c[0], c[1], 1, expansion)),
            nn.Sequential(InvertedResidual(c[1], c[2], 2, expansion), InvertedResidual(c[2], c[3], 1, expansion),
                          InvertedResidual(c[3], c[3], 1, expansion)),
            *(transformer_stage(i) for i in range(3)),
        ])
        self.final_conv = conv_bn_act(c[9], c[10])
        self.num_features = c[10]
        self.mlp_head = nn.Linear(c[10], num_classes) if num_classes > 0 else None
        self.feature_info = [dict(num_chs=width, reduction=2 ** (i + 1), module=f'stages.{i}')
                             for i, width in enumerate((c[1], c[3], c[5], c[7]))]
        self.feature_info.append(dict(num_chs=c[10], reduction=32, module='final_conv'))

    def forward_intermediates(self, img, indices=None):
        """The first four stages' maps and the final convolution's, (b, num_chs, h / reduction, w / reduction)
        as in `feature_info` (rounded up); `indices` chooses some (None: all, n: the last n, or a list)."""
        chosen = vit.take_indices(indices, len(self.feature_info))
        vit.check_images(img, channels=self.in_chans, patch_size=(1, 1), dtype=self.final_conv[0].weight.dtype)
        x, maps = self.conv1(img), []
        for stage in self.stages[:max(chosen) + 1]:
            maps.append(stage(x))
            x = maps[-1]
        if len(maps) == len(self.stages):
            maps[-1] = self.final_conv(maps[-1])
        return [maps[i] for i in chosen]

    def forward_features(self, img):
        """The final 1x1 convolution's map, (b, channels[-1], h / 32, w / 32) (rounded up)."""
        vit.check_images(img, channels=self.in_chans, patch_size=(1, 1), dtype=self.final_conv[0].weight.dtype)
        smallest = math.ceil(img.shape[-2] / 32) * math.ceil(img.shape[-1] / 32)   # the final map's positions
        if self.training and len(img) * smallest == 1:
            raise ValueError(f"MobileViT in training mode needs a batch of at least 2 images of {img.shape[-2]}x"
                             f"{img.shape[-1]} pixels, got {len(img)}: its BatchNorm layers normalise each channel by "
                             f"the batch's own mean and variance, and one image this small leaves its final map "
                             f"(stride 32) a single value per channel; call model.eval() to classify a single image "
                             f"(BatchNorm then uses its running statistics)")
        x = self.conv1(img)
        for stage in self.stages:
            x = stage(x)
        return self.final_conv(x)

    def forward_head(self, x, pre_logits=False):
        """Average-pool the map; then the classifier unless `pre_logits`."""
        x = reduce(x, 'b c h w -> b c', 'mean')
        return x if pre_logits or self.mlp_head is None else self.mlp_head(x)

    def forward(self, img):
        return self.forward_head(self.forward_features(img))

    def reset_classifier(self, num_classes):
        """A new zero-initialised head for `num_classes` (0 removes it)."""
        vit.reset_head(self, num_classes, self.num_features, like=self.final_conv[0].weight)

    def set_grad_checkpointing(self, enable=True):
        """Recompute each MobileViT block's transformer layers in the backward pass (the convolutions keep theirs)."""
        for module in self.modules():
            if isinstance(module, MobileViTBlock):
                module.transformer.grad_checkpointing = enable


class RegisteredMobileViT(MobileViT):
    """MobileViT under the argument names of the package's registry (`vit_pytorch.models`, 'mobile_vit'):
    `channels` is the images' channels, as for every other registered model and the training command's
    `--channels`, and `widths` the eleven widths that vit-pytorch's `channels` lists. The same model and
    state_dict as `MobileViT(channels=widths, in_chans=channels, ...)`.

        model = RegisteredMobileViT(image_size=16, dims=(8, 8, 8), widths=(8,) * 10 + (16,), num_classes=10,
                                    channels=1)

    `forward_features` returns the final 1x1 convolution's map, (b, widths[-1], h / 32, w / 32) (rounded up).
    `num_classes=0` makes `forward` return the pooled embedding (b, num_features).
    """

    def __init__(self, *, image_size, dims, widths, num_classes, channels=3, expansion=4, kernel_size=3,
                 patch_size=(2, 2), depths=(2, 4, 3), heads=4, mlp_ratio=2.):
        check_arguments(image_size=image_size, dims=dims, channels=widths, num_classes=num_classes,
                        expansion=expansion, kernel_size=kernel_size, patch_size=patch_size, depths=depths,
                        in_chans=channels, heads=heads, mlp_ratio=mlp_ratio, names=REGISTERED_NAMES)
        super().__init__(image_size=image_size, dims=dims, channels=widths, num_classes=num_classes,
                         expansion=expansion, kernel_size=kernel_size, patch_size=patch_size, depths=depths,
                         in_chans=channels, heads=heads, mlp_ratio=mlp_ratio)


# the paper's models (Table 4, section B; timm's mobilevit_*): name -> (dims, channels, expansion); 256x256
# images, patches 2x2, transformer depths (2, 4, 3), 4 heads, MLP ratio 2
CONFIGS = {
    'xxs': ((64, 80, 96), (16, 16, 24, 24, 48, 48, 64, 64, 80, 80, 320), 2),
    'xs': ((96, 120, 144), (16, 32, 48, 48, 64, 64, 80, 80, 96, 96, 384), 4),
    's': ((144, 192, 240), (16, 32, 64, 64, 96, 96, 128, 128, 160, 160, 640), 4),
}


def mobile_vit(variant, *, image_size=256, num_classes=1000, **overrides):
    """The paper's MobileViT `variant` (a key of CONFIGS); keyword arguments override."""
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    dims, channels, expansion = CONFIGS[variant]
    kwargs = dict(image_size=image_size, dims=dims, channels=channels, num_classes=num_classes, expansion=expansion)
    return MobileViT(**{**kwargs, **overrides})


def mobilevit_xxs(**kwargs):
    return mobile_vit('xxs', **kwargs)


def mobilevit_xs(**kwargs):
    return mobile_vit('xs', **kwargs)


def mobilevit_s(**kwargs):
    return mobile_vit('s', **kwargs)


# argument checks


# RegisteredMobileViT's names for MobileViT's arguments, so that a message names what its user typed
REGISTERED_NAMES = dict(channels='widths', in_chans='channels')


def check_arguments(*, image_size, dims, channels, num_classes, expansion, kernel_size, patch_size, depths,
                    in_chans, heads, mlp_ratio, names=None):
    """`names` renames arguments in the messages (REGISTERED_NAMES for RegisteredMobileViT)."""
    widths_name, in_chans_name = ((names or {}).get(name, name) for name in ('channels', 'in_chans'))
    vit.positive_pair('image_size', image_size)
    vit.positive_pair('patch_size', patch_size)
    for name, value, length in (('dims', dims, 3), (widths_name, channels, 11), ('depths', depths, 3)):
        if not isinstance(value, (tuple, list)) or len(value) != length:
            raise ValueError(f"{name} must be a list of {length} ints, got {value!r}")
        for index, item in enumerate(value):
            vit.positive_int(f'{name}[{index}]', item)
    vit.non_negative_int('num_classes', num_classes)
    for name, value in {'kernel_size': kernel_size, in_chans_name: in_chans, 'heads': heads}.items():
        vit.positive_int(name, value)
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be odd (the convolutions keep the map's size), got {kernel_size}")
    if channels[2] != channels[3]:
        raise ValueError(f"{widths_name}[2] and {widths_name}[3] must be equal (the second stage's blocks keep one "
                         f"width), got {channels[2]} and {channels[3]}")
    for dim in dims:
        if dim % heads:
            raise ValueError(f"every dims entry must be divisible by heads={heads}, got dims={list(dims)}")
    vit.positive_float('expansion', expansion)
    vit.positive_float('mlp_ratio', mlp_ratio)
    if int(min(channels[:-1]) * expansion) < 1 or int(min(dims) * mlp_ratio) < 1:
        raise ValueError(f"expansion and mlp_ratio must leave at least one hidden channel, got expansion={expansion}, "
                         f"mlp_ratio={mlp_ratio}")


# loading checkpoints


def timm_plan(model, keys):
    """timm's `ByobNet` of the `mobilevit_*` models (apple/ml-cvnets' weights) -> MobileViT.

    Names differ, values do not.
    """
    state = model.state_dict()
    names = {'conv1.0.': 'stem.conv.', 'conv1.1.': 'stem.bn.', 'final_conv.0.': 'final_conv.conv.',
             'final_conv.1.': 'final_conv.bn.', 'mlp_head.': 'head.fc.'}
    inverted = {'net.0.': 'conv1_1x1.conv.', 'net.1.': 'conv1_1x1.bn.', 'net.3.': 'conv2_kxk.conv.',
                'net.4.': 'conv2_kxk.bn.', 'net.6.': 'conv3_1x1.conv.', 'net.7.': 'conv3_1x1.bn.'}
    block = {'conv_local.0.': 'conv_kxk.conv.', 'conv_local.1.': 'conv_kxk.bn.', 'to_tokens.': 'conv_1x1.',
             'transformer.norm.': 'norm.', 'to_channels.0.': 'conv_proj.conv.', 'to_channels.1.': 'conv_proj.bn.',
             'fusion.0.': 'conv_fusion.conv.', 'fusion.1.': 'conv_fusion.bn.'}
    layer = {'0.norm.': 'norm1.', '0.to_qkv.': 'attn.qkv.', '0.to_out.0.': 'attn.proj.', '1.0.': 'norm2.',
             '1.1.': 'mlp.fc1.', '1.4.': 'mlp.fc2.'}
    for s, stage in enumerate(model.stages):
        for i, module in enumerate(stage):
            ours, theirs = f'stages.{s}.{i}.', f'stages.{s}.{i}.'
            if isinstance(module, InvertedResidual):
                names.update({ours + key: theirs + value for key, value in inverted.items()})
                continue
            names.update({ours + key: theirs + value for key, value in block.items()})
            for j in range(len(module.transformer.layers)):
                names.update({f'{ours}transformer.layers.{j}.{key}': f'{theirs}transformer.{j}.{value}'
                              for key, value in layer.items()})
    plan = vit.prefixed_plan(state, names, "timm's MobileViT")
    return plan, ('head.fc.',)


def vit_pytorch_plan(model, keys):
    raise ValueError(
        "vit-pytorch's MobileViT computes another function than the official MobileViT (and this one): its "
        "attention has 4 heads of 8 channels whatever the width (the paper: width / 4 each) and no qkv bias, its "
        "MLPs are 2, 4 and 4 times the width (the paper: 2), its 1x1 projection to the transformer has a "
        "BatchNorm and SiLU, no LayerNorm follows the transformer, it fuses [block output, input] in that order, "
        "and its classifier has no bias (the README's MobileViT-XS has 2,382,944 parameters, the official "
        "mobilevit_xs 2,317,848)")
