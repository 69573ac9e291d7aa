"""The official T2T-ViT built exactly: its Performer T2T layer and its `qk_scale`.

References: the official code (yitu-opensource/T2T-ViT @ 0f63dc9) through fixtures written by it
(tests/fixtures/make_t2t_official_fixtures.py), the parameter counts it gives, and the formulas.
The official weights' key layout is written out below only to prove the architecture equal.
"""

import math

import pytest
import torch
from helpers import as_tuples, count, load_fixture

from vit_pytorch.t2t import T2TViT, TokenPerformer, sinusoid_table, t2t_vit

# official count: sum(p.numel() for p in model.parameters()) of models/t2t_vit.py's constructors
# (all parameters / trainable ones: the frozen position table and the Performer's random features
# are parameters there, buffers here)
OFFICIAL_COUNTS = {
    ('7', 'performer'): (4_310_222, 4_255_694), ('10', 'performer'): (5_889_230, 5_834_702),
    ('12', 'performer'): (6_941_902, 6_887_374), ('14', 'performer'): (21_545_550, 21_465_806),
    ('19', 'performer'): (39_177_422, 39_085_070), ('24', 'performer'): (64_105_934, 64_000_974),
    ('14', 'transformer'): (21_541_070, 21_465_422), ('19', 'transformer'): (39_172_942, 39_084_686),
    ('24', 'transformer'): (64_101_454, 64_000_590),
}


@pytest.mark.parametrize('variant, t2t_layer', OFFICIAL_COUNTS)
def test_counts_equal_the_official_code(variant, t2t_layer):
    with torch.device('meta'):
        model = t2t_vit(variant, t2t_layer=t2t_layer)
    total, trainable = OFFICIAL_COUNTS[variant, t2t_layer]
    assert count(model) == trainable
    assert count(model) + sum(buffer.numel() for buffer in model.buffers()) == total


def official_to_ours(state, kind, depth):
    """The official T2T_ViT keys and layouts -> ours (the reference's layout, written out for this proof)."""
    ours = {'cls_token': state['cls_token'][0],
            'to_patch_embedding.project.weight': state['tokens_to_token.project.weight'],
            'to_patch_embedding.project.bias': state['tokens_to_token.project.bias'],
            'transformer.norm.weight': state['norm.weight'], 'transformer.norm.bias': state['norm.bias'],
            'mlp_head.weight': state['head.weight'], 'mlp_head.bias': state['head.bias']}
    for i in (0, 1):
        theirs, layer = f'tokens_to_token.attention{i + 1}.', f'to_patch_embedding.transformers.{i}.'
        names = ({'norm1': 'attn.norm', 'proj': 'attn.to_out.0', 'norm2': 'ff.net.0', 'mlp.0': 'ff.net.1',
                  'mlp.2': 'ff.net.4'} if kind == 'performer' else
                 {'norm1': 'attn.norm', 'attn.proj': 'attn.to_out.0', 'norm2': 'ff.net.0', 'mlp.fc1': 'ff.net.1',
                  'mlp.fc2': 'ff.net.4', 'attn.qkv': 'attn.to_qkv'})
        for their_name, our_name in names.items():
            for kind_of in ('weight', 'bias'):
                if f'{theirs}{their_name}.{kind_of}' in state:
                    ours[f'{layer}{our_name}.{kind_of}'] = state[f'{theirs}{their_name}.{kind_of}']
        if kind == 'performer':
            ours[f'{layer}attn.random_features'] = state[f'{theirs}w']
            for kind_of in ('weight', 'bias'):      # the official projection's rows are k, q, v; ours q, k, v
                k, q, v = state[f'{theirs}kqv.{kind_of}'].chunk(3)
                ours[f'{layer}attn.to_qkv.{kind_of}'] = torch.cat((q, k, v))
    for i in range(depth):
        for their_name, our_name in {'norm1': '0.norm', 'attn.qkv': '0.to_qkv', 'attn.proj': '0.to_out.0',
                                     'norm2': '1.net.0', 'mlp.fc1': '1.net.1', 'mlp.fc2': '1.net.4'}.items():
            for kind_of in ('weight', 'bias'):
                if f'blocks.{i}.{their_name}.{kind_of}' in state:
                    ours[f'transformer.layers.{i}.{our_name}.{kind_of}'] = state[f'blocks.{i}.{their_name}.{kind_of}']
    return ours


