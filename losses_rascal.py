"""RASCAL: Rank-Agreement Supervised Contrastive Alignment Loss (definition: ``docs/RASCAL.md``).

The loss is built from small parts, each a function of per-class blocks of the batch (rows grouped
by label, see :func:`losses.class_blocks`): :func:`fractional_rank_desc` ranks, :func:`rank_drift`
compares two rankings, ``WEIGHTINGS`` maps a mode to its positive weights, :func:`weight_statistics`
summarizes them, and :class:`RASCALLoss` holds the cache and puts the parts together.
"""
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from losses import Loss, block_pairs, class_blocks, flatten_views, on_host, upcast

DRIFT_BINS = 20  # histogram of rank drift over [0, 1]


def fractional_rank_desc(values, valid):
    """Fractional (average-of-positions) descending ranks along the last dim.

    ``values`` ``[..., K]``, ``valid`` ``[..., K]`` bool. Among the valid entries of
    each row the largest gets rank 0; tied values share the mean of the positions
    they span (Spearman's convention). Invalid entries get an arbitrary rank.
    """
    k = values.shape[-1]
    keyed = values.masked_fill(~valid, -float('inf'))           # invalid entries sort last
    ordered, order = keyed.sort(dim=-1, descending=True)  # ties are averaged: any order will do
    pos = torch.arange(k, device=values.device, dtype=values.dtype).expand_as(ordered)
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[..., 1:] = ordered[..., 1:] != ordered[..., :-1]
    ends = torch.ones_like(ordered, dtype=torch.bool)
    ends[..., :-1] = starts[..., 1:]
    first = torch.where(starts, pos, torch.zeros_like(pos)).cummax(dim=-1).values
    last = torch.where(ends, pos, torch.full_like(pos, k)).flip(-1).cummin(dim=-1).values.flip(-1)
    return torch.empty_like(values).scatter_(-1, order, (first + last) / 2)


class RascalPlan(NamedTuple):
    """What RASCAL builds on the host from the values of the batch's labels and dataset ids (and of the queue's host
    copy): index tensors whose shapes depend on those values, on the loss's device (:meth:`RASCALLoss.host_plan`).
    With it the rest of the loss has no shape that depends on a value and reads nothing back, so ``torch.compile``
    traces it whole (docs/USAGE.md, "torch.compile").

    ``rows``, ``present`` ``[C, K]``: the class blocks of the ``M = V*B`` rows (:func:`losses.class_blocks`).
    ``sample`` ``[B]``: the dataset ids. The cached-similarity table, ``cache[i].cache[j]`` once per pair of ids:
    its columns are ``uniq`` ``[U]``, the distinct ids of the batch and the queue; its rows ``uniq[anchor_uniq]``
    (``[U_b]``), the batch's distinct ids; ``anchor_row`` / ``batch_col`` ``[B]``: each sample's row and column,
    ``queue_col`` ``[K_queue]`` each queue entry's column. With a queue, ``queue_cols`` ``[C, Q]``: each class
    block's valid queue entries of its class (``queue_present`` marks padding; ``docs/QUEUE.md``); else ``None``.
    ``K`` and ``Q`` are at least 2, so that a compiled graph built for the first batch (an empty queue) fits the
    next ones (the compiler specializes sizes 0 and 1); padding is masked, so it adds exact zeros.

    Columns that share a dataset id (both views of a sample, a sample in the batch and in the queue, ids
    duplicated by ``DistributedSampler`` padding) have the same cached similarity by definition (``docs/RASCAL.md``,
    "Ties are exact"); reading them from one entry of one table makes them equal in the code too, whatever the
    BLAS, the CPU or the matrix shapes. Computing them along two paths (a batch block and a queue block) can differ
    in the last bit, which breaks a tie and changes the ranks.
    """
    rows: torch.Tensor
    present: torch.Tensor
    sample: torch.Tensor
    uniq: torch.Tensor
    anchor_uniq: torch.Tensor
    anchor_row: torch.Tensor
    batch_col: torch.Tensor
    queue_col: Optional[torch.Tensor] = None
    queue_cols: Optional[torch.Tensor] = None
    queue_present: Optional[torch.Tensor] = None


