"""main_ce.py end to end on the bundled digits (then main_linear.py on its encoder), with CARROT (--resume:
tests/engine/test_resume.py)."""
import json
import os

import pytest

from helpers import FAST, assert_one_line_error, only_run_folder, read_metrics, run_in_process, run_script

pytestmark = pytest.mark.slow    # runs the real scripts in subprocesses


@pytest.mark.xdist_group('ce')
def test_ce_then_linear_with_val_split(shared_run, tmp_path):
    run, out = shared_run('ce')          # 2 epochs, fp16 (its exact resume: tests/engine/test_resume.py)
    assert 'best test top-1' in out.stdout
    assert 'test/acc' in read_metrics(run)[-1]
    # the encoder trained on the long-tailed digits; evaluated on the balanced digits (given: the checkpoint's
    # dataset is the default since 6d42068)
    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--dataset', 'digits', '--epochs', 1,
                     '--val_split', 0.2, '--save_folder', tmp_path / 'lin', *FAST)
    assert 'best val top-1' in out.stdout
    assert 'val/acc' in read_metrics(only_run_folder(tmp_path / 'lin'))[0]


def test_ce_carrot(tmp_path):
    out = run_script('main_ce.py', '--carrot', '--carrot_weight', 0.5, '--epochs', 2, '--learning_rate', 0.05,
                     '--save_folder', tmp_path, *FAST)
    rows = read_metrics(only_run_folder(tmp_path))
    assert float(rows[-1]['train/carrot/alpha']) == pytest.approx(0.5)
    assert {'test/ece', 'test/nll', 'test/acc'} <= set(rows[-1]) and 'ECE' in out.stdout


def test_long_tailed_digits_with_logit_adjustment(tmp_path):
    out = run_script('main_ce.py', '--dataset', 'digits_lt', '--imb_factor', 0.1, '--loss', 'logit_adjusted',
                     '--la_tau', 1.5, '--epochs', 1, '--save_folder', tmp_path, *FAST)
    run = only_run_folder(tmp_path)
    assert '_imb_0.1' in run and '_la_tau_1.5' in run and 'final test top-1' in out.stdout
    results = json.load(open(os.path.join(run, 'results.json')))
    assert {'final_test_many_acc', 'final_test_medium_acc', 'final_test_few_acc'} <= set(results)


@pytest.mark.parametrize('loss,flags,name', [('gce', ['--gce_q', 0.5], '_gce_q_0.5'),
                                             ('sce', ['--sce_alpha', 0.2, '--carrot'], '_sce_a_0.2_b_1.0')])
def test_noise_robust_losses_train_and_evaluate(loss, flags, name, tmp_path):
    """--loss gce and sce (docs/FIELD.md, "GCE and SCE") on noisy digits: one epoch, the run named by the loss's
    values, finite training loss and a test accuracy."""
    out = run_script('main_ce.py', '--loss', loss, *flags, '--label_noise', 0.4, '--epochs', 1,
                     '--save_folder', tmp_path, *FAST)
    run = only_run_folder(tmp_path)
    assert name in run and 'final test top-1' in out.stdout
    row = read_metrics(run)[-1]
    assert 0 < float(row['train/loss']) < 100 and 0 <= float(row['test/acc']) <= 100


def test_ce_loss_errors():
    for args, words in [(['--la_tau', 2], '--la_tau needs --loss logit_adjusted'),
                        (['--loss', 'balanced_softmax', '--la_tau', 2], '--la_tau needs --loss logit_adjusted'),
                        (['--loss', 'logit_adjusted', '--la_tau', -1], '--la_tau must be >= 0'),
                        (['--loss', 'nope'], '--loss'),
                        (['--temp', 0.1], '--temp needs --supcon_weight > 0'),
                        (['--supcon_weight', -1], '--supcon_weight must be >= 0')]:
        assert_one_line_error(run_in_process('main_ce.py', *args), words)


