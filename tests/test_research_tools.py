"""Research tooling: kNN monitor, long-tail split, coarse labels, kappa_hat, shot groups, analyze.py, compare.py."""
import argparse
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import FAST, make_fake_cifar, only_run_folder, read_metrics, run_script


def test_knn_predict_matches_brute_force():
    from knn import knn_predict
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


def _opt(tmp_path, dataset, **kw):
    return argparse.Namespace(dataset=dataset, data_folder=str(tmp_path), size=32, imb_factor=0.1,
                              label_granularity='fine', **kw)


def test_long_tail_counts_follow_the_exponential_profile(tmp_path):
    from data import build_dataset, class_counts, long_tail_counts
    make_fake_cifar(tmp_path, n_train=1000, n_test=100)        # 100 training images per class
    lt = build_dataset(_opt(tmp_path, 'cifar10_lt'), True, None)
    want = [int(100 * 0.1 ** (c / 9)) for c in range(10)]
    assert class_counts(lt) == want == long_tail_counts(100, 10, 0.1)
    assert want[0] == 100 and want[-1] == 10
    assert class_counts(build_dataset(_opt(tmp_path, 'cifar10_lt'), False, None)) == [10] * 10   # balanced test
    again = build_dataset(_opt(tmp_path, 'cifar10_lt'), True, None)
    assert again.indices == lt.indices                                    # a fixed subset


def test_cifar100_coarse_mapping_on_a_fake_file(tmp_path):
    from data import CIFAR100_COARSE, build_dataset, num_classes
    make_fake_cifar(tmp_path, hundred=True, n_classes=100, n_train=300, n_test=100)
    assert sorted(set(CIFAR100_COARSE)) == list(range(20))
    assert np.bincount(CIFAR100_COARSE).tolist() == [5] * 20
    assert CIFAR100_COARSE[:5] == [4, 1, 14, 8, 0]          # apple, aquarium_fish, baby, bear, beaver
    fine = build_dataset(_opt(tmp_path, 'cifar100'), True, None)
    coarse = build_dataset(_opt(tmp_path, 'cifar100'), True, None, 'coarse')
    assert num_classes(fine) == 100 and num_classes(coarse) == 20 and coarse.classes[0] == 'aquatic_mammals'
    assert coarse.targets == [CIFAR100_COARSE[y] for y in fine.targets] and coarse.fine_targets == fine.targets
    assert coarse[7][1] == CIFAR100_COARSE[fine[7][1]]


def test_digits_coarse_grouping():
    from data import DIGITS_COARSE, Digits, build_dataset
    assert np.bincount(DIGITS_COARSE).tolist() == [2] * 5
    opt = argparse.Namespace(dataset='digits', size=16, label_granularity='coarse')
    coarse = build_dataset(opt, True, None)
    assert coarse.targets == [DIGITS_COARSE[y] for y in Digits(True).targets]
    with pytest.raises(Exception, match='coarse labels'):
        build_dataset(argparse.Namespace(dataset='cifar10', size=32, data_folder='/none'), True, None, 'coarse')


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


def test_evaluate_shot_groups_and_per_class_accuracy():
    from engine import evaluate
    opt = argparse.Namespace(device=torch.device('cpu'), amp='none', channels_last=False)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 2, 2])
    logits = F.one_hot(torch.tensor([0, 1, 1, 1, 0, 2, 2, 0]), 3).float() * 5   # class acc: 50, 100, 50 %
    loader = [(logits[:5], labels[:5]), (logits[5:], labels[5:])]
    out = evaluate(opt, loader, lambda x: x, 'test', 3, class_counts=[500, 50, 5])
    assert out['test/per_class_acc'] == [50.0, 100.0, 50.0]
    assert (out['test/many_acc'], out['test/medium_acc'], out['test/few_acc']) == (50.0, 100.0, 50.0)
    assert out['test/acc'] == 62.5
    assert 'test/few_acc' not in evaluate(opt, loader, lambda x: x, 'test', 3, class_counts=[500, 500, 50])


