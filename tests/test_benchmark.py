"""benchmarks/throughput.py measures every model registered in vit_pytorch.models.

Registered models run once through the script's own measuring code (`bench_registry`) at the `--tiny` size, one round
of one step per task, and every number it reports for each must be a positive finite one. The default run takes one
model of each kind of workload the script builds (SAMPLE); `pytest -m slow` takes every registered model (about a
minute). No test depends on how fast anything is.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch

from helpers import load_script
from vit_pytorch import ViT
from vit_pytorch.models import AUX_LOSSES, INPUTS, MODELS

SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, 'benchmarks', 'throughput.py')


def load_throughput():
    return load_script(SCRIPT, 'throughput')


@pytest.fixture(scope='module')
def throughput():
    return load_throughput()


# one model of each workload `registry_workload` builds: images, a distillation loss, a multi-scale model, packed
# images, signals, clips, an N-D input shape, an auxiliary loss, an extra input; and a model with no reference
SAMPLE = ('vit', 'distillable_vit', 'swin', 'na_vit', 'vit_1d', 'vivit', 'vit_nd', 'vit_with_decorr', 'vit_detpool',
          'simple_vit_with_qk_norm')


def tiny_run(throughput, registry):
    """One tiny run of the models `registry` names, as `--registry <registry> --tiny` measures them."""
    threads = torch.get_num_threads()
    args = throughput.parse_args(['--registry', registry, '--tiny', '--rounds', '1', '--seconds', '0',
                                  '--batches', '1,2', '--train-batch', '2', '--memory', '0', '--threads', '1'])
    torch.set_num_threads(1)
    try:
        result = throughput.bench_registry(args, log=lambda msg: None)
    finally:
        torch.set_num_threads(threads)
    return result


@pytest.fixture(scope='module')
def tiny_results(throughput):
    """One tiny run of every registered model, as `--registry all --tiny` measures them."""
    return tiny_run(throughput, 'all')


@pytest.fixture(scope='module')
def sample_results(throughput):
    """One tiny run of SAMPLE."""
    return tiny_run(throughput, ','.join(SAMPLE))


def positive_finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def check_measured(results, name):
    assert name not in results['failures'], results['failures'][name]
    assert name in results['models']
    for task in ('infer@1', 'infer@2', 'train@2'):
        speed = results['speed'][task][name]
        assert len(speed['rounds']) == 1
        assert all(positive_finite(s) for s in speed['rounds']), (task, speed)
        assert positive_finite(results['mfu'][task][name]['median'])
    flops = results['flops_per_image'][name]
    assert positive_finite(flops['forward']) and positive_finite(flops['train_step'])
    # a training step is a forward plus a backward, which costs more than the forward
    assert flops['train_step'] > flops['forward']


def test_the_sample_holds_registered_models_of_every_workload_kind():
    assert set(SAMPLE) <= set(MODELS)
    assert {'signals', 'clips'} <= {INPUTS.get(name, 'images').split()[0] for name in SAMPLE}
    assert set(SAMPLE) & set(AUX_LOSSES)


@pytest.mark.parametrize('name', SAMPLE)
def test_a_model_of_each_workload_gets_positive_finite_speeds_and_flops(sample_results, name):
    check_measured(sample_results, name)


@pytest.mark.slow
@pytest.mark.parametrize('name', list(MODELS))
def test_every_registered_model_gets_positive_finite_speeds_and_flops(tiny_results, name):
    check_measured(tiny_results, name)


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


def test_registry_all_expands_to_every_registered_model_each_followed_by_its_variant_rows(throughput):
    expanded = throughput.parse_args(['--registry', 'all']).registry
    assert [name for name in expanded if name not in throughput.VARIANTS] == list(MODELS)
    for name, variant in throughput.VARIANTS.items():
        assert expanded.index(name) > expanded.index(variant['model'])
        assert all(n in throughput.VARIANTS for n in expanded[expanded.index(variant['model']) + 1:expanded.index(name)])


def test_registry_replaces_the_default_section_only(throughput):
    assert throughput.parse_args([]).sections == ['throughput']
    assert throughput.parse_args(['--registry', 'cct']).sections == []
    assert throughput.parse_args(['--registry', 'cct', '--sections', 'throughput']).sections == ['throughput']


def test_unknown_registry_name_is_refused(throughput, capsys):
    with pytest.raises(SystemExit):
        throughput.parse_args(['--registry', 'not_a_model'])
    assert 'not_a_model' in capsys.readouterr().err


def test_tiny_report_names_every_sampled_model(throughput, sample_results):
    text = throughput.report(dict(machine=throughput.machine(1, 'wall'), configs=[sample_results]))
    for name in SAMPLE:
        assert f'\n{name} ' in text


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec('timm') is None, reason='timm not installed')
def test_distillable_vit_and_timms_distilled_deit_train_on_one_loss(throughput):
    # the reference (timm's VisionTransformerDistilled, our weights loaded) takes the same distillation loss as
    # ours: the same loss value and the same gradient of the distillation token on the same weights and batch
    workload = throughput.registry_workload('distillable_vit')
    reference = throughput.reference_workload(workload)
    img, labels = torch.randn(2, 3, 224, 224), torch.tensor([0, 1])
    losses, grads = [], []
    for w, token in ((workload, 'distill_token'), (reference, 'dist_token')):
        model = w['model'].train()
        loss = w['loss'](model, img, labels)
        loss.backward()
        losses.append(loss.detach())
        grads.append(dict(model.named_parameters())[token].grad.flatten())
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-4)


# vit-pytorch 1.26.14's own count, not ours: sum(p.numel() for p in cct_7(img_size=32, kernel_size=3, n_conv_layers=1,
# num_classes=10, positional_embedding='learnable').parameters()) with vit-pytorch 1.26.14's cct_7 (/work/ref/refvenv,
# torch 2.14.1), run from /tmp so that vit_pytorch was the installed reference
VIT_PYTORCH_CCT_7_3X1_PARAMS = 3_760_139


def test_cct_preset_is_the_papers_cifar_model(throughput):
    # CCT-7/3x1 on 32x32 CIFAR-10, as many parameters as the reference implementation's
    workload = throughput.registry_workload('cct')
    assert (workload['image_size'], workload['num_classes'], workload['params']) == (32, 10, VIT_PYTORCH_CCT_7_3X1_PARAMS)


def test_cct_is_timed_against_vit_pytorchs_cct_7(throughput):
    assert throughput.REFERENCES['cct'][0] == 'vit-pytorch 1.26.14 cct.cct_7' and 'cct' not in throughput.NO_REFERENCE


@pytest.mark.skipif(not os.environ.get('VIT_PYTORCH_SOURCE'), reason='vit-pytorch 1.26.14 source not given')
def test_vit_pytorch_cct_7_reference_computes_our_function_with_its_parameter_count(throughput):
    workload = throughput.registry_workload('cct')
    reference = throughput.reference_workload(workload)  # checks the logits agree before it returns
    assert reference['preset'] == 'vit-pytorch 1.26.14 cct.cct_7'
    assert reference['params'] == VIT_PYTORCH_CCT_7_3X1_PARAMS == workload['params']


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


@pytest.mark.parametrize('script', ['make_sep_vit_fixtures', 'make_scalable_vit_fixtures',
                                    'make_crossformer_fixtures'])
def test_the_official_references_fixture_scripts_import_from_the_benchmark(throughput, script, monkeypatch):
    # the official references are built by the fixture scripts' functions; the scripts import their sibling
    # fixture_tools, which is on the import path when they run as scripts but not when the benchmark loads them
    monkeypatch.setattr(sys, 'path', [p for p in sys.path if os.path.basename(p.rstrip(os.sep)) != 'fixtures'])
    monkeypatch.delitem(sys.modules, 'fixture_tools', raising=False)
    path = list(sys.path)
    fixtures = throughput.fixture_script(script)
    assert hasattr(fixtures, 'official_model') or hasattr(fixtures, 'official_module')
    assert sys.path == path


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get('VIT_PYTORCH_SOURCE'), reason='vit-pytorch 1.26.14 source not given')
def test_the_nested_tensor_navit_reference_is_timed_though_the_flop_counter_cannot_run_it(throughput):
    # torch's FLOP counter raises on vit-pytorch's jagged nested tensors; the reference still gets its row
    args = throughput.parse_args(['--registry', 'na_vit_nested_tensor', '--rounds', '1', '--seconds', '0',
                                  '--batches', '1', '--train-batch', '2', '--memory', '0', '--threads', '1'])
    threads = torch.get_num_threads()
    try:
        result = throughput.bench_registry(args, log=lambda msg: None)
    finally:
        torch.set_num_threads(threads)
    assert 'na_vit_nested_tensor' not in result['references'], result['references']
    ratios = result['ratios']['na_vit_nested_tensor/na_vit_nested_tensor:ref']
    assert all(positive_finite(ratios[task]['median']) for task in ('infer@1', 'train@2'))


# the official T2T-ViT_t-14's parameter count (tests/test_t2t_official.py: all its parameters, and the trainable
# ones, which ours has; its position table is a frozen parameter there, a buffer here)
T2T_T_14_OFFICIAL_COUNTS = (21_541_070, 21_465_422)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get('VIT_PYTORCH_OFFICIAL'), reason='official checkouts not given')
def test_the_official_t2t_reference_computes_our_function(throughput):
    workload = throughput.registry_workload('t2t')
    reference = throughput.reference_workload(workload)     # checks the logits agree before it returns
    official = reference['model']
    assert reference['params'] == T2T_T_14_OFFICIAL_COUNTS[0]
    trainable = sum(p.numel() for p in official.parameters() if p.requires_grad)
    assert trainable == workload['params'] == T2T_T_14_OFFICIAL_COUNTS[1]
    img = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = official.eval()(img)
        ours = workload['model'].eval()(img)
    assert theirs.std() > 0.1                                # logits far from 0, so the tolerance below means something
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_the_official_t2t_reference_is_skipped_without_the_checkouts(throughput, monkeypatch):
    monkeypatch.delenv('VIT_PYTORCH_OFFICIAL', raising=False)
    assert throughput.reference_workload(throughput.registry_workload('t2t')) is None
    assert 't2t' in throughput.REFERENCES and 't2t' not in throughput.NO_REFERENCE


# the official LocalViT-S at act 'hs' (LocalVisionTransformer, width 384, depth 12, MLP 1536) has ours' parameters
# but for each locality feed-forward's three BatchNorms (weight and bias) where ours has three convolution biases:
# 2 * (1536 + 1536 + 384) against 1536 + 1536 + 384, 3,456 more a layer
LOCAL_VIT_BATCHNORM_EXCESS = 12 * (1536 + 1536 + 384)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get('VIT_PYTORCH_OFFICIAL'), reason='official checkouts not given')
def test_the_official_local_vit_reference_computes_our_function(throughput):
    workload = throughput.registry_workload('local_vit')
    reference = throughput.reference_workload(workload)     # checks the logits agree before it returns
    official, ours = reference['model'], workload['model']
    assert reference['params'] - workload['params'] == LOCAL_VIT_BATCHNORM_EXCESS
    # at initialisation every BatchNorm is (0, 1) with unit scale and the folds barely move a weight: off it, with
    # running statistics off (0, 1), the folded weights must carry the official model's function
    # (in float64: the folds, one rounding of s W, and the order of sums differ, which float32 shows at 1e-4 after
    # 12 layers of perturbed weights; float64 leaves the map's own errors alone)
    throughput.fixture_script('fixture_tools').perturb(official, 0.1, 0, batchnorm_statistics=True)
    official, ours = official.double().eval(), ours.double().eval()
    ours.load_state_dict(throughput.local_vit_official_to_ours(official.state_dict(), 12), strict=True)
    img = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        theirs, mine = official(img), ours(img)
    assert theirs.std() > 0.1                                # logits far from 0, so the tolerance below means something
    torch.testing.assert_close(mine, theirs, atol=1e-9, rtol=0)


def test_the_official_local_vit_reference_is_skipped_without_the_checkouts(throughput, monkeypatch):
    monkeypatch.delenv('VIT_PYTORCH_OFFICIAL', raising=False)
    assert throughput.reference_workload(throughput.registry_workload('local_vit')) is None
    assert 'local_vit' in throughput.REFERENCES and 'local_vit' not in throughput.NO_REFERENCE

def test_every_registered_model_has_a_reference_or_says_why_it_has_none(throughput):
    # the table's reference cell reads one or the other (the slow whole-registry run checks every cell)
    assert set(MODELS) <= set(throughput.REFERENCES) | set(throughput.NO_REFERENCE)


def test_no_model_with_a_reference_also_says_why_it_has_none(throughput):
    # a NO_REFERENCE reason is read only where REFERENCES has no entry: one beside an entry is a stale statement
    assert not set(throughput.NO_REFERENCE) & set(throughput.REFERENCES)

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


@pytest.mark.skipif(not os.environ.get('VIT_PYTORCH_SOURCE'), reason='vit-pytorch 1.26.14 source not given')
def test_vit_pytorch_jumbo_reference_has_our_widths(throughput):
    # vit-pytorch's JumboViT computes another function (its checkpoints are refused), so it is timed with its own
    # weights; given multipliers, its feed-forwards are ours: the parameters differ by what differs by design alone,
    # our head on the whole jumbo token and the patch mean ((6 + 1) * 384 inputs, vit-pytorch's on 384) and our
    # jumbo LayerNorm in each of the 12 layers (vit-pytorch's one, shared)
    workload = throughput.registry_workload('jumbo_vit')
    reference = throughput.reference_workload(workload)
    dim, k, classes, depth = 384, 6, 1000, 12
    head = (k + 1) * dim * classes - dim * classes
    norms = (depth - 1) * 2 * k * dim
    assert workload['params'] - reference['params'] == head + norms


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


# the registry table (`--markdown`, `--markdown-from`)


def as_run(result, command):
    """A registry result as the script's --json file holds it."""
    return dict(command=command, date='2026-12-02T00:00:00+00:00', machine=dict(cpu='test', threads=1, clock='cpu'),
                load_average=dict(start=[1.0, 1.0, 1.0], end=[2.0, 2.0, 2.0]), configs=[result])