def test_one_stage_ce_supcon_resumes_exactly_and_evaluates(tmp_path):
    """main_ce.py --supcon_weight: 2 epochs; epoch 1's checkpoint resumed in a fresh folder reaches the same weights
    bit for bit; main_linear.py reads its encoder."""
    import shutil

    import torch

    from helpers import load
    args = ['--supcon_weight', 0.5, '--temp', 0.1, '--loss', 'balanced_softmax', '--size', 8, '--batch_size', 256,
            '--save_freq', 1, '--num_workers', 0, '--print_freq', 1000, '--device', 'cpu', '--model', 'resnet_nano']
    run_script('main_ce.py', *args, '--epochs', 2, '--save_folder', tmp_path / 'a')
    run = only_run_folder(tmp_path / 'a')
    assert '_balanced_softmax' in run and '_supcon_0.5_temp_0.1' in run
    row = read_metrics(run)[-1]
    assert float(row['train/supcon']) > 0 and float(row['train/ce']) > 0
    copy = tmp_path / 'b' / os.path.relpath(run, tmp_path / 'a')
    os.makedirs(copy)
    shutil.copy(os.path.join(run, 'ckpt_epoch_1.pth'), copy / 'last.pth')
    run_script('main_ce.py', *args, '--epochs', 2, '--resume', copy / 'last.pth')
    want, got = load(os.path.join(run, 'last.pth')), load(copy / 'last.pth')
    assert any(k.startswith('head.') for k in want['model'])
    assert all(torch.equal(got['model'][k], v) for k, v in want['model'].items())
    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 1, '--size', 8,
                     '--save_folder', tmp_path / 'lin', *FAST)
    assert out.stdout.strip().splitlines()[-1].startswith('final test top-1: ')


def test_batch_of_one_never_reaches_batchnorm(tmp_path):
    """9 training images in batches of 4 leave one image at the end of an epoch: it is dropped
    (train mode BatchNorm fails on a batch of one), so the run completes and saves."""
    from helpers import make_image_folder
    make_image_folder(tmp_path / 'data' / 'train', per_class=3)
    make_image_folder(tmp_path / 'data' / 'val', per_class=2)
    proc = run_in_process('main_ce.py', '--dataset', 'path', '--data_folder', tmp_path / 'data', '--mean', 0.5,
                          '--std', 0.25, '--size', 8, '--batch_size', 4, '--epochs', 1, '--num_workers', 0,
                          '--device', 'cpu', '--save_folder', tmp_path / 'runs')
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.path.isfile(os.path.join(only_run_folder(tmp_path / 'runs'), 'last.pth'))


def test_no_chunk_or_batch_of_one_image_reaches_batchnorm(tmp_path):
    """--batch_size 1 (or one image per torchrun process) and --chunk_size 1
    with single-view cross-entropy are one line; a batch of 5 in chunks of 4 would end in a chunk of one image:
    that chunk is merged into the one before, and the run trains."""
    from helpers import assert_one_line_error, make_image_folder
    from training.chunks import chunk_bounds
    assert chunk_bounds(5, 4, 1) == [(0, 5)] and chunk_bounds(9, 4, 1) == [(0, 4), (4, 9)]
    assert chunk_bounds(5, 4, 2) == [(0, 4), (4, 5)] and chunk_bounds(1, 4, 1) == [(0, 1)]
    make_image_folder(tmp_path / 'data', per_class=5)
    common = ['--dataset', 'path', '--data_folder', tmp_path / 'data', '--mean', 0.5, '--std', 0.25, '--size', 8,
              '--epochs', 1, '--num_workers', 0, '--device', 'cpu', '--save_folder', tmp_path / 'runs']
    assert_one_line_error(run_in_process('main_ce.py', *common, '--batch_size', 1),
                          '--batch_size 1 gives each step one image', 'at least 2')
    assert_one_line_error(run_in_process('main_ce.py', *common, '--batch_size', 4, '--chunk_size', 1),
                          '--chunk_size 1 puts single images through BatchNorm')
    proc = run_in_process('main_ce.py', *common, '--batch_size', 5, '--chunk_size', 4)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.xdist_group('tiny')
def test_label_fraction_says_how_many_labelled_images_and_results_record_n_train(tmp_path, tiny_ckpt):
    """--label_fraction never said how many labelled images a run used, and main_ce.py's results.json
    had no n_train (USAGE said it had): both scripts say it when training starts, both results hold it."""
    out = run_script('main_ce.py', '--label_fraction', 0.1, '--epochs', 1, '--save_folder', tmp_path / 'ce', *FAST)
    assert '--label_fraction 0.1: 142 labelled training images of 1437' in out.stdout
    with open(os.path.join(only_run_folder(tmp_path / 'ce'), 'results.json')) as f:
        assert json.load(f)['n_train'] == 142
    out = run_script('main_linear.py', '--ckpt', tiny_ckpt, '--label_fraction', 0.05, '--epochs', 1,
                     '--save_folder', tmp_path / 'lin', *FAST)
    assert '--label_fraction 0.05: 70 labelled training images of 1437' in out.stdout
    with open(os.path.join(only_run_folder(tmp_path / 'lin'), 'results.json')) as f:
        assert json.load(f)['n_train'] == 70
