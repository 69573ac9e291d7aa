"""The paper's ViT by name, and loading timm / Hugging Face / JAX checkpoints.

Parity references: fixtures written by tests/fixtures/make_reference_fixtures.py with timm 1.0.31 and
transformers 5.24 (tiny random-weight models), and, when those packages are installed, live comparisons.
Parameter counts: timm's and the official JAX code's published figures.
"""

import os
import re
import textwrap

import numpy as np
import pytest
import torch

from vit_pytorch import ViT
from vit_pytorch import pretrained
from vit_pytorch.pretrained import (RESAMPLE, CheckpointError, decode_variant, load_hf, load_jax, load_timm,
                                    num_parameters, read_checkpoint, vit)
from vit_pytorch.vit import resample_pos_embedding

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures')
TOL = dict(atol=1e-4, rtol=0)
# the configuration of every fixture model (see make_reference_fixtures.py)
TINY = dict(image_size=32, patch_size=8, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32, num_classes=5,
            patch_norm=False, qkv_bias=True, norm_eps=1e-6)


def tiny(**overrides):
    return ViT(**{**TINY, **overrides}).eval()


def fixture(name):
    return os.path.join(FIXTURES, name)


def reference(case):
    return read_checkpoint(fixture(f'{case}_reference.safetensors'))


def max_diff(a, b):
    return (a - b).abs().max().item()


# named configurations

PUBLISHED_COUNTS = {   # 224 px, 1000 classes: timm == official JAX models_test.py
    'Ti/16': 5_717_416, 'S/16': 22_050_664, 'B/16': 86_567_656, 'B/32': 88_224_232,
    'L/16': 304_326_632, 'L/32': 306_535_400, 'H/14': 632_045_800,
}


@pytest.mark.parametrize('variant, count', PUBLISHED_COUNTS.items())
def test_variant_parameter_count_equals_timm_and_jax(variant, count):
    assert num_parameters(variant, image_size=224, num_classes=1000) == count


def test_counts_at_384_grow_by_the_extra_position_rows_only():
    # 577 - 197 more position embeddings of width 768; timm's vit_base_patch16_384 has 86,859,496
    assert num_parameters(pretrained.vit_base_patch16_384) == 86_859_496
    assert num_parameters('B/16', image_size=384) - PUBLISHED_COUNTS['B/16'] == (577 - 197) * 768


def test_headless_counts():
    assert num_parameters('B/16', num_classes=0) == 85_798_656
    assert num_parameters('H/14', num_classes=0) == 630_764_800


@pytest.mark.parametrize('variant, width, count', [('B/16', 768, 103_186_515), ('L/16', 1024, 326_740_307),
                                                   ('H/14', 1280, 660_385_363)])
def test_imagenet21k_counts_with_the_pre_logits_layer(variant, width, count):
    # the in21k checkpoints: 21843 classes behind a width-wide tanh pre-logits layer
    assert num_parameters(variant, num_classes=21843, pre_logits_dim=width) == count


def test_counting_builds_on_the_meta_device():
    devices = []

    def build():
        model = vit('H/14')
        devices.append(model.pos_embedding.device)
        return model

    assert num_parameters(build) == PUBLISHED_COUNTS['H/14']
    assert devices == [torch.device('meta')]


NAMED = [name for name in pretrained.__all__ if name.startswith('vit_')]


@pytest.mark.parametrize('name', NAMED)
def test_named_constructor_is_its_variant(name):
    size, patch, resolution = re.fullmatch(r'vit_(tiny|small|base|large|huge)_patch(\d+)_(\d+)', name).groups()
    variant = f"{dict(tiny='Ti', small='S', base='B', large='L', huge='H')[size]}/{patch}"
    with torch.device('meta'):
        model = getattr(pretrained, name)(num_classes=10)
    config = decode_variant(variant)
    assert model.image_size == (int(resolution),) * 2 and model.patch_size == (int(patch),) * 2
    assert model.pos_embedding.shape[-1] == config['dim'] and len(model.transformer.layers) == config['depth']
    assert model.mlp_head.out_features == 10
    assert num_parameters(getattr(pretrained, name)) == num_parameters(variant, image_size=int(resolution))


def test_variant_table_gives_dim_head_as_width_over_heads():
    assert decode_variant('L/16') == dict(dim=1024, depth=24, mlp_dim=4096, heads=16, dim_head=64, patch_size=16)
    assert decode_variant('Ti/16')['dim_head'] == 64 and decode_variant('H/14')['dim_head'] == 80


