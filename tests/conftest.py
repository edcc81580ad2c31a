import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from helpers import FAST, only_run_folder, run_script  # noqa: E402  (needs ROOT on the path)


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
