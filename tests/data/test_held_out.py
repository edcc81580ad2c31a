"""The held-out split through both stages (data/labels.py ``HELD_OUT``, data/loaders.py ``build_dataset`` parts):
the same stratified images in every script, stage and seed; never trained on; measured by the kNN monitor and the
epoch selection; ``--eval_split val`` reads no test image (a CIFAR folder without its test file); records that say
where the selection was made; main_linear.py holding out what its stage-1 run held out."""
import json
import os

import numpy as np
import pytest

from data import build_dataset, evaluated_parts
from helpers import (
    FAST,
    assert_one_line_error,
    make_fake_cifar,
    make_options,
    only_run_folder,
    run_in_process,
    run_script,
)

HELD = {'dataset': 'digits', 'size': 8, 'val_split': 0.2}


def indices(dataset):
    return list(dataset.indices)


@pytest.mark.parametrize('script', ['supcon', 'ce', 'linear'])
def test_every_script_holds_out_the_same_stratified_images_whatever_the_seed(script):
    """The held-out part: ceil(0.2 N) images, stratified by class, disjoint from the training part and together the
    whole training split; the same in the three scripts and for every --seed (its own --split_seed)."""
    extra = {'ckpt': 'x.pth'} if script == 'linear' else {}
    parts = {p: build_dataset(make_options(script, **HELD, **extra, seed=7), p, None) for p in ('train', 'val')}
    reference = {p: build_dataset(make_options('supcon', **HELD), p, None) for p in ('train', 'val')}
    train, val = indices(parts['train']), indices(parts['val'])
    assert not set(train) & set(val) and sorted(train + val) == list(range(1437))
    assert len(val) == int(np.ceil(0.2 * 1437))
    assert (train, val) == (indices(reference['train']), indices(reference['val']))
    counts = np.bincount(parts['val'].targets, minlength=10) / np.bincount(parts['train'].targets, minlength=10)
    assert np.allclose(counts, 0.25, atol=0.04)                  # stratified: every class held out alike
    other = build_dataset(make_options(script, **HELD, **extra, split_seed=1), 'val', None)
    assert indices(other) != val                                 # power: the split seed draws another part


def test_label_operations_touch_the_training_part_alone():
    """Label noise, a labelled fraction and coarse labels: the held-out part keeps its clean labels and every image."""
    noisy = make_options('ce', **HELD, label_noise=0.4, label_fraction=0.5)
    val = build_dataset(noisy, 'val', None)
    clean = build_dataset(make_options('ce', **HELD), 'val', None)
    assert indices(val) == indices(clean) and val.targets == clean.targets
    train = build_dataset(noisy, 'train', None)
    assert set(indices(train)) < set(indices(build_dataset(make_options('ce', **HELD), 'train', None)))
    coarse = build_dataset(make_options('supcon', **HELD, label_granularity='coarse'), 'val', None)
    assert indices(coarse) == indices(clean) and max(coarse.targets) == 4


def test_the_parts_evaluated_and_bad_flags():
    assert evaluated_parts(0, 'test') == ('test',)
    assert evaluated_parts(0.2, 'test') == ('val', 'test')
    assert evaluated_parts(0.2, 'val') == ('val',)
    for argv, words in ((['--eval_split', 'val'], '--eval_split val evaluates on the held-out part'),
                        (['--split_seed', '3'], '--split_seed draws the held-out part'),
                        (['--val_split', '1'], '--val_split must be in [0, 1)')):
        assert_one_line_error(run_in_process('main_supcon.py', *argv), words)
    with pytest.raises(ValueError, match='--val_split > 0'):
        build_dataset(make_options('supcon', dataset='digits'), 'val', None)


