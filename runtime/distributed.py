"""Distributed training on torch.distributed (``torchrun``): set-up, the global-batch gathers,
and the few rank-aware helpers the scripts and the engine need.

One process per device. ``torchrun --nproc_per_node=N main_*.py ...`` sets ``WORLD_SIZE``,
``RANK`` and ``LOCAL_RANK``; without them everything here is a no-op and the scripts run in
one process as before. NCCL on CUDA devices, gloo on CPUs.

Gradient bookkeeping. The contrastive losses see the global batch: every rank gathers the
features of all ranks (``gather_with_grad``) and computes the same global loss ``L``. Rank r's
autograd then holds ``dL/dZ`` for every row, but only its own rows ``z_r`` connect to its
parameters. The gather's backward sums ``dL/dZ`` over ranks (identical copies, so ``W * dL/dz_r``)
and DDP averages parameter gradients over ranks (``/ W``), so each parameter receives
``sum_r dL/dz_r * dz_r/dtheta``: the gradient of one process on the concatenated batch.
A rank-local loss (cross-entropy on the local batch) needs no gather: DDP's average of local
means is the global mean for equal local batches.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

from core.flags import UserError


def is_distributed():
    return dist.is_available() and dist.is_initialized()


def world_size():
    return dist.get_world_size() if is_distributed() else 1


def rank():
    return dist.get_rank() if is_distributed() else 0


def is_main():
    """Rank 0 (or the only process): the one that prints, logs and writes checkpoints."""
    return rank() == 0


def init_distributed(opt):
    """Join the process group when started by torchrun; sets ``opt.world_size``, ``opt.rank``,
    ``opt.local_batch_size`` and, on CUDA, this rank's device. ``--batch_size`` is the global batch."""
    n = int(os.environ.get('WORLD_SIZE', '1'))
    opt.world_size, opt.rank, opt.local_batch_size = n, int(os.environ.get('RANK', '0')), opt.batch_size
    if n == 1:
        if opt.syncBN:
            print('note: --syncBN has no effect in one process (BatchNorm already sees the whole batch)')
        return
    if opt.batch_size % n:
        raise UserError(f'--batch_size {opt.batch_size} (the global batch) does not divide over {n} processes; '
                        f'use a multiple of {n}')
    if opt.syncBN and opt.device.type != 'cuda':
        raise UserError('--syncBN needs CUDA devices: PyTorch\'s SyncBatchNorm does not run on CPUs')
    opt.local_batch_size = opt.batch_size // n
    if opt.chunk_size > opt.local_batch_size:
        raise UserError(f'--chunk_size {opt.chunk_size} is larger than the batch of each process '
                        f'({opt.local_batch_size} = --batch_size {opt.batch_size} / {n}); use 0 (off) or a smaller one')
    if opt.device.type == 'cuda':
        local = int(os.environ.get('LOCAL_RANK', '0'))
        if local >= torch.cuda.device_count():
            raise UserError(f'LOCAL_RANK {local} but only {torch.cuda.device_count()} CUDA devices are visible')
        opt.device = torch.device('cuda', local)
        torch.cuda.set_device(opt.device)
    if is_distributed():      # already joined (a second parse in the same process)
        return
    if opt.device.type == 'cuda':
        dist.init_process_group('nccl', device_id=opt.device, timeout=datetime.timedelta(minutes=30))
    else:
        dist.init_process_group('gloo', timeout=datetime.timedelta(minutes=30))
    if not is_main():   # one copy of every message: the other ranks only report errors (stderr)
        sys.stdout = open(os.devnull, 'w')


