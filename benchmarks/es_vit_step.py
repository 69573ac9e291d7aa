"""One EsViT training step, vit-pytorch 1.26.14's EsViTTrainer against ours, on the same backbone (our CvT at
vit-pytorch's README widths, 64-pixel images, batch 8, K = 65336, AdamW), one thread: the median CPU time of a step
and the process's peak RSS. One process per trainer (the peak RSS is the process's):

    cd /tmp && for which in theirs ours ours0; do VIT_PYTORCH_SOURCE=vit_pytorch-1.26.14-py3-none-any.whl \
        python /path/to/benchmarks/es_vit_step.py $which 3; done

theirs: vit-pytorch's (its student sees the 2 local crops, its teacher the 2 global ones); ours: the paper's views
(the student sees the 2 global crops too: twice the student's work); ours0: ours without local crops, the same
number of forwards as vit-pytorch's. Needs vit-pytorch 1.26.14 installed beside torch, or its wheel in
$VIT_PYTORCH_SOURCE (as benchmarks/throughput.py reads it), and torchvision.
"""
import importlib.metadata
import importlib.util
import os
import resource
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_pytorch.cvt import CvT  # noqa: E402  (ours, from this checkout)

README = dict(num_classes=1000, s1_emb_dim=64, s1_emb_kernel=7, s1_emb_stride=4, s1_proj_kernel=3, s1_kv_proj_stride=2,
              s1_heads=1, s1_depth=1, s1_mlp_mult=4, s2_emb_dim=192, s2_emb_kernel=3, s2_emb_stride=2, s2_proj_kernel=3,
              s2_kv_proj_stride=2, s2_heads=3, s2_depth=2, s2_mlp_mult=4, s3_emb_dim=384, s3_emb_kernel=3,
              s3_emb_stride=2, s3_proj_kernel=3, s3_kv_proj_stride=2, s3_heads=4, s3_depth=10, s3_mlp_mult=4, dropout=0.)
HEAD = dict(projection_hidden_size=256, projection_layers=4, num_classes_K=65336)      # the README's
class Both(nn.Module):
    """Our CvT, its last map also the output of a hookable module (for vit-pytorch's trainer)."""
    def __init__(self, cvt=README):
        super().__init__()
        self.body, self.to_map, self.channels, self.num_prefix_tokens = CvT(**cvt), nn.Identity(), 3, 0
    def forward(self, x):
        return self.to_map(self.body.forward_intermediates(x, 1)[-1])
    def forward_intermediates(self, x, indices=None):
        return [self.forward(x)]
def build(which, image_size=64, cvt=README, head=HEAD, reference=None):
    """The trainer (theirs, ours, ours0) around a fresh Both(cvt), seed 0; `reference`: vit-pytorch's es_vit
    module for theirs (else from $VIT_PYTORCH_SOURCE or the installed vit-pytorch)."""
    torch.manual_seed(0)
    net = Both(cvt)
    args = dict(image_size=image_size, hidden_layer='to_map' if which == 'theirs' else 'layers', **head)
    if which == 'theirs':
        if reference is not None:
            ref = reference
        elif os.environ.get('VIT_PYTORCH_SOURCE'):      # its wheel or folder, as throughput.py reads it
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import throughput
            ref = throughput.vit_pytorch_module('es_vit')
        else:                                           # installed beside torch
            path = importlib.metadata.distribution('vit-pytorch').locate_file('vit_pytorch/es_vit.py')
            spec = importlib.util.spec_from_file_location('reference_es_vit', path)
            ref = importlib.util.module_from_spec(spec); spec.loader.exec_module(ref)
        return ref.EsViTTrainer(net, **args)
    from vit_pytorch.es_vit import EsViTTrainer
    return EsViTTrainer(net, **args, **(dict(num_local_crops=0) if which == 'ours0' else {}))


if __name__ == '__main__':
    torch.set_num_threads(1)
    which, rounds = sys.argv[1], int(sys.argv[2])
    learner = build(which)
    opt = torch.optim.AdamW(learner.parameters(), lr=3e-4)
    images = torch.rand(8, 3, 64, 64)
    times = []
    for r in range(rounds + 1):
        start = time.process_time()
        loss = learner(images); opt.zero_grad(); loss.backward(); opt.step(); learner.update_moving_average()
        times.append(time.process_time() - start)
    print(f"{which}: step CPU s (median of {rounds} after 1 warm-up) {sorted(times[1:])[rounds // 2]:.3f}, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB, torch {torch.__version__}")
