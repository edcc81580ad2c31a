"""Helpers for the end-to-end tests: run the real scripts, build small fake datasets."""
import importlib.util
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# --device cpu: the suite compares runs bit for bit, which holds on a CPU (on CUDA only with --deterministic); a
# machine with a GPU runs the CUDA tests of tests/test_cuda.py (pytest -m cuda) for that. --size 8 and --augment
# device: a digits epoch in a quarter of the time (the per-image PIL pipeline is three quarters of a 16-pixel
# epoch); --model resnet_nano: resnet_tiny at half the width, a quarter of the arithmetic (what these runs assert
# holds for any encoder; tests/test_networks.py builds every one, and the step-level tests keep resnet_tiny);
# CPU_AUGMENT puts the DataLoader's pipeline back, for the tests that are about it; FAST_FILES is FAST for datasets of
# image files (decoded by the DataLoader: its pipeline, their own --size and model).
FAST_FILES = ['--num_workers', '0', '--batch_size', '128', '--print_freq', '1000', '--device', 'cpu']
FAST = [*FAST_FILES, '--size', '8', '--augment', 'device', '--model', 'resnet_nano']
CPU_AUGMENT = ['--augment', 'cpu']


def free_port():
    """A TCP port of 127.0.0.1 that is free now (for a process group's rendezvous)."""
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def script_env(**extra):
    """The environment every subprocess of the suite runs in. One thread per script under pytest-xdist (the
    workers share the cores), two otherwise; the same for every run of a test, since a different thread
    count may round a convolution differently (the resume tests compare runs bit for bit)."""
    threads = '1' if 'PYTEST_XDIST_WORKER' in os.environ else '2'
    return {**os.environ, 'PYTHONUNBUFFERED': '1', 'OMP_NUM_THREADS': os.environ.get('OMP_NUM_THREADS', threads),
            **extra}


# The Pythons on which the suite ran through tests/script_server.py, whose private internals it relies on:
# subprocess.Popen's _execute_child (its parameters, by name), _close_pipe_fds and _child_created, and atexit's _clear
# and _run_exitfuncs. On any other Python the suite starts real interpreters instead (SUITE_SUBPROCESS=1).
CHECKED_PYTHONS = ((3, 11), (3, 12))
SERVER_READS = ('args', 'executable', 'preexec_fn', 'pass_fds', 'cwd', 'env', 'shell', 'p2cread', 'p2cwrite',
                'c2pread', 'c2pwrite', 'errread', 'errwrite', 'umask', 'start_new_session')


def script_server_usable(version=None):
    """``(usable, why not)``: whether tests/script_server.py can fork the scripts on this Python (``version``: another
    ``(major, minor)`` to ask about): one of :data:`CHECKED_PYTHONS`, with the private internals it reads present."""
    import atexit
    import inspect
    version = tuple(sys.version_info[:2] if version is None else version)
    if version not in CHECKED_PYTHONS:
        return False, (f'Python {version[0]}.{version[1]} is not one the script server was checked on '
                       f'({", ".join(f"{a}.{b}" for a, b in CHECKED_PYTHONS)})')
    params = set(inspect.signature(subprocess.Popen._execute_child).parameters)
    missing = [p for p in SERVER_READS if p not in params]
    missing += [name for owner, name in ((subprocess.Popen, '_close_pipe_fds'), (atexit, '_clear'),
                                         (atexit, '_run_exitfuncs')) if not hasattr(owner, name)]
    if missing:
        return False, f'this Python lacks the internals the script server reads ({", ".join(missing)})'
    return True, ''


def use_subprocesses_unless_the_server_can_run(version=None):
    """Set ``SUITE_SUBPROCESS=1`` (real interpreters) when the script server cannot run here; returns the one line
    that says so, or ``''``."""
    if os.environ.get('SUITE_SUBPROCESS') == '1':
        return ''
    usable, why = script_server_usable(version)
    if usable:
        return ''
    os.environ['SUITE_SUBPROCESS'] = '1'
    return f'tests: {why}: the scripts run as real subprocesses (slower, the same tests)'