@pytest.mark.slow
def test_eval_split_val_reads_no_test_file_in_any_script(tmp_path):
    """A CIFAR folder without its test file: with --val_split and --eval_split val the kNN monitor, CE and the linear
    probe run on the held-out part; results.json says the test split was not read and the selection was made on
    held-out data. Power: without --eval_split val the same command needs the test file."""
    data = make_fake_cifar(tmp_path / 'data', n_train=100)
    os.remove(os.path.join(data, 'cifar-10-batches-py', 'test_batch'))
    common = [*FAST, '--dataset', 'cifar10', '--data_folder', data, '--model', 'resnet_tiny', '--epochs', 1,
              '--val_split', 0.2, '--eval_split', 'val']
    pre = run_script('main_supcon.py', *common, '--knn_every', 1, '--knn_k', 5, '--save_folder', tmp_path / 'pre')
    run = only_run_folder(tmp_path / 'pre')
    assert 'knn/val_acc' in open(os.path.join(run, 'metrics.csv')).readline()
    lin = run_script('main_linear.py', *common, '--ckpt', os.path.join(run, 'last.pth'), '--save_folder',
                     tmp_path / 'lin')
    assert 'the test split was not read' in lin.stdout
    ce = run_script('main_ce.py', *common, '--save_folder', tmp_path / 'ce')
    for folder in (tmp_path / 'lin', tmp_path / 'ce'):
        results = json.loads(open(os.path.join(only_run_folder(folder), 'results.json')).read())
        assert results['test_split_read'] is False and results['selected_on'] == 'held-out'
        assert 'final_val_acc' in results and not any(k.startswith('final_test') for k in results)
    assert pre.returncode == ce.returncode == 0
    needs_test = run_script('main_ce.py', *common[:-2], '--save_folder', tmp_path / 'ce2', check=False)
    assert needs_test.returncode != 0 and 'test_batch' in needs_test.stderr


@pytest.mark.slow
def test_a_probe_holds_out_what_its_stage_1_held_out_and_the_records_say_where_it_selected(tmp_path):
    """main_linear.py without the flags takes the stage-1 run's held-out part (the epoch selected there, the test
    split read too); another held-out part is one line. A run without a held-out part selects on test and says
    so."""
    digits = [*FAST, '--epochs', 1]
    run_script('main_supcon.py', *digits, '--val_split', 0.2, '--save_folder', tmp_path / 'pre')
    ckpt = os.path.join(only_run_folder(tmp_path / 'pre'), 'last.pth')
    lin = run_script('main_linear.py', *digits, '--ckpt', ckpt, '--save_folder', tmp_path / 'lin')
    results = json.loads(open(os.path.join(only_run_folder(tmp_path / 'lin'), 'results.json')).read())
    assert results['config']['val_split'] == 0.2 and results['selected_on'] == 'held-out'
    assert results['test_split_read'] is True and 'best val top-1' in lin.stdout
    assert_one_line_error(run_in_process('main_linear.py', *digits, '--ckpt', ckpt, '--val_split', 0.3),
                          'holds out other images than the stage-1 run')
    plain = run_script('main_linear.py', *digits, '--ckpt', ckpt, '--val_split', 0, '--save_folder', tmp_path / 'p')
    results = json.loads(open(os.path.join(only_run_folder(tmp_path / 'p'), 'results.json')).read())
    assert results['selected_on'] == 'test' and results['selected_by'] == 'test/acc'
    assert plain.stdout.strip().splitlines()[-1].startswith('final test top-1: ')


def test_with_a_held_out_part_the_test_split_is_read_once_after_the_last_epoch(tmp_path):
    """--test_every: with --val_split (auto: end) the epoch is selected on the held-out part and the test split is
    read once, after the last epoch, as metrics.csv and results.json show; --test_every epoch gives SupContrast's
    per-epoch test curve back and says so; --test_every end without a held-out part selects nothing (the last epoch)
    and reads the test split once."""
    import csv
    digits = [*FAST, '--epochs', 3, '--learning_rate', 0.1]

    def run(name, *extra):
        out = run_script('main_ce.py', *digits, *extra, '--save_folder', tmp_path / name)
        folder = only_run_folder(tmp_path / name)
        with open(os.path.join(folder, 'metrics.csv')) as f:
            rows = list(csv.DictReader(f))
        tested = [int(r['epoch']) for r in rows if r.get('test/acc')]
        return out, tested, json.loads(open(os.path.join(folder, 'results.json')).read())
    out, tested, results = run('once', '--val_split', 0.2)
    assert tested == [3] and results['test_read'] == 'once, after the last epoch'
    assert results['selected_on'] == 'held-out' and results['config']['test_every'] == 'end'
    assert 'the test split was read once, after the last epoch' in out.stdout
    _, tested, results = run('curve', '--val_split', 0.2, '--test_every', 'epoch')
    assert tested == [1, 2, 3] and results['test_read'] == 'every epoch'
    _, tested, results = run('plain')                                   # SupContrast's habit, as before
    assert tested == [1, 2, 3] and results['selected_on'] == 'test'
    out, tested, results = run('last', '--test_every', 'end')
    assert tested == [3] and results['selected_on'] == 'last epoch' and results['best_epoch'] == 3
    assert 'read once, after the last epoch (3)' in out.stdout
    # resumed for more epochs: the test split was read at the first run's last epoch and at the new last one, and
    # results.json says so (it said 'once, after the last epoch', what the flag asked)
    last = os.path.join(only_run_folder(tmp_path / 'last'), 'last.pth')
    run_script('main_ce.py', *digits[:-4], '--epochs', 4, '--learning_rate', 0.1, '--test_every', 'end',
               '--resume', last)
    results = json.loads(open(os.path.join(os.path.dirname(last), 'results.json')).read())
    assert results['test_read'] == 'at epochs 3 and 4'


