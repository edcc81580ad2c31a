"""core/requirements.py: every command, run by a Python without the requirements, says so in one line (exit 2) that
names what is missing and the environment to use, instead of a ModuleNotFoundError traceback."""
import subprocess
import sys

import pytest

from helpers import ROOT

COMMANDS = ['main_supcon.py', 'main_ce.py', 'main_linear.py', 'sweep.py', 'compare.py', 'analyze.py', 'export.py']


@pytest.mark.parametrize('script', COMMANDS)
def test_a_python_without_torch_gets_one_line(script):
    code = ("import runpy, sys\nsys.modules['torch'] = None\n"        # this Python cannot import torch
            f"sys.argv = [{script!r}, '--help']\nrunpy.run_path({script!r}, run_name='__main__')\n")
    out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and 'Traceback' not in out.stderr, out.stderr
    assert lines[0].startswith(f'{script}: error: torch not installed in this Python') and '.venv' in lines[0]


def test_the_check_comes_before_any_third_party_import():
    """Power: in each command the check is the first import that is not the standard library's."""
    import ast
    import pathlib
    for script in COMMANDS:
        tree = ast.parse((pathlib.Path(ROOT) / script).read_text())
        imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = [(n.names[0].name if isinstance(n, ast.Import) else n.module) for n in imports]
        outside = [n for n in names if n.split('.')[0] not in sys.stdlib_module_names]
        assert outside and outside[0] == 'core.requirements', (script, outside[:3])


def test_a_sweeps_status_needs_no_torch(tmp_path):
    """``sweep.py FILE --status`` reads the sweep's files only: a Python without torch (and Optuna) prints it, as
    USAGE promises; the same Python running the sweep gets the one line."""
    sweep = tmp_path / 's.yaml'
    sweep.write_text(f'name: s\nsave_folder: {tmp_path}\nbase: {{dataset: digits, epochs: 1}}\n'
                     'methods: {SupCon: {method: SupCon}}\nseeds: [0]\n')
    code = ("import runpy, sys\nsys.path.insert(0, '.')\nsys.modules['torch'] = None\nsys.modules['optuna'] = None\n"
            f"sys.argv = ['sweep.py', {str(sweep)!r}, *sys.argv[1:]]\n"
            "runpy.run_path('sweep.py', run_name='__main__')\n")
    status = subprocess.run([sys.executable, '-c', code, '--status'], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert status.returncode == 0 and 'Traceback' not in status.stderr, status.stderr
    assert 'SupCon seed 0' in status.stdout
    run = subprocess.run([sys.executable, '-c', code, '--dry-run'], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and run.stderr.strip().startswith('sweep.py: error: torch not installed'), run.stderr