def own_process(*target):
    """``[python, ..., target]`` for a script (``'sweep.py'``) or a module (``'-m', 'benchmarks.gpu_check'``) that
    a test starts and signals itself (SIGKILL included): a real interpreter that has imported torch and whose own
    Python children are forked (``tests/script_server.py --run``); with ``SUITE_SUBPROCESS=1`` the plain one."""
    if os.environ.get('SUITE_SUBPROCESS') == '1':
        return [sys.executable, *target]
    return [sys.executable, os.path.join(ROOT, 'tests', 'script_server.py'), '--run', *target]


def own_python():
    """:func:`own_process` as one command line, for a sweep file's ``slurm: python:`` (a SLURM job's Python)."""
    import shlex
    return shlex.join(own_process())


def machine_slack():
    """How much slower than an idle machine this one runs now: 1 plus its load per core (the 1-minute load average,
    read at each call), at least ``SUITE_SLACK`` where that is set (a machine known to be slow). The end-to-end
    tests' time limits are multiplied by it, as the GPU check's bounds are (``--slack auto``), so a busy machine makes
    a run slow, not a failure."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load = 0.0
    return max(1.0 + load, float(os.environ.get('SUITE_SLACK') or 1))


def scaled(seconds):
    """A time limit of ``seconds`` on an idle machine, scaled to this one now (:func:`machine_slack`)."""
    return seconds * machine_slack()


def run_script(script, *args, check=True, timeout=600, env=None):
    """Run ``python <script> args`` in the repo root; returns a ``CompletedProcess`` (``returncode``, ``stdout``,
    ``stderr``). The script runs in a process of its own (:func:`start_script`), its environment
    :func:`script_env` and ``env``."""
    proc = start_script(script, args, env=env)
    try:
        out, err = proc.communicate(timeout=scaled(timeout))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)        # a Popen's child outlives its timeout otherwise
        proc.communicate()
        raise
    if check and proc.returncode != 0:
        raise AssertionError(f'{script} failed ({proc.returncode}):\n{out[-3000:]}\n{err[-3000:]}')
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def start_script(script, args, sigint=False, env=None):
    """Start ``python <script> args`` in the repo root (environment :func:`script_env`); returns a handle with
    ``Popen``'s ``args``, ``pid``, ``poll``, ``send_signal``, ``communicate`` and ``returncode``. ``sigint``: the
    script gets the default SIGINT handling back, as a terminal's foreground job has it (a shell's background
    job, as in CI, inherits SIGINT ignored, and so do the tests' children).

    The process is forked from a script server that has imported torch and the scripts once per pytest worker
    (tests/script_server.py): no interpreter start and no torch import per run, which hundreds of end-to-end
    runs would otherwise pay (several seconds each on 2 cores). ``SUITE_SUBPROCESS=1`` starts a fresh
    interpreter instead."""
    argv = [os.path.join(ROOT, script), *map(str, args)]
    if os.environ.get('SUITE_SUBPROCESS') == '1':
        return subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=script_env(**(env or {})),
                                preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if sigint else None)
    return ForkedScript(argv, script_env(**(env or {})), sigint)


class ForkedScript:
    """A script run by this worker's script server (one at a time: the server waits for each child)."""
    server = None
    running = None      # the last one started: killed if it still runs when the next starts (a failed test's)

    def __init__(self, argv, env, sigint):
        import json
        if not ForkedScript.start_server(env) and ForkedScript.running is not None \
                and ForkedScript.running.poll() is None:
            ForkedScript.running.send_signal(signal.SIGKILL)
            ForkedScript.running.poll(None)
        self.server, self.args, self.returncode = ForkedScript.server, [sys.executable, *argv], None
        self.folder = tempfile.TemporaryDirectory()
        self.out, self.err = (os.path.join(self.folder.name, name) for name in ('stdout', 'stderr'))
        request = {'argv': argv, 'env': env, 'out': self.out, 'err': self.err, 'sigint': sigint}
        self.server.stdin.write((json.dumps(request) + '\n').encode())
        self.pid = int(self._line())
        ForkedScript.running = self

    @staticmethod
    def start_server(env):
        """Start this worker's script server unless it runs; whether it was started now."""
        if ForkedScript.server is not None and ForkedScript.server.poll() is None:
            return False
        ForkedScript.server = subprocess.Popen([sys.executable, os.path.join(ROOT, 'tests', 'script_server.py')],
                                               cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                               env=env)
        ForkedScript.running = None
        return True

    def _line(self):
        """One line of the server's answer, byte by byte (nothing read ahead, so ``select`` sees the next)."""
        line = b''
        while not line.endswith(b'\n'):
            byte = self.server.stdout.read(1)
            if not byte:
                raise RuntimeError('the script server (tests/script_server.py) has ended')
            line += byte
        return line.decode()

    def poll(self, timeout=0):
        import select
        if self.returncode is None and select.select([self.server.stdout], [], [], timeout)[0]:
            self.returncode = int(self._line())
        return self.returncode

    def send_signal(self, signum):
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:       # it has ended already: its exit status says how
                pass

    def communicate(self, timeout=None):
        try:
            if self.poll(timeout) is None:
                self.send_signal(signal.SIGKILL)
                self.poll(None)
                raise subprocess.TimeoutExpired(self.args, timeout)
            return tuple(_read_text(path) for path in (self.out, self.err))
        finally:
            self.folder.cleanup()


