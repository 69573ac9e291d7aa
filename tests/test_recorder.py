import functools
import math

import pytest
import torch
from einops import rearrange
from torch import nn

from helpers import digits_batch, tiny_vit_kwargs
from vit_pytorch import SimpleViT, ViT
from vit_pytorch.recorder import Extractor, Recorder, attention_modules, forward_intermediates, token_layout

MODELS = [ViT, SimpleViT]


def softmax_from_weights(attn, x):
    """softmax(q k^T / sqrt(d)) written out from the layer's own norm and qkv weights."""
    h = attn.norm(x)
    qkv = h @ attn.to_qkv.weight.T
    if attn.to_qkv.bias is not None:
        qkv = qkv + attn.to_qkv.bias
    q, k, _ = (rearrange(t, 'b n (h d) -> b h n d', h=attn.heads) for t in qkv.chunk(3, dim=-1))
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)


def layer_inputs(model, img):
    """The input of every attention layer: the embedded tokens, then each layer's output."""
    x = model.embed(img) if hasattr(model, 'embed') else \
        model.to_patch_embedding(img) + model.pos_embedding_for(model.grid_size)
    _, outputs = model.transformer(x, return_layers=True)
    return [x] + outputs[:-1]


def assert_untouched(model, fused):
    for name, module in model.named_modules():
        assert not module._forward_hooks, f'{name} kept a forward hook'
        assert not module._forward_pre_hooks, f'{name} kept a pre-hook'
    assert [module.fused for _, module in attention_modules(model)] == fused


@pytest.mark.parametrize('model_cls', MODELS)
def test_recorded_attention_equals_softmax_of_the_layers_q_and_k(model_cls):
    model = model_cls(**tiny_vit_kwargs(qkv_bias=True) if model_cls is ViT else tiny_vit_kwargs()).double().eval()
    img = torch.randn(2, 3, 16, 24, dtype=torch.float64)
    _, attns = Recorder(model)(img)
    inputs = layer_inputs(model, img)
    assert attns.shape == (2, 2, 2, inputs[0].shape[1], inputs[0].shape[1])
    for index, ((attn, _), x) in enumerate(zip(model.transformer.layers, inputs)):
        torch.testing.assert_close(attns[:, index], softmax_from_weights(attn, x), atol=1e-12, rtol=0)


def test_recorded_rows_sum_to_one():
    model = ViT(**tiny_vit_kwargs()).eval()
    _, attns = Recorder(model)(torch.randn(3, 3, 16, 24))
    torch.testing.assert_close(attns.sum(dim=-1), torch.ones(attns.shape[:-1]))
    assert (attns >= 0).all()


@pytest.mark.parametrize('model_cls', MODELS)
def test_recording_does_not_change_logits_and_leaves_nothing_behind(model_cls):
    model = model_cls(**tiny_vit_kwargs()).eval()
    img = torch.randn(2, 3, 16, 24)
    expected = model(img)
    recorder = Recorder(model)
    logits, _ = recorder(img)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert_untouched(model, [True, True])
    torch.testing.assert_close(recorder.eject()(img), expected, atol=0, rtol=0)


def test_fused_is_restored_to_what_it_was():
    model = ViT(**tiny_vit_kwargs()).eval()
    first, second = (module for _, module in attention_modules(model))
    first.fused = False
    Recorder(model)(torch.randn(1, 3, 16, 24))
    assert_untouched(model, [False, True])


def test_hooks_are_removed_when_the_forward_fails():
    model = ViT(**tiny_vit_kwargs()).eval()
    with pytest.raises(ValueError, match='img must be'):
        Recorder(model)(torch.randn(1, 3, 20, 24))
    assert_untouched(model, [True, True])


def test_context_manager_records_calls_of_the_model_itself():
    model = ViT(**tiny_vit_kwargs()).eval()
    img = torch.randn(2, 3, 16, 24)
    with Recorder(model) as recorder:
        assert [module.fused for _, module in attention_modules(model)] == [False, False]
        model(torch.randn(5, 3, 16, 24))
        model(img)
    assert_untouched(model, [True, True])
    _, expected = Recorder(model)(img)
    torch.testing.assert_close(recorder.attentions, expected)
    assert recorder.names == ['transformer.layers.0.0', 'transformer.layers.1.0']


@pytest.mark.parametrize('pool, prefix', [('cls', 1), ('mean', 0)])
def test_rectangular_grid_and_prefix_tokens_are_reported(pool, prefix):
    model = ViT(**tiny_vit_kwargs(pool=pool)).eval()
    recorder = Recorder(model)
    _, attns = recorder(torch.randn(1, 3, 16, 24))
    assert (recorder.grid, recorder.num_prefix_tokens) == ((4, 3), prefix)
    assert attns.shape[-1] == prefix + 4 * 3


def test_grid_follows_the_input_of_a_dynamic_size_model():
    model = ViT(**tiny_vit_kwargs(dynamic_image_size=True)).eval()
    recorder = Recorder(model)
    recorder(torch.randn(1, 3, 24, 40))
    assert (recorder.grid, recorder.num_prefix_tokens) == ((6, 5), 1)


class DeclaredLayout(nn.Module):
    """A model that declares a 3-pixel token grid and two prefix tokens, as every model of the package does."""

    num_prefix_tokens = 2

    def token_grid(self, image_size):
        return image_size[0] // 3, image_size[1] // 3


def test_token_layout_is_what_the_model_declares_not_a_guess():
    model = DeclaredLayout()
    assert token_layout(model, (12, 24), 2 + 4 * 8) == ((4, 8), 2)
    assert token_layout(model, (12, 24), 4 * 8) == ((4, 8), 0)         # the patches alone
    assert token_layout(model, (12, 24), 1 + 4 * 8) == (None, None)    # neither: not this model's sequence
    assert token_layout(model, (12, 12), 2 + 16) == ((4, 4), 2)        # another image size
    # a model that declares nothing gets no layout, even where a factorisation would fit
    assert token_layout(nn.Linear(1, 1), (32, 32), 49) == (None, None)


class TwoShapes(nn.Module):
    """Stands in for CaiT/CrossViT: attention maps of different shapes in one forward."""

    def __init__(self):
        super().__init__()
        self.vit = ViT(**tiny_vit_kwargs())
        self.pooled = ViT(**tiny_vit_kwargs(patch_size=(8, 8), depth=1))

    def forward(self, img):
        return self.vit(img) + self.pooled(img)


def test_maps_of_different_shapes_come_back_as_a_list_in_call_order():
    model = TwoShapes().eval()
    _, attns = Recorder(model)(torch.randn(2, 3, 16, 24))
    assert isinstance(attns, list)
    assert [tuple(attn.shape) for attn in attns] == [(2, 2, 13, 13)] * 2 + [(2, 2, 7, 7)]


def test_model_without_attention_protocol_is_refused():
    with pytest.raises(ValueError, match='attention_probs'):
        Recorder(nn.Linear(3, 3))


def test_recording_twice_at_once_is_refused():
    recorder = Recorder(ViT(**tiny_vit_kwargs()))
    with recorder, pytest.raises(RuntimeError, match='already recording'):
        recorder.start()


def test_maps_keep_the_graph_when_asked():
    model = ViT(**tiny_vit_kwargs())
    _, attns = Recorder(model, detach=False)(torch.randn(1, 3, 16, 24))
    attns[:, -1, :, 0].sum().backward()
    assert model.transformer.layers[0][0].to_qkv.weight.grad is not None


def test_extractor_returns_the_final_tokens_of_forward_features():
    images, _ = digits_batch(4, size=16)
    model = ViT(**tiny_vit_kwargs(image_size=16, patch_size=4, channels=1)).eval()
    logits, tokens = Extractor(model)(images)
    torch.testing.assert_close(tokens, model.forward_features(images))
    torch.testing.assert_close(logits, model(images))
    assert_untouched(model, [True, True])
    torch.testing.assert_close(Extractor(model, return_embeddings_only=True)(images), tokens)


def test_extractor_takes_any_named_layer():
    model = ViT(**tiny_vit_kwargs()).eval()
    img = torch.randn(2, 3, 16, 24)
    with Extractor(model, layer_name='to_patch_embedding') as extractor:
        model(img)
    torch.testing.assert_close(extractor.embeddings, model.to_patch_embedding(img))
    with pytest.raises(ValueError, match="layer_name 'blocks'"):
        Extractor(model, layer_name='blocks')


@pytest.mark.parametrize('model_cls', MODELS)
def test_intermediates_are_the_block_outputs(model_cls):
    model = model_cls(**tiny_vit_kwargs(depth=3)).eval()
    img = torch.randn(2, 3, 16, 24)
    x = model.embed(img) if hasattr(model, 'embed') else \
        model.to_patch_embedding(img) + model.pos_embedding_for(model.grid_size)
    _, expected = model.transformer(x, return_layers=True)
    tokens = forward_intermediates(model, img)
    assert len(tokens) == 3
    for got, want in zip(tokens, expected):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(forward_intermediates(model, img, [-1, 0])[1], expected[0])
    torch.testing.assert_close(forward_intermediates(model, img, 2)[0], expected[1])
    assert_untouched(model, [True] * 3)


