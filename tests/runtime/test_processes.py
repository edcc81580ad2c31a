"""runtime/processes.py: the one place the sweeps and the GPU check start their child processes."""
import os
import subprocess
import sys

from helpers import ROOT


def test_start_is_popen_and_a_caller_can_replace_it(monkeypatch):
    from runtime import processes
    proc = processes.start([sys.executable, '-c', 'print(6 * 7)'], stdout=subprocess.PIPE, text=True)
    assert isinstance(proc, subprocess.Popen) and proc.communicate()[0] == '42\n' and proc.returncode == 0
    seen = []
    monkeypatch.setattr(processes, 'Popen', lambda cmd, **kwargs: seen.append((cmd, kwargs)) or 'handle')
    assert processes.start(['x', 'y'], cwd='/') == 'handle' and seen == [(['x', 'y'], {'cwd': '/'})]


def test_the_sweeps_and_the_gpu_check_start_processes_only_through_it():
    """A ``subprocess.Popen`` of their own would start its child past the seam (the suite would not fork it)."""
    found = []
    for folder in ('sweeping', os.path.join('benchmarks', 'gpu_check')):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith('.py'):
                    with open(os.path.join(dirpath, name)) as f:
                        if 'subprocess.Popen(' in f.read():
                            found.append(os.path.join(dirpath, name))
    assert found == []
