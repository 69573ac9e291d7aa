"""MAE (arXiv 2111.06377): what defines it, Hugging Face's outputs, every encoder it takes, vit-pytorch's example."""

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from helpers import digits_batch, load_fixture, tiny_vit_kwargs
from vit_pytorch import SimpleViT, ViT, vit
from vit_pytorch.deepvit import DeepViT
from vit_pytorch.distill import DeiT
from vit_pytorch.mae import MAE, decoder_table, sincos_2d
from vit_pytorch.parallel_vit import ViT as ParallelViT
from vit_pytorch.pretrained import load_hf
from vit_pytorch.simple_vit_with_patch_dropout import SimpleViT as PatchDropoutViT
from vit_pytorch.simple_vit_with_qk_norm import SimpleViT as QKNormViT
from vit_pytorch.simple_vit_with_register_tokens import SimpleViT as RegisterViT

# the encoders of the package beyond the plain ViT (test_conformance's WRAPPER_STEPS['mae'] trains that one)
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


def tiny_mae(encoder=None, **overrides):
    kwargs = dict(decoder_dim=16, decoder_depth=1, decoder_heads=2, decoder_dim_head=8)
    return MAE(encoder=encoder or ViT(**tiny_vit_kwargs()), **{**kwargs, **overrides})


# Hugging Face's ViTMAEForPreTraining on a committed fixture (tests/fixtures/make_ssl_fixtures.py)


def mae_from_hugging_face():
    metadata, state_dict, tensors = load_fixture('hf_mae')
    config = metadata['config']
    width, heads = config['hidden_size'], config['num_attention_heads']
    encoder = ViT(image_size=config['image_size'], patch_size=config['patch_size'], num_classes=0, dim=width,
                  depth=config['num_hidden_layers'], heads=heads, dim_head=width // heads,
                  mlp_dim=config['intermediate_size'], patch_norm=False, qkv_bias=True,
                  norm_eps=config['layer_norm_eps'])
    load_hf(encoder, {key: value for key, value in state_dict.items() if key.startswith('vit.')})

    dd, dh, depth = config['decoder_hidden_size'], config['decoder_num_attention_heads'], \
        config['decoder_num_hidden_layers']
    mae = MAE(encoder=encoder, decoder_dim=dd, decoder_depth=depth, decoder_heads=dh, decoder_dim_head=dd // dh,
              masking_ratio=config['mask_ratio'])
    # the paper's decoder blocks (qkv bias, HF's epsilon), as the docstring says to build them
    mae.decoder = vit.Transformer(dd, depth, dh, dd // dh, config['decoder_intermediate_size'], qkv_bias=True,
                              norm_eps=config['layer_norm_eps'])
    ours = {'enc_to_dec.weight': state_dict['decoder.decoder_embed.weight'],
            'enc_to_dec.bias': state_dict['decoder.decoder_embed.bias'],
            'mask_token': state_dict['decoder.mask_token'].flatten(),
            'decoder.norm.weight': state_dict['decoder.decoder_norm.weight'],
            'decoder.norm.bias': state_dict['decoder.decoder_norm.bias'],
            'to_pixels.weight': state_dict['decoder.decoder_pred.weight'],
            'to_pixels.bias': state_dict['decoder.decoder_pred.bias']}
    for i in range(depth):
        theirs = f'decoder.decoder_layers.{i}.'
        for kind in ('weight', 'bias'):
            ours[f'decoder.layers.{i}.0.to_qkv.{kind}'] = torch.cat(
                [state_dict[f'{theirs}attention.{name}_proj.{kind}'] for name in 'qkv'])
            for our_name, their_name in [('0.norm', 'layernorm_before'), ('0.to_out.0', 'attention.o_proj'),
                                         ('1.net.0', 'layernorm_after'), ('1.net.1', 'mlp.fc1'),
                                         ('1.net.4', 'mlp.fc2')]:
                ours[f'decoder.layers.{i}.{our_name}.{kind}'] = state_dict[f'{theirs}{their_name}.{kind}']
    missing, unexpected = mae.load_state_dict(ours, strict=False)
    assert unexpected == [] and all(key.startswith('encoder.') for key in missing)
    return mae.eval(), tensors


def test_decoder_positions_are_hugging_faces_fixed_table():
    mae, _ = mae_from_hugging_face()
    state_dict = load_fixture('hf_mae')[1]
    theirs = state_dict['decoder.decoder_pos_embed'][0]                                  # (1 + 16, 24)
    assert theirs[1:].abs().amax(dim=1).min() > 0                                        # filled, not zeros
    torch.testing.assert_close(mae.decoder_pos_embedding, theirs, atol=1e-6, rtol=0)
    # the paper's encoder uses the same function: HF's encoder table at width 32
    torch.testing.assert_close(sincos_2d(4, 4, 32), state_dict['vit.embeddings.position_embeddings'][0, 1:],
                               atol=1e-6, rtol=0)