def _padded(rows, present, width=2):
    """``rows``, ``present`` ``[C, K]`` with at least ``width`` columns (padding: row 0, not present)."""
    extra = width - rows.shape[1]
    if extra <= 0:
        return rows, present
    return F.pad(rows, (0, extra)), F.pad(present, (0, extra))


def build_plan(labels, sample_idx, n_views, device, host_queue=None):
    """:class:`RascalPlan` from host ``labels`` and ``sample_idx`` ``[B]`` and the queue's host copy
    (``memory_queue.QueueView.on_host``: labels, ids, validity), copied to ``device`` without waiting."""
    bsz = labels.shape[0]
    queue_ids = None if host_queue is None else host_queue.idx.clamp(min=0)
    ids = sample_idx if queue_ids is None else torch.cat([sample_idx, queue_ids])
    uniq, col = torch.unique(ids, return_inverse=True)          # one column per distinct id
    anchor_uniq, anchor_row = torch.unique(col[:bsz], return_inverse=True)   # one row per batch id
    rows, present, _ = class_blocks(labels.repeat(n_views), 'cpu')
    rows, present = _padded(rows, present)
    queue = {}
    if host_queue is not None:
        classes = torch.unique(labels)                         # the blocks' classes, in class_blocks' order
        same = (host_queue.label[None, :] == classes[:, None]) & host_queue.valid[None, :]   # [C, K_queue]
        width = int(same.sum(1).max())
        queue_cols = torch.argsort((~same).to(torch.int8), dim=1, stable=True)[:, :width]
        queue_cols, queue_present = _padded(queue_cols, torch.gather(same, 1, queue_cols))
        queue = dict(queue_col=col[bsz:], queue_cols=queue_cols, queue_present=queue_present)
    parts = dict(rows=rows, present=present, sample=sample_idx, uniq=uniq, anchor_uniq=anchor_uniq,
                 anchor_row=anchor_row, batch_col=col[:bsz], **queue)
    # contiguous: a compiled graph guards on the strides as well as the sizes
    return RascalPlan(**{k: v.contiguous().to(device, non_blocking=True) for k, v in parts.items()})


class Positives:
    """An anchor's positives inside its class block, and their similarities now and in the cache.

    ``rows`` ``[C, K]`` row indices (padding clamped to 0), ``present`` ``[C, K]`` (not padding).
    The block's columns are its ``K`` rows, then (with a memory queue) ``queue_cols`` ``[C, Q]``: the
    indices of the valid queue entries of the block's class (``queue_present`` marks padding), see
    ``docs/QUEUE.md``. Per anchor and column: ``pairs`` ``[C, K, K + Q]`` (positive pairs),
    ``current`` / ``cached`` (``z_r.z_c`` and ``cache[s(r)].cache[s(c)]``, where a queue entry's sample is
    its dataset id); per anchor: ``num_pos`` ``[C, K]`` (``m_r``), ``cache_complete`` (the anchor's and
    every positive's cache entries are valid), and ``rank_current`` (the descending fractional ranks of
    ``current`` among the positives).

    Built from the similarities, the cache and the batch's :class:`RascalPlan` ``plan``; nothing read on the host.
    """

    def __init__(self, sims, plan, cache_feat, cache_valid, queue=None, queue_sims=None):
        bsz = plan.sample.shape[0]
        sample_valid = cache_valid[plan.sample]
        feats = cache_feat[plan.uniq].to(sims.dtype)
        table = feats[plan.anchor_uniq] @ feats.T                    # [U_b, U]: cache[i].cache[j], once per pair
        self.rows, self.present = plan.rows, plan.present
        self.pairs = block_pairs(self.present)
        self.current = sims[self.rows[:, :, None], self.rows[:, None, :]]
        sample_of = self.rows % bsz                                # view-major rows: r = v * B + b
        anchor_rows = plan.anchor_row[sample_of][:, :, None]        # [C, K, 1]: the anchors' table rows
        self.cached = table[anchor_rows, plan.batch_col[sample_of][:, None, :]]
        anchor_valid = sample_valid[sample_of]
        column_valid = anchor_valid                                # the cache entries of the columns' samples
        self.queue_cols, self.queue_present = plan.queue_cols, plan.queue_present
        if queue is not None:
            self.pairs = torch.cat([self.pairs, self.present[:, :, None] & self.queue_present[:, None, :]], -1)
            self.current = torch.cat([self.current, queue_sims[self.rows[:, :, None], self.queue_cols[:, None, :]]], -1)
            self.cached = torch.cat([self.cached, table[anchor_rows, plan.queue_col[self.queue_cols][:, None, :]]], -1)
            column_valid = torch.cat([anchor_valid, (cache_valid[queue.idx.clamp(min=0)] & (queue.idx >= 0))[
                self.queue_cols]], -1)
        self.num_pos = self.pairs.sum(-1)
        self.cache_complete = anchor_valid & ~(self.pairs & ~column_valid[:, None, :]).any(-1)
        self.sample_valid = sample_valid
        self.rank_current = fractional_rank_desc(self.current, self.pairs)

    def rank_span(self):
        """``m_r - 1`` (at least 1), ``[C, K, 1]``: the largest possible rank difference."""
        return (self.num_pos - 1).clamp(min=1).to(self.current.dtype)[..., None]

    def uniform(self):
        return self.pairs.to(self.current.dtype) / self.num_pos.clamp(min=1).to(self.current.dtype)[..., None]


