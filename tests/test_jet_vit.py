"""JetViT: each layer's linear, window or full attention, each against its formula written out; the random choice of
the attention search; vit-pytorch's weights."""

import pytest
import torch
import torch.nn.functional as F

from helpers import move_off_initialisation, reference_case
from vit_pytorch.jet_vit import JetViT
from vit_pytorch.pretrained import load_vit_pytorch

GRID = (4, 6)                                                 # 16 x 24 images, patches of 4


def tiny(**overrides):
    torch.manual_seed(0)
    kwargs = dict(image_size=(16, 24), patch_size=4, num_classes=5, dim=16, depth=3, heads=2, dim_head=8, mlp_dim=32,
                  window_size=2, attn_layers=['LA', 'WA', 'FA'])
    return move_off_initialisation(JetViT(**dict(kwargs, **overrides)))


def option(kind):
    return tiny().double().eval().transformer.layers[0][0].options[kind]


def normed_heads(attn, x):
    normed = F.layer_norm(x, x.shape[-1:], attn.norm.weight, attn.norm.bias, attn.norm.eps)
    return ((normed @ attn.to_qkv.weight.T).chunk(3, dim=-1), attn.heads)


def split(t, heads):
    return t.unflatten(-1, (heads, -1)).transpose(1, 2)                    # (b, h, n, d)


