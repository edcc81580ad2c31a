"""The loop inside an epoch and the evaluation a trainer runs (docs/DEVELOPING.md, "The call chain"): one epoch of a
step function with the schedule's warm-up, the optimizer step, fp16's skipped steps and the host's one read of each
step's values (:func:`train_loop`); the test-split metrics of a classifier, accumulated on the device
(:func:`evaluate`). Below the trainers (``training/steps.py``, ``evaluation/probes.py``), which own their epochs
(:class:`Trainer`); the run around them is ``engine/run.py``'s."""
import math
import time
from collections import defaultdict
from typing import NamedTuple, Protocol

import torch

from core.flags import UserError
from losses import cross_entropy
from runtime.device import Runtime, keep_compiled_shapes
from runtime.distributed import all_reduce_sum, world_size
from training.schedule import Schedule
from util import AverageMeter, clock, progress


class ScaledBackward:
    """``backward(loss)`` of a training step: the ``GradScaler``-scaled backward (``--amp fp16``; plain otherwise).
    :meth:`scale` is the factor it multiplies by, as a device tensor (``None`` without a scaler), for code that
    takes gradients itself (CARROT's balance): gradients of the scaled loss do not underflow in float16."""

    def __init__(self, scaler):
        self.scaler = scaler

    def __call__(self, loss):
        self.scaler.scale(loss).backward()

    def scale(self, device):
        if not self.scaler.is_enabled():
            return None
        return self.scaler.scale(torch.ones((), device=device))      # the scale itself, read without a sync


MAX_SKIPPED_STEPS = 25    # --amp fp16: this many steps skipped in a row end the run (the scale fell by 2^25)


class Optimization(NamedTuple):
    """What the training loop updates with: the ``optimizer``, the ``scaler`` (``torch.amp.GradScaler``: enabled under
    ``--amp fp16``, a pass-through otherwise) and the learning-rate ``schedule``."""
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    schedule: Schedule


LONG_EPOCH_S = 180      # an epoch projected longer than this says so after PACE_STEPS steps (without a progress bar)
PACE_STEPS = 5


def say_long_epoch(epoch, steps, seconds, total):
    """One line, when ``steps`` steps took ``seconds`` and the epoch's ``total`` steps at that pace take longer than
    :data:`LONG_EPOCH_S`: what an epoch will take (a terminal's progress bar shows it anyway)."""
    projected = seconds / max(steps, 1) * total
    if projected > LONG_EPOCH_S:
        print(f'epoch {epoch}: about {clock(projected)} an epoch at this pace ({steps} steps of {total} in '
              f'{seconds:.1f}s)', flush=True)


