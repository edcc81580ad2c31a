"""scripts/env.sh, which every launcher sources: a Python that lacks the requirements is one line naming them, before
anything runs; one that has them passes without importing them (torch and torchvision would cost seconds of CPU on
every launch)."""
import os
import subprocess
import sys

from helpers import ROOT, assert_one_line_error, scaled


def source_env(tmp_path, python, *flags):
    shim = tmp_path / 'python'
    shim.write_text(f'#!/bin/sh\nexec {python} {" ".join(flags)} "$@"\n')
    shim.chmod(0o755)
    return subprocess.run(['bash', '-c', 'source scripts/env.sh && echo "sourced in $PWD"'], cwd=ROOT,
                          capture_output=True, text=True, timeout=scaled(60), env={**os.environ, 'PY': str(shim)})


def test_a_python_without_the_requirements_is_one_line(tmp_path):
    out = source_env(tmp_path, sys.executable, '-S')          # -S: no site-packages, so none of them is found
    assert_one_line_error(out, 'torch, torchvision, sklearn, tensorboard, tqdm not installed in', 'requirements.txt')
    assert 'sourced' not in out.stdout


def test_a_python_with_them_passes_without_importing_them(tmp_path):
    out = source_env(tmp_path, sys.executable, '-X', 'importtime')
    assert out.returncode == 0 and out.stdout.strip() == f'sourced in {ROOT}', out.stderr
    imported = {line.split('|')[-1].strip() for line in out.stderr.splitlines() if line.startswith('import time:')}
    assert imported and not imported & {'torch', 'torchvision', 'sklearn', 'tensorboard', 'tqdm'}, imported
