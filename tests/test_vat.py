"""VAT (vit_pytorch.vat): what the paper adds, a policy of action tokens reading a ViT's whole trajectory."""

import pytest
import torch

from helpers import load_fixture, move_off_initialisation
from vit_pytorch.pretrained import load_vit_pytorch
from vit_pytorch.recorder import Recorder
from vit_pytorch.vat import VAT, ViT, representation_trajectory

TOWER = dict(image_size=16, patch_size=8, num_classes=5, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=32)
POLICY = dict(dim=16, depth=3, heads=2, dim_head=8, dim_action=2, mlp_dim=32, num_views=2, action_chunk_len=3,
              time_seq_len=2, self_attn_heads=2, self_attn_dim_head=8, vit_layer_indices=(0, 1, 2))
VIDEO = (2, 2, 3, 2, 16, 16)       # (b, views, channels, frames, h, w)


def build(seed=0, tower=None, **changes):
    torch.manual_seed(seed)
    model = VAT(ViT(**dict(TOWER, **(tower or {}))), **dict(POLICY, **changes)).eval()
    return move_off_initialisation(model, seed)


def video(seed=1):
    return torch.randn(VIDEO, generator=torch.Generator().manual_seed(seed))


def predict(model, x, **kwargs):
    with torch.no_grad():
        return model(x, **kwargs)


def test_without_actions_the_forward_predicts_a_chunk_of_actions():
    assert predict(build(), video()).shape == (2, 3, 2)