def test_val_noise_same_gives_the_held_out_part_the_training_noise_drawn_independently():
    """--val_noise same: the held-out labels get the training labels' rate and kind of noise (over 40 seeds the rate
    is 0.4 within sampling error, and every flip goes to another class), drawn from a stream of their own: which
    held-out labels flip is independent of which training labels flip under the same seed (the flips of the first
    held-out and training positions agree as often as chance says); the images are the clean run's, and the test
    split is untouched. Power: drawn from the training part's stream, the two flip patterns coincide."""
    from data.labels import LABEL_NOISE_SEED, noisy_labels
    clean_val = build_dataset(make_options('ce', **HELD), 'val', None)
    test = build_dataset(make_options('ce', **HELD), 'test', None).targets
    rates, agree, n = [], [], len(clean_val.targets)
    for seed in range(40):
        opt = make_options('ce', **HELD, label_noise=0.4, val_noise='same', seed=seed)
        assert opt.held_out_noise == [0.4, 'symmetric']
        val, train = build_dataset(opt, 'val', None), build_dataset(opt, 'train', None)
        assert indices(val) == indices(clean_val)
        flipped = np.asarray(val.targets) != np.asarray(clean_val.targets)
        rates.append(flipped.mean())
        train_flipped = np.zeros(len(train.targets), bool)
        train_flipped[train.label_noise['flipped']] = True
        agree.append((flipped == train_flipped[:n]).mean())
        assert build_dataset(opt, 'test', None).targets == test
    assert abs(np.mean(rates) - 0.4) < 0.02                     # 40 x 288 labels: sd of the mean about 0.005
    assert abs(np.mean(agree) - (0.4 ** 2 + 0.6 ** 2)) < 0.02   # independent flips agree with p^2 + (1-p)^2
    same_stream = [np.asarray(noisy_labels(clean_val.targets, 10, 0.4, s, offset=LABEL_NOISE_SEED)[0])
                   != np.asarray(clean_val.targets) for s in range(5)]
    trained = [np.asarray(noisy_labels(list(range(10)) * 200, 10, 0.4, s)[0]) != np.asarray(list(range(10)) * 200)
               for s in range(5)]
    assert all((a == b[:n]).all() for a, b in zip(same_stream, trained))      # power: one stream, one pattern
    pair = make_options('ce', **HELD, label_noise=0.4, label_noise_kind='pairflip', val_noise='same')
    val = build_dataset(pair, 'val', None)
    moved = [(c, v) for c, v in zip(clean_val.targets, val.targets) if c != v]
    assert moved and all(v == (c + 1) % 10 for c, v in moved)


def test_val_noise_bad_input_is_one_line():
    for argv, words in ((['--val_noise', 'same', '--label_noise', '0.2'], '--val_noise same gives the held-out part '
                                                                          'noisy labels: give --val_split > 0 too'),
                        (['--val_noise', 'same', '--val_split', '0.2'], 'give --label_noise > 0 too')):
        assert_one_line_error(run_in_process('main_ce.py', *argv), words)


@pytest.mark.slow
def test_a_probe_with_val_noise_same_takes_its_stage_1_noise_and_says_so(tmp_path):
    """main_linear.py --val_noise same on a stage-1 run trained with --label_noise 0.4: its held-out labels get that
    noise (its own training labels stay clean), and results.json says which labels the held-out part had."""
    digits = [*FAST, '--epochs', 1, '--val_split', 0.2]
    run_script('main_supcon.py', *digits, '--label_noise', 0.4, '--val_noise', 'same', '--save_folder', tmp_path / 'p')
    ckpt = os.path.join(only_run_folder(tmp_path / 'p'), 'last.pth')
    for name, extra, said in (('noisy', ['--val_noise', 'same'], 'noisy (0.4 symmetric)'), ('clean', [], 'clean')):
        run_script('main_linear.py', *FAST, '--epochs', 1, '--ckpt', ckpt, '--shots', 2, '--shot_draws', 1, *extra,
                   '--save_folder', tmp_path / name)
        path = next((tmp_path / name).rglob('results.json'))
        results = json.loads(path.read_text())
        assert results['held_out_labels'] == said and results['config']['label_noise'] == 0
        assert results['config']['val_split'] == 0.2
