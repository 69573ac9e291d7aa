"""benchmarks/attn_residual_memory.py: Full against Block AttnRes's memory, and the paper's count of kept tensors.

The count is checked against the formula written out here (2 * depth + 1 for Full AttnRes, 2 * depth / S + 1 for
blocks of S branches) and against what the model itself returns as its history; a tiny run through the script's own
fresh-process children (`pytest -m slow`; 10 processes, 133-151 s on the shared 2-core machine at load average 6-15)
checks the structure of every number it reports and that autograd saves as many token tensors for Block AttnRes as
for Full (so the training step's saving comes from elsewhere: the mixes' (mix, source) pairs and the backward pass;
docs/blocks.md).
"""

import math
import os

import pytest
import torch

from helpers import load_script, tiny_vit_kwargs
from vit_pytorch.simple_vit_attn_residual import SimpleViTAttnResidual

SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, 'benchmarks', 'attn_residual_memory.py')


@pytest.fixture(scope='module')
def bench():
    return load_script(SCRIPT, 'attn_residual_memory')


@pytest.mark.parametrize('depth', [1, 3, 12, 24, 48])
def test_the_kept_count_is_the_papers_formula(bench, depth):
    assert bench.kept_tensors('full', depth) == 2 * depth + 1
    assert bench.kept_tensors('simple_vit', depth) == 0
    for size in (s for s in range(1, 2 * depth + 1) if (2 * depth) % s == 0):
        assert bench.kept_tensors(f'S={size}', depth) == 2 * depth // size + 1


@pytest.mark.parametrize('depth', [1, 2, 6, 24])
def test_blocks_keep_fewer_tensors_than_full_attnres_from_blocks_of_two(bench, depth):
    """Blocks of S >= 2 branches keep fewer tensors than Full AttnRes at every depth, blocks of one as many."""
    full = bench.kept_tensors('full', depth)
    assert bench.kept_tensors('S=1', depth) == full
    sizes = [s for s in range(2, 2 * depth + 1) if (2 * depth) % s == 0]
    assert sizes and all(bench.kept_tensors(f'S={s}', depth) < full for s in sizes)


@pytest.mark.parametrize('block_size', [None, 1, 2, 4, 8])
def test_the_count_is_the_number_of_tensors_the_model_returns_as_its_history(bench, block_size):
    model = SimpleViTAttnResidual(**tiny_vit_kwargs(depth=4, block_size=block_size)).eval()
    with torch.no_grad():
        _, history = model(torch.randn(2, 3, 16, 24), return_history=True)
    assert len(history) == bench.kept_tensors('full' if block_size is None else f'S={block_size}', 4)


def test_only_block_sizes_that_divide_the_branches_are_run(bench):
    assert bench.model_names(6, [2, 5, 8, 12]) == ['simple_vit', 'full', 'S=2', 'S=12']


@pytest.mark.slow
def test_a_tiny_run_reports_every_number_for_every_model_and_kind(bench):
    printed = []
    results = bench.main(['--tiny', '--kinds', 'infer,train'], log=printed.append)
    by_kind = results['depths'][4]
    tensor_mib = 2 * 16 * 32 * 4 / 2 ** 20                  # batch 2, 16 tokens, width 32, fp32
    assert by_kind['tensor_mib'] == pytest.approx(tensor_mib)
    for kind in ('infer', 'train'):
        rows = by_kind[kind]
        assert list(rows) == ['simple_vit', 'full', 'S=2', 'S=4', 'S=8']
        for name, row in rows.items():
            peak = row['peak_increase_mib']
            assert math.isfinite(peak['median']) and peak['min'] <= peak['median'] <= peak['max']
            assert len(peak['rounds']) == 1
            assert row['kept_tensors'] == {'simple_vit': 0, 'full': 9, 'S=2': 5, 'S=4': 3, 'S=8': 2}[name]
            assert row['kept_mib'] == pytest.approx(row['kept_tensors'] * tensor_mib)
            assert row['below_full_by_formula_mib'] == pytest.approx((9 - row['kept_tensors']) * tensor_mib)
        saved = {name: row['saved_token_tensors'] for name, row in rows.items()} if kind == 'train' else None
        if saved:
            # each mix saves its sources for the backward pass: Full AttnRes its 9 outputs, blocks every partial
            # sum, as many distinct tensors; SimpleViT saves fewer
            assert saved['S=2'] == saved['S=4'] == saved['S=8'] == saved['full'] > saved['simple_vit']
    assert len(printed) == 2 * 5                             # a line per child
