"""Gradient caching (``--chunk_size N``; Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup"), the second way a step of ``training/steps.py`` runs with the same loss code: (1) the encoder on
each chunk of N samples (all their views) without a graph, keeping only its outputs; (2) the head, the loss and CARROT
on the whole batch from those outputs (a leaf tensor), back-propagated to it; (3) the encoder on each chunk again,
with a graph, back-propagating the cached gradient of its outputs. The parameter gradients equal those of the plain
step on the same chunks; the memory is that of one chunk's graph. The RNG state is restored per chunk, so the second
forward equals the first; BatchNorm normalizes each chunk by its own statistics in both forwards (as each process of
torchrun does with its part of the batch) and updates its running statistics once per chunk, in the second forward.
"""
import contextlib

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from core.flags import Feature, check
from runtime.distributed import all_reduce_grads, broadcast_buffers


def chunk_bounds(bsz, chunk_size, n_views):
    """``[(start, end), ...]`` of the chunks of ``bsz`` samples: ``[k N, (k+1) N)``, the last possibly smaller. With
    one view a last chunk of one sample is merged into the one before (BatchNorm cannot train on one row)."""
    starts = list(range(0, bsz, chunk_size))
    if n_views == 1 and len(starts) > 1 and bsz - starts[-1] == 1:
        starts.pop()
    return list(zip(starts, starts[1:] + [bsz]))


def chunk_images(runtime, views, chunk_size):
    """The chunks of a batch (:func:`chunk_bounds`): chunk ``k`` holds samples ``[k N, (k+1) N)`` with all their
    views, view-major inside the chunk (as a torchrun process holds its part of the batch)."""
    bsz = views[0].shape[0]
    views = [v.to(runtime.device, non_blocking=True) for v in views]
    return [runtime.to_device(torch.cat([v[start:end] for v in views], dim=0))
            for start, end in chunk_bounds(bsz, chunk_size, len(views))]


def batch_order(parts, n_views):
    """Chunk outputs (each ``[V*n_k, .]``, view-major inside the chunk) -> the batch's view-major rows."""
    per_view = [p.chunk(n_views, dim=0) for p in parts]
    return torch.cat([chunk[v] for v in range(n_views) for chunk in per_view], dim=0)


def chunk_order(rows, sizes, n_views):
    """Inverse of :func:`batch_order`: batch rows -> per-chunk rows (``sizes``: samples per chunk)."""
    per_view = rows.chunk(n_views, dim=0)
    out = []
    start = 0
    for n in sizes:
        out.append(torch.cat([view[start:start + n] for view in per_view], dim=0))
        start += n
    return out


@contextlib.contextmanager
def frozen_bn_statistics(module):
    """BatchNorm layers normalize by batch statistics as usual (train mode) but leave their running
    statistics and counters untouched (momentum 0 for the duration)."""
    saved = []
    for m in module.modules():
        if isinstance(m, _BatchNorm) and m.track_running_stats:
            saved.append((m, m.momentum, m.num_batches_tracked.clone()))
            m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum, count in saved:
            m.momentum = momentum
            m.num_batches_tracked.copy_(count)


def rng_state(device):
    """The RNG states a forward may draw from (CPU, and the CUDA device's)."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == 'cuda' else None)


def restore_rng(device, state):
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def cached_step(runtime, model, head, views, chunk_size, loss_from, backward):
    """Gradient caching (module docstring): ``model.encoder`` per chunk without a graph, ``loss_from(h, head(h))``
    on the whole batch from the cached encoder outputs ``h`` (a leaf), ``backward(loss)`` into ``h`` and
    the head, then the encoder per chunk again with the cached gradient. Under torchrun the model is not
    wrapped in DDP: buffers come from rank 0 before the step (as DDP broadcasts them) and the gradients
    are averaged over processes after it. Returns ``(loss, statistics)``."""
    encoder = model.encoder
    broadcast_buffers(model)                       # no-op in one process
    n_views = len(views)
    chunks = chunk_images(runtime, views, chunk_size)
    sizes = [c.shape[0] // n_views for c in chunks]
    states, outputs = [], []
    with torch.no_grad(), frozen_bn_statistics(encoder):
        for chunk in chunks:
            states.append(rng_state(runtime.device))
            with runtime.autocast():
                outputs.append(encoder(chunk))
    after = rng_state(runtime.device)
    h = batch_order(outputs, n_views).detach().requires_grad_(True)
    del outputs
    with runtime.autocast():
        out = head(h)
    loss, stats = loss_from(h, out)
    backward(loss)
    for chunk, state, grad in zip(chunks, states, chunk_order(h.grad, sizes, n_views)):
        restore_rng(runtime.device, state)
        with runtime.autocast():
            again = encoder(chunk)
        again.backward(grad)
    restore_rng(runtime.device, after)
    all_reduce_grads(model.parameters())           # the mean over processes, as DDP; no-op in one process
    return loss.detach(), stats


CHUNKS = Feature(
    'gradient caching', scripts=('supcon', 'ce'), resume_may_change=('chunk_size',),
    flags={'--chunk_size': dict(type=int, default=0,
                                help='run the encoder on chunks of this many samples (all their views) and get the '
                                     'full-batch gradient with the memory of one chunk (0: off)')},
    check=lambda chunk_size, batch_size: check(
        0 <= chunk_size <= batch_size,
        f'--chunk_size must be in [0, --batch_size {batch_size}] (0: off), got {chunk_size}'))
