"""SupContrast's learning-rate schedule (step decay or cosine, with a linear warm-up) and its SGD optimizer."""
import math
from dataclasses import dataclass

import numpy as np
import torch

from flags import Feature


@dataclass(frozen=True)
class Schedule:
    """The learning rate of each epoch and warm-up iteration (SupContrast's ``adjust_learning_rate`` and
    ``warmup_learning_rate``). The fields are the options of those names; build it with
    ``flags.call_hook(Schedule, opt)``. Epochs count from 1."""
    learning_rate: float
    epochs: int
    lr_decay_epochs: tuple = ()
    lr_decay_rate: float = 0.1
    cosine: bool = False
    warm: bool = False
    warm_epochs: int = 10
    warmup_from: float = 0.01

    def lr_at(self, epoch: int) -> float:
        """SupContrast's per-epoch learning rate."""
        lr = self.learning_rate
        if self.cosine:
            eta_min = lr * self.lr_decay_rate ** 3
            return eta_min + (lr - eta_min) * (1 + math.cos(math.pi * epoch / self.epochs)) / 2
        steps = int(np.sum(epoch > np.asarray(self.lr_decay_epochs)))
        return lr * self.lr_decay_rate ** steps

    def warmup_target(self) -> float:
        """The learning rate the warm-up ramps to (SupContrast's ``warmup_to``)."""
        if self.cosine:
            eta_min = self.learning_rate * self.lr_decay_rate ** 3
            return eta_min + (self.learning_rate - eta_min) * (
                1 + math.cos(math.pi * self.warm_epochs / self.epochs)) / 2
        return self.learning_rate

    def adjust(self, optimizer, epoch: int) -> None:
        """Set the epoch's learning rate."""
        set_lr(optimizer, self.lr_at(epoch))

    def warmup(self, optimizer, epoch: int, batch_id: int, total_batches: int) -> None:
        """Per-iteration linear warm-up from ``warmup_from`` during the first ``warm_epochs`` epochs."""
        if self.warm and epoch <= self.warm_epochs:
            p = (batch_id + (epoch - 1) * total_batches) / (self.warm_epochs * total_batches)
            set_lr(optimizer, self.warmup_from + p * (self.warmup_target() - self.warmup_from))


def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group['lr'] = lr


def set_optimizer(params, learning_rate, momentum, weight_decay):
    """SupContrast's optimizer: SGD with momentum and weight decay."""
    return torch.optim.SGD(params, lr=learning_rate, momentum=momentum, weight_decay=weight_decay)


def _schedule_defaults(batch_size, warm):
    # SupContrast: large batches always warm up; 10 epochs from 0.01
    return {'warm': warm or batch_size > 256, 'warm_epochs': 10, 'warmup_from': 0.01}


SCHEDULE = Feature(
    'learning-rate schedule', check=_schedule_defaults, resume_may_change=('warm_epochs', 'warmup_from'),
    flags={'--cosine': dict(action='store_true', help='cosine annealing (else step decay at --lr_decay_epochs)'),
           '--warm': dict(action='store_true', help='10-epoch linear warm-up from 0.01 (always on above batch 256)')},
    run_name=lambda cosine, warm: ('_cosine' if cosine else '') + ('_warm' if warm else ''))
