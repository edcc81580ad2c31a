"""Supervised Contrastive Learning loss (Khosla et al., NeurIPS 2020) and SimCLR's loss family.

Re-implements SupContrast's ``SupConLoss`` with the same semantics, plus two
fixes: it is device-agnostic (no hard-coded ``cuda``) and it is finite for every
input (an anchor with nothing to contrast against contributes 0).

Every loss of this project derives from :class:`Loss`: it returns a scalar and reports its
statistics in ``last_stats`` (and histogram counts in ``last_hists``), never through its return value.
"""
import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

QUEUE_CHUNK = 8192     # queue columns per block of the queue's work: [B, 8192], not [B, K] (1 GB at B 4096, K 65536)


class Loss(nn.Module):
    """Base of the project's losses: one way to report statistics.

    ``last_stats``: ``{name: 0-d tensor}`` of the last call (the training loop reads all of a step's
    statistics back in one host sync); ``last_hists``: ``{name: bucket counts over equal bins of
    [0, 1]}``. Both are empty for losses without statistics.

    A subclass's ``forward(features, labels=None[, ids][, queue=None]) -> 0-d tensor`` takes ``features``
    ``[B, V, D]`` (unit projections, view-major), ``labels`` ``[B]``, dataset ``ids`` ``[B]`` and a
    ``memory_queue.QueueView`` (docs/DEVELOPING.md, "Adding a method"). ``end_epoch()`` runs after each epoch.
    """
    last_stats: dict[str, torch.Tensor]
    last_hists: dict[str, torch.Tensor]

    def __init__(self) -> None:
        super().__init__()
        self.last_stats, self.last_hists = {}, {}

    def host_plan(self, labels, ids, n_views, queue=None, device=None):
        """What ``forward(..., plan=)`` would otherwise build on the host from the values of ``labels``, dataset
        ``ids`` ``[B]`` and the queue's host copy: index tensors whose shapes depend on those values (RASCAL's class
        blocks and id table, the class groups of SINCERE and Spread, KCL's draw), on ``device``; or ``None``:
        nothing (the default). The training step builds it before its compiled loss step, which then has no shape
        that depends on a value (docs/USAGE.md, "torch.compile")."""
        return None

    def end_epoch(self) -> None:
        """Called by the training loop after every training epoch, before the checkpoint is written (TSC
        assigns its targets to classes here); nothing for most losses."""


