"""VAAT: the Vision Action Transformer with an audio branch (vit-pytorch's `vaat`).

VAT ("VAT: Vision Action Transformer by Unlocking Full Representation of ViT", arXiv 2512.06013; see
`vit_pytorch.vat`) with a second tower, an Audio Spectrogram Transformer (Gong et al., "AST: Audio Spectrogram
Transformer", arXiv 2104.01778): the spectrogram cut into patches like an image, a transformer over them. Each
policy layer cross-attends to the ViT's trajectory state `vit_layer_indices[l]` over every view and frame, then
to the AST's state `ast_layer_indices[l]` over every audio view. Given `actions` the forward returns the L1
loss, otherwise the predicted chunk.

    import torch
    from vit_pytorch.vaat import AST, VAAT, ViT

    vit = ViT(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=2, mlp_dim=64)
    ast = AST(dim=32, depth=2, heads=2, mlp_dim=64, patch_size=8)
    vaat = VAAT(vit, ast, dim=32, depth=3, heads=2, dim_head=16, dim_action=2, mlp_dim=64, num_image_views=2,
                num_audio_views=2, action_chunk_len=3, vit_layer_indices=(0, 1, 2), ast_layer_indices=(1, 2, 2))
    images = torch.randn(4, 2, 3, 32, 32)          # (batch, views, channels, height, width)
    audio = torch.randn(4, 2, 400)                 # (batch, audio views, samples): 65 x 34 spectrograms
    vaat(images, audio).shape                      # (4, 3, 2)

The spectrogram is computed in torch (`torch.stft`; vit-pytorch calls torchaudio, which cannot be installed
beside a CPU torch here): at vit-pytorch's settings (a power spectrogram, 128-point FFT of a 24-sample periodic
Hann window every 12 samples, frames centred with reflection padding) it equals torchaudio's `Spectrogram`
(a fixture written by torchaudio 2.11.1 checks it); `mel_filterbank` gives torchaudio's (HTK) mel filters for a
`MelSpectrogram` (the AST paper's input is a 128-band log mel filterbank; vit-pytorch's AST reads the linear
spectrogram, and so, for its checkpoints, does ours). `audio_spectrogram_transformer(variant)` builds the AST paper's
towers as its code names them (`AST_CONFIGS`: tiny224, small224, base224, base384) on (b, time, freq) spectrograms;
their parameter counts are the official code's less the terms the comment at AST_CONFIGS names.

Where this differs from vit-pytorch 1.26.14 (its checkpoints load with equal outputs all the same, converted): as
`vit_pytorch.vat` (FiLM as 1 + gamma, inputs checked with clear errors, an image batch is one view); with several
audio views vit-pytorch adds the audio view embedding of row i to batch element i (its (v, d) table broadcast as
(v, 1, 1, d) over (layers, b, v, n, d)), ours to view i, so `load_vit_pytorch` refuses such checkpoints; the AST's
`accept_spec_time_first=False` takes (b, freq, time) spectrograms (vit-pytorch reads every one as (b, time, freq)).
"""

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from vit_pytorch import vat
from vit_pytorch import vit as core
from vit_pytorch.vat import ViT  # noqa: F401  (vit-pytorch's vaat.ViT is the VAT tower)


def spectrogram(audio, window, *, n_fft, hop_length, pad=0, center=True, pad_mode='reflect', power=2.):
    """|STFT|^power of (..., samples) audio: (..., n_fft // 2 + 1, frames). Frame j holds the samples from
    j * hop_length on (about the centre with `center`), times `window` (win_length <= n_fft, centred in the
    FFT's n_fft points); bin k is the frequency k / n_fft of the sample rate. `power=None` gives the complex STFT."""
    if pad:
        audio = F.pad(audio, (pad, pad))
    shape = audio.shape
    stft = torch.stft(audio.reshape(-1, shape[-1]), n_fft, hop_length=hop_length, win_length=window.shape[0],
                      window=window, center=center, pad_mode=pad_mode, normalized=False, onesided=True,
                      return_complex=True)
    stft = stft.reshape(*shape[:-1], *stft.shape[-2:])
    return stft if power is None else stft.abs().pow(power)


