"""vit-pytorch 1.26.14's own README examples run on ours unchanged, with outputs of the shapes they state (issue 25).

The README is read at test time from vit-pytorch's installed wheel (the METADATA of the `vit-pytorch` distribution
found by importlib.metadata, version 1.26.14), or from the file named by $VIT_PYTORCH_README (that METADATA, or the
README itself); without either the tests skip. Its text is vit-pytorch's code and is not part of this repository.

Each ```python block is one example; a block without an import continues the previous block of its `## ` section
(it runs in that block's namespace). An example runs when every `vit_pytorch.<module>` it imports exists here and
its other imports are installed. Two edits make the examples runnable offline and short, as the survey of
vit-pytorch's README did (docs/vit-pytorch.md): training loops of range(100) / range(1000) run once, and torchvision's
`resnet50(pretrained = True)` is built without downloading weights. After an example, every name assigned on a line
whose comment states a shape, `name = ...  # (1, 1000)`, must be a tensor of that shape.

Examples that ours deliberately runs otherwise are listed in DIFFERENT with the reason and the error ours gives.
"""

import email
import importlib.metadata
import importlib.util
import os
import re

import pytest
import torch

VERSION = '1.26.14'

# examples (section, its n-th block, from 0) that run differently here on purpose: the reason, the error ours gives
DIFFERENT = {
    ('LeViT', 0): ("ours is the paper's LeViT, with BatchNorm before its classifier (vit-pytorch's head is a bare "
                   "Linear): one image in training mode, as the example calls it, is refused by BatchNorm",
                   ValueError, 'LeViT in training mode needs a batch of at least 2 images, got 1'),
}
# shapes the README's comments misstate, and the shape vit-pytorch 1.26.14 itself returns
MISSTATED = {('Vision Transformer for Small Datasets', 0): {'preds': (4, 1000)}}     # a batch of 4, "(1, 1000)"

# modules of third parties an example imports, and the pip name that provides it
THIRD_PARTY = {'torchvision': 'torchvision', 'nystrom_attention': 'nystrom-attention',
               'x_transformers': 'x-transformers'}


def readme_text():
    """vit-pytorch 1.26.14's README (the long description in its METADATA), or None."""
    path = os.environ.get('VIT_PYTORCH_README')
    if path:
        with open(path, encoding='utf-8') as handle:
            text = handle.read()
        return email.message_from_string(text).get_payload() if text.startswith('Metadata-Version') else text
    try:
        distribution = importlib.metadata.distribution('vit-pytorch')
    except importlib.metadata.PackageNotFoundError:
        return None
    if distribution.version != VERSION:
        return None
    return distribution.metadata.get_payload()


def examples(text):
    """[(section, index in section, code of the blocks it runs after in its section, its own code)]."""
    found, counts, earlier = [], {}, {}
    section = None
    for match in re.finditer(r'^## (.+?)$|^```python\n(.*?)^```', text, flags=re.M | re.S):
        if match.group(1) is not None:
            section = match.group(1).strip()
            continue
        code = match.group(2)
        index = counts.get(section, 0)
        counts[section] = index + 1
        before = earlier.get(section, '') if not re.search(r'^\s*(from|import) ', code, flags=re.M) else ''
        found.append((section, index, before, code))
        earlier[section] = before + code
    return found


TEXT = readme_text()
EXAMPLES = examples(TEXT) if TEXT else []


def runnable(code):
    """The example with its two offline edits: one training step, torchvision's ResNet-50 without downloading."""
    code = re.sub(r'range\((100|1000)\)', 'range(1)', code)
    return code.replace('resnet50(pretrained = True)', 'resnet50(weights = None)')


def missing(code):
    """Why the example cannot run here (a vit_pytorch module ours lacks, a third party not installed), or None."""
    modules = set(re.findall(r'^\s*from (vit_pytorch(?:\.\w+)*) import', code, flags=re.M))
    modules |= set(re.findall(r'^\s*import (vit_pytorch(?:\.\w+)*)', code, flags=re.M))
    for module in sorted(modules):
        if importlib.util.find_spec(module) is None:
            return f'{module} is not a module of ours'
    for module in sorted(set(re.findall(r'^\s*(?:from|import) (\w+)', code, flags=re.M)) & set(THIRD_PARTY)):
        if importlib.util.find_spec(module) is None:
            return f'{module} is not installed (pip install {THIRD_PARTY[module]})'
    return None


def stated_shapes(code):
    """{name: shape} for each `name = ... # (d0, d1, ...)` line of the example."""
    return {name: tuple(int(d) for d in dims.split(',') if d.strip())
            for name, dims in re.findall(r'^(\w+)\s*=[^#\n]*#\s*\(([\d,\s]+)\)', code, flags=re.M)}


def example_id(example):
    section, index, _, _ = example
    return f'{section}-{index}'


def marked(example):
    return pytest.param(example, id=example_id(example))


@pytest.mark.skipif(TEXT is None, reason=f'vit-pytorch {VERSION} is not installed and $VIT_PYTORCH_README is unset')
def test_the_readme_has_its_54_examples():
    assert len(EXAMPLES) == 54
    assert set(DIFFERENT) | set(MISSTATED) <= {(section, index) for section, index, _, _ in EXAMPLES}


@pytest.mark.slow      # full-size models: 5 to 100 s an example on 2 cores, 14 minutes in all
@pytest.mark.skipif(TEXT is None, reason=f'vit-pytorch {VERSION} is not installed and $VIT_PYTORCH_README is unset')
@pytest.mark.parametrize('example', [marked(example) for example in EXAMPLES])
def test_example_runs_unchanged_with_the_shapes_it_states(example, tmp_path, monkeypatch):
    section, index, before, code = example
    reason = missing(before + code)
    if reason:
        pytest.skip(reason)
    monkeypatch.chdir(tmp_path)                   # examples save checkpoints ('./pretrained-net.pt') where they run
    torch.manual_seed(0)
    namespace = {}
    exec(compile(runnable(before), f'<{section} before>', 'exec'), namespace)
    if (section, index) in DIFFERENT:
        _, error, message = DIFFERENT[section, index]
        with pytest.raises(error, match=message):
            exec(compile(runnable(code), f'<{section} {index}>', 'exec'), namespace)
        return
    exec(compile(runnable(code), f'<{section} {index}>', 'exec'), namespace)
    for name, shape in {**stated_shapes(code), **MISSTATED.get((section, index), {})}.items():
        assert isinstance(namespace[name], torch.Tensor) and tuple(namespace[name].shape) == shape, (name, shape)
