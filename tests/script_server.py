"""The suite's script server (tests/helpers.py, ``start_script``): imports torch and the other libraries once, then
forks one child per request, which runs a script as ``python <script> args`` would once its interpreter has
started. This saves each end-to-end run an interpreter start and the torch import (several seconds on 2 cores).

Protocol, one request at a time: a JSON line ``{"argv", "env", "out", "err", "sigint"}`` on stdin; the server answers a
line with the child's pid, then, when the child has ended, a line with its status (the exit code, or ``-N``
for signal ``N``, as ``subprocess`` reports it). The server ends at the end of its stdin.

The scripts' own children. A script run here that starts another (a sweep its stages, the GPU check its sections
and runs) does so with ``sys.executable``, which here is ``tests/python_shim``: for ``<shim> <file>.py args`` that
shim runs ``tests/stage_client.py``, which hands the request (its argv, environment, working folder and its
stdin, stdout and stderr themselves) to this server's stage server over a Unix socket (``SCRIPT_SERVER_SOCKET``)
and waits, passing on the signals it gets; a supervisor forked for that request forks the script the same way, and
answers the client with the child's pid and then its status, which the client exits with (a death by signal as
that signal). A client that dies (SIGKILL) takes its script with it (SIGTERM, as a sweep's stages get when the
sweep dies). Anything else (``<shim> -m ...``, no server) runs the real interpreter."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT

# What the scripts import that is slow to import, once. Not the repo's own modules: their state at import (the
# main process's pid, say) must be the script's own, as in a fresh interpreter.
import numpy  # noqa: E402,F401
import PIL.Image  # noqa: E402,F401
import scipy.optimize  # noqa: E402,F401
import scipy.stats  # noqa: E402,F401
import sklearn.datasets  # noqa: E402,F401
import sklearn.manifold  # noqa: E402,F401
import sklearn.model_selection  # noqa: E402,F401
import torch  # noqa: E402
import torch.distributed  # noqa: E402,F401
import torch.utils.tensorboard  # noqa: E402,F401
import torchvision  # noqa: E402,F401
import torchvision.datasets  # noqa: E402,F401
import torchvision.transforms  # noqa: E402,F401
import tqdm  # noqa: E402,F401

# the trackers (requirements-trackers.txt), where installed, with what a run imports later: wandb.init imports W&B
# Launch's inputs (pydantic models, about 1.5 s), MLflow's SQLite store imports alembic and sqlalchemy (about 1 s)
for optional in ('mlflow', 'mlflow.store.tracking.sqlalchemy_store', 'alembic', 'wandb',
                 'wandb.sdk.launch.inputs.internal'):
    try:
        __import__(optional)
    except ImportError:
        pass

SHIM = os.path.join(ROOT, 'tests', 'python_shim')


def run_child(argv, env, out=None, err=None, sigint=False, fds=None, cwd=ROOT):
    """In the forked child: the environment, stdout/stderr into files, ``argv[0]`` run as ``__main__`` in the
    repo root; exits with the script's status (a traceback on stderr and 1 for an exception, as the
    interpreter). SIGINT as the server inherited it (ignored in a shell's background job, as in CI), or with
    ``sigint`` Python's own handling, as in a terminal. ``fds``: the stdin, stdout and stderr to take instead of
    /dev/null and the files ``out`` and ``err`` (a stage client's own); ``cwd``: the folder to run in."""
    import runpy
    import signal
    import traceback
    if sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    if env.get('OMP_NUM_THREADS', '').isdigit():
        torch.set_num_threads(int(env['OMP_NUM_THREADS']))
    if fds is None:
        fds = [os.open(os.devnull, os.O_RDONLY)] + [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                                                    for path in (out, err)]
    for fd, given in enumerate(fds):
        os.dup2(given, fd)
    for given in set(fds) - {0, 1, 2}:
        os.close(given)
    sys.stdout.reconfigure(line_buffering=True)
    sys.executable = SHIM          # what the script starts with sys.executable comes back here (see above)
    os.chdir(cwd)
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))      # as the interpreter sets it for a script
    code = 0
    try:
        runpy.run_path(argv[0], run_name='__main__')
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def supervise(conn):
    """In a process forked by the stage server for one client: start its script, pass on its signals, answer its
    status; never returns."""
    import select
    import signal
    import socket
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while not data.endswith(b'\n'):
        more = conn.recv(1 << 16)
        if not more:
            os._exit(1)
        data += more
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:
        try:
            conn.close()
            run_child(request['argv'], request['env'], sigint=request['sigint'], fds=fds, cwd=request['cwd'])
        finally:
            os._exit(1)
    for fd in fds:
        os.close(fd)
    conn.sendall(f'{pid}\n'.encode())
    child = os.pidfd_open(pid)
    buffer, client = b'', True
    while True:
        ready = select.select([child, conn] if client else [child], [], [])[0]
        if child in ready:
            _, status = os.waitpid(pid, 0)
            if client:
                try:
                    conn.sendall(f'{os.waitstatus_to_exitcode(status)}\n'.encode())
                except OSError:
                    pass
            os._exit(0)
        more = conn.recv(4096)
        if not more:                    # the client has died: its script goes too
            client = False
            os.kill(pid, signal.SIGTERM)
            continue
        buffer += more
        while b'\n' in buffer:
            line, buffer = buffer.split(b'\n', 1)
            try:
                os.kill(pid, int(line))
            except ProcessLookupError:
                pass


def serve_stages(listener):
    """The stage server: a supervisor (:func:`supervise`) per connection, until the script server has ended."""
    import select
    parent = os.getppid()
    while os.getppid() == parent:
        ready = select.select([listener], [], [], 1.0)[0]
        while True:                     # the supervisors that have ended
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if ready:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                try:
                    supervise(conn)
                finally:
                    os._exit(1)
            conn.close()
    os._exit(0)


def serve():
    path = os.environ.get('SCRIPT_SERVER_SOCKET')
    if path:
        import socket
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        listener.bind(path)
        listener.listen(64)
        if os.fork() == 0:
            serve_stages(listener)
        listener.close()
    answers = os.fdopen(os.dup(1), 'w', buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                run_child(**request)
            finally:
                os._exit(1)
        answers.write(f'{pid}\n')
        _, status = os.waitpid(pid, 0)
        answers.write(f'{os.waitstatus_to_exitcode(status)}\n')
    if path and os.path.exists(path):
        os.unlink(path)


if __name__ == '__main__':
    serve()
