"""What-Where Transformer (arXiv 2605.12021): slots carry a "what" (their embedding) and a "where" (the token-slot
mask); the slots compete for each token; without a position table the "what" does not move with the image while
the "where" does. vit-pytorch 1.26.14's checkpoints load with its outputs (tests/fixtures/make_wwt_fixtures.py)."""

import pytest
import torch

from helpers import load_fixture, move_off_initialisation, reference_case
from vit_pytorch.pretrained import load_vit_pytorch
from vit_pytorch.recorder import Recorder
from vit_pytorch.wwt import WWT, AutoencodingHead, MutualAttention

TINY = dict(image_size=(16, 24), patch_size=(4, 8), num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32,
            num_slots=(6, 3))


def tiny(**changes):
    torch.manual_seed(0)
    return move_off_initialisation(WWT(**{**TINY, **changes})).eval()


def images(seed=1):
    return torch.randn(2, 3, 16, 24, generator=torch.Generator().manual_seed(seed))


# the paper's idea


def test_the_slots_of_a_level_share_out_every_token_between_them():
    """Slot competition (a softmax over the slots, as Slot Attention's): each token's weights over a level's slots,
    registers included, are positive and sum to 1, in every layer and head."""
    model = tiny(num_register_slots=1)
    _, attns = Recorder(model)(images())
    assert len(attns) == 2 * 2                               # 2 layers x 2 interactions (tokens-level 1, -level 2)
    for attn, slots in zip(attns, (7, 4, 7, 4)):
        assert attn.shape == (2, 2, 12, slots)
        assert (attn > 0).all()
        torch.testing.assert_close(attn.sum(dim=-1), torch.ones(2, 2, 12))


def shift_one_patch_right(img):
    return img.roll(8, dims=-1)                              # patches are 8 wide: the 4 x 3 grid's columns rotate


def test_without_a_position_table_moving_the_image_leaves_what_the_slots_say_unchanged():
    model = tiny()
    with torch.no_grad():
        model.pos_embedding.zero_()
        slots, _, _ = model(images(), return_embeddings=True)
        moved, _, _ = model(shift_one_patch_right(images()), return_embeddings=True)
    for level, level_moved in zip(slots, moved):
        torch.testing.assert_close(level_moved, level, rtol=1e-4, atol=1e-5)


def test_without_a_position_table_where_the_slots_look_moves_with_the_image():
    model = tiny()
    with torch.no_grad():
        model.pos_embedding.zero_()
        _, _, masks = model(images(), return_embeddings=True)
        _, _, moved = model(shift_one_patch_right(images()), return_embeddings=True)
    for mask, mask_moved in zip(masks, moved):                # (b, heads, 12 tokens on the 4 x 3 grid, slots)
        on_grid = mask.unflatten(2, (4, 3))
        torch.testing.assert_close(mask_moved.unflatten(2, (4, 3)), on_grid.roll(1, dims=3), rtol=1e-4, atol=1e-5)
        assert not torch.allclose(mask_moved, mask, atol=1e-3)


def test_with_the_position_table_the_slots_see_where_things_are():
    model = tiny()
    with torch.no_grad():
        slots, _, _ = model(images(), return_embeddings=True)
        moved, _, _ = model(shift_one_patch_right(images()), return_embeddings=True)
    assert not torch.allclose(moved[0], slots[0], atol=1e-3)


def test_a_slot_whose_mask_keeps_one_token_takes_that_tokens_value_as_what_it_adds():
    """With the slots' weights normalised over the tokens, a mask that rules out every token but one for a slot
    makes the slot's update that token's value, projected: its "where" decides its "what"."""
    torch.manual_seed(0)
    attn = move_off_initialisation(MutualAttention(16, 3, 2, 8, 32, l1norm_after_tokens_softmax=True,
                                                   gate_attention=False))
    tokens, slots = torch.randn(1, 5, 16), torch.randn(1, 3, 16)
    mask = torch.zeros(1, 1, 2, 5, 3)
    mask[..., 1] = -1e4
    mask[..., 2, 1] = 0.                                      # slot 1 keeps only token 2
    _, slots_out, _ = attn(tokens, slots, mask)
    value = attn.to_qkv(tokens)[:, 2, 16:]                    # token 2's values, (1, heads * dim_head)
    torch.testing.assert_close(slots_out[:, 1], attn.to_out_slots(value), rtol=1e-4, atol=1e-5)


def test_the_masks_are_handed_from_layer_to_layer():
    """A layer's logits add the mask the layer before it left: the first layer's next mask reaches the output (a
    shift of every entry alike would not: both softmaxes ignore it; this one favours slot 0 in head 0)."""
    model = tiny()
    before = model(images())
    with torch.no_grad():
        model.transformer.layers[0].attns[0].mlp_mask[4].bias[0] += 1.     # its outputs are (heads, slots), slot last
    assert not torch.allclose(model(images()), before, atol=1e-4)