def train_loop(loader, optim: Optimization, epoch, step, desc, print_freq=10):
    """One epoch of ``step(batch, backward) -> (loss, batch size, {name: scalar tensor})``, with ``optim``'s
    schedule's warm-up; without a progress bar a line every ``print_freq`` iterations.

    The step back-propagates by calling ``backward(loss)`` (a :class:`ScaledBackward`) itself, once or in parts
    (gradient caching); the loop zeroes the gradients before it and steps the optimizer after it. The host
    reads a step's loss and statistics once, after the next step has been queued (so an accelerator never
    waits for the host between steps); nothing else in a step waits for the device.

    ``--amp fp16``: a step whose gradients are not finite is skipped by the ``GradScaler`` (which lowers its
    scale); such steps are counted (``train/amp/skipped``), left out of the epoch means, and the run stops
    with one line after ``MAX_SKIPPED_STEPS`` in a row. Without fp16 a non-finite loss stops the run at once.
    Returns the epoch means.
    """
    optimizer, scaler, schedule = optim
    meters = defaultdict(AverageMeter)
    if hasattr(loader.sampler, 'set_epoch'):
        loader.sampler.set_epoch(epoch)    # DistributedSampler: a new shuffle every epoch
    bar = progress(loader, f'{desc} epoch {epoch}')
    backward = ScaledBackward(scaler)
    fp16 = scaler.is_enabled()
    state = {'pending': None, 'skipped': 0, 'in_a_row': 0}
    start = time.time()

    def read(pending):
        """The host's one read of a step's values: meters, the skip count, the progress line."""
        idx, n, names, values = pending
        values = values.tolist()
        skipped = values.pop() > 0 if fp16 else False
        if skipped or not math.isfinite(values[0]):
            if not fp16:
                raise UserError(f'the loss became {values[0]} at epoch {epoch}, iteration {idx + 1}; '
                                'lower --learning_rate (or use --amp none)')
            state['skipped'] += 1
            state['in_a_row'] += 1
            if state['in_a_row'] >= MAX_SKIPPED_STEPS:
                raise UserError(f'{MAX_SKIPPED_STEPS} steps in a row had non-finite gradients under --amp fp16 '
                                f'(epoch {epoch}, iteration {idx + 1}; the loss is {values[0]}); use --amp bf16 or '
                                'none, or lower --learning_rate')
            return
        state['in_a_row'] = 0
        for name, value in zip(names, values):
            meters[name].update(value, n)
        if bar.disable and (idx + 1) % print_freq == 0:      # SupContrast's line: batch and data time, then the loss
            bt, dt, loss = times['batch'], times['data'], meters['loss']
            print(f'{desc}: [{epoch}][{idx + 1}/{len(loader)}]\tBT {bt.val:.3f} ({bt.avg:.3f})\t'
                  f'DT {dt.val:.3f} ({dt.avg:.3f})\tloss {loss.val:.4f} ({loss.avg:.4f})', flush=True)
        elif not bar.disable:
            bar.set_postfix(loss=f'{meters["loss"].avg:.4f}', data=f'{times["data"].avg:.3f}s')

    times = {'batch': AverageMeter(), 'data': AverageMeter()}    # host seconds per iteration, and waiting for data
    end = time.time()
    pace_from = None
    for idx, batch in enumerate(bar):
        if idx == 1:
            pace_from = time.time()     # the first step compiles and warms up: the pace counts from the second
        elif idx == 1 + PACE_STEPS and bar.disable:
            say_long_epoch(epoch, idx - 1, time.time() - pace_from, len(loader))
        times['data'].update(time.time() - end)
        schedule.warmup(optimizer, epoch, idx, len(loader))
        optimizer.zero_grad(set_to_none=True)
        loss, n, stats = step(batch, backward)
        if idx == 0:
            keep_compiled_shapes()        # --compile: the first step's graphs; other shapes run eagerly from here
        scale_before = backward.scale(loss.device) if fp16 else None
        scaler.step(optimizer)
        scaler.update()
        names = ['loss'] + list(stats)
        values = [loss.detach().float()] + [torch.as_tensor(v, dtype=torch.float32, device=loss.device).detach()
                                            for v in stats.values()]
        values = all_reduce_sum(torch.stack(values)) / world_size()      # the mean over processes
        if fp16:     # the scaler lowers its scale exactly when it skips the step
            values = torch.cat([values, (backward.scale(loss.device) < scale_before).float()[None]])
        if state['pending'] is not None:
            read(state['pending'])
        state['pending'] = (idx, n, names, values)
        times['batch'].update(time.time() - end)
        end = time.time()
    if state['pending'] is not None:
        read(state['pending'])
    out = {f'train/{k}': m.avg for k, m in meters.items()}
    if fp16:
        out['train/amp/skipped'] = state['skipped']
    out['train/epoch_time'] = time.time() - start
    out['train/data_time'] = times['data'].sum
    return out


SHOT_GROUPS = {'many': (101, None), 'medium': (20, 100), 'few': (0, 19)}   # training samples per class


class CalibrationBins:
    """The expected calibration error (L1) over ``n_bins`` equal-width confidence bins, accumulated on ``device``:
    ``ECE = sum_b |sum_{i in b} 1[correct_i] - sum_{i in b} conf_i| / N`` with ``conf_i`` the top probability and
    bin ``b`` holding ``conf`` in ``[b / n, (b + 1) / n)`` (``bucketize(right=True) - 1``), ``conf = 1`` in a bin of
    its own (index ``n``): torchmetrics' ``MulticlassCalibrationError`` binning, which it equals up to rounding.
    Per-bin sums are one-hot products in float64: deterministic, fixed shapes."""

    def __init__(self, n_bins, device):
        self.edges = torch.linspace(0, 1, n_bins + 1, device=device)
        self.sums = torch.zeros(2, n_bins + 1, dtype=torch.float64, device=device)   # correct, confidence
        self.count = torch.zeros((), dtype=torch.float64, device=device)

    def update(self, probs, labels):
        conf, pred = probs.max(1)
        bins = torch.bucketize(conf, self.edges, right=True) - 1            # conf == 1 gets its own last bin
        members = (bins[:, None] == torch.arange(self.sums.shape[1], device=bins.device)).double()
        self.sums += torch.stack([(pred == labels).double(), conf.double()]) @ members
        self.count += labels.shape[0]

    def compute(self):
        return float((self.sums[0] - self.sums[1]).abs().sum() / self.count.clamp(min=1))


