"""A tiny VAT on the moving-digit action task: from two views (the clip and its mirror) of 4 frames, predict the
digit's displacement over the next 3 frames. Prints the test L1 error after each epoch beside two rules that
need no learning: predicting zero, and repeating the last observed step (right except where the digit bounces).

    python examples/vat_actions.py --epochs 3 --train 1024

The model is small (a ViT of width 32 and depth 2 on 32-pixel frames, a policy of width 32 and depth 3 reading
its embeddings, its layer 1 and its final tokens); AdamW at 1e-3, batches of 32, seed 0, one thread.
"""

import argparse
import time

import torch

from vit_pytorch.clips import action_clips
from vit_pytorch.vat import VAT, ViT


def l1(pred, actions):
    return (pred - actions).abs().mean().item()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--train', type=int, default=1024, help='training clips')
    parser.add_argument('--test', type=int, default=450, help='test clips')
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train, test = action_clips('train', count=args.train), action_clips('test', count=args.test)
    vit = ViT(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=2, dim_head=16, mlp_dim=64,
              channels=1)
    model = VAT(vit, dim=32, depth=3, heads=2, dim_head=16, dim_action=2, mlp_dim=64, num_views=2,
                action_chunk_len=3, time_seq_len=4, self_attn_heads=2, self_attn_dim_head=16,
                vit_layer_indices=(0, 1, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    # the last observed step, measured as the actions are, from the digit's corner (the clip's first view)
    def last_step(task):
        frames = task.views[:, 0, 0].float()
        mass = frames.sum(dim=(-1, -2))
        rows = (frames.sum(-1) * torch.arange(32)).sum(-1) / mass
        columns = (frames.sum(-2) * torch.arange(32)).sum(-1) / mass
        step = torch.stack((rows[:, -1] - rows[:, -2], columns[:, -1] - columns[:, -2]), dim=-1) / 2
        return step[:, None].expand(-1, 3, -1)

    print(f'test L1: zero {l1(torch.zeros_like(test.actions), test.actions):.3f}, '
          f'last step repeated {l1(last_step(test), test.actions):.3f}')
    for epoch in range(args.epochs):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(train))
        for batch in order.split(32):
            loss = model(train.floats(batch), actions=train.actions[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            pred = torch.cat([model(test.floats(batch)) for batch in torch.arange(len(test)).split(64)])
        print(f'epoch {epoch + 1}: train loss {loss.item():.3f}, test L1 {l1(pred, test.actions):.3f} '
              f'({time.perf_counter() - start:.0f} s)')


if __name__ == '__main__':
    main()