def test_the_logits_are_the_mean_over_levels_of_each_levels_mean_slot_logits():
    model = tiny()
    with torch.no_grad():
        slots, _, _ = model(images(), return_embeddings=True)
        expected = sum(model.mlp_head(level).mean(dim=1) for level in slots) / len(slots)
        torch.testing.assert_close(model(images()), expected, rtol=1e-5, atol=1e-6)


def test_sigreg_reads_only_the_levels_sigreg_slots_names():
    """One layer, so the level 1 slots never read level 2's: the loss of level 1 alone gives level 2's slots no
    gradient, and level 1's a non-zero one."""
    model = tiny(depth=1, sigreg_slots=(True, False)).train()
    _, loss = model(images())
    first, second = torch.autograd.grad(loss, list(model.slots))
    assert first.abs().sum() > 0 and second.abs().sum() == 0


def test_the_logits_send_no_gradient_back_through_the_last_layers_patch_token_branches():
    """The logits read the slots only, so after the last layer no patch token is read: the last layer's branches that
    only update the tokens (their feed-forward, each token-slot interaction's token output and gate) get no gradient
    at all, as in vit-pytorch's graph, rather than zeros carried back through them (which cost our training step
    about a tenth of its time at the registry's preset, docs/performance.md). The first layer's get one."""
    model = tiny().train()
    model(images()).sum().backward()

    def token_branches(layer):
        return [*layer.mlps[0].parameters(),
                *(p for attn in layer.attns for p in (*attn.to_out.parameters(), *attn.tokens_gate.parameters()))]

    first, last = model.transformer.layers
    assert [p.grad for p in token_branches(last)] == [None] * 11     # 5 feed-forward, 2 x 3 attention tensors
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in token_branches(first))


# what the trainer scores


def logits_by_hand(model, img):
    """The slot head's logits (the mean over the levels of the mean over each level's slots of `mlp_head`), and with
    `return_tokens` the mean of those and the token head's (the mean over the patches of `mlp_head_tokens`)."""
    slots, tokens, _ = model(img, return_embeddings=True)
    slot_logits = sum(model.mlp_head(level).mean(dim=1) for level in slots) / len(slots)
    return slot_logits if tokens is None else (slot_logits + model.mlp_head_tokens(tokens).mean(dim=1)) / 2


@pytest.mark.parametrize('training', [True, False], ids=['training', 'eval'])
@pytest.mark.parametrize('sigreg_slots', [None, True], ids=['no_sigreg', 'sigreg'])
@pytest.mark.parametrize('return_tokens', [False, True], ids=['slots', 'tokens'])
def test_the_trainer_scores_the_mean_of_the_slot_and_token_heads_logits(return_tokens, sigreg_slots, training):
    """Whatever WWT returns (logits, WWTReturn(slot_logits, token_logits), either with the SIGReg loss after it),
    `predicted_logits` gives the logits the trainer and its evaluation score: the slot head's, or with
    `return_tokens` the mean of both heads'."""
    from vit_pytorch.training.loop import predicted_logits

    model = tiny(return_tokens=return_tokens, sigreg_slots=sigreg_slots).train(training)
    with torch.no_grad():
        torch.testing.assert_close(predicted_logits(model(images())), logits_by_hand(model, images()),
                                   rtol=1e-5, atol=1e-6)


def test_the_evaluation_of_wwt_with_both_heads_and_sigreg_scores_the_heads_mean_logits():
    """The training command's evaluation of a WWT built with `return_tokens` and `sigreg_slots` (it crashed on the
    WWTReturn): its test loss is the cross-entropy of the two heads' mean logits, its accuracy their argmax's."""
    import torch.nn.functional as F

    from vit_pytorch.training.data import ImageSet
    from vit_pytorch.training.loop import evaluate

    model = tiny(return_tokens=True, sigreg_slots=True)
    img = torch.rand(6, 3, 16, 24, generator=torch.Generator().manual_seed(2))
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    tested = evaluate(model, ImageSet(img, labels, classes=list('abcde')), mean=(0.5,) * 3, std=(0.25,) * 3,
                      batch_size=4)
    with torch.no_grad():
        logits = logits_by_hand(model, (img - 0.5) / 0.25)
    assert tested['loss'] == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-5)
    assert tested['correct'] == (logits.argmax(dim=-1) == labels).sum().item()


# vit-pytorch 1.26.14's module (tests/fixtures/make_wwt_fixtures.py)


