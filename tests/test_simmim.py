"""SimMIM (arXiv 2111.09886): what defines it, Hugging Face's outputs, every encoder it takes, vit-pytorch's example."""

import pytest
import torch
from einops import rearrange

from helpers import digits_batch, load_fixture, tiny_vit_kwargs
from vit_pytorch import SimpleViT, ViT
from vit_pytorch.deepvit import DeepViT
from vit_pytorch.distill import DeiT
from vit_pytorch.parallel_vit import ViT as ParallelViT
from vit_pytorch.pretrained import load_hf
from vit_pytorch.simmim import SimMIM
from vit_pytorch.simple_vit_with_patch_dropout import SimpleViT as PatchDropoutViT
from vit_pytorch.simple_vit_with_qk_norm import SimpleViT as QKNormViT
from vit_pytorch.simple_vit_with_register_tokens import SimpleViT as RegisterViT

# the encoders of the package beyond the plain ViT (test_conformance's WRAPPER_STEPS['simmim'] trains that one)
ENCODERS = {
    'vit_mean': lambda: ViT(**tiny_vit_kwargs(pool='mean')),
    'simple_vit': lambda: SimpleViT(**tiny_vit_kwargs()),
    'simple_vit_with_registers': lambda: RegisterViT(**tiny_vit_kwargs(num_register_tokens=2)),
    'simple_vit_with_qk_norm': lambda: QKNormViT(**tiny_vit_kwargs()),
    'distillable_vit': lambda: DeiT(**tiny_vit_kwargs()),
    'deepvit': lambda: DeepViT(**tiny_vit_kwargs()),
    'parallel_vit': lambda: ParallelViT(**tiny_vit_kwargs()),
}
HEADS = ('encoder.mlp_head', 'encoder.linear_head', 'encoder.distill_head')


def tiny_simmim(encoder=None, **kwargs):
    return SimMIM(encoder=encoder or ViT(**tiny_vit_kwargs()), **kwargs)


def simmim_from_hugging_face():
    metadata, state_dict, tensors = load_fixture('hf_simmim')
    config = metadata['config']
    width, heads, patch = config['hidden_size'], config['num_attention_heads'], config['patch_size']
    encoder = ViT(image_size=config['image_size'], patch_size=patch, num_classes=0, dim=width,
                  depth=config['num_hidden_layers'], heads=heads, dim_head=width // heads,
                  mlp_dim=config['intermediate_size'], patch_norm=False, qkv_bias=config['qkv_bias'],
                  norm_eps=config['layer_norm_eps'])
    load_hf(encoder, {key: value for key, value in state_dict.items()
                      if key.startswith('vit.') and key != 'vit.embeddings.mask_token'})
    mim = SimMIM(encoder=encoder).eval()
    # HF's 1x1 convolution gives channels (c, p1, p2) to the pixel shuffle; our linear head gives (p1, p2, c)
    conv = state_dict['decoder.0.weight'][..., 0, 0]
    with torch.no_grad():
        mim.mask_token.copy_(state_dict['vit.embeddings.mask_token'].flatten())
        mim.to_pixels.weight.copy_(rearrange(conv, '(c p1 p2) d -> (p1 p2 c) d', p1=patch, p2=patch))
        mim.to_pixels.bias.copy_(rearrange(state_dict['decoder.0.bias'], '(c p1 p2) -> (p1 p2 c)', p1=patch,
                                           p2=patch))
    return mim, tensors


