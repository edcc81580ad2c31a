"""SupContrast's learning-rate schedule (step decay or cosine, with a linear warm-up) and the optimizers: its SGD,
AdamW and LARS (``--optimizer``), with biases and normalization weights optionally kept out of weight decay."""
import math
from dataclasses import dataclass

import numpy as np
import torch

from core.flags import Feature, check


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
    """Every group's learning rate: ``lr`` times the group's ``lr_scale`` (1 unless set: the encoder's group under
    ``main_linear.py --finetune --encoder_lr``)."""
    for group in optimizer.param_groups:
        group['lr'] = lr * group.get('lr_scale', 1.0)


class LARS(torch.optim.Optimizer):
    """SGD with momentum and layer-wise adaptive rate scaling (You et al. 2017, "Large Batch Training of
    Convolutional Networks"), as SimCLR, solo-learn and lightly use it. Per parameter tensor ``w`` with gradient
    ``g`` in a group with ``lars=True``::

        d = g + weight_decay * w
        d = d * (eta * ||w|| / ||d||)        (1 where ||w|| or ||d|| is 0)
        buf = momentum * buf + d;  w = w - lr * buf

    A group with ``lars=False`` (biases and normalization weights, :func:`parameter_groups`) takes the plain SGD
    step of the same formula without the trust ratio. The trust ratio stays on the device (no host read); state
    (the momentum buffers) is saved and restored with ``state_dict``."""

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, eta=0.001, lars=True):
        if not (lr > 0 and momentum >= 0 and weight_decay >= 0 and eta > 0):
            raise ValueError(f'need lr > 0, momentum >= 0, weight_decay >= 0, eta > 0; got {lr}, {momentum}, '
                             f'{weight_decay}, {eta}')
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta, lars=lars))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            for p in group['params']:
                if p.grad is None:
                    continue
                d = p.grad.add(p, alpha=group['weight_decay']) if group['weight_decay'] else p.grad.clone()
                if group['lars']:
                    w_norm, d_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(d)
                    usable = (w_norm > 0) & (d_norm > 0)
                    d.mul_(torch.where(usable, group['eta'] * w_norm / torch.where(usable, d_norm, 1), 1.0))
                state = self.state[p]
                if 'momentum_buffer' not in state:
                    state['momentum_buffer'] = d
                else:
                    state['momentum_buffer'].mul_(group['momentum']).add_(d)
                p.add_(state['momentum_buffer'], alpha=-group['lr'])
        return loss


def parameter_groups(params, exclude_bias_norm):
    """``[{'params': ...}, ...]``: one group, or with ``exclude_bias_norm`` two: the weights (tensors of 2 or more
    dimensions: convolutions, linear layers, attention projections) and the biases and normalization weights (1-D:
    BatchNorm's and LayerNorm's scales and shifts, every bias), which get no weight decay and no LARS scaling (as
    solo-learn's and lightly's ``exclude_bias_n_norm``; the group's ``lars`` is false, a key SGD and AdamW ignore)."""
    params = [p for p in params if p.requires_grad]
    if not exclude_bias_norm:
        return [{'params': params}]
    groups = [{'params': [p for p in params if p.ndim > 1]},
              {'params': [p for p in params if p.ndim <= 1], 'weight_decay': 0.0, 'lars': False}]
    return [group for group in groups if group['params']]


def set_optimizer(params, learning_rate, momentum, weight_decay, optimizer='sgd', exclude_bias_norm=False,
                  lars_eta=0.001, adamw_betas=(0.9, 0.999), scaled=(), fused=False):
    """The optimizer of ``--optimizer``: SupContrast's SGD with momentum and weight decay (the default), AdamW
    (``adamw_betas``; ``momentum`` unused) or :class:`LARS` (``lars_eta``; biases and normalization weights always
    excluded from its scaling and weight decay); ``exclude_bias_norm`` keeps them out of weight decay for the others
    too (:func:`parameter_groups`). ``scaled``: ``[(params, lr_scale), ...]``, more parameters whose learning rate
    is ``lr_scale`` times the schedule's (:func:`set_lr`). ``fused`` (``--compile``): SGD's and AdamW's update of
    every parameter in one kernel (torch's fused implementations; the same arithmetic, its multiply-adds fused, so
    within a rounding of the default multi-tensor update); LARS keeps its own."""
    exclude = exclude_bias_norm or optimizer == 'lars'
    groups = parameter_groups(params, exclude)
    for more, scale in scaled:
        groups += [{**group, 'lr_scale': scale, 'lr': learning_rate * scale}
                   for group in parameter_groups(more, exclude)]
    if optimizer == 'sgd':
        return torch.optim.SGD(groups, lr=learning_rate, momentum=momentum, weight_decay=weight_decay,
                               fused=fused or None)
    if optimizer == 'adamw':
        return torch.optim.AdamW(groups, lr=learning_rate, betas=adamw_betas, weight_decay=weight_decay,
                                 fused=fused or None)
    if optimizer == 'lars':
        return LARS(groups, lr=learning_rate, momentum=momentum, weight_decay=weight_decay, eta=lars_eta)
    raise ValueError(f'unknown optimizer {optimizer!r} (sgd, adamw, lars)')


