"""Masked patch prediction (the ViT paper, appendix B.1.2): corruption proportions, 3-bit mean-colour targets,
vit-pytorch's loss on a committed fixture, every model it takes, vit-pytorch's README example."""

import pytest
import torch
import torch.nn.functional as F

from helpers import digits_batch, load_fixture, tiny_vit_kwargs
from vit_pytorch import SimpleViT, ViT
from vit_pytorch.distill import DeiT
from vit_pytorch.mpp import MPP
from vit_pytorch.simple_vit_with_patch_dropout import SimpleViT as PatchDropoutViT
from vit_pytorch.simple_vit_with_register_tokens import SimpleViT as RegisterViT

# the encoders of the package beyond the plain ViT (test_conformance's WRAPPER_STEPS['mpp'] trains that one)
ENCODERS = {
    'vit_mean': lambda: ViT(**tiny_vit_kwargs(pool='mean')),
    'simple_vit': lambda: SimpleViT(**tiny_vit_kwargs()),
    'simple_vit_with_registers': lambda: RegisterViT(**tiny_vit_kwargs(num_register_tokens=2)),
    'distillable_vit': lambda: DeiT(**tiny_vit_kwargs()),
}
HEADS = ('transformer.mlp_head', 'transformer.linear_head', 'transformer.distill_head')


def tiny_mpp(model=None, **kwargs):
    return MPP(transformer=model or ViT(**tiny_vit_kwargs()), **kwargs)


def test_the_papers_corruption_half_the_patches_80_10_10():
    mpp = MPP.paper(ViT(**tiny_vit_kwargs()))
    patches = torch.randn(1000, 12, 32)
    corrupted, chosen = mpp.corrupt(patches)
    assert (chosen.sum(1) == 6).all()                                   # exactly half of each image
    assert torch.equal(corrupted[~chosen], patches[~chosen])            # the others are untouched
    by_mask = (corrupted == mpp.mask_token).all(-1)
    unchanged = (corrupted == patches).all(-1) & chosen
    by_random = chosen & ~by_mask & ~unchanged
    assert not (by_mask & ~chosen).any()
    fractions = torch.stack([by_mask.sum(), by_random.sum(), unchanged.sum()]) / chosen.sum()
    torch.testing.assert_close(fractions, torch.tensor([0.8, 0.1, 0.1]), atol=0.015, rtol=0)
    # a random replacement is some patch of the batch
    pool = patches.flatten(0, 1)
    replaced = corrupted[by_random][:50]
    assert all((pool == row).all(-1).any() for row in replaced)


def test_vit_pytorchs_argument_names_set_the_proportions():
    mpp = tiny_mpp(mask_prob=0.25, replace_prob=0.5, random_patch_prob=0.5)
    patches = torch.randn(2000, 12, 32)
    corrupted, chosen = mpp.corrupt(patches)
    assert (chosen.sum(1) == 3).all()
    by_mask = (corrupted == mpp.mask_token).all(-1)
    assert abs(by_mask.sum() / chosen.sum() - 0.5) < 0.02
    assert ((corrupted == patches).all(-1) & chosen).sum() / chosen.sum() < 0.01    # none left unchanged


def test_targets_are_the_3_bit_mean_colour_of_each_patch():
    mpp = tiny_mpp()                                                    # 4 x 8 patches of 3 channels
    img = torch.zeros(1, 3, 16, 24)
    img[:, 0, :4, :8], img[:, 1, :4, :8], img[:, 2, :4, :8] = 0.3, 0.7, 0.95         # patch 0: bins 2, 5, 7
    img[:, :, :4, 8:16] = torch.linspace(0, 1, 8)                                     # patch 1: mean 0.5 -> bin 3
    img[:, :, 12:, 16:] = 1.0                                                         # patch 11: the top bin
    target = mpp.target(img)
    assert target.shape == (1, 12)
    assert target[0, 0] == 2 + 5 * 8 + 7 * 64
    assert target[0, 1] == 3 + 3 * 8 + 3 * 64
    assert target[0, 11] == 511 and target[0, 2] == 0
    assert mpp.to_bits.out_features == 512


