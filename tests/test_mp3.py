"""MP3: the loss is the cross-entropy over positions, masked patches are left out of the keys only, no position is
given, a ViT learns positions; vit-pytorch's ViT loads; its README example runs."""

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from helpers import digits_batch, load_fixture, tiny_vit_kwargs
from vit_pytorch import SimpleViT
from vit_pytorch import ViT as CoreViT
from vit_pytorch.mp3 import MP3, ViT
from vit_pytorch.pretrained import load_vit_pytorch


def tiny_mp3(masking_ratio=0.5, **overrides):
    torch.manual_seed(0)
    return MP3(ViT(**tiny_vit_kwargs(**overrides)), masking_ratio)


def noise(batch=2, patches=12, seed=1):
    return torch.rand(batch, patches, generator=torch.Generator().manual_seed(seed))


def test_the_loss_is_the_mean_cross_entropy_of_every_patch_over_the_positions():
    mp3, img, fixed = tiny_mp3(), torch.randn(2, 3, 16, 24), noise()
    logits, _ = mp3.logits(img, noise=fixed)
    log_probs = logits.double().log_softmax(dim=-1)                        # (b, n, n)
    expected = -sum(log_probs[b, i, i] for b in range(2) for i in range(12)) / 24
    torch.testing.assert_close(mp3(img, noise=fixed).double(), expected, rtol=1e-5, atol=0)


def test_the_context_is_the_patches_of_lowest_noise_and_the_rest_is_masked():
    mp3 = tiny_mp3(masking_ratio=0.75)
    fixed = noise()
    context = mp3.context_mask(2, 12, device='cpu', noise=fixed)
    assert context.sum(dim=1).tolist() == [12 - int(12 * 0.75)] * 2
    assert torch.equal(context, fixed <= fixed.sort(dim=1).values[:, 2:3])


def patch_cells(index, grid=(4, 3), patch=(4, 8)):
    row, col = divmod(index, grid[1])
    return slice(row * patch[0], (row + 1) * patch[0]), slice(col * patch[1], (col + 1) * patch[1])


def test_a_masked_patch_is_no_key_changing_it_changes_only_its_own_prediction():
    mp3, img, fixed = tiny_mp3().eval(), torch.randn(1, 3, 16, 24), noise(batch=1)
    with torch.no_grad():
        logits, context = mp3.logits(img, noise=fixed)
        masked, kept = (~context[0]).nonzero()[0].item(), context[0].nonzero()[0].item()
        for changed_patch, others_change in ((masked, False), (kept, True)):
            changed = img.clone()
            # random pixels: the patch embedding's LayerNorm would undo a constant shift
            changed[..., patch_cells(changed_patch)[0], patch_cells(changed_patch)[1]] = torch.randn(1, 3, 4, 8)
            new_logits, _ = mp3.logits(changed, noise=fixed)
            others = [i for i in range(12) if i != changed_patch]
            assert not torch.allclose(new_logits[0, changed_patch], logits[0, changed_patch])
            assert torch.allclose(new_logits[0, others], logits[0, others], atol=1e-6) != others_change


def test_no_position_is_given_shuffling_the_patches_shuffles_the_predictions():
    """Without position embeddings the encoder is permutation-equivariant: the patch at a new place (with its
    noise) gets the prediction it had at the old one, so only its content can tell where it came from."""
    mp3, img, fixed = tiny_mp3().eval(), torch.randn(1, 3, 16, 24), noise(batch=1)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(3))
    shuffled = torch.empty_like(img)
    for new, old in enumerate(order.tolist()):
        shuffled[..., patch_cells(new)[0], patch_cells(new)[1]] = img[..., patch_cells(old)[0], patch_cells(old)[1]]
    with torch.no_grad():
        logits, _ = mp3.logits(img, noise=fixed)
        shuffled_logits, _ = mp3.logits(shuffled, noise=fixed[:, order])
    torch.testing.assert_close(shuffled_logits[0], logits[0, order], rtol=1e-5, atol=1e-5)


def masked_self_attention_encoder(transformer, x, context):
    """The paper's masked self-attention written out: in each layer the queries are all tokens and the keys and
    values that layer's tokens, a masked patch's key getting a logit of -inf (vit-pytorch reuses the first layer's
    input as keys and values)."""
    for attn, ff in transformer.layers:
        q, k, v = rearrange(attn.to_qkv(attn.norm(x)), 'b n (qkv h d) -> qkv b h n d', qkv=3, h=attn.heads)
        logits = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~context[:, None, None, :], float('-inf'))
        x = attn.to_out(rearrange(logits.softmax(dim=-1) @ v, 'b h n d -> b n (h d)')) + x
        x = ff(x) + x
    return transformer.norm(x)


@pytest.mark.parametrize('model, kwargs', [(ViT, {}), (CoreViT, dict(qkv_bias=True)), (SimpleViT, {})],
                         ids=['mp3_vit', 'vit_qkv_bias', 'simple_vit'])
