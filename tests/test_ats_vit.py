"""ATS (Fayyaz et al., arXiv 2111.15667): what the paper adds to the ViT, and vit-pytorch's checkpoints."""

import math

import pytest
import torch
from einops import rearrange
from torch import nn

from helpers import count, load_fixture, move_off_initialisation, reference_case
from vit_pytorch.ats_vit import AdaptiveTokenSampling, Attention, ViT, ats_vit
from vit_pytorch.pretrained import load_vit_pytorch

# 4 x 6 = 24 patches; the layers keep at most 12, 6 and 3 of them
SMALL = dict(image_size=(16, 24), patch_size=4, num_classes=5, dim=16, depth=3, max_tokens_per_depth=(12, 6, 3),
             heads=2, dim_head=8, mlp_dim=24)
PATCHES = 24


def small_model(seed=0, **changes):
    torch.manual_seed(seed)
    return move_off_initialisation(ViT(**{**SMALL, **changes}), seed=seed, scale=0.3).eval()


def images(seed, batch=4):
    return torch.randn(batch, 3, 16, 24, generator=torch.Generator().manual_seed(seed))


def kept_per_layer(model, img):
    """Each layer's kept patch ids (b, slots), -1 where a slot is empty, from the encoder's state."""
    kept, state = [], {}
    x = model.embed(img)
    for layer in model.transformer.layers:
        x, entries = model.transformer.step(layer, x, state)
        state = {**state, **entries}
        ids = state.get('token_ids')
        kept.append(ids.masked_fill(~state['mask'], 0)[:, 1:] - 1 if ids is not None else None)
    return kept


def sampled_per_layer(model, img):
    """Each attention layer's `ids` (b, 1 + slots) where it sampled, None where it did not."""
    sampled = []
    hooks = [layer[0].register_forward_hook(lambda module, inputs, output: sampled.append(output[2]))
             for layer in model.transformer.layers]
    try:
        with torch.no_grad():
            model(img)
    finally:
        for hook in hooks:
            hook.remove()
    return sampled


# the paper's idea


@pytest.mark.parametrize('seed', range(4))
def test_a_layer_never_keeps_more_than_its_max_tokens(seed):
    """At most K slots, and a kept patch in one of them only: with K slots a bound on the filled slots alone would
    hold by the shape, whatever the sampler kept."""
    model = small_model(seed)
    for kept, limit in zip(kept_per_layer(model, images(seed)), SMALL['max_tokens_per_depth']):
        assert kept.shape[1] <= limit
        for row in kept.tolist():
            real = [i for i in row if i >= 0]
            assert len(real) == len(set(real)) <= limit


@pytest.mark.parametrize('seed', range(4))
def test_the_cls_token_is_always_kept_first(seed):
    model = small_model(seed)
    x = model.embed(images(seed))
    tokens, token_ids = model.transformer(x)
    assert (token_ids[:, 0] == 0).all()
    # the pooled token is the cls token's: changing the patches alone cannot replace it by a patch token
    assert tokens.shape[1] == 1 + SMALL['max_tokens_per_depth'][-1]


@pytest.mark.parametrize('seed', range(4))
def test_the_returned_ids_are_distinct_patches_in_ascending_order_then_empty_slots(seed):
    logits, ids = small_model(seed)(images(seed), return_sampled_token_ids=True)
    assert ids.shape == (4, SMALL['max_tokens_per_depth'][-1])
    for row in ids.tolist():
        real = [i for i in row if i != -1]
        assert row == real + [-1] * (len(row) - len(real))
        assert real == sorted(set(real)) and all(0 <= i < PATCHES for i in real) and real


def test_a_token_of_zero_score_is_never_sampled():
    """Zero cls attention or a zero value vector gives a token score 0: it adds nothing to the distribution that
    the sample is drawn from, so no sampling point can land on it."""
    generator = torch.Generator().manual_seed(0)
    sampler = AdaptiveTokenSampling(6)
    for _ in range(50):
        attention = torch.rand(3, 2, 17, generator=generator).softmax(dim=-1)
        values = torch.randn(3, 2, 17, 4, generator=generator)
        zero = torch.rand(3, 17, generator=generator) < 0.5
        zero[:, 0] = False                                  # the cls token is not sampled from
        values = values.masked_fill(zero[:, None, :, None], 0.)
        ids, keep = sampler(attention, values)
        assert not zero.gather(1, ids).masked_select(keep).any()