def test_intermediate_maps_lay_patches_on_the_grid():
    model = ViT(**tiny_vit_kwargs()).eval()
    img = torch.randn(2, 3, 16, 24)
    tokens, = forward_intermediates(model, img, [1])
    maps, = forward_intermediates(model, img, [1], output='maps')
    assert maps.shape == (2, 32, 4, 3)
    # patch (row 2, column 1) is token 1 + 2 * 3 + 1
    torch.testing.assert_close(maps[:, :, 2, 1], tokens[:, 1 + 2 * 3 + 1])


def test_intermediates_do_not_change_the_model_output():
    model = ViT(**tiny_vit_kwargs()).eval()
    img = torch.randn(2, 3, 16, 24)
    expected = model(img)
    forward_intermediates(model, img)
    torch.testing.assert_close(model(img), expected, atol=0, rtol=0)


@pytest.mark.parametrize('indices', [3, 0, [2], [-3], [0.5]])
def test_intermediates_refuse_blocks_that_do_not_exist(indices):
    model = ViT(**tiny_vit_kwargs())
    with pytest.raises(ValueError, match='indices'):
        forward_intermediates(model, torch.randn(1, 3, 16, 24), indices)


def test_intermediates_refuse_an_unknown_output():
    with pytest.raises(ValueError, match="output must be 'tokens' or 'maps'"):
        forward_intermediates(ViT(**tiny_vit_kwargs()), torch.randn(1, 3, 16, 24), output='grid')


def test_extractor_by_default_catches_forward_features_and_restores_the_method():
    model = ViT(**tiny_vit_kwargs()).eval()
    img = torch.randn(2, 3, 16, 24)
    with Extractor(model) as extractor:
        logits = model(img)
    assert 'forward_features' not in vars(model)
    torch.testing.assert_close(extractor.embeddings, model.forward_features(img))
    torch.testing.assert_close(logits, model(img))


# every model registered in the package, built tiny; the recorder must see its attention through the protocol
VARIANT_KWARGS = dict(image_size=32, patch_size=8, num_classes=5, dim=32, depth=2, heads=2, mlp_dim=64, dim_head=16,
                      cls_depth=1, sm_dim=32, lg_dim=32, sm_patch_size=8, lg_patch_size=16, num_layers=2,
                      num_heads=2, embedding_dim=32, mlp_ratio=2, img_size=32)


def build_variant(name):
    models = pytest.importorskip('vit_pytorch.models')
    try:
        cls = models.model_class(name)
    except ValueError as error:
        pytest.skip(str(error))
    accepted = models.parameters(name)
    if name in models.SMALL_CONFIGS:    # multi-scale models: the trainer's small size (tuples per stage)
        extra = {key: value for key, value in VARIANT_KWARGS.items()
                 if key in ('num_classes', 'image_size', 'img_size') and key in accepted}
        return cls(**models.SMALL_CONFIGS[name], **extra).eval()
    if accepted is None:   # **kwargs passed on to the core ViT
        accepted = ('image_size', 'patch_size', 'num_classes', 'dim', 'depth', 'heads', 'mlp_dim', 'dim_head')
    return cls(**{key: value for key, value in VARIANT_KWARGS.items() if key in accepted}).eval()


try:
    from vit_pytorch.models import MODELS as REGISTERED
except ImportError:
    REGISTERED = {}


@pytest.mark.parametrize('name', sorted(REGISTERED))
def test_every_registered_model_is_recorded_without_side_effects(name):
    inputs = getattr(pytest.importorskip('vit_pytorch.models'), 'INPUTS', {})
    if name in inputs:
        pytest.skip(f'{name} takes {inputs[name]}, not images: tests/test_train_kinds.py records it on those')
    model = build_variant(name)
    fused_before = [module.fused for _, module in attention_modules(model)]
    img = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(img)
        recorder = Recorder(model)
        output, attns = recorder(img)
    assert recorder.maps, f'{name}: no attention map recorded'
    # window models (Swin, MaxViT, Twins' local attention, NesT's blocks, CrossFormer's groups, RegionViT's regions,
    # ScalableViT's and SepViT's windows) record (b * windows, heads, n, n), as their docstrings state
    assert all(attn.ndim == 4 and attn.shape[0] % 2 == 0 for attn in recorder.maps)
    if name not in ('swin', 'swinv2', 'max_vit', 'max_vit_with_registers', 'twins_svt', 'nest', 'crossformer', 'regionvit', 'scalable_vit',
                    'sep_vit'):
        assert all(attn.shape[0] == 2 for attn in recorder.maps)
    flat = lambda out: out if isinstance(out, torch.Tensor) else torch.cat([t.flatten(1) for t in out], dim=1)
    torch.testing.assert_close(flat(output), flat(expected), atol=1e-5, rtol=1e-5)
    assert_untouched(model, fused_before)


class Staged(nn.Module):
    """Stands in for a multi-scale model: it hands back its own stage maps."""

    def forward_intermediates(self, img, indices=None):
        maps = [img[:, :, ::2, ::2], img[:, :, ::4, ::4]]
        return maps if indices is None else [maps[i] for i in indices]


def test_forward_intermediates_lets_a_multi_scale_model_answer_for_itself():
    img = torch.randn(1, 3, 8, 8)
    maps = forward_intermediates(Staged(), img, indices=[1])
    assert len(maps) == 1 and maps[0].shape == (1, 3, 2, 2)


# every registered model: the recorded maps are the attention of the modules that ran (issue 23)


def explicit_layer_norm(x, norm):
    """LayerNorm over the last dimension, written out, with `norm`'s weight, bias and eps."""
    mean = x.mean(dim=-1, keepdim=True)
    variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    normed = (x - mean) / torch.sqrt(variance + norm.eps)
    normed = normed * norm.weight if norm.weight is not None else normed
    return normed + norm.bias if norm.bias is not None else normed


def explicit_linear(x, linear):
    return x @ linear.weight.T + (linear.bias if linear.bias is not None else 0)


def split_heads(t, heads):
    return rearrange(t, 'b n (h d) -> b h n d', h=heads)


def masked(logits, mask):
    """logits with a boolean mask (True: may attend) or an additive float mask applied."""
    if mask is None:
        return logits
    return logits.masked_fill(~mask, float('-inf')) if mask.dtype == torch.bool else logits + mask


def explicit_norm(x, norm):
    """The pre-norm written out: a LayerNorm, or an RMSNorm (LeVJEPA's encoders)."""
    return explicit_rms_norm(x, norm) if isinstance(norm, nn.RMSNorm) else explicit_layer_norm(x, norm)


def self_attention_q_k(module, x):
    """q and k of the pre-norm self-attention of `vit.Attention`, from its input tokens (b, n, dim)."""
    q, k, _ = explicit_linear(explicit_norm(x, module.norm), module.to_qkv).chunk(3, dim=-1)
    return split_heads(q, module.heads), split_heads(k, module.heads)


def core_attention(module, x, mask=None, key_index=None):
    """softmax(q k^T / sqrt(dim_head) + mask); `key_index` (b, m): the keys of those tokens alone (MP3's context)."""
    q, k = self_attention_q_k(module, x)
    if key_index is not None:
        k = torch.stack([k[b][:, key_index[b]] for b in range(k.shape[0])])
    return masked(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), mask).softmax(dim=-1)


def gated_attention(module, x, return_gate=False):
    """The G1 gate multiplies the attended values, after the softmax: the map is the core's."""
    return core_attention(module, x)


def qk_norm_attention(module, x, mask=None):
    """softmax(LN(q) LN(k)^T / sqrt(dim_head)): q and k layer-normed per head."""
    q, k = self_attention_q_k(module, x)
    q, k = explicit_layer_norm(q, module.q_norm), explicit_layer_norm(k, module.k_norm)
    return masked(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), mask).softmax(dim=-1)


def locality_attention(module, x):
    """Locality self-attention: softmax(q k^T * exp(temperature)) with no token attending to itself."""
    q, k = self_attention_q_k(module, x)
    logits = q @ k.transpose(-1, -2) * module.temperature.exp()
    itself = torch.eye(logits.shape[-1], dtype=torch.bool)
    return logits.masked_fill(itself, float('-inf')).softmax(dim=-1)


def class_attention(module, x):
    """The first token is the only query: softmax(q_cls k^T / sqrt(dim_head)) over every token."""
    h = explicit_layer_norm(x, module.norm) if isinstance(module.norm, nn.LayerNorm) else x
    q = split_heads(explicit_linear(h[:, :1], module.to_q), module.heads)
    k = split_heads(explicit_linear(h, module.to_kv).chunk(2, dim=-1)[0], module.heads)
    return (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(dim=-1)


def re_attention(module, x):
    """DeepViT's re-attention: the heads' softmax maps mixed by `reattn_weights`, then layer-normed across heads."""
    q, k = self_attention_q_k(module, x)
    attn = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(dim=-1)
    mixed = torch.einsum('bhij,hg->bijg', attn, module.reattn_weights)
    return rearrange(explicit_layer_norm(mixed, module.reattn_norm[1]), 'b i j h -> b h i j')


def explicit_rms_norm(x, norm):
    """RMSNorm over the last dimension, written out: x / sqrt(mean(x^2) + eps) * weight (eps None: the dtype's)."""
    eps = torch.finfo(x.dtype).eps if norm.eps is None else norm.eps
    return x / torch.sqrt((x ** 2).mean(dim=-1, keepdim=True) + eps) * norm.weight


def turned(t, angles):
    """Each channel pair (2i, 2i + 1) of t (b, h, n, d) as the complex number t_2i + j t_2i+1, times e^(j angle);
    the channels after the angles' pairs unchanged."""
    pairs = angles.shape[-1]
    z = torch.view_as_complex(rearrange(t[..., :2 * pairs].contiguous(), '... (p two) -> ... p two', two=2))
    z = torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles))
    return torch.cat((rearrange(z, '... p two -> ... (p two)'), t[..., 2 * pairs:]), dim=-1)