def test_targets_undo_the_normalisation_and_follow_max_pixel_val():
    img = torch.rand(2, 3, 16, 24)
    plain = tiny_mpp().target(img)
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    normalised = (img - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    assert torch.equal(tiny_mpp(mean=mean, std=std).target(normalised), plain)
    assert torch.equal(tiny_mpp(max_pixel_val=255.).target(img * 255), plain)


def test_loss_equals_vit_pytorchs_mpp_loss():
    metadata, _, reference = load_fixture('vit_pytorch_1.26.14_mpp_loss')
    mpp = tiny_mpp(ViT(**tiny_vit_kwargs(image_size=32, patch_size=8)))
    loss = mpp.loss(reference['predictions'], reference['input'], reference['mask'].bool())
    torch.testing.assert_close(loss, reference['loss'])


def test_only_the_chosen_patches_are_predicted():
    mpp = tiny_mpp()
    img = torch.rand(2, 3, 16, 24)
    logits = torch.randn(2, 12, 512, requires_grad=True)
    chosen = torch.rand(2, 12) < 0.5
    loss = mpp.loss(logits, img, chosen)
    torch.testing.assert_close(loss, F.cross_entropy(logits[chosen], mpp.target(img)[chosen]))
    loss.backward()
    assert logits.grad[~chosen].abs().max() == 0 and logits.grad[chosen].abs().max() > 0


@pytest.mark.parametrize('name', ENCODERS)
def test_trains_every_model_with_the_public_face(name):
    mpp = tiny_mpp(ENCODERS[name]())
    loss = mpp(torch.rand(2, 3, 16, 24))
    loss.backward()
    no_gradient = [key for key, p in mpp.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert torch.isfinite(loss) and all(key.startswith(HEADS) for key in no_gradient), no_gradient


def test_an_encoder_that_drops_patches_in_training_is_refused():
    with pytest.raises(ValueError, match='drop patches'):
        tiny_mpp(PatchDropoutViT(**tiny_vit_kwargs(patch_dropout=0.5)))(torch.rand(2, 3, 16, 24))


def test_pre_training_on_digits_lowers_the_loss():
    images, _ = digits_batch(64, size=16)
    model = ViT(image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, heads=2, dim_head=16, mlp_dim=64,
                channels=1, patch_norm=False)
    mpp = tiny_mpp(model)
    torch.manual_seed(1)
    with torch.no_grad():
        before = mpp(images).item()
    optimizer = torch.optim.AdamW(mpp.parameters(), lr=3e-3)
    for _ in range(40):
        loss = mpp(images)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.manual_seed(1)
    with torch.no_grad():
        assert mpp(images).item() < 0.6 * before


@pytest.mark.slow
def test_compiles_without_graph_breaks():
    mpp = tiny_mpp().eval()
    img = torch.rand(2, 3, 16, 24)
    compiled = torch.compile(mpp, fullgraph=True, backend='eager')
    assert torch.isfinite(compiled(img))


def test_vit_pytorchs_readme_example_runs_one_step():
    # as written, at 64 pixels instead of 256 (one step at 256 takes 7 s on two cores)
    model = ViT(image_size=64, patch_size=32, num_classes=1000, dim=1024, depth=6, heads=8, mlp_dim=2048,
                dropout=0.1, emb_dropout=0.1)
    mpp_trainer = MPP(transformer=model, patch_size=32, dim=1024, mask_prob=0.15, random_patch_prob=0.30,
                      replace_prob=0.50)
    opt = torch.optim.Adam(mpp_trainer.parameters(), lr=3e-4)

    def sample_unlabelled_images():
        return torch.FloatTensor(20, 3, 64, 64).uniform_(0., 1.)

    for _ in range(1):
        images = sample_unlabelled_images()
        loss = mpp_trainer(images)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(mask_prob=0.), ValueError, 'mask_prob'),
    (dict(replace_prob=0.9, random_patch_prob=0.2), ValueError, r'replace_prob \+ random_patch_prob'),
    (dict(patch_size=16), ValueError, "patch_size=16 disagrees with the transformer's"),
    (dict(dim=64), ValueError, 'dim=64 disagrees'),
    (dict(channels=1), ValueError, 'channels=1 disagrees'),
    (dict(output_channel_bits=6), ValueError, '2\\*\\*18 classes'),
    (dict(mean=[0.5, 0.5, 0.5]), ValueError, 'mean and std go together'),
    (dict(mean=[0.5], std=[0.2]), ValueError, 'one value per channel'),
    (dict(max_pixel_val=0), ValueError, 'max_pixel_val'),
])
def test_bad_arguments_are_refused_with_their_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        tiny_mpp(**kwargs)


def test_a_model_without_the_public_face_is_refused():
    with pytest.raises(TypeError, match='transformer must be a ViT or SimpleViT.*patch_tokens'):
        MPP(transformer=torch.nn.Linear(2, 2))
