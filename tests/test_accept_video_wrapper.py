"""AcceptVideoWrapper: any image model, frame by frame.

Reference: vit-pytorch 1.26.14's `AcceptVideoWrapper` around its ViT (tokens out, a time embedding
added after a projection), tests/fixtures/make_video_signal_fixtures.py.
"""

import pytest
import torch
from helpers import as_tuples, load_fixture

from vit_pytorch import SimpleViT, ViT
from vit_pytorch.accept_video_wrapper import AcceptVideoWrapper
from vit_pytorch.clips import moving_digits
from vit_pytorch.pretrained import load_vit_pytorch

IMAGE = dict(image_size=(16, 24), patch_size=(4, 8), num_classes=5, dim=16, depth=1, heads=2, dim_head=8, mlp_dim=32)
TOL = dict(atol=1e-5, rtol=1e-5)


def video(batch=2, frames=3):
    return torch.randn(batch, 3, frames, 16, 24)


def test_each_frame_gets_the_image_models_output():
    image_net = ViT(**IMAGE).eval()
    x = video()
    with torch.no_grad():
        out = AcceptVideoWrapper(image_net)(x)
        assert out.shape == (2, 3, 5)
        for frame in range(3):
            torch.testing.assert_close(out[:, frame], image_net(x[:, :, frame]), **TOL)


def test_nested_outputs_keep_their_structure_and_scalars_pass_through():
    class TwoOutputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.vit = ViT(**IMAGE)

        def forward(self, img):
            return {'logits': self.vit(img), 'pair': (self.vit.forward_features(img), torch.tensor(0.5))}

    out = AcceptVideoWrapper(TwoOutputs())(video())
    assert out['logits'].shape == (2, 3, 5) and out['pair'][0].shape == (2, 3, 13, 16)
    assert out['pair'][1].item() == 0.5


def test_time_embedding_is_added_along_the_frame_axis():
    image_net = ViT(**dict(IMAGE, num_classes=0)).eval()
    wrapper = AcceptVideoWrapper(image_net, add_time_pos_emb=True, dim_emb=16, time_seq_len=4).eval()
    x = video(frames=3)
    with torch.no_grad():
        plain, embedded = AcceptVideoWrapper(image_net)(x), wrapper(x)
    # every token of frame t moves by the same vector, the embedding of time t
    torch.testing.assert_close(embedded - plain, wrapper.pos_emb[:3][None, :, None].expand_as(plain), **TOL)


def test_channel_first_embedding_is_added_to_the_channel_axis():
    class FeatureMap(torch.nn.Module):
        def forward(self, img):
            return img[:, :2]                                   # (b * t, 2 channels, h, w)

    wrapper = AcceptVideoWrapper(FeatureMap(), add_time_pos_emb=True, dim_emb=2, time_seq_len=3,
                                 embed_is_channel_first=True)
    x = video(frames=3)
    out = wrapper(x)                                            # (b, t, 2, h, w)
    expected = x[:, :2].transpose(1, 2) + wrapper.pos_emb[None, :, :, None, None]
    torch.testing.assert_close(out, expected, **TOL)


def test_eval_with_no_grad_runs_the_image_model_frozen_and_restores_its_mode():
    image_net = ViT(**dict(IMAGE, dropout=0.5)).train()
    wrapper = AcceptVideoWrapper(image_net)
    x = video()
    first, second = wrapper(x, eval_with_no_grad=True), wrapper(x, eval_with_no_grad=True)
    torch.testing.assert_close(first, second, atol=0, rtol=0)          # no dropout: eval mode
    assert not first.requires_grad and image_net.training
    assert wrapper(x).requires_grad


def test_forward_function_and_kwargs_go_to_the_image_model():
    class Scaled(torch.nn.Module):
        def features(self, img, *, scale):
            return img.mean(dim=(2, 3)) * scale                          # (b * t, c)

    wrapper = AcceptVideoWrapper(Scaled(), forward_function='features')
    x = video()
    torch.testing.assert_close(wrapper(x, forward_kwargs=dict(scale=2.0)), 2 * x.mean(dim=(3, 4)).transpose(1, 2))
    tokens = AcceptVideoWrapper(SimpleViT(**IMAGE), forward_function='forward_features')(x)
    assert tokens.shape == (2, 3, 12, 16)


def test_a_per_frame_model_cannot_tell_a_clip_from_its_reversal_a_3d_vit_can():
    # a clip played backwards is a clip of the opposite direction (tests/test_clips.py); a frame-by-frame model
    # pooled over time sees the same set of frames in both, so it cannot tell left from right
    from vit_pytorch.vit_3d import ViT as ViT3d

    clips = moving_digits('train', count=8, frames=4, size=16, digit_size=8, speed=2, task='direction').floats()
    backwards = clips.flip(2)
    per_frame = AcceptVideoWrapper(ViT(image_size=16, patch_size=8, num_classes=8, dim=16, depth=1, heads=2,
                                       dim_head=8, mlp_dim=32, channels=1)).eval()
    spatio_temporal = ViT3d(image_size=16, image_patch_size=8, frames=4, frame_patch_size=2, num_classes=8, dim=16,
                            depth=1, heads=2, dim_head=8, mlp_dim=32, channels=1).eval()
    with torch.no_grad():
        torch.testing.assert_close(per_frame(clips).mean(dim=1), per_frame(backwards).mean(dim=1), **TOL)
        assert not torch.allclose(spatio_temporal(clips), spatio_temporal(backwards), **TOL)


@pytest.mark.slow
def test_compiles_without_graph_breaks():
    model = AcceptVideoWrapper(ViT(**IMAGE), add_time_pos_emb=True, dim_emb=5, time_seq_len=4).eval()
    x = video()
    compiled = torch.compile(model, fullgraph=True, backend='eager')
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOL)


def test_vit_pytorch_checkpoint_loads_and_reproduces_its_outputs():
    metadata, state_dict, tensors = load_fixture('vit_pytorch_1.26.14_accept_video_wrapper')
    config = dict(metadata['config'])
    image_net = ViT(**as_tuples(config.pop('image_net'), 'image_size', 'patch_size'))
    wrapper = load_vit_pytorch(AcceptVideoWrapper(image_net, **config).eval(), state_dict)
    with torch.no_grad():
        torch.testing.assert_close(wrapper(tensors['input']), tensors['output'], **TOL)


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(add_time_pos_emb=True), ValueError, r'dim_emb.*time_seq_len'),
    (dict(proj_embed_to_dim=8), ValueError, r'dim_emb'),
    (dict(forward_function='predict'), ValueError, r'forward_function'),
    (dict(moss=dict(dim=16)), ValueError, r'moss.*not offered'),
])
def test_bad_arguments_are_refused_with_their_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        AcceptVideoWrapper(ViT(**IMAGE), **kwargs)


def test_too_many_frames_for_the_time_embedding_is_refused():
    wrapper = AcceptVideoWrapper(ViT(**IMAGE), add_time_pos_emb=True, dim_emb=5, time_seq_len=2)
    with pytest.raises(ValueError, match=r'video has 3 frames, more than time_seq_len=2'):
        wrapper(video(frames=3))