def _read_text(path):
    """A forked run's output file; '' if the run ended before it opened it (killed at once)."""
    try:
        with open(path, errors='replace') as f:
            return f.read()
    except FileNotFoundError:
        return ''


def method_modes(queue=('--queue_size', '64'), carrot=('--carrot',), skip=()):
    """``{name: argv}`` of every method of the registry (``methods.METHODS``, read when called: a method registered
    by a test is in it): each method alone; with every feature its definition allows (``queue`` where it takes one,
    ``carrot`` where it uses labels); and each other value of its own flags with choices (RASCAL's weightings, TSC's
    assignment, SupCon's loss family). The per-method tests take their modes from here, so a new method is covered by
    registering it."""
    from methods import METHODS
    modes = {}
    for name, method in METHODS.items():
        if name in skip:
            continue
        base = ['--method', name]
        modes[name] = base
        extra = [*(queue if method.takes_queue else ()), *(carrot if method.uses_labels else ())]
        if extra:
            features = ' + '.join(f for f, on in (('queue', method.takes_queue), ('CARROT', method.uses_labels)) if on)
            modes[f'{name} + {features}'] = base + list(extra)
        for flag, kwargs in method.flags.items():
            for choice in kwargs.get('choices', ()):
                if choice != kwargs.get('default'):
                    modes[f'{name} {flag}={choice}'] = base + [flag, str(choice)]
    return modes


def method_flag_needs():
    """``{flag: argv}``: each method's own flag with the ``--method`` that has it (given alone it is refused)."""
    from methods import method_flags
    return {flag: ['--method', owners[0]] for flag, (_, owners) in method_flags().items()}


def make_options(script='supcon', **flags):
    """Options as ``script``'s parser makes them (``options.parse_option``), from flags given as keywords:
    ``make_options(dataset='digits', size=8, label_noise=0.2)`` is ``--dataset digits --size 8 --label_noise 0.2``
    (``True``: the flag alone; ``None`` or ``False``: left out). The suite never builds options by hand, so a new
    flag cannot break a test (``tests/test_layering.py`` pins it)."""
    from config.options import parse_option
    argv = []
    for name, value in flags.items():
        if value is None or value is False:
            continue
        argv.append(f'--{name}')
        if value is not True:
            argv.append(str(value))
    return parse_option(script, argv)