def test_the_empty_slots_of_an_earlier_layer_are_never_sampled_again():
    """An empty slot is masked out of the cls token's attention: its score is 0 in every later layer."""
    torch.manual_seed(0)
    layer = move_off_initialisation(Attention(16, heads=2, dim_head=8, output_num_tokens=4), scale=0.5).eval()
    generator = torch.Generator().manual_seed(3)
    for _ in range(20):
        x = torch.randn(3, 11, 16, generator=generator)
        mask = torch.rand(3, 11, generator=generator) < 0.5
        mask[:, :2] = True                                  # the cls token and at least one patch
        _, kept, ids = layer(x, mask=mask)
        assert mask.gather(1, ids).all()
        assert (kept[:, 1:].sum(dim=1) <= mask[:, 1:].sum(dim=1)).all()


def hand_made_layer():
    """An ATS layer (K = 4, 2 heads of 2 channels, no norm) whose cls attention and values are read off its input:
    q_h = (sqrt(2) x_5, 0), k_h = (x_4, 0) in both heads, v = (x_0, x_1 | x_2, x_3). The cls token (x_5 = 1) has
    the logit q k^T / sqrt(2) = x_4 on every token: a token with x_4 = ln w gets cls attention w / (sum of the w
    of the real tokens) in each head."""
    layer = Attention(6, heads=2, dim_head=2, output_num_tokens=4).double().eval()
    layer.norm = nn.Identity()
    weight = torch.zeros(12, 6, dtype=torch.float64)
    weight[0, 5] = weight[2, 5] = 2 ** 0.5                  # q: (qkv h d) rows 0 and 2 are each head's first channel
    weight[4, 4] = weight[6, 4] = 1.                        # k: rows 4 and 6
    weight[8:12, :4] = torch.eye(4)                         # v: rows 8 to 11
    layer.to_qkv.weight.data = weight
    return layer


def test_a_hand_made_layer_keeps_the_tokens_the_rule_gives_by_hand():
    """The cls token and 8 patches, patch j at position j, given (w, v) (cls: w 1, v 0):
        1: (4, (1/sqrt2, 0 | 1/sqrt2, 0))  score 4 x 1 = 4 (its value split over the heads)
        2: (4, (9, 12 | 0, 0))             60
        3: (2, 0)                          0 (a zero value vector)
        4: (1, (1, 0 | 0, 0))              1
        5: (1000, (1, 0 | 0, 0))           0: masked out, no key of the cls token
        6: (1, (3, 4 | 0, 0))              5
        7: (2, (0, 0 | 1, 0))              2
        8: (1, (0, 0 | 0, 3))              3
    the score being the cls attention summed over the heads (2 w / 16, the same factor for every patch) times the
    norm of the whole value vector. Sorted, 0 0 1 2 3 4 5 60: cumulative 0 0 1 3 6 10 15 75, min-max normalised
    c / 75; K = 4 points evenly from the least non-zero value 1/75 to 1: 1/75, 77/225, 151/225, 1; the nearest of
    the K largest values 6/75, 10/75, 15/75, 1 to each: 6/75 (patch 8), 15/75 (patch 6), 1 (patch 2), 1 (patch 2
    again: its slot left empty). Kept: the cls token first, then patches 8, 6, 2 and an empty slot.
    Weighing each head's attention by that head's value norm (vit-pytorch's) makes patch 1's score 4 sqrt2 and keeps
    patch 1 instead of 6; dropping the 1/sqrt(dim_head) scale (attention w^sqrt2) keeps 1 instead of 6; ignoring the
    mask in the cls attention spends two slots on patch 5 (then empty: it is not there) and keeps 1 and 2; taking for
    each point the first token whose cumulative value reaches it keeps 4 and 2."""
    layer = hand_made_layer()
    values = [[0, 0, 0, 0], [2 ** -0.5, 0, 2 ** -0.5, 0], [9, 12, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0],
              [3, 4, 0, 0], [0, 0, 1, 0], [0, 0, 0, 3]]
    weights = [1, 4, 4, 2, 1, 1000, 1, 2, 1]
    x = torch.tensor([v + [math.log(w), 0.] for v, w in zip(values, weights)], dtype=torch.float64)[None]
    x[0, 0, 5] = 1.                                         # the cls token asks
    mask = torch.ones(1, 9, dtype=torch.bool)
    mask[0, 5] = False
    with torch.no_grad():
        _, kept, ids = layer(x, mask=mask)
    assert ids.tolist() == [[0, 8, 6, 2, 2]]
    assert kept.tolist() == [[True, True, True, True, False]]


