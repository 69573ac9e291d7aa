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