def table_rows(text):
    """model name -> the cells of its markdown row."""
    rows = {}
    for line in text.splitlines():
        if line.startswith('| `'):
            cells = [c.strip() for c in line.strip('|').split('|')]
            name = cells[0].strip('`')
            assert name not in rows, f'{name} has two rows'
            rows[name] = cells[1:]
    return rows


def test_the_markdown_table_has_a_row_for_every_registered_model_measured_or_not(throughput, sample_results):
    rows = table_rows(throughput.markdown_table(throughput.registry_table(as_run(sample_results, 'A'))))
    assert set(rows) == set(MODELS) | set(throughput.VARIANTS)
    for name, cells in rows.items():
        if name in SAMPLE:
            assert cells[0] == 'tiny' and 'not measured' not in ' '.join(cells), (name, cells)
        else:
            assert cells[1] == 'not measured in these runs', (name, cells)


@pytest.mark.slow
def test_the_markdown_table_has_a_measured_row_for_every_registered_model(throughput, tiny_results):
    rows = table_rows(throughput.markdown_table(throughput.registry_table(as_run(tiny_results, 'A'))))
    assert set(rows) == set(MODELS) | set(throughput.VARIANTS)
    for name, cells in rows.items():
        assert cells[0] == 'tiny' and 'not measured' not in ' '.join(cells), (name, cells)