def hz_to_mel(hz):
    """The HTK mel scale: 2595 log10(1 + f / 700)."""
    return 2595. * torch.log10(1. + torch.as_tensor(hz, dtype=torch.float64) / 700.)


def mel_to_hz(mel):
    return 700. * (10. ** (torch.as_tensor(mel, dtype=torch.float64) / 2595.) - 1.)


def mel_filterbank(n_freqs, n_mels, sample_rate, f_min=0., f_max=None):
    """(n_freqs, n_mels) triangular filters, unnormalised: filter m rises from 0 at the mel point m to 1 at point
    m + 1 and falls to 0 at point m + 2, the n_mels + 2 points evenly spaced in mel from f_min to f_max
    (default sample_rate / 2); bin k of a one-sided spectrogram is the frequency k sample_rate / (2 (n_freqs - 1))."""
    f_max = sample_rate / 2 if f_max is None else f_max
    bins = torch.linspace(0, sample_rate / 2, n_freqs, dtype=torch.float64)
    points = mel_to_hz(torch.linspace(hz_to_mel(f_min).item(), hz_to_mel(f_max).item(), n_mels + 2,
                                      dtype=torch.float64))
    lower, centre, upper = points[:-2], points[1:-1], points[2:]
    rising = (bins[:, None] - lower) / (centre - lower)
    falling = (upper - bins[:, None]) / (upper - centre)
    return rising.minimum(falling).clamp(min=0).float()


class Spectrogram(nn.Module):
    """torchaudio's `Spectrogram` (its arguments, its `window` buffer) in torch: (..., samples) ->
    (..., n_fft // 2 + 1, frames); `hop_length` defaults to win_length // 2, `win_length` to n_fft."""

    def __init__(self, n_fft=400, win_length=None, hop_length=None, pad=0, power=2., center=True,
                 pad_mode='reflect'):
        super().__init__()
        win_length = n_fft if win_length is None else win_length
        self.n_fft, self.hop_length = n_fft, win_length // 2 if hop_length is None else hop_length
        self.pad, self.power, self.center, self.pad_mode = pad, power, center, pad_mode
        self.register_buffer('window', torch.hann_window(win_length))     # periodic Hann, as torchaudio's

    def forward(self, audio):
        return spectrogram(audio, self.window, n_fft=self.n_fft, hop_length=self.hop_length, pad=self.pad,
                           center=self.center, pad_mode=self.pad_mode, power=self.power)


