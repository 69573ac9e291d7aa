"""What one training step of a registry model allocates, ours or its reference's (benchmarks/throughput.py's
preset, AdamW, one thread): the tensors autograd saves in the forward, and from torch.profiler's allocation events
of the second step the peak of allocated bytes over the step's start, the op running at that peak, and the ops
that allocate and free most. Unlike the peak RSS (`throughput.py --memory`), this does not depend on how the C
allocator lays out its heap.

    PYTHONPATH=. VIT_PYTORCH_SOURCE=vit_pytorch-1.26.14-py3-none-any.whl python benchmarks/step_allocations.py wwt ours
    ... step_allocations.py wwt ref

usage: step_allocations.py NAME ours|ref [batch [timeline.json]]"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import throughput as T
from torch.profiler import profile, ProfilerActivity

name, which = sys.argv[1], sys.argv[2]
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 8
torch.set_num_threads(1); torch.manual_seed(0)
w = T.registry_workload(name)
r = T.reference_workload(w)
w = r if which == 'ref' else w
model, loss = w['model'].train(), w['loss']
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
img = torch.randn(batch, w['channels'], *T.input_dims(w['image_size']))
label = torch.randint(0, w['num_classes'], (batch,))
def step():
    opt.zero_grad(set_to_none=True)
    l = loss(model, img, label); l.backward(); opt.step()
step()
# saved tensors in forward
saved = {}
def pack(t):
    saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes(); return t
opt.zero_grad(set_to_none=True)
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    l = loss(model, img, label)
l.backward(); del l
opt.zero_grad(set_to_none=True)
with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
    step()
kev = prof.profiler.kineto_results.events()
mem = sorted([e for e in kev if e.name() == '[memory]'], key=lambda e: e.start_ns())
ops = [e for e in kev if e.name() != '[memory]']
cur = peak = 0; tpeak = None
for e in mem:
    cur += e.nbytes()
    if cur > peak: peak, tpeak = cur, e.start_ns()
enc = [o for o in ops if o.start_ns() <= tpeak <= o.start_ns() + o.duration_ns()]
enc.sort(key=lambda o: o.duration_ns())
print(f'{name} {which}: saved {sum(saved.values())/2**20:.1f} MiB; step alloc peak {peak/2**20:.1f} MiB '
      f'(over the step start, grads set_to_none); total allocated {sum(e.nbytes() for e in mem if e.nbytes()>0)/2**20:.1f} MiB '
      f'in {sum(1 for e in mem if e.nbytes()>0)} buffers')
print('  at peak inside:', ' < '.join(o.name() for o in enc[:8]))
ka = prof.key_averages()
rows = sorted(ka, key=lambda k: -k.self_cpu_memory_usage)[:12]
print('  top self CPU mem ops:')
for k in rows:
    print(f'    {k.key:40s} self {k.self_cpu_memory_usage/2**20:8.1f} MiB  calls {k.count}')
rows = sorted(ka, key=lambda k: k.self_cpu_memory_usage)[:6]
print('  top freeing ops:')
for k in rows:
    print(f'    {k.key:40s} self {k.self_cpu_memory_usage/2**20:8.1f} MiB  calls {k.count}')
if len(sys.argv) > 4:
    # timeline: running allocation, sampled at op boundaries of top-level ops
    out = []
    cur = 0
    for e in mem:
        cur += e.nbytes(); out.append((e.start_ns(), cur))
    json.dump(out, open(sys.argv[4], 'w'))