def test_a_model_missing_from_the_runs_is_a_row_saying_so(throughput, sample_results):
    table = throughput.registry_table(as_run(sample_results, 'A'))
    del table['rows']['swin']
    rows = table_rows(throughput.markdown_table(table))
    assert rows['swin'][1] == 'not measured in these runs' and rows['swin'][-2] == 'not measured'


def check_references_stated(throughput, results, names):
    header = ['preset', 'reference', 'infer@1', 'infer@2', 'train@2']
    rows = table_rows(throughput.markdown_table(throughput.registry_table(as_run(results, 'A'))))
    for name in names:
        cells = rows[name]
        reference = dict(zip(header, cells))['reference']
        if name in throughput.REFERENCES:       # references run at their preset only
            assert reference == 'not run: references run at the preset, not --tiny', (name, reference)
        else:                                    # none exists: the row says why
            assert reference == f'none: {throughput.NO_REFERENCE[name]}', (name, reference)


def test_every_missing_reference_of_the_sample_is_stated(throughput, sample_results):
    assert set(SAMPLE) & set(throughput.NO_REFERENCE) and set(SAMPLE) & set(throughput.REFERENCES)
    check_references_stated(throughput, sample_results, SAMPLE)


@pytest.mark.slow
def test_every_missing_reference_is_stated(throughput, tiny_results):
    check_references_stated(throughput, tiny_results, MODELS)