def test_vit_builds_the_papers_numerics_and_takes_overrides():
    model = vit('Ti/16', image_size=32, num_classes=3, gelu_approximate='tanh', norm_eps=1e-12)
    attn, ff = model.transformer.layers[0]
    assert attn.to_qkv.bias is not None and isinstance(model.to_patch_embedding[1], torch.nn.Identity)
    assert ff.net[2].approximate == 'tanh' and attn.norm.eps == 1e-12
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)


@pytest.mark.parametrize('bad', ['X/16', 'B/15', 'B16', 'b/16', 16, None])
def test_unknown_variant_is_refused(bad):
    with pytest.raises(ValueError, match='variant'):
        vit(bad)


# parity with the fixtures written by timm and transformers


def test_timm_vit_fixture_logits():
    ref = reference('timm_vit')
    model = load_timm(tiny(), fixture('timm_vit.safetensors'))
    torch.testing.assert_close(model(ref['input']), ref['logits'], **TOL)


def test_timm_resampling_on_load_matches_timm_at_another_resolution():
    ref = reference('timm_vit')
    model = load_timm(tiny(image_size=40), fixture('timm_vit.safetensors'))   # 4x4 grid -> 5x5, bicubic + antialias
    torch.testing.assert_close(model(ref['input_40']), ref['logits_40'], **TOL)


def test_another_resampling_mode_misses_timms_logits():
    ref = reference('timm_vit')
    model = load_timm(tiny(image_size=40), fixture('timm_vit.safetensors'), resample='hf')
    assert max_diff(model(ref['input_40']), ref['logits_40']) > 1e-4


def test_timm_checkpoint_loads_from_a_torch_file_and_a_deit_style_wrapper(tmp_path):
    ref = reference('timm_vit')
    state_dict = read_checkpoint(fixture('timm_vit.safetensors'))
    torch.save(state_dict, tmp_path / 'plain.pth')
    torch.save({'model': state_dict}, tmp_path / 'wrapped.pth')
    for source in (tmp_path / 'plain.pth', str(tmp_path / 'wrapped.pth'), state_dict):
        model = load_timm(tiny(), source)
        torch.testing.assert_close(model(ref['input']), ref['logits'], **TOL)


def test_hf_classifier_fixture_logits():
    ref = reference('hf_vit_classifier')
    model = load_hf(tiny(norm_eps=1e-12), fixture('hf_vit_classifier.safetensors'))   # HF's default eps
    torch.testing.assert_close(model(ref['input']), ref['logits'], **TOL)


def test_hf_resampling_on_load_and_at_run_time_match_interpolate_pos_encoding():
    ref = reference('hf_vit_classifier')
    loaded_at_40 = load_hf(tiny(norm_eps=1e-12, image_size=40), fixture('hf_vit_classifier.safetensors'))
    torch.testing.assert_close(loaded_at_40(ref['input_40']), ref['logits_40'], **TOL)
    dynamic = load_hf(tiny(norm_eps=1e-12, dynamic_image_size=True), fixture('hf_vit_classifier.safetensors'))
    torch.testing.assert_close(dynamic(ref['input_40']), ref['logits_40'], **TOL)


def transformers5_names(state_dict):
    """The in-memory names of transformers 5 (the renames of its conversion_mapping, in order)."""
    renames = [('encoder.layer.', 'layers.'), ('attention.attention.query', 'attention.q_proj'),
               ('attention.attention.key', 'attention.k_proj'), ('attention.attention.value', 'attention.v_proj'),
               ('attention.output.dense', 'attention.o_proj'), ('intermediate.dense', 'mlp.fc1'),
               ('output.dense', 'mlp.fc2')]
    renamed = {}
    for name, tensor in state_dict.items():
        for old, new in renames:
            name = name.replace(old, new)
        renamed[name] = tensor
    return renamed


def test_hf_in_memory_names_of_transformers_5_load_too():
    ref = reference('hf_vit_classifier')
    state_dict = transformers5_names(read_checkpoint(fixture('hf_vit_classifier.safetensors')))
    assert 'vit.layers.0.attention.q_proj.weight' in state_dict
    model = load_hf(tiny(norm_eps=1e-12), state_dict)
    torch.testing.assert_close(model(ref['input']), ref['logits'], **TOL)


