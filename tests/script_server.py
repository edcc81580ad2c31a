"""The suite's script server (tests/helpers.py, ``start_script``): imports torch and the other libraries once, then
forks one child per request, which runs a script as ``python <script> args`` would once its interpreter has
started. This saves each end-to-end run an interpreter start and the torch import (several seconds on 2 cores).

Protocol, one request at a time: a JSON line ``{"argv", "env", "out", "err", "sigint"}`` on stdin; the server answers a
line with the child's pid, then, when the child has ended, a line with its status (the exit code, or ``-N``
for signal ``N``, as ``subprocess`` reports it). The server ends at the end of its stdin."""
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


def run_child(argv, env, out, err, sigint):
    """In the forked child: the environment, stdout/stderr into files, ``argv[0]`` run as ``__main__`` in the
    repo root; exits with the script's status (a traceback on stderr and 1 for an exception, as the
    interpreter). SIGINT as the server inherited it (ignored in a shell's background job, as in CI), or with
    ``sigint`` Python's own handling, as in a terminal."""
    import runpy
    import signal
    import traceback
    if sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    if env.get('OMP_NUM_THREADS', '').isdigit():
        torch.set_num_threads(int(env['OMP_NUM_THREADS']))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout.reconfigure(line_buffering=True)
    os.chdir(ROOT)
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


def serve():
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


if __name__ == '__main__':
    serve()