def test_an_uninstalled_reference_says_what_it_needs(throughput, monkeypatch):
    monkeypatch.delenv('VIT_PYTORCH_SOURCE', raising=False)
    reference, why = throughput.try_reference(throughput.registry_workload('deepvit'), tiny=False)
    assert reference is None and why.startswith('not installed: vit-pytorch 1.26.14 deepvit.DeepViT needs')
    assert '$VIT_PYTORCH_SOURCE' in why


def test_a_failing_reference_is_stated_and_the_others_are_still_measured(throughput, monkeypatch):
    def disagrees(workload):
        raise AssertionError('Tensor-likes are not close!')

    monkeypatch.setattr(throughput, 'reference_workload', disagrees)
    reference, why = throughput.try_reference(throughput.registry_workload('vit', tiny=True), tiny=False)
    assert reference is None and why == 'failed: AssertionError: Tensor-likes are not close!'


def test_merging_keeps_the_later_runs_rows(throughput, sample_results, tmp_path):
    later = tiny_run(throughput, 'vit,swin')
    first, second = tmp_path / 'all.json', tmp_path / 'two.json'
    first.write_text(json.dumps(as_run(sample_results, 'the whole registry')))
    second.write_text(json.dumps(as_run(later, 'vit and swin again')))
    merged_md, merged_json, again_md = tmp_path / 'merged.md', tmp_path / 'merged.json', tmp_path / 'again.md'
    assert throughput.main(['--markdown-from', str(first), str(second), '--markdown', str(merged_md),
                            '--json', str(merged_json)]) == 0
    table = json.loads(merged_json.read_text())['registry_table']
    assert [run['command'] for run in table['runs']] == ['the whole registry', 'vit and swin again']
    for name in SAMPLE:
        source, command = (later, 'vit and swin again') if name in ('vit', 'swin') else (sample_results, 'the whole registry')
        assert table['runs'][table['rows'][name]['run']]['command'] == command
        assert table['rows'][name]['speed']['train@2']['ours'] == source['speed']['train@2'][name]
    rows = table_rows(merged_md.read_text())
    assert rows['vit'][-1] == rows['swin'][-1] == '2' and rows['vivit'][-1] == '1'
    # the merged JSON merges again, and the markdown comes out the same
    assert throughput.main(['--markdown-from', str(merged_json), '--markdown', str(again_md)]) == 0
    assert again_md.read_text() == merged_md.read_text()
    # in the other order the whole run wins everywhere and the superseded run is dropped
    reverse = throughput.merge_tables([throughput.registry_table(as_run(later, 'B')),
                                       throughput.registry_table(as_run(sample_results, 'A'))])
    assert [run['command'] for run in reverse['runs']] == ['A']
    assert reverse['rows']['vit']['speed']['train@2']['ours'] == sample_results['speed']['train@2']['vit']


def ratio_row(ratios, memory=None, failure=None):
    return dict(failure=failure, ratios={task: dict(median=m, min=lo, max=hi) for task, (m, lo, hi) in ratios.items()},
                memory_ratio=None if memory is None else dict(median=memory[0], min=memory[1], max=memory[2]))


def test_the_verdict_reads_the_ratios_and_their_spread(throughput, monkeypatch):
    monkeypatch.setattr(throughput, 'BELOW_EXPLAINED', {'swin': 'performance.md#swin'})
    at_least = ratio_row({'infer@1': (1.00, 0.95, 1.10), 'train@8': (1.03, 1.01, 1.05)}, memory=(0.99, 0.99, 0.99))
    assert throughput.verdict('vit', at_least) == '>= 1.0'
    parity = ratio_row({'infer@1': (0.97, 0.90, 1.02), 'train@8': (1.03, 1.01, 1.05)}, memory=(1.01, 0.98, 1.03))
    assert throughput.verdict('vit', parity) == 'parity (spread includes 1.0)'
    below = ratio_row({'infer@1': (0.97, 0.90, 1.02), 'train@8': (0.94, 0.90, 0.99)}, memory=(1.07, 1.07, 1.07))
    assert throughput.verdict('swin', below) == 'below (train@8 0.94, memory 1.07): see [performance.md#swin](performance.md#swin)'
    assert throughput.verdict('cait', below) == 'below (train@8 0.94, memory 1.07): not explained yet'
    assert throughput.verdict('t2t', ratio_row({})) == '-'
    assert throughput.verdict('vit', ratio_row({}, failure='ValueError: x')) == 'not measured'


def test_the_verdict_reads_the_ratios_as_printed(throughput):
    # 1066 / 1062 MiB = 1.004 in one memory run is printed 1.00: at parity with the reference, not a miss (it read
    # 'below (memory 1.00)'); a speed ratio of 0.996 in every round is printed 1.00 (it read 'below (infer@1 1.00)')
    speed = {'infer@1': (1.02, 1.01, 1.05)}
    assert throughput.verdict('swin', ratio_row(speed, memory=(1066 / 1062,) * 3)) == '>= 1.0'
    assert throughput.verdict('vit', ratio_row({'infer@1': (0.996, 0.995, 0.997)})) == '>= 1.0'
    assert throughput.verdict('vit', ratio_row({'infer@1': (0.994, 0.990, 0.994)})) == \
        'below (infer@1 0.99): not explained yet'