def test_the_kept_tokens_are_the_official_samplers():
    """tests/fixtures/make_ats_official_fixtures.py: the official AdaptiveTokenSampler (adaptivetokensampling/ATS
    @ 9271257) with K points for a budget of K, on cls attention rows with tokens of zero score and one image whose
    attention is on two tokens: the same tokens kept, in the same order (ascending significance; ours leaves a
    duplicate's slot empty where the official code moves the empty slots last)."""
    tensors = load_fixture('ats_official_sampler')[2]
    for k in (3, 5, 8, 11, 12):
        ids, keep = AdaptiveTokenSampling(k)(tensors['attention'][:, :, 0], tensors['values'])
        ours = [[i for i, kept in zip(row, flags) if kept] for row, flags in zip(ids.tolist(), keep.tolist())]
        assert ours == [[i for i in row[1:] if i > 0] for row in tensors[f'kept.{k}'].tolist()], k


def test_concentrated_scores_keep_fewer_tokens():
    """Adaptive: K = 4 points on a distribution with all its mass on one token all pick that token; on a uniform
    one over 8 tokens (normalised cumulative values j / 7) the points 1/7, 3/7, 5/7, 1 pick among the top four
    (4/7 .. 1) the values 4/7, 4/7, 5/7 and 1: 3 tokens."""
    sampler = AdaptiveTokenSampling(4)
    values = torch.ones(2, 1, 9, 3)
    peaked = torch.zeros(1, 1, 9)
    peaked[..., 0], peaked[..., 5] = 0.5, 0.5
    uniform = torch.full((1, 1, 9), 1 / 9)
    ids, keep = sampler(torch.cat([peaked, uniform]), values)
    assert ids[0][keep[0]].tolist() == [5]
    assert keep[1].sum() == 3


