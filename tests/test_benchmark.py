"""benchmarks/throughput.py measures every model registered in vit_pytorch.models.

All registered models run once through the script's own measuring code (`bench_registry`)
at the `--tiny` size, one round of one step per task, and every number it reports for each
must be a positive finite one. No test depends on how fast anything is.
"""

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

from vit_pytorch import ViT
from vit_pytorch.models import MODELS

SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, 'benchmarks', 'throughput.py')


def load_script():
    spec = importlib.util.spec_from_file_location('throughput', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def throughput():
    return load_script()


@pytest.fixture(scope='module')
def tiny_results(throughput):
    """One tiny run of every registered model, as `--registry all --tiny` measures them."""
    threads = torch.get_num_threads()
    args = throughput.parse_args(['--registry', 'all', '--tiny', '--rounds', '1', '--seconds', '0',
                                  '--batches', '1,2', '--train-batch', '2', '--memory', '0', '--threads', '1'])
    torch.set_num_threads(1)
    try:
        result = throughput.bench_registry(args, log=lambda msg: None)
    finally:
        torch.set_num_threads(threads)
    return result


def positive_finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.parametrize('name', list(MODELS))
def test_every_registered_model_gets_positive_finite_speeds_and_flops(tiny_results, name):
    assert name not in tiny_results['failures'], tiny_results['failures'][name]
    assert name in tiny_results['models']
    for task in ('infer@1', 'infer@2', 'train@2'):
        speed = tiny_results['speed'][task][name]
        assert len(speed['rounds']) == 1
        assert all(positive_finite(s) for s in speed['rounds']), (task, speed)
        assert positive_finite(tiny_results['mfu'][task][name]['median'])
    flops = tiny_results['flops_per_image'][name]
    assert positive_finite(flops['forward']) and positive_finite(flops['train_step'])
    # a training step is a forward plus a backward, which costs more than the forward
    assert flops['train_step'] > flops['forward']


def test_a_model_that_fails_to_build_is_reported_and_the_others_are_still_measured(throughput, monkeypatch):
    workload = throughput.registry_workload

    def broken_simple_vit(name, tiny=False):
        if name == 'simple_vit':
            raise ValueError('a broken preset')
        return workload(name, tiny)

    monkeypatch.setattr(throughput, 'registry_workload', broken_simple_vit)
    args = throughput.parse_args(['--registry', 'vit,simple_vit', '--tiny', '--rounds', '1', '--seconds', '0',
                                  '--batches', '1', '--train-batch', '2', '--memory', '0', '--threads', '1'])
    threads = torch.get_num_threads()
    try:
        result = throughput.bench_registry(args, log=lambda msg: None)
    finally:
        torch.set_num_threads(threads)
    assert result['models'] == ['vit'] and positive_finite(result['speed']['train@2']['vit']['median'])
    assert result['failures'] == {'simple_vit': 'ValueError: a broken preset'}
    text = throughput.report(dict(machine=throughput.machine(1, 'wall'), configs=[result]))
    assert '\nsimple_vit not measured: ValueError: a broken preset' in text


def test_every_registered_model_has_a_preset(throughput):
    assert set(throughput.REGISTRY) == set(MODELS)


def test_registry_all_expands_to_every_registered_model(throughput):
    assert throughput.parse_args(['--registry', 'all']).registry == list(MODELS)


def test_registry_replaces_the_default_section_only(throughput):
    assert throughput.parse_args([]).sections == ['throughput']
    assert throughput.parse_args(['--registry', 'cct']).sections == []
    assert throughput.parse_args(['--registry', 'cct', '--sections', 'throughput']).sections == ['throughput']


def test_unknown_registry_name_is_refused(throughput, capsys):
    with pytest.raises(SystemExit):
        throughput.parse_args(['--registry', 'not_a_model'])
    assert 'not_a_model' in capsys.readouterr().err


def test_tiny_report_names_every_model(throughput, tiny_results):
    text = throughput.report(dict(machine=throughput.machine(1, 'wall'), configs=[tiny_results]))
    for name in MODELS:
        assert f'\n{name} ' in text


def test_flops_with_explicit_attention_match_the_plain_reference(throughput):
    # our ViT counted through its explicit path against the script's independent plain-torch
    # ViT of the same size; the fused path would hide the attention matmuls from the counter
    size = dict(image_size=32, patch_size=8, dim=64, depth=2, heads=2, mlp_dim=128)
    ours = ViT(num_classes=throughput.NUM_CLASSES, dim_head=64, patch_norm=False, qkv_bias=True, **size)
    reference = throughput.RefViT(dim_head=64, **size)
    assert throughput.training_flops(ours, 32) == throughput.training_flops(reference, 32)
    tokens, heads, dim_head = 1 + (32 // 8) ** 2, 2, 64
    attention_matmuls = 2 * 2 * tokens * tokens * dim_head * heads * size['depth']     # q k^T and attn v
    with torch.no_grad():
        from torch.utils.flop_counter import FlopCounterMode
        with FlopCounterMode(display=False) as counter:
            ours.eval()(torch.randn(1, 3, 32, 32))
    assert throughput.training_flops(ours, 32)[1] - counter.get_total_flops() == attention_matmuls


@pytest.mark.parametrize('groups', [1, 8])
def test_a_convolutions_backward_counts_twice_its_forward(throughput, groups):
    # grad of the input and grad of the weight each cost a forward, grouped or not (torch's own
    # formula counts a grouped convolution's weight gradient `groups` times over)
    from torch.utils.flop_counter import FlopCounterMode

    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=groups)
    x = torch.randn(1, 8, 6, 6, requires_grad=True)
    with FlopCounterMode(display=False, custom_mapping=throughput.FLOP_FORMULAS) as counter:
        y = conv(x)
    forward = counter.get_total_flops()
    assert forward == 2 * 6 * 6 * 8 * (8 // groups) * 3 * 3
    with FlopCounterMode(display=False, custom_mapping=throughput.FLOP_FORMULAS) as counter:
        y.sum().backward()
    assert counter.get_total_flops() == 2 * forward


def test_distillable_vit_trains_on_the_distillation_loss(throughput):
    # in training mode DeiT returns two logits; cross-entropy alone would fail on them
    workload = throughput.registry_workload('distillable_vit', tiny=True)
    assert isinstance(workload['loss'], throughput.DistillationLoss)
    model = workload['model'].train()
    img = torch.randn(2, workload['channels'], workload['image_size'], workload['image_size'])
    assert isinstance(model(img), tuple)
    loss = workload['loss'](model, img, torch.tensor([0, 1]))
    loss.backward()
    assert loss.ndim == 0 and model.distill_token.grad is not None and model.distill_head.weight.grad is not None


def test_cct_preset_is_the_papers_cifar_model(throughput):
    # CCT-7/3x1 on 32x32 CIFAR-10: 3,760,139 parameters in the reference implementation
    workload = throughput.registry_workload('cct')
    assert (workload['image_size'], workload['num_classes'], workload['params']) == (32, 10, 3_760_139)


def test_memory_child_measures_a_registry_model(throughput):
    threads = torch.get_num_threads()
    try:
        out = throughput.memory_child(dict(registry='distillable_vit', tiny=True, batch=2, threads=1))
    finally:
        torch.set_num_threads(threads)
    assert out['params_mib'] > 0 and out['step_s'] > 0 and math.isfinite(out['peak_increase_mib'])


def test_memory_children_run_with_glibcs_mmap_threshold_fixed(throughput, monkeypatch):
    seen = []

    def run(command, **kwargs):
        seen.append(kwargs.get('env'))
        return subprocess.CompletedProcess(command, 0, stdout='{"peak_increase_mib": 1.0}\n', stderr='')

    monkeypatch.setattr(throughput.subprocess, 'run', run)
    throughput.measure_memory(dict(registry='vit', tiny=True, batch=2, threads=1))
    throughput.measure_memory(dict(registry='vit', tiny=True, batch=2, threads=1, reference=True))
    assert [env['MALLOC_MMAP_THRESHOLD_'] for env in seen] == ['65536', '65536']
    assert all(env['PATH'] == os.environ['PATH'] for env in seen)


GLIBC_RETENTION = """
import torch
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
big = torch.ones(4 * 2 ** 20)             # 16 MiB, mapped: freeing it raises glibc's dynamic threshold to 16 MiB
del big
before = rss()
keep, buffers = [], []
for _ in range(64):
    buffers.append(torch.ones(2 ** 18))   # 1 MiB each, from the heap once the threshold has risen
    keep.append(torch.ones(16))           # a small live tensor after each
del buffers
print(rss() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason="glibc's malloc, /proc/self/status")
def test_in_the_memory_childs_environment_freed_buffers_leave_the_resident_set(throughput):
    # 64 MiB allocated and freed: with glibc's dynamic threshold the heap keeps them resident (64 MiB measured),
    # which made the same live bytes read 1.20x for PVT v2 against timm's; with the child's fixed threshold, ~0
    def retained(env):
        out = subprocess.run([sys.executable, '-c', GLIBC_RETENTION], capture_output=True, text=True, timeout=120,
                             env=env, check=True)
        return float(out.stdout.split()[-1])

    dynamic = {k: v for k, v in os.environ.items() if not k.startswith('MALLOC_')}
    assert retained(dynamic) > 32                       # what the measurement read before the threshold was fixed
    assert retained(throughput.memory_child_env()) < 8


def test_help_exits_zero():
    out = subprocess.run([sys.executable, SCRIPT, '--help'], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert '--registry' in out.stdout


def test_vit_pytorch_reference_is_imported_beside_ours_and_ours_is_put_back(throughput, tmp_path, monkeypatch):
    # a stand-in for vit-pytorch's package: same top-level name, a module importing a sibling absolutely,
    # and an __init__ that must not run (vit-pytorch's imports torchvision)
    source = tmp_path / 'vit_pytorch'
    source.mkdir()
    (source / '__init__.py').write_text("raise ImportError('the reference package __init__ ran')\n")
    (source / 'blocks.py').write_text("WIDTH = 7\n")
    (source / 'toy.py').write_text("from vit_pytorch.blocks import WIDTH\n\ndef width():\n    return WIDTH\n")
    monkeypatch.setenv('VIT_PYTORCH_SOURCE', str(source))
    import vit_pytorch
    import vit_pytorch.vit as our_vit

    toy = throughput.vit_pytorch_module('toy')
    assert toy.width() == 7
    assert sys.modules['vit_pytorch'] is vit_pytorch and sys.modules['vit_pytorch.vit'] is our_vit
    assert 'vit_pytorch.toy' not in sys.modules and 'vit_pytorch.blocks' not in sys.modules
    assert throughput.vit_pytorch_module('absent') is None


def test_vit_pytorch_reference_is_skipped_without_a_source(throughput, monkeypatch):
    monkeypatch.delenv('VIT_PYTORCH_SOURCE', raising=False)
    assert throughput.vit_pytorch_module('deepvit') is None
    workload = throughput.registry_workload('deepvit')
    assert throughput.reference_workload(workload) is None


@pytest.mark.skipif(not os.environ.get('VIT_PYTORCH_SOURCE'), reason='vit-pytorch 1.26.14 source not given')
def test_vit_pytorch_deepvit_reference_computes_our_function(throughput):
    workload = throughput.registry_workload('deepvit')
    reference = throughput.reference_workload(workload)  # checks the logits agree before it returns
    assert reference['params'] == workload['params']


def run_script_in_subprocess(tmp_path, *options):
    """The script's registry run of the tiny ViT in a fresh process (the device options set module-wide
    state); returns its JSON results and its stdout."""
    out = tmp_path / 'results.json'
    done = subprocess.run([sys.executable, SCRIPT, '--registry', 'vit', '--tiny', *options, '--rounds', '1',
                           '--seconds', '0', '--batches', '2', '--train-batch', '2', '--memory', '1', '--threads', '1',
                           '--json', str(out)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), os.pardir)))
    assert done.returncode == 0, done.stderr[-2000:]
    import json
    return json.loads(out.read_text()), done.stdout


def test_bf16_runs_on_the_cpu_path(tmp_path):
    # an option of the GPU run (`--device cuda --bf16`), on the CPU; the memory child gets it too
    result, stdout = run_script_in_subprocess(tmp_path, '--bf16')
    assert 'bf16 autocast' in stdout
    assert result['machine']['bf16'] and not result['machine']['compile'] and result['machine']['gpu'] is None
    assert positive_finite(result['configs'][0]['speed']['train@2']['vit']['median'])
    assert positive_finite(result['configs'][0]['memory']['vit']['median'])


@pytest.mark.slow
def test_bf16_and_compile_run_on_the_cpu_path(tmp_path):
    result, stdout = run_script_in_subprocess(tmp_path, '--bf16', '--compile')
    assert 'bf16 autocast, compiled' in stdout and result['machine']['compile']
    assert positive_finite(result['configs'][0]['speed']['train@2']['vit']['median'])


def test_cpu_clock_with_cuda_is_refused(throughput, capsys):
    with pytest.raises(SystemExit):
        throughput.parse_args(['--device', 'cuda', '--clock', 'cpu'])
    assert 'wall clock' in capsys.readouterr().err
