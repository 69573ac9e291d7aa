"""examples/jet_search.py's pieces (JetViT's post-training attention search on the digits, docs/blocks.md): the
choice of the cheapest pattern within the tolerance, the weight inheritance, the held-out split, the pattern set
and its FLOPs, and that the chosen pattern is what `set_attn_layers` fixes."""


import pytest
import torch

from helpers import load_example
from vit_pytorch.jet_vit import JetViT
from vit_pytorch.training.data import ImageSet
from vit_pytorch.training.trials import with_statistics



jet_search = load_example('jet_search')


def tiny(**options):
    return JetViT(image_size=8, patch_size=2, num_classes=3, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32,
                  channels=1, window_size=2, **options)


# a hand-made table: reference 0.90, tolerance 0.02, so accuracies of 0.88 and more qualify
TABLE = [
    dict(pattern=['FA', 'FA'], accuracy=0.91, flops=100),
    dict(pattern=['WA', 'FA'], accuracy=0.89, flops=90),
    dict(pattern=['FA', 'WA'], accuracy=0.88, flops=90),
    dict(pattern=['WA', 'WA'], accuracy=0.85, flops=80),      # cheapest, but 0.05 below
    dict(pattern=['LA', 'LA'], accuracy=0.95, flops=120),     # best, but dearest
]


def test_search_picks_the_cheapest_pattern_within_the_tolerance_and_the_more_accurate_of_a_tie():
    assert jet_search.search(TABLE, 0.90, 0.02)['pattern'] == ['WA', 'FA']
    assert jet_search.search(TABLE, 0.90, 0.05)['pattern'] == ['WA', 'WA']     # exactly at the edge qualifies
    assert jet_search.search(TABLE, 0.90, 0.0)['pattern'] == ['FA', 'FA']
    assert jet_search.search(TABLE, 0.99, 0.0) is None


def test_patterns_are_every_choice_of_one_kind_per_layer():
    found = jet_search.patterns(3)
    assert len(found) == 27 and len(set(found)) == 27
    assert all(len(pattern) == 3 and set(pattern) <= {'WA', 'LA', 'FA'} for pattern in found)


def test_the_chosen_pattern_is_what_set_attn_layers_fixes_on_the_supernet():
    torch.manual_seed(0)
    supernet = tiny(attn_layers=[('WA', 'LA', 'FA')] * 2)
    chosen = jet_search.search(TABLE, 0.90, 0.02)['pattern']
    supernet.set_attn_layers(chosen)
    assert supernet.attn_layers == chosen
    fixed = tiny(attn_layers=chosen)
    fixed.load_state_dict(supernet.state_dict())
    images = torch.randn(3, 1, 8, 8)
    supernet.eval(), fixed.eval()
    first = supernet(images)
    torch.manual_seed(123)                     # no draw left: another seed gives the same output
    assert torch.equal(supernet(images), first)
    torch.testing.assert_close(first, fixed(images))


def test_inherit_attention_copies_the_full_attentions_shared_weights_into_window_and_linear():
    torch.manual_seed(0)
    model = tiny()
    before = {name: parameter.clone() for name, parameter in model.named_parameters()}
    jet_search.inherit_attention(model)
    for index, layer in enumerate(model.transformer.layers):
        full, window, linear = (layer[0].options[kind] for kind in ('FA', 'WA', 'LA'))
        for other in (window, linear):
            assert torch.equal(other.norm.weight, full.norm.weight) and torch.equal(other.norm.bias, full.norm.bias)
            assert torch.equal(other.to_qkv.weight, full.to_qkv.weight)
            assert torch.equal(other.to_out[0].weight, full.to_out[0].weight)
        assert torch.equal(linear.to_out[0].bias, full.to_out[0].bias)
        assert not torch.equal(window.to_qkv.weight, before[f'transformer.layers.{index}.0.options.WA.to_qkv.weight'])
    untouched = [name for name in before if 'dynamic_conv' in name or 'rel_pos_bias' in name or '.FA.' in name
                 or 'options' not in name]
    assert all(torch.equal(before[name], dict(model.named_parameters())[name]) for name in untouched)


def test_held_out_split_is_a_disjoint_fifth_with_the_statistics_of_the_rest():
    images = torch.arange(50 * 4, dtype=torch.float32).reshape(50, 1, 2, 2) / 200
    data = with_statistics(ImageSet(images, torch.arange(50) % 5, list('abcde')),
                           ImageSet(images[:3], torch.arange(3), list('abcde')))
    split = jet_search.held_out_split(data, 0.2, seed=0)
    assert len(split.test) == 10 and len(split.train) == 40
    held = {tuple(image.flatten().tolist()) for image in split.test.images}
    rest = {tuple(image.flatten().tolist()) for image in split.train.images}
    assert not held & rest and len(held | rest) == 50
    assert split.mean[0] == pytest.approx(split.train.images.mean().item())
    assert jet_search.held_out_split(data, 0.2, seed=0).test.labels.tolist() == split.test.labels.tolist()


def test_pattern_flops_are_each_layers_own_cost_summed():
    # a layer's attention costs the same whatever the other layers run: the count of a mixed pattern is the
    # all-FA count plus each changed layer's own change
    torch.manual_seed(0)
    model = tiny()
    count = lambda pattern: jet_search.pattern_flops(model, pattern, 8, 1, 3)
    full = count(('FA', 'FA'))
    window_first, linear_second = count(('WA', 'FA')) - full, count(('FA', 'LA')) - full
    assert count(('WA', 'LA')) == full + window_first + linear_second
    assert window_first < 0 < linear_second      # at 16 tokens the windows are cheaper, linear attention dearer
    assert model.attn_layers == ['FA', 'FA']      # counted on a copy