def test_a_memory_ratio_is_below_only_when_its_whole_spread_is_above_one(throughput):
    speed = {'infer@1': (1.02, 1.01, 1.05)}
    # over three memory runs: 1.03 with 1.00 (as printed) within the spread is parity, 1.03 (1.02-1.05) below
    assert throughput.verdict('vit', ratio_row(speed, memory=(1.03, 1.004, 1.05))) == 'parity (spread includes 1.0)'
    assert throughput.verdict('vit', ratio_row(speed, memory=(1.03, 0.98, 1.05))) == 'parity (spread includes 1.0)'
    assert throughput.verdict('vit', ratio_row(speed, memory=(1.03, 1.02, 1.05))) == \
        'below (memory 1.03): not explained yet'


def test_budget_is_the_tables_settings_and_given_options_replace_them(throughput):
    args = throughput.parse_args(['--budget'])
    assert (args.registry, args.batches, args.train_batch, args.rounds, args.memory, args.threads, args.clock) == (
        throughput.table_names(), [1, 8], 8, 3, 3, 1, 'cpu')
    args = throughput.parse_args(['--budget', '--registry', 'swin,levit', '--rounds', '5'])
    assert (args.registry, args.rounds, args.batches) == (['swin', 'levit'], 5, [1, 8])


def test_shards_split_the_registry_into_disjoint_slices_that_cover_it(throughput):
    shards = [throughput.parse_args(['--registry', 'all', '--shard', f'{k}/3']).registry for k in (1, 2, 3)]
    rows = throughput.table_names()
    assert sorted(sum(shards, [])) == sorted(rows) and sum(map(len, shards)) == len(rows)
    assert shards[0][:2] == rows[0:4:3]


@pytest.mark.parametrize('spec', ['0/2', '3/2', 'half'])
def test_a_bad_shard_is_refused(throughput, capsys, spec):
    with pytest.raises(SystemExit):
        throughput.parse_args(['--registry', 'all', '--shard', spec])
    assert '--shard' in capsys.readouterr().err


# one model and its reference at a time


def test_each_pair_is_freed_before_the_next_is_built(throughput, monkeypatch):
    # a whole-registry run kept every model, its AdamW state and gradients until the end (OOM-killed at 17.9 GB):
    # when the next model is built, the models built before it must be gone
    import gc
    import weakref

    workload, built, alive_at_build = throughput.registry_workload, [], []

    def tracked(name, tiny=False):
        gc.collect()
        alive_at_build.append([w() is not None for w in built])
        result = workload(name, tiny)
        built.append(weakref.ref(result['model']))
        return result

    monkeypatch.setattr(throughput, 'registry_workload', tracked)
    result = tiny_run(throughput, 'vit,simple_vit,cait')
    assert result['models'] == ['vit', 'simple_vit', 'cait']
    # none of the models built before is alive when the next one is built
    assert alive_at_build == [[], [False], [False, False]]


def test_memory_runs_alternate_and_give_the_ratio_a_spread(throughput, monkeypatch):
    # three memory runs each, ours and the reference's alternating (run i of each a pair in time); the table's
    # memory ratio is the per-run ratio's median and spread, which the verdict reads
    def as_reference(workload):
        return dict(workload, name=f"{workload['name']}:ref", preset='a stand-in reference',
                    model=throughput.copy.deepcopy(workload['model']))

    monkeypatch.setattr(throughput, 'try_reference', lambda workload, tiny: (as_reference(workload), None))
    seen, mib = [], iter([100., 99., 103., 100., 104., 100.])

    def measure(spec):
        seen.append((spec['registry'], spec['reference']))
        return dict(peak_increase_mib=next(mib))

    monkeypatch.setattr(throughput, 'measure_memory', measure)
    args = throughput.parse_args(['--registry', 'vit', '--tiny', '--rounds', '1', '--seconds', '0', '--batches', '1',
                                  '--train-batch', '2', '--memory', '3', '--threads', '1'])
    threads = torch.get_num_threads()
    try:
        result = throughput.bench_registry(args, log=lambda msg: None)
    finally:
        torch.set_num_threads(threads)
    assert seen == [('vit', False), ('vit', True)] * 3
    assert result['memory']['vit']['rounds'] == [100., 103., 104.]
    assert result['memory']['vit:ref']['rounds'] == [99., 100., 100.]
    row = throughput.registry_table(as_run(result, 'A'))['rows']['vit']
    assert row['memory_ratio']['rounds'] == pytest.approx([100 / 99, 1.03, 1.04])
    assert throughput.verdict('vit', dict(row, ratios={'train@2': dict(median=1.0, min=1.0, max=1.0)})) == \
        'below (memory 1.03): not explained yet'
    assert '| 103 / 100 = 1.03 (1.01-1.04) |' in throughput.markdown_table(throughput.registry_table(as_run(result, 'A')))


# variant rows: the paper's decorrelation matrices (`vit_with_decorr:paper`) beside vit-pytorch's method

PAPER_DECORR = 'vit_with_decorr:paper'
DOCS = os.path.join(os.path.dirname(__file__), os.pardir, 'docs')


def decorrelation_weights(model):
    return {name: buffer.clone() for name, buffer in model.named_buffers() if name.endswith('decorrelation.weight')}


