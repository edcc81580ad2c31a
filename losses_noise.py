"""Losses built for noisy labels (definitions in our words: docs/FIELD.md, "Built for noisy labels").

For ``main_supcon.py``: :class:`SymNCELoss` (SupCon plus a reverse term), :class:`RINCELoss` (robust InfoNCE in its
supervised form) and :class:`SelCLLoss` (Sel-CL: confident examples and pairs selected by a kNN vote).
For ``main_ce.py --loss``: :class:`GCELoss` (generalized cross-entropy) and :class:`SCELoss` (symmetric
cross-entropy). Notation as docs/FIELD.md, "Notation": ``s_ij = z_i.z_j / tau``, ``S(i)`` the same-class rows
other than ``i``, ``D(i)`` the rows of other classes, ``N_i = log sum_{n in D(i)} exp(s_in)``.
All are computed in float32 (float64 for float64 input), finite for every input and deterministic; the step of each
reads nothing back from the device (Sel-CL's selection runs once an epoch, after it).
"""
import math

import torch

from losses import (
    Loss,
    flatten_views,
    float32_under_autocast,
    positive_dots,
    queue_logits,
    upcast,
)
from losses_field import (
    _check_temperature,
    _queue_same,
    _row_groups,
    _rows,
    block_logits,
    negative_logsumexp,
    positive_pair_mean,
    self_masked_logits,
)


# ---------------------------------------------------------------- SymNCE
@float32_under_autocast
def symnce_terms(features, labels, temperature=0.07, queue=None):
    """SymNCE's two terms (docs/FIELD.md, "SymNCE") from one ``[M, M]`` logits matrix: ``(L_out, R)``, SupCon's loss
    with ``tau_base = tau`` (an anchor without a positive adds 0; a lone row, 0) and the reverse term, with
    ``e_ij = exp((z_i.z_j - 1) / tau)`` in ``(0, 1]``::

        R_i = - mean_{p in S(i)} e_ip + mean_{n in D(i)} e_in

    each the mean over all ``M`` anchors; a mean over an empty set is 0. Valid queue keys join ``S(i)`` or ``D(i)``
    by their label, and every denominator. One ``[M, M]`` label mask; the positives' logits from per-class sums."""
    _check_temperature(temperature)
    z, row_labels, on_device, bsz, n_views = _rows(features, labels)
    n_rows = z.shape[0]
    logits = self_masked_logits(z, temperature)                                   # -inf on the diagonal
    log_denom = torch.logsumexp(logits, dim=1)
    e = torch.exp(logits - 1 / temperature)                                       # 0 on the diagonal
    same = row_labels[:, None] == row_labels[None, :]
    pos, n_same = (e * same).sum(1), same.sum(1).to(z.dtype) - 1                 # the diagonal is no positive
    neg, n_neg = (e * ~same).sum(1), (~same).sum(1).to(z.dtype)
    if queue is not None:
        q_logits = queue_logits(z, queue, temperature)
        q_e = torch.exp(q_logits - 1 / temperature)
        q_same = _queue_same(row_labels, queue)
        q_other = ~q_same & queue.valid[None, :]
        log_denom = torch.logaddexp(log_denom, torch.logsumexp(q_logits.masked_fill(~queue.valid[None, :], -math.inf),
                                                               dim=1))
        pos, n_same = pos + (q_e * q_same).sum(1), n_same + q_same.sum(1).to(z.dtype)
        neg, n_neg = neg + (q_e * q_other).sum(1), n_neg + q_other.sum(1).to(z.dtype)
    reverse = (neg / n_neg.clamp(min=1) - pos / n_same.clamp(min=1)).sum() / n_rows
    if n_rows == 1:                                   # as SupConLoss: nothing of the batch to contrast with
        return (z * 0).sum(), reverse
    pos_dot, n_pos = positive_dots(z, z, bsz, n_views, on_device, None, queue)
    has_pos = n_pos > 0
    per_row = torch.where(has_pos, log_denom - pos_dot / temperature / n_pos.clamp(min=1), torch.zeros_like(n_pos))
    return per_row.sum() / n_rows, reverse


