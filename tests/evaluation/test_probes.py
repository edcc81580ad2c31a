"""evaluation/probes.py and --label_noise: K-shot draws, the logistic-regression probe, within-superclass accuracy on
embeddings whose answer is known, symmetric label noise; main_linear.py --shots end to end."""
import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from core.flags import UserError
from evaluation.probes import few_shot_indices, linear_probe, within_superclass_accuracy
from helpers import make_options


def test_few_shot_draws_exactly_k_per_class_and_repeat_with_their_seed():
    targets = [c for c in range(4) for _ in range(10 + c)]
    for k in (1, 5, 10):
        idx = few_shot_indices(targets, k, seed=3)
        assert np.bincount(np.asarray(targets)[idx]).tolist() == [k] * 4 and len(set(idx)) == 4 * k
    assert few_shot_indices(targets, 5, 3) == few_shot_indices(targets, 5, 3)
    assert few_shot_indices(targets, 5, 3) != few_shot_indices(targets, 5, 4)
    with pytest.raises(UserError, match='class 0 has 10 training images, fewer than --shots 11'):
        few_shot_indices(targets, 11, 0)


def superclass_embedding(separate, per_class=20, seed=0):
    """3 superclasses of 2 fine classes. ``separate``: each fine class on its own axis (plus small noise);
    otherwise the two fine classes of a superclass are the same point, their superclass's axis."""
    g = torch.Generator().manual_seed(seed)
    fine = torch.arange(6).repeat_interleave(per_class)
    axis = fine if separate else fine // 2
    noise = 0.01 * torch.randn(len(fine), 6, generator=g, dtype=torch.float64) if separate else 0
    feats = F.normalize(F.one_hot(axis, 6).double() + noise, dim=1)
    return feats, fine


def test_within_superclass_accuracy_on_known_embeddings():
    coarse_of = [0, 0, 1, 1, 2, 2]
    train, train_y = superclass_embedding(True, seed=0)
    test, test_y = superclass_embedding(True, seed=1)
    assert within_superclass_accuracy(train, train_y, test, test_y, coarse_of, k=5) == 100.0
    train, train_y = superclass_embedding(False, seed=0)
    test, test_y = superclass_embedding(False, seed=1)
    merged = within_superclass_accuracy(train, train_y, test, test_y, coarse_of, k=40)   # all of the superclass
    assert merged == pytest.approx(50.0)          # chance within a superclass of two fine classes


def test_linear_probe_separates_what_is_separable():
    train, train_y = superclass_embedding(True, per_class=3, seed=0)
    test, test_y = superclass_embedding(True, seed=1)
    assert linear_probe(train, train_y, test, test_y, 6) == 100.0
    merged, merged_y = superclass_embedding(False, per_class=3, seed=0)
    test_m, test_my = superclass_embedding(False, seed=1)
    assert linear_probe(merged, merged_y, test_m, test_my, 6) < 75.0    # fine classes of a superclass overlap
    assert linear_probe(train, train_y, test, test_y, 6) == linear_probe(train, train_y, test, test_y, 6)


def noise_opt(noise, seed=0, kind='symmetric'):
    return make_options(dataset='digits', size=8, label_noise=noise or None, seed=seed,
                        label_noise_kind=kind if noise else None)


def test_label_noise_flips_the_stated_fraction_of_training_labels_only():
    from data import build_dataset
    clean = build_dataset(noise_opt(0.0), 'train', None).targets
    for p in (0.2, 0.4):
        noisy = build_dataset(noise_opt(p), 'train', None)
        changed = sum(a != b for a, b in zip(clean, noisy.targets))
        assert stats.binomtest(changed, len(clean), p).pvalue > 1e-3
        assert changed == noisy.label_noise['n_flipped'] and noisy.label_noise['fraction'] == p
        assert noisy.fine_targets == clean                       # the clean labels are kept beside them
        assert [noisy.targets[i] != clean[i] for i in noisy.label_noise['flipped']] == [True] * changed
    def targets(opt, part='train'):
        return build_dataset(opt, part, None).targets
    assert targets(noise_opt(0.4)) == targets(noise_opt(0.4))
    assert targets(noise_opt(0.4, 1)) != targets(noise_opt(0.4))
    assert targets(noise_opt(0.4), 'test') == targets(noise_opt(0.0), 'test')
    # symmetric: a flipped label goes to each other class about equally often
    noisy = build_dataset(noise_opt(0.4), 'train', None)
    moved = [(noisy.targets[i] - clean[i]) % 10 for i in noisy.label_noise['flipped']]
    assert stats.chisquare(np.bincount(moved, minlength=10)[1:]).pvalue > 1e-3


def test_pairflip_noise_moves_a_label_to_the_next_class_only():
    from data import build_dataset
    clean = build_dataset(noise_opt(0.0), 'train', None).targets
    noisy = build_dataset(noise_opt(0.4, kind='pairflip'), 'train', None)
    assert noisy.label_noise['kind'] == 'pairflip'
    changed = sum(a != b for a, b in zip(clean, noisy.targets))
    assert changed == noisy.label_noise['n_flipped'] and stats.binomtest(changed, len(clean), 0.4).pvalue > 1e-3
    assert {(noisy.targets[i] - clean[i]) % 10 for i in noisy.label_noise['flipped']} == {1}
    # the same draw of which labels flip as symmetric noise with the seed: only where they go differs
    assert noisy.label_noise['flipped'] == build_dataset(noise_opt(0.4), 'train', None).label_noise['flipped']


