"""A tiny action transformer on the moving-digit action task: from two views (the clip and its mirror) of 4 frames,
predict the digit's displacement over the next 3 frames. Prints the test L1 error after each epoch beside two rules
that need no learning: predicting zero, and repeating the last observed step (right except where the digit bounces).

    python examples/vat_actions.py --epochs 3 --train 1024
    python examples/vat_actions.py --model vaat --epochs 3 --train 1024

`--model` picks the policy, all of width 32 and depth 3 reading their tower's embeddings, its layer 1 and its final
tokens, on a tower of width 32 and depth 2 with 8-pixel patches of the 32-pixel frames:
  vat     `vit_pytorch.vat.VAT` on the VAT ViT (gated attention).
  siglip  `vit_pytorch.vat_siglip.SigLIPVAT`, its SigLIP tower of the same size trained from scratch (no file is
          read); SigLIP takes RGB, so the grey frames are repeated over 3 channels.
  vaat    `vit_pytorch.vaat.VAAT`: the VAT ViT and an AST of the same size, hearing the clip's position tones
          (`action_clips(audio_samples=256)`: in each frame a tone whose pitch is the digit's column), as 65 x 17
          magnitude-squared spectrograms (128-point Hann window every 64 samples) cut into 8 x 4 patches (4 hops:
          about one frame's tone); `--silent` feeds it zeros instead, to measure what the sound adds.
AdamW at 1e-3, batches of 32, one thread; `--seed` seeds the initialisation and the batch order (the clips are
always the same). The L1 is also given per axis (dy, dx): the tones tell only the horizontal.
"""

import argparse
import time

import torch

from vit_pytorch.clips import action_clips
from vit_pytorch.vaat import AST, VAAT
from vit_pytorch.vat import VAT, ViT
from vit_pytorch.vat_siglip import SigLIPVAT

MODELS = ('vat', 'vaat', 'siglip')
AUDIO_SAMPLES = 256          # of the position tone per frame
# the policy every model shares: width 32, depth 3, layer l reading the tower's state (0, 1, 2)[l]
POLICY = dict(dim=32, depth=3, heads=2, dim_head=16, dim_action=2, mlp_dim=64, action_chunk_len=3,
              time_seq_len=4, self_attn_heads=2, self_attn_dim_head=16, vit_layer_indices=(0, 1, 2))


def l1(pred, actions, dim=None):
    error = (pred - actions).abs()
    return error.mean().item() if dim is None else error.mean(dim=dim)


def build(name):
    if name == 'siglip':
        return SigLIPVAT(num_views=2, siglip_image_size=32, siglip_patch_size=8, siglip_dim=32, siglip_depth=2,
                         siglip_heads=2, siglip_mlp_dim=64, **POLICY)
    vit = ViT(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=2, dim_head=16, mlp_dim=64,
              channels=1)
    if name == 'vat':
        return VAT(vit, num_views=2, **POLICY)
    ast = AST(dim=32, depth=2, heads=2, dim_head=16, mlp_dim=64, patch_size=(8, 4), spec_n_fft=128,
              spec_win_length=128, spec_hop_length=64)
    return VAAT(vit, ast, num_image_views=2, num_audio_views=1, ast_layer_indices=(0, 1, 2), **POLICY)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', choices=MODELS, default='vat')
    parser.add_argument('--silent', action='store_true', help='vaat only: zero audio in place of the tones')
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--train', type=int, default=1024, help='training clips')
    parser.add_argument('--test', type=int, default=450, help='test clips')
    parser.add_argument('--seed', type=int, default=0, help='of the initialisation and the batch order')
    args = parser.parse_args(argv)
    if args.silent and args.model != 'vaat':
        parser.error(f'--silent takes --model vaat (the only one that hears), got --model {args.model}')
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    samples = AUDIO_SAMPLES if args.model == 'vaat' else 0
    train = action_clips('train', count=args.train, audio_samples=samples)
    test = action_clips('test', count=args.test, audio_samples=samples)
    model = build(args.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def inputs(task, index):
        views = task.floats(index)
        if args.model == 'siglip':
            return (views.expand(-1, -1, 3, -1, -1, -1),)
        if args.model == 'vaat':
            audio = task.audio[index]
            return views, torch.zeros_like(audio) if args.silent else audio
        return (views,)

    # the last observed step, measured as the actions are, from the digit's corner (the clip's first view)
    def last_step(task):
        frames = task.views[:, 0, 0].float()
        mass = frames.sum(dim=(-1, -2))
        rows = (frames.sum(-1) * torch.arange(32)).sum(-1) / mass
        columns = (frames.sum(-2) * torch.arange(32)).sum(-1) / mass
        step = torch.stack((rows[:, -1] - rows[:, -2], columns[:, -1] - columns[:, -2]), dim=-1) / 2
        return step[:, None].expand(-1, 3, -1)

    zero, last = torch.zeros_like(test.actions), last_step(test)
    print(f'test L1: zero {l1(zero, test.actions):.3f}, last step repeated {l1(last, test.actions):.3f}')
    print('per axis (dy, dx): zero ({:.3f}, {:.3f}), last step repeated ({:.3f}, {:.3f})'.format(
        *l1(zero, test.actions, (0, 1)).tolist(), *l1(last, test.actions, (0, 1)).tolist()))
    print(f'model {args.model}{" (silent)" if args.silent else ""}: '
          f'{sum(p.numel() for p in model.parameters()):,} parameters, seed {args.seed}')
    for epoch in range(args.epochs):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(train))
        for batch in order.split(32):
            loss = model(*inputs(train, batch), actions=train.actions[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            pred = torch.cat([model(*inputs(test, batch)) for batch in torch.arange(len(test)).split(64)])
        dy, dx = l1(pred, test.actions, (0, 1)).tolist()
        print(f'epoch {epoch + 1}: train loss {loss.item():.3f}, test L1 {l1(pred, test.actions):.3f} '
              f'(dy {dy:.3f}, dx {dx:.3f}) ({time.perf_counter() - start:.0f} s)')


if __name__ == '__main__':
    main()
