"""SimpleViT with a specialized cls token: what "Revisiting [CLS] and Patch Token Interaction in Vision
Transformers" (arXiv 2602.08626) adds: separate per-token parameters for the cls token, the tokens still meeting
in attention.

The registry-wide tests (tests/test_conformance.py) cover the face, gradients and export; here: which
parameters each kind of token reads, where the specialization stops, the abstract's parameter figure,
vit-pytorch 1.26.14's checkpoints (fixture written by tests/fixtures/make_simple_vit_with_specialized_cls_fixtures.py).
"""

import copy

import pytest
import torch

from helpers import reference_case
from vit_pytorch.pretrained import load_vit_pytorch
from vit_pytorch.simple_vit import SimpleViT as PlainSimpleViT
from vit_pytorch.simple_vit_with_specialized_cls import Specialized, SimpleViT

CONFIG = dict(image_size=(16, 24), patch_size=(4, 8), num_classes=5, dim=16, depth=3, heads=2, dim_head=8,
              mlp_dim=32)


def model(**changes):
    torch.manual_seed(0)
    return SimpleViT(**{**CONFIG, **changes}).eval()


def tokens(seed=1):
    """(2, 1 + 12, 16) tokens entering a layer: the cls token first."""
    return torch.randn(2, 13, 16, generator=torch.Generator().manual_seed(seed))


def perturbed(module, which):
    """A copy of `module` with the parameters of `fns[which]` of each of its Specialized children moved."""
    changed = copy.deepcopy(module)
    with torch.no_grad():
        for child in changed.modules():
            if isinstance(child, Specialized):
                for p in child.fns[which].parameters():
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return changed


CLS, PATCHES = 0, 1


@pytest.mark.parametrize('moved, kept', [(CLS, slice(1, None)), (PATCHES, slice(0, 1))], ids=['cls', 'patches'])
def test_in_a_specialized_layer_each_kind_of_tokens_queries_keys_and_values_ignore_the_others_parameters(moved, kept):
    attention = model().transformer.layers[0][0]
    assert isinstance(attention.to_qkv, Specialized)
    x = tokens()
    with torch.no_grad():
        before, after = attention.qkv(x), perturbed(attention, moved).qkv(x)
    for ours, theirs in zip(before, after):                   # q, k, v: (b, heads, 1 + n, dim_head)
        assert torch.equal(ours[:, :, kept], theirs[:, :, kept])
        assert not torch.equal(ours, theirs)


@pytest.mark.parametrize('moved, kept', [(CLS, slice(1, None)), (PATCHES, slice(0, 1))], ids=['cls', 'patches'])
def test_each_kind_of_tokens_feed_forward_ignores_the_others_norm(moved, kept):
    feedforward = model().transformer.layers[2][1]            # a layer without specialized qkv: norms still are
    x = tokens()
    with torch.no_grad():
        before, after = feedforward(x), perturbed(feedforward, moved)(x)
    assert torch.equal(before[:, kept], after[:, kept])
    assert not torch.equal(before, after)


def test_the_tokens_still_meet_in_attention():
    """Specialization splits the per-token maps only: a patch token's output reads the cls token's key and
    value, and the cls token's reads the patches'."""
    attention = model().transformer.layers[0][0]
    x, y = tokens(), tokens()
    y[:, 1:] = x[:, 1:] + 1.0                                  # other patches, the same cls token
    with torch.no_grad():
        assert not torch.equal(attention(x)[:, 0], attention(y)[:, 0])
        z = x.clone()
        z[:, 0] += 1.0                                         # another cls token, the same patches
        assert not torch.equal(attention(x)[:, 1:], attention(z)[:, 1:])


@pytest.mark.parametrize('depth, specialized', [(3, 1), (6, 2), (12, 4), (2, 0)])
def test_the_first_third_of_the_layers_specialize_their_qkv_projection(depth, specialized):
    layers = model(depth=depth).transformer.layers
    assert [isinstance(attention.to_qkv, Specialized) for attention, _ in layers] == \
        [index < specialized for index in range(depth)]
    assert all(isinstance(attention.norm, Specialized) and isinstance(ff.norm, Specialized) for attention, ff in layers)


def test_specialize_qkv_depth_sets_how_many_first_layers_specialize():
    layers = model(depth=3, specialize_qkv_depth=3).transformer.layers
    assert all(isinstance(attention.to_qkv, Specialized) for attention, _ in layers)


def test_specialization_adds_8_percent_parameters_to_a_vit_b_16_as_the_abstract_says():
    """Specialized norms and the first third's qkv projections: "only an 8% increase in parameters" (abstract;
    counted on the meta device, against the same SimpleViT-B/16 with a cls token and shared parameters)."""
    base = dict(image_size=224, patch_size=16, num_classes=1000, dim=768, depth=12, heads=12, mlp_dim=3072)
    with torch.device('meta'):
        specialized = sum(p.numel() for p in SimpleViT(**base).parameters())
        plain = sum(p.numel() for p in PlainSimpleViT(**base).parameters()) + 768        # + the cls token
    extra = 4 * 768 * 3 * 768 + (2 * 12 + 1) * 2 * 768                 # 4 qkv projections, 25 LayerNorms
    assert specialized - plain == extra
    assert round(100 * extra / plain) == 8


@pytest.mark.parametrize('value, error, message', [
    (4, ValueError, r'specialize_qkv_depth must be at most depth \(3\).* got 4'),
    (1.5, TypeError, r'specialize_qkv_depth must be a non-negative int, got 1.5'),
])
def test_a_bad_specialize_qkv_depth_is_refused_by_name(value, error, message):
    with pytest.raises(error, match=message):
        model(specialize_qkv_depth=value)


# vit-pytorch 1.26.14


def test_vit_pytorch_checkpoints_load_and_give_its_outputs():
    config, state, img, expected = reference_case('vit_pytorch_1.26.14_simple_vit_with_specialized_cls', 'image_size')
    net = load_vit_pytorch(SimpleViT(**config).eval(), state)
    with torch.no_grad():
        torch.testing.assert_close(net(img), expected, rtol=1e-5, atol=1e-5)


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                     # vit-pytorch's sizes: dim 1024, 6 layers
def test_vit_pytorchs_main_block_runs():
    v = SimpleViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=16, mlp_dim=2048)
    img = torch.randn(1, 3, 256, 256)
    out = v(img)
    assert out.shape == (1, 1000)