class SymNCELoss(Loss):
    """Symmetric InfoNCE (Cui et al. 2025, "An Inclusive Theoretical Framework of Robust Supervised Contrastive Loss
    against Label Noise"; docs/FIELD.md, "SymNCE"): SupCon's ``L_out`` plus ``beta`` times a reverse term
    (:func:`symnce_terms`), whose sum over the ways of labelling a pair positive or negative is constant, the
    condition under which a pairwise loss is robust to symmetric label noise::

        L = L_out + beta * mean_i R_i

    Args:
        beta: weight of the reverse term (>= 0; 0 is SupCon).
        temperature: ``tau`` (> 0), of both terms (``L_out`` with ``tau_base = tau``).

    Shapes: features ``[B, V, D]`` unit rows, labels ``[B]``; ``queue``: a ``memory_queue.QueueView``. Output: scalar.
    """

    def __init__(self, beta=1.0, temperature=0.07):
        super().__init__()
        _check_temperature(temperature)
        if not beta >= 0 or not math.isfinite(beta):
            raise ValueError(f'beta must be finite and >= 0, got {beta}')
        self.beta, self.temperature = beta, temperature

    def forward(self, features, labels, queue=None):
        if features.dim() < 3:
            raise ValueError('`features` needs to be [bsz, n_views, ...]')
        infonce, reverse = symnce_terms(features, labels, self.temperature, queue)
        self.last_stats = {'infonce': infonce.detach(), 'reverse': reverse.detach()}
        return infonce + self.beta * reverse


# ---------------------------------------------------------------- RINCE, supervised
@float32_under_autocast
def rince_loss(features, labels, temperature=0.07, q=0.5, lam=0.01, queue=None, groups=None):
    """Supervised RINCE (docs/FIELD.md, "RINCE"). Per anchor ``i`` and positive ``p in S(i)``::

        r_ip = -exp(q s_ip) / q + (lam (exp(s_ip) + sum_{n in D(i)} exp(s_in)))^q / q

    averaged over ``S(i)``, then over all ``M`` anchors (an anchor without a positive adds 0). The second power is
    taken in log space, ``exp(q (log lam + logaddexp(s_ip, N_i)))``. As ``q -> 0``, ``r_ip`` tends to SINCERE's
    ``log(exp(s_ip) + sum_n exp(s_in)) - s_ip + log lam``. The per-pair terms run inside class blocks (``groups``)."""
    _check_temperature(temperature)
    z, row_labels, _, _, n_views = _rows(features, labels)
    n_rows = z.shape[0]
    logits = self_masked_logits(z, temperature)
    q_logits = queue_logits(z, queue, temperature) if queue is not None else None
    groups = _row_groups(labels, n_views, z.device) if groups is None else groups
    pairs = block_logits(logits, groups)                     # before negative_logsumexp masks the logits
    neg = negative_logsumexp(logits, row_labels, queue, q_logits)
    log_lam = math.log(lam)

    def term(s, n):
        return (torch.exp(q * (log_lam + torch.logaddexp(s, n))) - torch.exp(q * s)) / q
    per_row, _ = positive_pair_mean(pairs, groups, neg, term, q_logits,
                                    _queue_same(row_labels, queue) if queue is not None else None)
    return per_row.sum() / n_rows


class RINCELoss(Loss):
    """Robust InfoNCE (Chuang et al., CVPR 2022, "Robust Contrastive Learning against Noisy Views"; docs/FIELD.md,
    "RINCE") in its supervised form: every same-class row is a positive, contrasted with itself and the anchor's
    other-class rows (:func:`rince_loss`). ``q`` trades InfoNCE's hardness (``q -> 0``) for robustness (``q = 1``:
    a loss whose gradient does not grow on a pair it cannot align).

    Args:
        q: in ``(0, 1]``.
        lam: ``lambda`` in ``(0, 1]``, the weight of the density term.
        temperature: ``tau`` (> 0).

    Shapes: as :class:`SymNCELoss`.
    """

    def __init__(self, q=0.5, lam=0.01, temperature=0.07):
        super().__init__()
        _check_temperature(temperature)
        if not 0 < q <= 1:
            raise ValueError(f'q must be in (0, 1], got {q}')
        if not 0 < lam <= 1:
            raise ValueError(f'lam must be in (0, 1], got {lam}')
        self.q, self.lam, self.temperature = q, lam, temperature

    def forward(self, features, labels, queue=None, plan=None):
        """``plan``: the rows' class groups (:meth:`host_plan`), or ``None``: built here."""
        if features.dim() < 3:
            raise ValueError('`features` needs to be [bsz, n_views, ...]')
        return rince_loss(features, labels, self.temperature, self.q, self.lam, queue, plan)

    def host_plan(self, labels, ids, n_views, queue=None, device=None):
        return _row_groups(labels, n_views, device)