def sincos_grid(height, width, dim, temperature=10000):
    """(height * width, dim) fixed 2D sin-cos positions (row-major): quarters sin, cos of column x then of row y,
    times frequencies temperature ** -(i / (dim / 4 - 1)), as vit-pytorch's AST."""
    omega = temperature ** -(torch.arange(dim // 4) / (dim // 4 - 1))
    y, x = torch.meshgrid(torch.arange(height), torch.arange(width), indexing='ij')
    angles = [rearrange(t, 'h w -> (h w) 1') * omega for t in (x, y)]
    return torch.cat([f(a) for a in angles for f in (torch.sin, torch.cos)], dim=1)


class AST(nn.Module):
    """Audio Spectrogram Transformer (arXiv 2104.01778), vit-pytorch's: the spectrogram of (b, samples) audio (or
    a given (b, time, freq) spectrogram with `accept_spec`), cropped to whole patches, patches through the Dual
    PatchNorm projection plus fixed sin-cos positions, `num_register_tokens` registers before them, the gated
    encoder of `vit_pytorch.vat`, a final LayerNorm; `forward` returns the mean of the patch tokens through
    `mlp_head` (the pooled (b, dim) tokens without `num_classes`)."""

    def __init__(self, dim, depth, mlp_dim, num_classes=None, patch_size=16, dim_head=64, heads=8, dropout=0.,
                 accept_spec=False, accept_spec_time_first=True, spec_n_fft=128, spec_power=2, spec_win_length=24,
                 spec_hop_length=None, spec_pad=0, spec_center=True, spec_pad_mode='reflect', num_register_tokens=4):
        check_ast_arguments(**core.arguments(locals()))
        super().__init__()
        self.dim, self.depth, self.patch_size = dim, depth, core.pair(patch_size)
        self.accept_spec, self.accept_spec_time_first = accept_spec, accept_spec_time_first
        self.to_patch_tokens = core.PatchEmbedding(channels=1, patch_size=self.patch_size, dim=dim)
        self.spec = Spectrogram(n_fft=spec_n_fft, win_length=spec_win_length, hop_length=spec_hop_length,
                                pad=spec_pad, power=spec_power, center=spec_center, pad_mode=spec_pad_mode)
        self.transformer = core.Transformer(dim, depth, heads, dim_head, mlp_dim, dropout,
                                            attention=vat.tower_attention)
        self.final_norm = nn.LayerNorm(dim)
        self.mlp_head = nn.Linear(dim, num_classes) if num_classes is not None else nn.Identity()
        self.register_tokens = nn.Parameter(torch.randn(num_register_tokens, dim) * 1e-2)

    def embed(self, audio_or_spec):
        """Registers and position-embedded patch tokens: (b, registers + patches, dim)."""
        expected = 3 if self.accept_spec else 2
        if audio_or_spec.ndim != expected:
            raise ValueError(f"AST takes {'(b, time, freq) spectrograms' if self.accept_spec else '(b, samples) audio'}"
                             f" (accept_spec={self.accept_spec}), got shape {tuple(audio_or_spec.shape)}")
        if not self.accept_spec:
            reach = self.spec.n_fft // 2 if self.spec.center and self.spec.pad_mode == 'reflect' else 0
            if audio_or_spec.shape[-1] + 2 * self.spec.pad <= reach:
                raise ValueError(f'audio of {audio_or_spec.shape[-1]} samples is too short for the spectrogram: '
                                 f'its centred frames reflect n_fft // 2 = {reach} samples at each end')
            spec = self.spec(audio_or_spec)
        else:
            spec = rearrange(audio_or_spec, 'b t f -> b f t') if self.accept_spec_time_first else audio_or_spec
        (ph, pw), (height, width) = self.patch_size, spec.shape[-2:]
        if height < ph or width < pw:
            raise ValueError(f'the spectrogram is {height} x {width} (freq x time), smaller than one '
                             f'patch {ph} x {pw}: give longer audio or a smaller patch_size')
        # a spectrogram that is not whole patches is cropped at its high frequencies and its end
        spec = spec[..., :height // ph * ph, :width // pw * pw]
        patches = self.to_patch_tokens(spec[:, None])
        patches = patches + sincos_grid(height // ph, width // pw, self.dim).to(patches)
        return torch.cat((repeat(self.register_tokens, 'n d -> b n d', b=patches.shape[0]), patches), dim=1)

    def trajectory(self, audio_or_spec):
        """(depth + 1, b, n, dim): each layer's input, then the final output (normed twice, as vit-pytorch's:
        the encoder's norm, then `final_norm`)."""
        tokens = self.embed(audio_or_spec)
        final, outputs = self.transformer(tokens, return_layers=True)
        return torch.stack((tokens, *outputs[:-1], self.final_norm(final)))

    def forward(self, raw_audio_or_spec, return_hiddens=False):
        trajectory = self.trajectory(raw_audio_or_spec)
        if return_hiddens:
            return trajectory[-1], trajectory[:-1]
        pooled = trajectory[-1][:, self.register_tokens.shape[0]:].mean(dim=1)
        return self.mlp_head(pooled)


# The AST paper's towers, as its code names them (YuanGongND/ast @ 31088be, src/models/ast_models.py `model_size`):
# name -> (dim, depth, heads), the widths of the DeiT (distilled) it starts from, patches of 16, heads of 64
# channels, an MLP 4 * dim wide; base224 and base384 are one architecture (they differ in the ImageNet weights the
# code starts from). The code's AudioSet recipe reads 1024 frames of 128 mel bands, (b, time, freq), into 527
# classes. What the tower here keeps of vit-pytorch's AST (non-overlapping patches where the paper's overlap by 6,
# fixed sin-cos positions and registers where the paper learns a table and two tokens, gated attention without
# query/key/value biases) leaves the counts apart by the terms tests/test_vaat.py writes out.
AST_CONFIGS = {'tiny224': (192, 12, 3), 'small224': (384, 12, 6), 'base224': (768, 12, 12),
               'base384': (768, 12, 12)}


def audio_spectrogram_transformer(variant, *, num_classes=527, **overrides):
    """The AST paper's `variant` (a key of AST_CONFIGS) on (b, time, freq) spectrograms, 16 x 16 patches, 527
    AudioSet classes; keyword arguments of AST override the table."""
    if variant not in AST_CONFIGS:
        raise ValueError(f"variant must be one of {sorted(AST_CONFIGS)}, got {variant!r}")
    dim, depth, heads = AST_CONFIGS[variant]
    config = dict(dim=dim, depth=depth, heads=heads, dim_head=dim // heads, mlp_dim=4 * dim, patch_size=16,
                  num_classes=num_classes, accept_spec=True)
    return AST(**{**config, **overrides})


class VAAT(vat.ActionPolicy, nn.Module):
    """Multi-view images or videos and multi-view audio to a chunk of actions; see the module docstring.

    forward(video_or_image, audio_or_spec, *, extra, tasks, advantages, actions, return_hiddens, freeze_vit,
    freeze_ast): as `vit_pytorch.vat.VAT`, with audio (b, audio views, samples) or (b, samples) (one view), or
    with the AST's `accept_spec` spectrograms (b, audio views, time, freq) or (b, time, freq).
    """

    def __init__(self, vit, ast, *, dim, depth, heads, dim_head, dim_action, mlp_dim, num_image_views=None,
                 num_audio_views=None, num_tasks=None, dim_extra_token=None, num_register_tokens=4,
                 action_chunk_len=7, time_seq_len=1, dropout=0., add_self_attn=True, self_attn_heads=4,
                 self_attn_dim_head=32, ast_layer_indices=None, vit_layer_indices=None, num_advantage_bins=0):
        vit = ViT(**vit) if isinstance(vit, dict) else vit
        ast = AST(**ast) if isinstance(ast, dict) else ast
        check_arguments(**core.arguments(locals()))
        super().__init__()
        self.vit, self.ast = vit, ast
        vit_dim, ast_dim = vit.embed_dim, ast.dim
        self.register_buffer('vit_layer_indices', torch.tensor(
            tuple(range(depth)) if vit_layer_indices is None else tuple(vit_layer_indices)), persistent=False)
        self.register_buffer('ast_layer_indices', torch.tensor(
            tuple(range(depth)) if ast_layer_indices is None else tuple(ast_layer_indices)), persistent=False)

        self.time_seq_len, self.is_video = time_seq_len, time_seq_len > 1
        self.time_pos_emb = vat.embedding_rows(time_seq_len, vit_dim)
        # `num_views` (the image views) is what the shared input check reads
        self.num_image_views = self.num_views = 1 if num_image_views is None else num_image_views
        self.num_audio_views = 1 if num_audio_views is None else num_audio_views
        self.image_view_emb = vat.embedding_rows(self.num_image_views, vit_dim)
        self.audio_view_emb = vat.embedding_rows(self.num_audio_views, ast_dim)
        # each layer cross-attends to the ViT's states, then to the AST's
        self.build_policy(dim, (vit_dim, ast_dim), depth=depth, heads=heads, dim_head=dim_head, dim_action=dim_action,
                          mlp_dim=mlp_dim, dropout=dropout, num_tasks=num_tasks, dim_extra_token=dim_extra_token,
                          num_register_tokens=num_register_tokens, action_chunk_len=action_chunk_len,
                          num_advantage_bins=num_advantage_bins, add_self_attn=add_self_attn,
                          self_attn_heads=self_attn_heads, self_attn_dim_head=self_attn_dim_head)

    def audio_contexts(self, audio, freeze_ast):
        """(depth, b, audio views * tokens, ast_dim)."""
        b, v = audio.shape[:2]
        with torch.no_grad() if freeze_ast else nullcontext():
            trajectory = self.ast.trajectory(rearrange(audio, 'b v ... -> (b v) ...'))
        hiddens = rearrange(trajectory[self.ast_layer_indices], 'l (b v) n d -> l b v n d', b=b, v=v)
        if self.audio_view_emb is not None:
            hiddens = hiddens + rearrange(self.audio_view_emb, 'v d -> v 1 d')
        return rearrange(hiddens, 'l b v n d -> l b (v n) d')

    def forward(self, video_or_image, audio_or_spec, *, extra=None, tasks=None, advantages=None, actions=None,
                return_hiddens=False, freeze_vit=False, freeze_ast=False):
        video = self.check_input(video_or_image, extra=extra, tasks=tasks, advantages=advantages, actions=actions)
        batch = video.shape[0]
        audio = self.check_audio(audio_or_spec, batch)
        image_contexts = vat.vision_contexts(self.vit, video, self.vit_layer_indices, time_pos_emb=self.time_pos_emb,
                                             view_emb=self.image_view_emb, freeze_vit=freeze_vit)
        audio_contexts = self.audio_contexts(audio, freeze_ast)
        return self.act((image_contexts, audio_contexts), extra=extra, tasks=tasks, advantages=advantages,
                        actions=actions, return_hiddens=return_hiddens)

    def check_audio(self, audio, batch):
        """(b, audio views, samples) or (b, audio views, time, freq), or a ValueError saying what was expected."""
        if not isinstance(audio, torch.Tensor):
            raise TypeError(f'audio_or_spec must be a tensor, got {type(audio).__name__}')
        one_view = 3 if self.ast.accept_spec else 2
        if audio.ndim == one_view:
            audio = audio[:, None]
        if audio.ndim != one_view + 1 or audio.shape[0] != batch:
            expected = '(b, audio views, time, freq)' if self.ast.accept_spec else '(b, audio views, samples)'
            raise ValueError(f'audio_or_spec must be {expected} (or one view without its axis) with the batch of '
                             f'{batch} of the images, got shape {tuple(audio.shape)}')
        if audio.shape[1] != self.num_audio_views:
            raise ValueError(f'audio_or_spec has {audio.shape[1]} views, expected num_audio_views='
                             f'{self.num_audio_views}')
        return audio


# argument checks


def check_ast_arguments(*, dim, depth, mlp_dim, num_classes, patch_size, dim_head, heads, dropout, accept_spec,
                        accept_spec_time_first, spec_n_fft, spec_power, spec_win_length, spec_hop_length, spec_pad,
                        spec_center, spec_pad_mode, num_register_tokens):
    for name, value in dict(dim=dim, depth=depth, mlp_dim=mlp_dim, dim_head=dim_head, heads=heads,
                            spec_n_fft=spec_n_fft).items():
        core.positive_int(name, value)
    if dim % 4 or dim < 8:
        raise ValueError(f'dim must be a multiple of 4 and at least 8 (the sin-cos positions), got {dim}')
    core.positive_pair('patch_size', patch_size)
    if num_classes is not None:
        core.positive_int('num_classes', num_classes)
    core.probability('dropout', dropout)
    core.non_negative_int('num_register_tokens', num_register_tokens)
    core.non_negative_int('spec_pad', spec_pad)
    win_length = spec_n_fft if spec_win_length is None else spec_win_length
    core.positive_int('spec_win_length', win_length)
    if win_length > spec_n_fft:
        raise ValueError(f'spec_win_length={win_length} must be at most spec_n_fft={spec_n_fft}')
    if spec_hop_length is not None:
        core.positive_int('spec_hop_length', spec_hop_length)
    elif win_length < 2:
        raise ValueError(f'spec_win_length={win_length} gives a hop of win_length // 2 = 0: pass spec_hop_length')
    core.boolean('accept_spec_time_first', accept_spec_time_first)


def check_arguments(*, vit, ast, dim, depth, heads, dim_head, dim_action, mlp_dim, num_image_views, num_audio_views,
                    num_tasks, dim_extra_token, num_register_tokens, action_chunk_len, time_seq_len, dropout,
                    add_self_attn, self_attn_heads, self_attn_dim_head, ast_layer_indices, vit_layer_indices,
                    num_advantage_bins):
    if num_image_views is not None:
        core.positive_int('num_image_views', num_image_views)      # before VAT's check, which calls it num_views
    vat.check_arguments(vit=vit, dim=dim, depth=depth, heads=heads, dim_head=dim_head, dim_action=dim_action,
                        mlp_dim=mlp_dim, num_views=num_image_views, num_tasks=num_tasks,
                        dim_extra_token=dim_extra_token, num_register_tokens=num_register_tokens,
                        action_chunk_len=action_chunk_len, time_seq_len=time_seq_len, dropout=dropout,
                        add_self_attn=add_self_attn, self_attn_heads=self_attn_heads,
                        self_attn_dim_head=self_attn_dim_head, vit_layer_indices=vit_layer_indices,
                        num_advantage_bins=num_advantage_bins)
    if not isinstance(ast, AST):
        raise TypeError(f'ast must be a vit_pytorch.vaat.AST or a dict of its arguments, got {type(ast).__name__}')
    if num_audio_views is not None:
        core.positive_int('num_audio_views', num_audio_views)
    if ast_layer_indices is None:
        if ast.depth != depth:
            raise ValueError(f'depth={depth} differs from the AST depth {ast.depth}: pass ast_layer_indices, one '
                             f'index of the AST trajectory (0 to {ast.depth}) per VAAT layer')
        return
    vat.layer_indices('ast_layer_indices', ast_layer_indices, depth)
    indices = tuple(ast_layer_indices)
    if len(indices) != depth or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= ast.depth
                                        for i in indices):
        raise ValueError(f'ast_layer_indices must be {depth} ints (one per VAAT layer) in 0..{ast.depth}, got '
                         f'{ast_layer_indices!r}')


# loading checkpoints


def vit_pytorch_plan(model, keys):
    """vit-pytorch's `vaat.VAAT`, `vaat.ViT` and `vaat.AST`: `vit_pytorch.vat`'s conversions (the policy's stack,
    the tower's cls token and position table, FiLM's gamma bias); the AST's keys are ours as they are."""
    if isinstance(model, VAAT) and model.audio_view_emb is not None:
        raise ValueError("vit-pytorch's VAAT computes another function with several audio views: it adds its "
                         "audio view embedding (v, d) to the AST states (layers, b, v, n, d) as (v, 1, 1, d), so "
                         "row i reaches batch element i whatever its view (and any batch but b = v fails); ours "
                         "adds row i to view i. Its checkpoints load for num_audio_views=None or 1")
    plan, _ = vat.vit_pytorch_plan(model, keys)
    heads = {VAAT: ('vit.mlp_head.', 'ast.mlp_head.'), AST: ('mlp_head.',)}.get(type(model), ('mlp_head.',))
    return plan, heads

