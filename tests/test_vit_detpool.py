"""ViTDetPool: what DetPool (Niu et al., ICLR 2026) adds to a ViT: attention and pooling over an object's patches.

The registry-wide tests (tests/test_conformance.py, rows 'vit_detpool*') cover the face, gradients and export;
here: the mask's effect, its three forms, the mask generator, the clear errors, vit-pytorch 1.26.14's
checkpoints (fixture written by tests/fixtures/make_vit_detpool_fixtures.py).
"""

import pytest
import torch
from torch import nn

from helpers import load_fixture, reference_case
from vit_pytorch.pretrained import load_vit_pytorch
from vit_pytorch.vit_detpool import ViTDetPool

CONFIG = dict(image_size=(16, 24), patch_size=(4, 8), num_classes=5, dim=16, depth=2, heads=2, dim_head=8,
              mlp_dim=32)


def model(**changes):
    torch.manual_seed(0)
    net = ViTDetPool(**{**CONFIG, **changes}).eval()
    with torch.no_grad():                      # off the initialisation: attention far from uniform
        for p in net.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return net


def images(batch=2, seed=1):
    return torch.randn(batch, 3, 16, 24, generator=torch.Generator().manual_seed(seed))


def grid_mask():
    """A (2, 4, 3) patch mask: 4 patches of the first image, 1 of the second."""
    mask = torch.zeros(2, 4, 3, dtype=torch.bool)
    mask[0, 1:3, 0:2] = True
    mask[1, 3, 2] = True
    return mask


def outside_pixels(mask):
    """(2, 16, 24) pixels of the patches outside a (2, 4, 3) patch mask."""
    return ~mask.repeat_interleave(4, dim=1).repeat_interleave(8, dim=2)


@pytest.mark.parametrize('use_cls_token', [True, False])
def test_patches_outside_the_mask_do_not_change_the_output(use_cls_token):
    net, img, mask = model(use_cls_token=use_cls_token), images(), grid_mask()
    changed = torch.where(outside_pixels(mask)[:, None], images(seed=7) * 10, img)
    with torch.no_grad():
        expected = net(img, object_mask=mask)
        assert not torch.equal(net(changed), net(img))          # without the mask they do change it
        # the masked keys get weight exactly 0 and the pooling leaves them out: equal to the last bit
        assert torch.equal(net(changed, object_mask=mask), expected)


@pytest.mark.parametrize('use_cls_token', [True, False])
def test_an_all_ones_mask_is_plain_attention_and_mean_pooling(use_cls_token):
    net, img = model(use_cls_token=use_cls_token), images()
    with torch.no_grad():
        torch.testing.assert_close(net(img, object_mask=torch.ones(2, 16, 24, dtype=torch.bool)), net(img))


def test_the_pooling_is_the_mean_of_the_objects_patch_tokens():
    net, img, mask = model(), images(), grid_mask()
    with torch.no_grad():
        tokens = net.forward_features(img, object_mask=mask)
        pooled = net.forward_head(tokens, pre_logits=True, object_mask=mask)
    patches = tokens[:, 1:]
    expected = torch.stack([patches[i][mask[i].flatten()].mean(dim=0) for i in range(2)])
    torch.testing.assert_close(pooled, expected)


def test_every_token_attends_only_to_the_cls_token_and_the_objects_patches():
    net, img, mask = model(), images(), grid_mask()
    maps = []
    for layer in net.transformer.layers:
        layer[0].fused = False                   # the explicit path, whose matrix passes attention_probs
        layer[0].attention_probs.register_forward_hook(lambda module, args, out: maps.append(out))
    with torch.no_grad():
        net(img, object_mask=mask)
    readable = torch.cat((torch.ones(2, 1, dtype=torch.bool), mask.flatten(1)), dim=1)     # (b, 1 + patches)
    assert len(maps) == 2
    for attn in maps:                            # (b, heads, queries, keys)
        keys = readable[:, None, None, :].expand_as(attn)
        assert not attn[~keys].any()
        assert (attn[keys] > 0).all()


def test_a_pixel_mask_marks_every_patch_that_holds_an_object_pixel():
    net, img = model(), images()
    pixels = torch.zeros(2, 16, 24, dtype=torch.bool)
    pixels[0, 5, 3] = pixels[0, 9, 20] = True          # one pixel in patch (1, 0), one in patch (2, 2)
    pixels[1, 15, 23] = True                           # the last pixel: patch (3, 2)
    patches = torch.zeros(2, 4, 3, dtype=torch.bool)
    patches[0, 1, 0] = patches[0, 2, 2] = patches[1, 3, 2] = True
    with torch.no_grad():
        expected = net(img, object_mask=patches)
        torch.testing.assert_close(net(img, object_mask=pixels), expected, rtol=0, atol=0)
        torch.testing.assert_close(net(img, object_mask=patches.flatten(1)), expected, rtol=0, atol=0)