def run_in_process(script, *args):
    """Run ``script`` as ``python <script> args`` would, but in this process (``runpy``, as ``__main__``), for the
    error paths that stop before training: no interpreter start, no torch import. Returns an object with
    ``returncode``, ``stdout`` and ``stderr`` like :func:`run_script`'s. The working directory, ``sys.argv``,
    the SIGTERM and SIGINT handlers and the global RNG states are restored afterwards; an exception that the script does
    not turn into a one-line error propagates (the test fails, as a traceback would)."""
    import contextlib
    import io
    import random
    import runpy
    saved = (os.getcwd(), sys.argv, signal.getsignal(signal.SIGTERM), random.getstate(), np.random.get_state(),
             torch.get_rng_state(), signal.getsignal(signal.SIGINT))
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        os.chdir(ROOT)
        sys.argv = [os.path.join(ROOT, script), *map(str, args)]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(sys.argv[0], run_name='__main__')
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(saved[0])
        sys.argv = saved[1]
        signal.signal(signal.SIGTERM, saved[2])
        random.setstate(saved[3])
        np.random.set_state(saved[4])
        torch.set_rng_state(saved[5])
        signal.signal(signal.SIGINT, saved[6])
    return subprocess.CompletedProcess([script, *args], code, out.getvalue(), err.getvalue())


def signal_after_first_checkpoint(script, args, folder, signum, delay):
    """Start ``script args``, send ``signum`` ``delay`` seconds after the first ``last.pth`` appears under
    ``folder``; returns (finished process, that last.pth or None, stderr). The child gets SIGINT back, as a
    terminal's foreground job has it (a shell's background job, as in CI, inherits it ignored)."""
    proc = start_script(script, args, sigint=True)
    deadline, last = time.time() + 300, None
    while time.time() < deadline and proc.poll() is None:
        found = [os.path.join(d, 'last.pth') for d, _, fs in os.walk(folder) if 'last.pth' in fs]
        if found:
            time.sleep(delay)
            last = found[0]
            proc.send_signal(signum)
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=120)
    return proc, last, err


def only_run_folder(root):
    """The single run folder (the one holding last.pth) below ``root``."""
    found = [d for d, _, files in os.walk(root) if 'last.pth' in files]
    assert len(found) == 1, found
    return found[0]


def read_metrics(folder):
    from runtime.run_log import read_metrics as rows
    assert os.path.isfile(os.path.join(folder, 'metrics.csv')), folder
    return rows(folder)


def load(path):
    return torch.load(path, map_location='cpu', weights_only=True)


def make_fake_cifar(root, n_train=40, n_test=20, n_classes=10, hundred=False, seed=0):
    """Files laid out like the python-version CIFAR archives, with random images."""
    rng = np.random.default_rng(seed)
    folder = os.path.join(root, 'cifar-100-python' if hundred else 'cifar-10-batches-py')
    os.makedirs(folder, exist_ok=True)
    key = 'fine_labels' if hundred else 'labels'

    def batch(n):
        return {'data': rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                key: [int(i % n_classes) for i in range(n)]}

    names = ['train', 'test'] if hundred else [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']
    for name in names:
        n = n_test if 'test' in name else (n_train if hundred else n_train // 5)
        with open(os.path.join(folder, name), 'wb') as f:
            pickle.dump(batch(n), f)
    meta = {'fine_label_names': [f'c{i}' for i in range(n_classes)]} if hundred else \
        {'label_names': [f'c{i}' for i in range(n_classes)]}
    with open(os.path.join(folder, 'meta' if hundred else 'batches.meta'), 'wb') as f:
        pickle.dump(meta, f)
    return root


def make_image_folder(root, classes=('a', 'b', 'c'), per_class=6, size=12, seed=0):
    from PIL import Image
    rng = np.random.default_rng(seed)
    for split in ('train', 'val'):
        for c in classes:
            d = os.path.join(root, split, c)
            os.makedirs(d, exist_ok=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
                    os.path.join(d, f'{i}.png'))
    return root


def unit(*shape, dtype=torch.float64, seed=0):
    """Random unit vectors along the last dim (seeded)."""
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=dtype), dim=-1)


