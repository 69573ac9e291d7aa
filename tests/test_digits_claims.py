"""examples/digits_claims.py (issues 26, 27): its FLOP formula for the patch merger, the auxiliary loss and the
per-epoch hook it gives `trials.fit`, nViT's renormalisation in it, the tied control of the specialized cls token,
the cluttered digits and their mask channel, and the script at a tiny size."""

import argparse
import json

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from helpers import load_example
from vit_pytorch.flops import FLOP_FORMULAS, explicit_attention
from vit_pytorch.training import registry
from vit_pytorch.training.data import ImageSet, normalise
from vit_pytorch.training.trials import fit, with_statistics



digits_claims = load_example('digits_claims')

SMALL = dict(image_size=16, patch_size=4, channels=1, num_classes=10, dim=64, depth=4, heads=4, dim_head=16,
             mlp_dim=128)


def counted_flops(model, image_size, channels):
    model = explicit_attention(model).eval()
    with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as counter:
        model(torch.randn(1, channels, image_size, image_size))
    return counter.get_total_flops()


@pytest.mark.parametrize('merge', [(2, 8), (2, 4), (1, 1), (4, 16), (3, 5)])
@pytest.mark.parametrize('widths', [dict(), dict(dim=24, heads=3, dim_head=10, mlp_dim=40, num_classes=7,
                                                 image_size=24, channels=3)])
def test_the_merger_flop_formula_is_the_flop_counters(merge, widths):
    from vit_pytorch.vit_with_patch_merger import ViT
    arguments = {**SMALL, **widths, 'patch_merge_layer': merge[0], 'patch_merge_num_tokens': merge[1]}
    counted = counted_flops(ViT(**arguments), arguments['image_size'], arguments['channels'])
    assert digits_claims.merger_flops(**arguments) == counted


def test_without_a_merge_the_formula_is_the_plain_mean_pooled_vits_count():
    from vit_pytorch.vit import ViT
    assert digits_claims.merger_flops(**SMALL) == counted_flops(ViT(**SMALL, pool='mean'), 16, 1)


def test_the_merged_count_is_written_out():
    # 16 tokens through layers 1-2, the merge of 16 into 4 (2 x 4 x 16 x 64 for the scores, as much for the sum),
    # then 4 tokens through layers 3-4; the patch projection 2*16*16*64 and the head 2*64*10
    def layer(n):
        return 2 * n * 64 * 192 + 2 * 2 * 4 * n * n * 16 + 2 * n * 64 * 64 + 2 * 2 * n * 64 * 128
    expected = 2 * layer(16) + 2 * 2 * 4 * 16 * 64 + 2 * layer(4) + 2 * 16 * 16 * 64 + 2 * 64 * 10
    assert digits_claims.merger_flops(**SMALL, patch_merge_layer=2, patch_merge_num_tokens=4) == expected


