"""torch.hub: hubconf.py at the repository root builds the named models from a local checkout.

The expected sizes come from the names themselves and the ViT paper's Table 1 (plus Ti and S
from "How to train your ViT?", arXiv 2106.10270), not from the package's own table. Large models
are built on the meta device: no memory, nothing downloaded.
"""

import re
from pathlib import Path

import pytest
import torch

from helpers import load_script
from vit_pytorch import SimpleViT, ViT

REPO = str(Path(__file__).resolve().parent.parent)

# width, depth, heads
PAPER = {'tiny': (192, 12, 3), 'small': (384, 12, 6), 'base': (768, 12, 12), 'large': (1024, 24, 16),
         'huge': (1280, 32, 16)}
# timm's published parameter counts (ImageNet-1k heads)
PUBLISHED_COUNTS = {'vit_tiny_patch16_224': 5_717_416, 'vit_small_patch16_224': 22_050_664,
                    'vit_base_patch16_224': 86_567_656, 'vit_large_patch16_224': 304_326_632}


def hub_load(name, *args, **kwargs):
    return torch.hub.load(REPO, name, *args, source='local', **kwargs)


def named_entries():
    import vit_pytorch.pretrained as pretrained

    return [name for name in pretrained.__all__ if re.fullmatch(r'vit_[a-z]+_patch\d+_\d+', name)]


def hubconf():
    return load_script(Path(REPO) / 'hubconf.py')


def test_hubconf_lists_the_named_models_and_the_classes():
    # what torch.hub.list shows (it reads GitHub repositories only, so the rule is applied here)
    module = hubconf()
    listed = {name for name in dir(module) if callable(getattr(module, name)) and not name.startswith('_')}
    assert 'vit_base_patch16_224' in listed
    assert set(named_entries()) <= listed
    assert {'ViT', 'SimpleViT', 'vit'} <= listed


def test_hub_loads_vit_base_patch16_224_with_the_published_size():
    with torch.device('meta'):
        model = hub_load('vit_base_patch16_224')
    assert isinstance(model, ViT)
    assert sum(p.numel() for p in model.parameters()) == 86_567_656


@pytest.mark.parametrize('name', named_entries())
def test_every_named_model_has_the_sizes_its_name_says(name):
    size, patch, image = re.fullmatch(r'vit_([a-z]+)_patch(\d+)_(\d+)', name).groups()
    width, depth, heads = PAPER[size]
    with torch.device('meta'):
        model = hub_load(name)
    assert model.patch_size == (int(patch), int(patch))
    assert model.image_size == (int(image), int(image))
    assert model.pos_embedding.shape == (1 + (int(image) // int(patch)) ** 2, width)
    assert len(model.transformer.layers) == depth
    assert model.transformer.layers[0][0].heads == heads
    assert model.mlp_head.out_features == 1000
    if name in PUBLISHED_COUNTS:
        assert sum(p.numel() for p in model.parameters()) == PUBLISHED_COUNTS[name]


def test_hub_model_runs_with_keyword_overrides():
    model = hub_load('vit', 'Ti/16', image_size=32, num_classes=10, depth=1).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_named_hub_model_takes_a_new_head():
    with torch.device('meta'):
        model = hub_load('vit_small_patch16_224', num_classes=10)
    assert model.mlp_head.out_features == 10


@pytest.mark.parametrize('name, cls', [('ViT', ViT), ('SimpleViT', SimpleViT)])
def test_hub_builds_the_model_classes(name, cls):
    kwargs = dict(image_size=16, patch_size=4, num_classes=3, dim=16, depth=1, heads=2, mlp_dim=32)
    model = hub_load(name, **kwargs)
    assert type(model) is cls
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 3)


@pytest.mark.parametrize('name', ['vit_base_patch16_224', 'vit'])
def test_hub_refuses_pretrained_weights_rather_than_downloading(name):
    args = ('B/16',) if name == 'vit' else ()
    with pytest.raises(ValueError, match=r'pretrained=True.*never downloads.*load_timm'):
        hub_load(name, *args, pretrained=True)


def test_hub_entries_keep_their_docstrings_for_hub_help():
    module = hubconf()
    assert 'B/16' in module.vit.__doc__
    assert module.vit_base_patch16_224.__name__ == 'vit_base_patch16_224'
