"""compare.py: mean +- std tables over results.json files."""
import json

import numpy as np
import pytest


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
    from core.flags import UserError
    with pytest.raises(UserError, match='no results.json'):
        compare.main([f'C={tmp_path}/none'])


def test_compare_reads_the_evaluated_runs_training_metrics(tmp_path, capsys):
    """--train_metrics: the last metrics.csv row of the run a linear evaluation read, and how many runs the
    collapse monitor flags."""
    import compare
    for seed, z_std in enumerate([0.3, 0.01]):       # the second falls below a tenth of its first epoch
        pre = tmp_path / f'seed_{seed}' / 'pretrain'
        pre.mkdir(parents=True)
        (pre / 'metrics.csv').write_text(f'epoch,train/collapse/z_std_enc\n1,0.5\n2,{z_std}\n')
        lin = tmp_path / f'seed_{seed}' / 'linear'
        lin.mkdir()
        (lin / 'results.json').write_text(json.dumps({'final_test_acc': 90.0 - 50 * seed,
                                                      'ckpt': str(pre / 'last.pth')}))
    compare.main([f'X={tmp_path}/seed_*/linear', '--train_metrics', 'train/collapse/z_std_enc'])
    text = capsys.readouterr().out
    assert 'train/collapse/z_std_enc (last epoch) | collapse warnings |' in text
    assert '| X | 2 | 65.00 ± 35.36 | 0.1550 ± 0.2051 | 1/2 |' in text


def compare_seeds(tmp_path, capsys, rows):
    """compare.py's table (baseline ``base``) of ``rows`` (``{label: {seed: test top-1}}``), one results.json each."""
    import compare
    for label, accs in rows.items():
        for seed, acc in accs.items():
            d = tmp_path / label / f'seed_{seed}'
            d.mkdir(parents=True)
            (d / 'results.json').write_text(json.dumps({'final_test_acc': acc, 'config': {'seed': seed}}))
    compare.main([f'{label}={tmp_path}/{label}' for label in rows] + ['--baseline', 'base'])
    return capsys.readouterr().out


def test_paired_interval_against_a_hand_computation(tmp_path, capsys):
    """Differences 1, 2, 3 over seeds 0-2: mean 2, sd 1, t(0.975, 2) = 4.302653, half-width 4.302653/sqrt(3) =
    2.484138, so [-0.48, 4.48], which contains 0; differences 2, 2.2, 1.8: sd 0.2, half-width 0.496828,
    [1.50, 2.50], which excludes 0. Seed 3 exists only in the baseline row and is left out."""
    import compare
    base = {0: 90.0, 1: 91.0, 2: 92.0, 3: 50.0}
    rows = {'base': base, 'm1': {0: 91.0, 1: 93.0, 2: 95.0}, 'm2': {2: 94.2, 0: 92.0, 1: 92.8}}
    text = compare_seeds(tmp_path, capsys, rows)
    assert 'Δ test top-1 (%) vs base (95 % CI, paired t over seeds) | CI excludes 0 |' in text
    assert '| base | 4 | ' in text and '(baseline)' in text
    assert '+2.00 [-0.48, +4.48] (n=3) | no |' in text
    assert '+2.00 [+1.50, +2.50] (n=3) | yes |' in text
    n, mean, half = compare.paired_difference([{'final_test_acc': v, 'config': {'seed': s}} for s, v in
                                               rows['m1'].items()],
                                              [{'final_test_acc': v, 'config': {'seed': s}} for s, v in base.items()],
                                              'final_test_acc')
    assert n == 3 and mean == pytest.approx(2.0) and half == pytest.approx(4.302653 / 3 ** 0.5, rel=1e-6)
    from core.flags import UserError
    with pytest.raises(UserError, match='is not one of the rows'):
        compare.main([f'base={tmp_path}/base', '--baseline', 'nope'])


