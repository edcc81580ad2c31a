"""tests/script_server.py through helpers.start_script / run_script: a forked run behaves as ``python script args``
would (exit status, a traceback's 1, a signal's -N, stdout and stderr, the environment and thread count, the
repo's modules imported afresh), a timeout kills the run and the next one still works."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from helpers import ROOT, run_script, script_env, start_script

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
    """What a forked script starts through ``runtime.processes.start`` (as a sweep its stages) with this Python is
    forked from it: its argv, working folder, environment, stdin/stdout/stderr, exit status and death by a signal are
    its own; the parent's signal handlers, exit handlers and pipes are not; the repo's modules are imported afresh;
    ``-m`` runs a module, and a module's own children are forked in turn. Anything else starts for real. The power
    check: the child did not start an interpreter (torch is imported when it starts)."""
    child = write(tmp_path, 'child.py', '''
        import atexit, os, sys, signal, time
        sys.path.insert(0, os.getcwd() if os.path.exists('sweep.py') else os.environ['REPO'])
        from config import cli
        atexit.register(lambda: print('its exit handler', flush=True))
        print('child', sys.argv[1:], os.getcwd(), os.environ.get('PROBE'), 'torch' in sys.modules,
              signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, cli._MAIN_PID == os.getpid(), flush=True)
        print('line', sys.stdin.readline().strip(), file=sys.stderr, flush=True)
        if sys.argv[1] == 'wait':
            open(sys.argv[2], 'w').close()
            time.sleep(60)
        sys.exit(4)
    ''')
    write(tmp_path, 'modprobe.py', f'''
        import subprocess, sys
        sys.path.insert(0, {ROOT!r})
        from runtime import processes
        print('module', 'torch' in sys.modules, sys.argv[1:], flush=True)
        p = processes.start([sys.executable, {child!r}, 'y'], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={{'REPO': {ROOT!r}}})
        print('its child', *p.communicate('x\\n')[0].splitlines()[0].split()[-3:], p.returncode, flush=True)
    ''')
    parent = write(tmp_path, 'parent.py', f'''
        import atexit, os, signal, subprocess, sys, time
        sys.stdout.reconfigure(line_buffering=True)
        sys.path.insert(0, os.getcwd())
        from config import cli
        from runtime import processes
        atexit.register(lambda: print('the parent exit handler'))
        signal.signal(signal.SIGTERM, lambda *a: print('the parent handler'))
        kept = subprocess.Popen(['sleep', '60'], stdout=subprocess.PIPE)      # a pipe the child must not hold
        env = {{**os.environ, 'PROBE': 'given', 'REPO': os.getcwd()}}
        p = processes.start([sys.executable, {child!r}, 'x'], cwd={str(tmp_path)!r}, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = p.communicate('hello\\n', timeout=60)
        print('run', p.returncode, repr(out), repr(err))
        flag = {str(tmp_path / 'up')!r}
        q = processes.start([sys.executable, {child!r}, 'wait', flag], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        while not os.path.exists(flag):
            time.sleep(0.02)
        q.send_signal(signal.SIGTERM)
        q.communicate(timeout=60)
        print('term', q.returncode)
        m = processes.start([sys.executable, '-u', '-m', 'modprobe', 'arg'], cwd={str(tmp_path)!r},
                            stdout=subprocess.PIPE, text=True)
        print('module m', m.wait(timeout=60), repr(m.stdout.read()))
        real = processes.start(['sh', '-c', 'echo real $PPID'], stdout=subprocess.PIPE, text=True)
        print(real.communicate()[0].strip() == f'real {{os.getpid()}}')
        kept.kill()
        print('pipe', kept.stdout.read() == b'')
    ''')
    out = run_script(parent, timeout=120).stdout.splitlines()
    assert out[0] == (f"run 4 \"child ['x'] {tmp_path} given True True True\\nits exit handler\\n\" "
                      "'line hello\\n'")
    assert out[1] == f'term {-signal.SIGTERM}'
    assert out[2] == "module m 0 \"module True ['arg']\\nits child True True True 4\\n\""
    assert out[3:] == ['True', 'pipe True', 'the parent exit handler']


def test_the_server_names_the_pythons_it_relies_on_and_falls_back_on_others(monkeypatch):
    """The script server reads private internals of subprocess and atexit: it runs on the Pythons of
    helpers.CHECKED_PYTHONS whose internals are there (this one among them, or the suite says it fell back), and on
    any other the suite sets SUITE_SUBPROCESS=1 and says so in one line, rather than failing."""
    import helpers
    assert helpers.CHECKED_PYTHONS == ((3, 11), (3, 12))
    usable, why = helpers.script_server_usable()
    assert usable or os.environ.get('SUITE_SUBPROCESS') == '1', why
    monkeypatch.delenv('SUITE_SUBPROCESS', raising=False)
    line = helpers.use_subprocesses_unless_the_server_can_run((3, 99))
    assert os.environ['SUITE_SUBPROCESS'] == '1'
    assert line == ('tests: Python 3.99 is not one the script server was checked on (3.11, 3.12): the scripts run '
                    'as real subprocesses (slower, the same tests)')
    proc = helpers.start_script('main_supcon.py', ['--help'])
    out, _ = proc.communicate(timeout=120)
    assert isinstance(proc, subprocess.Popen) and proc.returncode == 0 and '--method' in out     # a real interpreter
    if sys.version_info[:2] in helpers.CHECKED_PYTHONS:          # power: without an internal it reads, not usable
        monkeypatch.delattr(subprocess.Popen, '_close_pipe_fds')
        assert helpers.script_server_usable() == (False, 'this Python lacks the internals the script server reads '
                                                         '(_close_pipe_fds)')
