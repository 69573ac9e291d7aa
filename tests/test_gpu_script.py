"""benchmarks/gpu.py, the script that measures what a GPU would tell us, on its CPU path (no test needs a GPU)."""
import json
import math
import os

import pytest

from helpers import load_script

SCRIPT = os.path.join(os.path.dirname(__file__), '..', 'benchmarks', 'gpu.py')


@pytest.fixture(scope='module')
def gpu():
    return load_script(SCRIPT, 'gpu_benchmark')


@pytest.mark.parametrize('threshold', [0, 3, 4, 7, 8, 9, 100, 129, 1000, 4095, 5000])
@pytest.mark.parametrize('start', [4, 5, 128])
def test_largest_batch_fits_and_the_next_step_does_not(gpu, threshold, start):
    limit = 4096
    best, tried = gpu.largest_batch(lambda b: b <= threshold, start, limit)
    if threshold < start:
        assert best == 0 and tried == [start]
        return
    assert best <= threshold
    assert best == limit or best + 8 > threshold
    assert len(tried) == len(set(tried)) and len(tried) <= 2 * math.log2(limit) + 2


def test_datasheet_peak_takes_the_longest_matching_chip_name(gpu):
    assert gpu.datasheet_peak('NVIDIA H100 PCIe') == 756.0e12
    assert gpu.datasheet_peak('NVIDIA H200') == 989.4e12
    assert gpu.datasheet_peak('NVIDIA A100-SXM4-80GB') == 312.0e12
    assert gpu.datasheet_peak('Some other accelerator') is None


def test_an_unknown_section_is_refused(gpu, capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu.parse_args(['--sections', 'throughput,speed'])
    assert exit_.value.code == 2
    assert 'throughput, compile, batch' in capsys.readouterr().err


def test_cpu_path_measures_throughput_mfu_and_the_batch_search(gpu, tmp_path):
    out = tmp_path / 'gpu.json'
    result = gpu.main(['--device', 'cpu', '--tiny', '--sections', 'throughput,batch', '--batch', '4',
                       '--max-batch', '16', '--steps', '1', '--warmup', '1', '--rounds', '2', '--threads', '1',
                       '--json', str(out)])
    assert json.loads(out.read_text())['config'] == 'tiny'
    speed = result['throughput']['images_per_s']
    assert 0 < speed['min'] <= speed['median'] <= speed['max'] < math.inf and len(speed['rounds']) == 2
    # MFU is the counted FLOPs at the measured speed over the measured peak
    peak = result['peaks']['measured matmul']
    assert result['throughput']['mfu']['measured matmul'] == pytest.approx(
        result['training_flops_per_image'] * speed['median'] / peak)
    assert 'datasheet' not in result['throughput']['mfu']
    # a CPU has no memory wall here: the search doubles 4 -> 8 -> 16 and stops at the limit
    assert result['batch'] == dict(largest=16, tried=[4, 8, 16], limit=16, stopped_by='the limit (--max-batch)')
    assert result['skipped'] == []


def test_a_section_past_the_budget_is_skipped_and_said(gpu):
    args = gpu.parse_args(['--device', 'cpu', '--tiny', '--sections', 'batch', '--budget-s', '1e-9',
                           '--max-batch', '8', '--batch', '4'])
    result = gpu.run(args, log=lambda line: None)
    assert result['skipped'] == ['batch'] and 'batch' not in result
    assert 'batch: skipped' in gpu.report(result)


@pytest.mark.slow
def test_cpu_path_measures_the_compile_speedup(gpu):
    result = gpu.main(['--device', 'cpu', '--tiny', '--sections', 'compile', '--batch', '4', '--steps', '2',
                       '--warmup', '1', '--rounds', '2', '--threads', '1'])
    ratios = result['compile']['speedup']['rounds']
    assert len(ratios) == 2 and all(0 < r < math.inf for r in ratios)
    assert result['compile']['compile_s'] > 0