@pytest.mark.parametrize('results, words', [
    ({'final_test_acc': None}, 'final_test_acc is null, not a number'),
    ({'final_test_acc': '91.2'}, 'final_test_acc is "91.2", not a number'),
    ({'final_test_acc': True}, 'final_test_acc is true'),
    ({'final_test_acc': 90.0, 'config': {'seed': '1'}}, 'config.seed is "1", not an integer'),
    ({'final_test_acc': 90.0, 'config': None}, 'config is null, not an object'),
    ([90.0], 'not a results.json'),
])
def test_compare_refuses_what_is_not_a_number_in_one_line(tmp_path, results, words):
    """Null or a string where a number belongs, through the real script."""
    from helpers import assert_one_line_error, run_in_process
    (tmp_path / 'r').mkdir()
    (tmp_path / 'r' / 'results.json').write_text(json.dumps(results))
    assert_one_line_error(run_in_process('compare.py', f'X={tmp_path}/r'), words)


@pytest.mark.parametrize('where', ['missing', 'unwritable', 'folder'])
def test_compare_checks_out_before_the_work(tmp_path, where):
    """``--out`` into a folder that cannot be written (or that is a folder) is one line before
    any work (the rows would fail next: no results.json), through the real script; a folder that does not exist
    is created."""
    from helpers import assert_one_line_error, run_in_process
    (tmp_path / 'r').mkdir()
    (tmp_path / 'r' / 'results.json').write_text(json.dumps({'final_test_acc': 90.0}))
    if where == 'missing':
        out = tmp_path / 'new' / 'deeper' / 't.md'
        assert run_in_process('compare.py', f'X={tmp_path}/r', '--out', out).returncode == 0 and out.is_file()
        return
    out = '/proc/no_such/t.md' if where == 'unwritable' else tmp_path
    assert_one_line_error(run_in_process('compare.py', f'X={tmp_path}/none', '--out', out), '--out')


def test_a_diverged_probe_is_marked_and_left_out_of_the_paired_differences(tmp_path, capsys):
    """A probe trained at an absurd learning rate (``probe_diverged``) is the row's best number here: its row is
    marked, a note counts it, and its seed leaves the paired differences unless --include_diverged."""
    import compare
    rows = {'base': {0: 90.0, 1: 91.0, 2: 92.0}, 'wild': {0: 99.0, 1: 92.0, 2: 93.0}}
    for label, accs in rows.items():
        for seed, acc in accs.items():
            d = tmp_path / label / f'seed_{seed}'
            d.mkdir(parents=True)
            bad = label == 'wild' and seed == 0
            (d / 'results.json').write_text(json.dumps({'final_test_acc': acc, 'config': {'seed': seed},
                                                        'probe_diverged': bad}))
    args = [f'{label}={tmp_path}/{label}' for label in rows] + ['--baseline', 'base']
    compare.main(args)
    text = capsys.readouterr().out
    assert '| wild † | 3 |' in text and '| base | 3 |' in text
    assert 'wild: 1 of 3' in text and 'left out of the paired differences' in text
    assert '+1.00 (n=2)' not in text and '(n=2)' in text            # seeds 1 and 2 only: +1, +1
    compare.main(args + ['--include_diverged'])
    assert '(n=3)' in capsys.readouterr().out


def oracle_power(delta, sd, n, alpha=0.05):
    """The paired t test's power from the noncentral t's definition, T = (Z + λ) / sqrt(V / df) with Z normal and V
    chi-square: P(|T| > c) = E_V[P(Z > c·sqrt(V/df) - λ) + P(Z < -c·sqrt(V/df) - λ)], integrated over V."""
    from scipy import integrate
    from scipy.stats import chi2, norm, t
    df, lam = n - 1, delta * n ** 0.5 / sd
    c = t.ppf(1 - alpha / 2, df)

    def at(v):
        s = c * (v / df) ** 0.5
        return chi2.pdf(v, df) * (norm.sf(s - lam) + norm.cdf(-s - lam))
    return integrate.quad(at, 0, float('inf'), limit=200)[0]