def test_a_sampling_layer_gives_the_kept_tokens_the_full_layers_output():
    """Sampling only drops tokens after attention: the kept tokens' outputs are the rows of the layer without it."""
    torch.manual_seed(0)
    sampling = move_off_initialisation(Attention(16, heads=2, dim_head=8, output_num_tokens=5), scale=0.5).eval()
    full = Attention(16, heads=2, dim_head=8).eval()
    full.load_state_dict(sampling.state_dict())
    x = torch.randn(3, 13, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out, _, ids = sampling(x, mask=None)
        expected, _, none = full(x, mask=None)
    assert none is None
    torch.testing.assert_close(out, expected.gather(1, ids[..., None].expand(-1, -1, 16)), rtol=1e-5, atol=1e-6)


def test_the_model_is_a_function_of_its_input():
    model = small_model(2)
    with torch.no_grad():
        first, second = model(images(2), return_sampled_token_ids=True), model(images(2), return_sampled_token_ids=True)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_layers_with_no_more_tokens_than_their_limit_keep_every_token():
    model = small_model(0, max_tokens_per_depth=(PATCHES, PATCHES, PATCHES))
    _, ids = model(images(0), return_sampled_token_ids=True)
    assert ids.tolist() == [list(range(PATCHES))] * 4


def test_without_always_sample_a_layer_at_its_patch_count_is_a_plain_layer():
    """vit-pytorch's rule (always_sample=False, the default): K = every patch samples nothing, so the model is the
    plain one with the same weights (no sampler at all: None layers)."""
    model = small_model(0, max_tokens_per_depth=(PATCHES, PATCHES - 4, PATCHES - 4), always_sample=False)
    # the first layer keeps all 24, the second samples 20 slots, the third (20 slots, K = 20) keeps them
    assert [layer is None for layer in sampled_per_layer(model, images(0))] == [True, False, True]
    model = small_model(0, max_tokens_per_depth=(PATCHES,) * 3, always_sample=False)
    plain = ViT(**{**SMALL, 'max_tokens_per_depth': (None, None, None)}).eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        logits, ids = model(images(0), return_sampled_token_ids=True)
        expected = plain(images(0))
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    assert ids.tolist() == [list(range(PATCHES))] * 4


def test_with_always_sample_a_layer_at_its_patch_count_samples():
    """always_sample=True: K = 24 points over 24 patches (and K = 30 is capped at the 24 patches), duplicates
    dropped: every layer keeps 24 slots, some of them empty, fewer tokens than patches."""
    for k in (PATCHES, 30):
        model = small_model(0, max_tokens_per_depth=(k,) * 3, always_sample=True)
        sampled = sampled_per_layer(model, images(0))
        assert all(ids.shape == (4, 1 + PATCHES) for ids in sampled), k
        _, ids = model(images(0), return_sampled_token_ids=True)
        assert ids.shape == (4, PATCHES) and ((ids >= 0).sum(dim=1) < PATCHES).all(), k


def test_a_layer_without_a_max_tokens_never_samples():
    """None in max_tokens_per_depth: a plain layer with no sampler, even with always_sample and after a layer that
    sampled (it attends over the slots the layer before it kept and passes them on)."""
    model = small_model(0, max_tokens_per_depth=(None, 12, None), always_sample=True)
    assert [layer[0].ats is None for layer in model.transformer.layers] == [True, False, True]
    sampled = sampled_per_layer(model, images(0))
    assert sampled[0] is None and sampled[1].shape == (4, 13) and sampled[2] is None
    tokens = model.forward_features(images(0))
    assert tokens.shape == (4, 13, SMALL['dim'])


# the paper's configuration (the official configs/ImageNet/DeiT_S.yaml, adaptivetokensampling/ATS @ 9271257)

OFFICIAL_DEIT_S = 22_050_664      # tests/fixtures/count_official_ats.py: its trainable parameters (timm's DeiT-S's too)


def test_the_deit_s_configuration_has_the_official_parameters_less_qkv_biases_plus_two_patch_norms():
    """The official model has biases on its 12 layers' qkv projections (3 x 384 each; vit-pytorch's ATS has none)
    and a convolution as its patch embedding, where vit-pytorch's has a LayerNorm before (16 x 16 x 3 wide) and one
    after (384 wide) its linear projection."""
    with torch.device('meta'):
        model = ats_vit('DeiT-S')
    qkv_biases = 12 * 3 * 384
    patch_norms = 2 * (16 * 16 * 3) + 2 * 384
    assert count(model) == OFFICIAL_DEIT_S - qkv_biases + patch_norms


def test_the_deit_s_configuration_samples_in_layers_3_to_11_at_max_tokens():
    with torch.device('meta'):
        model = ats_vit('DeiT-S', 98)
    assert model.max_tokens_per_depth == (None,) * 3 + (98,) * 9     # the first three are plain layers
    assert model.always_sample
    with torch.device('meta'):
        assert ats_vit('DeiT-S').max_tokens_per_depth == (None,) * 3 + (196,) * 9


def test_the_deit_s_configuration_samples_only_in_its_ats_layers():
    """At 64 pixels (16 patches) with K = 8: the first three layers keep every token, each later one at most 8."""
    torch.manual_seed(0)
    model = move_off_initialisation(ats_vit('DeiT-S', 8, image_size=64, num_classes=3, dim=24, heads=2), scale=0.3)
    kept = kept_per_layer(model.eval(), torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1)))
    assert kept[:3] == [None] * 3
    assert all(layer.shape == (2, 8) for layer in kept[3:])


def fixture_layer(k, always_sample):
    """An ATS layer (2 heads of 4 channels, no norm, float64) whose cls attention and values are read off its input,
    for the official sampler fixture's 1 + 12 tokens: v = (x_0 .. x_3 | x_4 .. x_7); q_h = (2 x_10, 0, 0, 0) and
    k_h = (x_(8+h), 0, 0, 0), so the cls token (x_10 = 1) has the logit q k^T / 2 = x_(8+h) on every token in head
    h: x_(8+h) = ln a gives it the attention a (a row that sums to 1), -1e4 (exp underflows to 0) for a = 0."""
    layer = Attention(11, heads=2, dim_head=4, output_num_tokens=k, always_sample=always_sample).double().eval()
    layer.norm = nn.Identity()
    weight = torch.zeros(24, 11, dtype=torch.float64)
    weight[0, 10] = weight[4, 10] = 2.                      # q: (qkv h d) rows 0 and 4 are each head's first channel
    weight[8, 8] = weight[12, 9] = 1.                       # k: rows 8 and 12
    weight[16:24, :8] = torch.eye(8)                        # v: rows 16 to 23
    layer.to_qkv.weight.data = weight
    return layer