@pytest.mark.parametrize('after_step', [True, False])
def test_the_papers_decorrelation_row_trains_as_the_training_loop_does(throughput, after_step):
    # the training loop's order (vit_pytorch.training.loop.train_epoch): cross-entropy, backward, the optimizer's
    # step, then every matrix's own step from that forward's rows; the row's Runner must take the same step
    workload = throughput.registry_workload(PAPER_DECORR, tiny=True)
    by_hand = throughput.copy.deepcopy(workload['model'])
    runner = throughput.Runner(workload['model'], workload['image_size'], [2], 2, channels=workload['channels'],
                               num_classes=workload['num_classes'], loss=workload['loss'],
                               after_step=workload['after_step'] if after_step else None)
    runner.train(2)
    by_hand.train()
    optimizer = torch.optim.AdamW(by_hand.parameters(), lr=1e-5)
    torch.nn.functional.cross_entropy(by_hand(runner.images[2]), runner.labels).backward()
    optimizer.step()
    by_hand.update_decorrelation_()
    ours, expected = decorrelation_weights(workload['model']), decorrelation_weights(by_hand)
    # a matrix before every Linear of the encoder: the patch projection and 4 in each layer
    assert len(ours) == len(expected) == 1 + 4 * len(by_hand.transformer.layers)
    moved = [name for name, weight in expected.items() if not torch.equal(weight, torch.eye(len(weight)))]
    assert moved == list(expected)                      # the rule moved every matrix off the identity
    if after_step:
        for name, weight in expected.items():
            torch.testing.assert_close(ours[name], weight, atol=1e-6, rtol=0)
    else:                                               # without the step the matrices stay where they started
        assert all(torch.equal(weight, torch.eye(len(weight))) for weight in ours.values())


def test_the_papers_decorrelation_rows_memory_child_takes_the_matrices_step(throughput, monkeypatch):
    steps = []

    def recorded(model):
        steps.append(sum(not torch.equal(w, torch.eye(len(w))) for w in decorrelation_weights(model).values()))
        throughput.step_decorrelation(model)

    monkeypatch.setitem(throughput.VARIANTS, PAPER_DECORR, dict(throughput.VARIANTS[PAPER_DECORR], after_step=recorded))
    threads = torch.get_num_threads()
    try:
        out = throughput.memory_child(dict(registry=PAPER_DECORR, tiny=True, batch=2, threads=1))
    finally:
        torch.set_num_threads(threads)
    # after each of its two training steps, from the identity (none moved) and then from the first step's matrices
    assert math.isfinite(out['peak_increase_mib']) and len(steps) == 2 and steps[0] == 0 and steps[1] > 0


def test_the_papers_decorrelation_row_is_measured_with_the_flops_of_its_matrices_step(throughput):
    result = tiny_run(throughput, PAPER_DECORR)
    check_measured(result, PAPER_DECORR)
    flops = result['flops_per_image'][PAPER_DECORR]
    assert positive_finite(flops['after_step']) and flops['train_step'] > flops['after_step'] + flops['forward']
    table = throughput.registry_table(as_run(result, 'A'))
    assert table['rows'][PAPER_DECORR]['flops']['ours'] == flops


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get('VIT_PYTORCH_SOURCE'), reason='vit-pytorch 1.26.14 source not given')
def test_the_papers_decorrelation_row_is_timed_against_vit_pytorchs_method(throughput):
    # vit-pytorch has no matrices: its module, at the preset, trains by its own method (the auxiliary loss x 0.1)
    # and takes no step after the optimizer's; its weights load into ours (the matrices at the identity), so that
    # the logits were checked equal before it returns
    workload = throughput.registry_workload(PAPER_DECORR)
    reference, why = throughput.try_reference(workload, tiny=False)
    assert why is None and reference['preset'] == 'vit-pytorch 1.26.14 vit_with_decorr.ViT'
    assert reference['after_step'] is None and workload['after_step'] is throughput.step_decorrelation
    assert isinstance(reference['loss'], throughput.AuxiliaryLoss) and reference['loss'].weight == 0.1
    assert workload['loss'] is throughput.classification_loss
    assert reference['params'] == workload['params']


def test_the_registry_table_has_the_papers_decorrelation_row_beside_vit_pytorchs_method(throughput):
    with open(os.path.join(DOCS, 'registry-table.json')) as f:
        table = json.load(f)['registry_table']
    row = table['rows'][PAPER_DECORR]
    assert row['reference'] == 'vit-pytorch 1.26.14 vit_with_decorr.ViT' and row['failure'] is None
    assert set(row['ratios']) == {'infer@1', 'infer@8', 'train@8'} and len(row['memory_ratio']['rounds']) == 3
    assert all(len(ratio['rounds']) == 5 for ratio in row['ratios'].values())
    assert positive_finite(row['flops']['ours']['after_step']) and 'after_step' not in row['flops']['reference']
    with open(os.path.join(DOCS, 'registry-table.md')) as f:
        text = f.read()
    assert text == throughput.markdown_table(table)
    names = list(table_rows(text))
    assert names.index(PAPER_DECORR) == names.index('vit_with_decorr') + 1
    cells = table_rows(text)[PAPER_DECORR]
    assert "the paper's method against vit-pytorch's method" in cells[1] and 'GFLOP per image' in cells[1]
    assert cells[-2] == 'different work (no verdict)'


# benchmarks/wrapper_steps.py: the research-long-tail wrappers against vit-pytorch 1.26.14's module of the same name

WRAPPER_SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, 'benchmarks', 'wrapper_steps.py')


@pytest.fixture(scope='module')
def wrapper_steps():
    return load_script(WRAPPER_SCRIPT, 'wrapper_steps')


def run_wrapper_rows(wrapper_steps, monkeypatch, rows):
    """The script's tiny run of `rows` without vit-pytorch's source; checks that each row has our speeds and says
    why it has no ratios."""
    monkeypatch.delenv('VIT_PYTORCH_SOURCE', raising=False)
    threads = torch.get_num_threads()
    results = wrapper_steps.main(['--tiny', '--rows', ','.join(rows), '--rounds', '1', '--seconds', '0', '--memory',
                                  '0'], log=lambda msg: None)
    assert torch.get_num_threads() == threads
    assert list(results['rows']) == rows
    for name, row in results['rows'].items():
        tasks = ['train@8'] if name in wrapper_steps.NO_INFERENCE else ['infer@8', 'train@8']
        assert list(row['speed']) == tasks, name
        assert all(positive_finite(row['speed'][task]['ours']['median']) for task in tasks), (name, row['speed'])
        assert row['ratios'] == {} and '$VIT_PYTORCH_SOURCE' in row['reference_missing'], (name, row)
        assert f'| `{name}` |' in wrapper_steps.markdown(results)