@pytest.mark.parametrize('delta, sd, n', [(1.0, 1.0, 5), (0.3, 0.5, 10), (2.0, 1.5, 3), (0.0, 1.0, 8),
                                          (102.95, 6.43, 2)])      # the last: far out, where scipy's nct fails
def test_power_against_the_noncentral_t_by_its_definition(delta, sd, n):
    import compare
    assert compare.power(delta, sd, n) == pytest.approx(oracle_power(delta, sd, n), abs=1e-6)


@pytest.mark.parametrize('sd, n', [(1.0, 5), (0.25, 10), (3.0, 3)])
def test_the_detectable_difference_and_the_seeds_needed_reach_80_percent(sd, n):
    """The smallest detectable difference has power 0.8 (and 1 % less of it has less); the seeds needed for a
    difference reach 0.8, and one seed fewer does not."""
    import compare
    mde = compare.detectable(sd, n)
    assert oracle_power(mde, sd, n) == pytest.approx(0.8, abs=1e-5)
    assert oracle_power(0.99 * mde, sd, n) < 0.8
    needed = compare.seeds_needed(0.7 * sd, sd)
    assert oracle_power(0.7 * sd, sd, needed) >= 0.8 > oracle_power(0.7 * sd, sd, needed - 1)
    assert compare.seeds_needed(0.0, sd) is None and compare.seeds_needed(1e-4 * sd, sd) is None     # beyond reach


def test_holm_and_the_p_value_against_hand_computations():
    from scipy.stats import ttest_rel

    import compare
    ps = {'a': 0.01, 'b': 0.04, 'c': 0.03}
    # by hand: sorted a, c, b -> 3 x 0.01 = 0.03; 2 x 0.03 = 0.06; 1 x 0.04 = 0.04, raised to the running 0.06
    assert compare.holm(ps) == pytest.approx({'a': 0.03, 'c': 0.06, 'b': 0.06})
    assert compare.holm({'a': 0.5, 'b': 0.6}) == pytest.approx({'a': 1.0, 'b': 1.0})
    mine, base = [91.0, 93.0, 95.5, 90.0], [90.0, 91.0, 92.0, 90.5]
    want = ttest_rel(mine, base).pvalue
    assert compare.p_value([m - b for m, b in zip(mine, base)]) == pytest.approx(want, rel=1e-9)


def test_the_table_states_each_comparison_s_power(tmp_path, capsys):
    """Beside each paired difference: the Holm-adjusted p across the table, the difference the seeds could detect,
    the seeds the observed one needs, and the seeds on which the row beats the baseline."""
    import compare
    rows = {'base': [90.0, 91.0, 92.0, 93.0], 'up': [91.0, 92.1, 92.9, 94.0], 'noise': [91.0, 90.0, 93.0, 92.0]}
    text = compare_seeds(tmp_path, capsys, {label: dict(enumerate(accs)) for label, accs in rows.items()})
    assert '| Holm p | detectable at 80 % power | seeds for 80 % power | seeds better |' in text
    res = {label: [{'final_test_acc': a, 'config': {'seed': s}} for s, a in enumerate(accs)]
           for label, accs in rows.items()}
    got = compare.comparisons(list(res.items()), 'base', 'final_test_acc')
    diffs = [u - b for u, b in zip(rows['up'], rows['base'])]
    sd = float(np.std(diffs, ddof=1))
    assert got['up']['wins'] == (4, 4) and got['noise']['wins'] == (2, 4)
    assert got['up']['detectable'] == pytest.approx(compare.detectable(sd, 4))
    first, second = sorted(('up', 'noise'), key=lambda k: got[k]['p'])        # Holm over the table's two
    assert got[first]['holm'] == pytest.approx(min(1, 2 * got[first]['p']))
    assert got[second]['holm'] == pytest.approx(min(1, max(2 * got[first]['p'], got[second]['p'])))
    line = next(x for x in text.splitlines() if x.startswith('| up |'))
    assert f'±{got["up"]["detectable"]:.2f}' in line and '| 4/4 |' in line