def wrap_model(model, device, sync_bn=False, chunked=False):
    """DistributedDataParallel around ``model`` (on ``device``; with SyncBatchNorm for ``--syncBN``); ``model``
    itself in one process. Keep the unwrapped module for evaluation and checkpoints. With gradient
    caching (``chunked``: ``--chunk_size``) the step syncs buffers and gradients itself (``broadcast_buffers``,
    ``all_reduce_grads``): no DDP wrapper."""
    if not is_distributed():
        return model
    if sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if chunked:
        return model
    ids = [device.index] if device.type == 'cuda' else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather along dim 0 whose backward sums the incoming gradients over ranks and returns
    this rank's slice (see the module docstring for why the sum is right under DDP)."""

    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        ctx.start, ctx.stop = dist.get_rank() * x.shape[0], (dist.get_rank() + 1) * x.shape[0]
        return torch.cat(parts, 0)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad[ctx.start:ctx.stop]


def gather_with_grad(x):
    """``[n, ...]`` on each rank -> ``[W * n, ...]`` in rank order, differentiable (equal n on every rank)."""
    return _GatherWithGrad.apply(x) if world_size() > 1 else x


@torch.no_grad()
def gather(x):
    """``[n, ...]`` on each rank -> ``[W * n, ...]`` in rank order, without gradient (labels, ids)."""
    if world_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, 0)


@torch.no_grad()
def gather_labels(x, device):
    """Labels or dataset ids ``[n]`` of this process -> those of the global batch ``[W * n]``. In one process
    ``x`` itself, wherever it is: a loader's host tensor stays on the host, where the losses build their
    class structure without waiting for the device. Under torchrun they are gathered on ``device`` (the losses
    then read them back once: one host synchronization per step that one process does not have)."""
    return x if world_size() == 1 else gather(x.to(device, non_blocking=True))


def all_reduce_sum(x):
    """Sum of ``x`` over ranks (a new tensor; ``x`` itself in one process)."""
    if world_size() == 1:
        return x
    x = x.clone()
    dist.all_reduce(x)
    return x


def _flat_groups(tensors):
    """``tensors`` grouped by dtype and device: ``[[tensor, ...], ...]``, in their order (one flat buffer each)."""
    groups = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    return list(groups.values())


@torch.no_grad()
def all_reduce_grads(parameters):
    """Average the gradients of ``parameters`` (an iterable: ``model.parameters()``, a loss's own) over processes
    (what DDP does in its backward), in one all-reduce per dtype of the gradients flattened into one buffer (not one
    call per parameter)."""
    if world_size() == 1:
        return
    for grads in _flat_groups([p.grad for p in parameters if p.grad is not None]):
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat.div_(world_size())
        torch._foreach_copy_(grads, [part.view_as(g) for part, g in zip(flat.split([g.numel() for g in grads]), grads)])


@torch.no_grad()
def broadcast_tensors(tensors, src=0):
    """Rank ``src``'s values of ``tensors`` on every process, in place: one broadcast per dtype of the tensors
    flattened into one buffer (a ResNet-50's 160 BatchNorm buffers are 2 calls, not 160). A no-op in one process."""
    if world_size() == 1:
        return
    for group in _flat_groups([t for t in tensors if t.numel()]):
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        dist.broadcast(flat, src)
        torch._foreach_copy_([t.data for t in group],
                             [part.view_as(t) for part, t in zip(flat.split([t.numel() for t in group]), group)])


def broadcast_buffers(model):
    """Rank 0's buffers (BatchNorm running statistics) on every process (what DDP does before a forward)."""
    broadcast_tensors(list(model.buffers()))


def broadcast_state(*modules):
    """Rank 0's parameters and buffers of every module in ``modules`` on every process: once, after building
    (every process seeds ``--seed + rank``, so each built its own random weights). DDP does this for the model it
    wraps; this is the one place that does it for every mode: the bare model of ``--chunk_size``, a loss's own
    parameters (BCL's, PaCo's classifier) and buffers, before the key encoder copies the model."""
    broadcast_tensors([t for m in modules for t in (*m.parameters(), *m.buffers())])


def all_gather_object(obj):
    """``[obj of rank 0, obj of rank 1, ...]``; ``[obj]`` in one process."""
    if world_size() == 1:
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier():
    if is_distributed():
        if dist.get_backend() == 'nccl':
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()