def parts_after(parts, test_every, epoch, epochs):
    """The parts a classifier's run measures after ``epoch`` of ``epochs``: every one of ``parts``, but under
    ``--test_every end`` the test split only after the last epoch (read once: data/labels.py's ``HELD_OUT``)."""
    return [p for p in parts if p != 'test' or test_every == 'epoch' or epoch >= epochs]


def evaluate_parts(runtime: Runtime, loaders, predict, parts, num_classes, class_counts=None):
    """:func:`evaluate` on each of ``parts`` (names of ``loaders``: :func:`parts_after`'s), its metrics under the
    part's name: what a classifier's trainer measures after an epoch (main_ce.py's, main_linear.py's)."""
    out = {}
    for part in parts:
        out.update(evaluate(runtime, loaders[part], predict, part, num_classes, class_counts))
    return out


@torch.no_grad()
def evaluate(runtime: Runtime, loader, predict, prefix, num_classes, class_counts=None):
    """Over ``loader``: the cross-entropy loss (``<prefix>/nll``), top-1 accuracy, the expected calibration error
    (:class:`CalibrationBins`: 15 equal-width confidence bins, as torchmetrics' ``MulticlassCalibrationError``) of
    ``predict(images) -> logits``, and the per-class accuracy (a list under ``<prefix>/per_class_acc``). With
    ``class_counts`` (training samples per class) also many-shot (> 100), medium-shot (20-100) and few-shot (< 20)
    accuracy: over the test samples of the classes in each group (groups without classes are left out).
    Everything accumulates on the device in fixed shapes and is read once, after the last batch."""
    device = runtime.device
    ece = CalibrationBins(15, device)
    classes = torch.arange(num_classes, device=device)
    totals = torch.zeros(2, dtype=torch.float64, device=device)   # summed NLL, correct; read once
    per_class = torch.zeros(2, num_classes, dtype=torch.float64, device=device)   # correct, seen
    for images, labels in progress(loader, f'eval {prefix}'):
        images, labels = runtime.to_device(images), labels.to(device, non_blocking=True)
        with runtime.autocast():
            logits = predict(images)
        logits = logits.float()
        hit = logits.argmax(1) == labels
        totals += torch.stack([cross_entropy(logits, labels, reduction='sum'), hit.sum()]).double()
        members = (labels[:, None] == classes).double()                  # [n, C]: no bincount, no atomics
        per_class += torch.stack([(members * hit[:, None]).sum(0), members.sum(0)])
        ece.update(logits.softmax(1), labels)
    (loss_sum, correct), (hits, seen) = totals.tolist(), per_class.tolist()
    count = sum(seen)
    out = {f'{prefix}/acc': 100.0 * correct / count, f'{prefix}/nll': loss_sum / count, f'{prefix}/ece': ece.compute(),
           f'{prefix}/per_class_acc': [100.0 * h / n if n else float('nan') for h, n in zip(hits, seen)]}
    for group, (lo, hi) in (SHOT_GROUPS.items() if class_counts is not None else ()):
        members = [c for c, n in enumerate(class_counts) if n >= lo and (hi is None or n <= hi)]
        n = sum(seen[c] for c in members)
        if n:
            out[f'{prefix}/{group}_acc'] = 100.0 * sum(hits[c] for c in members) / n
    return out


class Trainer(Protocol):
    """What ``engine.fit`` runs, epoch by epoch: ``steps.Pretraining`` (main_supcon.py), ``steps.CETraining``
    (main_ce.py), ``probes.LinearProbe`` (main_linear.py). Each owns its epoch: it puts its modules in training mode,
    runs :func:`train_loop` over the loader with its own step, and gathers what the epoch reports."""
    model: torch.nn.Module          # what checkpoints hold (the unwrapped module)

    def train_epoch(self, loader, optim: Optimization, epoch: int) -> dict:
        """One epoch's training; its metrics (``train/...``)."""

    def evaluate_epoch(self, epoch: int) -> dict:
        """The metrics of an evaluation after the epoch (``{}`` when there is none this epoch)."""

    def checkpointed(self) -> dict:
        """``{key: object with state_dict / load_state_dict}`` saved next to the model (a loss's buffers, ...)."""

