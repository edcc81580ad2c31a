"""main_linear.py's evaluations beyond the frozen linear probe: end-to-end fine-tuning (--finetune, the
encoder at its own learning rate), a fixed labelled fraction of the training set (--label_fraction), and transfer
(a checkpoint evaluated on another dataset). The frozen probe itself: tests/test_main_supcon.py and others."""
import json
import os

import pytest
import torch

from helpers import (
    FAST,
    assert_one_line_error,
    load,
    make_fake_cifar,
    only_run_folder,
    run_in_process,
    run_script,
)

pytestmark = pytest.mark.slow    # runs the real scripts


def encoder_state(state):
    return {k: v for k, v in state.items() if k.startswith('encoder.')}


def test_finetune_trains_the_encoder_resumes_exactly_and_takes_a_label_fraction(tiny_ckpt, tmp_path):
    """--finetune moves the encoder's weights (the frozen probe leaves them: its checkpoint holds the classifier
    only), trains on 10 % of the labels (a stratified subset: n_train in results.json), and 1 epoch + --resume equals
    2 epochs bit for bit (encoder, classifier, optimizer state of both learning rates)."""
    args = ['--ckpt', tiny_ckpt, '--finetune', '--encoder_lr', 0.01, '--label_fraction', 0.1, '--batch_size', 64,
            *FAST]
    run_script('main_linear.py', *args, '--epochs', 2, '--save_folder', tmp_path / 'whole')
    run_script('main_linear.py', *args, '--epochs', 1, '--save_folder', tmp_path / 'parts')
    part = os.path.join(only_run_folder(tmp_path / 'parts'), 'last.pth')
    run_script('main_linear.py', *args, '--epochs', 2, '--resume', part)
    folder = only_run_folder(tmp_path / 'whole')
    assert '_labels_0.1' in folder and '_finetune_enclr_0.01' in folder
    whole, resumed, stage1 = load(os.path.join(folder, 'last.pth')), load(part), load(tiny_ckpt)
    for key, value in whole['model'].items():
        assert torch.equal(value, resumed['model'][key]), key
    tuned = encoder_state(whole['model'])
    assert tuned.keys() == encoder_state(stage1['model']).keys()
    assert any(not torch.equal(v, stage1['model'][k]) for k, v in tuned.items())          # the encoder trained
    assert whole['optimizer']['param_groups'][-1]['lr_scale'] == pytest.approx(0.1)
    results = json.load(open(os.path.join(folder, 'results.json')))
    assert results['n_train'] == 142 and 0 <= results['final_test_acc'] <= 100        # 10 % of each digit class
    frozen = run_script('main_linear.py', '--ckpt', tiny_ckpt, '--epochs', 1, '--batch_size', 64, *FAST,
                        '--save_folder', tmp_path / 'frozen')
    assert 'final test top-1' in frozen.stdout
    assert not encoder_state(load(os.path.join(only_run_folder(tmp_path / 'frozen'), 'last.pth'))['model'])
    for bad, *words in [(['--encoder_lr', 0.01], '--encoder_lr needs --finetune'),
                       (['--finetune', '--shots', 5], '--finetune', '--shots'),
                       (['--label_fraction', 0], '--label_fraction must be in (0, 1]')]:
        assert_one_line_error(run_in_process('main_linear.py', '--ckpt', tiny_ckpt, *bad,
                                             '--save_folder', tmp_path / 'bad'), *words)


def test_transfer_to_another_dataset(tiny_ckpt, tmp_path):
    """A digits encoder evaluated on CIFAR-10 files (--dataset given): the images are resized to the encoder's size,
    normalized as its training data was; a --size other than the encoder's is one line."""
    data = make_fake_cifar(tmp_path / 'cifar')
    out = run_script('main_linear.py', '--ckpt', tiny_ckpt, '--dataset', 'cifar10', '--data_folder', data,
                     '--epochs', 1, '--batch_size', 16, '--num_workers', 0, '--device', 'cpu',
                     '--save_folder', tmp_path / 'lin')
    results = json.load(open(os.path.join(only_run_folder(tmp_path / 'lin'), 'results.json')))
    assert 'final test top-1' in out.stdout and results['config']['dataset'] == 'cifar10'
    assert results['config']['size'] == load(tiny_ckpt)['config']['size']
    assert_one_line_error(run_in_process('main_linear.py', '--ckpt', tiny_ckpt, '--dataset', 'cifar10',
                                         '--data_folder', data, '--size', 32), '--size 32 contradicts')


@pytest.mark.xdist_group('tiny')
def test_a_diverged_probe_says_so_and_the_normalized_probe(tiny_ckpt, tmp_path):
    """A probe whose training loss ends above chance level (ln C) reported its accuracy with exit 0 and
    no word; now a warning line, ``warnings.txt`` and ``probe_diverged``/``probe_warning`` in results.json. A probe
    that trains says ``probe_diverged: false``. ``--probe_norm bn``, the default: MAE's BatchNorm (no affine
    parameters) before the linear layer, in the checkpoint and the run name."""
    args = ['--ckpt', tiny_ckpt, '--epochs', 3, *FAST]
    bad = run_script('main_linear.py', *args, '--learning_rate', 30, '--probe_norm', 'none', '--save_folder',
                     tmp_path / 'bad')
    folder = only_run_folder(tmp_path / 'bad')
    with open(os.path.join(folder, 'results.json')) as f:
        results = json.load(f)
    assert results['probe_diverged'] and 'above chance level (ln 10' in results['probe_warning']
    assert 'test NLL' in results['probe_warning'] and 'does not measure' not in results['probe_warning']
    assert 'warning: the linear probe did not converge' in bad.stderr and 'warning' not in bad.stdout
    with open(os.path.join(folder, 'warnings.txt')) as f:
        assert 'the linear probe did not converge' in f.read()
    run_script('main_linear.py', *args, '--learning_rate', 0.1, '--save_folder', tmp_path / 'bn')     # the default
    folder = only_run_folder(tmp_path / 'bn')
    with open(os.path.join(folder, 'results.json')) as f:
        results = json.load(f)
    assert results['probe_diverged'] is False and results['probe_warning'] is None
    assert folder.endswith('_bnprobe') and 'norm.running_mean' in load(os.path.join(folder, 'last.pth'))['model']
    assert 'weight' not in {k.split('.')[-1] for k in load(os.path.join(folder, 'last.pth'))['model'] if 'norm' in k}