# The inputs of the loss tests (B, V, labels): random classes (drawn from 3); one class; a class with a single sample;
# classes absent from the batch (labels 1-3 and 5-8); B = 1; one view
LOSS_CASES = {
    'random': (12, 2, None),
    'three views': (7, 3, None),
    'one class': (6, 2, [3] * 6),
    'singleton class': (5, 2, [0, 0, 1, 2, 2]),
    'absent class': (6, 2, [0, 0, 4, 4, 9, 9]),
    'B = 1': (1, 2, [0]),
    'B = 1, one view': (1, 1, [0]),
    'one view, singletons': (4, 1, [0, 1, 1, 2]),
    'long tail': (15, 2, [2] * 8 + [0] * 4 + [5] * 2 + [1]),     # 16, 8, 4 and 2 rows: four size groups
}


def loss_case(name, seed=0, d=6):
    """``LOSS_CASES[name]`` as ``(features [B, V, d] unit rows, labels [B])``, seeded."""
    bsz, n_views, labels = LOSS_CASES[name]
    feats = unit(bsz, n_views, d, seed=seed)
    if labels is None:
        labels = torch.randint(0, 3, (bsz,), generator=torch.Generator().manual_seed(seed))
    return feats, torch.as_tensor(labels)


def loss_queue(k=9, d=6, n_classes=3, seed=0):
    """A ``memory_queue.QueueView`` of ``k`` unit keys with labels in ``[0, n_classes)``, about 70 % valid."""
    from training.memory_queue import QueueView
    g = torch.Generator().manual_seed(seed)
    valid = torch.rand(k, generator=g) < 0.7
    return QueueView(unit(k, d, seed=seed + 7), torch.randint(0, n_classes, (k,), generator=g), torch.arange(k), valid)


def assert_one_line_error(proc, *words):
    """A finished script failed with one line on stderr that contains ``error`` and ``words``, no traceback."""
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert 'Traceback' not in proc.stderr and 'error' in lines[0]
    for w in words:
        assert w in lines[0], lines[0]


# ---------------------------------------------------------------- one training step, as the scripts build it
STEP_BSZ = 16     # the global batch of the step tests (8 per process under 2-process torchrun)


def step_batch(seed=0):
    """A fixed global batch: two views of 16 digits-sized images, 3 classes, dataset ids 100..115."""
    g = torch.Generator().manual_seed(seed)
    views = [torch.randn(STEP_BSZ, 3, 16, 16, generator=g) for _ in range(2)]
    return views, torch.randint(0, 3, (STEP_BSZ,), generator=g), torch.arange(100, 100 + STEP_BSZ)


def build_training(argv, ce=False, chunk=0, train=False, dropout=False, device='cpu', same_init=True,
                   scripts_model=False):
    """``steps.Pretraining`` (or ``steps.CETraining`` with ``ce``) as the scripts build it from ``argv``, with
    a ``resnet_tiny`` seeded by 0, batch ``STEP_BSZ``, ``--chunk_size chunk``, on ``device``, 200 dataset ids,
    3 classes (5, 1 and 10 training samples, for ``--loss``'s and BCL's priors; with ``--supcon_weight``, two views).
    ``train``: BatchNorm in train mode (else eval: per-sample, so the loss is the only coupling
    of samples); ``dropout``: a dropout layer after the encoder (a forward that draws random numbers);
    ``same_init=False``: the model is built from this process's own seed (``--seed + rank``, as the scripts build
    it under torchrun) instead of seed 0 on every process; ``scripts_model``: the model the scripts build from
    ``argv`` (``--model``, ``--model_args``, ...) instead of ``resnet_tiny``."""
    import torch.nn as nn

    from config.options import parse_option
    from engine.run import setup
    from networks import SupCEResNet, SupConResNet
    from training.steps import CETraining, Pretraining
    opt = setup(parse_option('ce' if ce else 'supcon', [*argv, '--batch_size', str(STEP_BSZ), '--device', device,
                                                        '--chunk_size', str(chunk)]), run_folder=False)
    if same_init:
        torch.manual_seed(0)
    if scripts_model:
        net = None
    else:
        net = (SupCEResNet('resnet_tiny', num_classes=3, head=opt.head if opt.supcon_weight else None) if ce
               else SupConResNet('resnet_tiny'))
    if dropout:
        net.encoder = nn.Sequential(net.encoder, nn.Dropout(0.5))
    training = (CETraining(opt, 3, [5, 1, 10], model=net) if ce
                else Pretraining(opt, 200, model=net, class_counts=[5, 1, 10]))
    training.model.train(train)
    if getattr(training, 'key_encoder', None) is not None:
        training.key_encoder.eval()
    return training


