"""What one training step computes and back-propagates, for ``main_supcon.py`` (any registered method,
optionally with CARROT) and ``main_ce.py`` (cross-entropy, optionally with CARROT); the training loop
(``engine.train_loop``) zeroes the gradients before and steps the optimizer after.

Each step runs in one of two ways with the same loss code (``supcon_loss_from_parts``, ``ce_loss_from_parts``):

- plain: the model on the whole batch, one backward;
- gradient caching (``--chunk_size N``, Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size
  under Memory Limited Setup"): (1) the encoder on each chunk of N samples (all their views) without a
  graph, keeping only its outputs; (2) the head, the loss and CARROT on the whole batch from those outputs
  (a leaf tensor), back-propagated to it; (3) the encoder on each chunk again, with a graph, back-propagating
  the cached gradient of its outputs. The parameter gradients equal those of the plain step on the same
  chunks; the memory is that of one chunk's graph. The RNG state is restored per chunk, so the second
  forward equals the first; BatchNorm normalizes each chunk by its own statistics in both forwards (as
  each process of torchrun does with its part of the batch) and updates its running statistics once per
  chunk, in the second forward.
"""
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from distributed import all_reduce_grads, all_reduce_sum, broadcast_buffers, gather, gather_with_grad
from losses_carrot import grad_balanced_total_loss
from memory_queue import key_features, sample_keys
from monitors import collapse_statistics
from util import accuracy, autocast, to_device


def carrot_term(opt, carrot, base, h, labels, params=()):
    """``base + alpha * CARROT(h, labels)`` (alpha gradient-balanced unless ``--carrot_weight``) and
    the step's statistics. ``params``: parameters between ``h`` and ``base`` (head, classifier)."""
    # under torchrun: corridor and R on the global batch, alpha from norms over the global batch
    reg = carrot(gather_with_grad(h), gather(labels))
    balance = {}
    total, alpha = grad_balanced_total_loss(base, reg, h, params=params, weight=opt.carrot_weight,
                                            alpha_max=opt.carrot_alpha_max, reduce_sum=all_reduce_sum, stats=balance)
    return total, {**{f'carrot/{k}': v for k, v in carrot.last_stats.items()}, 'carrot/alpha': alpha,
                   'carrot/ratio': balance['ratio'], 'carrot/cap_binds': balance['cap_binds']}


# ---------------------------------------------------------------- the losses, from the model's outputs
def supcon_loss_from_parts(opt, method, model, criterion, carrot, h_enc, h_proj, labels, sample_idx, n_views,
                           queue=None):
    """The loss, statistics and the (global, detached) unit features ``[B, V, D]`` of ``main_supcon.py`` from
    the encoder output ``h_enc`` and the projection ``h_proj`` (``[V*b, .]``, view-major rows ``v*b + j``).
    Under torchrun the loss sees the global batch (samples in rank order). ``queue``: a
    :class:`memory_queue.MemoryQueue` the loss reads (as it was before this step)."""
    bsz = labels.shape[0]
    features = F.normalize(h_proj, dim=1)
    features = torch.stack(torch.split(features, bsz, dim=0), dim=1)  # [bsz, n_views, feat_dim]
    features = gather_with_grad(features)                       # no-op in one process
    args = (features, gather(labels) if method.uses_labels else None)
    if method.uses_ids:
        args += (gather(sample_idx.to(opt.device)),)
    loss = criterion(*args, queue=queue.view()) if queue is not None else criterion(*args)
    stats = {f'{method.stats_prefix}{k}': v for k, v in criterion.last_stats.items()}
    # collapse monitors of the global batch (the projections are gathered already)
    stats.update(collapse_statistics(gather(h_enc.detach()), 'enc'),
                 **collapse_statistics(features.detach().reshape(-1, features.shape[-1]), 'proj'))
    if carrot is not None:
        # rows of h are view-major like the images, so labels are repeated (not interleaved)
        h, params = (h_enc, model.head.parameters()) if opt.carrot_on == 'encoder' else (h_proj, ())
        loss, carrot_stats = carrot_term(opt, carrot, loss, h, labels.repeat(n_views), params)
        stats.update(carrot_stats)
    return loss, stats, features.detach()


def ce_loss_from_parts(opt, model, carrot, h, logits, labels):
    """Cross-entropy (+ CARROT on the penultimate features ``h``) and statistics, this process's batch."""
    loss = F.cross_entropy(logits.float(), labels)   # this process's batch; DDP averages the gradients
    stats = {'acc': accuracy(logits, labels)[0], **collapse_statistics(h, 'enc')}
    if carrot is not None:
        loss, carrot_stats = carrot_term(opt, carrot, loss, h, labels, model.fc.parameters())
        stats.update(carrot_stats)
    return loss, stats


