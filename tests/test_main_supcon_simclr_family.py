"""main_supcon.py --simclr_loss: one digits epoch per loss, naming, and flag validation."""
import pytest

from helpers import FAST, only_run_folder, read_metrics, run_script
from options import parse_option
from util import UserError


@pytest.mark.parametrize('method,loss,extra,name', [
    ('SimCLR', 'ntlogistic', ['--temp', '0.5'], 'SimCLR-ntlogistic_digits'),
    ('SimCLR', 'margin_triplet', [], 'SimCLR-margin_triplet_digits'),
    ('SupCon', 'margin_triplet', ['--margin', '0.5'], 'SupCon-margin_triplet_digits'),
])
def test_one_digits_epoch(tmp_path, method, loss, extra, name):
    run_script('main_supcon.py', '--method', method, '--simclr_loss', loss, *extra, '--epochs', 1,
               '--save_folder', tmp_path, *FAST)
    run = only_run_folder(tmp_path)
    assert name in run
    scale = {'ntlogistic': '_temp_0.5_', 'margin_triplet': '_margin_0.5_' if extra else '_margin_1.0_'}[loss]
    assert scale in run
    assert float(read_metrics(run)[0]['train/loss']) > 0


def test_flag_validation():
    assert parse_option('supcon', []).simclr_loss == 'ntxent'
    assert parse_option('supcon', ['--simclr_loss', 'margin_triplet']).margin == 1.0
    assert parse_option('supcon', ['--simclr_loss', 'ntlogistic', '--carrot']).carrot
    for argv, words in [
        (['--method', 'RASCAL', '--simclr_loss', 'ntlogistic'], '--simclr_loss'),
        (['--margin', '0.5'], '--margin needs'),
        (['--simclr_loss', 'margin_triplet', '--margin', '-1'], '--margin must'),
    ]:
        with pytest.raises(UserError, match=words):
            parse_option('supcon', argv)
    with pytest.raises(SystemExit):
        parse_option('supcon', ['--simclr_loss', 'infonce'])
