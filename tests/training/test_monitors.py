"""training/monitors.py: the collapse statistics against hand-computed batches, RankMe, and the one-time warning."""
import math
import os

import pytest
import torch

from evaluation.knn import rankme
from helpers import FAST, only_run_folder, read_metrics, run_script, scaled, unit
from training.monitors import CollapseWatch, collapse_statistics


def test_identical_features_are_fully_collapsed():
    h = unit(1, 16).expand(10, 16) * 3.0             # same direction, any length
    stats = collapse_statistics(h, 'enc')
    assert float(stats['collapse/z_std_enc']) == pytest.approx(0, abs=1e-6)
    assert float(stats['collapse/cos_enc']) == pytest.approx(1, abs=1e-6)
    assert rankme(torch.nn.functional.normalize(h, dim=1)) == pytest.approx(1, abs=1e-3)


@pytest.mark.parametrize('n', [4, 16, 64])
def test_orthonormal_features_have_known_values(n):
    h = torch.eye(n) * torch.linspace(1, 2, n)[:, None]   # orthogonal rows, unequal lengths
    stats = collapse_statistics(h, 'proj')
    # each dimension holds one 1 and n - 1 zeros: unbiased std sqrt(1/n)
    assert float(stats['collapse/z_std_proj']) == pytest.approx(1 / math.sqrt(n), rel=1e-5)
    assert float(stats['collapse/cos_proj']) == pytest.approx(0, abs=1e-6)
    assert rankme(torch.eye(n)) == pytest.approx(n, rel=1e-4)


def test_mean_cosine_equals_the_pairwise_loop():
    h = torch.randn(9, 5, generator=torch.Generator().manual_seed(0))
    z = torch.nn.functional.normalize(h, dim=1)
    want = sum(float(z[i] @ z[j]) for i in range(9) for j in range(9) if i != j) / (9 * 8)
    assert float(collapse_statistics(h, 'x')['collapse/cos_x']) == pytest.approx(want, rel=1e-5)
    assert float(collapse_statistics(h, 'x')['collapse/z_std_x']) == pytest.approx(float(z.std(0).mean()), rel=1e-6)


def test_watch_fires_once_on_collapse_and_never_on_healthy_runs():
    healthy = [0.04, 0.03, 0.025, 0.02, 0.02]
    watch = CollapseWatch()
    assert all(watch.check(e, {'train/collapse/z_std_enc': v}) is None for e, v in enumerate(healthy, 1))
    watch = CollapseWatch()
    messages = [watch.check(e, {'train/collapse/z_std_enc': v}) for e, v in enumerate([0.04, 0.01, 0.003, 0.001], 1)]
    assert messages[:2] == [None, None] and messages[3] is None
    assert 'epoch 3' in messages[2] and 'collapse/z_std_enc' in messages[2]
    watch = CollapseWatch()
    assert watch.check(1, {'train/collapse/z_std_enc': 0.04, 'train/carrot/L': 0.7}) is None
    message = watch.check(2, {'train/collapse/z_std_enc': 0.03, 'train/carrot/L': 0.995})
    assert 'carrot/L is 0.9950' in message and '--carrot_alpha_max' in message
    watch = CollapseWatch()
    assert watch.check(1, {'train/collapse/z_std_enc': 0.04, 'train/collapse/cos_enc': 0.7}) is None
    assert 'collapse/cos_enc is 0.9970' in watch.check(2, {'train/collapse/z_std_enc': 0.03,
                                                           'train/collapse/cos_enc': 0.997})
    watch = CollapseWatch()
    assert watch.check(1, {'train/collapse/z_std_enc': 0.04, 'train/carrot/L': 0.7}) is None
    watch.check(2, {'train/collapse/z_std_enc': 0.03, 'train/carrot/L': 0.995})
    restored = CollapseWatch()
    restored.load_state_dict(watch.state_dict())         # checkpointed: a resumed run does not warn again
    assert restored.check(3, {'train/collapse/z_std_enc': 0.0001, 'train/carrot/L': 0.999}) is None


@pytest.mark.slow
def test_warning_on_a_collapsed_run_and_statistics_in_metrics(tmp_path):
    """Uncapped balanced CARROT with a large learning rate collapses within two epochs on digits."""
    out = run_script('main_supcon.py', '--carrot', '--carrot_alpha_max', 'inf', '--learning_rate', 0.2,
                     '--temp', 0.1, '--cosine', '--epochs', 3, '--save_folder', tmp_path, *FAST, '--size', 16)
    warnings = [line for line in out.stdout.splitlines() if line.startswith('warning:')]
    assert len(warnings) == 1 and 'collapsed' in warnings[0], out.stdout[-2000:]
    run = only_run_folder(tmp_path)
    assert open(os.path.join(run, 'warnings.txt')).read().count('warning:') == 1
    row = read_metrics(run)[-1]
    for key in ('z_std_enc', 'cos_enc', 'z_std_proj', 'cos_proj'):
        assert f'train/collapse/{key}' in row
    assert float(row['train/carrot/L']) > 0.99


@pytest.mark.slow
def test_the_demo_runs_and_stays_silent(tmp_path):
    """The README's demo (SupCon on digits, then linear evaluation), shortened to 2 + 1 epochs: it ends on the test
    accuracy, with no warning. (The full demo, 30 + 10 epochs, printed none either: docs/results.md, "The demo".)"""
    import subprocess
    import sys

    from helpers import ROOT, script_env
    proc = subprocess.run(['bash', 'scripts/demo.sh', '0'], cwd=ROOT, capture_output=True, text=True,
                          timeout=scaled(900), env=script_env(PRETRAIN_EPOCHS='2', LINEAR_EPOCHS='1',
                                                              DEMO_OUT=str(tmp_path), PY=sys.executable))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'warning:' not in proc.stdout and 'warning:' not in proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith('digits test accuracy')
    run = only_run_folder(tmp_path / 'pretrain')
    assert not os.path.exists(os.path.join(run, 'warnings.txt'))


def test_probe_divergence_flags_a_loss_above_chance_or_not_finite():
    import math

    from training.monitors import probe_divergence
    assert probe_divergence([2.0, 0.5, 0.3], 10, 0.4) is None
    assert 'above chance level (ln 10' in probe_divergence([13.3, 22.8, 11.9], 10, 8.3)
    assert 'above chance level' in probe_divergence([1.0, 2.4], 10)          # rose back above ln 10 = 2.303
    assert 'not finite' in probe_divergence([1.0, 0.5], 10, math.nan)
    assert 'its test NLL is not finite' in probe_divergence([1.0, 0.5], 10, math.inf)
    absurd = probe_divergence([9.0, 1.0], 10, 1.2e28)       # the training loss came down; the NLL did not
    assert 'test NLL 1.2e+28 is over 10 x chance level' in absurd
    assert probe_divergence([9.0, 1.0], 10, 10 * math.log(10)) is None       # at the threshold: not flagged
    assert probe_divergence([0.69], 2) is None and probe_divergence([0.7], 2) is not None    # ln 2 = 0.693
