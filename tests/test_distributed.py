"""The core models under PyTorch's distributed engines, two CPU processes on gloo.

Each rank trains on its half of a global batch; the gradients and parameters after a few
steps must equal those of one process training on the whole batch. DDP with its defaults
(find_unused_parameters=False, broadcast_buffers=True) also fails if a forward leaves any
parameter unused, which is part of what is tested.
"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from helpers import tiny_vit_kwargs
from vit_pytorch import SimpleViT, ViT

WORLD_SIZE, GLOBAL_BATCH, STEPS = 2, 8, 3

MODELS = {
    'vit_cls': lambda: ViT(**tiny_vit_kwargs()),
    # mean pooling keeps a (0, dim) cls_token parameter, which must not upset the engines
    'vit_mean_paper': lambda: ViT(**tiny_vit_kwargs(pool='mean', patch_norm=False, qkv_bias=True, norm_eps=1e-6)),
    # SimpleViT's position table is a (non-persistent) buffer, which DDP broadcasts
    'simple_vit': lambda: SimpleViT(**tiny_vit_kwargs()),
}


def global_batch():
    generator = torch.Generator().manual_seed(123)
    img = torch.randn(GLOBAL_BATCH, 3, *tiny_vit_kwargs()['image_size'], generator=generator)
    labels = torch.randint(0, tiny_vit_kwargs()['num_classes'], (GLOBAL_BATCH,), generator=generator)
    return img, labels


def train(model, img, labels, full_tensor=lambda t: t):
    """STEPS of SGD with momentum; the first step's gradients and the final parameters."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    first_grads = None
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(img), labels).backward()
        if first_grads is None:
            first_grads = {name: full_tensor(p.grad).detach().clone() for name, p in model.named_parameters()}
        optimizer.step()
    params = {name: full_tensor(p).detach().clone() for name, p in model.named_parameters()}
    return first_grads, params


def gather(tensor):
    """The whole tensor from an FSDP2 shard (a DTensor); an ignored parameter is whole already."""
    return tensor.full_tensor() if hasattr(tensor, 'full_tensor') else tensor


def fresh(name):
    torch.manual_seed(0)
    return MODELS[name]()


def worker(rank, engine, store, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=f'file://{store}', rank=rank, world_size=WORLD_SIZE)
    try:
        img, labels = global_batch()
        local = slice(rank * GLOBAL_BATCH // WORLD_SIZE, (rank + 1) * GLOBAL_BATCH // WORLD_SIZE)
        results = {}
        for name in MODELS:
            model = fresh(name)
            if engine == 'ddp':
                from torch.nn.parallel import DistributedDataParallel
                wrapped = DistributedDataParallel(model)
                grads, params = train(wrapped, img[local], labels[local])
                strip = len('module.')
                grads = {k[strip:]: v for k, v in grads.items()}
                params = {k[strip:]: v for k, v in params.items()}
            else:
                from torch.distributed.fsdp import fully_shard
                # each layer is a ModuleList (attention, feedforward) without a forward of its own
                for attn, ff in model.transformer.layers:
                    fully_shard(attn)
                    fully_shard(ff)
                fully_shard(model)
                grads, params = train(model, img[local], labels[local], full_tensor=gather)
            results[name] = dict(grads=grads, params=params)
        torch.save(results, os.path.join(out_dir, f'rank{rank}.pt'))
    finally:
        dist.destroy_process_group()


def run_two_processes(engine, tmp_path):
    mp.spawn(worker, args=(engine, str(tmp_path / 'store'), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    return [torch.load(tmp_path / f'rank{rank}.pt', weights_only=True) for rank in range(WORLD_SIZE)]


@pytest.fixture(scope='module')
def ddp_results(tmp_path_factory):
    return run_two_processes('ddp', tmp_path_factory.mktemp('ddp'))


@pytest.fixture(scope='module')
def fsdp_results(tmp_path_factory):
    return run_two_processes('fsdp', tmp_path_factory.mktemp('fsdp'))


@pytest.fixture(scope='module')
def single_process_results():
    img, labels = global_batch()
    results = {}
    for name in MODELS:
        grads, params = train(fresh(name), img, labels)
        results[name] = dict(grads=grads, params=params)
    return results


def assert_same_training(actual, expected):
    for what in ('grads', 'params'):
        assert actual[what].keys() == expected[what].keys()
        for key in expected[what]:
            torch.testing.assert_close(actual[what][key], expected[what][key], rtol=1e-5, atol=1e-6,
                                       msg=f'{what} {key}')


@pytest.mark.parametrize('name', list(MODELS))
def test_ddp_two_processes_train_like_one_process_on_the_global_batch(name, ddp_results, single_process_results):
    for rank_results in ddp_results:
        assert_same_training(rank_results[name], single_process_results[name])


@pytest.mark.parametrize('name', list(MODELS))
def test_fsdp_two_processes_train_like_one_process_on_the_global_batch(name, fsdp_results, single_process_results):
    for rank_results in fsdp_results:
        assert_same_training(rank_results[name], single_process_results[name])
