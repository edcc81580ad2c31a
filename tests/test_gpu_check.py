"""benchmarks/gpu_check.py (scripts/gpu_check.sh), the GPU session's one command: its dry run end to end on this
machine (every section; those that need CUDA say ``skipped: no CUDA``, never ``passed``), a failing or hanging
section recorded while the next one runs, and the checks its verdicts rest on."""
import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import gpu_check
from helpers import ROOT


def dry_run(tmp_path, *args, env=None):
    proc = subprocess.run(['bash', 'scripts/gpu_check.sh', '--dry-run', '--out', str(tmp_path), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, 'PY': sys.executable, **(env or {})})
    with open(tmp_path / 'gpu_report.json') as f:
        report = json.load(f)
    return proc, {s['key']: s for s in report['sections']}, (tmp_path / 'gpu_report.md').read_text()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU dry run (a GPU machine runs the real check)')
def test_the_dry_run_runs_every_section_and_says_what_needs_cuda(tmp_path):
    proc, sections, report = dry_run(tmp_path, '--budget', '800', '--slack', '4')    # the suite loads the machine
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [s for s in sections] == [key for _, key, *_ in gpu_check.SECTIONS]
    assert sections['environment']['status'] == 'passed'
    for key, section in sections.items():
        if key != 'environment':
            assert section['status'] == 'skipped: no CUDA', (key, section['summary'])
    assert sections['cuda_tests']['data']['skipped'] == sections['cuda_tests']['data']['tests'] > 0
    assert all(r['steady_total'] == [1] * 6 for r in sections['loop_syncs']['data'].values())
    assert sections['recipe']['data']['bit_equal_repeat'] and sections['recipe']['data']['bit_equal_resume']
    assert len(sections['field']['data']) == len(gpu_check.field_runs())
    assert all('test_acc' in r for r in sections['field']['data'].values())
    assert '## 7. The field on the GPU' in report and 'passed' not in report.split('## 2.')[1].split('\n')[0]
    assert sorted(os.listdir(tmp_path)) == ['gpu_check.log', 'gpu_report.json', 'gpu_report.md']


@pytest.mark.slow
@pytest.mark.parametrize('how,status', [('fail', 'failed'), ('hang', 'timed out')])
def test_a_failing_or_hanging_section_is_recorded_and_the_next_runs(tmp_path, how, status):
    budget = '40' if how == 'hang' else '200'     # the hanging section is stopped at the budget
    proc, sections, report = dry_run(tmp_path, '--sections', '2,3', '--budget', budget,
                                     env={'GPU_CHECK_SABOTAGE': f'environment:{how}'})
    assert proc.returncode == 1
    assert sections['environment']['status'] == status
    if how == 'fail':
        assert 'sabotaged section environment' in sections['environment']['summary']
        assert sections['cuda_tests']['status'] == 'skipped: no CUDA'      # the next one ran
    else:
        assert all(s['status'] == 'skipped: out of time' for k, s in sections.items() if k != 'environment')
    assert f'1. Environment: {status}' in report


def test_sections_parse_and_the_environment_always_runs():
    assert gpu_check.parse_sections('4') == {1, 4}
    assert gpu_check.parse_sections('2-4,7') == {1, 2, 3, 4, 7}
    with pytest.raises(SystemExit):
        gpu_check.parse_sections('8')


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