def optimizer_for(opt, params, scaled=(), fused=False):
    """``set_optimizer`` with the command line's ``--optimizer``, ``--exclude_bias_norm`` and ``--lars_eta``."""
    return set_optimizer(params, opt.learning_rate, opt.momentum, opt.weight_decay, opt.optimizer,
                         opt.exclude_bias_norm, opt.lars_eta, scaled=scaled, fused=fused)


SUPCONTRAST_WARMUP_FROM = 0.01     # SupContrast's absolute warm-up start


def warmup_start(target, warm_start=None):
    """Where the warm-up starts, never above its ``target``: ``warm_start`` times the target when given, else
    SupContrast's 0.01 capped at a tenth of the target (so SupContrast's settings, whose targets are all >= 0.1,
    keep their exact schedule, and AdamW's 1e-3 warms up from 1e-4 instead of cooling down from 0.01)."""
    if warm_start is not None:
        return warm_start * target
    return min(SUPCONTRAST_WARMUP_FROM, 0.1 * target)


def _schedule_defaults(batch_size, warm, warm_epochs, warm_start, learning_rate, epochs, lr_decay_rate, cosine, given):
    # SupContrast: large batches always warm up; 10 epochs (--warm_epochs; 0 turns it off)
    check(warm_epochs >= 0, f'--warm_epochs must be >= 0 (0: no warm-up), got {warm_epochs}')
    check(not (warm and warm_epochs == 0), '--warm needs --warm_epochs >= 1 (--warm_epochs 0 turns the warm-up off)')
    check(warm_start is None or 0 <= warm_start < 1, f'--warm_start must be in [0, 1), got {warm_start}')
    why = '--warm' if warm else f'--batch_size {batch_size}: above 256 it is on, as in SupContrast'
    shorter = f'give --warm_epochs below {epochs}' if epochs > 1 else ''
    fix = (shorter or 'leave --warm out') if warm else (f'{shorter} (0: no warm-up)' if shorter else
                                                        'give --warm_epochs 0 (no warm-up)')
    warm = (warm or batch_size > 256) and warm_epochs > 0
    check(warm or 'warm_start' not in given, '--warm_start needs a warm-up (--warm, or a batch above 256)')
    # a warm-up as long as the run never hands over to the schedule: the run ends below its learning rate
    check(not warm or warm_epochs < epochs,
          f'the warm-up ({why}) lasts --warm_epochs {warm_epochs}, not shorter than --epochs {epochs}: the run '
          f'would end inside it, below --learning_rate {learning_rate:g}; {fix}')
    target = Schedule(learning_rate, epochs, lr_decay_rate=lr_decay_rate, cosine=cosine,
                      warm_epochs=warm_epochs).warmup_target()
    return {'warm': warm, 'warmup_from': warmup_start(target, warm_start)}


SCHEDULE = Feature(
    'learning-rate schedule', check=_schedule_defaults, resume_may_change=('warmup_from',),
    flags={'--cosine': dict(action='store_true', help='cosine annealing (else step decay at --lr_decay_epochs)'),
           '--warm': dict(action='store_true', help='linear warm-up over --warm_epochs to the schedule\'s learning '
                                                    'rate (always on above batch 256)'),
           '--warm_epochs': dict(type=int, default=10,
                                 help='epochs of the linear warm-up (default 10, SupContrast\'s; 0: none, also above '
                                      'batch 256); shorter than --epochs'),
           '--warm_start': dict(type=float, default=None,
                                help='the warm-up starts at this fraction of its target (default: SupContrast\'s '
                                     '0.01, capped at a tenth of the target)')},
    run_name=lambda cosine, warm, warm_epochs, warm_start: ('_cosine' if cosine else '') + ('_warm' if warm else '')
    + (f'_warm_epochs_{warm_epochs}' if warm_epochs != 10 else '')
    + (f'_warm_start_{warm_start}' if warm_start is not None else ''))


def _check_optimizer(optimizer, exclude_bias_norm, lars_eta, given):
    check(lars_eta > 0, f'--lars_eta must be > 0, got {lars_eta}')
    check(optimizer == 'lars' or 'lars_eta' not in given, f'--lars_eta needs --optimizer lars, got {optimizer}')
    check(optimizer != 'lars' or 'exclude_bias_norm' not in given,
          '--optimizer lars always keeps biases and normalization weights out of its scaling and weight decay: '
          'leave --exclude_bias_norm out')


OPTIMIZER = Feature(
    'optimizer', check=_check_optimizer,
    flags={'--optimizer': dict(choices=['sgd', 'adamw', 'lars'], default='sgd',
                               help='sgd (SupContrast\'s, with --momentum), adamw, or lars (SGD with layer-wise '
                                    'trust ratios, --momentum, --lars_eta)'),
           '--exclude_bias_norm': dict(action='store_true',
                                       help='no weight decay on biases and normalization weights (always so with '
                                            'lars)'),
           '--lars_eta': dict(type=float, default=0.001, help='LARS trust coefficient (default 0.001)')},
    run_name=lambda optimizer, exclude_bias_norm: ('' if optimizer == 'sgd' else f'_{optimizer}')
    + ('_exclude_bias_norm' if exclude_bias_norm else ''))