def test_every_layer_attends_from_all_patches_to_its_own_tokens_of_the_context_patches(model, kwargs):
    """Outputs and gradients (of every parameter and the image) are the masked self-attention's to float64 rounding,
    the context being the 6 patches of lowest noise."""
    torch.manual_seed(0)
    mp3 = MP3(model(**tiny_vit_kwargs(**kwargs)), 0.5).double()
    img, fixed = torch.randn(2, 3, 16, 24, dtype=torch.float64, requires_grad=True), noise().double()
    context = fixed <= fixed.sort(dim=1).values[:, 5:6]
    inputs = [img, *mp3.parameters()]
    logits, _ = mp3.logits(img, noise=fixed)
    expected = mp3.mlp_head(masked_self_attention_encoder(mp3.vit.transformer, mp3.vit.patch_tokens(img), context))
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    gradients = torch.autograd.grad((logits * weights).sum(), inputs, allow_unused=True)   # the ViT's own head: none
    expected_gradients = torch.autograd.grad((expected * weights).sum(), inputs, allow_unused=True)
    assert [g is None for g in gradients] == [g is None for g in expected_gradients]
    for gradient, expected_gradient in zip(gradients, expected_gradients):
        if gradient is not None:
            torch.testing.assert_close(gradient, expected_gradient, rtol=0, atol=1e-12)


def test_a_tiny_vit_learns_where_the_patches_of_digits_come_from():
    """48 real digits (16x16, patches of 4: 16 positions), 100 steps of AdamW: on 16 digits it has not seen the model
    places the patches far above chance (1 in 16; measured 0.28, untrained 0.07; blank border patches cannot be
    told apart)."""
    digits, _ = digits_batch(64, size=16)
    train, test = digits[:48], digits[48:]
    torch.manual_seed(0)
    mp3 = MP3(ViT(num_classes=10, image_size=16, patch_size=4, channels=1, dim=32, depth=2, heads=4, dim_head=8,
                  mlp_dim=64), masking_ratio=0.5)
    optimizer = torch.optim.AdamW(mp3.parameters(), lr=3e-3)
    for _ in range(100):
        loss = mp3(train)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        logits, _ = mp3.eval().logits(test)
    accuracy = (logits.argmax(dim=-1) == torch.arange(16)).float().mean().item()
    assert accuracy > 0.15, accuracy


@pytest.mark.parametrize('model', [CoreViT, SimpleViT], ids=['vit', 'simple_vit'])
def test_it_trains_the_core_vits_through_their_public_face(model):
    mp3 = MP3(model(**tiny_vit_kwargs()), 0.5)
    loss = mp3(torch.randn(2, 3, 16, 24))
    loss.backward()
    assert torch.isfinite(loss) and mp3.vit.to_patch_embedding[2].weight.grad.abs().sum() > 0


# vit-pytorch 1.26.14 (tests/fixtures/make_relpos_decorr_mp3_fixtures.py)


def test_vit_pytorchs_mp3_vit_loads_and_gives_its_output():
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_mp3_vit')
    model = load_vit_pytorch(ViT(**dict(metadata['config'], image_size=tuple(metadata['config']['image_size']))),
                             state_dict).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input']), tensors['output'], rtol=1e-4, atol=1e-5)


@pytest.mark.slow            # vit-pytorch's sizes: 1024 patches of width 1024, 6 layers (352 s on the shared 2 cores)
def test_vit_pytorchs_readme_example_runs_unchanged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    v = ViT(
        num_classes = 1000,
        image_size = 256,
        patch_size = 8,
        dim = 1024,
        depth = 6,
        heads = 8,
        mlp_dim = 2048,
        dropout = 0.1,
    )

    mp3 = MP3(
        vit = v,
        masking_ratio = 0.75
    )

    images = torch.randn(8, 3, 256, 256)

    loss = mp3(images)
    loss.backward()

    torch.save(v.state_dict(), './trained-vit.pt')
    assert (tmp_path / 'trained-vit.pt').exists() and loss.ndim == 0


# clear errors


@pytest.mark.parametrize('ratio', [0, 1.])        # NaN and a string: test_arguments, for every wrapper
def test_a_masking_ratio_outside_0_1_is_refused_by_name(ratio):
    with pytest.raises(ValueError, match='masking_ratio'):
        MP3(ViT(**tiny_vit_kwargs()), ratio)


def test_a_model_without_the_public_face_is_refused():
    with pytest.raises(TypeError, match='has no patch_tokens'):
        MP3(torch.nn.Linear(3, 3), 0.5)


def test_images_of_another_size_than_the_positions_are_refused():
    with pytest.raises(ValueError, match=r'img must be \(16, 24\)'):
        tiny_mp3()(torch.randn(2, 3, 16, 16))


def test_cross_entropy_reference_is_torchs():
    """The explicit loss above agrees with torch's cross-entropy on the same logits (a check of the test itself)."""
    logits = torch.randn(2, 12, 12)
    explicit = -sum(logits[b].log_softmax(-1)[i, i] for b in range(2) for i in range(12)) / 24
    torch.testing.assert_close(F.cross_entropy(logits.reshape(24, 12), torch.arange(12).repeat(2)), explicit)
