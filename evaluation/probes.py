"""Probes of a frozen encoder that can tell methods apart where a full-label linear probe is at its ceiling
(``main_linear.py --shots K``, ``--within_superclass``; definitions in ``docs/PROBES.md``).

- :func:`few_shot_indices` (from ``knn``, which the kNN monitor shares): ``K`` labelled training images per
  class, drawn with a seed of their own.
- :func:`linear_probe`: multinomial logistic regression on unit features, fitted to convergence (L-BFGS).
- :func:`within_superclass_accuracy`: fine-label weighted kNN restricted to each test image's own superclass.

and the trainer of ``main_linear.py``'s SGD probe, :class:`LinearProbe` (a ``loop.Trainer``): a linear classifier
on the frozen encoder, or with ``--finetune`` the encoder and the classifier end to end.
"""
import torch
import torch.nn.functional as F

from core.flags import Feature, call_hook, check
from data import coarse_labels
from evaluation.knn import few_shot_indices, knn_predict  # noqa: F401  (few_shot_indices: part of this module's API)
from losses import cross_entropy
from networks import EncoderClassifier, LinearClassifier
from runtime.device import Runtime
from runtime.distributed import wrap_model
from training.loop import Optimization, evaluate_parts, parts_after, train_loop
from util import accuracy


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


# ---------------------------------------------------------------- the probes' flags (core/flags.py)
def _check_probes(shots, shot_draws, within_superclass, dataset):
    check(shots is None or shots >= 1, f'--shots must be >= 1 (K labelled images per class), got {shots}')
    check(shot_draws >= 1, f'--shot_draws must be >= 1, got {shot_draws}')
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


# ---------------------------------------------------------------- main_linear.py's trainer
class LinearProbe:
    """What ``main_linear.py`` trains, built once from ``opt``: a :class:`networks.LinearClassifier` (with
    ``--probe_norm bn``, MAE's BatchNorm before it) on the frozen ``encoder``'s features, or with ``--finetune`` the
    encoder too (``model``: an :class:`networks.EncoderClassifier`, the encoder at ``--encoder_lr`` on the same
    schedule). ``eval_loaders``: ``{split: loader}`` measured after every epoch (``val`` with ``--val_split``,
    ``test``), with ``num_classes`` and ``class_counts`` (training samples per class, for the shot groups)."""

    def __init__(self, opt, encoder, num_classes, eval_loaders, class_counts=None):
        self.runtime = runtime = call_hook(Runtime, opt)
        self.encoder, self.finetune, self.print_freq = encoder, opt.finetune, opt.print_freq
        self.eval_loaders, self.num_classes, self.class_counts = eval_loaders, num_classes, class_counts
        self.test_every, self.epochs = opt.test_every, opt.epochs
        self.classifier = LinearClassifier(encoder.feature_dim, num_classes=num_classes,
                                           norm=opt.probe_norm == 'bn').to(runtime.device)
        if opt.finetune:        # the encoder trains too, at its own learning rate (--encoder_lr, on the same schedule)
            for p in encoder.parameters():
                p.requires_grad_(True)
            self.model = EncoderClassifier(encoder, self.classifier)
            self.scaled = [(list(encoder.parameters()), opt.encoder_lr / opt.learning_rate)]
        else:
            self.model, self.scaled = self.classifier, []
        self.ddp_model = wrap_model(self.model, runtime.device, opt.syncBN)    # itself in one process

    def parameters(self):
        """The classifier's parameters (the optimizer's base group; :attr:`scaled`: the encoder's, fine-tuning)."""
        return self.classifier.parameters()

    def checkpointed(self) -> dict:
        return {}

    def predict(self, images, head=None):
        """Logits of ``images``: the frozen encoder's features (no graph), then ``head`` (the classifier)."""
        with torch.no_grad():
            features = self.encoder(images)
        return (head or self.classifier)(features.float())

    def train_epoch(self, loader, optim: Optimization, epoch: int) -> dict:
        """One epoch of cross-entropy on ``loader``'s ``(images, labels)`` (the encoder's BatchNorm in training mode
        too when fine-tuning)."""
        self.model.train()
        return train_loop(loader, optim, epoch, self.loop_step, 'Finetune' if self.finetune else 'Linear',
                          self.print_freq)

    def loop_step(self, batch, backward):
        runtime = self.runtime
        images, labels = runtime.to_device(batch[0]), batch[1].to(runtime.device, non_blocking=True)
        with runtime.autocast():
            logits = self.ddp_model(images) if self.finetune else self.predict(images, self.ddp_model)
        loss = cross_entropy(logits.float(), labels)
        backward(loss)
        return loss.detach(), labels.shape[0], {'acc': accuracy(logits, labels)[0]}

    def evaluate_epoch(self, epoch: int) -> dict:
        """Loss, top-1, ECE, per-class and shot-group accuracy of every split of ``eval_loaders`` measured after
        ``epoch`` (``--test_every end``: the test split after the last epoch only)."""
        self.model.eval()
        return evaluate_parts(self.runtime, self.eval_loaders, self.predict,
                              parts_after(self.eval_loaders, self.test_every, epoch, self.epochs), self.num_classes,
                              self.class_counts)


# ---------------------------------------------------------------- the linear probe's form (main_linear.py)
LINEAR_PROBE = Feature(
    'the linear probe', scripts=('linear',),
    flags={'--probe_norm': dict(choices=['none', 'bn'], default='bn', absent='none',    # stage 1's records: as before
                                help='bn (default): MAE\'s normalized probe, a BatchNorm without affine '
                                     'parameters before the linear layer, blind to the features\' scale and offset; '
                                     'none: SupContrast\'s plain linear layer')},
    run_name=lambda probe_norm: '_bnprobe' if probe_norm == 'bn' else '')