def rank_drift(pos):
    """``|rank_current - rank_cached| / (m_r - 1)`` per positive pair (0 for anchors with one positive)."""
    return (pos.rank_current - fractional_rank_desc(pos.cached, pos.pairs)).abs() / pos.rank_span() \
        * (pos.num_pos >= 2)[..., None]


def agreement_weights(pos, drift):
    """``w = max(0, 1 - drift)``, normalized; uniform where a cache entry is missing or ``sum w <= 1e-12``.
    Returns ``(W [C, K, K], ranked [C, K], rows whose drift counts in the statistics [C, K])``."""
    w = (1 - drift).clamp(min=0) * pos.pairs
    w_sum = w.sum(-1, keepdim=True)
    ranked = (pos.num_pos >= 1) & pos.cache_complete & (w_sum.squeeze(-1) > 1e-12)
    return torch.where(ranked[..., None], w / w_sum.clamp(min=1e-12), pos.uniform()), ranked, ranked


def current_weights(pos, drift):
    """No cache: ``w = 1 - rank_current / (m_r - 1)`` (``1`` when ``m_r = 1``), normalized."""
    several = (pos.num_pos >= 2)[..., None]
    w = torch.where(several, 1 - pos.rank_current / pos.rank_span(), torch.ones_like(pos.rank_current)) \
        * pos.pairs
    has_pos = pos.num_pos >= 1
    return w / w.sum(-1, keepdim=True).clamp(min=1e-12), has_pos, has_pos & pos.cache_complete


def uniform_weights(pos, drift):
    """``1 / m_r``: plain SupCon (the cache is still kept, so the statistics stay comparable)."""
    has_pos = pos.num_pos >= 1
    return pos.uniform(), torch.zeros_like(has_pos), has_pos & pos.cache_complete


WEIGHTINGS = {'agreement': agreement_weights, 'current': current_weights, 'uniform': uniform_weights}


def drift_histogram(drift, mask, bins=DRIFT_BINS):
    """Counts ``[bins]`` of the ``drift`` values where ``mask``, over equal bins of ``[0, 1]`` (``torch.histc``'s
    bins: value ``x`` in bin ``floor(x * bins)``, 1 in the last). Integer adds, fixed shapes: deterministic and
    without a host synchronization on every device (``histc`` has neither on CUDA)."""
    bucket = (drift.float() * bins).long().clamp_(0, bins - 1)
    return torch.zeros(bins, dtype=torch.long, device=drift.device).scatter_add_(
        0, bucket.flatten(), mask.flatten().long()).float()