def test_hf_vit_model_tokens_and_pooler_are_our_tokens_and_pre_logits():
    ref = reference('hf_vit_model')
    model = load_hf(tiny(norm_eps=1e-12, num_classes=0, pre_logits_dim=16), fixture('hf_vit_model.safetensors'))
    tokens = model(ref['input'])
    torch.testing.assert_close(tokens, ref['last_hidden_state'], **TOL)
    torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), ref['pooler_output'], **TOL)


def test_hf_vit_model_without_its_pooler():
    ref = reference('hf_vit_model')
    model = load_hf(tiny(norm_eps=1e-12, num_classes=0), fixture('hf_vit_model.safetensors'), load_head=False)
    torch.testing.assert_close(model(ref['input']), ref['last_hidden_state'], **TOL)


def test_jax_npz_with_tanh_gelu_matches_timm_running_it_the_jax_way():
    ref = reference('jax_vit')
    model = load_jax(tiny(gelu_approximate='tanh'), fixture('jax_vit.npz'))
    torch.testing.assert_close(model(ref['input']), ref['logits_tanh'], **TOL)


def test_jax_npz_with_exact_gelu_matches_timms_default():
    ref = reference('jax_vit')
    model = load_jax(tiny(), fixture('jax_vit.npz'))
    torch.testing.assert_close(model(ref['input']), ref['logits_exact'], **TOL)


def test_the_gelu_choice_is_visible_in_the_logits():
    ref = reference('jax_vit')
    model = load_jax(tiny(), fixture('jax_vit.npz'))
    assert max_diff(model(ref['input']), ref['logits_tanh']) > 5e-5


def test_jax_npz_resampled_like_timms_npz_loader():
    ref = reference('jax_vit')
    model = load_jax(tiny(gelu_approximate='tanh', image_size=40), fixture('jax_vit.npz'), resample=dict(mode='bilinear'))
    torch.testing.assert_close(model(ref['input_40']), ref['logits_40'], **TOL)


def test_jax_default_resampling_is_the_official_scipy_zoom():
    scipy_ndimage = pytest.importorskip('scipy.ndimage')
    arrays = dict(np.load(fixture('jax_vit.npz')))
    model = load_jax(tiny(image_size=56), arrays)       # 4x4 grid -> 7x7
    table = arrays['Transformer/posembed_input/pos_embedding'][0]
    # vit_jax/checkpoint.py interpolate_posembed: scipy.ndimage.zoom(grid, (new/old, new/old, 1), order=1)
    grid = scipy_ndimage.zoom(table[1:].reshape(4, 4, -1), (7 / 4, 7 / 4, 1), order=1).reshape(49, -1)
    expected = torch.from_numpy(np.concatenate([table[:1], grid]))
    torch.testing.assert_close(model.pos_embedding.detach(), expected, atol=1e-6, rtol=0)


def test_jax_old_optimizer_layout_and_pre_logits():
    arrays = {f'opt/target/{name}': value for name, value in np.load(fixture('jax_vit.npz')).items()}
    generator = np.random.default_rng(0)
    arrays['opt/target/pre_logits/kernel'] = generator.standard_normal((16, 16)).astype(np.float32)
    arrays['opt/target/pre_logits/bias'] = generator.standard_normal(16).astype(np.float32)
    arrays['opt/target/head/kernel'] = generator.standard_normal((16, 5)).astype(np.float32)
    model = load_jax(tiny(pre_logits_dim=16), arrays)
    tokens = model.forward_features(reference('jax_vit')['input'])
    kernel, bias = (torch.from_numpy(arrays[f'opt/target/pre_logits/{name}']) for name in ('kernel', 'bias'))
    pre_logits = torch.tanh(tokens[:, 0] @ kernel + bias)    # the JAX code: Dense, then tanh, on token 0
    torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), pre_logits, atol=1e-6, rtol=0)
    head = pre_logits @ torch.from_numpy(arrays['opt/target/head/kernel']) + torch.from_numpy(arrays['opt/target/head/bias'])
    torch.testing.assert_close(model.forward_head(tokens), head, atol=1e-5, rtol=0)


# fine-tuning: another head, another resolution


def test_load_without_head_then_zero_initialised_new_head():
    ref = reference('timm_vit')
    model = tiny(num_classes=7)
    with pytest.raises(CheckpointError, match='load_head=False'):
        load_timm(model, fixture('timm_vit.safetensors'))
    load_timm(model, fixture('timm_vit.safetensors'), load_head=False)
    model.reset_classifier(7)
    assert model(ref['input']).abs().max() == 0          # the paper's zero-initialised transfer head
    features = load_timm(tiny(), fixture('timm_vit.safetensors')).forward_features(ref['input'])
    torch.testing.assert_close(model.forward_features(ref['input']), features, atol=0, rtol=0)


