"""The published SupCon variants that change which positives count or what the denominator holds
(definitions in our words: docs/FIELD.md): KCL, SINCERE, epsilon-SupInfoNCE, supervised DCL and L_spread.

Notation for all five (docs/FIELD.md, "Notation"): rows ``i`` are the ``M = V*B`` unit projections (view-major,
as :func:`losses.flatten_views`), ``s_ij = z_i.z_j / tau``; ``S(i)``: the rows of ``i``'s class other than ``i``
(its SupCon positives), ``O(i)`` the other views of ``i``'s own sample (part of ``S(i)``), ``D(i)`` the rows
of other classes. With a memory queue (``queue=``, docs/QUEUE.md) a valid queue key is one more row with its
label: in ``S(i)`` when the label is ``i``'s, else in ``D(i)``; it is never an anchor.

Cost: each loss computes the ``M x M`` logits once and at most one ``[M, M]`` label mask; sums over positives
that are linear come from per-class sums (:func:`losses.positive_dots`), and the per-pair terms over positives
(SINCERE, epsilon-SupInfoNCE, L_spread's class-conditional term) run inside class blocks grouped by size
(:func:`losses.class_groups`, at most ``4 sum_c n_c^2`` entries), built on the host from the host's labels
(``python benchmarks/field_speed.py``). All are computed in float32 (float64 for float64 input), finite for
every input, deterministic, and free of host synchronizations when the labels are on the host.
"""
import math

import numpy as np
import torch

from losses import (
    Loss,
    block_pairs,
    class_groups,
    flatten_views,
    float32_under_autocast,
    on_host,
    positive_dots,
    queue_logits,
    upcast,
)

NEG_INF = -math.inf


def _check_temperature(temperature):
    if not temperature > 0:
        raise ValueError(f'temperature must be > 0, got {temperature}')


def _rows(features, labels):
    """``(z [M, D] float32+, row labels on the device [M], labels [B] on the device, bsz, n_views)``."""
    z, bsz, n_views = flatten_views(features)
    if labels is None:
        raise ValueError('this loss needs labels')
    labels = labels.reshape(-1)
    if labels.shape[0] != bsz:
        raise ValueError('Num of labels does not match num of features')
    on_device = labels.to(features.device, non_blocking=True)
    return upcast(z), on_device.repeat(n_views), on_device, bsz, n_views


def _row_groups(labels, n_views, device):
    """The class groups (``losses.class_groups``) of the ``V*B`` view-major rows, from the labels on the host: the
    host plan of the losses that sum over class blocks (``losses.Loss.host_plan``)."""
    return class_groups(on_host(labels).reshape(-1).repeat(n_views), device)


def self_masked_logits(z, temperature):
    """``[M, M]`` logits ``z_i.z_j / tau`` with ``-inf`` on the diagonal (a row is never in its own sums)."""
    logits = z @ z.T / temperature
    logits.diagonal().fill_(NEG_INF)
    return logits


def negative_logsumexp(logits, row_labels, queue=None, q_logits=None):
    """``N_i = log sum_{n in D(i)} exp(s_in)`` per row ``[M]`` (``-inf`` where ``i`` has no negative), from the
    logits and the one ``[M, M]`` label mask; valid queue keys of another label join ``D(i)`` (their logsumexp is
    added to the batch's, no ``[M, M + K]`` copy). The logits are consumed (masked in place: read what else you need
    from them first); ``q_logits`` are not."""
    neg = torch.logsumexp(logits.masked_fill_(row_labels[:, None] == row_labels[None, :], NEG_INF), dim=1)
    if queue is not None:
        q_other = (row_labels[:, None] != queue.label[None, :]) & queue.valid[None, :]
        neg = torch.logaddexp(neg, torch.logsumexp(q_logits.masked_fill(~q_other, NEG_INF), dim=1))
    return neg


def _queue_same(row_labels, queue):
    return (row_labels[:, None] == queue.label[None, :]) & queue.valid[None, :]