def take_steps(training, views, labels, ids, seed=None):
    """The step under test (after a first step that warms RASCAL's cache): zeroed gradients, ``seed`` for the
    global RNG before each step when given. Returns ``(loss, statistics, {parameter: gradient})``, the loss's own
    parameters included (``criterion.<name>``)."""
    warm = 2 if getattr(training, 'method', None) is not None and training.method.uses_ids else 1
    params = dict(training.model.named_parameters())
    if isinstance(getattr(training, 'criterion', None), torch.nn.Module):     # a loss's own (BCL's classifier)
        params.update({f'criterion.{n}': p for n, p in training.criterion.named_parameters()})
    for _ in range(warm):
        if seed is not None:
            torch.manual_seed(seed)
        for p in params.values():
            p.grad = None
        if hasattr(training, 'method'):
            loss, stats = training.step(views, labels, ids)
        else:
            loss, stats = training.step(views if training.supcon is not None else views[0], labels)
    return loss, stats, {n: p.grad.clone() for n, p in params.items() if p.grad is not None}


# ---------------------------------------------------------------- experiment trackers, read back as a user would
TRACKER_PACKAGES = ('wandb', 'mlflow', 'sqlalchemy')     # requirements-trackers.txt (sqlalchemy: MLflow's SQLite store)
# The tracker tests' mark: skipped with a reason where a package is absent. Found without importing them: importing
# wandb and mlflow takes about 3 s, which every pytest worker would pay while collecting.
needs_trackers = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in TRACKER_PACKAGES),
    reason='the tracker tests need wandb, mlflow and sqlalchemy (pip install -r requirements-trackers.txt)')


def wandb_records(run_folder):
    """``[(run id, [record, ...])]`` of every offline W&B run under ``run_folder``, read by W&B's own reader
    (``wandb leet inspect --json``)."""
    import glob
    import json
    out = []
    # in the order written: by folder (W&B names a second run of the same second and id '<folder>-1', which a sort of
    # the whole paths put first, since '-' sorts before '/')
    for path in sorted(glob.glob(os.path.join(run_folder, 'wandb', 'offline-run-*', 'run-*.wandb')),
                       key=os.path.dirname):
        text = subprocess.run([sys.executable, '-m', 'wandb', 'leet', 'inspect', '--json', path], check=True,
                              capture_output=True, text=True, timeout=120).stdout
        records = [json.loads(line) for line in text.splitlines() if line.startswith('{')]
        run = next(r['run'] for r in records if r['type'] == 'run')
        out.append((run['run_id'], records))
    return out


def wandb_history(records, key):
    """``{step: value}`` of ``key`` in a W&B run's history records."""
    return {r['history']['step']['num']: r['history']['item'][key] for r in records
            if r['type'] == 'history' and key in r['history']['item']}


def summary(records):
    """A W&B run's summary: its summary records' updates, in order."""
    out = {}
    for r in records:
        if r['type'] == 'summary':
            out.update(r['summary'].get('update', {}))
    return out