# ---------------------------------------------------------------- Sel-CL
SIM_TOLERANCE = 1e-6     # a cosine similarity and the threshold compared within float32 rounding
def _vote(neighbour_labels, n_classes):
    """``[n, C]`` shares of each class among each row's neighbours' labels ``[n, k]`` (every vote weighs 1)."""
    votes = torch.zeros(neighbour_labels.shape[0], n_classes, dtype=torch.float64, device=neighbour_labels.device)
    votes.scatter_add_(1, neighbour_labels, torch.ones_like(neighbour_labels, dtype=torch.float64))
    return votes / votes.sum(1, keepdim=True)


def _neighbours(feat, k, chunk=1024):
    """``[N, k]`` the indices of each row's ``k`` most similar other rows (cosine of the unit rows ``feat``; ties
    by the smaller index)."""
    n = feat.shape[0]
    out = []
    for start in range(0, n, chunk):
        sim = feat[start:start + chunk] @ feat.T
        rows = torch.arange(start, min(start + chunk, n), device=feat.device)
        sim[torch.arange(len(rows)), rows] = -math.inf                            # never one's own neighbour
        out.append(torch.sort(sim, dim=1, descending=True, stable=True).indices[:, :k])
    return torch.cat(out)


def _quantile(values, level):
    """The ``level`` quantile of a 1-D tensor with linear interpolation (NumPy's default), of any size."""
    v = torch.sort(values.double()).values
    pos = level * (v.numel() - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, v.numel() - 1)
    return float(v[lo] + (pos - lo) * (v[hi] - v[lo]))


