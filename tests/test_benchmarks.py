"""The benchmark scripts run (tiny settings): they are not timed tests, but they must not rot."""
import pytest

from helpers import run_script

pytestmark = pytest.mark.slow

RUNS = {
    'supcon_speed': ['--sizes', '64', '--reps', '1'],
    'field_speed': ['--sizes', '64', '--classes', '4', '--reps', '1'],
    'carrot_overhead': ['--skip_step', '--reps', '1'],
    'rascal_overhead': ['--reps', '1'],
    'chunk_memory': ['--model', 'resnet_tiny', '--size', '8', '--batches', '8,16', '--chunk', '4', '--steps', '1'],
    'train_throughput': ['--models', 'resnet_tiny', '--batch_size', '8', '--steps', '1'],
    'augment_speed': ['--skip_epochs', '--images', '64'],
    'queue_overhead': ['--size', '8', '--batch', '16', '--queue', '64', '--reps', '1'],
    'carrot_quantile': ['--batch_sizes', '64', '--reps', '1'],
    'queue_memory': ['--batch', '32', '--queue', '128'],
    'class_blocks_cost': ['--batch', '64', '--reps', '1'],
    'tsc_targets': ['--classes', '20', '--dim', '4', '--steps', '50'],
    'feature_scale': ['--smoke'],
    'torchrun_exits': ['--runs', '1', '--parallel', '1', '--no_resume'],
}


@pytest.mark.parametrize('name', sorted(RUNS))
def test_benchmark_runs(name):
    proc = run_script(f'benchmarks/{name}.py', *RUNS[name])
    assert proc.stdout.strip()


def test_a_compiled_row_is_compared_with_the_compiled_bound():
    """``gpu_throughput.py --compile`` measures ``bound compiled``: a compiled row's ratio is taken over it (the
    H100 report of 2026-11-26 read 1.29 of the uncompiled bound), every other row's over the plain bound."""
    from benchmarks.gpu_throughput import bound_of, missed_targets
    rates = {'baseline': 1.0, 'bound': 10.0, 'bound compiled': 14.0, 'ours SupCon': 9.0, 'ours SupCon compiled': 13.0,
             'ours RASCAL compiled': 11.5}
    assert bound_of('ours SupCon compiled', rates) == 'bound compiled' and bound_of('ours SupCon', rates) == 'bound'
    assert bound_of('ours SupCon compiled', {'bound': 10.0}) == 'bound'        # measured without --compile
    assert missed_targets('resnet18', rates) == []
    rates['ours SupCon compiled'] = 12.0                                      # 0.86 of the compiled bound
    rates['ours RASCAL compiled'] = 11.0                                      # 0.79 of it
    assert [(row, over) for row, over, *_ in missed_targets('resnet18', rates)] == [
        ('ours SupCon compiled', 'bound compiled'), ('ours RASCAL compiled', 'bound compiled')]


def test_gpu_throughput_has_a_compiled_row_per_method(tmp_path):
    """``--compile``: every method also with the scripts' ``--compile`` (here on aot_eager, the same graphs without
    code generation), each over the compiled bound."""
    import json

    from benchmarks.gpu_throughput import METHOD_FLAGS
    run_script('benchmarks/gpu_throughput.py', '--smoke', '--compile', '--compile_backend', 'aot_eager', '--device',
               'cpu', '--profile', 'never', '--json', tmp_path / 'rates.json')
    rates = json.loads((tmp_path / 'rates.json').read_text())['configs'][0]['rates']
    assert {f'ours {m} compiled' for m in METHOD_FLAGS} | {'bound compiled'} <= set(rates)