@pytest.mark.parametrize('kind', ['performer', 'transformer'])
def test_the_official_models_outputs(kind):
    metadata, state, tensors = load_fixture(f't2t_official_{kind}')
    config = metadata['config']
    model = T2TViT(image_size=config['img_size'], num_classes=config['num_classes'], dim=config['embed_dim'],
                   depth=config['depth'], heads=config['num_heads'],
                   dim_head=config['embed_dim'] // config['num_heads'],
                   mlp_dim=int(config['embed_dim'] * config['mlp_ratio']), token_dim=config['token_dim'],
                   t2t_layer=kind, qk_scale=config['qk_scale']).eval()
    model.load_state_dict(official_to_ours(state, kind, config['depth']), strict=True)
    torch.testing.assert_close(model.pos_embedding, state['pos_embed'][0], atol=1e-6, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], atol=1e-5, rtol=1e-5)
        model.transformer.layers[0][0].scale = (config['embed_dim'] // config['num_heads']) ** -0.5
        assert (model(tensors['input']) - tensors['output']).abs().max() > 1e-3   # the default scale differs


# the Performer layer against its formula


def performer(**overrides):
    torch.manual_seed(0)
    layer = TokenPerformer(**{'dim': 12, 'dim_out': 8, **overrides}).eval()
    with torch.no_grad():
        for param in layer.parameters():
            param.add_(0.2 * torch.randn_like(param))
    return layer


def test_performer_is_its_formula():
    layer = performer()
    x = torch.randn(2, 10, 12)
    q, k, v = layer.to_qkv(layer.norm(x)).chunk(3, dim=-1)
    w = layer.random_features                                            # (m, d), m = 4

    def phi(t):
        return torch.exp(t @ w.T - (t * t).sum(-1, keepdim=True) / 2) / math.sqrt(w.shape[0])

    kernel = phi(q) @ phi(k).transpose(1, 2)                             # (b, n, n)
    expected = v + layer.to_out((kernel @ v) / (kernel.sum(-1, keepdim=True) + 1e-8))
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


def test_performer_random_features_are_orthogonal_of_norm_sqrt_m_and_saved():
    layer = TokenPerformer(12, 8, kernel_ratio=0.5)
    w = layer.random_features
    assert w.shape == (4, 8)
    torch.testing.assert_close(w @ w.T, 4 * torch.eye(4), atol=1e-5, rtol=0)
    assert 'random_features' in layer.state_dict()
    assert not any(param is w for param in layer.parameters())


def test_performer_linear_and_quadratic_paths_agree_and_the_map_is_recorded():
    layer = performer()
    x = torch.randn(2, 10, 12)
    with torch.no_grad():
        linear = layer(x)
        layer.fused = False
        maps = []
        layer.attention_probs.register_forward_hook(lambda module, inputs, output: maps.append(output))
        quadratic = layer(x)
    torch.testing.assert_close(linear, quadratic, atol=1e-5, rtol=1e-5)
    assert maps[0].shape == (2, 1, 10, 10) and (maps[0] >= 0).all()


# qk_scale


def test_qk_scale_is_the_logit_scale_of_the_backbone_attention():
    model = t2t_vit('14', image_size=32, depth=1, t2t_layer='performer', qk_scale=384 ** -0.5).eval()
    attention = model.transformer.layers[0][0]
    x = torch.randn(2, 5, 384)
    q, k, v = attention.to_qkv(attention.norm(x)).reshape(2, 5, 3, 6, 64).permute(2, 0, 3, 1, 4)
    attn = (q @ k.transpose(-1, -2) * 384 ** -0.5).softmax(-1)          # the official formula, dim ** -0.5
    expected = attention.to_out((attn @ v).transpose(1, 2).reshape(2, 5, 384))
    with torch.no_grad():
        torch.testing.assert_close(attention(x), expected, atol=1e-5, rtol=1e-5)
    assert t2t_vit('14', image_size=32, depth=1).transformer.layers[0][0].scale == 64 ** -0.5   # the default


def test_qk_scale_leaves_the_t2t_layers_alone():
    default = t2t_vit('7', image_size=32, depth=1)
    scaled = t2t_vit('7', image_size=32, depth=1, qk_scale=256 ** -0.5)
    assert [layer.attn.scale for layer in scaled.to_patch_embedding.transformers] == \
        [layer.attn.scale for layer in default.to_patch_embedding.transformers]


@pytest.mark.parametrize('overrides, error, match', [
    (dict(t2t_layer='linformer'), ValueError, "t2t_layer must be 'transformer' or 'performer'"),
    (dict(qk_scale=0.), ValueError, 'qk_scale'),
    (dict(qk_scale='small'), TypeError, 'qk_scale'),
])
def test_bad_options_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        T2TViT(**as_tuples(dict(image_size=32, num_classes=3, dim=16, depth=1, heads=2, mlp_dim=32), 'image_size'),
               **overrides)


def test_the_official_position_table_is_ours():
    metadata, state, _ = load_fixture('t2t_official_transformer')
    torch.testing.assert_close(sinusoid_table(5, 16), state['pos_embed'][0], atol=1e-6, rtol=0)