@torch.no_grad()
def selcl_selection(feat, labels, k=250, alpha=0.5, beta=0.25, n_classes=None):
    """Sel-CL's selection (docs/FIELD.md, "Sel-CL"): ``(selected [N] bool, threshold float)``.

    ``feat`` ``[N, D]`` unit features, ``labels`` ``[N]`` the (noisy) training labels. A vote over the ``k``
    nearest neighbours' labels corrects each label to the vote's winner (ties: the smaller class); a second vote,
    over the neighbours' corrected labels, gives each example the share ``p_i`` of its own label and agrees when
    its label wins. Each class keeps its ``min(n_c, m)`` examples of the smallest ``-log clip(p_i, 0.01, 0.99)``
    (ties: the smaller index), ``m`` the ``alpha`` quantile over classes of the agreeing examples per class (the
    lower median at 0.5). The threshold is the ``beta`` quantile of the cosine similarities of the same-label
    pairs of selected examples (each with itself included)."""
    feat, labels = upcast(feat), labels.long()
    n = feat.shape[0]
    n_classes = int(labels.max()) + 1 if n_classes is None else int(n_classes)
    near = _neighbours(feat, min(int(k), n - 1))
    corrected = _vote(labels[near], n_classes).argmax(1)                       # argmax: the first of the ties
    share = _vote(corrected[near], n_classes)
    agrees = share.argmax(1) == labels
    discrepancy = -torch.log(share.gather(1, labels[:, None])[:, 0].clamp(0.01, 0.99))
    per_class = torch.stack([agrees[labels == c].sum() for c in range(n_classes)]).double()
    if alpha == 0.5:
        m = float(per_class.sort().values[(n_classes - 1) // 2])              # torch.median: the lower middle
    else:
        m = _quantile(per_class, alpha)
    selected = torch.zeros(n, dtype=torch.bool, device=feat.device)
    for c in range(n_classes):
        members = torch.nonzero(labels == c)[:, 0]
        take = int(min(m, members.numel()))
        order = torch.sort(discrepancy[members], stable=True).indices[:take]
        selected[members[order]] = True
    sims = []
    for c in range(n_classes):
        chosen = feat[selected & (labels == c)]
        sims.append((chosen @ chosen.T).reshape(-1))
    sims = torch.cat(sims)
    return selected, (_quantile(sims, beta) if sims.numel() else math.inf)


class SelCLLoss(Loss):
    """Selective-supervised contrastive learning (Li et al., CVPR 2022, "Selective-Supervised Contrastive Learning
    with Noisy Labels"; docs/FIELD.md, "Sel-CL"), its pretraining stage (not Sel-CL+'s fine-tuning).

    After each epoch (:meth:`end_epoch`) :func:`selcl_selection` runs on the features the epoch left in a bank (one
    unit feature per dataset id, the mean of its views, written by every step) and keeps, with a snapshot of the
    bank, the selected examples and the threshold. Sample ``a``'s confident partners are the samples ``b != a`` of its
    label with ``snap_a.snap_b >= threshold``, or with both selected. In a batch, a sample with a partner (in the
    batch or among the valid queue keys, by their dataset ids) takes SupCon's ``L_out`` over its own other views and
    its partners' rows; a sample without one takes the instance term (its own other views only: SimCLR's). Both share
    SupCon's denominator (every other row, and the queue's keys)::

        L = 1/B sum_b [ has_b mean_v l^sup_(v,b) + (1 - has_b) mean_v l^inst_(v,b) ]

    During the first ``warmup`` epochs (at least one: a selection needs an epoch's features) no pair is selected:
    every sample takes the instance term.

    Args:
        num_samples: the training set's size ``N``; ``dim``: the features' dimension; ``n_classes``: ``C``.
        k, alpha, beta: the selection's (the authors' ``k_val``, ``alpha``, ``beta``).
        warmup: epochs of the instance term alone (>= 1).
        temperature: ``tau`` (> 0).

    Shapes: features ``[B, V, D]`` unit rows, labels ``[B]``, ids ``[B]`` distinct dataset indices in ``[0, N)``;
    ``queue``: a ``memory_queue.QueueView`` (its ``idx``: dataset indices). Output: scalar.
    """

    def __init__(self, num_samples, dim, n_classes, k=250, alpha=0.5, beta=0.25, warmup=1, temperature=0.1):
        super().__init__()
        _check_temperature(temperature)
        if int(k) != k or k < 1:
            raise ValueError(f'k must be an integer >= 1, got {k}')
        if not (0 <= alpha <= 1 and 0 <= beta <= 1):
            raise ValueError(f'alpha and beta must be in [0, 1], got {alpha} and {beta}')
        if int(warmup) != warmup or warmup < 1:
            raise ValueError(f'warmup must be an integer >= 1, got {warmup}')
        self.k, self.alpha, self.beta, self.warmup = int(k), alpha, beta, int(warmup)
        self.n_classes, self.temperature = int(n_classes), temperature
        self.epochs = 0                                   # epochs finished: extra state (host), no device read
        n, d = int(num_samples), int(dim)
        self.register_buffer('bank', torch.zeros(n, d))
        self.register_buffer('bank_label', torch.full((n,), -1, dtype=torch.long))
        self.register_buffer('snapshot', torch.zeros(n, d))
        self.register_buffer('selected', torch.zeros(n, dtype=torch.bool))
        self.register_buffer('threshold', torch.full((), math.inf))

    def get_extra_state(self):
        return {'epochs': self.epochs}

    def set_extra_state(self, state):
        self.epochs = int(state['epochs'])

    @property
    def selecting(self):
        """Whether the step uses a selection (the warm-up is over)."""
        return self.epochs >= self.warmup

    def end_epoch(self):
        self.epochs += 1
        if self.epochs < self.warmup:
            return
        seen = self.bank_label >= 0
        ids = torch.nonzero(seen)[:, 0]
        selected, threshold = selcl_selection(self.bank[ids], self.bank_label[ids], self.k, self.alpha, self.beta,
                                              self.n_classes)
        self.selected.zero_()
        self.selected[ids] = selected
        self.snapshot.copy_(self.bank)
        self.threshold.fill_(threshold)

    def partners(self, labels, ids, q_label=None, q_idx=None):
        """``[B, B']`` confident partners of the batch's samples among ``ids`` ``[B']`` (labels ``[B']``)."""
        a = self.selected[ids]
        same = labels[:, None] == (labels if q_label is None else q_label)[None, :]
        other = ids if q_idx is None else q_idx.clamp(min=0)
        both = a[:, None] & self.selected[other][None, :]
        # within float32 rounding: the pair that sets the threshold passes it, whatever the product's summation order
        close = self.snapshot[ids] @ self.snapshot[other].T >= self.threshold - SIM_TOLERANCE
        return same & (both | close)

    def forward(self, features, labels, ids, queue=None):
        if features.dim() < 3:
            raise ValueError('`features` needs to be [bsz, n_views, ...]')
        z, bsz, n_views = flatten_views(features)
        z = upcast(z)
        device = z.device
        labels = labels.reshape(-1).to(device, non_blocking=True)
        ids = ids.reshape(-1).to(device, non_blocking=True)
        if labels.shape[0] != bsz or ids.shape[0] != bsz:
            raise ValueError('Num of labels (and ids) does not match num of features')
        with torch.no_grad():                             # the bank: this step's features of these samples
            mean = z.detach().reshape(n_views, bsz, -1).mean(0)
            self.bank[ids] = torch.nn.functional.normalize(mean, dim=1).to(self.bank.dtype)
            self.bank_label[ids] = labels
        logits = self_masked_logits(z, self.temperature)
        log_denom = torch.logsumexp(logits, dim=1)
        if queue is not None:
            q_logits = queue_logits(z, queue, self.temperature)
            log_denom = torch.logaddexp(log_denom, torch.logsumexp(
                q_logits.masked_fill(~queue.valid[None, :], -math.inf), dim=1))
        zero = torch.zeros((), dtype=z.dtype, device=device)
        own_dot, n_own = positive_dots(z, z, bsz, n_views)                        # the instance term's positives
        inst = torch.where(n_own > 0, log_denom - own_dot / self.temperature / n_own.clamp(min=1), zero)
        if not self.selecting:                    # the warm-up: no partners, the instance term for every sample
            has, per_row = torch.zeros(bsz, dtype=torch.bool, device=device), inst
        else:
            eye = torch.eye(bsz, dtype=torch.bool, device=device)
            pair = self.partners(labels, ids) & ~eye
            has = pair.any(1)
            sup_dot, n_sup = positive_dots(z, z, bsz, n_views, mask=(pair | eye).to(z.dtype))
            if queue is not None:
                q_pair = (self.partners(labels, ids, queue.label, queue.idx) & queue.valid[None, :]
                          & (ids[:, None] != queue.idx[None, :]))              # [B, K]: not its own older key
                q_pair_rows = q_pair.to(z.dtype)[torch.arange(z.shape[0], device=device) % bsz]
                sup_dot = sup_dot + (q_logits * q_pair_rows).sum(1) * self.temperature
                n_sup = n_sup + q_pair_rows.sum(1)
                has = has | q_pair.any(1)
            sup = torch.where(n_sup > 0, log_denom - sup_dot / self.temperature / n_sup.clamp(min=1), zero)
            per_row = torch.where(has.repeat(n_views), sup, inst)
        self.last_stats = {'with_partners': has.to(z.dtype).mean(),
                           'selected': self.selected.to(z.dtype).mean()}
        return per_row.sum() / (n_views * bsz)


# ---------------------------------------------------------------- noise-robust cross-entropy (main_ce.py)
class GCELoss(Loss):
    """Generalized cross-entropy, L_q (Zhang & Sabuncu, NeurIPS 2018, "Generalized Cross Entropy Loss for Training
    Deep Neural Networks with Noisy Labels", eq. 6; docs/FIELD.md, "GCE and SCE")::

        L = mean_i (1 - p_i[y_i]^q) / q ,  p_i = softmax(f(x_i))

    ``q -> 0`` is cross-entropy, ``q = 1`` the mean absolute error (times 1/2 of its L1 form). ``p^q`` is taken as
    ``exp(q log_softmax)``: finite for every logit.

    Args:
        q: in ``(0, 1]``.

    Shapes: logits ``[N, C]``, labels ``[N]``. Output: scalar, float32 for half inputs.
    """

    def __init__(self, q=0.7):
        super().__init__()
        if not 0 < q <= 1:
            raise ValueError(f'q must be in (0, 1], got {q}')
        self.q = q

    def forward(self, logits, labels):
        log_p = upcast(logits).log_softmax(1).gather(1, labels.reshape(-1, 1).to(logits.device))[:, 0]
        return ((1 - torch.exp(self.q * log_p)) / self.q).mean()


class SCELoss(Loss):
    """Symmetric cross-entropy (Wang et al., ICCV 2019, "Symmetric Cross Entropy for Robust Learning with Noisy
    Labels", eqs. 5-7; docs/FIELD.md, "GCE and SCE"): cross-entropy plus reverse cross-entropy, in which ``log 0``
    of the one-hot label is clipped to ``A = -4`` (the paper's)::

        L = mean_i  alpha (-log p_i[y_i]) + beta (-A) (1 - p_i[y_i])

    Args:
        alpha, beta: the weights (>= 0, not both 0).

    Shapes: logits ``[N, C]``, labels ``[N]``. Output: scalar, float32 for half inputs.
    """
    A = -4.0

    def __init__(self, alpha=0.1, beta=1.0):
        super().__init__()
        if not (alpha >= 0 and beta >= 0 and alpha + beta > 0 and math.isfinite(alpha + beta)):
            raise ValueError(f'alpha and beta must be finite, >= 0 and not both 0, got {alpha} and {beta}')
        self.alpha, self.beta = alpha, beta

    def forward(self, logits, labels):
        log_p = upcast(logits).log_softmax(1).gather(1, labels.reshape(-1, 1).to(logits.device))[:, 0]
        return (self.alpha * -log_p + self.beta * -self.A * (1 - torch.exp(log_p))).mean()
