"""evaluation/knn.py: the weighted kNN classifier against a brute-force loop, and the --knn_every monitor."""
import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

from helpers import FAST, only_run_folder, read_metrics, run_script


def test_knn_predict_matches_brute_force():
    from evaluation.knn import knn_predict
    g = torch.Generator().manual_seed(0)
    bank = F.normalize(torch.randn(300, 8, generator=g), dim=1)
    bank_y = torch.randint(0, 5, (300,), generator=g)
    query = F.normalize(torch.randn(50, 8, generator=g), dim=1)
    for k, t in ((200, 0.1), (7, 0.5), (1000, 0.07)):
        got = knn_predict(bank, bank_y, query, 5, k=k, t=t, chunk=16)
        for i in range(50):
            sims = [(float(query[i] @ bank[j]), j) for j in range(300)]
            sims.sort(reverse=True)
            votes = [0.0] * 5
            for s, j in sims[:min(k, 300)]:
                votes[int(bank_y[j])] += math.exp(s / t)
            assert int(got[i]) == max(range(5), key=lambda c: votes[c])


@pytest.mark.slow
@pytest.mark.xdist_group('coarse')
def test_knn_monitor_and_coarse_to_fine_linear(coarse_rascal_run, tmp_path):
    rows = read_metrics(coarse_rascal_run)
    assert all(10 < float(r['knn/acc']) <= 100 and float(r['knn/acc_fine']) > 10 for r in rows)
    # --knn_shots 5: a 5-per-class bank (k = min(50, 25) coarse, min(50, 50) fine), chance 20 % / 10 %
    assert all(20 < float(r['knn/acc_5shot']) <= 100 and 10 < float(r['knn/acc_fine_5shot']) <= 100 for r in rows)
    run_script('main_linear.py', '--ckpt', os.path.join(coarse_rascal_run, 'last.pth'), '--eval_labels', 'fine',
               '--epochs', 1, '--save_folder', tmp_path, *FAST)
    results = json.load(open(os.path.join(only_run_folder(tmp_path), 'results.json')))
    assert len(results['final_test_per_class_acc']) == 10 and results['config']['eval_labels'] == 'fine'


def test_knn_ties_go_to_the_lowest_index_and_the_lowest_class():
    """Equal similarities (duplicated images) are resolved by a rule, not by how topk orders them."""
    from evaluation.knn import knn_predict, top_k_neighbours
    e = torch.eye(4)
    query = F.normalize(e[0] + e[1], dim=0)[None]                        # equally close to e0 and e1
    bank = torch.stack([e[2], e[1], e[0], e[1], e[0], e[3]])             # duplicates of e1 and e0
    for labels, k, want in (([0, 1, 2, 1, 2, 0], 1, 1),                  # index 1 (label 1) before 2, 3, 4
                            ([0, 2, 1, 2, 1, 0], 1, 2),
                            ([0, 1, 2, 2, 1, 0], 2, 1),                  # one vote each: the lower class
                            ([0, 1, 2, 2, 1, 0], 3, 2)):                 # indices 1, 2, 3
        assert int(knn_predict(bank, torch.tensor(labels), query, 3, k=k, t=0.1)) == want
    sims = torch.tensor([[0.5, 0.9, 0.5, 0.5, 0.1, 0.5]])
    assert top_k_neighbours(sims, 3).tolist() == [[0, 1, 2]]
    assert top_k_neighbours(sims.flip(1), 3).tolist() == [[0, 2, 4]]           # 0.9 at 4, then ties 0, 2
    assert top_k_neighbours(sims, 6).tolist() == [[0, 1, 2, 3, 4, 5]]


def test_knn_memory_is_bounded_and_small_temperatures_do_not_overflow():
    """The per-chunk work is within the stated budget whatever the bank's size (about 1M images gives a few rows
    per chunk, not a [1024, N] block); a tiny ``t`` (exp(1/0.001) overflows float32) still votes correctly."""
    from evaluation.knn import KNN_MEMORY_BUDGET, knn_chunk_rows, knn_predict
    for n_train, k, classes in ((1_000_000, 200, 1000), (50_000, 200, 100), (1437, 200, 10), (10, 5, 1000)):
        rows = knn_chunk_rows(n_train, k, classes)
        assert rows >= 1 and (rows == 1 or rows * (16 * n_train + 5 * k * classes) <= KNN_MEMORY_BUDGET)
    assert knn_chunk_rows(1_000_000, 200, 1000) < 64
    bank = F.normalize(torch.randn(50, 8, generator=torch.Generator().manual_seed(0)), dim=1)
    labels = torch.arange(50) % 5
    query = bank[:10] + 0.01
    for t in (0.1, 0.01, 0.001):
        pred = knn_predict(bank, labels, F.normalize(query, dim=1), 5, k=3, t=t)
        assert torch.equal(pred, labels[:10]), t


@pytest.mark.slow
def test_the_monitor_neither_overflows_nor_moves_the_run(tmp_path):
    """Through the real script: with ``--knn_t 0.01`` (exp(s / t) overflows float32)
    the monitor reports an accuracy, not NaN votes; and two epochs with the monitor give the weights of two epochs
    without it (its loaders draw from no RNG the run uses); under ``--test_every end`` it reads the test split at the
    last epoch only."""
    from helpers import assert_one_line_error, load, run_in_process
    args = ['--size', 8, '--epochs', 2, *FAST]
    run_script('main_supcon.py', *args, '--save_folder', tmp_path / 'plain')
    run_script('main_supcon.py', *args, '--knn_every', 1, '--knn_t', 0.01, '--save_folder', tmp_path / 'knn')
    plain, knn = only_run_folder(tmp_path / 'plain'), only_run_folder(tmp_path / 'knn')
    accs = [float(r['knn/acc']) for r in read_metrics(knn)]
    assert len(accs) == 2 and all(20 < a <= 100 for a in accs), accs
    a, b = load(os.path.join(plain, 'last.pth'))['model'], load(os.path.join(knn, 'last.pth'))['model']
    assert all(torch.equal(a[k], b[k]) for k in a)
    # --test_every end (a tuned sweep's seeded cells): the monitor reads the test split at the last epoch only
    run_script('main_supcon.py', *args, '--knn_every', 1, '--test_every', 'end', '--save_folder', tmp_path / 'end')
    rows = read_metrics(only_run_folder(tmp_path / 'end'))
    assert [int(r['epoch']) for r in rows if r.get('knn/acc')] == [2]
    for value in ('1e-5', '1e5'):
        assert_one_line_error(run_in_process('main_supcon.py', '--knn_every', 1, '--knn_t', value),
                              '--knn_t must be in [0.0001, 10000]')
    assert_one_line_error(run_in_process('main_supcon.py', '--temp', '1e-50'), '--temp must be in')