def test_compare_table(tmp_path, capsys):
    import compare
    for method, accs in (('a', [90.0, 92.0, 94.0]), ('b', [80.0])):
        for seed, acc in enumerate(accs):
            d = tmp_path / method / f'seed_{seed}' / 'Linear' / 'run'
            d.mkdir(parents=True)
            (d / 'results.json').write_text(json.dumps({'final_test_acc': acc, 'final_test_ece': 0.05}))
    compare.main([f'A={tmp_path}/a', f'B={tmp_path}/b/*', '--out', str(tmp_path / 't.md')])
    text = capsys.readouterr().out
    assert '| A | 3 | 92.00 ± 2.00 | 0.0500 ± 0.0000 |' in text
    assert '| B | 1 | 80.00 | 0.0500 |' in text
    assert (tmp_path / 't.md').read_text().strip() == text.strip()
    from util import UserError
    with pytest.raises(UserError, match='no results.json'):
        compare.main([f'C={tmp_path}/none'])


def test_options_for_the_tools():
    from options import parse_option
    from util import UserError
    for script, argv, words in [('supcon', ['--dataset', 'cifar10', '--label_granularity', 'coarse'], 'coarse'),
                                ('linear', ['--dataset', 'cifar10', '--eval_labels', 'coarse', '--ckpt', 'x'],
                                 'coarse'),
                                ('ce', ['--dataset', 'cifar10_lt', '--imb_factor', '0'], '--imb_factor'),
                                ('supcon', ['--knn_every', '-1'], '--knn_every')]:
        with pytest.raises(UserError, match=words):
            parse_option(script, argv)
    assert parse_option('ce', ['--dataset', 'cifar100_lt', '--label_granularity', 'coarse']).run_folder.endswith(
        '_coarse_imb_0.01')


@pytest.fixture(scope='module')
def coarse_rascal_run(tmp_path_factory):
    root = tmp_path_factory.mktemp('coarse')
    run_script('main_supcon.py', '--method', 'RASCAL', '--label_granularity', 'coarse', '--knn_every', 1,
               '--knn_k', 50, '--knn_t', 0.2,
               '--epochs', 2, '--save_folder', root, *FAST)
    return only_run_folder(root)


def test_knn_monitor_and_coarse_to_fine_linear(coarse_rascal_run, tmp_path):
    rows = read_metrics(coarse_rascal_run)
    assert all(10 < float(r['knn/acc']) <= 100 and float(r['knn/acc_fine']) > 10 for r in rows)
    run_script('main_linear.py', '--ckpt', os.path.join(coarse_rascal_run, 'last.pth'), '--eval_labels', 'fine',
               '--epochs', 1, '--save_folder', tmp_path, *FAST)
    results = json.load(open(os.path.join(only_run_folder(tmp_path), 'results.json')))
    assert len(results['final_test_per_class_acc']) == 10 and results['config']['eval_labels'] == 'fine'


def test_analyze_writes_plots_and_summary(coarse_rascal_run, tmp_path):
    out = run_script('analyze.py', '--ckpt', os.path.join(coarse_rascal_run, 'last.pth'), '--out', tmp_path / 'a',
                     '--max_points', 200)
    assert 'analysis written' in out.stdout
    files = set(os.listdir(tmp_path / 'a'))
    assert {'kappa.png', 'kappa_coarse.png', 'tsne.png', 'curves.png', 'rank_drift.png', 'summary.md'} <= files
    for name in files - {'summary.md'}:
        assert (tmp_path / 'a' / name).read_bytes()[:4] == b'\x89PNG'
    summary = (tmp_path / 'a' / 'summary.md').read_text()
    assert 'kappa_hat' in summary and '| fine | 10 |' in summary and '| coarse | 5 |' in summary
