"""examples/ats_tokens.py (issue 26): its count of kept tokens, its FLOP formula, and the script at a tiny size."""

import json

import pytest
import torch

from helpers import load_example, move_off_initialisation
from vit_pytorch.ats_vit import ViT
from torch.utils.flop_counter import FlopCounterMode

from vit_pytorch.flops import FLOP_FORMULAS, explicit_attention
from vit_pytorch.training.data import load_digits



ats_tokens = load_example('ats_tokens')

# the example's model (the trainer's small ats_vit on the 16-pixel digits: 16 patch tokens)
SMALL = dict(image_size=16, patch_size=4, channels=1, num_classes=10, dim=64, depth=4, heads=4, dim_head=16,
             mlp_dim=128)


@pytest.mark.parametrize('budget', [(16, 8, 8, 4), (16, 8, 4, 2), (12, 12, 5, 1)])
def test_no_layer_keeps_more_patch_tokens_than_its_budget_on_the_digits(budget):
    torch.manual_seed(0)
    model = move_off_initialisation(ViT(**SMALL, max_tokens_per_depth=budget), scale=0.5).eval()
    images = load_digits('test', image_size=16).floats()[:64]
    counts = ats_tokens.kept_tokens(model, images)                           # (layers, b)
    assert counts.shape == (4, 64)
    limits = torch.tensor([min(16, k) for k in budget])[:, None]
    assert (counts >= 1).all() and (counts <= limits).all()
    assert (counts[1:] <= counts[:-1]).all()                                 # a dropped token never comes back
    # the last layer's count is the number of distinct patches the model returns
    with torch.no_grad():
        _, ids = model(images, return_sampled_token_ids=True)
    assert torch.equal(counts[-1], (ids >= 0).sum(dim=1))
    # the sampler's duplicates leave slots empty: the digits' scores keep fewer than K somewhere
    assert (counts < limits).any()


@pytest.mark.parametrize('budget, always_sample', [
    *(((budget, False) for budget in [(16, 16, 16, 16), (16, 8, 8, 4), (16, 8, 4, 2), (8, 8, 8, 8), (15, 3, 2, 1)])),
    # always_sample: the paper's rule at the full budget (the first layer plain), sampling at K = n - 1 in every
    # layer, a K above the patches (k = min(K, n - 1) = 16), plain layers between sampling ones
    *(((budget, True) for budget in [(None, 16, 16, 16), (16, 16, 16, 16), (8, 8, 8, 8), (None, 20, 16, 3),
                                     (12, None, 5, None)]))])
@pytest.mark.parametrize('widths', [dict(), dict(dim=24, heads=3, dim_head=10, mlp_dim=40, num_classes=7)])
def test_the_flop_formula_is_the_flop_counters(budget, always_sample, widths):
    arguments = {**SMALL, **widths}
    model = explicit_attention(ViT(**arguments, max_tokens_per_depth=budget, always_sample=always_sample)).eval()
    with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as counter:   # as flops.training_flops
        model(torch.randn(1, 1, 16, 16))
    counted = counter.get_total_flops()
    assert ats_tokens.forward_flops(**arguments, max_tokens_per_depth=budget, always_sample=always_sample) == counted


def test_the_plain_vits_count_is_written_out():
    # 17 tokens through 4 layers: qkv 2*17*64*192, attention 2*2*4*17*17*16, projection 2*17*64*64,
    # MLP 2*2*17*64*128; the patch projection 2*16*16*64 and the head 2*64*10
    layer = 2 * 17 * 64 * 192 + 2 * 2 * 4 * 17 * 17 * 16 + 2 * 17 * 64 * 64 + 2 * 2 * 17 * 64 * 128
    assert ats_tokens.forward_flops(**SMALL, max_tokens_per_depth=(16,) * 4) == 4 * layer + 2 * 16 * 16 * 64 + 1280


# one layer of the example's model reading n tokens and keeping m (the cls token among both), with the sampler's cls
# row where it samples: qkv of the n, the m queries over the n keys, projection and MLP of the m
def layer(n, m, sampling):
    return (2 * n * 64 * 192 + sampling * 2 * 4 * n * 16 + 2 * 2 * 4 * m * n * 16 + 2 * m * 64 * 64
            + 2 * 2 * m * 64 * 128)


ENDS = 2 * 16 * 16 * 64 + 2 * 64 * 10                          # the patch projection and the head


def test_the_paper_rules_count_is_the_plain_vits_plus_the_cls_rows():
    # at the full budget every slot is computed, an empty one too: only the sampler's cls row is added
    full = ats_tokens.forward_flops(**SMALL, max_tokens_per_depth=(None, 16, 16, 16), always_sample=True)
    assert full == 4 * layer(17, 17, False) + 3 * 2 * 4 * 17 * 16 + ENDS