def test_wrapper_steps_measures_a_wrapper_with_and_one_without_an_inference_path(wrapper_steps, monkeypatch):
    # mp3 returns only its loss (no inference row), vat predicts: run_wrapper_rows checks each row's tasks
    assert 'mp3' in wrapper_steps.NO_INFERENCE and 'vat' not in wrapper_steps.NO_INFERENCE
    run_wrapper_rows(wrapper_steps, monkeypatch, ['mp3', 'vat'])


@pytest.mark.slow
def test_wrapper_steps_measures_ours_in_every_row_at_tiny_sizes(wrapper_steps, monkeypatch):
    # 2.6 s of CPU time on the 2-core machine
    run_wrapper_rows(wrapper_steps, monkeypatch, list(wrapper_steps.ROW_NAMES))
    assert wrapper_steps.ROW_NAMES == ('mp3', 'levjepa', 'levjepa_nd', 'vat', 'vaat', 'vat_siglip', 'es_vit', 'lejepa')


def test_a_wrapper_reference_that_cannot_be_imported_is_stated_with_its_exception(wrapper_steps, monkeypatch):
    # as vit-pytorch's vaat, which imports torchaudio; ours is still built and measured
    def without_torchaudio(name):
        raise ModuleNotFoundError("No module named 'torchaudio'")

    monkeypatch.setattr(wrapper_steps, 'reference_module', without_torchaudio)
    ours, theirs, why = wrapper_steps.build_row('vaat', tiny=True)
    assert theirs is None and ours.infer_fn is not None
    assert why == "cannot run here: importing or building it raised ModuleNotFoundError: No module named 'torchaudio'"


def test_a_wrapper_reference_whose_step_raises_is_stated_with_its_exception(wrapper_steps, monkeypatch):
    # as vit-pytorch's levjepa, whose block mask cannot be built here: the reference builds, its steps raise
    build = wrapper_steps.BUILDERS['vat']

    def build_with_a_broken_reference(tiny):
        row, _ = build(tiny)
        module, infer, _ = row['ours']

        def raises():
            raise AssertionError('Expected 4 or 5 positional args, got 0')
        return row, lambda: (module, infer, raises)

    monkeypatch.setitem(wrapper_steps.BUILDERS, 'vat', build_with_a_broken_reference)
    _, theirs, why = wrapper_steps.build_row('vat', tiny=True)
    assert theirs is None
    assert why == 'cannot run here: its training raised AssertionError: Expected 4 or 5 positional args, got 0'


def test_a_wrapper_reference_whose_weights_our_loader_refuses_is_not_timed_and_says_so(wrapper_steps, monkeypatch):
    # as vit-pytorch's VAAT with 2 audio views: load_vit_pytorch refuses it (CheckpointError), which is no failure
    # to import or build
    from vit_pytorch.vaat import AST, VAAT, ViT
    build = wrapper_steps.BUILDERS['vaat']

    def build_with_refused_weights(tiny):
        row, _ = build(tiny)

        def reference():
            two_views = VAAT(ViT(image_size=16, patch_size=8, num_classes=4, dim=16, depth=1, heads=2, dim_head=8,
                                 mlp_dim=32),
                             AST(dim=16, depth=1, heads=2, dim_head=8, mlp_dim=32, patch_size=8), dim=16, depth=1,
                             heads=2, dim_head=8, dim_action=2, mlp_dim=32, num_audio_views=2)
            wrapper_steps.load_vit_pytorch(two_views, two_views.state_dict())
            return row['ours']
        return row, reference

    monkeypatch.setitem(wrapper_steps.BUILDERS, 'vaat', build_with_refused_weights)
    ours, theirs, why = wrapper_steps.build_row('vaat', tiny=True)
    assert theirs is None and ours.infer_fn is not None
    assert why.startswith("not timed: load_vit_pytorch refuses its weights: the state_dict: vit-pytorch's VAAT "
                          "computes another function with several audio views"), why


def test_the_wrapper_memory_child_measures_two_training_steps(wrapper_steps):
    threads = torch.get_num_threads()
    try:
        mib = wrapper_steps.memory_child(dict(row='vat', who='ours', tiny=True))
    finally:
        torch.set_num_threads(threads)
    assert math.isfinite(mib) and mib >= 0


def test_every_wrapper_has_a_row_or_a_stated_reason(wrapper_steps):
    # the wrappers' registry (test_conformance.WRAPPER_STEPS): a row in this table or the reason it has none here
    import test_conformance as conformance
    for name in conformance.WRAPPER_STEPS:
        assert (name in wrapper_steps.ROW_NAMES) != (name in wrapper_steps.NO_ROW), name
    assert set(wrapper_steps.NO_ROW) <= set(conformance.WRAPPER_STEPS)
    assert {'es_vit', 'lejepa'} <= set(wrapper_steps.ROW_NAMES)


def test_the_wrapper_table_has_every_row(wrapper_steps):
    # docs/wrapper-table.json (and .md) hold a measured row of every row the script defines
    root = os.path.join(os.path.dirname(__file__), os.pardir)
    with open(os.path.join(root, 'docs', 'wrapper-table.json')) as f:
        rows = json.load(f)['rows']
    with open(os.path.join(root, 'docs', 'wrapper-table.md')) as f:
        markdown = f.read()
    for name in wrapper_steps.ROW_NAMES:
        assert name in rows and rows[name]['config'] == wrapper_steps.CONFIGS[name], name
        assert f'| `{name}` |' in markdown, name
        if name in wrapper_steps.SAME_WORK:
            assert rows[name]['same_work'] == wrapper_steps.SAME_WORK[name][0], name
            assert 'train@8' in rows[name]['paper']['ratios'] and rows[name]['paper']['memory_ratio'], name