class Brightest(nn.Module):
    """A stand-in for a segmenter, with a parameter and a train mode: the (b, 4, 3) patches brighter than the
    image's mean patch."""

    def __init__(self):
        super().__init__()
        self.offset = nn.Parameter(torch.zeros(()))
        self.modes = []

    def forward(self, img):
        self.modes.append(self.training)
        brightness = nn.functional.avg_pool2d(img.mean(dim=1), (4, 8)) + self.offset        # (b, 4, 3)
        return brightness > brightness.flatten(1).mean(dim=1)[:, None, None]


def test_the_mask_generators_mask_is_used_without_gradients_in_eval_mode():
    torch.manual_seed(0)
    net = ViTDetPool(**CONFIG, mask_generator=Brightest()).train()
    img = images()
    out = net(img)
    out.sum().backward()
    assert net.mask_generator.offset.grad is None
    assert net.mask_generator.modes == [False]
    net.eval()
    with torch.no_grad():
        mask = net.object_mask(img)
        assert torch.equal(net(img), net(img, object_mask=mask))
        assert not torch.equal(net(img), net(img, object_mask=torch.ones_like(mask)))
        assert torch.equal(net.forward_head(net.forward_features(img), object_mask=mask), net(img))


def test_an_image_whose_mask_holds_no_patch_is_refused_by_name():
    mask = grid_mask()
    mask[1] = False
    with pytest.raises(ValueError, match=r'object_mask holds no patch of image\(s\) \[1\]'):
        model()(images(), object_mask=mask)


@pytest.mark.parametrize('mask, error, message', [
    (torch.ones(2, 16, 24), TypeError, r'object_mask must be a boolean tensor .* got dtype torch.float32'),
    (torch.ones(2, 16, 16, dtype=torch.bool), ValueError, r'object_mask must have shape .*\(2, 16, 24\).*'
                                                          r'\(2, 4, 3\).*\(2, 12\).* got \(2, 16, 16\)'),
    (torch.ones(3, 12, dtype=torch.bool), ValueError, r'got \(3, 12\)'),
    ([[True]], TypeError, r'object_mask must be a boolean tensor .* got list'),
])
def test_a_mask_of_the_wrong_kind_or_shape_is_refused_by_name(mask, error, message):
    with pytest.raises(error, match=message):
        model()(images(), object_mask=mask)


def test_images_of_another_size_are_refused_by_name():
    with pytest.raises(ValueError, match=r"img must be 16x24 .* the model's image_size, got 8x24"):
        model()(torch.randn(1, 3, 8, 24))


def test_a_mask_generator_that_is_not_a_module_is_refused_by_name():
    with pytest.raises(TypeError, match=r'mask_generator must be a torch.nn.Module .* got function'):
        ViTDetPool(**CONFIG, mask_generator=lambda img: img > 0)


# vit-pytorch 1.26.14


def test_vit_pytorch_checkpoints_load_and_give_its_outputs_with_and_without_a_mask():
    config, state, img, expected = reference_case('vit_pytorch_1.26.14_vit_detpool', 'image_size')
    tensors = load_fixture('vit_pytorch_1.26.14_vit_detpool')[2]
    net = load_vit_pytorch(ViTDetPool(**config).eval(), state)
    with torch.no_grad():
        torch.testing.assert_close(net(img), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(net(img, object_mask=tensors['object_mask']), tensors['output_masked'],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.slow                     # an export: 8-22 s on 2 shared cores
def test_exports_with_the_object_mask_as_a_second_input_of_dynamic_batch():
    """The empty-mask check is data-dependent and skipped while exporting; the masked attention and pooling
    export, the mask's batch symbolic like the images'."""
    net, img, mask = model(), images(), grid_mask()
    batch = torch.export.Dim('batch', min=1, max=1024)
    program = torch.export.export(net, (img,), {'object_mask': mask},
                                  dynamic_shapes={'img': {0: batch}, 'object_mask': {0: batch}})
    other_mask = torch.ones(3, 4, 3, dtype=torch.bool)
    other_mask[:, 0] = False
    with torch.no_grad():
        torch.testing.assert_close(program.module()(images(3, seed=5), object_mask=other_mask),
                                   net(images(3, seed=5), object_mask=other_mask), rtol=1e-5, atol=1e-6)


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                     # vit-pytorch's sizes: dim 1024, 6 layers (~4 s on 2 cores)
def test_vit_pytorchs_main_block_runs():
    vit = ViTDetPool(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16, mlp_dim=2048,
                     dropout=0.1, emb_dropout=0.1)
    img = torch.randn(1, 3, 256, 256)
    object_mask = torch.randint(0, 2, (1, 256, 256)).bool()
    assert vit(img, object_mask=object_mask).shape == (1, 1000)
    assert vit(img).shape == (1, 1000)

    class MockMasker(nn.Module):
        def forward(self, img):
            batch, _, height, width = img.shape
            return torch.ones(batch, height, width).bool()

    vit = ViTDetPool(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=1, heads=16, mlp_dim=2048,
                     mask_generator=MockMasker())
    assert vit(img).shape == (1, 1000)
