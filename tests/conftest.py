import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
# The test folders mirror the packages (tests/training/ tests training/); a test that shares another's cases imports
# it by its module name (``from test_steps import CASES``) from any folder, so every test folder is on the path, after
# the repository (whose packages ``data``, ``training``, ... are never shadowed by the folders of the same name).
TESTS = os.path.dirname(os.path.abspath(__file__))
for folder in sorted(os.listdir(TESTS)):
    if os.path.isdir(os.path.join(TESTS, folder)) and not folder.startswith(('.', '_')):
        sys.path.append(os.path.join(TESTS, folder))

import torch  # noqa: E402

from helpers import (  # noqa: E402  (needs ROOT on the path)
    CPU_AUGMENT,
    FAST,
    only_run_folder,
    run_script,
    use_subprocesses_unless_the_server_can_run,
)

# before any worker starts: on a Python whose internals the script server was not checked on, real subprocesses
# (SUITE_AS_PYTHON=3.99 asks as another Python would: how the fallback is tried here)
_AS = os.environ.get('SUITE_AS_PYTHON')
FALLBACK = use_subprocesses_unless_the_server_can_run(tuple(map(int, _AS.split('.'))) if _AS else None)


def pytest_sessionstart(session):
    if FALLBACK and not hasattr(session.config, 'workerinput'):     # said once, by the controller
        session.config.pluginmanager.get_plugin('terminalreporter').write_line(FALLBACK)

# One thread per pytest-xdist worker, as its scripts have (helpers.script_env): two workers of two threads each on
# two cores made OpenMP's waiting threads spin against each other (a 0.2 s step took 6 s).
if 'PYTEST_XDIST_WORKER' in os.environ:
    torch.set_num_threads(1)



@pytest.fixture(autouse=True)
def default_compiler_stance():
    """Each test starts with the compiler's default stance: a compiled training loop in the test process sets
    ``eager_on_recompile`` (``runtime.device.keep_compiled_shapes``), which would leave later tests' graphs
    uncompiled."""
    yield
    device = sys.modules.get('runtime.device')
    if device is not None and device._compiled:
        torch.compiler.set_stance('default')
        device._compiled = False


# Under pytest-xdist (scripts/test.sh runs ``-n auto --dist loadgroup``) each worker has its own session: the tests
# that read one of the runs below carry ``@pytest.mark.xdist_group(<run>)`` ('tiny', 'coarse', or a SHARED_RUNS
# name), so each run is trained by one worker only.


@pytest.fixture(scope='session')
def tiny_ckpt(tmp_path_factory):
    """A one-epoch SupCon run on digits: its last.pth."""
    root = tmp_path_factory.mktemp('pre')
    run_script('main_supcon.py', '--epochs', 1, '--save_folder', root, *FAST)
    return next(os.path.join(d, 'last.pth') for d, _, fs in os.walk(root) if 'last.pth' in fs)


@pytest.fixture(scope='session')
def coarse_rascal_run(tmp_path_factory):
    """Two epochs of RASCAL on the 5 coarse digit groups, with the kNN monitor (and its 5-shot form): the run
    folder."""
    root = tmp_path_factory.mktemp('coarse')
    run_script('main_supcon.py', '--method', 'RASCAL', '--label_granularity', 'coarse', '--knn_every', 1,
               '--knn_k', 50, '--knn_t', 0.2, '--knn_shots', 5,
               '--epochs', 2, '--save_folder', root, *FAST)
    return only_run_folder(root)


# Digits runs that several end-to-end tests read (each trains once per session, on first use):
# name -> (script, flags). Every one is 2 epochs; tests/engine/test_resume.py checks that 1 epoch + --resume
# reaches each of them bit for bit, and other tests read their metrics, checkpoints and outputs.
# 24 does not divide 64
# half precision on a CPU without native support runs 25-50x slower: those runs train on a smaller set (about 350
# images: the long tail with the rarest class at 1 %)
SMALL_DATA = ['--dataset', 'digits_lt', '--imb_factor', 0.01]
CHUNKED = ['--chunk_size', 24, *FAST, '--batch_size', 64]
QUEUED = ['--queue_size', 256, *FAST, '--batch_size', 64]
SHARED_RUNS = {
    # batch 64: epochs long enough to interrupt one midway; the DataLoader's augmentation (its RNG in checkpoints)
    'supcon': ('main_supcon.py', ['--seed', 5, *FAST, '--batch_size', 64, *CPU_AUGMENT]),
    'rascal': ('main_supcon.py', ['--method', 'RASCAL', *FAST]),
    'chunked': ('main_supcon.py', CHUNKED),
    'queue': ('main_supcon.py', ['--moco_m', 0.99, '--shuffle_bn_splits', 4, *QUEUED]),
    'devaug': ('main_supcon.py', ['--augment', 'device', *FAST]),
    'ce': ('main_ce.py', ['--amp', 'fp16', *FAST, *SMALL_DATA]),
    'kcl': ('main_supcon.py', ['--method', 'KCL', '--kcl_k', 3, *FAST]),           # its draws are seeded per step
}


@pytest.fixture(scope='session')
def shared_run(tmp_path_factory):
    """``shared_run(name) -> (run folder, the finished process)``: the 2-epoch run ``SHARED_RUNS[name]``."""
    done = {}

    def get(name):
        if name not in done:
            script, flags = SHARED_RUNS[name]
            root = tmp_path_factory.mktemp(f'run_{name}')
            proc = run_script(script, *flags, '--epochs', 2, '--save_folder', root)
            done[name] = (only_run_folder(root), proc)
        return done[name]
    return get


@pytest.fixture(scope='session')
def slurm(tmp_path_factory):
    """A one-node SLURM cluster on this machine (tests/slurm_cluster.py), stopped after the session; the tests that
    use it carry ``@pytest.mark.xdist_group('slurm')``, so one worker starts it."""
    import slurm_cluster
    why = slurm_cluster.unavailable()
    if why and os.environ.get('SWEEP_SLURM_REQUIRED') == '1':       # .ci/run installed it: it must work
        pytest.fail(why)
    if why:
        pytest.skip(why)
    cluster = slurm_cluster.start(str(tmp_path_factory.mktemp('slurm')))
    yield cluster
    slurm_cluster.stop(cluster)


def pytest_collection_modifyitems(items):
    """The end-to-end tests (``slow``) first, each file's in its own order, the quick ones after: pytest-xdist hands
    tests out in this order, so a run of a minute or more never starts last while the other worker has nothing left
    (the folders are collected by name, and ``tests/runtime/``'s torchrun runs would come late)."""
    items.sort(key=lambda item: item.get_closest_marker('slow') is None)

