"""The suite's script server (tests/helpers.py, ``start_script``): imports torch and the other libraries once, then
forks one child per request, which runs a script as ``python <script> args`` would once its interpreter has
started. This saves each end-to-end run an interpreter start and the torch import (several seconds on 2 cores).

Protocol, one request at a time: a JSON line ``{"argv", "env", "out", "err", "sigint"}`` on stdin; the server answers a
line with the child's pid, then, when the child has ended, a line with its status (the exit code, or ``-N``
for signal ``N``, as ``subprocess`` reports it). The server ends at the end of its stdin.

The scripts' own children. The project starts every Python child (a sweep its stages, the GPU check its sections
and runs) through ``runtime.processes.start``. A script run here gets :class:`ForkedPopen` there: ``[python,
<file>.py | -m <module>, args]`` is forked from the script's own process (torch imported already) and run as the
interpreter would run it; anything else (a shell, ``-c``) starts for real. ``python tests/script_server.py --run
<script> args`` runs one script the same way in this interpreter (a test that signals the script itself).
Processes that the project does not start (torchrun's workers, a SLURM job) are real interpreters."""
import json
import os
import subprocess
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



def python_form(args, executable):
    """``('script', path, argv)`` or ``('module', name, argv)`` for ``[python, (-u), <file>.py | -m <module>,
    args]`` run with this interpreter; None for anything else (started for real)."""
    args = [os.fspath(a) for a in args]
    if executable is not None or not args or os.path.realpath(args[0]) != os.path.realpath(sys.executable):
        return None
    rest = args[1:]
    if rest[:1] == ['-u']:              # unbuffered: the child's output is line-buffered here anyway
        rest = rest[1:]
    if len(rest) >= 2 and rest[0] == '-m':
        return 'module', rest[1], rest[1:]
    if rest and rest[0].endswith('.py') and not rest[0].startswith('-'):
        return 'script', rest[0], rest
    return None


def as_after_exec(env):
    """This forked process as a new interpreter would start: the environment ``env`` (None: as it is), the signal
    handlers that ``exec`` resets (a handler becomes the default, SIGINT Python's own unless ignored), fresh
    ``sys.stdin/stdout/stderr`` on fds 0-2 (a lock another thread held at the fork is not ours), the repo's
    modules to be imported afresh (their state at import, the main process's pid say, is the script's own), no
    exit handlers of the parent's, and the thread count that ``OMP_NUM_THREADS`` asks for."""
    import atexit
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    exec_signals()
    sys.stdin = sys.__stdin__ = open(0, closefd=False)
    sys.stdout = sys.__stdout__ = open(1, 'w', buffering=1, closefd=False)
    sys.stderr = sys.__stderr__ = open(2, 'w', buffering=1, errors='backslashreplace', closefd=False)
    for name, module in list(sys.modules.items()):
        if name != '__main__' and module is not sys.modules.get(__name__) and \
                (_repo_module(module) or name.split('.')[0] in FRESH_LIBRARIES):
            del sys.modules[name]
    atexit._clear()
    if os.environ.get('OMP_NUM_THREADS', '').isdigit():
        torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))
    install()


# libraries whose module state holds the process's own connections, imported afresh too: MLflow caches its stores
# (and their SQLite connections) by URI, so a stage forked from a sweep that had logged to MLflow read the sweep's
# connection (W&B checks the process id itself; SQLAlchemy's compiled extensions cannot be imported twice)
FRESH_LIBRARIES = ('mlflow',)


def exec_signals():
    """The signal handlers as ``exec`` leaves them: a handler becomes the default, SIGINT Python's own unless
    ignored, no wake-up fd."""
    import signal
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        if signum == signal.SIGINT:
            if handler is not signal.SIG_IGN:
                signal.signal(signum, signal.default_int_handler)
        elif callable(handler):
            signal.signal(signum, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)


def _repo_module(module):
    """Whether ``module`` is one of the repo's own (not an installed package in one of its virtualenvs: ``.venv``,
    ``.venv-gpu-image``)."""
    repo, venv = ROOT + os.sep, os.path.join(ROOT, '.venv')
    where = [getattr(module, '__file__', None)]
    try:
        where += list(getattr(module, '__path__', None) or [])
    except (TypeError, KeyError):      # a namespace package whose parent has left sys.modules
        pass
    return any(isinstance(w, str) and w.startswith(repo) and not w.startswith(venv) for w in where)


def install():
    """The project starts its Python children through :class:`ForkedPopen` (``runtime.processes``)."""
    import runtime.processes
    runtime.processes.Popen = ForkedPopen


def run_as_main(kind, target, argv):
    """Run a script (``kind`` ``'script'``, ``target`` its path) or a module (``'module'``, its name) as ``__main__``
    with ``sys.argv`` ``argv``, as ``python target`` / ``python -m target`` would; never returns. Exits with the
    script's status: its ``SystemExit``, 1 and a traceback for an exception, death by SIGINT for an uncaught
    ``KeyboardInterrupt``; the exit handlers it registered run first."""
    import atexit
    import runpy
    import signal
    import traceback
    sys.argv = list(argv)
    code, interrupted = 0, False
    try:
        if kind == 'module':
            sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name='__main__', alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))      # as the interpreter sets it for a script
            runpy.run_path(target, run_name='__main__')
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _popen_parameters():
    import inspect
    return list(inspect.signature(subprocess.Popen._execute_child).parameters)[1:]