def test_with_actions_the_forward_returns_the_mean_absolute_error_of_its_prediction():
    model, x = build(), video()
    actions = torch.randn(2, 3, 2, generator=torch.Generator().manual_seed(2))
    pred = predict(model, x)
    expected = sum(abs(pred[b, k, d] - actions[b, k, d]) for b in range(2) for k in range(3) for d in range(2)) / 12
    torch.testing.assert_close(predict(model, x, actions=actions), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('view', [0, 1])
@pytest.mark.parametrize('frame', [0, 1])
def test_every_view_and_frame_reaches_the_action_tokens(view, frame):
    model, x = build(), video()
    changed = x.clone()
    changed[:, view, :, frame] += torch.randn(changed[:, view, :, frame].shape)
    assert not torch.allclose(predict(model, x), predict(model, changed), atol=1e-4)


def test_the_trajectory_runs_from_the_embedded_tokens_to_the_final_normed_tokens():
    tower = move_off_initialisation(ViT(**dict(TOWER, num_register_tokens=2))).eval()
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        trajectory = representation_trajectory(tower, images)
        first_layer = tower.transformer.layers[0]
        tokens = tower.embed(images)
        after_first = first_layer[1](first_layer[0](tokens) + tokens) + first_layer[0](tokens) + tokens
        torch.testing.assert_close(trajectory[0], tokens, rtol=0, atol=0)
        torch.testing.assert_close(trajectory[1], after_first, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(trajectory[2], tower.forward_features(images), rtol=0, atol=0)
    assert trajectory.shape == (3, 3, 1 + 2 + 4, 16)


def test_policy_layers_read_only_the_tower_states_named_by_vit_layer_indices():
    # every policy layer reads the embedded tokens (index 0): the tower's encoder layers cannot matter
    model, x = build(vit_layer_indices=(0, 0, 0)), video()
    before = predict(model, x)
    with torch.no_grad():
        for p in model.vit.transformer.parameters():
            p.add_(torch.randn(p.shape))
    torch.testing.assert_close(predict(model, x), before, rtol=0, atol=0)


def test_the_last_policy_layer_reads_the_tower_state_its_index_names():
    model, x = build(vit_layer_indices=(0, 0, 2)), video()
    before = predict(model, x)
    with torch.no_grad():
        model.vit.transformer.norm.weight.add_(1.)      # only trajectory index 2 (the final norm) sees this
    assert not torch.allclose(predict(model, x), before, atol=1e-4)


def test_untrained_task_conditioning_leaves_the_prediction_as_it_is():
    torch.manual_seed(0)
    model = VAT(ViT(**TOWER), **POLICY, num_tasks=3).eval()
    x = video()
    torch.testing.assert_close(predict(model, x, tasks=torch.tensor([0, 2])), predict(model, x), rtol=0, atol=0)


def test_tasks_advantages_and_the_extra_token_each_change_the_prediction():
    model = build(num_tasks=3, num_advantage_bins=2, dim_extra_token=4)
    x = video()
    base = dict(tasks=torch.tensor([0, 1]), advantages=torch.tensor([0, 1]), extra=torch.zeros(2, 4))
    reference = predict(model, x, **base)
    for name, value in dict(tasks=torch.tensor([2, 2]), advantages=torch.tensor([-1, -1]),
                            extra=torch.ones(2, 4)).items():
        assert not torch.allclose(predict(model, x, **dict(base, **{name: value})), reference, atol=1e-4), name


def test_an_image_batch_is_one_view_of_one_frame():
    torch.manual_seed(0)
    model = VAT(ViT(**TOWER), **dict(POLICY, num_views=None, time_seq_len=1)).eval()
    images = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(predict(model, images), predict(model, images[:, None]), rtol=0, atol=0)


def test_the_recorder_sees_the_towers_and_the_policys_attention():
    model, x = build(), video()
    with Recorder(model) as recorder:
        predict(model, x)
    names = recorder.names
    assert sum(name.startswith('vit.') for name in names) == 2
    cross = [m for name, m in zip(names, recorder.maps) if name.endswith('.2')]
    # 4 registers + 3 action tokens query 2 views x 2 frames x (1 cls + 4 patches) tower tokens
    assert [tuple(m.shape) for m in cross] == [(2, 2, 7, 20)] * 3


def test_the_recorded_path_gives_the_fused_output():
    model, x = build(), video()
    fused = predict(model, x)
    with Recorder(model):
        torch.testing.assert_close(predict(model, x), fused, rtol=1e-5, atol=1e-5)


def test_the_backward_builds_the_gradient_of_the_stacked_tower_states_once():
    # the policy's 5 layers read the stack of tower states (5, b, views * frames * tokens, dim); its gradient is one
    # tensor of that shape. Taking each layer's state by indexing the stack makes the backward build one such
    # tensor per layer (a zero-filled select_backward) and add them up: 2 x 5 - 1 of them instead of 1.
    from torch.utils._python_dispatch import TorchDispatchMode

    model, x = build(depth=5, vit_layer_indices=(0, 0, 1, 1, 2)), video()
    stacked = (5, 2, 2 * 2 * 5, 16)

    class StackSized(TorchDispatchMode):
        made = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and tuple(out.shape) == stacked:
                StackSized.made.append(func)
            return out

    loss = model.train()(x, actions=torch.zeros(2, 3, 2), freeze_vit=True)
    with StackSized():
        loss.backward()
    assert len(StackSized.made) == 1, StackSized.made
    assert model.view_emb.grad is not None and model.time_pos_emb.grad is not None


# vit-pytorch's checkpoints


def test_loads_vit_pytorchs_checkpoint_and_gives_its_prediction_and_loss():
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_vat')
    tower = dict(metadata['vit_config'], image_size=tuple(metadata['vit_config']['image_size']))
    config = dict(metadata['config'], vit_layer_indices=tuple(metadata['config']['vit_layer_indices']))
    torch.manual_seed(1)
    model = load_vit_pytorch(VAT(ViT(**tower), **config), state_dict).eval()
    inputs = dict(tasks=tensors['tasks'], advantages=tensors['advantages'], extra=tensors['extra'])
    torch.testing.assert_close(predict(model, tensors['input'], **inputs), tensors['output'], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(predict(model, tensors['input'], actions=tensors['actions'], **inputs),
                               tensors['loss'], rtol=1e-5, atol=1e-5)


# vit-pytorch's __main__ block (less .cuda()), at its shapes


@pytest.mark.slow
def test_vit_pytorchs_main_block_runs():
    vit = ViT(image_size=256, patch_size=32, num_classes=1000, dim=256, heads=8, depth=4, mlp_dim=1024)
    for num_adv_bins in (0, 2, 10):
        vat = VAT(vit, dim=512, depth=9, heads=8, dim_head=64, mlp_dim=2048, dim_action=20, action_chunk_len=7,
                  time_seq_len=4, num_views=2, num_tasks=4, num_advantage_bins=num_adv_bins, add_self_attn=True,
                  dim_extra_token=33, vit_layer_indices=(0, 0, 1, 1, 2, 2, 3, 3, 4))
        images = torch.randn(2, 2, 3, 4, 256, 256)
        tasks = torch.randint(0, 4, (2,))
        extra = torch.randn(2, 33)
        advantages = torch.randint(-1, num_adv_bins, (2,)) if num_adv_bins > 0 else None
        actions = torch.randn(2, 7, 20)
        loss = vat(images, actions=actions, advantages=advantages, tasks=tasks, extra=extra, freeze_vit=True)
        loss.backward()
        pred_actions, hiddens = vat(images, advantages=advantages, tasks=tasks, extra=extra, return_hiddens=True)
        assert pred_actions.shape == (2, 7, 20)


# clear errors


@pytest.mark.parametrize('changes, words', [
    (dict(depth=4), 'vit_layer_indices'),
    (dict(vit_layer_indices=(0, 1, 3)), 'vit_layer_indices must be 3 ints'),
    (dict(dim_action=0), 'dim_action'),
    (dict(dropout=1.5), 'dropout'),
])
def test_a_bad_configuration_is_refused_by_name(changes, words):
    with pytest.raises(ValueError, match=words):
        VAT(ViT(**TOWER), **dict(POLICY, **changes))


@pytest.mark.parametrize('shape, words', [
    ((2, 3, 3, 2, 16, 16), 'has 3 views, expected num_views=2'),
    ((2, 2, 3, 3, 16, 16), 'has 3 frames, expected time_seq_len=2'),
    ((2, 2, 3, 16, 16), r'\(b, views, channels, frames, height, width\)'),
])
def test_an_input_of_another_layout_is_refused_by_name(shape, words):
    with pytest.raises(ValueError, match=words):
        build()(torch.randn(shape))


def test_actions_of_another_shape_are_refused_by_name():
    with pytest.raises(ValueError, match=r'actions must be \(b, action_chunk_len, dim_action\) = \(2, 3, 2\)'):
        build()(video(), actions=torch.zeros(2, 4, 2))


def test_tasks_without_num_tasks_are_refused():
    with pytest.raises(ValueError, match='num_tasks'):
        build()(video(), tasks=torch.tensor([0, 1]))