# loader errors


def timm_state_dict():
    return read_checkpoint(fixture('timm_vit.safetensors'))


def test_missing_key_is_named():
    state_dict = timm_state_dict()
    del state_dict['blocks.1.mlp.fc2.bias']
    with pytest.raises(CheckpointError, match=r'missing keys \(1\): blocks\.1\.mlp\.fc2\.bias'):
        load_timm(tiny(), state_dict)


def test_unexpected_key_is_named():
    state_dict = timm_state_dict()
    state_dict['blocks.0.ls1.gamma'] = torch.ones(16)
    with pytest.raises(CheckpointError, match=r'unexpected keys \(1\): blocks\.0\.ls1\.gamma'):
        load_timm(tiny(), state_dict)


def test_a_deeper_checkpoint_reports_its_extra_layer():
    state_dict = timm_state_dict()
    state_dict.update({name.replace('blocks.1.', 'blocks.2.'): value for name, value in state_dict.items()
                       if name.startswith('blocks.1.')})
    with pytest.raises(CheckpointError, match=r'unexpected keys \(12\): blocks\.2\.'):
        load_timm(tiny(), state_dict)


def test_wrong_shape_is_named_and_nothing_is_copied():
    state_dict = timm_state_dict()
    state_dict['blocks.0.mlp.fc1.weight'] = state_dict['blocks.0.mlp.fc1.weight'].T.contiguous()
    model = tiny()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r'blocks\.0\.mlp\.fc1\.weight: shape \(16, 32\), expected \(32, 16\)'):
        load_timm(model, state_dict)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_jax_wrong_attention_layout_is_refused():
    arrays = dict(np.load(fixture('jax_vit.npz')))
    name = 'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel'
    arrays[name] = arrays[name].reshape(16, 16)          # a Dense kernel, not (dim, heads, dim_head)
    with pytest.raises(CheckpointError, match=re.escape(f'{name}: shape (16, 16), expected (16, 2, 8)')):
        load_jax(tiny(), arrays)


def test_position_table_that_is_not_a_square_grid_is_refused():
    state_dict = timm_state_dict()
    state_dict['pos_embed'] = state_dict['pos_embed'][:, :-1]
    with pytest.raises(CheckpointError, match=r"pos_embed: 15 positions .* neither the model's 4 x 4 grid nor a square"
                                              r" one: pass checkpoint_grid"):
        load_timm(tiny(), state_dict)


def test_hf_missing_value_projection_is_named():
    state_dict = read_checkpoint(fixture('hf_vit_classifier.safetensors'))
    del state_dict['vit.encoder.layer.0.attention.attention.value.weight']
    with pytest.raises(CheckpointError, match=r'vit\.encoder\.layer\.0\.attention\.attention\.value\.weight'):
        load_hf(tiny(norm_eps=1e-12), state_dict)


PWNED = []


def _pwned(marker):
    PWNED.append(marker)
    return marker


class Malicious:
    def __reduce__(self):
        return _pwned, ('code ran',)


def test_pickle_with_an_arbitrary_object_is_refused_unexecuted(tmp_path):
    path = tmp_path / 'evil.pth'
    torch.save({'cls_token': torch.zeros(1, 1, 16), 'payload': Malicious()}, path)
    with pytest.raises(CheckpointError, match='refused to unpickle'):
        load_timm(tiny(), path)
    assert PWNED == []
    torch.load(path, weights_only=False)   # what a plain unpickler does with the same file
    assert PWNED == ['code ran']
    PWNED.clear()


def test_npz_with_pickled_objects_is_refused(tmp_path):
    path = tmp_path / 'evil.npz'
    np.savez(path, embedding=np.array([Malicious()], dtype=object))
    with pytest.raises(CheckpointError, match='pickled objects'):
        load_jax(tiny(), path)
    assert PWNED == []


def test_model_that_is_not_the_papers_vit_is_refused():
    with pytest.raises(ValueError, match='patch_norm=False.*qkv_bias=True'):
        load_timm(ViT(**{**TINY, 'patch_norm': True, 'qkv_bias': False}), timm_state_dict())


def test_bad_resample_and_source_arguments():
    with pytest.raises(ValueError, match="resample must be one of"):
        load_timm(tiny(), timm_state_dict(), resample='nearest-ish')
    with pytest.raises(TypeError, match='path or a state_dict'):
        read_checkpoint(42)