class _Forked:
    """What :class:`ForkedPopen` does in the forked child, from ``Popen._execute_child``'s arguments."""

    @staticmethod
    def take_fds(a):
        """stdin/stdout/stderr as ``Popen`` gives them; every other inherited descriptor (another run's pipe, the
        parent's log or lock) pointed at /dev/null, as ``close_fds`` would close it, without closing a number that a
        Python object of the parent's still holds."""
        wanted = [a['p2cread'], a['c2pwrite'], a['errwrite']]
        held = [os.dup(fd) if fd != -1 else -1 for fd in wanted]
        for target, fd in enumerate(held):
            if fd != -1:
                os.dup2(fd, target)
        null = os.open(os.devnull, os.O_RDWR)
        keep = {0, 1, 2, null, *map(int, a['pass_fds'])}
        for name in os.listdir('/proc/self/fd'):
            fd = int(name)
            if fd not in keep:
                try:
                    os.dup2(null, fd)
                except OSError:
                    pass
        os.close(null)

    @staticmethod
    def run(a, form):
        """In the order of ``Popen``'s child: the session, the signals, ``preexec_fn`` (at once: a parent that
        dies now must still take the child with it), the descriptors, the folder, then the interpreter's start."""
        if a['start_new_session']:
            os.setsid()
        if a.get('process_group', -1) is not None and a.get('process_group', -1) >= 0:
            os.setpgid(0, a['process_group'])
        exec_signals()
        if a['preexec_fn'] is not None:
            a['preexec_fn']()
        _Forked.take_fds(a)
        if a['cwd'] is not None:
            os.chdir(a['cwd'])
        if a['umask'] >= 0:
            os.umask(a['umask'])
        env = None if a['env'] is None else {os.fsdecode(k): os.fsdecode(v) for k, v in a['env'].items()}
        as_after_exec(env)
        run_as_main(*form)



class ForkedPopen(subprocess.Popen):
    """``subprocess.Popen`` that forks ``[python, <file>.py | -m <module>, args]`` from this process and runs it as
    that interpreter would (:func:`as_after_exec`, :func:`run_as_main`), instead of starting an interpreter; pipes,
    files, ``cwd``, ``env``, ``start_new_session``, ``preexec_fn``, signals and the exit status work as for a real
    child. Any other command starts for real."""
    PARAMETERS = _popen_parameters()

    def _execute_child(self, *args):
        a = dict(zip(self.PARAMETERS, args))
        form = None if a['shell'] else python_form(a['args'], a['executable'])
        if form is None:
            return super()._execute_child(*args)
        pid = os.fork()
        if pid == 0:
            try:
                _Forked.run(a, form)
            except BaseException:
                _died()
            finally:
                os._exit(1)
        self.pid, self._child_created = pid, True
        self._close_pipe_fds(a['p2cread'], a['p2cwrite'], a['c2pread'], a['c2pwrite'], a['errread'], a['errwrite'])


def _died():
    """A forked child whose set-up failed: the error on its stderr, exit 1."""
    import traceback
    try:
        traceback.print_exc(file=sys.__stderr__)
        sys.__stderr__.flush()
    finally:
        os._exit(1)


def run_child(argv, env, out=None, err=None, sigint=False):
    """In a child forked for a request: stdin from /dev/null, stdout/stderr into the files ``out`` and ``err``,
    ``argv[0]`` run as ``__main__`` in the repo root (:func:`run_as_main`). SIGINT as the server inherited it
    (ignored in a shell's background job, as in CI), or with ``sigint`` Python's own handling, as in a terminal."""
    import signal
    fds = [os.open(os.devnull, os.O_RDONLY)] + [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                                                for path in (out, err)]
    for fd, given in enumerate(fds):
        os.dup2(given, fd)
        os.close(given)
    os.chdir(ROOT)
    if sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    as_after_exec(env)
    run_as_main('script', argv[0], argv)


def serve():
    answers = os.fdopen(os.dup(1), 'w', buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                answers.close()
                run_child(**request)
            except BaseException:
                _died()
            finally:
                os._exit(1)
        answers.write(f'{pid}\n')
        _, status = os.waitpid(pid, 0)
        answers.write(f'{os.waitstatus_to_exitcode(status)}\n')


if __name__ == '__main__':
    if sys.argv[1:2] == ['--run']:        # --run [-u] <script> args, or --run [-u] -m <module> args
        as_after_exec(None)
        given = sys.argv[3:] if sys.argv[2] == '-u' else sys.argv[2:]
        if given[0] == '-m':
            run_as_main('module', given[1], given[1:])
        run_as_main('script', given[0], given)
    serve()