def explicit_dynamic_conv(conv, v):
    """Per image and channel c, kernel K_c (the MLP of the values' mean, k x k), out[c, y, x] =
    sum_{a, b} K_c[a, b] v[c, y + a - k // 2, x + b - k // 2] (zero outside the grid)."""
    b, heads, n, d = v.shape
    k = conv.kernel_size
    kernels = conv.mlp(v.mean(dim=2).reshape(b, heads * d)).reshape(b, heads * d, k, k)
    maps = v.permute(0, 1, 3, 2).reshape(b, heads * d, *GRID)
    padded = F.pad(maps, (k // 2,) * 4)
    out = torch.zeros_like(maps)
    for a in range(k):
        for c in range(k):
            out += kernels[:, :, a, c, None, None] * padded[:, :, a:a + GRID[0], c:c + GRID[1]]
    return out.reshape(b, heads, d, n).permute(0, 1, 3, 2)


def test_linear_attention_is_its_formula_plus_the_squeeze_dynamic_convolution():
    """out_i = sum_j (phi(q_i) . phi(k_j)) v_j / sum_j phi(q_i) . phi(k_j), phi = relu, plus the dynamic convolution
    of v, then the output projection; a query that relu zeroes (no weight on any key) takes no linear part, as
    vit-pytorch's clamp of the sum at 1e-6 gives."""
    attn = option('LA')
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    (q, k, v), heads = normed_heads(attn, x)
    q, k, v = split(q, heads).relu(), split(k, heads).relu(), split(v, heads)
    weights = q @ k.transpose(-1, -2)
    linear = (weights / weights.sum(dim=-1, keepdim=True).clamp(min=1e-6)) @ v
    expected = (linear + explicit_dynamic_conv(attn.dynamic_conv, v)).transpose(1, 2).flatten(2)
    expected = expected @ attn.to_out[0].weight.T + attn.to_out[0].bias
    with torch.no_grad():
        torch.testing.assert_close(attn(x), expected, rtol=1e-10, atol=1e-10)


def test_the_dynamic_convolution_while_exporting_is_the_same_formula(monkeypatch):
    """While exporting, the grouped convolution (its group count grows with the batch; ONNX's is a constant) is
    written as a sum of shifted maps: the same cross-correlation, at each of two batch sizes."""
    conv = option('LA').dynamic_conv
    monkeypatch.setattr(torch.compiler, 'is_exporting', lambda: True)
    for b in (1, 3):
        v = torch.randn(b, 2, 24, 8, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(conv(v), explicit_dynamic_conv(conv, v), rtol=1e-10, atol=1e-10)


def test_linear_attentions_explicit_path_for_the_recorder_equals_its_linear_time_path():
    attn = option('LA')
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    with torch.no_grad():
        fused = attn(x)
        attn.fused = False
        torch.testing.assert_close(attn(x), fused, rtol=1e-10, atol=1e-10)


def test_window_attention_is_full_attention_masked_to_the_window_with_the_relative_bias():
    """Full softmax attention over all 24 tokens where a query may see only the keys of its own 2 x 2 window, with
    the bias table's entry for the query-minus-key offset (dy, dx) at ((dy + 1) * 3 + dx + 1)."""
    attn = option('WA')
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    (q, k, v), heads = normed_heads(attn, x)
    q, k, v = (split(t, heads) for t in (q, k, v))
    rows, cols = torch.arange(24) // GRID[1], torch.arange(24) % GRID[1]
    same_window = (rows[:, None] // 2 == rows[None] // 2) & (cols[:, None] // 2 == cols[None] // 2)
    offset = ((rows % 2)[:, None] - (rows % 2)[None] + 1) * 3 + (cols % 2)[:, None] - (cols % 2)[None] + 1
    bias = attn.rel_pos_bias.weight[offset].permute(2, 0, 1)               # (h, n, n)
    scores = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias).masked_fill(~same_window, float('-inf'))
    expected = (scores.softmax(dim=-1) @ v).transpose(1, 2).flatten(2) @ attn.to_out[0].weight.T
    with torch.no_grad():
        torch.testing.assert_close(attn(x), expected, rtol=1e-10, atol=1e-10)


def test_window_attention_has_dim_over_dim_head_heads_whatever_heads_says():
    """vit-pytorch's rule: 16 / 8 = 2 heads for window attention, 4 for the others."""
    model = tiny(heads=4)
    options = model.transformer.layers[0][0].options
    assert (options['WA'].heads, options['LA'].heads, options['FA'].heads) == (2, 4, 4)


def test_full_attention_is_softmax_attention_over_every_token():
    attn = option('FA')
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    (q, k, v), heads = normed_heads(attn, x)
    q, k, v = (split(t, heads) for t in (q, k, v))
    out = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).softmax(dim=-1) @ v
    expected = out.transpose(1, 2).flatten(2) @ attn.to_out[0].weight.T + attn.to_out[0].bias
    with torch.no_grad():
        torch.testing.assert_close(attn(x), expected, rtol=1e-10, atol=1e-10)


# the attention search


def kinds_run(model, img, forwards):
    """Which attention of the first layer ran in each of `forwards` forwards."""
    ran = []
    options = model.transformer.layers[0][0].options
    hooks = [module.register_forward_hook(lambda *_, kind=kind: ran.append(kind)) for kind, module in options.items()]
    try:
        with torch.no_grad():
            for _ in range(forwards):
                model(img)
    finally:
        for hook in hooks:
            hook.remove()
    return ran


def test_a_layer_given_a_tuple_draws_one_of_its_kinds_in_every_forward():
    model = tiny(attn_layers=[('WA', 'LA'), 'WA', 'FA']).eval()
    torch.manual_seed(0)
    ran = kinds_run(model, torch.randn(1, 3, 16, 24), 20)
    assert len(ran) == 20 and set(ran) == {'WA', 'LA'}


def test_the_draw_follows_torchs_seed():
    model = tiny(attn_layers=[('WA', 'LA', 'FA'), 'WA', 'FA']).eval()
    img = torch.randn(1, 3, 16, 24)
    torch.manual_seed(5)
    first = kinds_run(model, img, 10)
    torch.manual_seed(5)
    assert kinds_run(model, img, 10) == first


def test_setting_the_search_result_runs_each_layers_chosen_kind_with_the_same_weights():
    model = tiny(attn_layers=[('WA', 'LA'), ('WA', 'FA'), ('LA', 'FA')]).eval()
    weights = {key: value.clone() for key, value in model.state_dict().items()}
    model.set_attn_layers(['LA', 'FA', 'LA'])
    assert model.attn_layers == ['LA', 'FA', 'LA']
    assert all(torch.equal(weights[key], value) for key, value in model.state_dict().items())
    fixed = tiny(attn_layers=['LA', 'FA', 'LA']).eval()
    img = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        torch.testing.assert_close(model(img), fixed(img), rtol=0, atol=0)


def test_a_choice_stored_as_a_list_is_a_choice_like_a_tuple():
    """A checkpoint's JSON config turns the tuples into lists."""
    assert tiny(attn_layers=[['WA', 'LA'], 'WA', 'FA']).attn_layers[0] == ('WA', 'LA')


# vit-pytorch 1.26.14 (tests/fixtures/make_gate_jet_looped_fixtures.py)


def test_vit_pytorchs_checkpoint_loads_strictly_and_gives_its_output():
    """One layer of each kind: LA, WA (windows of 2 x 2), FA."""
    config, state_dict, img, expected = reference_case('vit_pytorch_1.26.14_jet_vit', 'image_size')
    model = load_vit_pytorch(JetViT(**config), state_dict).eval()
    assert model.state_dict().keys() == state_dict.keys()
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-4, atol=1e-5)


# clear errors


@pytest.mark.parametrize('overrides, message', [
    (dict(attn_layers=['LA', 'XA', 'FA']), 'attn_layers'),
    (dict(attn_layers=['LA', 'FA']), 'attn_layers'),
    (dict(attn_layers=['LA', (), 'FA']), 'attn_layers'),
    (dict(window_size=3), 'window_size 3'),
    (dict(dim_head=6), 'dim_head'),
])
def test_a_bad_argument_is_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny(**overrides)


def test_a_search_step_that_the_windows_do_not_tile_is_refused():
    model = tiny(window_size=4, attn_layers=['LA', 'LA', 'FA'])
    with pytest.raises(ValueError, match='window_size 4'):
        model.set_attn_layers(['WA', 'LA', 'FA'])


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow
def test_vit_pytorchs_readme_example_runs():
    """Its README's three stages: 224 pixels, patches of 16, width 512, depth 6, windows of 7 x 7."""
    common = dict(image_size=224, patch_size=16, num_classes=1000, dim=512, depth=6, heads=8, dim_head=64,
                  mlp_dim=3072, window_size=7)
    JetViT(**common, attn_layers=[('WA', 'LA')] * 6)
    JetViT(**common, attn_layers=[('LA', 'FA'), ('LA', 'FA'), ('WA', 'FA'), ('LA', 'FA'), ('LA', 'FA'), ('WA', 'FA')])
    model = JetViT(**common, attn_layers=['LA', 'LA', 'WA', 'FA', 'LA', 'FA'])
    img = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert model(img).shape == (1, 1000)