def test_the_count_with_the_empty_slots_skipped_is_written_out():
    config = {key: value for key, value in SMALL.items() if key != 'depth'}
    # the paper's rule keeping 16, 10, 7, 7 patches: the plain first layer, then each sampling layer reads the
    # tokens the one before kept
    assert ats_tokens.skipped_flops(config, (None, 16, 16, 16), True, (16, 10, 7, 7)) == \
        layer(17, 17, False) + layer(17, 11, True) + layer(11, 8, True) + layer(8, 8, True) + ENDS
    # (16, 8, 8, 4) without always_sample keeping 16, 6, 6, 3: layers 0 and 2 do not sample (16 and 8 slots)
    assert ats_tokens.skipped_flops(config, (16, 8, 8, 4), False, (16, 6, 6, 3)) == \
        layer(17, 17, False) + layer(17, 7, True) + layer(7, 7, False) + layer(7, 4, True) + ENDS
    # where every slot holds a token, skipping the empty ones changes nothing
    for budget, always_sample, kept in [((None, 16, 16, 16), True, (16,) * 4), ((16, 8, 8, 4), False, (16, 8, 8, 4)),
                                        ((16, 8, 4, 2), False, (16, 8, 4, 2)), ((8, 8, 8, 8), True, (8,) * 4)]:
        assert ats_tokens.skipped_flops(config, budget, always_sample, kept) == \
            ats_tokens.forward_flops(**config, max_tokens_per_depth=budget, always_sample=always_sample)


@pytest.mark.slow                       # three trainings of one epoch each on the 1,347 digits: ~10 s
def test_the_script_at_a_tiny_size(tmp_path, monkeypatch):
    seen = []
    tested = ats_tokens.tested

    def spy(model, data, device):
        seen.append(((model.max_tokens_per_depth, model.always_sample), {key: value.clone() for key, value in model.state_dict().items()}))
        return tested(model, data, device)

    monkeypatch.setattr(ats_tokens, 'tested', spy)
    lines = ats_tokens.main(['--seeds', '0', '--epochs', '1', '--out', str(tmp_path), '--quiet'])
    runs = json.loads((tmp_path / 'results.json').read_text())['runs']
    official = 'None,16,16,16 always_sample'
    assert sorted(run['setting'] for run in runs) == ['ATS 16,8,4,2', 'ATS 16,8,8,4', f'ATS {official}', 'plain']
    assert (tmp_path / 'table.md').read_text().splitlines() == lines
    assert len(lines) == 2 + 7

    # the plug-in models hold the trained plain ViT's weights, with the sampler on
    (plain_budget, plain), *plugged = seen[:4]
    assert plain_budget == ((16, 16, 16, 16), False)
    assert [budget for budget, _ in plugged] == [((16, 8, 8, 4), False), ((16, 8, 4, 2), False),
                                                 ((None, 16, 16, 16), True)]
    for _, state in plugged:
        assert state.keys() == plain.keys() and all(torch.equal(state[key], plain[key]) for key in plain)

    # each row's paired difference is its accuracy minus the plain ViT's, and its two FLOP counts agree
    by_setting = {run['setting']: run for run in runs}
    plain_accuracy = 100 * by_setting['plain']['test_accuracy']
    names = ('16,8,8,4', '16,8,4,2', official)
    records = [by_setting[f'ATS {name}'] for name in names] + [by_setting['plain'][f'plug-in {name}'] for name in names]
    assert len(lines[3:]) == len(records)
    for line, record in zip(lines[3:], records):
        accuracy = 100 * record['test_accuracy']
        cells = [cell.strip() for cell in line.strip('|').split('|')]
        assert cells[1] == f'{accuracy:.2f} +- 0.00%'
        assert cells[2] == f'{accuracy - plain_accuracy:+.2f} +- 0.00 points'
        counted, formula = cells[3].split(', ')
        assert counted == formula
        # the kept counts cover the 450 test digits and average to the kept tokens shown
        counts = torch.tensor([[int(value) for value in name.split(',')] for name in record['kept_counts']])
        images = torch.tensor(list(record['kept_counts'].values()))
        assert images.sum() == 450
        means = (counts * images[:, None]).sum(dim=0) / 450
        shown = [float(value) for value in cells[5].split(' / ')]
        assert all(abs(value - mean) < 0.0051 for value, mean in zip(shown, means.tolist(), strict=True))
        # with the empty slots skipped, an image costs at most what the slots cost, the plain ViT's at most
        assert float(cells[4]) <= float(formula) <= 4.793
    assert lines[2].split('|')[4].strip() == '4.786, 4.786'        # test_the_plain_vits_count_is_written_out
    assert lines[2].split('|')[5].strip() == '4.786'               # every slot of the plain ViT holds a token
    assert lines[5].split('|')[4].strip() == '4.793, 4.793'        # test_the_paper_rules_count_is_the_plain_vits...

    # run again, it trains nothing: the recorded runs are read back
    monkeypatch.setattr(ats_tokens, 'fit', lambda *args, **kwargs: pytest.fail('trained a recorded run again'))
    assert ats_tokens.main(['--seeds', '0', '--epochs', '1', '--out', str(tmp_path), '--quiet']) == lines