def weight_statistics(pos, weights, ranked, drift, drift_rows, n_rows):
    """The statistics of ``docs/RASCAL.md`` as 0-d tensors, and the drift histogram counts (masked sums over the
    pairs: no selection of a data-dependent size)."""
    has_pos = pos.num_pos >= 1
    multi = pos.num_pos >= 2
    pair_mask = (drift_rows & multi)[..., None] & pos.pairs
    n_drift = pair_mask.sum().clamp(min=1)
    drift_mean = (drift * pair_mask).sum() / n_drift
    drift_std = ((((drift - drift_mean) * pair_mask) ** 2).sum() / n_drift).sqrt()
    entropy = -(weights * torch.log(weights.clamp(min=1e-30))).sum(-1)
    stats = {
        'avg_pos_per_anchor': pos.num_pos.sum().to(torch.float32) / n_rows,
        'cache_hit_rate': pos.sample_valid.float().mean(),
        'ranked_row_rate': (ranked & has_pos).sum() / has_pos.sum().clamp(min=1),
        'rank_drift_mean': drift_mean,
        'rank_drift_std': drift_std,
        'w_entropy': (entropy * multi).sum() / multi.sum().clamp(min=1),
    }
    return stats, drift_histogram(drift, pair_mask)


class RASCALLoss(Loss):
    """SupCon L_out whose average over an anchor's positives is weighted by rank agreement.

    Definition: ``docs/RASCAL.md``. With rows ``r`` (``M = V*B``, view-major), unit features ``z``,
    ``log_prob[r, c] = z_r.z_c/tau - log sum_{a != r} exp(z_r.z_a/tau)`` and positives
    ``P(r) = {c != r : y_c = y_r}``::

        loss = -(tau / tau_base) * (1/M) * sum_r sum_{c in P(r)} W[r, c] * log_prob[r, c]

    ``W`` (no gradient) sums to 1 over ``P(r)``. Mode ``agreement``: rank the positives by
    current similarity ``z_r.z_c`` and by cached similarity ``cache[s(r)].cache[s(c)]``
    (descending, ties share the mean position), ``drift = |rank_cur - rank_old| / (m_r - 1)``,
    ``w = max(0, 1 - drift)``, ``W = w / sum w``; uniform ``1/m_r`` when a cache entry of
    the row is missing or ``sum w <= 1e-12``. Mode ``current``: ``w = 1 - rank_cur/(m_r - 1)``.
    Mode ``uniform``: ``1/m_r`` (equals :class:`losses.SupConLoss`). After the loss, the cache
    entries of the batch become the normalized mean of their views (duplicate ids: the
    normalized mean of all their occurrences). Rows without positives contribute 0 and
    count in ``M``.

    Args:
        num_samples: ``N``, the dataset size (``sample_idx`` in ``[0, N)``).
        feat_dim: ``D`` of the features.
        temperature, base_temperature: ``tau``, ``tau_base`` (> 0).
        weighting: ``'agreement'`` | ``'current'`` | ``'uniform'``.
        persistent_cache: keep ``cache_feat``/``cache_valid`` in ``state_dict()``.

    Shapes: features ``[B, V, D]`` (more dims flattened), labels ``[B]``, sample_idx ``[B]``;
    returns a scalar (float32 under autocast). ``last_stats`` holds the statistics of
    ``docs/RASCAL.md`` as 0-d tensors (no host sync); ``last_hists['rank_drift']`` the drift
    counts over ``DRIFT_BINS`` equal bins of ``[0, 1]``.
    """

    def __init__(self, num_samples, feat_dim, temperature=0.07, base_temperature=0.07,
                 weighting='agreement', persistent_cache=False):
        super().__init__()
        if int(num_samples) < 1 or int(feat_dim) < 1:
            raise ValueError(f'num_samples and feat_dim must be >= 1, got {num_samples} and {feat_dim}')
        if not temperature > 0 or not base_temperature > 0:
            raise ValueError(f'temperatures must be > 0, got {temperature} and {base_temperature}')
        if weighting not in WEIGHTINGS:
            raise ValueError(f'weighting must be one of {tuple(WEIGHTINGS)}, got {weighting!r}')
        self.num_samples, self.feat_dim = int(num_samples), int(feat_dim)
        self.temperature, self.base_temperature = temperature, base_temperature
        self.weighting = weighting
        self.register_buffer('cache_feat', torch.zeros(self.num_samples, self.feat_dim),
                             persistent=persistent_cache)
        self.register_buffer('cache_valid', torch.zeros(self.num_samples, dtype=torch.bool),
                             persistent=persistent_cache)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        saved = state_dict.get(prefix + 'cache_feat')
        if saved is not None and tuple(saved.shape) != tuple(self.cache_feat.shape):
            raise ValueError(f'the RASCAL cache in the checkpoint is {tuple(saved.shape)} (samples x feat_dim) '
                             f'but this run needs {tuple(self.cache_feat.shape)}: the dataset or --feat_dim differs')
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def host_plan(self, labels, sample_idx, n_views, queue=None, device=None):
        """The batch's :class:`RascalPlan`, built on the host from ``labels`` and ``sample_idx`` ``[B]`` (read there:
        no wait when they are host tensors, as a loader yields them) and the queue's host copy; checks them. On the
        cache's device (``device`` is that)."""
        labels, sample_idx = on_host(labels.reshape(-1)), on_host(sample_idx.reshape(-1))
        if labels.shape[0] != sample_idx.shape[0]:
            raise ValueError(f'labels ({labels.shape[0]}) and sample_idx ({sample_idx.shape[0]}) '
                             'must have one entry per sample')
        if bool(((sample_idx < 0) | (sample_idx >= self.num_samples)).any()):
            raise ValueError(f'sample_idx must lie in [0, {self.num_samples})')
        return build_plan(labels, sample_idx, n_views, self.cache_feat.device,
                          None if queue is None else queue.on_host())

    def _flatten(self, features, labels, sample_idx, queue, plan):
        """The view-major rows ``[M, D]``, ``V`` and the plan (built here when not given)."""
        contrast, bsz, n_views = flatten_views(features)
        if contrast.shape[1] != self.feat_dim:
            raise ValueError(f'features have {contrast.shape[1]} dims, the cache has feat_dim={self.feat_dim}')
        plan = self.host_plan(labels, sample_idx, n_views, queue) if plan is None else plan
        if plan.sample.shape[0] != bsz:
            raise ValueError(f'labels and sample_idx ({plan.sample.shape[0]}) must have one entry per sample ({bsz})')
        return contrast, n_views, plan

    def forward(self, features, labels, sample_idx, queue=None, plan=None):
        """``queue``: a :class:`memory_queue.QueueView` whose valid entries join every denominator and,
        with the anchor's label, its positives (``docs/QUEUE.md``); ``None``: no queue. ``plan``: the batch's
        :class:`RascalPlan` (:meth:`host_plan` of the same arguments) when built already; ``labels`` and
        ``sample_idx`` are then not read (the training step builds it before its compiled loss step)."""
        contrast, n_views, plan = self._flatten(features, labels, sample_idx, queue, plan)
        with torch.autocast(device_type=features.device.type, enabled=False):
            z = F.normalize(upcast(contrast), dim=1)
            n_rows = z.shape[0]
            sims = z @ z.T                                   # reused for the denominator and ranking
            queue_sims = None
            if queue is not None:
                q_feat = queue.feat.to(z.dtype)
                queue_sims = z @ q_feat.T                    # [M, K_queue], reused like sims
            if n_rows > 1 or queue is not None:
                logits = (sims / self.temperature).fill_diagonal_(-float('inf'))
                if queue is not None:      # valid queue entries join every denominator
                    q_logits = (queue_sims / self.temperature).masked_fill(~queue.valid, -float('inf'))
                    logits = torch.cat([logits, q_logits], 1)
                log_denom = torch.logsumexp(logits, dim=1)   # log sum_{a != r} exp(z_r.z_a / tau)
                if queue is not None:      # B = 1, V = 1 and an empty queue: nothing to contrast with
                    log_denom = torch.where(torch.isfinite(log_denom), log_denom, torch.zeros_like(log_denom))
            else:                                            # nothing to contrast with
                log_denom = sims.new_zeros(1)
            with torch.no_grad():
                pos, weights, stats, drift_hist = self.positive_weights(
                    sims.detach(), plan, queue, None if queue_sims is None else queue_sims.detach())
            # sum_c W[r,c] log_prob[r,c] = z_r.(sum_c W[r,c] z_c)/tau - (sum_c W[r,c]) log_denom[r], per class block
            zb = z[pos.rows]                                 # [C, K, D]
            columns = zb if queue is None else torch.cat([zb, q_feat[pos.queue_cols]], 1)
            pos_term = (zb * torch.bmm(weights, columns)).sum(-1) / self.temperature
            per_row = (pos_term - weights.sum(-1) * log_denom[pos.rows]) * pos.present
            loss = -(self.temperature / self.base_temperature) * per_row.sum() / n_rows
            with torch.no_grad():
                self._update_cache(z.detach().reshape(n_views, -1, z.shape[1]).mean(0), plan)
        self.last_stats, self.last_hists = stats, {'rank_drift': drift_hist}
        return loss

    def positive_weights(self, sims, plan, queue=None, queue_sims=None):
        """``(Positives, W per class block [C, K, K + Q], statistics, drift histogram)`` from the detached
        similarities ``sims`` ``[M, M]`` (and ``queue_sims`` ``[M, K_queue]``) and the cache as it is
        (before this step's update)."""
        pos = Positives(sims, plan, self.cache_feat, self.cache_valid, queue, queue_sims)
        drift = rank_drift(pos)
        weights, ranked, drift_rows = WEIGHTINGS[self.weighting](pos, drift)
        stats, drift_hist = weight_statistics(pos, weights, ranked, drift, drift_rows, sims.shape[0])
        return pos, weights, stats, drift_hist

    @torch.no_grad()
    def weight_matrix(self, features, labels, sample_idx, queue=None):
        """The dense weights ``W`` the next call would use (cache untouched), ``[M, M]``, or with a queue
        ``[M, M + K_queue]`` (queue entry ``j`` in column ``M + j``); for tests and analysis."""
        contrast, _, plan = self._flatten(features, labels, sample_idx, queue, None)
        z = F.normalize(upcast(contrast), dim=1)
        queue_sims = None if queue is None else z @ queue.feat.to(z.dtype).T
        pos, weights, _, _ = self.positive_weights(z @ z.T, plan, queue, queue_sims)
        n_cols = z.shape[0] + (0 if queue is None else queue.feat.shape[0])
        dense = torch.zeros(z.shape[0], n_cols, dtype=z.dtype, device=z.device)
        rows, columns, present = pos.rows, pos.rows, pos.present
        if queue is not None:
            columns = torch.cat([pos.rows, pos.queue_cols + z.shape[0]], 1)
            present = torch.cat([pos.present, pos.queue_present], 1)
        pair = pos.present[:, :, None] & present[:, None, :]
        dense[rows[:, :, None].expand_as(pair)[pair], columns[:, None, :].expand_as(pair)[pair]] = weights[pair]
        return dense

    def _update_cache(self, mean_views, plan):
        """cache[i] = normalize(mean of the view-means of every occurrence of i); deterministic. The batch's
        distinct ids and each sample's position among them come from the ``plan`` (the table's rows)."""
        uniq, inverse = plan.uniq[plan.anchor_uniq], plan.anchor_row
        onehot = (inverse[None, :] == torch.arange(uniq.shape[0], device=uniq.device)[:, None])
        summed = onehot.to(mean_views.dtype) @ mean_views          # a matmul, not an atomic scatter
        self.cache_feat[uniq] = F.normalize(summed, dim=1).to(self.cache_feat.dtype)
        self.cache_valid.index_fill_(0, uniq, True)       # not `[uniq] = True`: a host scalar copied (a wait)
