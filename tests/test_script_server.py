"""tests/script_server.py through helpers.start_script / run_script: a forked run behaves as ``python script args``
would (exit status, a traceback's 1, a signal's -N, stdout and stderr, the environment and thread count, the
repo's modules imported afresh), a timeout kills the run and the next one still works."""
import os
import signal
import subprocess
import textwrap

import pytest

from helpers import run_script, script_env, start_script

pytestmark = pytest.mark.slow      # starts the worker's script server if no test has yet


def write(tmp_path, name, code):
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return str(path)


def test_a_forked_run_is_a_fresh_script(tmp_path):
    script = write(tmp_path, 'probe.py', '''
        import os, sys, torch
        sys.path.insert(0, os.getcwd())      # the repo root: the runs' working directory
        from config import cli
        print('argv', sys.argv[1:], 'cwd', os.getcwd())
        print('threads', torch.get_num_threads(), os.environ['OMP_NUM_THREADS'], os.environ.get('PROBE'))
        print('main pid', cli._MAIN_PID == os.getpid())     # the repo's modules are this process's own
        print('to stderr', file=sys.stderr)
        sys.exit(3)
    ''')
    os.environ['PROBE'] = 'seen'
    try:
        proc = run_script(script, 'a', 2, check=False)
    finally:
        del os.environ['PROBE']
    threads = script_env()['OMP_NUM_THREADS']
    assert proc.returncode == 3 and proc.stderr == 'to stderr\n'
    assert proc.stdout.splitlines() == [f"argv ['a', '2'] cwd {os.path.dirname(os.path.dirname(__file__))}",
                                        f'threads {threads} {threads} seen', 'main pid True']


def test_an_exception_a_signal_and_a_timeout(tmp_path):
    boom = run_script(write(tmp_path, 'boom.py', 'raise ValueError("boom")\n'), check=False)
    assert boom.returncode == 1 and 'Traceback' in boom.stderr and 'ValueError: boom' in boom.stderr
    sleeper = write(tmp_path, 'sleep.py', 'import time\nprint("up", flush=True)\ntime.sleep(60)\n')
    proc = start_script(sleeper, [])
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with pytest.raises(subprocess.TimeoutExpired):
        run_script(sleeper, timeout=1)
    assert run_script(write(tmp_path, 'ok.py', 'print("after")\n')).stdout == 'after\n'     # still in step


def test_time_limits_grow_with_the_machine_s_load(monkeypatch):
    """The end-to-end tests' limits follow the machine: twice the limit at one busy process per core, and at least
    SUITE_SLACK times it where that is set."""
    import helpers
    monkeypatch.setattr(helpers.os, 'getloadavg', lambda: (float(os.cpu_count() or 1), 0.0, 0.0))
    monkeypatch.delenv('SUITE_SLACK', raising=False)
    assert helpers.scaled(600) == 1200
    monkeypatch.setenv('SUITE_SLACK', '3')
    assert helpers.scaled(600) == 1800


def test_a_script_s_own_children_are_forked_and_behave_as_real_processes(tmp_path):
    """A script started with ``sys.executable`` from a forked script goes through the shim and the stage server: its
    argv, working folder, environment, stdin/stdout/stderr and exit status are its own; a signal sent to the client
    reaches the script (and its death by that signal comes back); a client killed outright takes its script with it;
    ``-m`` runs the module in the real interpreter (``-u -m`` too: a SLURM job's submitit), with the shim as its
    ``sys.executable``, so that a script it starts is forked in turn. The power check: the child is not a fresh
    interpreter (torch is already imported when it starts)."""
    child = write(tmp_path, 'child.py', '''
        import os, sys, signal, time
        print('child', sys.argv[1:], os.getcwd(), os.environ.get('PROBE'), 'torch' in sys.modules, flush=True)
        print('line', sys.stdin.readline().strip(), file=sys.stderr, flush=True)
        if sys.argv[1] == 'wait':
            signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(7)))
            open(sys.argv[2], 'w').close()
            time.sleep(60)
        sys.exit(4)
    ''')
    write(tmp_path, 'shimprobe.py', f'''
        import subprocess, sys
        print('module', sys.executable.endswith('python_shim'), 'torch' in sys.modules, sys.argv[1:], flush=True)
        p = subprocess.run([sys.executable, {child!r}, 'y'], input='x\\n', capture_output=True, text=True)
        print('its child', p.returncode, p.stdout.split()[-1], flush=True)
    ''')
    parent = write(tmp_path, 'parent.py', f'''
        import os, signal, subprocess, sys, time
        sys.stdout.reconfigure(line_buffering=True)
        print('shim', sys.executable.endswith('python_shim'))
        env = {{**os.environ, 'PROBE': 'given'}}
        p = subprocess.run([sys.executable, {child!r}, 'x'], cwd={str(tmp_path)!r}, env=env, input='hello\\n',
                           capture_output=True, text=True)
        print('run', p.returncode, repr(p.stdout), repr(p.stderr))
        flag = {str(tmp_path / 'up')!r}
        for how in ('term', 'kill'):
            if os.path.exists(flag):
                os.unlink(flag)
            q = subprocess.Popen([sys.executable, {child!r}, 'wait', flag], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            while not os.path.exists(flag):
                time.sleep(0.02)
            q.send_signal(signal.SIGTERM if how == 'term' else signal.SIGKILL)
            out, _ = q.communicate(timeout=60)
            print(how, q.returncode, repr(out.splitlines()[-1]))
        m = subprocess.run([sys.executable, '-m', 'json.tool'], input='[1]', capture_output=True, text=True)
        print('m', m.returncode, repr(m.stdout.strip()))
        m = subprocess.run([sys.executable, '-u', '-m', 'shimprobe', 'arg'], cwd={str(tmp_path)!r}, capture_output=True,
                           text=True)
        print('module m', m.returncode, repr(m.stdout))
    ''')
    out = run_script(parent, timeout=120).stdout.splitlines()
    assert out[0] == 'shim True'
    assert out[1] == (f"run 4 \"child ['x'] {tmp_path} given True\\n\" 'line hello\\n'")
    assert out[2] == "term 7 'got TERM'"
    assert out[3] == f"kill {-signal.SIGKILL} 'got TERM'"     # the client died at once; its script got SIGTERM
    assert out[4] == "m 0 '[\\n    1\\n]'"
    # the module in a real interpreter (no torch), the shim its sys.executable, its own child forked (torch there)
    assert out[5] == "module m 0 \"module True False ['arg']\\nits child 4 True\\n\""
