"""compare.py: mean +- std tables over results.json files."""
import json

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
    from util import UserError
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