def test_resample_presets_are_what_the_docstring_says():
    assert RESAMPLE == {'timm': dict(mode='bicubic', antialias=True), 'hf': dict(mode='bicubic', antialias=False),
                        'jax': dict(mode='bilinear', align_corners=True)}
    table = torch.randn(1 + 16, 4)
    for options in RESAMPLE.values():
        out = resample_pos_embedding(table, old_grid=(4, 4), new_grid=(5, 5), num_prefix_tokens=1, **options)
        assert torch.equal(out[0], table[0]) and out.shape == (26, 4)


def test_module_docstring_example_runs():
    example = '    import torch' + pretrained.__doc__.split('    import torch', 1)[1].split('\n\nPlans.', 1)[0]
    namespace = {}
    exec(textwrap.dedent(example), namespace)
    assert namespace['logits'].shape == (1, 10)


# live comparisons, when the reference packages are installed


def perturbed(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
    return model.eval()


TIMM_TINY = dict(img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5)


def test_live_timm_vit_and_deit_distilled():
    timm = pytest.importorskip('timm')
    from vit_pytorch.distill import DeiT

    x = torch.randn(2, 3, 32, 32)
    for timm_cls, ours_cls in [(timm.models.vision_transformer.VisionTransformer, ViT),
                               (timm.models.deit.VisionTransformerDistilled, DeiT)]:
        reference_model = perturbed(timm_cls(**TIMM_TINY))
        model = load_timm(ours_cls(**TINY).eval(), reference_model.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(model(x), reference_model(x), **TOL)


def test_live_timm_npz_loader(tmp_path):
    timm = pytest.importorskip('timm')
    reference_model = timm.models.vision_transformer.VisionTransformer(**TIMM_TINY, act_layer='gelu_tanh')
    reference_model.load_pretrained(fixture('jax_vit.npz'))
    model = load_jax(tiny(gelu_approximate='tanh'), fixture('jax_vit.npz'))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference_model.eval()(x), **TOL)


def test_live_hf_vit_for_image_classification(tmp_path):
    transformers = pytest.importorskip('transformers')
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32, num_labels=5)
    reference_model = perturbed(transformers.ViTForImageClassification(config))
    reference_model.save_pretrained(tmp_path)
    model = load_hf(tiny(norm_eps=config.layer_norm_eps), tmp_path / 'model.safetensors')
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference_model(pixel_values=x).logits, **TOL)
    in_memory = load_hf(tiny(norm_eps=config.layer_norm_eps), reference_model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(in_memory(x), reference_model(pixel_values=x).logits, **TOL)


def test_the_learnable_memory_vit_takes_the_paper_vits_jax_checkpoints():
    from vit_pytorch.learnable_memory_vit import ViT as MemoryViT
    ref = reference('jax_vit')
    model = load_jax(MemoryViT(**{**TINY, 'gelu_approximate': 'tanh'}).eval(), fixture('jax_vit.npz'))
    torch.testing.assert_close(model(ref['input']), ref['logits_tanh'], **TOL)


def test_prefixed_plan_maps_by_the_first_matching_prefix_and_names_an_uncovered_key():
    from vit_pytorch.vit import joined_kv_plan, prefixed_plan
    state = {'blocks.0.to_q.weight': torch.zeros(4, 2), 'blocks.0.to_kv.weight': torch.zeros(8, 2),
             'head.bias': torch.zeros(3)}
    plan = {'blocks.0.to_kv.weight': joined_kv_plan(state['blocks.0.to_kv.weight'], 'b.0.k.weight', 'b.0.v.weight')}
    names = {'blocks.0.to_q.': 'b.0.q.', 'blocks.0.': 'never.', 'head.': 'fc.'}
    prefixed_plan(state, names, "the test's model", plan)
    assert {key: sources for key, (sources, _) in plan.items()} == {
        'blocks.0.to_q.weight': {'b.0.q.weight': (4, 2)},
        'blocks.0.to_kv.weight': {'b.0.k.weight': (4, 2), 'b.0.v.weight': (4, 2)},
        'head.bias': {'fc.bias': (3,)},
    }
    k, v = torch.ones(4, 2), torch.full((4, 2), 2.)
    assert torch.equal(plan['blocks.0.to_kv.weight'][1](k, v), torch.cat((k, v)))
    with pytest.raises(ValueError, match=r"the test's model has no counterpart of head\.bias"):
        prefixed_plan(state, {'blocks.': 'b.'}, "the test's model")
