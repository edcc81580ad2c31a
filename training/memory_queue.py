"""The label-aware memory queue and the momentum key encoder of ``main_supcon.py --queue_size K``
(definition: ``docs/QUEUE.md``).

:class:`MemoryQueue` is a FIFO of ``K`` sample-level keys with their labels and dataset ids; every piece
of its state (the pointer too) is a persistent buffer, so checkpoints carry it. :class:`MomentumEncoder`
is MoCo's slowly moving copy of the model (He et al. 2020). :func:`key_features` runs it with shuffled
BatchNorm, so that batch statistics cannot leak which key belongs to which query.
"""
import copy
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from core.flags import Feature, check
from losses import QUEUE_CHUNK


class QueueView(NamedTuple):
    """What a loss reads of the queue: ``feat`` ``[K, D]`` unit keys, ``label`` ``[K]``, ``idx`` ``[K]``
    dataset ids, ``valid`` ``[K]`` (written yet?). Entries that are not valid take no part in the loss.
    ``host``: the same ``label``, ``idx`` and ``valid`` on the CPU when the queue keeps them there (for losses
    whose shapes depend on them), else ``None``."""
    feat: torch.Tensor
    label: torch.Tensor
    idx: torch.Tensor
    valid: torch.Tensor
    host: Optional['QueueView'] = None

    def on_host(self):
        """This view with ``label``, ``idx`` and ``valid`` on the CPU (``feat`` as it is): the queue's own host copy
        when it has one, else a copy from the device (which makes the host wait for it)."""
        if self.host is not None:
            return self.host
        return QueueView(self.feat, self.label.cpu(), self.idx.cpu(), self.valid.cpu())


class MemoryQueue(nn.Module):
    """A FIFO of ``size`` keys of dimension ``dim`` (``docs/QUEUE.md``, "State").

    ``enqueue(keys, labels, ids)`` writes ``n <= size`` entries at the pointer, wrapping around, and
    advances it; ``view()`` is what the loss reads; ``statistics(labels)`` the queue's statistics for a
    batch with ``labels``. All state is in buffers (no host sync on the hot path). The labels, ids and
    validity are also kept on the host while they are enqueued from there (a loader's labels and ids), so
    that losses whose shapes depend on them (RASCAL) need not read them from the device.
    """

    def __init__(self, size, dim):
        super().__init__()
        if int(size) < 1 or int(dim) < 1:
            raise ValueError(f'size and dim must be >= 1, got {size} and {dim}')
        self.size = int(size)
        self.register_buffer('feat', torch.zeros(self.size, int(dim)))
        self.register_buffer('label', torch.full((self.size,), -1, dtype=torch.long))
        self.register_buffer('idx', torch.full((self.size,), -1, dtype=torch.long))
        self.register_buffer('valid', torch.zeros(self.size, dtype=torch.bool))
        self.register_buffer('written', torch.zeros(self.size, dtype=torch.long))   # the step of each write
        self.register_buffer('ptr', torch.zeros((), dtype=torch.long))
        self.register_buffer('steps', torch.zeros((), dtype=torch.long))             # enqueues so far
        self._host = None        # (label, idx, valid, pointer) on the CPU, or None: read from the buffers

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._host = None

    def _host_copy(self):
        if self._host is None:
            self._host = (self.label.to('cpu', copy=True), self.idx.to('cpu', copy=True),
                          self.valid.to('cpu', copy=True),
                          int(self.ptr))
        return self._host

    def view(self, host=True):
        """What a loss reads (:class:`QueueView`); ``host=False``: without the host copy (a compiled loss step, whose
        loss has its host plan already, reads the buffers alone: the graph does not depend on whether the copy is
        there)."""
        if not host or self._host is None:
            return QueueView(self.feat, self.label, self.idx, self.valid)
        label, idx, valid, _ = self._host
        return QueueView(self.feat, self.label, self.idx, self.valid, QueueView(self.feat, label, idx, valid))

    @torch.no_grad()
    def enqueue(self, keys, labels, ids):
        """Write ``keys`` ``[n, D]`` (stored L2-normalized, float32), ``labels`` and ``ids`` ``[n]`` at the
        pointer (wrapping around) and advance it by ``n``."""
        n = keys.shape[0]
        if n > self.size:
            raise ValueError(f'{n} keys do not fit a queue of {self.size}')
        if labels.device.type == 'cpu' and ids.device.type == 'cpu':     # keep the host copy current
            label_h, idx_h, valid_h, ptr_h = self._host_copy()
            slots_h = (ptr_h + torch.arange(n)) % self.size
            label_h[slots_h], idx_h[slots_h], valid_h[slots_h] = labels.reshape(-1), ids.reshape(-1), True
            self._host = (label_h, idx_h, valid_h, (ptr_h + n) % self.size)
        else:
            self._host = None
        slots = (self.ptr + torch.arange(n, device=self.ptr.device)) % self.size
        self.feat[slots] = F.normalize(keys.float(), dim=1)
        self.label[slots] = labels.reshape(-1).to(self.label.device, self.label.dtype, non_blocking=True)
        self.idx[slots] = ids.reshape(-1).to(self.idx.device, self.idx.dtype, non_blocking=True)
        self.valid.index_fill_(0, slots, True)           # not `[slots] = True`: a host scalar copied (a wait)
        self.written[slots] = self.steps
        self.ptr.copy_((self.ptr + n) % self.size)
        self.steps += 1

    @torch.no_grad()
    def statistics(self, labels=None):
        """``queue/fill`` (fraction of valid entries), ``queue/key_age`` (mean steps since the valid entries
        were written) and, with ``labels`` ``[B]``, ``queue/pos_per_anchor`` (valid same-label entries per
        anchor; 0 without labels) as 0-d tensors."""
        valid = self.valid.float()
        n_valid = valid.sum().clamp(min=1)
        stats = {'queue/fill': valid.mean(),
                 'queue/key_age': ((self.steps - self.written).float() * valid).sum() / n_valid}
        if labels is None:
            stats['queue/pos_per_anchor'] = valid.new_zeros(())
            return stats
        labels = labels.to(self.label.device, non_blocking=True).reshape(-1, 1)
        count = 0
        for start in range(0, self.size, QUEUE_CHUNK):      # [B, chunk] blocks, not a [B, K] mask
            end = start + QUEUE_CHUNK
            count = count + ((self.label[None, start:end] == labels) & self.valid[None, start:end]).sum(1)
        stats['queue/pos_per_anchor'] = count.float().mean()
        return stats


