"""The SigLIP VAT (vit_pytorch.vat_siglip): a SigLIP file the user has loads into the tower with SigLIP's states,
and vit-pytorch's SigLIP VAT checkpoints load with its outputs."""

import pytest
import torch

from helpers import FIXTURES, count, load_fixture
from vit_pytorch.pretrained import CheckpointError, load_vit_pytorch
from vit_pytorch.vat import representation_trajectory
from vit_pytorch.vat_siglip import SigLIPVAT

# the tower of hf_siglip_vision.safetensors (transformers' SiglipVisionModel, 2 layers of width 16)
SMALL = dict(dim=16, depth=3, heads=2, dim_head=8, dim_action=2, mlp_dim=32, action_chunk_len=3,
             vit_layer_indices=(0, 1, 2), siglip_image_size=16, siglip_patch_size=8, siglip_dim=16, siglip_depth=2,
             siglip_heads=2, siglip_mlp_dim=24)


def test_a_siglip_file_gives_the_tower_siglips_hidden_states_as_its_trajectory():
    _, _, reference = load_fixture('hf_siglip_vision_reference')
    torch.manual_seed(0)
    model = SigLIPVAT(**SMALL).load_siglip(FIXTURES / 'hf_siglip_vision.safetensors').eval()
    with torch.no_grad():
        trajectory = representation_trajectory(model.vit, reference['input'])
    hidden = reference['hidden_states']
    # the embeddings and each layer's output but the last, then the post-LayerNorm tokens
    torch.testing.assert_close(trajectory[:-1], hidden[:-1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(trajectory[-1], reference['last_hidden_state'], rtol=1e-5, atol=1e-5)


def test_a_file_of_another_size_is_refused_naming_the_key_and_nothing_is_copied():
    torch.manual_seed(0)
    model = SigLIPVAT(**dict(SMALL, siglip_mlp_dim=32))
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r'hf_siglip_vision.safetensors: .*mlp.fc1.weight gives .* shape'):
        model.load_siglip(FIXTURES / 'hf_siglip_vision.safetensors')
    assert all(torch.equal(value, model.state_dict()[key]) for key, value in before.items())


def test_a_file_without_a_siglip_tower_is_refused():
    torch.manual_seed(0)
    with pytest.raises(CheckpointError, match='no SigLIP vision tower'):
        SigLIPVAT(**SMALL).load_siglip(FIXTURES / 'vit_pytorch_1.26.14_vat.safetensors')


def test_a_file_that_is_not_safetensors_is_refused_without_unpickling(tmp_path):
    path = tmp_path / 'model.pt'
    torch.save({'vision_model.embeddings.patch_embedding.weight': torch.zeros(1)}, path)
    torch.manual_seed(0)
    with pytest.raises(CheckpointError, match='not a readable safetensors file'):
        SigLIPVAT(**SMALL).load_siglip(path)


def test_loads_vit_pytorchs_checkpoint_and_gives_its_prediction_and_loss():
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_vat_siglip')
    config = dict(metadata['config'], vit_layer_indices=tuple(metadata['config']['vit_layer_indices']))
    torch.manual_seed(1)
    model = load_vit_pytorch(SigLIPVAT(**config), state_dict).eval()
    inputs = dict(tasks=tensors['tasks'], advantages=tensors['advantages'], extra=tensors['extra'])
    with torch.no_grad():
        torch.testing.assert_close(model(tensors['input'], **inputs), tensors['output'], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(tensors['input'], actions=tensors['actions'], **inputs), tensors['loss'],
                                   rtol=1e-5, atol=1e-5)


def test_a_heads_count_that_does_not_divide_the_width_is_refused():
    with pytest.raises(ValueError, match='siglip_dim=16 must be divisible by siglip_heads=3'):
        SigLIPVAT(**dict(SMALL, siglip_heads=3))


@pytest.mark.slow
@pytest.mark.parametrize('num_advantage_bins', [0, 2, 10])
def test_vit_pytorchs_main_block_runs_at_its_shapes_without_the_download(num_advantage_bins):
    # vit-pytorch's __main__ (its three advantage settings) less load_siglip(), which downloads So400m
    torch.manual_seed(0)
    vat = SigLIPVAT(num_tasks=4, dim_extra_token=32, time_seq_len=2, num_views=2, depth=4,
                    num_advantage_bins=num_advantage_bins, vit_layer_indices=(0, 1, 26, 27))
    images = torch.randn(1, 2, 3, 2, 224, 224)
    tasks = torch.randint(0, 4, (1,))
    extra = torch.randn(1, 32)
    # vit-pytorch draws the advantage from -1 (none) to num_advantage_bins - 1; the top bin is the one a table
    # short of its "none" row would miss
    advantages = torch.tensor([num_advantage_bins - 1]) if num_advantage_bins else None
    loss = vat(images, actions=torch.randn(1, 50, 32), advantages=advantages, tasks=tasks, extra=extra,
               freeze_vit=True)
    loss.backward()
    assert vat(images, advantages=advantages, tasks=tasks, extra=extra).shape == (1, 50, 32)


# the default tower, the VAT paper's (SigLIP So400m/14 at 224), against transformers 5.24.0's SiglipVisionModel of
# that configuration (counted by tests/fixtures/count_official_siglip.py): the whole model, then its attention-pooling
# head, which a trajectory never reads and our tower does not build
SIGLIP_SO400M_14_224 = dict(total=427_680_704, head=15_238_352)


def test_the_default_tower_counts_siglip_so400m_less_its_pooling_head():
    dim, mlp_dim = 1152, 4304
    # the head: a probe token, a MultiheadAttention (in- and out-projections with biases), a LayerNorm, an MLP
    head = (dim + (3 * dim * dim + 3 * dim) + (dim * dim + dim) + 2 * dim
            + (dim * mlp_dim + mlp_dim) + (mlp_dim * dim + dim))
    assert head == SIGLIP_SO400M_14_224['head']
    with torch.device('meta'):
        vat = SigLIPVAT()
    assert count(vat.vit) == SIGLIP_SO400M_14_224['total'] - head
