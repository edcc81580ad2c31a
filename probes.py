"""Probes of a frozen encoder that can tell methods apart where a full-label linear probe is at its ceiling
(``main_linear.py --shots K``, ``--within_superclass``; definitions in ``docs/PROBES.md``).

- :func:`few_shot_indices` (from ``knn``, which the kNN monitor shares): ``K`` labelled training images per
  class, drawn with a seed of their own.
- :func:`linear_probe`: multinomial logistic regression on unit features, fitted to convergence (L-BFGS).
- :func:`within_superclass_accuracy`: fine-label weighted kNN restricted to each test image's own superclass.
"""
import torch
import torch.nn.functional as F

from data import coarse_labels
from flags import Feature, check
from knn import few_shot_indices, knn_predict  # noqa: F401  (few_shot_indices: part of this module's API)
from losses import cross_entropy


def linear_probe(train_feats, train_labels, test_feats, test_labels, num_classes, weight_decay=1e-4, max_iter=500):
    """Top-1 (%) on the test features of a multinomial logistic regression (weights and bias) fitted on the
    training features by full-batch L-BFGS: ``mean CE + weight_decay * |W|^2 / 2``. Features are L2-normalized.
    Deterministic: no sampling, no augmentation."""
    x = F.normalize(train_feats.double(), dim=1)
    y = train_labels.long()
    layer = torch.nn.Linear(x.shape[1], num_classes, dtype=torch.float64, device=x.device)
    torch.nn.init.zeros_(layer.weight)
    torch.nn.init.zeros_(layer.bias)
    optimizer = torch.optim.LBFGS(layer.parameters(), lr=1, max_iter=max_iter, tolerance_grad=1e-9,
                                  tolerance_change=1e-12, history_size=20, line_search_fn='strong_wolfe')

    def closure():
        optimizer.zero_grad()
        loss = cross_entropy(layer(x), y) + weight_decay / 2 * layer.weight.square().sum()
        loss.backward()
        return loss
    optimizer.step(closure)
    with torch.no_grad():
        pred = layer(F.normalize(test_feats.double(), dim=1)).argmax(1)
    return 100.0 * (pred == test_labels).double().mean().item()


def within_superclass_accuracy(train_feats, train_fine, test_feats, test_fine, coarse_of, k=200, t=0.1):
    """Top-1 (%) of a fine-label weighted kNN (``knn.knn_predict``, ``k``, ``t``) whose neighbours are only the
    training images of the test image's own superclass (``coarse_of[fine]``): how well sub-classes stay apart
    inside a superclass. Chance is ``1 / (fine classes in the superclass)``."""
    coarse_of = torch.as_tensor(coarse_of, device=train_fine.device)
    train_c, test_c = coarse_of[train_fine], coarse_of[test_fine]
    n_fine = int(coarse_of.numel())
    correct = 0
    for c in torch.unique(test_c).tolist():
        bank, queries = train_c == c, test_c == c
        pred = knn_predict(train_feats[bank], train_fine[bank], test_feats[queries], n_fine, k, t)
        correct += int((pred == test_fine[queries]).sum())
    return 100.0 * correct / test_fine.numel()


# ---------------------------------------------------------------- the probes' flags (flags.py)
def _check_probes(shots, shot_draws, val_split, within_superclass, dataset):
    check(shots is None or shots >= 1, f'--shots must be >= 1 (K labelled images per class), got {shots}')
    check(shot_draws >= 1, f'--shot_draws must be >= 1, got {shot_draws}')
    check(shots is None or val_split == 0, '--shots fits the probe to convergence: --val_split has no use')
    if within_superclass:
        coarse_labels(dataset)    # a one-line error for datasets without superclasses


PROBES = Feature(
    'probes (docs/PROBES.md)', scripts=('linear',), check=_check_probes,
    flags={'--shots': dict(type=int, default=None,
                           help='few-shot probe instead of SGD training: a logistic regression on frozen features of '
                                'K labelled training images per class, and a K-shot kNN'),
           '--shot_draws': dict(type=int, default=5, help='--shots: draws of the K-shot set, averaged'),
           '--shot_seed': dict(type=int, default=0, help='--shots: seed of the draws (their own, not --seed)'),
           '--within_superclass': dict(action='store_true',
                                       help='also report fine-label kNN accuracy within each test image\'s own '
                                            'superclass (datasets with coarse labels)')})


# ---------------------------------------------------------------- fine-tuning (main_linear.py --finetune)
def _check_finetune(finetune, encoder_lr, learning_rate, shots, given):
    check(finetune or 'encoder_lr' not in given, '--encoder_lr needs --finetune')
    if not finetune:
        return {'encoder_lr': None}
    check(not shots, '--finetune trains the encoder end to end; --shots probes frozen features: give one')
    encoder_lr = learning_rate / 10 if encoder_lr is None else encoder_lr
    check(encoder_lr > 0, f'--encoder_lr must be > 0, got {encoder_lr}')
    return {'encoder_lr': encoder_lr}


FINETUNE = Feature(
    'fine-tuning (docs/USAGE.md, "Fine-tuning and label fractions")', scripts=('linear',), check=_check_finetune,
    flags={'--finetune': dict(action='store_true',
                              help='fine-tune the encoder end to end with the linear classifier (not frozen)'),
           '--encoder_lr': dict(type=float, default=None,
                                help='with --finetune: the encoder\'s learning rate, following the schedule as '
                                     '--learning_rate does (default: 0.1 x --learning_rate)')},
    run_name=lambda finetune, encoder_lr: f'_finetune_enclr_{encoder_lr}' if finetune else '')


# ---------------------------------------------------------------- the linear probe's form (main_linear.py)
LINEAR_PROBE = Feature(
    'the linear probe', scripts=('linear',),
    flags={'--probe_norm': dict(choices=['none', 'bn'], default='none',
                                help='bn: MAE\'s normalized probe, a BatchNorm without affine parameters before the '
                                     'linear layer (default none: SupContrast\'s plain linear layer)')},
    run_name=lambda probe_norm: '_bnprobe' if probe_norm == 'bn' else '')
