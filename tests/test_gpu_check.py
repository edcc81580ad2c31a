"""benchmarks/gpu_check/ (scripts/gpu_check.sh), the GPU check in one command: its dry run end to end on this
machine (every section; those that need CUDA say ``skipped: no CUDA``, never ``passed``), a failing or hanging
section recorded while the next one runs, and the checks its verdicts rest on."""
import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import gpu_check
from helpers import ROOT, own_process, script_env


def dry_run(tmp_path, *args, env=None):
    """``python -m benchmarks.gpu_check --dry-run``, as scripts/gpu_check.sh runs it (its sections and their runs
    forked, one thread each)."""
    proc = subprocess.run([*own_process('-m', 'benchmarks.gpu_check'), '--dry-run', '--out', str(tmp_path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, env={**script_env(), **(env or {})})
    with open(tmp_path / 'gpu_report.json') as f:
        report = json.load(f)
    return proc, {s['key']: s for s in report['sections']}, (tmp_path / 'gpu_report.md').read_text()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU dry run (a GPU machine runs the real check)')
def test_the_dry_run_passes_on_a_loaded_machine_and_says_what_needs_cuda(tmp_path):
    """The dry run with its default budget and slack while another process wants a core (beside the suite's other
    worker): its bounds follow the machine, and every section needs CUDA but the environment."""
    # niced: it raises the load the check reads as much as a busy core would, but yields the core to the suite
    burner = subprocess.Popen([sys.executable, '-c', 'import os\nos.nice(19)\nwhile True: pass'])
    try:
        proc, sections, report = dry_run(tmp_path)
    finally:
        burner.kill()
        burner.wait()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [s for s in sections] == [key for _, key, *_ in gpu_check.SECTIONS]
    assert sections['environment']['status'] == 'passed'
    for key, section in sections.items():
        if key != 'environment':
            assert section['status'] == 'skipped: no CUDA', (key, section['summary'])
    assert sections['cuda_tests']['data']['skipped'] == sections['cuda_tests']['data']['tests'] > 0
    assert all(r['steady_total'] == [1] * 6 for r in sections['loop_syncs']['data'].values())
    assert sections['recipe']['data']['bit_equal_repeat'] and sections['recipe']['data']['bit_equal_resume']
    assert list(sections['field']['data']) == list(gpu_check.FIELD_DRY_RUN)        # a few of the field's runs
    assert len(gpu_check.field_runs()) > len(gpu_check.FIELD_DRY_RUN)
    assert all('test_acc' in r for r in sections['field']['data'].values())
    assert sections['user_recipe']['data']['projection_s'] > sections['user_recipe']['data']['first_epoch_s'] > 0
    assert '## 7. The field on the GPU' in report and 'passed' not in report.split('## 2.')[1].split('\n')[0]
    # the default plan: the environment and the throughput alone, then four process chains side by side
    with open(tmp_path / 'gpu_report.json') as f:
        meta = json.load(f)['meta']
    assert meta['plan'] == {'alone': [[1], [4], [8]], 'side_by_side': [[2], [3, 5], [6], [7]],
                            'chains': max(1, (os.cpu_count() or 1) // 2)}
    assert sorted(os.listdir(tmp_path)) == ['gpu_check.log', 'gpu_check_2.log', 'gpu_check_3-5.log',
                                            'gpu_check_6.log', 'gpu_check_7.log', 'gpu_report.json', 'gpu_report.md']
    assert '===== 5. The accelerator forms' in (tmp_path / 'gpu_check_3-5.log').read_text()
    assert report.index('## 2.') < report.index('## 3.') < report.index('## 7.')      # in section order
    # a second call into the same folder is refused before it runs anything: the first report stays
    again = subprocess.run(['bash', 'scripts/gpu_check.sh', '--dry-run', '--out', str(tmp_path)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120, env={**os.environ, 'PY': sys.executable})
    assert_one_line(again, 'holds a report already')
    assert (tmp_path / 'gpu_report.md').read_text() == report


@pytest.mark.slow
@pytest.mark.parametrize('how,status', [('fail', 'failed'), ('hang', 'timed out')])
def test_a_failing_or_hanging_section_is_recorded_and_the_next_runs(tmp_path, how, status):
    budget = '13.5' if how == 'hang' else '200'   # the hanging section is stopped at the budget (a section needs 10 s)
    proc, sections, report = dry_run(tmp_path, '--sections', '2', '--budget', budget,
                                     env={'GPU_CHECK_SABOTAGE': f'environment:{how}'})
    assert proc.returncode == 1
    assert sections['environment']['status'] == status
    if how == 'fail':
        assert 'sabotaged section environment' in sections['environment']['summary']
        assert sections['cuda_tests']['status'] == 'skipped: no CUDA'      # the next one ran
    else:
        assert all(s['status'] == 'skipped: out of time' for k, s in sections.items() if k != 'environment')
    assert f'1. Environment: {status}' in report


def test_the_cuda_section_runs_every_file_that_marks_a_test_cuda(request):
    """Section 2 runs ``pytest -m cuda`` on the files whose text marks a test ``cuda``: every such test this session
    collected is in one of them (the whole suite's, when the suite runs)."""
    files = gpu_check.cuda_test_files()
    assert 'tests/test_cuda.py' in files and all(os.path.isfile(os.path.join(ROOT, f)) for f in files)
    marked = {os.path.relpath(str(item.path), ROOT) for item in request.session.items
              if item.get_closest_marker('cuda')}
    assert marked <= set(files), marked - set(files)


def assert_one_line(proc, *words):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith('gpu_check.sh: error: '), proc.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert 'GPU check (' not in proc.stdout            # nothing ran


def test_sections_parse_and_the_environment_always_runs():
    assert gpu_check.parse_sections('4') == {1, 4}
    assert gpu_check.parse_sections('2-4,7') == {1, 2, 3, 4, 7}
    assert gpu_check.parse_sections(' 1 - 3 , 5') == {1, 2, 3, 5}
    for bad in ('9', '', ',', '3-1', '1-', 'a', '1,,2', '2-3-4', '-1'):
        with pytest.raises(gpu_check.ArgumentError):
            gpu_check.parse_sections(bad)


def unwritable_folder(tmp_path):
    """A folder no file can be written into: read-only by its mode, or (as root, whom modes do not stop) one of sysfs,
    where nothing may be created."""
    if os.geteuid() != 0:
        folder = tmp_path / 'read_only'
        folder.mkdir()
        folder.chmod(0o555)
        return str(folder / 'out')
    return '/sys/gpu_check_out'


@pytest.mark.parametrize('args, words', [
    (['--sections', ''], ['--sections takes numbers', "got ''"]),
    (['--sections', '3-1'], ['the range 3-1 is reversed']),
    (['--sections', '1-3,x'], ['--sections takes numbers']),
    (['--sections', '9'], ['numbers in 1-8']),
    (['--budget', '0'], ['--budget must be a number of seconds > 0']),
    (['--budget', '-5'], ['--budget must be a number of seconds > 0']),
    (['--budget', 'inf'], ['--budget must be a number of seconds > 0']),
    (['--slack', '0'], ['--slack must be a number > 0']),
    (['--slack', 'lots'], ['--slack must be a number > 0']),
    (['--section', '2'], ['unknown flag --section', '--sections']),
    ('file', ['is a file: give a folder']),
    ('under a file', ['cannot write the report into', 'Not a directory']),
    ('unwritable', ['cannot write the report into']),
])
def test_bad_arguments_are_one_line_before_anything_runs(tmp_path, args, words):
    out = str(tmp_path / 'out')
    if args == 'file':
        (tmp_path / 'f').write_text('x')
        args, out = [], str(tmp_path / 'f')
    elif args == 'under a file':
        (tmp_path / 'f').write_text('x')
        args, out = [], str(tmp_path / 'f' / 'out')
    elif args == 'unwritable':
        args, out = [], unwritable_folder(tmp_path)
    proc = subprocess.run(['bash', 'scripts/gpu_check.sh', '--dry-run', '--out', out, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, 'PY': sys.executable})
    assert_one_line(proc, *words)


def test_field_runs_skipped_for_time_are_not_failures(tmp_path, monkeypatch):
    """A field section the budget cut short says ``skipped: out of time`` (its runs were never tried), not
    ``failed``; a run that failed still makes it ``failed``."""
    ctx = gpu_check.Context(True, False, str(tmp_path), str(tmp_path / 'log'), 0)      # no time left at all
    result = gpu_check.section_field(ctx)
    assert result['status'] == 'skipped: out of time'
    n = len(gpu_check.FIELD_DRY_RUN)
    assert f'{n} of {n} runs skipped' in result['summary']
    monkeypatch.setattr(gpu_check.Context, 'left', lambda self, reserve=5: 100.0 if not hasattr(self, 'n') else 0)

    def fail(*args):
        ctx.n = 1
        raise RuntimeError('boom')
    monkeypatch.setattr(gpu_check.field, 'Forked', fail)           # the field section's fork helper
    assert gpu_check.section_field(ctx)['status'] == 'failed'


@pytest.mark.slow
def test_the_chains_run_side_by_side_after_the_throughput_alone(tmp_path):
    """The driver's plan on sections that each nap 3 s (``GPU_CHECK_SABOTAGE=nap``): the throughput starts only after
    the environment and ends before any chain starts; the four chains start together (``--chains 4``) and each
    chain's sections run in order; the whole takes about one chain's time, not the sum; the report lists the sections
    in order."""
    proc, sections, report = dry_run(tmp_path, '--chains', '4', env={'GPU_CHECK_SABOTAGE': 'nap'})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    start = {k: s['started_s'] for k, s in sections.items()}
    end = {k: start[k] + s['seconds'] for k, s in sections.items()}
    firsts = [start[k] for k in ('cuda_tests', 'loop_syncs', 'recipe', 'field')]
    assert start['throughput'] >= end['environment'] - 0.5 and start['user_recipe'] >= end['throughput'] - 0.5
    assert min(firsts) >= end['user_recipe'] - 0.5                            # the timed sections alone
    assert max(firsts) - min(firsts) < 2.5                                    # side by side, not one after another
    assert start['forms'] >= end['loop_syncs'] - 0.5                          # 3 then 5 in one chain
    assert max(end.values()) - min(firsts) < 15        # about one chain's 6 s; one after another: 15 s of naps alone
    assert list(sections) == [key for _, key, *_ in gpu_check.SECTIONS]


def test_forked_children_run_side_by_side_and_report_each_outcome(tmp_path):
    """The field's pool: children started together finish together (they ran side by side), a failing child's
    last lines and a child past its time bound come back as ``RuntimeError``."""
    import time
    start = time.monotonic()
    children = [gpu_check.Forked(lambda i: time.sleep(1.0) or i, (i,), str(tmp_path / f'{i}.log'), 30)
                for i in range(3)]
    results = {}
    while len(results) < 3:
        for i, child in enumerate(children):
            if i not in results:
                out = child.poll()
                if out is not None:
                    results[i] = out
        time.sleep(0.05)
    assert results == {0: 0, 1: 1, 2: 2}
    assert time.monotonic() - start < 2.5                      # three 1-second children, not three seconds
    with pytest.raises(RuntimeError, match='ZeroDivisionError'):
        gpu_check.forked(lambda: 1 / 0, (), str(tmp_path / 'fail.log'), 30)
    with pytest.raises(RuntimeError, match='timed out after 1 s'):
        gpu_check.forked(time.sleep, (30,), str(tmp_path / 'hang.log'), 1)


def test_outcome_never_says_passed_without_cuda(tmp_path):
    cpu = gpu_check.Context(False, False, str(tmp_path), str(tmp_path / 'log'), 0)
    gpu = gpu_check.Context(False, True, str(tmp_path), str(tmp_path / 'log'), 0)
    assert cpu.dry and not gpu.dry
    assert gpu_check.outcome(cpu, True, '')['status'] == 'skipped: no CUDA'
    assert gpu_check.outcome(cpu, False, '')['status'] == 'failed'
    assert gpu_check.outcome(cpu, True, '', needs_cuda=False)['status'] == 'passed'
    assert gpu_check.outcome(gpu, True, '')['status'] == 'passed'


def test_state_differences_sees_one_changed_bit():
    """The recipe's bit-equality verdict (power check: one ulp in one weight, one optimizer entry)."""
    a = {'model': {'w': torch.ones(3), 'b': torch.zeros(2)}, 'optimizer': {'state': {0: {'m': torch.ones(3)}}},
         'extra': {}}
    b = {'model': {'w': torch.ones(3), 'b': torch.zeros(2)}, 'optimizer': {'state': {0: {'m': torch.ones(3)}}},
         'extra': {}}
    assert gpu_check.state_differences(a, b) == []
    b['model']['w'][1] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    b['optimizer']['state'][0]['m'] = torch.ones(3) * 2
    assert gpu_check.state_differences(a, b) == ['model.w', 'optimizer.state.0.m']



def test_the_user_recipe_figures_come_from_its_epoch_lines_and_metrics():
    """Section 8's arithmetic: the steady wall-clock epoch is the span from the first epoch's line to the last's over
    the epochs between; the projection is the time to the first epoch's end plus 999 steady epochs; the benchmark's
    best SupCon row (deterministic left out) for resnet50 at batch 1024."""
    lines = [(1.0, 'path: cuda, --augment device'), (30.0, 'epoch 1/4 (25.0s; 0:30 elapsed, about 1:30 left): x'),
             (36.0, 'epoch 2/4 (5.0s; 0:36 elapsed, about 0:12 left): x'), (42.5, 'noise'),
             (42.0, 'epoch 3/4 (5.0s; 0:42 elapsed, about 0:06 left): x'),
             (48.0, 'epoch 4/4 (5.0s; 0:48 elapsed, about 0:00 left): x')]
    ends = gpu_check.epoch_ends(lines)
    assert ends == {1: 30.0, 2: 36.0, 3: 42.0, 4: 48.0}
    r = gpu_check.user_recipe_rates(50_000, ends, [25.0, 5.0, 5.0, 5.0], 50.0)
    assert r['steady_epoch_wall_s'] == 6.0 and r['steady_epoch_train_s'] == 5.0
    assert r['images_per_s_wall'] == 100_000 / 6.0 and r['images_per_s_train'] == 20_000
    assert r['projection_s'] == 30.0 + 999 * 6.0
    with pytest.raises(ValueError):
        gpu_check.user_recipe_rates(50_000, {1: 30.0}, [25.0], 31.0)


def test_the_user_recipe_is_compared_with_the_benchmarks_best_row(tmp_path):
    (tmp_path / 'throughput').mkdir()
    report = {'configs': [{'model': 'resnet18', 'batch': 1024, 'rates': {'ours SupCon': 9e9}},
                          {'model': 'resnet50', 'batch': 1024, 'rates': {
                              'baseline': 3000.0, 'bound compiled': 20000.0, 'ours SupCon': 13000.0,
                              'ours SupCon compiled': 18000.0, 'ours SupCon deterministic': 19000.0}}]}
    (tmp_path / 'throughput' / 'throughput.json').write_text(json.dumps(report))
    assert gpu_check.benchmark_best(str(tmp_path / 'user_recipe')) == ('ours SupCon compiled', 18000.0)
    assert gpu_check.benchmark_best(str(tmp_path / 'nowhere' / 'user_recipe')) is None


def test_a_field_run_stopped_by_the_budgets_end_is_skipped_not_failed(tmp_path, monkeypatch):
    """A run started with less time left than its own bound and stopped there was cut by the budget (the H100 check
    of 2026-11-27 reported SupCon + CARROT as failed after 11 s): skipped; one stopped at its own bound failed."""
    class TimedOut:
        def __init__(self, fn, args, log, timeout):
            os.makedirs(os.path.dirname(log), exist_ok=True)
            open(log, "w").close()

        def poll(self):
            raise RuntimeError('timed out after 11 s')
    monkeypatch.setattr(gpu_check.field, 'Forked', TimedOut)
    for left, status in ((11.0, 'skipped: out of time'), (1000.0, 'failed')):
        monkeypatch.setattr(gpu_check.Context, 'left', lambda self, reserve=5, left=left: left)
        ctx = gpu_check.Context(True, False, str(tmp_path / str(left)), str(tmp_path / 'log'), 0)
        assert gpu_check.section_field(ctx)['status'] == status