class MomentumEncoder(nn.Module):
    """A copy of the query model, without gradient, that follows it slowly (MoCo):
    ``theta_k <- m * theta_k + (1 - m) * theta_q`` for every parameter, buffers (BatchNorm running
    statistics) copied from the query model (``docs/QUEUE.md``, "State"). Starts equal to the query model."""

    def __init__(self, model, momentum):
        super().__init__()
        if not 0 <= momentum < 1:
            raise ValueError(f'momentum must be in [0, 1), got {momentum}')
        self.momentum = momentum
        self.model = copy.deepcopy(model)
        for p in self.model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, query):
        """One momentum step towards ``query`` (a few multi-tensor kernels, not one per parameter)."""
        keys = list(self.model.parameters())
        torch._foreach_mul_(keys, self.momentum)
        torch._foreach_add_(keys, [p.detach() for p in query.parameters()], alpha=1 - self.momentum)
        torch._foreach_copy_(list(self.model.buffers()), list(query.buffers()))


@torch.no_grad()
def key_features(model, images, splits, forward):
    """``forward(model, x)`` of ``images`` ``[N, ...]`` with shuffled BatchNorm; returns ``[N, D]`` in the
    order of ``images``: the images are shuffled and encoded in ``splits`` sub-batches, each normalized by its own
    statistics, then unshuffled (what MoCo's authors do on one GPU). Under torchrun every process does this with
    its own images and the caller gathers the keys: no image crosses processes (MoCo's own shuffle gathers every
    process's images to every process, ``W`` times the key encoder's input memory), and the sub-batches' statistics
    still differ from the queries' (docs/QUEUE.md, "Shuffled BatchNorm").
    """
    n = images.shape[0]
    perm = torch.randperm(n, device=images.device)
    out = torch.cat([forward(model, part) for part in images[perm].chunk(max(1, min(splits, n)))])
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n, device=perm.device)
    return out[inverse]


def sample_keys(features):
    """``[B, V, D]`` view features -> ``[B, D]``: the normalized mean of each sample's views (the sample-level
    summary the queue stores, as RASCAL's cache does)."""
    return F.normalize(features.float().mean(1), dim=1)


# ---------------------------------------------------------------- the queue's flags (core/flags.py)
def _check_queue(queue_size, moco_m, shuffle_bn_splits, batch_size, method, method_entry, given):
    check(queue_size >= 0, f'--queue_size must be >= 0 (0: off), got {queue_size}')
    if not queue_size:
        stray = [f for f in ('moco_m', 'shuffle_bn_splits') if f in given]
        check(not stray, f'--{stray[0] if stray else ""} needs --queue_size')
        return
    check(method_entry.takes_queue, f'--queue_size is not defined for --method {method}')
    check(queue_size >= batch_size, f'--queue_size {queue_size} is smaller than the (global) batch '
                                    f'{batch_size}: one step would overwrite its own keys')
    check(0 <= moco_m < 1, f'--moco_m must be in [0, 1), got {moco_m}')
    check('shuffle_bn_splits' not in given or moco_m > 0, '--shuffle_bn_splits needs a key encoder (--moco_m > 0)')
    check(shuffle_bn_splits >= 1, f'--shuffle_bn_splits must be >= 1, got {shuffle_bn_splits}')


QUEUE = Feature(
    'memory queue (docs/QUEUE.md)', scripts=('supcon',), check=_check_queue,
    flags={'--queue_size': dict(type=int, default=0,
                                help='memory queue of this many keys from earlier batches (0: off)'),
           '--moco_m': dict(type=float, default=0.999,
                            help='with --queue_size: momentum of the key encoder; 0: no key encoder, the keys are '
                                 'the detached queries'),
           '--shuffle_bn_splits': dict(type=int, default=8,
                                       help='with a key encoder in one process: BatchNorm over this many shuffled '
                                            'sub-batches of the keys')},
    run_name=lambda queue_size, moco_m: f'_queue_{queue_size}_m_{moco_m}' if queue_size else '')