def fixture_tokens():
    """The fixture's 3 images as fixture_layer's input (3, 13, 11), and the official sampler's kept tokens at K = 12."""
    tensors = load_fixture('ats_official_sampler')[2]
    attention, values = tensors['attention'][:, :, 0].double(), tensors['values'].double()   # (3, 2, 13), (3, 2, 13, 4)
    logits = attention.log().clamp_min(-1e4)
    x = torch.cat([rearrange(values, 'b h n d -> b n (h d)'), rearrange(logits, 'b h n -> b n h'),
                   torch.zeros(3, 13, 1, dtype=torch.float64)], dim=-1)
    x[:, 0, 10] = 1.                                        # the cls token asks
    return x, tensors['kept.12']


def test_at_the_official_budget_a_layer_that_always_samples_keeps_the_official_samplers_tokens():
    """The official budget, 197 tokens of 197 at 224 pixels, is K = every patch, and the official code samples then
    too. On the official sampler's fixture (tests/fixtures/make_ats_official_fixtures.py: 12 points over 12 patches,
    its `inverse_transform_sampling` at n_tokens = n_ref_tokens = 13, keeping 7, 7 and 2 of them), a layer with K = 12
    and always_sample=True, given the fixture's cls attention and values through its own projections, keeps the
    official sampler's tokens, in its order (ascending significance), the rest of its 12 slots empty."""
    x, official = fixture_tokens()
    assert [(row[1:] > 0).sum().item() for row in official] == [7, 7, 2]
    with torch.no_grad():
        _, kept, ids = fixture_layer(12, always_sample=True)(x)
    assert ids.shape == (3, 13) and (ids[:, 0] == 0).all() and kept[:, 0].all()
    ours = [[i for i, flag in zip(row[1:], flags[1:]) if flag] for row, flags in zip(ids.tolist(), kept.tolist())]
    assert ours == [[i for i in row[1:] if i > 0] for row in official.tolist()]


def test_the_deit_s_configuration_samples_at_its_default_budget_in_layers_3_to_11_only():
    """`ats_vit('DeiT-S')` at 224 pixels (196 patches, K = 196): layers 0 to 2 never sample, each of layers 3 to 11
    does (196 slots), and the official rule's duplicates leave fewer than 196 patches kept on a random image (random
    weights, narrowed to 24 wide to be quick)."""
    torch.manual_seed(0)
    model = ats_vit('DeiT-S', num_classes=0, dim=24, heads=2).eval()
    img = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    sampled = sampled_per_layer(model, img)
    assert sampled[:3] == [None] * 3
    assert all(ids.shape == (2, 197) for ids in sampled[3:])
    with torch.no_grad():
        _, ids = model(img, return_sampled_token_ids=True)
    assert ids.shape == (2, 196) and ((ids >= 0).sum(dim=1) < 196).all()


# vit-pytorch's checkpoints


def test_loads_vit_pytorchs_checkpoint_and_gives_its_output_where_no_layer_samples():
    config, state_dict, x, output = reference_case('vit_pytorch_1.26.14_ats_vit', 'image_size', 'max_tokens_per_depth')
    token_ids = load_fixture('vit_pytorch_1.26.14_ats_vit')[2]['token_ids']
    torch.manual_seed(1)
    model = load_vit_pytorch(ViT(**config), state_dict).eval()
    with torch.no_grad():
        logits, ids = model(x, return_sampled_token_ids=True)
    torch.testing.assert_close(logits, output, rtol=1e-5, atol=1e-5)
    assert torch.equal(ids, token_ids)


@pytest.mark.parametrize('schedule, always_sample', [((16, 8), False), ((None, 24), True), ((24, 24), True)])
def test_vit_pytorchs_checkpoint_is_refused_where_a_layer_samples(schedule, always_sample):
    # 24 patches: K = 16 samples by vit-pytorch's rule, K = 24 only under always_sample; vit-pytorch draws another
    # sample (Gumbel-max, random), so its weights would compute another function there
    config = dict(image_size=(32, 48), patch_size=8, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32)
    state_dict = ViT(**config, max_tokens_per_depth=(24, 24)).state_dict()
    model = ViT(**config, max_tokens_per_depth=schedule, always_sample=always_sample)
    with pytest.raises(ValueError, match="Gumbel-max.*inverse transform sample.*every entry at least 24"):
        load_vit_pytorch(model, state_dict)
    # where no layer samples the same weights load
    plain = load_vit_pytorch(ViT(**config, max_tokens_per_depth=(24, None)), state_dict)
    assert all(torch.equal(plain.state_dict()[key], value) for key, value in state_dict.items())