def images_through_the_backbone(learner, loss):
    """{grad enabled: images} that one training loss of `learner` sends through its backbone (our ViT's transformer,
    es_vit_step.Both), its EMA teacher's copy included."""
    seen = {True: 0, False: 0}

    def counted(module, x, *args, **kwargs):
        seen[torch.is_grad_enabled()] += x.shape[0]
        return type(module).forward(module, x, *args, **kwargs)
    # an instance's forward, not a hook: Both's forward_intermediates calls self.forward; bound, so that a deepcopy
    # (vit-pytorch's teacher, made in its first step) counts its own calls
    backbones = [m for m in learner.modules() if type(m).__name__ == 'Both'
                 or (type(m).__name__ == 'Transformer' and m.__module__ == 'vit_pytorch.vit')]
    for m in backbones:
        m.forward = types.MethodType(counted, m)
    try:
        loss()
    finally:
        for m in learner.modules():
            m.__dict__.pop('forward', None)
    return seen


@pytest.mark.parametrize('name', ['es_vit', 'lejepa'])
def test_a_like_for_like_row_times_ours_at_vit_pytorchs_work_and_the_papers_step_beside_it(wrapper_steps, name,
                                                                                           monkeypatch):
    # vit-pytorch 1.26.14's steps (es_vit.py's and lejepa.py's forward): 2 views of the batch with gradient (the
    # student's / the encoder's local crops) and 2 without (the teacher's / the targets' global crops). Ours in the
    # row must send as many images through the backbone, with and without gradient; the paper's step takes its 2
    # global views with gradient too (es_vit: its teacher still sees 2 without)
    monkeypatch.delenv('VIT_PYTORCH_SOURCE', raising=False)
    row, _ = wrapper_steps.BUILDERS[name](tiny=True)
    batch = wrapper_steps.BATCH
    assert images_through_the_backbone(row['ours'][0], row['ours'][2]) == {True: 2 * batch, False: 2 * batch}
    paper = {'es_vit': {True: 4 * batch, False: 2 * batch}, 'lejepa': {True: 4 * batch, False: 0}}[name]
    assert images_through_the_backbone(row['paper'][0], row['paper'][2]) == paper
    # the script runs it beside ours and says so in the row
    results = wrapper_steps.main(['--tiny', '--rows', name, '--rounds', '1', '--seconds', '0', '--memory', '0'],
                                 log=lambda msg: None)
    measured = results['rows'][name]
    assert set(measured['speed']['train@8']) == {'ours', 'paper'}
    assert measured['same_work'] == wrapper_steps.SAME_WORK[name][0]
    assert 'like for like, ours is timed' in wrapper_steps.markdown(results)


@pytest.mark.skipif(not os.environ.get('VIT_PYTORCH_SOURCE'), reason='vit-pytorch 1.26.14 source not given')
@pytest.mark.parametrize('name', ['es_vit', 'lejepa'])
def test_vit_pytorchs_step_does_the_work_the_like_for_like_row_times(wrapper_steps, name):
    # the counts the test above takes from vit-pytorch's source, from its module run
    row, reference = wrapper_steps.BUILDERS[name](tiny=True)
    theirs, _, loss, *_ = reference()
    batch = wrapper_steps.BATCH
    assert images_through_the_backbone(theirs, loss) == {True: 2 * batch, False: 2 * batch}


def test_merging_rows_keeps_the_others_and_records_the_run(wrapper_steps):
    table = dict(command='full', date='d0', machine='m0', load_average='l0', rounds=5, memory_runs=3,
                 rows=dict(a=dict(config='A'), b=dict(config='B old')))
    results = dict(command='rows', date='d1', machine='m1', load_average='l1', rounds=2, memory_runs=1,
                   rows=dict(b=dict(config='B new'), c=dict(config='C')))
    merged = wrapper_steps.merge(table, results, 'why')
    record = dict(command='rows', date='d1', machine='m1', load_average='l1', rounds=2, memory_runs=1, note='why')
    assert merged == dict(command='full', date='d0', machine='m0', load_average='l0', rounds=5, memory_runs=3,
                          rows=dict(a=dict(config='A'), b=dict(config='B new', remeasured=record),
                                    c=dict(config='C', remeasured=record)))
    assert list(merged['rows']) == ['a', 'b', 'c'] and table['rows']['b'] == dict(config='B old')


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get('VIT_PYTORCH_SOURCE'), reason='vit-pytorch 1.26.14 source not given')
@pytest.mark.parametrize('name', ['mp3', 'levjepa_nd', 'vat', 'vat_siglip', 'es_vit', 'lejepa', pytest.param(
    'vaat', marks=pytest.mark.skipif(importlib.util.find_spec('torchaudio') is None,
                                     reason="vit-pytorch's vaat imports torchaudio"))])
def test_vit_pytorch_wrappers_load_into_ours_and_agree_on_the_same_inputs(wrapper_steps, name):
    # build_row loads vit-pytorch's weights into ours and checks the outputs equal (mp3: the ViTs' logits; the
    # LeVJEPA: the embedding) before its reference takes a step; any failure there is the row's stated reason
    # (vaat: at one audio view, which vit-pytorch's VAAT runs at batch 8)
    _, theirs, why = wrapper_steps.build_row(name, tiny=True)
    assert why is None and theirs is not None