def test_predictions_mask_and_loss_equal_hugging_faces_vit_mae():
    mae, reference = mae_from_hugging_face()
    with torch.no_grad():
        prediction, mask = mae.predict(reference['input'], noise=reference['noise'])
        loss = mae(reference['input'], noise=reference['noise'])
    assert torch.equal(mask.float(), reference['mask'])
    torch.testing.assert_close(prediction, reference['logits'], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(loss, reference['loss'], atol=1e-6, rtol=1e-5)


def test_per_patch_normalised_loss_equals_hugging_faces():
    mae, reference = mae_from_hugging_face()
    mae.norm_pix_loss = True
    with torch.no_grad():
        loss = mae(reference['input'], noise=reference['noise'])
    torch.testing.assert_close(loss, reference['loss_norm_pix'], atol=1e-6, rtol=1e-5)


# what defines MAE


def test_decoder_positions_are_the_papers_sin_cos_formula():
    height, width, dim = 2, 3, 8                          # frequencies 10000 ** -(i / 2), i = 0, 1
    frequencies = [10000 ** -(i / (dim / 4)) for i in range(dim // 4)]
    rows = []
    for y in range(height):
        for x in range(width):
            rows.append([math.sin(x * w) for w in frequencies] + [math.cos(x * w) for w in frequencies]
                        + [math.sin(y * w) for w in frequencies] + [math.cos(y * w) for w in frequencies])
    torch.testing.assert_close(sincos_2d(height, width, dim), torch.tensor(rows), atol=1e-6, rtol=0)
    table = decoder_table(2, (height, width), dim)
    assert table.shape == (2 + 6, 8) and table[:2].abs().max() == 0
    torch.testing.assert_close(table[2:], torch.tensor(rows), atol=1e-6, rtol=0)


def test_the_encoder_never_sees_a_hidden_patch():
    mae = tiny_mae().eval()
    img, noise = torch.randn(2, 3, 16, 24), torch.rand(2, 12)
    lengths = []
    mae.encoder.transformer.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[1]))
    prediction, mask = mae.predict(img, noise=noise)
    assert lengths == [1 + 3]                       # the cls token and int(12 * 0.25) visible patches
    # new pixels in every hidden patch change nothing the model computes
    patches = mae.patchify(img)
    changed = mae.unpatchify(torch.where(mask[..., None], torch.randn_like(patches), patches), (4, 3))
    assert not torch.equal(changed, img)
    torch.testing.assert_close(mae.predict(changed, noise=noise)[0], prediction, atol=0, rtol=0)


def test_the_loss_is_the_squared_error_of_hidden_patches_only():
    mae = tiny_mae()
    img, noise = torch.randn(2, 3, 16, 24), torch.rand(2, 12)
    prediction, mask = mae.predict(img, noise=noise)
    prediction.retain_grad()
    loss = mae.loss(prediction, mae.target(img), mask)
    target = rearrange(img, 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=4, p2=8)
    torch.testing.assert_close(loss, F.mse_loss(prediction[mask], target[mask]))
    loss.backward()
    assert prediction.grad[~mask].abs().max() == 0 and prediction.grad[mask].abs().max() > 0
    # anything predicted for a visible patch leaves the loss as it is
    moved = torch.where(mask[..., None], prediction, prediction + 10)
    torch.testing.assert_close(mae.loss(moved, mae.target(img), mask), loss)


def test_normalised_targets_are_each_patch_standardised():
    mae = tiny_mae(norm_pix_loss=True)
    img = torch.rand(2, 3, 16, 24)
    target = mae.target(img)                                          # (2, 12, 96)
    patches = rearrange(img, 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=4, p2=8)
    expected = (patches - patches.mean(-1, keepdim=True)) / torch.sqrt(patches.var(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(target, expected)
    torch.testing.assert_close(target.mean(-1), torch.zeros(2, 12), atol=1e-5, rtol=0)
    # a patch's brightness and contrast do not change its target
    torch.testing.assert_close(mae.target(3 * img + 1), target, atol=1e-4, rtol=1e-4)


def test_three_quarters_of_the_patches_are_hidden_at_random_per_image():
    mae = tiny_mae()
    visible, mask = mae.random_mask(500, 12, device='cpu')
    assert (mask.sum(1) == 9).all() and visible.shape == (500, 3)
    assert (mask.float().std(0) > 0).all() and len({tuple(row.tolist()) for row in mask}) > 150
    assert (mask.float().mean(0) - 0.75).abs().max() < 0.1          # no position is favoured


def test_reconstruction_shows_the_input_where_visible_and_the_prediction_where_hidden():
    mae = tiny_mae(norm_pix_loss=True).eval()
    img, noise = torch.rand(2, 3, 16, 24), torch.rand(2, 12)
    masked, reconstruction = mae.reconstruct(img, noise=noise)
    mask = mae.random_mask(2, 12, device='cpu', noise=noise)[1]
    pixels = mae.unpatchify(mask[..., None].float().expand(-1, -1, 96), (4, 3)).bool()   # hidden pixels
    assert torch.equal(masked[~pixels], img[~pixels]) and masked[pixels].abs().max() == 0
    assert torch.equal(reconstruction[~pixels], img[~pixels])
    assert not torch.allclose(reconstruction[pixels], img[pixels])


# every encoder with the public face


@pytest.mark.parametrize('name', ENCODERS)
def test_trains_every_encoder_with_the_public_face(name):
    mae = tiny_mae(ENCODERS[name]())
    loss = mae(torch.randn(2, 3, 16, 24))
    loss.backward()
    assert torch.isfinite(loss)
    no_gradient = [key for key, p in mae.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert all(key.startswith(HEADS) for key in no_gradient), no_gradient      # only the classifier rests


def test_prefix_tokens_go_through_encoder_and_decoder():
    mae = tiny_mae(RegisterViT(**tiny_vit_kwargs(num_register_tokens=2)))
    mae(torch.randn(2, 3, 16, 24)).backward()
    assert mae.encoder.register_tokens.grad.abs().sum() > 0
    assert mae.decoder_pos_embedding.shape == (2 + 12, 16) and mae.decoder_pos_embedding[:2].abs().max() == 0


def test_other_image_sizes_get_their_own_decoder_positions():
    mae = tiny_mae(SimpleViT(**tiny_vit_kwargs()))
    prediction, mask = mae.predict(torch.randn(2, 3, 24, 32))          # a 6 x 4 grid
    assert prediction.shape == (2, 24, 96) and mask.sum(1).tolist() == [18, 18]


def test_an_encoder_that_drops_patches_in_training_is_refused():
    mae = tiny_mae(PatchDropoutViT(**tiny_vit_kwargs(patch_dropout=0.5)))
    with pytest.raises(ValueError, match='drop patches'):
        mae(torch.randn(2, 3, 16, 24))
    mae.eval()
    assert torch.isfinite(mae(torch.randn(2, 3, 16, 24)))


def test_pre_training_on_digits_lowers_the_reconstruction_error():
    images, _ = digits_batch(64, size=16)
    encoder = ViT(image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, heads=2, dim_head=16, mlp_dim=64,
                  channels=1, patch_norm=False)
    mae = tiny_mae(encoder, decoder_dim=32, decoder_dim_head=16)
    noise = torch.rand(64, 16)
    with torch.no_grad():
        before = mae(images, noise=noise).item()
    optimizer = torch.optim.AdamW(mae.parameters(), lr=3e-3)
    for _ in range(40):
        loss = mae(images)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        assert mae(images, noise=noise).item() < 0.5 * before


@pytest.mark.slow
def test_compiles_without_graph_breaks():
    mae = tiny_mae().eval()
    img, noise = torch.randn(2, 3, 16, 24), torch.rand(2, 12)
    compiled = torch.compile(mae, fullgraph=True, backend='eager')
    torch.testing.assert_close(compiled(img, noise=noise), mae(img, noise=noise))


# vit-pytorch's README example, with our classes (one step, as written)


def test_vit_pytorchs_readme_example_runs():
    from vit_pytorch import MAE, ViT

    v = ViT(image_size=256, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=8, mlp_dim=2048)
    mae = MAE(encoder=v, masking_ratio=0.75, decoder_dim=512, decoder_depth=6)
    images = torch.randn(8, 3, 256, 256)
    loss = mae(images)
    loss.backward()
    assert torch.isfinite(loss) and v.transformer.layers[0][0].to_qkv.weight.grad is not None


# clear errors


@pytest.mark.parametrize('overrides, error, match', [
    (dict(masking_ratio=0.), ValueError, 'masking_ratio'),
    (dict(decoder_dim=18), ValueError, 'decoder_dim'),
    (dict(norm_pix_loss=1), TypeError, 'norm_pix_loss'),
])
def test_bad_arguments_are_refused_with_their_name(overrides, error, match):
    with pytest.raises(error, match=match):
        tiny_mae(**overrides)


def test_a_model_without_the_public_face_is_refused():
    with pytest.raises(TypeError, match='encoder must be a ViT or SimpleViT.*patch_tokens'):
        MAE(encoder=torch.nn.Linear(2, 2), decoder_dim=16)


def test_bad_noise_and_too_few_patches_are_refused():
    with pytest.raises(ValueError, match=r'noise must have shape \(batch, patches\) = \(2, 12\)'):
        tiny_mae()(torch.randn(2, 3, 16, 24), noise=torch.rand(2, 10))
    mae = tiny_mae(ViT(**tiny_vit_kwargs(image_size=8, patch_size=4)), masking_ratio=0.8)
    with pytest.raises(ValueError, match='hides all 4 patches'):
        mae(torch.randn(2, 3, 8, 8))