def test_dropping_the_empty_slots_would_change_the_next_sample():
    # why every sampling layer keeps K slots (docs/performance.md): the sampler's k = min(K, n - 1) and its min-max
    # normalisation read the slot count and whether a slot is empty, so the same real tokens with the empty slots
    # removed keep other tokens; padded to a batch's largest count, an image's sample would depend on its batch mates
    generator = torch.Generator().manual_seed(0)
    changed = 0
    for _ in range(200):
        attn, values = torch.rand(1, 2, 13, generator=generator), torch.randn(1, 2, 13, 4, generator=generator)
        empty = torch.zeros(13, dtype=torch.bool)
        empty[torch.randperm(12, generator=generator)[:3] + 1] = True
        attn = attn.masked_fill(empty, 0.)
        attn = attn / attn.sum(dim=-1, keepdim=True)
        ids, keep = AdaptiveTokenSampling(8)(attn, values)
        real = (~empty).nonzero().squeeze(1)
        compact_ids, compact_keep = AdaptiveTokenSampling(8)(attn[..., real], values[:, :, real])
        kept = set(ids[keep].tolist())
        assert not kept & set(empty.nonzero().squeeze(1).tolist())        # an empty slot is never kept
        changed += kept != set(real[compact_ids[compact_keep]].tolist())
    assert changed > 100


# clear errors


@pytest.mark.parametrize('value, error, words', [
    ((12, 6), ValueError, 'one entry per layer'),
    ((6, 12, 3), ValueError, 'must not increase'),
    ((12, 0, 0), ValueError, 'max_tokens_per_depth'),
    ((12, 6.5, 3), TypeError, 'max_tokens_per_depth'),
    (12, TypeError, 'max_tokens_per_depth'),
    ((None, 6, 12), ValueError, 'must not increase'),           # the None entries aside, 6 then 12
    ((12, None, 24), ValueError, 'must not increase'),
    ((None, 0, None), ValueError, 'max_tokens_per_depth'),
    ((None, 'x', None), TypeError, 'max_tokens_per_depth'),
])
def test_a_bad_max_tokens_per_depth_is_refused_by_name(value, error, words):
    with pytest.raises(error, match=words):
        ViT(**{**SMALL, 'max_tokens_per_depth': value})


@pytest.mark.parametrize('value', [1, 'yes', None])
def test_a_bad_always_sample_is_refused_by_name(value):
    with pytest.raises(TypeError, match=f'always_sample must be True or False, got {value!r}'):
        ViT(**SMALL, always_sample=value)


@pytest.mark.parametrize('variant, error, words', [
    ('DeiT-B', ValueError, r"variant must be one of \['DeiT-S'\], got 'DeiT-B'"),
    (('DeiT-S', 0), ValueError, 'max_tokens must be a positive int, got 0'),
    (('DeiT-S', 98.0), TypeError, 'max_tokens must be a positive int, got 98.0'),
])
def test_a_bad_configuration_is_refused_by_name(variant, error, words):
    with pytest.raises(error, match=words):
        ats_vit(*variant) if isinstance(variant, tuple) else ats_vit(variant)


# vit-pytorch 1.26.14's __main__ block / README example for this module, unchanged but for .cuda()

@pytest.mark.slow                  # the README's model: 1024 wide, 256 patches (3 s)
def test_vit_pytorchs_readme_example_runs():
    v = ViT(image_size=256, patch_size=16, num_classes=1000, dim=1024, depth=6,
            max_tokens_per_depth=(256, 128, 64, 32, 16, 8), heads=16, mlp_dim=2048, dropout=0.1, emb_dropout=0.1)
    img = torch.randn(4, 3, 256, 256)
    assert v(img).shape == (4, 1000)
    preds, token_ids = v(img, return_sampled_token_ids=True)
    assert preds.shape == (4, 1000) and token_ids.shape[0] == 4 and token_ids.shape[1] <= 8