def vit_5_attention(module, x, *, angles):
    """ViT-5: softmax(R RMS(q) (R RMS(k))^T / sqrt(dim_head)), q, k of the RMS-normed tokens, R the rotary turn."""
    q, k, _ = explicit_linear(explicit_rms_norm(x, module.norm), module.to_qkv).chunk(3, dim=-1)
    q, k = (turned(explicit_rms_norm(split_heads(t, module.heads), norm), angles)
            for t, norm in ((q, module.q_norm), (k, module.k_norm)))
    return (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(dim=-1)


def rvt_attention(module, x, *, angles, grid):
    """RvT: softmax(R q (R k)^T / sqrt(dim_head)); the patches' queries a depthwise then a pointwise convolution
    over the grid of the layer-normed tokens, the cls token's a Linear (or none), keys a Linear."""
    h = explicit_layer_norm(x, module.norm)
    if module.use_ds_conv:
        depthwise, pointwise = module.to_q.conv
        patches = rearrange(h[:, 1:], 'b (y x) d -> b d y x', y=grid[0])
        patches = nn.functional.conv2d(patches, depthwise.weight, padding=depthwise.padding, groups=patches.shape[1])
        patches = torch.einsum('bdyx,ed->beyx', patches, pointwise.weight[:, :, 0, 0])
        cls_proj = module.to_q.cls_proj
        cls_query = h[:, :1] if isinstance(cls_proj, nn.Identity) else explicit_linear(h[:, :1], cls_proj)
        q = torch.cat((cls_query, rearrange(patches, 'b e y x -> b (y x) e')), dim=1)
    else:
        q = explicit_linear(h, module.to_q)
    k = explicit_linear(h, module.to_kv).chunk(2, dim=-1)[0]
    q, k = (split_heads(t, module.heads) for t in (q, k))
    if angles is not None:
        q, k = turned(q, angles), turned(k, angles)
    return (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(dim=-1)


def scaled_softmax(q, k, scale, bias=0.):
    """softmax(q k^T * scale + bias) over the keys."""
    return (q @ k.transpose(-1, -2) * scale + bias).softmax(dim=-1)


def padded_to(x, size):
    """A (b, h, w, c) map zero-padded at the bottom and right to `size`."""
    return nn.functional.pad(x, (0, 0, 0, size[1] - x.shape[2], 0, size[0] - x.shape[1]))


def whole_windows(size, window):
    """`size` rounded up to whole windows."""
    return tuple(-(-side // length) * length for side, length in zip(size, window))


def window_positions(size, window, interval=(1, 1)):
    """(windows, n) rows and columns of the tokens of each window of a (padded) map, windows in raster order of
    their spans, then of their offsets within a span; tokens row-major. A window holds window[0] x window[1]
    tokens `interval` apart (1: a tile of the map; CrossFormer's long-distance groups: several)."""
    (height, width), (wh, ww), (ih, iw) = size, window, interval
    rows, cols = [], []
    for span_y in range(0, height, wh * ih):
        for span_x in range(0, width, ww * iw):
            for offset_y in range(ih):
                for offset_x in range(iw):
                    rows.append([span_y + offset_y + i * ih for i in range(wh) for _ in range(ww)])
                    cols.append([span_x + offset_x + j * iw for _ in range(wh) for j in range(ww)])
    return torch.tensor(rows), torch.tensor(cols)


def windowed_heads(t, rows, cols, heads):
    """(b, h, w, heads * d) map -> (b * windows, heads, n, d) for the windows' tokens (rows, cols)."""
    return rearrange(t[:, rows, cols], 'b w n (h d) -> (b w) h n d', h=heads)


def offsets(rows, cols):
    """(windows, n, n, 2) of query minus key position for every pair of a window."""
    return torch.stack((rows[:, :, None] - rows[:, None, :], cols[:, :, None] - cols[:, None, :]), dim=-1)


def swin_regions(size, window, shift):
    """Each token's region of a shifted map (Swin, section 3.2, the official code's slices): along each axis
    [0, L - window), [L - window, L - shift), [L - shift, L), as one label per token (h, w)."""
    labels = []
    for length, length_window, length_shift in zip(size, window, shift):
        label = torch.zeros(length, dtype=torch.long)
        label[length - length_window:length - length_shift] = 1
        label[length - length_shift:] = 2
        labels.append(label)
    return labels[0][:, None] * 3 + labels[1][None, :]


def swin_mask(rows, cols, size, window, shift):
    """-100 between two tokens of a window from different regions of the shifted map, 0 within one."""
    if not any(shift):
        return 0.
    region = swin_regions(size, window, shift)[rows, cols]                 # (windows, n)
    apart = region[:, :, None] != region[:, None, :]
    return torch.zeros(apart.shape, dtype=torch.float64).masked_fill(apart, -100.)[:, None]


def table_at(table, delta, window):
    """table ((2 wh - 1) (2 ww - 1), heads) read at offsets delta (..., 2): (..., heads)."""
    return table[(delta[..., 0] + window[0] - 1) * (2 * window[1] - 1) + delta[..., 1] + window[1] - 1]


def per_batch(bias, batch):
    """(windows, heads, n, n) -> (b * windows, heads, n, n), batch outermost."""
    return bias.repeat(batch, 1, 1, 1) if torch.is_tensor(bias) and bias.ndim == 4 else bias


def swin_attention(module, x):
    """Swin: the normed map rolled by -shift, zero-padded to whole windows; in each window
    softmax(q k^T / sqrt(d) + B[query - key] + shift mask), B the learned table."""
    window, shift = module.windows.window_size, module.windows.shift_size
    b, height, width, _ = x.shape
    size = whole_windows((height, width), window)
    h = padded_to(torch.roll(explicit_layer_norm(x, module.norm), (-shift[0], -shift[1]), (1, 2)), size)
    q, k, _ = explicit_linear(h, module.to_qkv).chunk(3, dim=-1)
    rows, cols = window_positions(size, window)
    q, k = (windowed_heads(t, rows, cols, module.heads) for t in (q, k))
    bias = rearrange(table_at(module.relative_position_bias_table, offsets(rows, cols), window), 'w i j h -> w h i j')
    return scaled_softmax(q, k, q.shape[-1] ** -0.5, per_batch(bias + swin_mask(rows, cols, size, window, shift), b))


def swin_v2_attention(module, x):
    """Swin V2: softmax(cos(q, k) min(exp(logit_scale), 100) + 16 sigmoid(MLP(log-spaced offset)) + shift mask)
    within each window of the rolled map, q with a bias, k without (sections 3.2, 3.3)."""
    window, shift = module.windows.window_size, module.windows.shift_size
    b, height, width, _ = x.shape
    size = whole_windows((height, width), window)
    h = padded_to(torch.roll(x, (-shift[0], -shift[1]), (1, 2)), size)
    q, k, _ = (h @ module.to_qkv.weight.T).chunk(3, dim=-1)
    q = q + module.q_bias if module.q_bias is not None else q
    rows, cols = window_positions(size, window)
    q, k = (nn.functional.normalize(windowed_heads(t, rows, cols, module.heads), dim=-1) for t in (q, k))
    # the coordinates in float32, as the model keeps them (a float32 table, made before .double())
    delta = offsets(rows, cols).float() / torch.tensor([max(side - 1, 1) for side in window]) * 8
    log_spaced = torch.sign(delta) * torch.log2(delta.abs() + 1) / math.log2(8)
    bias = rearrange(16 * torch.sigmoid(module.cpb_mlp(log_spaced.double())), 'w i j h -> w h i j')
    scale = module.logit_scale.clamp(max=math.log(100)).exp()                # (heads, 1, 1)
    return scaled_softmax(q * scale, k, 1., per_batch(bias + swin_mask(rows, cols, size, window, shift), b))


def max_vit_attention(module, x):
    """MaxViT, on windows (windows, r + n, dim): softmax(q k^T / sqrt(d) + B[key - query]), B a (heads,
    2 wh - 1, 2 ww - 1) table; every pair with one of the r registers gets the head's register bias."""
    q, k = self_attention_q_k(module, x)
    heads, table_height, table_width = module.relative_position_bias.shape
    window = ((table_height + 1) // 2, (table_width + 1) // 2)
    registers = x.shape[1] - window[0] * window[1]
    rows, cols = window_positions(window, window)
    delta = -offsets(rows, cols)[0]                                            # key minus query
    bias = module.relative_position_bias[:, delta[..., 0] + window[0] - 1, delta[..., 1] + window[1] - 1]
    if registers:
        bias = nn.functional.pad(bias, (registers, 0, registers, 0))
        bias[:, :registers, :] = module.register_bias[:, None, None]
        bias[:, :, :registers] = module.register_bias[:, None, None]
    return scaled_softmax(q, k, q.shape[-1] ** -0.5, bias)


def crossformer_attention(module, x, size):
    """CrossFormer's SDA/LDA: the normed map zero-padded to whole spans; groups of G x G tokens `interval`
    apart (LDA; SDA: interval 1; interval None: the map is the span), softmax(q k^T / sqrt(d) + DPB(query - key))
    with -1e6 on padding keys (section 3.2-3.3)."""
    G = module.group_size
    if module.interval is None:
        group, interval = G, (size[0] // G, size[1] // G)
    elif min(size) <= G:
        group, interval = min(size), (1, 1)
    else:
        group, interval = G, (module.interval, module.interval)
    padded = tuple(-(-side // (group * i)) * group * i for side, i in zip(size, interval))
    h = padded_to(rearrange(explicit_layer_norm(x, module.norm), 'b (h w) d -> b h w d', h=size[0]), padded)
    q, k, _ = explicit_linear(h, module.to_qkv).chunk(3, dim=-1)
    rows, cols = window_positions(padded, (group, group), interval)
    q, k = (windowed_heads(t, rows, cols, module.heads) for t in (q, k))
    delta = torch.stack((rows[:, :, None] - rows[:, None, :], cols[:, :, None] - cols[:, None, :]), dim=-1)
    delta = delta // torch.tensor(interval)                                    # in group units
    bias = rearrange(module.position_bias(delta.double()), 'w i j h -> w h i j')
    padding = (rows >= size[0]) | (cols >= size[1])                            # (windows, n) keys
    bias = bias.masked_fill(padding[:, None, None, :], -1e6)
    return scaled_softmax(q, k, q.shape[-1] ** -0.5, per_batch(bias, x.shape[0]))


def levit_attention(module, x):
    """LeViT: softmax(q k^T / sqrt(dim_key) + B[h, |dy| w + |dx|]), queries on every `stride`-th row and column
    of the key grid (2 in the shrinking attention), keys on all of it (section 4.3)."""
    heads, dim_key, grid = module.heads, module.dim_key, module.grid
    if hasattr(module, 'to_q'):                                     # the shrinking attention
        queries = rearrange(rearrange(x, 'b (h w) c -> b h w c', h=grid[0])[:, ::2, ::2], 'b h w c -> b (h w) c')
        q = split_heads(module.to_q(queries), heads)
        k = split_heads(module.to_kv(x), heads)[..., :dim_key]
        stride = 2
    else:
        q, k, _ = split_heads(module.to_qkv(x), heads).split((dim_key, dim_key, module.dim_value), dim=-1)
        stride = 1
    query_rows, query_cols = (t.flatten() for t in torch.meshgrid(
        torch.arange(0, grid[0], stride), torch.arange(0, grid[1], stride), indexing='ij'))
    key_rows, key_cols = (t.flatten() for t in torch.meshgrid(
        torch.arange(grid[0]), torch.arange(grid[1]), indexing='ij'))
    index = (query_rows[:, None] - key_rows).abs() * grid[1] + (query_cols[:, None] - key_cols).abs()
    return scaled_softmax(q, k, dim_key ** -0.5, module.pos_bias[:, index])


def spatial_reduction_attention(module, x, size):
    """PVT: queries from every normed token, keys from the normed map reduced (a strided convolution, or PVT v2's
    7x7 pooling and 1x1 convolution) then layer-normed (and GELU in v2): softmax(q k^T / sqrt(d))."""
    h = explicit_layer_norm(x, module.norm)
    context = h
    if module.reduce is not None:
        reduced = module.reduce(rearrange(h, 'b (h w) d -> b d h w', h=size[0]))
        context = module.reduce_act(explicit_layer_norm(rearrange(reduced, 'b d h w -> b (h w) d'),
                                                        module.reduce_norm))
    q = split_heads(explicit_linear(h, module.to_q), module.heads)
    k = split_heads(explicit_linear(context, module.to_kv).chunk(2, dim=-1)[0], module.heads)
    return scaled_softmax(q, k, q.shape[-1] ** -0.5)


def windowed_attention(module, x, size, window):
    """Plain attention within each window of the normed (h, w) map, zero-padded to whole windows."""
    h = padded_to(rearrange(explicit_layer_norm(x, module.norm), 'b (h w) d -> b h w d', h=size[0]),
                  whole_windows(size, window))
    q, k, _ = explicit_linear(h, module.to_qkv).chunk(3, dim=-1)
    rows, cols = window_positions(whole_windows(size, window), window)
    q, k = (windowed_heads(t, rows, cols, module.heads) for t in (q, k))
    return scaled_softmax(q, k, q.shape[-1] ** -0.5)


def twins_local_attention(module, x, size):
    """Twins' LSA: attention within each window of the map, no bias."""
    return windowed_attention(module, x, size, module.windows.window_size)


def scalable_interactive_attention(module, x, size):
    """ScalableViT's IWSA: attention within each window (the whole map when window_size is None), no bias; the
    local interaction adds to the values after the softmax."""
    window = size if module.window_size is None else (module.window_size,) * 2
    return windowed_attention(module, x, size, window)


def scalable_self_attention(module, x, size):
    """ScalableViT's SSA: keys from the normed map scaled by a depthwise and pointwise convolution, layer-normed
    and GELU; softmax(q k^T / sqrt(key_dim))."""
    h = explicit_layer_norm(x, module.norm)
    context = h
    if module.reduce is not None:
        reduced = module.reduce(rearrange(h, 'b (h w) d -> b d h w', h=size[0]))
        norm, act = module.reduce_norm
        context = act(explicit_layer_norm(rearrange(reduced, 'b d h w -> b (h w) d'), norm))
    q = split_heads(explicit_linear(h, module.to_q), module.heads)
    k = split_heads(explicit_linear(context, module.to_k), module.heads)
    return scaled_softmax(q, k, q.shape[-1] ** -0.5)


def cvt_attention(module, x, *, grid):
    """CvT: q, k from depthwise convolutions (k strided) and BatchNorm of the normed map, then a Linear; prefix
    tokens skip the convolutions; softmax(q k^T / sqrt(dim)) with the full width, as the paper's code scales."""
    h = explicit_layer_norm(x, module.norm)
    prefix, patches = h[:, :module.num_prefix_tokens], h[:, module.num_prefix_tokens:]
    token_map = rearrange(patches, 'b (h w) c -> b c h w', h=grid[0])
    q, k = (split_heads(explicit_linear(torch.cat((prefix, conv(token_map)), dim=1), linear), module.heads)
            for conv, linear in ((module.to_q_conv, module.to_q), (module.to_k_conv, module.to_k)))
    return scaled_softmax(q, k, x.shape[-1] ** -0.5)


def xcit_attention(module, x):
    """XCiT: q, k L2-normalised along the tokens; softmax over key channels of temperature * q^T k (eq. 4)."""
    q, k = (nn.functional.normalize(t.transpose(-1, -2), dim=-1) for t in self_attention_q_k(module, x))
    return scaled_softmax(q * module.temperature, k, 1.)


def sep_vit_depthwise_attention(module, x):
    """SepViT's DSA on windows (b, windows, 1 + n, dim), no norm: softmax(q k^T / sqrt(d)) per window."""
    q, k, _ = explicit_linear(x, module.to_qkv).chunk(3, dim=-1)
    q, k = (rearrange(t, 'b w n (h d) -> (b w) h n d', h=module.heads) for t in (q, k))
    return scaled_softmax(q, k, q.shape[-1] ** -0.5)


def sep_vit_pointwise_attention(module, tokens, maps):
    """SepViT's PSA: the window tokens, layer-normed and GELU, attend to each other: softmax(q k^T / sqrt(d))."""
    q, k = explicit_linear(nn.functional.gelu(explicit_layer_norm(tokens, module.norm)), module.to_qk).chunk(2, dim=-1)
    q, k = split_heads(q, module.heads), split_heads(k, module.heads)
    return scaled_softmax(q, k, q.shape[-1] ** -0.5)


def regionvit_attention(module, x, mask=None, entry='forward'):
    """RegionViT. forward: the local tokens of a window and its regional token (first) attend to each other,
    softmax(q k^T / sqrt(d) + B + mask), B[key - query] from a (heads, 2 ws - 1, 2 ws - 1) table between local
    tokens, 0 in the regional token's row and column (section 3.2). among_regions: the regional tokens, normed by
    their own LayerNorm, attend to each other without a bias."""
    if entry == 'among_regions':
        q, k, _ = explicit_linear(explicit_layer_norm(x, module.region_norm), module.to_qkv).chunk(3, dim=-1)
        q, k = split_heads(q, module.heads), split_heads(k, module.heads)
        return scaled_softmax(q, k, q.shape[-1] ** -0.5)
    q, k = self_attention_q_k(module, x)
    window = (module.relative_position_bias.shape[-1] + 1) // 2
    rows, cols = window_positions((window, window), (window, window))
    delta = -offsets(rows, cols)[0]                                            # key minus query
    bias = module.relative_position_bias[:, delta[..., 0] + window - 1, delta[..., 1] + window - 1]
    bias = nn.functional.pad(bias, (1, 0, 1, 0))
    return masked(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias, mask).softmax(dim=-1)


def token_sampling_attention(module, x, *, mask=None):
    """ATS: softmax(q k^T / sqrt(d)) over the real keys (`mask` (b, n): which tokens are real); in a sampling layer
    (n - 1 > K, or any layer with a K under always_sample) only the rows of the cls token and of the min(K, n - 1)
    sampled tokens, which the parameter-free sampler (checked against the official one in tests/test_ats_vit.py)
    picks from this map's cls row and the values."""
    h = explicit_linear(explicit_layer_norm(x, module.norm), module.to_qkv)
    q, k, v = (split_heads(t, module.heads) for t in h.chunk(3, dim=-1))
    attn = masked(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), None if mask is None else mask[:, None, None])
    attn = attn.softmax(dim=-1)
    if module.ats is None or (not module.always_sample and x.shape[1] - 1 <= module.output_num_tokens):
        return attn
    ids, _ = module.ats(attn[:, :, 0], v)
    rows = torch.cat((torch.zeros_like(ids[:, :1]), ids), dim=1)
    return attn.gather(2, rows[:, None, :, None].expand(-1, attn.shape[1], -1, attn.shape[-1]))


def grouped_projection(x, linear, heads):
    """A Linear, or DCA's grouped one: group g of x (g, b, n, dim) through rows g of the weight; split in heads."""
    if x.ndim == 3:
        return split_heads(explicit_linear(x, linear), heads)
    weight = rearrange(linear.weight, '(g e) d -> g e d', g=x.shape[0])
    return split_heads(rearrange(torch.einsum('gbnd,ged->bnge', x, weight), 'b n g e -> b n (g e)'), heads)


def depth_mixed_attention(module, xq, xk, xv):
    """Attention residuals with DCA: q from RMS(xq), k from RMS(xk) (each its RMSNorm; with head groups a group of
    heads from its own mix); softmax(q k^T / sqrt(d)). The gate multiplies the output, after the map."""
    q = grouped_projection(explicit_rms_norm(xq, module.norm_q), module.to_q, module.heads)
    k = grouped_projection(explicit_rms_norm(xk, module.norm_k), module.to_k, module.heads)
    return scaled_softmax(q, k, q.shape[-1] ** -0.5)


def talking_heads_attention(module, x):
    """CaiT's talking heads: softmax over the keys of the logits q k^T / sqrt(d) mixed across heads by the pre-softmax
    map (heads x heads weight, and a bias per head); the post-softmax mixing comes after the recorded map."""
    q, k = self_attention_q_k(module, x)
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mix = module.mix_heads_pre_attn
    return (torch.einsum('bhij,gh->bgij', logits, mix.weight) + mix.bias[:, None, None]).softmax(dim=-1)


def jet_linear_attention(module, x):
    """JetViT's LA records relu(q) relu(k)^T with each row divided by its sum (floored at 1e-6), no scale: the
    weights its linear-time path applies to the values (not a softmax)."""
    q, k = (t.relu() for t in self_attention_q_k(module, x))
    weights = q @ k.transpose(-1, -2)
    return weights / weights.sum(dim=-1, keepdim=True).clamp(min=1e-6)


def jet_window_attention(module, x):
    """JetViT's WA: within each window_size^2 window of the grid (windows row-major), softmax(q k^T / sqrt(d) +
    B[query - key]), B the (2 w - 1)^2 x heads table (vit-pytorch's index, query minus key)."""
    window = (module.window_size,) * 2
    h = rearrange(explicit_layer_norm(x, module.norm), 'b (y x) d -> b y x d', y=module.grid[0])
    q, k, _ = explicit_linear(h, module.to_qkv).chunk(3, dim=-1)
    rows, cols = window_positions(module.grid, window)
    q, k = (windowed_heads(t, rows, cols, module.heads) for t in (q, k))
    bias = rearrange(table_at(module.rel_pos_bias.weight, offsets(rows, cols), window), 'w i j h -> w h i j')
    return scaled_softmax(q, k, q.shape[-1] ** -0.5, per_batch(bias, x.shape[0]))


def memory_attention(module, x, *, memories=None, mask=None):
    """Learnable memory: the layer's memory tokens join the keys (normed and projected as tokens), only the n
    tokens ask queries; softmax(q k^T / sqrt(d) + mask) over the tokens, then the memories."""
    num_tokens = x.shape[1]
    if memories is not None:
        x = torch.cat((x, memories[module.layer_index].expand(x.shape[0], -1, -1)), dim=1)
    q, k = self_attention_q_k(module, x)
    return masked(q[:, :, :num_tokens] @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), mask).softmax(dim=-1)


def lookup_attention(module, compressed, lookup):
    """LookViT's lookup attention: the compressed tokens (normed by `norm`) ask, the lookup tokens (normed by
    `norm_context`) answer: softmax(q k^T / sqrt(d))."""
    q = split_heads(explicit_linear(explicit_layer_norm(compressed, module.norm), module.to_q), module.heads)
    k = split_heads(explicit_linear(explicit_layer_norm(lookup, module.norm_context), module.to_kv).chunk(2, -1)[0],
                    module.heads)
    return scaled_softmax(q, k, q.shape[-1] ** -0.5)


def reverse_attention(module, compressed, dots):
    """LookViT's reverse attention takes the lookup attention's logits q k^T / sqrt(d) (b, h, m, n) of the same
    layer: the lookup tokens' weights over the compressed tokens, softmax(k q^T / sqrt(d)), are those transposed
    (lookup_attention recomputes the logits themselves from q and k)."""
    return dots.transpose(-1, -2).softmax(dim=-1)


def qk_normed(t, gamma):
    """NaViT's QK norm: each head's vector scaled to norm sqrt(d) (a zero vector, a padding token's, stays zero: the
    norm floored at 1e-12), times the learned gain."""
    return t / t.norm(dim=-1, keepdim=True).clamp_min(1e-12) * math.sqrt(t.shape[-1]) * gamma


def segment_maps(q, k, segments, logits_of):
    """One map per run of `segments` (count, queries, keys) of a packed sequence (1, h, n, d): the images of a run
    stacked, (count, h, queries, keys), each attending within itself."""
    maps, q_start, k_start = [], 0, 0
    for count, queries, keys in segments:
        q_run = rearrange(q[:, :, q_start:q_start + count * queries], '1 h (c n) d -> c h n d', c=count)
        k_run = rearrange(k[:, :, k_start:k_start + count * keys], '1 h (c n) d -> c h n d', c=count)
        maps.append(logits_of(q_run, k_run).softmax(dim=-1))
        q_start, k_start = q_start + count * queries, k_start + count * keys
    return maps


def na_vit_attention(module, x, *, context=None, mask=None, segments=None):
    """NaViT: q from the normed tokens, k from the context (default: the normed tokens; not normed again, its
    non-finite values zeroed under a mask), both QK-normed (norm sqrt(d) times a gain), no scale: softmax(q k^T +
    mask); with `segments` one map per run of images of a packed sequence."""
    h = explicit_layer_norm(x, module.norm)
    context = h if context is None else context
    if mask is not None:
        context = torch.nan_to_num(context, nan=0., posinf=0., neginf=0.)
    q = qk_normed(split_heads(explicit_linear(h, module.to_q), module.heads), module.q_norm.gamma)
    k = qk_normed(split_heads(explicit_linear(context, module.to_kv).chunk(2, dim=-1)[0], module.heads),
                  module.k_norm.gamma)
    if segments is not None:
        return segment_maps(q, k, segments, lambda q, k: q @ k.transpose(-1, -2))
    return masked(q @ k.transpose(-1, -2), mask).softmax(dim=-1)


def nested_na_vit_attention(module, x, *, context=None, segments):
    """NaViT (nested tensors): q from the normed tokens, k from the context (default: the same), each head's q and k
    layer-normed (no bias); softmax(q k^T / sqrt(d)) within each image of each run of `segments`."""
    h = explicit_layer_norm(x, module.norm)
    context = h if context is None else context
    q = explicit_layer_norm(split_heads(explicit_linear(h, module.to_queries), module.heads), module.query_norm)
    k = explicit_layer_norm(split_heads(explicit_linear(context, module.to_keys), module.heads), module.key_norm)
    return segment_maps(q, k, segments, lambda q, k: q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))


def normalized_attention(module, x):
    """nGPT (eq. 15-16): q, k from the unit-row projection (the weight's rows normalised), each head's vector
    normalised then times s_qk (param * init / scale), softmax(q k^T * sqrt(d_head)); no norm before it."""
    weight = module.to_qkv.weight / module.to_qkv.weight.norm(dim=-1, keepdim=True)
    q, k, _ = (x @ weight.T).chunk(3, dim=-1)
    s_qk = module.s_qk.param * module.s_qk.factor
    q, k = (split_heads(t, module.heads) for t in (q, k))
    q, k = (t / t.norm(dim=-1, keepdim=True) * s_qk for t in (q, k))
    return scaled_softmax(q, k, math.sqrt(q.shape[-1]))


def relative_projected_attention(module, x, *, grid):
    """softmax(q k^T / sqrt(d) + b), b[h, i, j] = sum over the axes a and curves c of w(x_i)[a, h, c] *
    bank[a, c, pos_i,a - pos_j,a + max_dist - 1], w a Linear of the block's input before its norm; 0 where an offset
    reaches max_dist."""
    position_bias = module.rel_pos_bias
    axes, max_dist = position_bias.dim_pos, position_bias.max_dist
    weights = rearrange(explicit_linear(x, position_bias.to_distance_weights[0]), 'b n (a h c) -> a b h n c',
                        a=axes, h=module.heads)
    positions = torch.cartesian_prod(*(torch.arange(side) for side in grid)).reshape(-1, len(grid))
    delta = positions[:, None, :] - positions[None, :, :]                           # (n, n, axes) query minus key
    bias = 0.
    for axis in range(axes):
        curves = position_bias.distance_banks[axis][:, (delta[..., axis] + max_dist - 1).clamp(0, 2 * max_dist - 2)]
        bias = bias + torch.einsum('bhic,cij->bhij', weights[axis], curves)
    bias = bias.masked_fill((delta.abs() >= max_dist).any(dim=-1), 0.)
    return core_attention(module, x, bias)


def specialized_cls_attention(module, x):
    """SimpleViT with a specialized cls: the cls token normed (and projected, where specialized) by its own
    LayerNorm (and Linear), the patches by theirs; softmax(q k^T / sqrt(d))."""
    norms = module.norm.fns
    h = torch.cat((explicit_layer_norm(x[:, :1], norms[0]), explicit_layer_norm(x[:, 1:], norms[1])), dim=1)
    to_qkv = module.to_qkv.fns if hasattr(module.to_qkv, 'fns') else (module.to_qkv, module.to_qkv)
    qkv = torch.cat((explicit_linear(h[:, :1], to_qkv[0]), explicit_linear(h[:, 1:], to_qkv[1])), dim=1)
    q, k, _ = (split_heads(t, module.heads) for t in qkv.chunk(3, dim=-1))
    return scaled_softmax(q, k, q.shape[-1] ** -0.5)


def value_residual_attention(module, x, value_residual=None):
    """Value residual learning mixes the values only: the map is SimpleViT's softmax(q k^T / sqrt(d))."""
    return core_attention(module, x)


def token_attention(module, x):
    """T2T's token attention: one head, softmax(q k^T / sqrt(dim)) scaled by the INPUT width (the official code's),
    not the head's."""
    q, k = self_attention_q_k(module, x)
    return scaled_softmax(q, k, x.shape[-1] ** -0.5)


def rotary_attention(module, x, *, angles=None, mask=None):
    """RoPE: softmax(R q (R k)^T / sqrt(d) + mask), R the rotary turn of each channel pair by its angle."""
    q, k = self_attention_q_k(module, x)
    if angles is not None:
        q, k = turned(q, angles), turned(k, angles)
    return masked(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), mask).softmax(dim=-1)


def pope_attention(module, x, *, angles, key_angles, mask=None):
    """PoPE: logit(i, j) = sum_f softplus(q_if) softplus(k_jf) cos(angle_if - key_angle_jf) / sqrt(d) + mask, the
    real part of the complex product of the polar query and the conjugate key (key_angles: the angles plus the
    model's clamped phase offset)."""
    q, k = (nn.functional.softplus(t) for t in self_attention_q_k(module, x))
    cosines = torch.cos(angles[..., :, None, :] - key_angles[..., None, :, :])      # (..., i, j, f)
    logits = (q[..., :, None, :] * k[..., None, :, :] * cosines).sum(dim=-1)
    return masked(logits / math.sqrt(q.shape[-1]), mask).softmax(dim=-1)


def prenormed_attention(module, normed):
    """ViT with decorrelation: the core attention on tokens the stack has normed already (with `module.norm`)."""
    q, k, _ = explicit_linear(normed, module.to_qkv).chunk(3, dim=-1)
    q, k = split_heads(q, module.heads), split_heads(k, module.heads)
    return scaled_softmax(q, k, q.shape[-1] ** -0.5)


def patch_merger_attention(module, x):
    """The patch merger: its learned queries over the normed tokens, one head, softmax(queries . LN(x) / sqrt(dim))."""
    h = explicit_layer_norm(x, module.norm)
    return (module.queries @ h.transpose(-1, -2) / math.sqrt(x.shape[-1])).softmax(dim=-1)[:, None]


def mutual_attention(module, tokens, slots, mask):
    """WWT's slot gathering: each token's weights over the slots, softmax over the slots of q_tokens k_slots^T /
    sqrt(d) + mask, the first query group and mask group (the tokens and slots come normed)."""
    q = rearrange(tokens @ module.to_qkv.weight.T, 'b t (g h d) -> g b h t d', g=module.q_groups + 1,
                  h=module.heads)[0]
    k = split_heads((slots @ module.to_k_v_slots.weight.T).chunk(2, dim=-1)[0], module.heads)
    return scaled_softmax(q, k, q.shape[-1] ** -0.5, mask[:, 0])


def vat_attention(module, x, context=None):
    """VAT's attention (its towers, the policy): q from the normed tokens, k from the `context` normed by its own
    LayerNorm (self-attention: from the normed tokens); softmax(q k^T / sqrt(d)). The head gate multiplies the
    output, after the map."""
    h = explicit_layer_norm(x, module.norm)
    keys_from = h if context is None else explicit_layer_norm(context, module.context_norm)
    q = split_heads(explicit_linear(h, module.to_q), module.heads)
    k = split_heads(explicit_linear(keys_from, module.to_kv).chunk(2, dim=-1)[0], module.heads)
    return scaled_softmax(q, k, q.shape[-1] ** -0.5)


# attention methods besides forward that record a map (RegionViT's regional attention)
ENTRY_POINTS = {'among_regions'}


def explicit_formulas():
    """Attention class (exactly: a subclass may change the formula) -> its map recomputed from the module's input."""
    from vit_pytorch import deepvit, rvt, simple_vit, simple_vit_with_qk_norm, vit, vit_5, vit_for_small_dataset
    from vit_pytorch import looped_vit, simple_vit_with_sparse_gating
    from vit_pytorch import crossformer, cvt, levit, max_vit, multiscale, regionvit, scalable_vit, sep_vit, swin
    from vit_pytorch import twins_svt, xcit
    multi_scale = {swin.WindowAttention: swin_attention, swin.CosineWindowAttention: swin_v2_attention,
                   max_vit.WindowAttention: max_vit_attention, crossformer.CrossScaleAttention: crossformer_attention,
                   levit.Attention: levit_attention, levit.SubsampleAttention: levit_attention,
                   multiscale.SpatialReductionAttention: spatial_reduction_attention,
                   twins_svt.LocallyGroupedAttention: twins_local_attention,
                   scalable_vit.InteractiveWindowAttention: scalable_interactive_attention,
                   scalable_vit.ScalableSelfAttention: scalable_self_attention, cvt.ConvAttention: cvt_attention,
                   xcit.XCAttention: xcit_attention, sep_vit.DepthwiseSelfAttention: sep_vit_depthwise_attention,
                   sep_vit.PointwiseSelfAttention: sep_vit_pointwise_attention,
                   regionvit.RegionToLocalAttention: regionvit_attention}
    from vit_pytorch import ats_vit, attn_residual_with_dca_simple_vit, cait, jet_vit, learnable_memory_vit, look_vit
    from vit_pytorch import na_vit, na_vit_nested_tensor, normalized_vit, simple_vit_with_relative_proj_pos_bias
    from vit_pytorch import simple_vit_with_specialized_cls, simple_vit_with_value_residual, t2t, vit_nd_pope
    from vit_pytorch import vit_with_decorr, vit_with_patch_merger, wwt
    from vit_pytorch import levjepa, vat
    # the encoders of wrappers that are no conformance row (test_the_encoders_inside_wrappers_record_their_formulas)
    wrapped = {levjepa.Attention: rotary_attention, vat.Attention: vat_attention}
    long_tail = {ats_vit.Attention: token_sampling_attention,
                 attn_residual_with_dca_simple_vit.Attention: depth_mixed_attention,
                 cait.TalkingHeadsAttention: talking_heads_attention, jet_vit.LinearAttention: jet_linear_attention,
                 jet_vit.WindowAttention: jet_window_attention, learnable_memory_vit.Attention: memory_attention,
                 look_vit.LookupAttention: lookup_attention, look_vit.ReverseAttention: reverse_attention,
                 na_vit.Attention: na_vit_attention, na_vit_nested_tensor.Attention: nested_na_vit_attention,
                 normalized_vit.Attention: normalized_attention,
                 simple_vit_with_relative_proj_pos_bias.Attention: relative_projected_attention,
                 simple_vit_with_specialized_cls.Attention: specialized_cls_attention,
                 simple_vit_with_value_residual.Attention: value_residual_attention,
                 t2t.TokenAttention: token_attention, vit.RotaryAttention: rotary_attention,
                 vit_nd_pope.Attention: pope_attention, vit_with_decorr.Attention: prenormed_attention,
                 vit_with_patch_merger.PatchMerger: patch_merger_attention, wwt.MutualAttention: mutual_attention}
    return {**multi_scale, **long_tail, **wrapped, vit.Attention: core_attention,
            simple_vit.Attention: core_attention, simple_vit_with_qk_norm.Attention: qk_norm_attention,
            vit_for_small_dataset.LSA: locality_attention, vit.ClassAttention: class_attention,
            deepvit.ReAttention: re_attention, vit_5.Attention: vit_5_attention, rvt.Attention: rvt_attention,
            simple_vit_with_sparse_gating.GatedAttention: gated_attention, looped_vit.Attention: core_attention}


# the window, shift and group sizes the formulas read from a module, against the sizes the row was built with (its
# kwargs): a module that silently used another window (Twins with (w, w + 1)) would pass the formula, which reads the
# same wrong size. Each entry: (module, its name, the row's kwargs, the call's arguments) -> (read, configured).


def index_after(name, part):
    """The index after `part.` in a module name: index_after('stages.1.blocks.layers.0.0.fn', 'stages') == 1."""
    return int(name.split(f'{part}.')[1].split('.')[0])


def per_stage(value, stage):
    return value[stage] if isinstance(value, (tuple, list)) else value


def pair(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def table_window(table):
    """The (wh, ww) window of a (..., 2 wh - 1, 2 ww - 1) relative bias table."""
    return (table.shape[-2] + 1) // 2, (table.shape[-1] + 1) // 2


def swin_windows(module, name, kwargs, x):
    """Swin: window_size on every stage, the whole map where it is no larger (no shift there); every second block
    shifted by half a window (section 3.2)."""
    side, shifted = kwargs['window_size'], index_after(name, 'layers') % 2 == 1
    window = tuple(min(length, side) for length in x.shape[1:3])
    shift = tuple(side // 2 if shifted and length > side else 0 for length in x.shape[1:3])
    return (module.windows.window_size, module.windows.shift_size), (window, shift)


def twins_windows(module, name, kwargs, x, size):
    return ((module.windows.window_size, module.windows.shift_size),
            (pair(kwargs[f"s{index_after(name, 'stages') + 1}_local_patch_size"]), (0, 0)))


def crossformer_groups(module, name, kwargs, x, size):
    """CrossFormer (vit-pytorch's arguments): SDA blocks (even) groups of local_window_size[stage], LDA blocks (odd)
    global_window_size tokens a side spread over the map (interval None)."""
    stage, lda = index_after(name, 'stages'), index_after(name, 'layers') % 2 == 1
    configured = (kwargs['global_window_size'], None) if lda else (per_stage(kwargs['local_window_size'], stage), 1)
    return (module.group_size, module.interval), configured


def configured_windows():
    from vit_pytorch import crossformer, jet_vit, max_vit, regionvit, scalable_vit, swin, twins_svt
    return {
        swin.WindowAttention: swin_windows, swin.CosineWindowAttention: swin_windows,
        twins_svt.LocallyGroupedAttention: twins_windows, crossformer.CrossScaleAttention: crossformer_groups,
        max_vit.WindowAttention: lambda module, name, kwargs, *args: (
            table_window(module.relative_position_bias), pair(kwargs['window_size'])),
        regionvit.RegionToLocalAttention: lambda module, name, kwargs, *args, **entry: (
            table_window(module.relative_position_bias), pair(kwargs['window_size'])),
        scalable_vit.InteractiveWindowAttention: lambda module, name, kwargs, *args: (
            module.window_size, per_stage(kwargs['window_size'], index_after(name, 'stages'))),
        jet_vit.WindowAttention: lambda module, name, kwargs, *args: (
            (module.window_size, module.grid),
            (kwargs['window_size'], tuple(side // patch for side, patch in
                                          zip(pair(kwargs['image_size']), pair(kwargs['patch_size']))))),
    }


# attention classes that run in a row but get no formula, with the reason (none: every one has its formula)
NO_FORMULA = {}


# the recorded map is not a distribution over keys by design: DeepViT records the re-attention map (mixed and
# layer-normed across heads), which is what multiplies the values; its formula above checks it exactly
NOT_A_DISTRIBUTION = {'deepvit.ReAttention'}


def class_name(module):
    return f"{type(module).__module__.rpartition('.')[2]}.{type(module).__name__}"


def attention_off_initialisation(model, seed=4):
    """The attention modules' parameters moved off their initialisation: a bias table that starts at zero (LeViT's,
    MaxViT's register bias), a temperature at one (XCiT's) or a norm's unit weight would let a formula that drops
    it pass."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, module in attention_modules(model):
            for param in module.parameters():
                param.add_(0.05 * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return model


@functools.cache
def recorded_run(case_id):
    """(model, every call of an attention module as (name, module, args, kwargs), the recorder) of the row's model
    in float64 and eval mode, recorded on the row's input; built once a row for the three tests that read it."""
    import test_conformance as conformance
    model, x = conformance.build(case_id)
    model = model.double().eval()
    x = [image.double() for image in x] if isinstance(x, list) else x.double()
    attention_off_initialisation(model)
    calls = []
    handles = [module.register_forward_pre_hook(
        lambda module, args, kwargs, name=name: calls.append((name, module, args, kwargs)), with_kwargs=True)
        for name, module in attention_modules(model)]
    # an attention entry point besides forward (RegionViT's regional attention) is logged as a call with
    # entry=<method> among its keyword arguments, in call order with the forward calls
    entered = []
    for name, module in attention_modules(model):
        for method in ENTRY_POINTS.intersection(dir(module)):
            def logged(*args, name=name, module=module, method=method, original=getattr(module, method), **kwargs):
                calls.append((name, module, args, {**kwargs, 'entry': method}))
                return original(*args, **kwargs)
            setattr(module, method, logged)
            entered.append((module, method))
    try:
        recorder = Recorder(model)
        with torch.no_grad():
            recorder(x, **conformance.CASES[case_id].forward)
    finally:
        for handle in handles:
            handle.remove()
        for module, method in entered:
            delattr(module, method)
    return model, calls, recorder


def conformance_rows():
    import test_conformance as conformance
    return sorted(conformance.CASES)


@pytest.mark.parametrize('case_id', conformance_rows())
def test_every_attention_module_that_runs_is_recorded(case_id):
    """A model with attention whose maps the recorder misses (a module that bypasses `attention_probs`) fails."""
    _, calls, recorder = recorded_run(case_id)
    assert calls, f'{case_id}: no attention module ran'
    assert set(recorder.names) == {name for name, *_ in calls}


@pytest.mark.parametrize('case_id', conformance_rows())
def test_recorded_maps_are_distributions_over_the_keys(case_id):
    """Every map but a re-attention map: non-negative, each query's row summing to 1 over the keys."""
    model, _, recorder = recorded_run(case_id)
    modules = dict(model.named_modules())
    assert recorder.maps, f'{case_id}: no map recorded'
    for name, attn in zip(recorder.names, recorder.maps, strict=True):
        if class_name(modules[name]) in NOT_A_DISTRIBUTION:
            continue
        assert torch.isfinite(attn).all() and (attn >= 0).all(), name
        torch.testing.assert_close(attn.sum(dim=-1), torch.ones(attn.shape[:-1], dtype=attn.dtype),
                                   atol=1e-12, rtol=0, msg=name)


@pytest.mark.parametrize('case_id', conformance_rows())
def test_every_recorded_attention_of_a_conformance_row_weighs_at_least_two_keys(case_id):
    """The rows' rule (tests/test_conformance.py): a softmax over one key is 1 whatever the query, so if every query
    of a map weighs one key the query projection gets no gradient; a key masked out (weight 0) does not count. A
    causal map's first query sees itself alone by design, so the rule asks, per image and head, for some query
    weighing two keys or more."""
    _, _, recorder = recorded_run(case_id)
    for name, attn in zip(recorder.names, recorder.maps, strict=True):
        keys = (attn != 0).sum(dim=-1).amax(dim=-1).min().item()       # (..., queries, keys) -> most keys of a query
        assert keys >= 2, f'{case_id}: {name} (map {tuple(attn.shape)}) weighs {keys} key(s) for every query'


@pytest.mark.parametrize('case_id', conformance_rows())
def test_recorded_maps_equal_the_attention_recomputed_from_each_modules_input(case_id):
    """Every attention class that runs in a row has a formula in `explicit_formulas`: ViT's, SimpleViT's, QK-norm,
    LSA, class attention, re-attention, ViT-5's and RvT's rotary attention; Swin's window attention with its relative
    bias and shift mask, Swin V2's cosine attention, MaxViT's windows with registers, CrossFormer's groups with
    padding, LeViT's and its shrinking attention with the offset bias, PVT's spatial reduction (PVT v2, Twins),
    Twins' local windows, CvT's convolutional projections, XCiT's cross-covariance, ScalableViT's SSA and IWSA,
    SepViT's DSA and PSA, RegionViT's local and regional attention; ATS's sampled rows, DCA's depth-mixed q and k,
    CaiT's talking heads, JetViT's linear (row-normalised relu(q) relu(k)^T, not a softmax) and window attention,
    learnable memories, LookViT's lookup and reverse attention, NaViT's QK-normed attention (per packed run),
    nViT's, the projected relative bias, the specialized cls norms, value residuals, T2T's token attention, RoPE
    (vit_nd_rotary), PoPE, ViT with decorrelation, the patch merger's learned queries, WWT's slot gathering. The
    i-th map of a module is its formula on the module's input of its i-th call (a formula gives a list where a call
    records several maps). Window, shift and group sizes are read from the module and checked against the row's
    configuration (`configured_windows`); the scores, scales, biases and masks are recomputed."""
    import test_conformance as conformance
    formulas, windows = explicit_formulas(), configured_windows()
    _, calls, recorder = recorded_run(case_id)
    missing = {class_name(module) for _, module, *_ in calls if type(module) not in formulas} - set(NO_FORMULA)
    assert not missing, f'{case_id}: no formula for {sorted(missing)} (add one, or its reason to NO_FORMULA)'
    exact = [(name, module, args, kwargs) for name, module, args, kwargs in calls if type(module) in formulas]
    if not exact:
        pytest.skip(f'{case_id}: its attention classes are in NO_FORMULA')
    maps = {}
    for name, attn in zip(recorder.names, recorder.maps, strict=True):
        maps.setdefault(name, []).append(attn)
    seen = {}
    for name, module, args, kwargs in exact:
        if type(module) in windows:
            read, configured = windows[type(module)](module, name, conformance.CASES[case_id].kwargs, *args, **kwargs)
            assert read == configured, f'{name}: the formula would read {read}, the row configures {configured}'
        expected = formulas[type(module)](module, *args, **kwargs)
        # a formula gives a list where one call records several maps (NaViT's runs of packed images)
        for attn in expected if isinstance(expected, list) else [expected]:
            index = seen[name] = seen.get(name, -1) + 1
            assert index < len(maps.get(name, [])), f'{name}: map {index} was not recorded'
            torch.testing.assert_close(maps[name][index], attn, atol=1e-10, rtol=0, msg=name)
    assert all(len(maps[name]) == count + 1 for name, count in seen.items())


def maps_and_formulas(model, x, **forward):
    """[(name, recorded map, its formula)] of every attention call of `model` on `x` (float64), in call order."""
    formulas, calls = explicit_formulas(), []
    handles = [module.register_forward_pre_hook(
        lambda module, args, kwargs, name=name: calls.append((name, module, args, kwargs)), with_kwargs=True)
        for name, module in attention_modules(model)]
    try:
        recorder = Recorder(model)
        with torch.no_grad():
            recorder(x, **forward)
    finally:
        for handle in handles:
            handle.remove()
    expected = []
    for name, module, args, kwargs in calls:
        attn = formulas[type(module)](module, *args, **kwargs)
        expected += [(name, map_) for map_ in (attn if isinstance(attn, list) else [attn])]
    assert [name for name, _ in expected] == recorder.names
    return [(name, recorded, attn) for (name, attn), recorded in zip(expected, recorder.maps)]


def navit_packed_with_a_mask():
    from vit_pytorch.na_vit import NaViT
    model = NaViT(image_size=(32, 48), patch_size=8, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32,
                  packing='mask').double().eval()
    images = [[torch.randn(3, 16, 24), torch.randn(3, 32, 16)], [torch.randn(3, 24, 48)]]
    return model, [[image.double() for image in group] for group in images]


def memories_with_their_mask():
    from vit_pytorch.learnable_memory_vit import Adapter, ViT as MemoryViT
    adapter = Adapter(vit=MemoryViT(**tiny_vit_kwargs()), num_memories_per_layer=3, num_classes=4).double().eval()
    return adapter, torch.randn(2, 3, 16, 24, dtype=torch.float64)


@pytest.mark.parametrize('build', [navit_packed_with_a_mask, memories_with_their_mask])
def test_formula_paths_no_conformance_row_reaches(build):
    """NaViT's 'mask' packing (padded sequences of several images, a block-diagonal mask, padding tokens whose QK norm
    is 0 / 0 unless floored, the pooling's masked cross-attention) and learnable memories with the adapter's mask:
    the rows run neither, so their formulas' masks are checked here."""
    torch.manual_seed(0)
    model, x = build()
    with torch.no_grad():
        for _, module in attention_modules(model):
            for param in module.parameters():
                param.add_(0.05 * torch.randn_like(param))
    pairs = maps_and_formulas(model, x)
    assert any((recorded == 0).any() for _, recorded, _ in pairs)          # some key masked out
    for name, recorded, attn in pairs:
        torch.testing.assert_close(recorded, attn, atol=1e-10, rtol=0, msg=name)


# the encoders inside wrappers that are no conformance row (tests/test_conformance.py's build_wrapper builds them),
# recorded on the input and keyword arguments their wrapper gives them (issues 26/28). Each run: the wrapper ->
# (the module recorded, its input, its keyword arguments, the number of keys of its first map). Inputs are float64.


def generated(seed, *shape, uniform=False):
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand if uniform else torch.randn)(*shape, generator=generator, dtype=torch.float64)


def policy_inputs(audio=False):
    """VAT_POLICY's forward: 2 views x 2 frames of 16 x 24 images (and 2 audio views of 300 samples), tasks,
    advantages and the extra token."""
    inputs = dict(tasks=torch.tensor([0, 1]), advantages=torch.tensor([-1, 1]), extra=generated(3, 2, 3))
    return {**inputs, 'audio_or_spec': generated(4, 2, 2, 300)} if audio else inputs


WRAPPER_ENCODERS = {
    # LeVJEPA calls its VideoTransformer on each view, in training with drop_ratio (0.5 here): every token with the
    # block-causal mask in eval (1 + 2 frames x 2 x 3 patches), a random half of each clip's 12 patches in its own
    # order in training (1 + 6), their rotary angles and mask gathered with them
    'levjepa': lambda w: (w.encoder, generated(1, 2, 3, 2, 16, 24, uniform=True), {}, 13),
    'levjepa[drop]': lambda w: (w.encoder.train(), generated(1, 2, 3, 2, 16, 24, uniform=True),
                                dict(drop_ratio=w.drop_ratio), 7),
    # LeVJEPAND's NDTransformer: a 4 x 3 grid of patches, causal along the first axis
    'levjepa_nd': lambda w: (w.encoder, generated(1, 2, 2, 8, 12), {}, 13),
    'levjepa_nd[drop]': lambda w: (w.encoder.train(), generated(1, 2, 2, 8, 12), dict(drop_ratio=w.drop_ratio), 7),
    # MP3's ViT on its own (fine-tuning), and as the wrapper runs it: the patches without positions, every layer's
    # keys its own tokens of the 6 context patches (6 of 12 masked out: no key)
    'mp3': lambda w: (w.vit, generated(1, 2, 3, 16, 24), {}, 12),
    'mp3[context]': lambda w: (w, generated(1, 2, 3, 16, 24), dict(noise=generated(2, 2, 12)), 6),
    # VAAT's towers: the VAT ViT (1 cls + 1 register + 12 patches), the AST on 300 samples (a 65 x 26 spectrogram:
    # 8 x 3 patches, 4 registers); then the whole wrapper, whose policy cross-attends to both
    'vaat[vit]': lambda w: (w.vit, generated(1, 4, 3, 16, 24), {}, 14),
    'vaat[ast]': lambda w: (w.ast, generated(1, 4, 300), {}, 28),
    'vaat': lambda w: (w, generated(1, 2, 2, 3, 2, 16, 24), policy_inputs(audio=True), 14),
    # SigLIPVAT's SigLIP tower (no cls token, biased projections, LayerNorms of eps 1e-6: 2 x 2 patches), then
    # the whole wrapper, whose policy cross-attends to it
    'vat_siglip[tower]': lambda w: (w.vit, generated(1, 4, 3, 16, 16), {}, 4),
    'vat_siglip': lambda w: (w, generated(1, 2, 2, 3, 2, 16, 16), policy_inputs(), 4),
}


@pytest.mark.parametrize('run', sorted(WRAPPER_ENCODERS))
def test_the_encoders_inside_wrappers_record_their_formulas(run):
    """Every attention module of the encoder a wrapper uses is recorded, and each map is its formula
    (`explicit_formulas`: LeVJEPA's RMS-normed rotary attention under its mask, the core attention, VAT's gated
    attention) on the module's input, whatever the wrapper hands it (token dropping, a context mask, a context)."""
    import test_conformance as conformance
    wrapper = attention_off_initialisation(conformance.build_wrapper(run.split('[')[0]).double().eval())
    model, x, forward, keys = WRAPPER_ENCODERS[run](wrapper)
    torch.manual_seed(0)                                    # the tokens a training forward keeps
    pairs = maps_and_formulas(model, x, **forward)
    assert {name for name, *_ in pairs} == {name for name, _ in attention_modules(model)}
    assert pairs[0][1].shape[-1] == keys
    for name, recorded, attn in pairs:
        torch.testing.assert_close(recorded, attn, atol=1e-10, rtol=0, msg=name)