# ---------------------------------------------------------------- the two steps
def contrastive_step(opt, method, ddp_model, model, criterion, carrot, views, labels, sample_idx=None,
                     backward=torch.Tensor.backward, queue=None, key_encoder=None):
    """One ``main_supcon.py`` step on ``views`` (a list of ``[b, C, H, W]``): computes the loss, calls
    ``backward(loss)`` (``GradScaler``'s scaled backward in training) and returns ``(loss, statistics)``.
    ``ddp_model`` is what the plain forward goes through (DDP under torchrun), ``model`` the module.
    With a ``queue`` (``docs/QUEUE.md``) the loss also contrasts with its keys, and after the backward this
    step's keys are enqueued: from ``key_encoder`` (a :class:`memory_queue.MomentumEncoder`, updated first)
    or, without one, the detached queries."""
    labels = labels.to(opt.device)
    n_views = len(views)
    kept = {}
    queue_stats = queue.statistics(gather(labels) if method.uses_labels else None) if queue is not None else {}

    def loss_from(h_enc, h_proj):
        loss, stats, kept['features'] = supcon_loss_from_parts(opt, method, model, criterion, carrot, h_enc, h_proj,
                                                               labels, sample_idx, n_views, queue)
        return loss, stats
    if opt.chunk_size:
        loss, stats = cached_step(opt, model, model.encoder, lambda h: model.head(h), views, opt.chunk_size,
                                  loss_from, backward)
    else:
        images = to_device(opt, torch.cat(views, dim=0))            # view-major rows: v * bsz + b
        with autocast(opt):
            h_enc, h_proj = ddp_model(images, parts=True)
        loss, stats = loss_from(h_enc, h_proj)
        backward(loss)
        loss = loss.detach()
    if queue is not None:
        stats.update(queue_stats, **enqueue_keys(opt, model, key_encoder, queue, views, labels, sample_idx,
                                                 kept['features']))
    return loss, stats


@torch.no_grad()
def enqueue_keys(opt, model, key_encoder, queue, views, labels, sample_idx, features):
    """This step's keys into ``queue``, one per sample of the global batch, with labels and ids: the
    normalized view mean of the key encoder's features (updated from ``model`` first; shuffled BatchNorm),
    or of the detached query ``features`` ``[B, V, D]`` without a key encoder. Returns
    ``queue/key_query_cos`` (with a key encoder)."""
    queries = sample_keys(features)
    stats = {}
    if key_encoder is None:
        keys = queries
    else:
        key_encoder.update(model)
        images = to_device(opt, torch.cat(views, dim=0))

        def forward(key_model, part):
            with autocast(opt):
                return key_model(part).float()
        out = key_features(key_encoder.model, images, opt.shuffle_bn_splits, forward)   # [V*b, D] view-major
        keys = gather(sample_keys(torch.stack(torch.split(out, labels.shape[0], dim=0), dim=1)))
        stats['queue/key_query_cos'] = (keys * queries).sum(1).mean()
    queue.enqueue(keys, gather(labels), gather(sample_idx.to(opt.device)))
    return stats


def ce_step(opt, ddp_model, model, carrot, images, labels, backward=torch.Tensor.backward):
    """One ``main_ce.py`` step: as :func:`contrastive_step`, with one view."""
    labels = labels.to(opt.device)

    def loss_from(h, logits):
        return ce_loss_from_parts(opt, model, carrot, h, logits, labels)
    if opt.chunk_size:
        return cached_step(opt, model, model.encoder, lambda h: model.fc(h), [images], opt.chunk_size,
                           loss_from, backward)
    with autocast(opt):
        h, logits = ddp_model(to_device(opt, images), parts=True)
    loss, stats = loss_from(h, logits)
    backward(loss)
    return loss.detach(), stats


# ---------------------------------------------------------------- gradient caching
def chunk_images(opt, views, chunk_size):
    """The chunks of a batch: chunk ``k`` holds samples ``[k N, (k+1) N)`` with all their views, view-major
    inside the chunk (as a torchrun process holds its part of the batch); the last may be smaller."""
    bsz = views[0].shape[0]
    return [to_device(opt, torch.cat([v[start:start + chunk_size] for v in views], dim=0))
            for start in range(0, bsz, chunk_size)]


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


def cached_step(opt, model, encoder, head, views, chunk_size, loss_from, backward):
    """Gradient caching (module docstring): ``encoder`` per chunk without a graph, ``loss_from(h, head(h))``
    on the whole batch from the cached encoder outputs ``h`` (a leaf), ``backward(loss)`` into ``h`` and
    the head, then the encoder per chunk again with the cached gradient. Under torchrun the model is not
    wrapped in DDP: buffers come from rank 0 before the step (as DDP broadcasts them) and the gradients
    are averaged over processes after it. Returns ``(loss, statistics)``."""
    broadcast_buffers(model)                       # no-op in one process
    n_views = len(views)
    chunks = chunk_images(opt, views, chunk_size)
    sizes = [c.shape[0] // n_views for c in chunks]
    states, outputs = [], []
    with torch.no_grad(), frozen_bn_statistics(encoder):
        for chunk in chunks:
            states.append(rng_state(opt.device))
            with autocast(opt):
                outputs.append(encoder(chunk))
    after = rng_state(opt.device)
    h = batch_order(outputs, n_views).detach().requires_grad_(True)
    del outputs
    with autocast(opt):
        out = head(h)
    loss, stats = loss_from(h, out)
    backward(loss)
    for chunk, state, grad in zip(chunks, states, chunk_order(h.grad, sizes, n_views)):
        restore_rng(opt.device, state)
        with autocast(opt):
            again = encoder(chunk)
        again.backward(grad)
    restore_rng(opt.device, after)
    all_reduce_grads(model)                        # the mean over processes, as DDP; no-op in one process
    return loss.detach(), stats