@pytest.mark.parametrize('name', ['vit_pytorch_1.26.14_wwt', 'vit_pytorch_1.26.14_wwt_over_slots'])
def test_vit_pytorchs_checkpoint_loads_and_gives_its_logits_and_masks(name):
    config, state_dict, x, expected = reference_case(name, 'image_size', 'patch_size', 'num_slots',
                                                     'num_register_slots')
    if 'interactions' in config:
        config['interactions'] = tuple(tuple(pair) for pair in config['interactions'])
    tensors = load_fixture(name)[2]
    model = load_vit_pytorch(WWT(**config), state_dict).eval()
    with torch.no_grad():
        out = model(x)
        _, _, masks = model(x, return_embeddings=True)
    if config.get('return_tokens'):
        out, token_logits = out
        torch.testing.assert_close(token_logits, tensors['token_logits'], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for i, mask in enumerate(masks):
        torch.testing.assert_close(mask, tensors[f'mask_{i}'], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('token_softmax_over_slots, project_mask_groups, channel_first',
                         [(False, False, False), (True, False, False), (True, True, True)])
def test_vit_pytorchs_main_block_runs(token_softmax_over_slots, project_mask_groups, channel_first):
    autoencoding_head = AutoencodingHead(image_size=256, patch_size=32, pathways=((3, 2, 0), (0, 2, 3)),
                                         channel_first=channel_first)
    model = WWT(image_size=256, patch_size=32, num_classes=1000, dim=256, depth=2, num_slots=(64, 32, 16),
                sigreg_slots=(True, False, True), interactions=((0, 1), (0, 2), (1, 2), (2, 3)), heads=4, mlp_dim=512,
                return_tokens=True, l1norm_after_tokens_softmax=True, token_softmax_over_slots=token_softmax_over_slots,
                project_mask_groups=project_mask_groups, num_register_tokens=4, num_register_slots=(4, 4, 2),
                task_heads=autoencoding_head)
    out, dense_feature_maps, sreg_loss = model(torch.randn(1, 3, 256, 256))
    slot_preds, token_preds = out
    assert slot_preds.shape == (1, 1000) and token_preds.shape == (1, 1000)
    dense_320, dense_023 = dense_feature_maps
    assert dense_320.shape == ((1, 256, 8, 8) if channel_first else (1, 8, 8, 256))
    assert dense_023.shape == (1, 16, 256)
    assert sreg_loss.ndim == 0


def test_the_autoencoding_head_carries_the_top_slots_down_to_the_patch_grid():
    head = AutoencodingHead(image_size=(16, 24), patch_size=(4, 8), channel_first=True)
    model = tiny(task_heads=head)
    logits, dense = model(images())
    assert logits.shape == (2, 5)
    assert isinstance(dense, tuple) and [d.shape for d in dense] == [(2, 16, 4, 3)] * 2


# clear errors


@pytest.mark.parametrize('changes, error, match', [
    (dict(num_slots=(3, 6)), ValueError, 'num_slots must strictly decrease'),
    (dict(num_slots=2.0), TypeError, 'num_slots'),
    (dict(sigreg_slots=(True,)), ValueError, 'sigreg_slots must be one value or a tuple of one per level'),
    (dict(num_register_slots=(1, 1, 1)), ValueError, 'num_register_slots'),
    (dict(interactions=((1, 0),)), ValueError, r'interactions must be pairs \(i, j\) of levels 0 <= i < j <= 2'),
    (dict(interactions=((0, 3),)), ValueError, 'interactions'),
    (dict(interactions=((0, 1), (0, 1))), ValueError, 'interactions must be distinct'),
    (dict(task_heads='decoder'), TypeError, 'task_heads'),
    (dict(image_size=(16, 20)), ValueError, 'image'),
])
def test_a_bad_argument_is_refused_by_name(changes, error, match):
    with pytest.raises(error, match=match):
        WWT(**{**TINY, **changes})


def test_a_pathway_that_turns_back_is_refused():
    with pytest.raises(ValueError, match=r'strictly up or strictly down the levels, got \(2, 0, 1\)'):
        AutoencodingHead(image_size=16, patch_size=4, pathways=((2, 0, 1),))


# the training command: --sigreg-slots adds --sigreg-loss-weight x the slots' SIGReg to the cross-entropy


def epps_pulley_by_hand(samples, projections, knots=17):
    """The mean over the directions of N * trapezoid over t in [-5, 5] of |mean_j exp(i t x_j) - exp(-t^2/2)|^2
    exp(-t^2/2), for samples (N, d) and unit directions (d, m)."""
    t = torch.linspace(-5, 5, knots, dtype=torch.float64)
    x = (samples.double() @ projections.double())                                      # (N, m)
    ecf = torch.exp(1j * x[..., None] * t).mean(dim=0)                                  # (m, knots), complex
    phi = torch.exp(-t ** 2 / 2)
    f = (ecf - phi).abs() ** 2 * phi
    return (samples.shape[0] * ((f[:, 1:] + f[:, :-1]) / 2 * (t[1] - t[0])).sum(dim=-1)).mean()


def wwt_trainer_step(monkeypatch, tmp_path, *options):
    """helpers.first_training_step with --model wwt --sigreg-slots True --depth 1, its loss backpropagated:
    dict(loss, images, labels (the cross-entropy's targets), projections (SIGReg's directions, as drawn), model,
    grads (the slots' gradients))."""
    import torch.nn.functional as F

    from helpers import first_training_step
    from vit_pytorch import sigreg

    drawn, targets = [], []
    draw, cross_entropy = sigreg.random_projections, F.cross_entropy
    monkeypatch.setattr(sigreg, 'random_projections', lambda *a, **k: drawn.append(draw(*a, **k)) or drawn[-1])
    monkeypatch.setattr(F, 'cross_entropy',
                        lambda input, target, **k: targets.append(target) or cross_entropy(input, target, **k))

    def before_step():                                  # the trainer's checks before training drew some
        drawn.clear()
        targets.clear()

    seen = first_training_step(monkeypatch, tmp_path, 'wwt', '--sigreg-slots', 'True', '--depth', 1, *options,
                               backward=True, before_step=before_step)
    monkeypatch.undo()
    return dict(seen, projections=drawn, labels=targets[0].argmax(dim=1),
                grads=[p.grad.clone() for p in seen['model'].slots])


def sigreg_by_hand(model, images, projections):
    slots, _, _ = model(images, return_embeddings=True)
    assert len(slots) == len(projections) == 2                                   # one draw a level
    return sum(epps_pulley_by_hand(level.flatten(0, 1), directions) for level, directions in zip(slots, projections))


@pytest.mark.parametrize('weight', [None, 0.5])
def test_the_trainers_loss_of_wwt_with_sigreg_slots_is_cross_entropy_plus_weight_x_sigreg(weight, monkeypatch,
                                                                                        tmp_path):
    import torch.nn.functional as F

    chosen = () if weight is None else ('--sigreg-loss-weight', weight)
    seen = wwt_trainer_step(monkeypatch, tmp_path, *chosen)
    model = seen['model']
    with torch.no_grad():
        logits, _ = model(seen['images'])
        regulariser = sigreg_by_hand(model, seen['images'], seen['projections'])
    expected = F.cross_entropy(logits, seen['labels'], label_smoothing=0.1) + (0.02 if weight is None else weight) * \
        regulariser
    assert regulariser > 1                                  # the SIGReg term counts visibly: at least 0.02 of ~2.3
    assert seen['loss'] == pytest.approx(expected.item(), rel=1e-4)


def test_a_trainer_step_of_wwt_gives_the_slots_the_gradient_of_cross_entropy_plus_weight_x_sigreg(monkeypatch,
                                                                                              tmp_path):
    """The slots' gradient in a trainer step is that of the loss written out by hand, and SIGReg's part of it is
    not negligible (without the term the comparison fails)."""
    import torch.nn.functional as F

    seen = wwt_trainer_step(monkeypatch, tmp_path)
    model = seen['model']
    logits, _ = model(seen['images'])
    cross_entropy = F.cross_entropy(logits, seen['labels'], label_smoothing=0.1)
    regulariser = sigreg_by_hand(model, seen['images'], seen['projections'])
    from_ce = torch.autograd.grad(cross_entropy, list(model.slots), retain_graph=True)
    from_sigreg = torch.autograd.grad(regulariser, list(model.slots))
    for got, ce, sig in zip(seen['grads'], from_ce, from_sigreg):
        assert (0.02 * sig).norm() > 0.05 * ce.norm()
        torch.testing.assert_close(got, ce + 0.02 * sig.float(), rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize('options, message', [
    (('--model', 'wwt', '--sigreg-loss-weight', 0.5),
     '--sigreg-loss-weight weights the auxiliary loss of --model wwt built with --sigreg-slots; --model wwt without '
     '--sigreg-slots has none'),
    (('--model', 'vit', '--sigreg-loss-weight', 0.5),
     '--sigreg-loss-weight weights the auxiliary loss of --model wwt built with --sigreg-slots; --model vit has none'),
    (('--model', 'wwt', '--sigreg-slots', 'True', '--sigreg-loss-weight', -1),
     '--sigreg-loss-weight must be a finite number >= 0, got -1'),
])
def test_a_sigreg_weight_that_would_do_nothing_is_refused(options, message, tmp_path, capsys):
    from vit_pytorch import train

    assert train.main([str(option) for option in (*options, '--image-size', 8, '--depth', 1, '--epochs', 1,
                                                  '--quiet', '--no-plots', '--out', tmp_path / 'run')]) == 2
    error = capsys.readouterr().err
    assert message in error
    assert len(error.strip().splitlines()) == 1