class Toy(nn.Module):
    """Logits from a linear map of the pixels; an auxiliary loss (offset - 3)^2 when asked, that nothing else reads."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 3)
        self.offset = nn.Parameter(torch.tensor(1.0))
        self.asked = []

    def forward(self, images, return_aux=False):
        self.asked.append(return_aux)
        logits = self.linear(images.flatten(1))
        return (logits, (self.offset - 3) ** 2) if return_aux else logits


def toy_data():
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(24, 1, 4, 4, generator=generator)
    labels = torch.arange(24) % 3
    return with_statistics(ImageSet(images, labels, ['a', 'b', 'c']), ImageSet(images[:6], labels[:6], ['a', 'b', 'c']))


# no augmentation: no shift, flip or mixup
PLAN = argparse.Namespace(lr=1e-2, weight_decay=0.05, batch_size=8, warmup_epochs=0, epochs=2, quiet=True,
                          label_smoothing=0.0, clip_grad=0.0, translate=0, hflip=False, mixup=0.0)


@pytest.mark.parametrize('weight', [0.5, 2.0])
def test_fit_adds_the_weighted_auxiliary_loss_and_calls_back_after_each_epoch(weight):
    model, gradients, epochs = Toy(), [], []
    model.offset.register_hook(lambda gradient: gradients.append((model.offset.item(), gradient.item())))
    fit(model, toy_data(), PLAN, seed=0, device='cpu', aux_loss=('return_aux', weight),
        after_epoch=lambda epoch, trained: epochs.append((epoch, trained is model, trained.training)))
    assert epochs == [(1, True, True), (2, True, True)]
    assert len(gradients) == 2 * 3 and all(model.asked[:6])        # 3 batches of 8 an epoch, each asked for the loss
    for offset, gradient in gradients:                               # d/d offset of CE + weight (offset - 3)^2
        assert gradient == pytest.approx(weight * 2 * (offset - 3), rel=1e-6)


def test_fit_without_an_auxiliary_loss_does_not_ask_for_one():
    model = Toy()
    fit(model, toy_data(), PLAN, seed=0, device='cpu')
    assert model.offset.grad is None and not any(model.asked)


def test_fit_puts_nvits_weights_back_on_the_sphere_after_the_steps():
    # blocks3 trains nViT through fit: the epoch loop must renormalise it after the steps, as the training command
    # does (input-side matrices unit rows, output-side unit columns; the layout of tests/test_normalized_vit.py)
    torch.manual_seed(0)
    model = registry.build_model('normalized_vit', image_size=4, patch_size=2, channels=1, num_classes=3, dim=16,
                                 depth=2, heads=2, dim_head=8, mlp_dim=32)
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    fit(model, toy_data(), PLAN, seed=0, device='cpu')
    weights = dict(model.named_parameters())
    assert not torch.equal(weights['to_pred.weight'], before['to_pred.weight'])       # it trained
    for name in ('abs_pos_emb.weight', 'to_pred.weight', 'transformer.layers.1.0.block.to_qkv.weight',
                 'transformer.layers.1.1.block.to_hidden_and_gate.weight'):
        torch.testing.assert_close(weights[name].detach().norm(dim=1), torch.ones(len(weights[name])))
    for name in ('to_patch_embedding.1.weight', 'transformer.layers.1.0.block.to_out.weight',
                 'transformer.layers.1.1.block.to_out.weight'):
        torch.testing.assert_close(weights[name].detach().norm(dim=0), torch.ones(weights[name].shape[1]))


def test_the_tied_control_is_a_simplevit_with_a_cls_token():
    # every specialized pair tied: SimpleViT's parameters and the cls token (dim), none of the cls token's own
    from vit_pytorch.simple_vit import SimpleViT
    from vit_pytorch.simple_vit_with_specialized_cls import SimpleViT as Specialized
    tied = digits_claims.tied_cls(Specialized(**SMALL, specialize_qkv_depth=2))
    assert sum(p.numel() for p in tied.parameters()) == sum(p.numel() for p in SimpleViT(**SMALL).parameters()) + 64
    # its layers treat the cls token as any token: swapping it with a patch token swaps the outputs (not so untied,
    # where the first two layers' qkv projections differ)
    tokens, swap = torch.randn(2, 17, 64), [5, 1, 2, 3, 4, 0, *range(6, 17)]
    torch.manual_seed(0)
    untied = Specialized(**SMALL, specialize_qkv_depth=2)
    for model, equivariant in ((tied, True), (untied, False)):
        with torch.no_grad():
            out, swapped = model.transformer(tokens), model.transformer(tokens[:, swap])
        assert torch.allclose(swapped, out[:, swap], atol=1e-5) == equivariant


def test_cluttered_digits_hold_the_digit_whole_over_pieces_of_others():
    # five flat images of distinct brightness: the mask is one 16 x 16 square of ones; under it the canvas is at
    # least the image's own brightness; elsewhere only black or other images' brightness
    levels = 0.3 + 0.1 * torch.arange(5)
    images = levels[:, None, None, None].expand(5, 1, 16, 16).contiguous()
    canvas = digits_claims.cluttered(images, torch.Generator().manual_seed(0))
    assert canvas.shape == (5, 2, 24, 24)
    for index, level in enumerate(levels):
        mask = canvas[index, 1].bool()
        rows, columns = mask.any(dim=1).nonzero().flatten(), mask.any(dim=0).nonzero().flatten()
        assert mask.sum() == 256 and len(rows) == len(columns) == 16
        assert mask[rows[0]:rows[-1] + 1, columns[0]:columns[-1] + 1].all()
        assert (canvas[index, 0][mask] >= level).all()
        outside = set(canvas[index, 0][~mask].unique().tolist())
        assert level.item() not in outside and outside <= {0.0, *(levels[levels != level].tolist())}
        assert len(outside) > 1                                              # some clutter landed off the digit
    # the mask marks the image's pixels above INK, nothing else
    ramp = torch.linspace(0, 1, 256).reshape(1, 1, 16, 16).repeat(2, 1, 1, 1)
    canvas = digits_claims.cluttered(ramp, torch.Generator().manual_seed(1))
    assert canvas[:, 1].sum(dim=(1, 2)).tolist() == [float((ramp[0] > digits_claims.INK).sum())] * 2


def test_the_mask_channel_comes_back_after_normalisation():
    class Spy(nn.Module):
        def forward(self, images, object_mask=None):
            self.seen = images, object_mask
            return images.mean(dim=(1, 2, 3))
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(6, 2, 8, 8, generator=generator)
    images[:, 1] = (images[:, 1] > 0.1).float()            # mostly ones: 1 normalises below 0.5
    data = with_statistics(ImageSet(images, torch.zeros(6, dtype=torch.long), ['a']), ImageSet(images, None, ['a']))
    normed = normalise(images, data.mean, data.std)
    spy = Spy()
    digits_claims.MaskChannel(spy, digits_claims.mask_threshold(data), use_mask=True)(normed)
    assert torch.equal(spy.seen[0], normed[:, :1]) and torch.equal(spy.seen[1], images[:, 1].bool())
    digits_claims.MaskChannel(spy, digits_claims.mask_threshold(data), use_mask=False)(normed)
    assert spy.seen[1] is None


@pytest.mark.slow          # 2 epochs each on the 1,347 digits: 24 s of CPU time for the first three, 40 s for the others
@pytest.mark.parametrize('claim', ['patch_merger', 'decorr', 'residuals', 'tokens2', 'blocks2', 'orthog', 'blocks3',
                                   'detpool', 'attnres_blocks'])
def test_the_script_at_a_tiny_size(claim, tmp_path, monkeypatch):
    arguments = [claim, '--seeds', '0', '--epochs', '2', '--out', str(tmp_path), '--quiet']
    lines = digits_claims.main(arguments)
    saved = json.loads((tmp_path / 'results.json').read_text())
    runs = {run['setting']: run for run in saved['runs']}
    models = digits_claims.CLAIMS[claim]
    assert sorted(runs) == sorted(label for label, *_ in models)
    assert (tmp_path / 'table.md').read_text().splitlines() == lines and len(lines) == 2 + len(models)

    for line, (label, name, options, weight) in zip(lines[2:], models):
        run = runs[label]
        # a test after each epoch, the last of them the final test that fit reports
        assert len(run['curve']) == 2 and run['curve'][-1] == run['test_accuracy']
        cells = [cell.strip() for cell in line.strip('|').split('|')]
        assert cells[0] == label
        assert cells[1:3] == [f"{100 * accuracy:.2f} +- 0.00%" for accuracy in run['curve']]
        # the paired difference is this model's accuracy minus the first's, or the one's it is paired with
        against = digits_claims.AGAINST.get(label)
        difference = 100 * (run['test_accuracy'] - runs[against or models[0][0]]['test_accuracy'])
        expected = ('' if label == models[0][0] else
                    f"{difference:+.2f} +- 0.00 points" + (f' (vs {against})' if against else ''))
        also = digits_claims.ALSO_AGAINST.get(label)
        if also:                                          # and minus the one's it is also paired with
            also_difference = 100 * (run['test_accuracy'] - runs[also]['test_accuracy'])
            expected += f"; {also_difference:+.2f} +- 0.00 points (vs {also})"
        assert cells[3] == expected
        size = 24 if claim == 'detpool' else 16           # the cluttered canvas
        config = registry.model_config(name, options, image_size=size, channels=1, num_classes=10)
        if claim == 'patch_merger':                       # the counter's FLOPs and the formula's agree
            counted, formula = cells[4].removesuffix(')').split(' (formula ')
            assert counted == formula == f'{digits_claims.merger_flops(**config) / 1e6:.2f}'
        parameters = sum(p.numel() for p in registry.build_model(name, **config).parameters())
        if label == digits_claims.TIED_CLS:               # SimpleViT's and the cls token
            parameters = sum(p.numel() for p in registry.build_model('simple_vit', **config).parameters()) + 64
        assert cells[5] == f"{parameters:,}"
    if claim == 'patch_merger':                           # 16 tokens, then K: fewer FLOPs the fewer tokens
        flops = [float(line.split('|')[5].split()[0]) for line in lines[2:]]
        assert flops[0] > flops[1] > flops[2]
    if claim == 'decorr':
        # the normalized rows train decorbp's normalized rule (every matrix), at their rate, paired with the standard
        # rule at 1e-2 as well; at the same rate that rule's step is 1 / (d - 1) of the standard's, so its matrices
        # moved less and the Linears' inputs stayed more correlated
        normalized = [(label, options) for label, _, options, _ in models if label.startswith('normalized')]
        assert [options['decorr_matrices_lr'] for _, options in normalized] == [1e-2, 0.63]
        for label, options in normalized:
            assert digits_claims.ALSO_AGAINST[label] == 'decorrelation matrices, lr 1e-2'
            config = registry.model_config('vit_with_decorr', options, image_size=16, channels=1, num_classes=10)
            matrices = [module for module in digits_claims.build(label, 'vit_with_decorr', config, 0, None).modules()
                        if isinstance(module, digits_claims.Decorrelation)]
            assert len(matrices) == 17 and {(m.method, m.lr) for m in matrices} == {
                ('normalized', options['decorr_matrices_lr'])}
        assert all(run['test_decorr_loss'] > 0 and run['test_linear_input_correlation'] > 0
                   for run in runs.values()) and len(runs) == 6
        assert (runs['normalized matrices, lr 1e-2']['test_linear_input_correlation']
                > runs['decorrelation matrices, lr 1e-2']['test_linear_input_correlation'])
    if claim == 'detpool':                                # one ViT, with and without the mask
        assert len({line.split('|')[5] for line in lines[2:]}) == 1
        assert saved['settings']['data'] == dict(image_size=24, pieces=3, piece_size=8, ink=0.25)

    # run again, it trains nothing: the recorded runs are read back
    monkeypatch.setattr(digits_claims, 'fit', lambda *args, **kwargs: pytest.fail('trained a recorded run again'))
    assert digits_claims.main(arguments) == lines