def test_coarse_labels_are_noised_after_the_mapping():
    from data import DIGITS_COARSE, build_dataset
    opt = noise_opt(0.3)
    opt.label_granularity = 'coarse'
    noisy = build_dataset(opt, 'train', None)
    assert set(noisy.targets) == set(range(5))
    changed = sum(a != DIGITS_COARSE[f] for a, f in zip(noisy.targets, noisy.fine_targets))
    assert changed == noisy.label_noise['n_flipped'] > 0


@pytest.mark.slow
@pytest.mark.xdist_group('tiny')
def test_shots_and_label_noise_end_to_end(tiny_ckpt, tmp_path):
    from helpers import assert_one_line_error, only_run_folder, run_in_process, run_script
    out = run_script('main_linear.py', '--ckpt', tiny_ckpt, '--shots', 2, '--shot_draws', 3, '--within_superclass',
                     '--num_workers', 0, '--save_folder', tmp_path / 'probe')
    assert '2-shot linear probe' in out.stdout
    (found,) = [os.path.join(d, 'results.json') for d, _, fs in os.walk(tmp_path / 'probe') if 'results.json' in fs]
    assert '_shots_2_draws_3_seed_0' in found
    results = json.load(open(found))
    assert results['shots'] == 2 and len(results['draws_test_acc']) == 3 and len(set(results['draws_test_acc'])) > 1
    assert 10 < results['final_test_acc'] <= 100 and 50 <= results['final_test_within_superclass_acc'] <= 100
    assert 'final_test_knn_acc' in results and results['config']['shot_seed'] == 0
    again = run_in_process('main_linear.py', '--ckpt', tiny_ckpt, '--shots', 2, '--shot_draws', 3,
                           '--within_superclass', '--num_workers', 0, '--save_folder', tmp_path / 'probe')
    assert_one_line_error(again, 'already holds results.json')
    assert json.load(open(found)) == results
    run_script('main_supcon.py', '--label_noise', 0.4, '--epochs', 1, '--num_workers', 0, '--batch_size', 128,
               '--save_folder', tmp_path / 'noisy')
    run = only_run_folder(tmp_path / 'noisy')
    record = json.load(open(os.path.join(run, 'label_noise.json')))
    assert '_noise_0.4' in run and 0.3 < record['n_flipped'] / record['n_samples'] < 0.5
    for args, words in ((['--shots', 0], ['--shots must be >= 1']),
                        (['--shots', 500], ['fewer than --shots 500']),
                        (['--dataset', 'cifar10', '--within_superclass'], ['coarse labels are defined for'])):
        proc = run_in_process('main_linear.py', '--ckpt', tiny_ckpt, *args, '--save_folder', tmp_path / 'bad')
        assert_one_line_error(proc, *words)
    assert_one_line_error(run_in_process('main_ce.py', '--label_noise', 1.5), '--label_noise must be in [0, 1)')


def _probe_after_training(features, labels, scale, norm, steps=30, lr=0.5):
    """A linear probe (plain, or with ``norm`` MAE's BatchNorm) trained by SGD on ``features * scale`` from one
    initialization; its logits on the training features (in eval mode)."""
    from networks import LinearClassifier
    torch.manual_seed(0)
    probe = LinearClassifier(features.shape[1], num_classes=int(labels.max()) + 1, norm=norm)
    optimizer = torch.optim.SGD(probe.parameters(), lr=lr, momentum=0.9)
    x = features * scale
    for step in range(steps):
        batch = torch.arange(step * 32, step * 32 + 32) % len(x)
        loss = torch.nn.functional.cross_entropy(probe(x[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    probe.eval()
    with torch.no_grad():
        return probe(x)


def test_the_normalized_probe_does_not_move_when_the_features_are_scaled():
    """--probe_norm bn: multiplying every feature by a constant (an encoder whose features are 100x smaller or
    larger) leaves the trained probe's logits, and so its accuracy, where they were: the probe measures the features'
    arrangement, not their scale. Power: the plain probe at a fixed learning rate moves (it is SupContrast's)."""
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(320) % 4
    features = torch.randn(4, 24, generator=g)[labels] + 1.5 * torch.randn(320, 24, generator=g)
    normalized = [_probe_after_training(features, labels, scale, norm=True) for scale in (0.1, 1.0, 10.0)]
    for logits in normalized[1:]:
        assert torch.allclose(logits, normalized[0], atol=1e-3)
        assert (logits.argmax(1) == normalized[0].argmax(1)).all()
    plain = [(_probe_after_training(features, labels, scale, norm=False).argmax(1) == labels).float().mean()
             for scale in (0.01, 1.0, 100.0)]
    assert max(plain) - min(plain) > 0.05, plain