def _mean_over_anchors(per_row, n_rows):
    return per_row.sum() / n_rows


# ---------------------------------------------------------------- KCL
def kcl_positives(labels, n_views, k, generator):
    """KCL's sampled positives (docs/FIELD.md, "KCL"), built on the host: ``(chosen [M, k'], valid [M, k'])``
    with ``k' = min(k, largest class's rows - V)``; row ``i``'s valid entries are ``min(k, |S(i) \\ O(i)|)`` distinct
    rows of its class outside its own sample, a uniform draw without replacement. Padding entries (``valid``
    false) point at row ``i`` itself.

    The draw costs ``O(M (k + V))`` whatever the class sizes (no ``[C, K, K]`` block): each class's rows are put
    in one random order (one uniform key per row from ``generator``, sorted), and row ``i`` takes the first ``k``
    rows outside its own sample among the ``k + V - 1`` that follow it in its class's order, cyclically. Given
    ``i``'s place, the rows that follow it are in a uniformly random order, so each anchor's draw is a uniform
    ``k``-subset of its candidates (the draws of two anchors of one class are not independent of each other; the
    loss, a sum over anchors, has the same expectation)."""
    labels = on_host(labels).reshape(-1)
    bsz = labels.shape[0]
    n_rows = bsz * n_views
    own = torch.arange(n_rows)[:, None]
    if n_rows == 0:
        return own[:, :0], torch.zeros(0, 0, dtype=torch.bool)
    row_labels = labels.repeat(n_views)
    shuffled = torch.argsort(torch.rand(n_rows, generator=generator))
    order = shuffled[torch.argsort(row_labels[shuffled], stable=True)]           # rows by class, shuffled within
    _, counts = torch.unique_consecutive(row_labels[order], return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    size = counts.repeat_interleave(counts)                                    # per place in `order`: its class
    start = starts.repeat_interleave(counts)
    place = torch.arange(n_rows) - start                                       # the row's place in its class
    take = max(0, min(int(k), int(counts.max()) - n_views))
    if take == 0:
        return own[:, :0], torch.zeros(n_rows, 0, dtype=torch.bool)
    ahead = torch.arange(1, take + n_views)                                    # the k + V - 1 rows that follow
    following = order[start[:, None] + (place[:, None] + ahead) % size[:, None]]    # [M, k + V - 1], by place
    fresh = ahead[None, :] < size[:, None]                                      # not wrapped onto seen rows
    candidate = fresh & (following % bsz != order[:, None] % bsz)               # outside the anchor's sample
    first = torch.argsort((~candidate).to(torch.int8), dim=1, stable=True)[:, :take]   # the first k, in order
    chosen, valid = torch.empty(n_rows, take, dtype=torch.long), torch.empty(n_rows, take, dtype=torch.bool)
    chosen[order], valid[order] = following.gather(1, first), candidate.gather(1, first)
    return torch.where(valid, chosen, own), valid


@float32_under_autocast
def kcl_loss(features, labels, chosen, valid, temperature=0.07):
    """KCL's loss (docs/FIELD.md, "KCL") for given sampled positives: per anchor ``i`` with positives
    ``P(i) = O(i) + K(i)`` (``K(i)``: row ``i``'s ``valid`` entries of ``chosen`` ``[M, k]``)::

        l_i = -1/|P(i)| sum_{p in P(i)} ( s_ip - log sum_{a != i} exp(s_ia) )

    mean over all ``M`` anchors (an anchor without a positive adds 0). ``features`` ``[B, V, D]``, ``labels``
    ``[B]`` (checked only for their count: the classes are in ``chosen``)."""
    _check_temperature(temperature)
    z, _, _, bsz, n_views = _rows(features, labels)
    n_rows = z.shape[0]
    if n_rows == 1:
        return (z * 0).sum()
    logits = self_masked_logits(z, temperature)
    log_denom = torch.logsumexp(logits, dim=1)
    own_dot, n_own = positive_dots(z, z, bsz, n_views)                         # O(i), from sample sums
    chosen, valid = chosen.to(z.device, non_blocking=True), valid.to(z.device, non_blocking=True)
    drawn = torch.where(valid, logits.gather(1, chosen), torch.zeros((), dtype=z.dtype, device=z.device))
    pos_logit = own_dot / temperature + drawn.sum(1)
    n_pos = n_own + valid.sum(1).to(z.dtype)
    has_pos = n_pos > 0
    n_pos = torch.where(has_pos, n_pos, torch.ones_like(n_pos))
    per_row = torch.where(has_pos, log_denom - pos_logit / n_pos, torch.zeros_like(n_pos))
    return _mean_over_anchors(per_row, n_rows)


class KCLLoss(Loss):
    """K-positive contrastive loss (Kang et al., ICLR 2021, "Exploring Balanced Feature Spaces for
    Representation Learning"; docs/FIELD.md, "KCL").

    Each anchor's positives are its own other view(s) and ``k`` rows of its class outside its own sample, drawn
    uniformly without replacement (all of them when fewer); the denominator is SupCon's (every other row). See
    :func:`kcl_loss`. The draw comes from a CPU generator seeded per call from ``(seed, calls so far)``; the
    call count is this module's state (``get_extra_state``), so it travels in checkpoints and a resumed run draws
    what the uninterrupted one drew. Under torchrun every process draws the same positives for the global batch.

    Args:
        k: positives drawn per anchor (>= 0).
        temperature: ``tau`` (> 0).
        seed: seeds the draws.

    Shapes: features ``[B, V, D]`` unit rows, labels ``[B]`` (host tensors avoid a wait). Output: scalar.
    """

    def __init__(self, k=6, temperature=0.07, seed=0):
        super().__init__()
        if int(k) != k or k < 0:
            raise ValueError(f'k must be an integer >= 0, got {k}')
        _check_temperature(temperature)
        self.k, self.temperature, self.seed = int(k), temperature, int(seed)
        self.calls = 0

    def get_extra_state(self):
        return {'calls': self.calls}

    def set_extra_state(self, state):
        self.calls = int(state['calls'])

    def generator(self, call):
        """The CPU generator of call number ``call``: seeded from ``(seed, call)`` by NumPy's SeedSequence."""
        entropy = np.random.SeedSequence([self.seed % 2 ** 64, call]).generate_state(2, np.uint32)
        return torch.Generator().manual_seed((int(entropy[0]) << 31 ^ int(entropy[1])) % 2 ** 63)

    def host_plan(self, labels, ids, n_views, queue=None, device=None):
        """This call's draw (``kcl_positives``; the call count advances): ``(chosen, valid)`` ``[M, k]`` on
        ``device``, drawn on the host from the host's ``labels``."""
        chosen, valid = kcl_positives(labels, n_views, self.k, self.generator(self.calls))
        self.calls += 1
        return chosen.to(device, non_blocking=True), valid.to(device, non_blocking=True)

    def forward(self, features, labels, plan=None):
        """``plan``: the step's draw (:meth:`host_plan`) when made already, else drawn here."""
        if features.dim() < 3:
            flatten_views(features)                                                  # its error message
        chosen, valid = self.host_plan(labels, None, features.shape[1], device=features.device) if plan is None \
            else plan
        return kcl_loss(features, labels, chosen, valid, self.temperature)


# ---------------------------------------------------------------- SINCERE and epsilon-SupInfoNCE
@float32_under_autocast
def sincere_loss(features, labels, temperature=0.07, margin=0.0, queue=None, groups=None):
    """SINCERE (``margin = 0``) and epsilon-SupInfoNCE (``margin = eps``) (docs/FIELD.md). Per anchor ``i``::

        l_i = 1/|S(i)| sum_{p in S(i)} [ log( exp(s_ip - eps) + sum_{n in D(i)} exp(s_in) ) - s_ip ]

    i.e. each positive is contrasted with itself and the anchor's other-class rows only; ``eps`` in logit units (the
    authors' convention: in cosine units it is ``eps * tau``); mean over all ``M``
    anchors (an anchor without a positive adds 0; one without a negative adds ``-eps``, the equation's value,
    with no gradient). The per-pair terms run inside class blocks (``groups``: the rows' ``losses.class_groups``,
    built from the labels on the host when not given); ``N_i`` comes from one masked logsumexp."""
    _check_temperature(temperature)
    z, row_labels, _, _, n_views = _rows(features, labels)
    n_rows = z.shape[0]
    logits = self_masked_logits(z, temperature)
    q_logits = queue_logits(z, queue, temperature) if queue is not None else None
    shift = margin                                          # logit units, as the authors' code
    groups = _row_groups(labels, n_views, z.device) if groups is None else groups
    pairs = block_logits(logits, groups)             # read before negative_logsumexp masks the logits in place
    neg = negative_logsumexp(logits, row_labels, queue, q_logits)               # [M]

    def term(s, n):
        return torch.logaddexp(s - shift, n) - s
    per_row, _ = positive_pair_mean(pairs, groups, neg, term, q_logits,
                                    _queue_same(row_labels, queue) if queue is not None else None)
    return _mean_over_anchors(per_row, n_rows)


def block_logits(logits, groups):
    """``[(pairs [c, k, k], rows [c, k], values [c, k, k])]`` per group of ``groups`` (``losses.class_groups``): the
    logits of the same-class pairs inside each class block, 0 at the other entries (finite everywhere)."""
    zero = torch.zeros((), dtype=logits.dtype, device=logits.device)
    out = []
    for rows, present in groups.blocks:
        pairs = block_pairs(present)                                             # [c, k, k]
        out.append((pairs, rows, torch.where(pairs, logits[rows[:, :, None], rows[:, None, :]], zero)))
    return out


def positive_pair_mean(pairs, groups, neg, term, q_logits=None, q_same=None):
    """Per row ``i`` ``[M]``: ``mean_{p in S(i)} term(s_ip, N_i)`` over its same-class rows (``pairs``:
    :func:`block_logits`) and, with ``q_same`` ``[M, K]``, its same-label valid queue keys (``q_logits``); 0 for a row
    without a positive. Also returns ``has_pos`` ``[M]``. ``term`` is elementwise and must be finite where its
    first argument is 0 (the blocks' padding)."""
    zero = torch.zeros((), dtype=neg.dtype, device=neg.device)
    totals, counts = [], []
    for mask, rows, values in pairs:
        totals.append(torch.where(mask, term(values, neg[rows][:, :, None]), zero).sum(-1))     # [c, k]
        counts.append(mask.sum(-1).to(neg.dtype))
    total, count = groups.per_row(totals), groups.per_row(counts)               # [M]
    if q_same is not None:
        total = total + torch.where(q_same, term(q_logits, neg[:, None]), zero).sum(1)
        count = count + q_same.sum(1).to(neg.dtype)
    has_pos = count > 0
    return torch.where(has_pos, total / torch.where(has_pos, count, torch.ones_like(count)), zero), has_pos


class SINCERELoss(Loss):
    """SINCERE (Feeney & Hughes, "SINCERE: Supervised Information Noise-Contrastive Estimation REvisited";
    docs/FIELD.md, "SINCERE"): SupCon whose denominator, for anchor ``i`` and positive ``p``, holds ``p`` itself
    and the anchor's other-class rows only, so no other same-class row repels the anchor. See
    :func:`sincere_loss` (``margin = 0``).

    Args:
        temperature: ``tau`` (> 0).

    Shapes: features ``[B, V, D]``, labels ``[B]``; ``queue``: a ``memory_queue.QueueView``. Output: scalar.
    """

    def __init__(self, temperature=0.07):
        super().__init__()
        _check_temperature(temperature)
        self.temperature = temperature

    def forward(self, features, labels, queue=None, plan=None):
        """``plan``: the rows' class groups (:meth:`host_plan`), or ``None``: built here."""
        return sincere_loss(features, labels, self.temperature, 0.0, queue, plan)

    def host_plan(self, labels, ids, n_views, queue=None, device=None):
        return _row_groups(labels, n_views, device)


class EpsSupInfoNCELoss(Loss):
    """epsilon-SupInfoNCE (Barbano et al., ICLR 2023, "Unbiased Supervised Contrastive Learning"; docs/FIELD.md,
    "epsilon-SupInfoNCE"): SINCERE's form with a margin ``eps`` taken from the positive's logit in the
    denominator, which asks every negative to stay ``eps`` logits (``eps * tau`` in cosine similarity) below each
    positive. See :func:`sincere_loss`.

    Args:
        margin: ``eps`` (>= 0, logit units, as the authors' code; ``eps * tau`` in cosine similarity).
        temperature: ``tau`` (> 0).

    Shapes: as :class:`SINCERELoss`.
    """

    def __init__(self, margin=0.1, temperature=0.07):
        super().__init__()
        _check_temperature(temperature)
        if not margin >= 0 or not math.isfinite(margin):
            raise ValueError(f'margin must be finite and >= 0, got {margin}')
        self.margin, self.temperature = margin, temperature

    def forward(self, features, labels, queue=None, plan=None):
        """``plan``: the rows' class groups (:meth:`host_plan`), or ``None``: built here."""
        return sincere_loss(features, labels, self.temperature, self.margin, queue, plan)

    def host_plan(self, labels, ids, n_views, queue=None, device=None):
        return _row_groups(labels, n_views, device)


# ---------------------------------------------------------------- supervised DCL
@float32_under_autocast
def supdcl_loss(features, labels, temperature=0.07, queue=None):
    """Supervised decoupled contrastive loss (docs/FIELD.md, "Supervised DCL"). Per anchor ``i``::

        l_i = -1/|S(i)| sum_{p in S(i)} ( s_ip - log sum_{n in D(i)} exp(s_in) )
            = N_i - mean_{p in S(i)} s_ip

    mean over all ``M`` anchors; an anchor without a positive or without a negative adds 0. Linear in the
    positives: per-class sums, one masked logsumexp."""
    _check_temperature(temperature)
    z, row_labels, on_device, bsz, n_views = _rows(features, labels)
    n_rows = z.shape[0]
    logits = self_masked_logits(z, temperature)
    q_logits = queue_logits(z, queue, temperature) if queue is not None else None
    neg = negative_logsumexp(logits, row_labels, queue, q_logits)
    pos_dot, n_pos = positive_dots(z, z, bsz, n_views, on_device, None, queue)
    ok = (n_pos > 0) & torch.isfinite(neg)
    n_pos = torch.where(ok, n_pos, torch.ones_like(n_pos))
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    per_row = torch.where(ok, torch.where(ok, neg, zero) - pos_dot / temperature / n_pos, zero)
    return _mean_over_anchors(per_row, n_rows)


class SupDCLLoss(Loss):
    """Supervised decoupled contrastive learning (Yeh et al., ECCV 2022, "Decoupled Contrastive Learning", in its
    supervised form; docs/FIELD.md, "Supervised DCL"): SupCon with the positives taken out of the denominator,
    which holds the anchor's other-class rows only. See :func:`supdcl_loss`.

    Args:
        temperature: ``tau`` (> 0).

    Shapes: as :class:`SINCERELoss`.
    """

    def __init__(self, temperature=0.07):
        super().__init__()
        _check_temperature(temperature)
        self.temperature = temperature

    def forward(self, features, labels, queue=None):
        return supdcl_loss(features, labels, self.temperature, queue)


# ---------------------------------------------------------------- L_spread
@float32_under_autocast
def spread_loss(features, labels, temperature=0.07, alpha=0.5, queue=None, groups=None):
    """L_spread (docs/FIELD.md, "L_spread"): ``(1 - alpha) L_SupCon + alpha L_cNCE``, both means over all ``M``
    anchors, with::

        L_SupCon:  l_i = -1/|S(i)| sum_{p in S(i)} ( s_ip - log sum_{a != i} exp(s_ia) )
        L_cNCE:    l_i = -1/|O(i)| sum_{p in O(i)} ( s_ip - log sum_{a in S(i)} exp(s_ia) )

    (no temperature factor in front). The class-conditional term's positives are the anchor's own other views and
    its denominator the anchor's own class only; an anchor without positives adds 0 to a term. One ``M x M``
    logits matrix serves both terms; the class-conditional denominator runs inside class blocks."""
    _check_temperature(temperature)
    z, row_labels, on_device, bsz, n_views = _rows(features, labels)
    n_rows = z.shape[0]
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    if n_rows == 1 and queue is None:                          # nothing to contrast with
        return (z * 0).sum()
    logits = self_masked_logits(z, temperature)
    q_logits = None
    log_denom = torch.logsumexp(logits, dim=1)
    if queue is not None:                                      # no [M, M + K] copy: the two logsumexps added
        q_logits = queue_logits(z, queue, temperature)
        log_denom = torch.logaddexp(log_denom, torch.logsumexp(q_logits.masked_fill(~queue.valid[None, :], NEG_INF),
                                                               dim=1))
    # SupCon
    pos_dot, n_pos = positive_dots(z, z, bsz, n_views, on_device, None, queue)
    has_pos = n_pos > 0
    supcon = torch.where(has_pos, log_denom - pos_dot / temperature / torch.where(has_pos, n_pos, 1.0), zero)
    # class-conditional InfoNCE: O(i) over S(i)
    own_dot, n_own = positive_dots(z, z, bsz, n_views)
    groups = _row_groups(labels, n_views, z.device) if groups is None else groups
    same_lse = groups.per_row([torch.logsumexp(logits[rows[:, :, None], rows[:, None, :]]
                                               .masked_fill(~block_pairs(present), NEG_INF), dim=-1)
                               for rows, present in groups.blocks])             # [M]
    if queue is not None:
        q_lse = torch.logsumexp(q_logits.masked_fill(~_queue_same(row_labels, queue), NEG_INF), dim=1)
        same_lse = torch.logaddexp(same_lse, q_lse)
    has_own = n_own > 0
    cnce = torch.where(has_own, same_lse - own_dot / temperature / torch.where(has_own, n_own, 1.0), zero)
    return ((1 - alpha) * supcon.sum() + alpha * cnce.sum()) / n_rows


class SpreadLoss(Loss):
    """L_spread (Chen et al., ICML 2022, "Perfectly Balanced: Improving Transfer and Robustness of Supervised
    Contrastive Learning"; docs/FIELD.md, "L_spread"): SupCon plus a class-conditional InfoNCE whose positive is
    the anchor's own other view and whose negatives are the other rows of its own class, which keeps a class
    from collapsing to a point. See :func:`spread_loss`.

    Args:
        alpha: weight of the class-conditional term, in ``[0, 1]``.
        temperature: ``tau`` (> 0).

    Shapes: as :class:`SINCERELoss`.
    """

    def __init__(self, alpha=0.5, temperature=0.07):
        super().__init__()
        _check_temperature(temperature)
        if not 0 <= alpha <= 1:
            raise ValueError(f'alpha must be in [0, 1], got {alpha}')
        self.alpha, self.temperature = alpha, temperature

    def forward(self, features, labels, queue=None, plan=None):
        """``plan``: the rows' class groups (:meth:`host_plan`), or ``None``: built here."""
        return spread_loss(features, labels, self.temperature, self.alpha, queue, plan)

    def host_plan(self, labels, ids, n_views, queue=None, device=None):
        return _row_groups(labels, n_views, device)
