"""analyze.py: kappa_hat against known concentrations, and the plots and summary of a real run."""
import math
import os

import numpy as np
import pytest
import torch

from helpers import run_script


@pytest.mark.parametrize('kappa,dim', [(20.0, 16), (200.0, 64)])
def test_kappa_hat_recovers_a_known_concentration(kappa, dim):
    from scipy.stats import vonmises_fisher

    from analyze import kappa_hat
    mu = np.zeros(dim)
    mu[0] = 1.0
    x = vonmises_fisher(mu, kappa).rvs(5000, random_state=np.random.default_rng(0))
    est = kappa_hat(torch.from_numpy(x), torch.zeros(5000, dtype=torch.long))[0]
    assert abs(est - kappa) / kappa < 0.1, est
    assert kappa_hat(torch.ones(3, 4) / 2, torch.zeros(3, dtype=torch.long))[0] == math.inf


@pytest.mark.slow
@pytest.mark.xdist_group('coarse')
def test_analyze_writes_plots_and_summary(coarse_rascal_run, tmp_path):
    out = run_script('analyze.py', '--ckpt', os.path.join(coarse_rascal_run, 'last.pth'), '--out', tmp_path / 'a',
                     '--max_points', 200)
    assert 'analysis written' in out.stdout
    steps = [line for line in out.stdout.splitlines() if line.startswith('analyze: ')]
    assert [line.split()[1] for line in steps] == ['1/4', '2/4', '3/4', '4/4'], out.stdout     # progress as it goes
    files = set(os.listdir(tmp_path / 'a'))
    assert {'kappa.png', 'kappa_coarse.png', 'tsne.png', 'curves.png', 'rank_drift.png', 'summary.md'} <= files
    for name in files - {'summary.md'}:
        assert (tmp_path / 'a' / name).read_bytes()[:4] == b'\x89PNG'
    summary = (tmp_path / 'a' / 'summary.md').read_text()
    assert 'kappa_hat' in summary and '| fine | 10 |' in summary and '| coarse | 5 |' in summary


@pytest.mark.slow
def test_analyze_checks_out_first_and_skips_tsne_on_two_images(tmp_path):
    """``--out`` that cannot be written is one line before any work (the checkpoint
    does not even exist here); a run whose val/ has 2 images gets every part but the t-SNE map, with a line
    saying why."""
    from helpers import FAST_FILES, assert_one_line_error, make_image_folder, only_run_folder, run_in_process
    assert_one_line_error(run_in_process('analyze.py', '--ckpt', tmp_path / 'none.pth', '--out', '/proc/no_such/a'),
                          'cannot write to /proc/no_such/a', '--out')
    data = make_image_folder(tmp_path / 'imgs', classes=('a', 'b'))
    for c, keep in (('a', '0.png'), ('b', '0.png')):
        for f in os.listdir(data / 'val' / c):
            if f != keep:
                os.remove(data / 'val' / c / f)
    run_script('main_supcon.py', '--dataset', 'path', '--data_folder', data, '--mean', 0.5, '--std', 0.25, '--size', 12,
               '--model', 'resnet_tiny', '--epochs', 1, *FAST_FILES, '--save_folder', tmp_path / 'pre')
    proc = run_in_process('analyze.py', '--ckpt', os.path.join(only_run_folder(tmp_path / 'pre'), 'last.pth'),
                          '--out', tmp_path / 'a')
    assert proc.returncode == 0, proc.stderr
    assert 't-SNE skipped: the test split has 2 images' in proc.stdout
    written = set(os.listdir(tmp_path / 'a'))
    assert {'kappa.png', 'summary.md'} <= written and 'tsne.png' not in written


def test_plots_have_legends_and_axis_labels(tmp_path, monkeypatch):
    """The t-SNE map names its classes (a legend per colouring, superclasses by their members) and every curve has an
    epoch axis."""
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib.figure import Figure

    import analyze
    figures = []
    monkeypatch.setattr(Figure, 'savefig', lambda fig, *a, **k: figures.append(fig))
    rng = np.random.RandomState(0)
    analyze.plot_tsne(rng.randn(40, 5), [('coarse class (trained on)', [i % 2 for i in range(40)], ['0, 2', '1, 3']),
                                         ('class', [i % 4 for i in range(40)], ['zero', 'one', 'two', 'three'])],
                      str(tmp_path / 't.png'), 0, 'run_x (SupCon, digits)')
    assert 'run_x (SupCon, digits)' in figures[0]._suptitle.get_text()
    legends = [ax.get_legend() for ax in figures[0].axes]
    assert [[t.get_text() for t in legend.get_texts()] for legend in legends] == [['0, 2', '1, 3'],
                                                                                   ['zero', 'one', 'two', 'three']]
    assert legends[1].get_title().get_text() == 'class'
    analyze.plot_curves([{'epoch': '1', 'train/loss': '2.0', 'knn/acc': ''}, {'epoch': '2', 'train/loss': '1.5',
                                                                             'knn/acc': '90'}], str(tmp_path / 'c.png'),
                        'run_x (SupCon, digits)')
    used = [ax for ax in figures[1].axes if ax.get_title()]
    assert [ax.get_xlabel() for ax in used] == ['epoch', 'epoch'] and used[0].get_ylabel() == 'loss'
    figures[1].canvas.draw()
    ticks = [t for t in used[0].get_xticks() if 1 <= t <= 2]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks      # whole epochs, not 1.2 and 1.4
    assert figures[1]._suptitle.get_text() == 'run_x (SupCon, digits)'
