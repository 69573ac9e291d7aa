"""Where one EsViT training step's memory goes, vit-pytorch 1.26.14's EsViTTrainer against ours, on the same
backbone (es_vit_step.py's: our CvT at vit-pytorch's README widths), README head (K = 65336, width 256, 4 layers),
AdamW, one thread, at a chosen image size and batch (the README's is 256 px, batch 8):

    cd /tmp && prlimit --as=6000000000 -- /usr/bin/time -v /work/ref/refvenv/bin/python \\
        /path/to/benchmarks/es_vit_memory.py theirs|ours|ours0 IMAGE_SIZE BATCH [--no-profile]

Prints, after a first step: the tensors autograd saves in a forward (distinct storages, parameters left out),
summed by the graph node that first saves them, with their largest shapes; the peak of allocated bytes of a forward
and backward over their start, from torch.profiler's allocation events (gradients set to None before), and the ops
running at that peak (the optimiser step and the EMA are left out: vit-pytorch's EMA reallocates every teacher
weight, whose old storages the profiler cannot subtract); the process's peak RSS (all of it: the trainer's
construction, with vit-pytorch's forward of two images there, and the steps). theirs, ours, ours0 as in
es_vit_step.py (ours0: ours with num_local_crops=0, vit-pytorch's number of forwards); `--no-profile` leaves the
profiler out.
"""
import os
import resource
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import es_vit_step  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

which, image_size, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
profiled = '--no-profile' not in sys.argv
torch.set_num_threads(1)
learner = es_vit_step.build(which, image_size)
opt = torch.optim.AdamW(learner.parameters(), lr=3e-4)
images = torch.rand(batch, 3, image_size, image_size)
torch.manual_seed(1)


def step():
    opt.zero_grad(set_to_none=True)
    loss = learner(images)
    loss.backward()
    opt.step()
    learner.update_moving_average()


step()
# the forward's saved tensors, by the node that saves them (a storage saved by several nodes counted once)
opt.zero_grad(set_to_none=True)
loss = learner(images)
seen = {p.untyped_storage().data_ptr() for p in learner.parameters()}     # parameters are no extra memory
parameters = len(seen)
by_node, shapes = defaultdict(int), defaultdict(set)
stack, visited = [loss.grad_fn], set()
while stack:
    node = stack.pop()
    if node is None or node in visited:
        continue
    visited.add(node)
    for attribute in dir(node):                 # built-in nodes' _saved_*, a custom Function's saved_tensors
        if not attribute.startswith('_saved_') and attribute != 'saved_tensors':
            continue
        try:
            value = getattr(node, attribute)
        except RuntimeError:
            continue
        for tensor in value if isinstance(value, (tuple, list)) else [value]:
            if isinstance(tensor, torch.Tensor) and tensor.numel() > 0:
                key = tensor.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    by_node[node.name()] += tensor.untyped_storage().nbytes()
                    shapes[node.name()].add(tuple(tensor.shape))
    stack.extend(next_node for next_node, _ in node.next_functions)
loss.backward()
del loss
MiB = 2 ** 20
print(f'{which} {image_size}px batch {batch}: saved {sum(by_node.values()) / MiB:.0f} MiB in '
      f'{len(seen) - parameters} storages (parameters left out)')
for name, nbytes in sorted(by_node.items(), key=lambda item: -item[1])[:8]:
    print(f'    {name:28s} {nbytes / MiB:8.0f} MiB  {sorted(shapes[name], key=lambda s: -torch.Size(s).numel())[:2]}')
if profiled:
    opt.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        learner(images).backward()
    events = prof.profiler.kineto_results.events()
    memory = sorted((e for e in events if e.name() == '[memory]'), key=lambda e: e.start_ns())
    current = peak = 0
    peak_at = None
    for event in memory:
        current += event.nbytes()
        if current > peak:
            peak, peak_at = current, event.start_ns()
    running = sorted((o for o in events if o.name() != '[memory]' and o.start_ns() <= peak_at <= o.start_ns()
                      + o.duration_ns()), key=lambda o: o.duration_ns())
    print(f'    forward+backward allocation peak {peak / MiB:.0f} MiB over its start, inside: '
          + ' < '.join(o.name() for o in running[:6]))
print(f'    peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB, torch {torch.__version__}')