def flatten_views(features: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """``[B, V, ...]`` -> (``[V*B, D]`` view-major rows, B, V).

    Row ``r = v*B + b`` holds view ``v`` of sample ``b`` (SupContrast's
    ``torch.cat(torch.unbind(features, 1), 0)``). Per-sample tensors must be
    repeated with ``.repeat(V)`` to stay aligned with these rows.
    """
    if features.dim() < 3:
        raise ValueError('`features` needs to be [bsz, n_views, ...], '
                         'at least 3 dimensions are required')
    bsz, n_views = features.shape[0], features.shape[1]
    features = features.reshape(bsz, n_views, -1)
    return features.transpose(0, 1).reshape(n_views * bsz, -1), bsz, n_views


def on_host(x):
    """``x`` on the CPU: ``x`` itself when it is there already (labels and dataset ids as a loader yields them),
    else a copy, which makes the host wait for the device (pass host tensors to avoid it)."""
    return x if x.device.type == 'cpu' else x.cpu()


def class_blocks(labels, device=None):
    """Rows grouped by class, each class padded to the largest: ``(rows, present, counts)``.

    ``rows`` ``[C, K]`` row indices (padding clamped to 0), ``present`` ``[C, K]`` (not padding),
    ``counts`` ``[C]`` class sizes. Same-class (positive) pairs are exactly the pairs inside a
    block, so pair-wise work on positives costs ``sum_c n_c^2`` instead of ``n^2``.

    The shapes depend on the labels' values, so the blocks are built on the host (``labels`` as given when on
    the CPU, else copied there) and ``rows``/``present`` are then copied to ``device`` (default: the labels'),
    without waiting; ``counts`` stays on the host.
    """
    device = labels.device if device is None else device
    labels = on_host(labels)
    order = torch.argsort(labels, stable=True)
    _, class_of, counts = torch.unique(labels[order], return_inverse=True, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(labels.shape[0], device=labels.device) - starts[class_of]
    members = torch.full((counts.shape[0], int(counts.max())), -1, dtype=torch.long, device=labels.device)
    members[class_of, slot] = order
    return members.clamp(min=0).to(device, non_blocking=True), (members >= 0).to(device, non_blocking=True), counts


class ClassGroups:
    """The class blocks of :func:`class_blocks`, in groups of similar size (:func:`class_groups`): ``blocks``, a list
    of ``(rows [c, k], present [c, k])`` on the device, one per group, each padded only to its own largest class;
    :meth:`per_row` gathers values computed per block entry back to the rows; ``counts``: the class sizes (host)."""

    def __init__(self, blocks, position, counts):
        self.blocks, self.position, self.counts = blocks, position, counts

    def __iter__(self):
        """Its device tensors (``runtime.device.dynamic_sizes`` marks their sizes)."""
        for rows, present in self.blocks:
            yield rows
            yield present
        yield self.position

    def per_row(self, values):
        """``[M]``: row ``r``'s entry of ``values`` (one ``[c, k]`` tensor per block, in ``blocks``' order)."""
        return torch.cat([v.reshape(-1) for v in values])[self.position]


def class_groups(labels, device=None):
    """:func:`class_blocks` with the classes grouped by size, so that the padded work stays within ``4 sum_c n_c^2``
    whatever the class sizes (one block padded to the largest class costs ``C max_c n_c^2``: at CIFAR-10-LT's
    imbalance 0.01 and B = 4096, 6.5 times ``sum_c n_c^2``). Classes of ``n`` rows with ``2^(j-1) < n <= 2^j`` form
    group ``j``, padded to its largest; a balanced batch is one group. Built on the host (the labels' values decide
    the shapes), copied to ``device`` without waiting. Returns a :class:`ClassGroups`."""
    device = labels.device if device is None else device
    members, present, counts = class_blocks(labels, 'cpu')
    size_class = torch.ceil(torch.log2(counts.double())).long()                 # j with 2^(j-1) < n <= 2^j
    blocks, position = [], torch.empty(int(counts.sum()), dtype=torch.long)
    start = 0
    for j in torch.unique(size_class).tolist():
        classes = torch.nonzero(size_class == j)[:, 0]
        width = int(counts[classes].max())
        rows, keep = members[classes, :width], present[classes, :width]
        local = torch.arange(classes.shape[0] * width).reshape(-1, width) + start
        position[rows[keep]] = local[keep]
        blocks.append((rows.to(device, non_blocking=True), keep.to(device, non_blocking=True)))
        start += classes.shape[0] * width
    return ClassGroups(blocks, position.to(device, non_blocking=True), counts)


def block_pairs(present):
    """``[C, K, K]`` bool: ``(i, j)`` are two different, non-padding rows of one class block, i.e. a
    positive pair (``present`` from :func:`class_blocks`)."""
    k = present.shape[1]
    not_self = ~torch.eye(k, dtype=torch.bool, device=present.device)
    return present[:, :, None] & present[:, None, :] & not_self


def float32_under_autocast(loss):
    """Run a functional loss with autocast off: computed in float32 (float64 for float64 input) whatever the
    caller's autocast region, as every loss of the project."""
    @functools.wraps(loss)
    def wrapped(features, *args, **kwargs):
        with torch.autocast(device_type=features.device.type, enabled=False):
            return loss(features, *args, **kwargs)
    return wrapped


def upcast(x):
    """float16/bfloat16 -> float32; float32/float64 unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def sample_positives(bsz, device, labels=None, mask=None):
    """Sample-level positive mask ``[B, B]`` from ``labels`` ``[B]`` (bool), a given ``mask`` (returned
    as given), or neither (bool identity: each sample is only its own positive, SimCLR)."""
    if labels is not None and mask is not None:
        raise ValueError('Cannot define both `labels` and `mask`')
    if labels is not None:
        labels = labels.reshape(-1)
        if labels.shape[0] != bsz:
            raise ValueError('Num of labels does not match num of features')
        labels = labels.to(device, non_blocking=True)
        return labels[:, None] == labels[None, :]
    if mask is None:
        return torch.eye(bsz, dtype=torch.bool, device=device)
    if mask.shape != (bsz, bsz):
        raise ValueError(f'`mask` must be [{bsz}, {bsz}], got {list(mask.shape)}')
    return mask.to(device=device)


def pair_masks(features, labels=None, mask=None):
    """Rows and pair masks shared by the pair-wise losses: ``(rows, pos, neg)``.

    ``rows`` ``[M, D]`` (M = V*B, view-major, float32 for half inputs), ``pos[i, j]``: row j is a
    positive of row i and j != i; ``neg[i, j]``: j is neither i nor a positive.
    """
    rows, bsz, n_views = flatten_views(features)
    same = (sample_positives(bsz, features.device, labels, mask) != 0).repeat(n_views, n_views)
    not_self = ~torch.eye(rows.shape[0], dtype=torch.bool, device=features.device)
    return upcast(rows), same & not_self, ~same & not_self


class SupConLoss(Loss):
    """Supervised contrastive loss L_out (Khosla et al. 2020, eq. 2); SimCLR's NT-Xent without labels.

    For anchor rows ``i`` and contrast rows ``a`` (all rows but ``i`` itself)::

        L = -(tau / tau_base) * mean_i  1/|P(i)| * sum_{p in P(i)} log( exp(z_i.z_p/tau)
                                                          / sum_{a != i} exp(z_i.z_a/tau) )

    ``P(i)`` are the rows whose sample is a positive of ``i``'s sample (same label,
    or ``mask[i, j] = 1``, or the other views of the same sample when neither is
    given). An anchor with no positive contributes 0 and still counts in the mean.
    Features are used as given (SupContrast's models L2-normalize them).

    Args:
        temperature: ``tau`` (> 0).
        contrast_mode: ``'all'`` (every view is an anchor) or ``'one'`` (view 0 only).
        base_temperature: ``tau_base`` (> 0).

    Shapes:
        features: ``[B, V, D]`` (extra dims are flattened into D).
        labels: ``[B]`` integer classes, or mask: ``[B, B]`` with ``mask[i, j] = 1``
        when sample ``j`` is a positive of sample ``i``. Not both.
        Output: scalar. Computed in float32 (float64 for float64 input) even under autocast.

    Cost: the positive term needs only per-class (per-sample, for SimCLR) sums of the feature rows,
    ``sum_{p in P(i)} z_i.z_p = z_i.(sum_{p in P(i)} z_p)``, so the only ``M x M`` work is the logits and
    one logsumexp; no ``[M, M]`` masks are built (``python benchmarks/supcon_speed.py``).
    """

    def __init__(self, temperature=0.07, contrast_mode='all', base_temperature=0.07):
        super().__init__()
        if not temperature > 0 or not base_temperature > 0:
            raise ValueError('temperature and base_temperature must be > 0, got '
                             f'{temperature} and {base_temperature}')
        if contrast_mode not in ('all', 'one'):
            raise ValueError(f'Unknown mode: {contrast_mode}')
        self.temperature = temperature
        self.contrast_mode = contrast_mode
        self.base_temperature = base_temperature

    def forward(self, features, labels=None, mask=None, queue=None):
        contrast, bsz, n_views = flatten_views(features)
        if labels is not None and mask is not None:
            raise ValueError('Cannot define both `labels` and `mask`')
        if queue is not None and mask is not None:
            raise ValueError('a queue needs labels (or neither, SimCLR), not a mask')
        if labels is not None:
            labels = labels.to(features.device, non_blocking=True)   # labels may come from the host
        with torch.autocast(device_type=features.device.type, enabled=False):
            contrast = upcast(contrast)
            n_rows = contrast.shape[0]
            anchor = contrast[:bsz] if self.contrast_mode == 'one' else contrast
            if n_rows == 1:                                   # nothing to contrast with: 0
                return (contrast * 0).sum()
            # the only M x M work: the logits and one logsumexp over each row's non-self entries
            logits = anchor @ contrast.T / self.temperature
            logits.diagonal().fill_(-math.inf)               # anchor i is row i: not in its own denominator
            log_denom = torch.logsumexp(logits, dim=1)
            if queue is not None:         # valid queue entries join every denominator, [A, chunk] at a time
                log_denom = torch.logaddexp(log_denom, queue_logsumexp(anchor, queue, self.temperature))
            pos_dot, n_pos = positive_dots(anchor, contrast, bsz, n_views, labels, mask, queue)
            has_pos = n_pos >= 1e-6
            n_pos = torch.where(has_pos, n_pos, torch.ones_like(n_pos))
            mean_log_prob_pos = (pos_dot / self.temperature - n_pos * log_denom) / n_pos
            mean_log_prob_pos = torch.where(has_pos, mean_log_prob_pos, torch.zeros_like(mean_log_prob_pos))
            loss = -(self.temperature / self.base_temperature) * mean_log_prob_pos
        return loss.mean()


class _QueueLogSumExp(torch.autograd.Function):
    """:func:`queue_logsumexp`: forward and backward over ``[M, chunk]`` blocks of the queue, recomputed in the
    backward rather than kept (autograd would keep the ``[M, K]`` logits and make their ``[M, K]`` gradient)."""

    @staticmethod
    def forward(ctx, z, feat, valid, temperature, chunk):
        scaled = z / temperature
        out = torch.full((z.shape[0],), -math.inf, dtype=z.dtype, device=z.device)
        for start in range(0, feat.shape[0], chunk):
            block = (scaled @ feat[start:start + chunk].T).masked_fill_(~valid[None, start:start + chunk], -math.inf)
            out = torch.logaddexp(out, torch.logsumexp(block, dim=1))
        ctx.save_for_backward(z, feat, valid, out)
        ctx.temperature, ctx.chunk = temperature, chunk
        return out

    @staticmethod
    def backward(ctx, grad):
        z, feat, valid, out = ctx.saved_tensors
        scaled = z / ctx.temperature
        finite = torch.where(torch.isfinite(out), out, torch.zeros_like(out))[:, None]     # no key: no gradient
        grad_z = torch.zeros_like(z)
        for start in range(0, feat.shape[0], ctx.chunk):
            keys = feat[start:start + ctx.chunk]
            block = (scaled @ keys.T).masked_fill_(~valid[None, start:start + ctx.chunk], -math.inf)
            grad_z += (block.sub_(finite).exp_() * grad[:, None]) @ keys
        return grad_z / ctx.temperature, None, None, None, None


def queue_logsumexp(z, queue, temperature, chunk=QUEUE_CHUNK):
    """``log sum_{j valid} exp(z_i.q_j / tau)`` per row ``[M]`` (``-inf`` where no key is valid) of ``z`` ``[M, D]``
    against the queue's keys, differentiable in ``z``, with the memory of one ``[M, chunk]`` block whatever the
    queue's size: at B = 4096 (two views) and K = 65536 the ``[M, K]`` logits alone are 2 GB, their gradient
    as much again (``python benchmarks/queue_memory.py``). Blocks in a fixed order: deterministic."""
    return _QueueLogSumExp.apply(z, queue.feat.to(z.dtype), queue.valid, temperature, chunk)


def queue_logits(z, queue, temperature):
    """``[M, K]`` logits ``z_i.q_j / tau`` against the queue's keys (valid or not: callers mask), made as one
    ``[M, K]`` tensor (the scale goes to ``z``, ``[M, D]``, not to a second ``[M, K]``)."""
    return (z / temperature) @ queue.feat.to(z.dtype).T


def positive_dots(anchor, contrast, bsz, n_views, labels=None, mask=None, queue=None):
    """Per anchor row ``i`` (``anchor`` ``[A, D]``, the first ``A`` rows of ``contrast`` ``[V*B, D]``, view-major):
    ``(sum_{p in P(i)} w_ip z_i.z_p [A], sum_{p in P(i)} w_ip [A])`` over its positives ``P(i)`` (same label, a
    ``mask``'s weights, or the other views of its own sample; the anchor never its own positive), plus the valid
    queue entries of its label (``queue``, with ``labels``). Linear in the positives, so it is built from
    per-sample / per-class sums of the rows, ``z_i.(sum_p w_ip z_p)``: no ``[M, M]`` work."""
    sample_sum = contrast.reshape(n_views, bsz, -1).sum(0)                    # [B, D]
    pos_sum, weight_sum, self_weight = positive_sums(sample_sum, labels, mask)
    b = torch.arange(anchor.shape[0], device=contrast.device) % bsz          # each anchor's sample
    pos_dot = (anchor * pos_sum[b]).sum(1) - self_weight[b] * (anchor * anchor).sum(1)
    n_pos = n_views * weight_sum[b] - self_weight[b]            # the anchor is not its own positive
    if queue is not None and labels is not None:     # same-label valid queue entries are positives
        q_sum, q_count = queue_positive_sums(labels, queue, queue.feat.to(contrast.dtype))
        pos_dot = pos_dot + (anchor * q_sum[b]).sum(1)
        n_pos = n_pos + q_count[b]
    return pos_dot, n_pos


def queue_positive_sums(labels, queue, q_feat, chunk=QUEUE_CHUNK):
    """Per sample ``b``: the sum of the valid queue keys with ``b``'s label ``[B, D]`` and their count ``[B]``, as
    products of ``[B, chunk]`` blocks of the label-match matrix with the keys, summed in a fixed order (deterministic,
    fixed shapes: no host sync; the memory of one block, whatever the queue's size)."""
    labels = labels.reshape(-1, 1)
    sums, counts = 0, 0
    for start in range(0, q_feat.shape[0], chunk):
        end = start + chunk
        same = ((labels == queue.label[None, start:end]) & queue.valid[None, start:end]).to(q_feat.dtype)
        sums, counts = sums + same @ q_feat[start:end], counts + same.sum(1)
    return sums, counts


def positive_sums(sample_sum, labels=None, mask=None):
    """Per sample ``b``: ``(sum_j w_bj s_j [B, D], sum_j w_bj [B], w_bb [B])`` with ``s_j`` the sum of sample
    ``j``'s view rows (``sample_sum``) and ``w`` the positive weights of :func:`sample_positives`.

    With ``labels`` the class sums come from one ``[B, B]`` label-match product (``O(B^2 D)``, a quarter of the
    ``V = 2`` logits' cost; deterministic on every device, unlike an atomic ``index_add``, and free of host
    synchronizations, unlike ``unique``); with neither labels nor mask (SimCLR) a sample is its own only
    positive; a ``mask`` is used as given (``[B, B] @ [B, D]``).
    """
    bsz = sample_sum.shape[0]
    if labels is not None:
        labels = labels.reshape(-1)
        if labels.shape[0] != bsz:
            raise ValueError('Num of labels does not match num of features')
        same = (labels[:, None] == labels[None, :]).to(sample_sum.dtype)
        return same @ sample_sum, same.sum(1), sample_sum.new_ones(bsz)
    if mask is None:
        ones = sample_sum.new_ones(bsz)
        return sample_sum, ones, ones
    if mask.shape != (bsz, bsz):
        raise ValueError(f'`mask` must be [{bsz}, {bsz}], got {list(mask.shape)}')
    mask = mask.to(device=sample_sum.device, dtype=sample_sum.dtype)
    return mask @ sample_sum, mask.sum(1), mask.diagonal()


def cross_entropy(logits, labels, reduction='mean'):
    """``-log softmax(logits)[label]`` per row ``[N, C]``, ``[N]``, then mean or sum (``reduction``): the same value
    as ``F.cross_entropy``, written with ``log_softmax`` and ``gather`` because CUDA's ``nll_loss`` has no
    deterministic kernel (``--deterministic`` refuses it). Computed in float32 for half inputs."""
    per_row = -upcast(logits).log_softmax(1).gather(1, labels.reshape(-1, 1)).squeeze(1)
    return per_row.sum() if reduction == 'sum' else per_row.mean()


class LogitAdjustedLoss(Loss):
    """Logit-adjusted cross-entropy (Menon et al., ICLR 2021, "Long-tail learning via logit adjustment") and
    balanced softmax (Ren et al., NeurIPS 2020, "Balanced Meta-Softmax for Long-Tailed Visual Recognition"):
    cross-entropy on the logits shifted by ``tau`` times the log class prior (docs/USAGE.md, "Long tail")::

        L = mean_i -log softmax(f(x_i) + tau * log pi)[y_i]

    ``pi_c``: the share of class ``c`` among the training labels (a class without a training sample counts as
    one, so the shift stays finite). Balanced softmax is ``tau = 1``; ``tau = 0`` is plain cross-entropy. The shift
    is for training only: predictions use the plain logits ``f(x)``.

    Args:
        class_counts: training samples per class ``[C]``.
        tau: ``tau`` (>= 0).

    Shapes: logits ``[N, C]``, labels ``[N]``. Output: scalar, float32 for half inputs.
    """

    def __init__(self, class_counts, tau=1.0):
        super().__init__()
        if not tau >= 0 or not math.isfinite(tau):
            raise ValueError(f'tau must be finite and >= 0, got {tau}')
        counts = torch.as_tensor(class_counts, dtype=torch.float64).clamp(min=1)
        self.tau = tau
        self.register_buffer('offset', (tau * torch.log(counts / counts.sum())).float(), persistent=False)

    def forward(self, logits, labels):
        logits = upcast(logits)
        return cross_entropy(logits + self.offset.to(logits.dtype), labels)


class NTLogisticLoss(Loss):
    """NT-Logistic loss (Chen et al., SimCLR 2020, Table 2), with positives and negatives balanced.

    Each pair is a logistic-regression example with logit ``s_ij / tau`` (``s_ij = z_i . z_j``)::

        L = mean_i [ -1/|P(i)| sum_{p in P(i)} log sigmoid( s_ip / tau)
                     -1/|N(i)| sum_{n in N(i)} log sigmoid(-s_in / tau) ]

    ``P(i)``: the rows of ``i``'s positives (other views of the same sample; with labels or
    a mask, also the same-class samples' views); ``N(i)``: every other row but ``i``. Averaging
    each side separately gives positives and negatives equal total weight: with one positive
    against 2(N-1) negatives the plain sum over all pairs trains badly (background document
    docs/USAGE.md, "The SimCLR loss family"; its corrected loss is exactly this one for V = 2). A side that is empty for
    an anchor (no positive, or no negative) contributes 0.

    Args:
        temperature: ``tau`` (> 0).

    Shapes:
        features: ``[B, V, D]``; labels ``[B]`` or mask ``[B, B]`` (not both), as ``SupConLoss``.
        Output: scalar, computed in float32 (float64 for float64 input) even under autocast.
    """

    def __init__(self, temperature=0.5):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f'temperature must be > 0, got {temperature}')
        self.temperature = temperature

    def forward(self, features, labels=None, mask=None):
        with torch.autocast(device_type=features.device.type, enabled=False):
            rows, pos, neg = pair_masks(features, labels, mask)
            logits = rows @ rows.T / self.temperature
            pos_term = (F.logsigmoid(logits) * pos).sum(1) / pos.sum(1).clamp(min=1)
            neg_term = (F.logsigmoid(-logits) * neg).sum(1) / neg.sum(1).clamp(min=1)
            return -(pos_term + neg_term).mean()


class MarginalTripletLoss(Loss):
    """Marginal triplet loss (Chen et al., SimCLR 2020, Table 2), every positive against every negative.

    With ``s_ij = z_i . z_j`` (no temperature)::

        l(i, p) = 1/|N(i)| sum_{n in N(i)} max(s_in - s_ip + m, 0)
        L       = mean_i 1/|P(i)| sum_{p in P(i)} l(i, p)

    ``P(i)``, ``N(i)`` as in ``NTLogisticLoss``. For V = 2 without labels this is the background
    document's loss (docs/USAGE.md, "The SimCLR loss family"): each anchor's one positive is reused against its 2(N-1)
    negatives. An anchor without a positive or without a negative contributes 0.

    The inner sums are not built as an ``[M, M, M]`` tensor: per anchor the negatives'
    similarities are sorted once, and for each threshold ``t = s_ip - m`` the hinge sum is
    ``sum_{s_in > t} s_in - t * #{s_in > t}``, read from prefix sums (``O(M^2 log M)``).

    Args:
        margin: ``m`` (>= 0).

    Shapes:
        features: ``[B, V, D]``; labels ``[B]`` or mask ``[B, B]`` (not both), as ``SupConLoss``.
        Output: scalar, computed in float32 (float64 for float64 input) even under autocast.
    """

    def __init__(self, margin=1.0):
        super().__init__()
        if not margin >= 0:
            raise ValueError(f'margin must be >= 0, got {margin}')
        self.margin = margin

    def forward(self, features, labels=None, mask=None):
        with torch.autocast(device_type=features.device.type, enabled=False):
            rows, pos, neg = pair_masks(features, labels, mask)
            sims = rows @ rows.T
            # negatives sorted ascending per row; non-negatives become -inf and sort first
            neg_sorted = torch.sort(sims.masked_fill(~neg, -math.inf), dim=1).values
            finite = torch.where(neg_sorted.isfinite(), neg_sorted, torch.zeros_like(neg_sorted))
            prefix = F.pad(torch.cumsum(finite, dim=1), (1, 0))          # prefix[:, k] = sum of first k
            thresh = sims - self.margin                                      # t = s_ip - m, every column
            first_above = torch.searchsorted(neg_sorted.detach().contiguous(), thresh.detach().contiguous(),
                                             right=True)
            n_above = (sims.shape[1] - first_above).to(sims.dtype)
            sum_above = prefix[:, -1:] - torch.gather(prefix, 1, first_above)
            hinge = (sum_above - thresh * n_above) / neg.sum(1, keepdim=True).clamp(min=1)
            per_anchor = (hinge * pos).sum(1) / pos.sum(1).clamp(min=1)
            return per_anchor.mean()