def test_reconstruction_and_loss_equal_hugging_faces_masked_image_modeling():
    mim, reference = simmim_from_hugging_face()
    mask = reference['bool_masked_pos'].bool()
    with torch.no_grad():
        prediction, _ = mim.predict(reference['input'], mask=mask)
        loss = mim(reference['input'], mask=mask)
    reconstruction = rearrange(prediction, 'b (h w) (p1 p2 c) -> b c (h p1) (w p2)', h=4, p1=4, p2=4)
    torch.testing.assert_close(reconstruction, reference['reconstruction'], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(loss, reference['loss'], atol=1e-6, rtol=1e-5)


# what defines SimMIM


def test_hidden_patches_enter_the_encoder_as_the_mask_token_at_their_own_position():
    mim = tiny_simmim().eval()
    img = torch.randn(2, 3, 16, 24)
    mask = torch.rand(2, 12) < 0.5
    seen = []
    mim.encoder.transformer.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    mim.predict(img, mask=mask)
    patches = mim.encoder.patch_tokens(img)
    expected = mim.encoder.embed_tokens(torch.where(mask[..., None], mim.mask_token, patches), (4, 3))
    assert seen[0].shape == (2, 1 + 12, 32)                         # every position, the cls token first
    torch.testing.assert_close(seen[0], expected)
    # the hidden pixels themselves change nothing
    pixels = rearrange(mask, 'b (h w) -> b 1 h w', h=4).repeat_interleave(4, 2).repeat_interleave(8, 3)
    changed = torch.where(pixels, torch.randn_like(img), img)
    torch.testing.assert_close(mim.predict(changed, mask=mask)[0], mim.predict(img, mask=mask)[0], atol=0, rtol=0)


def test_the_loss_is_the_l1_error_of_hidden_pixels_only():
    mim = tiny_simmim()
    img, mask = torch.randn(2, 3, 16, 24), torch.rand(2, 12) < 0.5
    prediction, _ = mim.predict(img, mask=mask)
    prediction.retain_grad()
    loss = mim.loss(prediction, img, mask)
    pixels = rearrange(img, 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=4, p2=8)
    torch.testing.assert_close(loss, (prediction[mask] - pixels[mask]).abs().mean())
    loss.backward()
    assert prediction.grad[~mask].abs().max() == 0 and prediction.grad[mask].abs().max() > 0


def test_half_the_patches_are_hidden_at_random_per_image():
    mask = tiny_simmim().random_mask(500, 12, device='cpu')
    assert (mask.sum(1) == 6).all() and len({tuple(row.tolist()) for row in mask}) > 150
    assert (mask.float().mean(0) - 0.5).abs().max() < 0.1


def test_the_prediction_head_is_one_linear_layer_per_token():
    mim = tiny_simmim()
    assert isinstance(mim.to_pixels, torch.nn.Linear) and mim.to_pixels.out_features == 3 * 4 * 8


@pytest.mark.parametrize('name', ENCODERS)
def test_trains_every_encoder_with_the_public_face(name):
    mim = tiny_simmim(ENCODERS[name]())
    loss = mim(torch.randn(2, 3, 16, 24))
    loss.backward()
    no_gradient = [key for key, p in mim.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert torch.isfinite(loss) and all(key.startswith(HEADS) for key in no_gradient), no_gradient


def test_an_encoder_that_drops_patches_in_training_is_refused():
    with pytest.raises(ValueError, match='drop patches'):
        tiny_simmim(PatchDropoutViT(**tiny_vit_kwargs(patch_dropout=0.5)))(torch.randn(2, 3, 16, 24))


def test_pre_training_on_digits_lowers_the_reconstruction_error():
    images, _ = digits_batch(64, size=16)
    encoder = ViT(image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, heads=2, dim_head=16, mlp_dim=64,
                  channels=1, patch_norm=False)
    mim = tiny_simmim(encoder)
    mask = mim.random_mask(64, 16, device='cpu')
    with torch.no_grad():
        before = mim(images, mask=mask).item()
    optimizer = torch.optim.AdamW(mim.parameters(), lr=3e-3)
    for _ in range(40):
        loss = mim(images)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        assert mim(images, mask=mask).item() < 0.6 * before


@pytest.mark.slow
def test_compiles_without_graph_breaks():
    mim = tiny_simmim().eval()
    img, mask = torch.randn(2, 3, 16, 24), torch.rand(2, 12) < 0.5
    compiled = torch.compile(mim, fullgraph=True, backend='eager')
    torch.testing.assert_close(compiled(img, mask=mask), mim(img, mask=mask))


def test_vit_pytorchs_readme_example_runs():
    v = ViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=8, mlp_dim=2048)
    mim = SimMIM(encoder=v, masking_ratio=0.5)
    images = torch.randn(8, 3, 256, 256)
    loss = mim(images)
    loss.backward()
    assert torch.isfinite(loss) and v.transformer.layers[0][0].to_qkv.weight.grad is not None


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(masking_ratio=0.), ValueError, 'masking_ratio'),
])
def test_bad_arguments_are_refused_with_their_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        tiny_simmim(**kwargs)


def test_a_model_without_the_public_face_and_a_bad_mask_are_refused():
    with pytest.raises(TypeError, match='encoder must be a ViT or SimpleViT.*patch_tokens'):
        SimMIM(encoder=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r'mask must be a bool tensor of shape \(batch, patches\) = \(2, 12\)'):
        tiny_simmim()(torch.randn(2, 3, 16, 24), mask=torch.ones(2, 12))
