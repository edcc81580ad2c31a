"""RASCAL: Rank-Agreement Supervised Contrastive Alignment Loss (definition: ``docs/RASCAL.md``).

The loss is built from small parts, each a function of per-class blocks of the batch (rows grouped
by label, see :func:`losses.class_blocks`): :func:`fractional_rank_desc` ranks, :func:`rank_drift`
compares two rankings, ``WEIGHTINGS`` maps a mode to its positive weights, :func:`weight_statistics`
summarizes them, and :class:`RASCALLoss` holds the cache and puts the parts together.
"""
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


class CachedSimilarities:
    """``cache[i].cache[j]`` for every anchor id ``i`` of the batch and every column id ``j`` (batch samples,
    and the dataset ids of the queue entries), computed **once per pair of ids**.

    Columns that share a dataset id (both views of a sample, a sample that is in the batch and in the
    queue, ids duplicated by ``DistributedSampler`` padding) have the same cached similarity by definition
    (``docs/RASCAL.md``, "Ties are exact"); reading them from one entry of one table makes them equal in the code
    too, whatever the BLAS, the CPU or the matrix shapes. Computing them along two paths (a batch block and
    a queue block) can differ in the last bit, which breaks a tie and changes the ranks.

    ``sample_idx`` ``[B]``, ``queue_ids`` ``[K]`` or ``None``, both on the host (which ids are distinct decides
    the table's shape). ``batch_col[b]`` / ``queue_col[j]``: the table column of batch sample ``b`` / queue
    entry ``j`` (on the cache's device); ``lookup(anchor_samples, columns)`` reads the table at the anchors' rows
    (batch sample indices) and the given table columns.
    """

    def __init__(self, cache_feat, sample_idx, queue_ids, dtype):
        bsz = sample_idx.shape[0]
        device = cache_feat.device
        ids = sample_idx if queue_ids is None else torch.cat([sample_idx, queue_ids])
        uniq, col = torch.unique(ids, return_inverse=True)          # one column per distinct id
        anchor_uniq, anchor_row = torch.unique(col[:bsz], return_inverse=True)   # one row per batch id
        uniq, anchor_uniq, col, self.anchor_row = (t.to(device, non_blocking=True)
                                                   for t in (uniq, anchor_uniq, col, anchor_row))
        feats = cache_feat[uniq].to(dtype)
        self.table = feats[anchor_uniq] @ feats.T                     # [U_batch, U]
        self.batch_col, self.queue_col = col[:bsz], col[bsz:]

    def lookup(self, anchor_samples, columns):
        """``table[row of anchor_samples[..., None]], columns[..., None, :]]``: anchors ``[C, K]`` (batch
        sample indices) and columns ``[C, Q]`` give ``[C, K, Q]``."""
        return self.table[self.anchor_row[anchor_samples][:, :, None], columns[:, None, :]]


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

    ``labels`` and ``sample_idx`` are read on the host (they decide the blocks' shapes; no wait when they come
    from there), as are the queue's labels, ids and validity (:meth:`memory_queue.QueueView.on_host`).
    """

    def __init__(self, sims, labels, n_views, cache_feat, cache_valid, sample_idx, queue=None, queue_sims=None):
        bsz = labels.shape[0]
        device = sims.device
        labels, sample_idx = on_host(labels), on_host(sample_idx)
        sample_valid = cache_valid[sample_idx.to(device, non_blocking=True)]
        host_queue = None if queue is None else queue.on_host()
        queue_ids = None if queue is None else host_queue.idx.clamp(min=0)
        table = CachedSimilarities(cache_feat, sample_idx, queue_ids, sims.dtype)
        self.rows, self.present, _ = class_blocks(labels.repeat(n_views), device)
        self.pairs = block_pairs(self.present)
        self.current = sims[self.rows[:, :, None], self.rows[:, None, :]]
        sample_of = self.rows % bsz                                # view-major rows: r = v * B + b
        self.cached = table.lookup(sample_of, table.batch_col[sample_of])
        anchor_valid = sample_valid[sample_of]
        column_valid = anchor_valid                                # the cache entries of the columns' samples
        self.queue_cols = self.queue_present = None
        if queue is not None:
            classes = torch.unique(labels)                         # the blocks' classes, in class_blocks' order
            same = (host_queue.label[None, :] == classes[:, None]) & host_queue.valid[None, :]   # [C, K_queue]
            width = int(same.sum(1).max())
            queue_cols = torch.argsort((~same).to(torch.int8), dim=1, stable=True)[:, :width]
            self.queue_present = torch.gather(same, 1, queue_cols).to(device, non_blocking=True)
            self.queue_cols = queue_cols.to(device, non_blocking=True)
            self.pairs = torch.cat([self.pairs, self.present[:, :, None] & self.queue_present[:, None, :]], -1)
            self.current = torch.cat([self.current, queue_sims[self.rows[:, :, None], self.queue_cols[:, None, :]]], -1)
            self.cached = torch.cat([self.cached, table.lookup(sample_of, table.queue_col[self.queue_cols])], -1)
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

    def _check_inputs(self, features, labels, sample_idx):
        contrast, bsz, n_views = flatten_views(features)
        if contrast.shape[1] != self.feat_dim:
            raise ValueError(f'features have {contrast.shape[1]} dims, the cache has feat_dim={self.feat_dim}')
        labels, sample_idx = on_host(labels.reshape(-1)), on_host(sample_idx.reshape(-1))   # read on the host
        if labels.shape[0] != bsz or sample_idx.shape[0] != bsz:
            raise ValueError(f'labels ({labels.shape[0]}) and sample_idx ({sample_idx.shape[0]}) '
                             f'must have one entry per sample ({bsz})')
        if bool(((sample_idx < 0) | (sample_idx >= self.num_samples)).any()):
            raise ValueError(f'sample_idx must lie in [0, {self.num_samples})')
        return contrast, labels, sample_idx, n_views

    def forward(self, features, labels, sample_idx, queue=None):
        """``queue``: a :class:`memory_queue.QueueView` whose valid entries join every denominator and,
        with the anchor's label, its positives (``docs/QUEUE.md``); ``None``: no queue."""
        contrast, labels, sample_idx, n_views = self._check_inputs(features, labels, sample_idx)
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
                    sims.detach(), labels, sample_idx, n_views, queue,
                    None if queue_sims is None else queue_sims.detach())
            # sum_c W[r,c] log_prob[r,c] = z_r.(sum_c W[r,c] z_c)/tau - (sum_c W[r,c]) log_denom[r], per class block
            zb = z[pos.rows]                                 # [C, K, D]
            columns = zb if queue is None else torch.cat([zb, q_feat[pos.queue_cols]], 1)
            pos_term = (zb * torch.bmm(weights, columns)).sum(-1) / self.temperature
            per_row = (pos_term - weights.sum(-1) * log_denom[pos.rows]) * pos.present
            loss = -(self.temperature / self.base_temperature) * per_row.sum() / n_rows
            with torch.no_grad():
                self._update_cache(z.detach().reshape(n_views, -1, z.shape[1]).mean(0), sample_idx)
        self.last_stats, self.last_hists = stats, {'rank_drift': drift_hist}
        return loss

    def positive_weights(self, sims, labels, sample_idx, n_views, queue=None, queue_sims=None):
        """``(Positives, W per class block [C, K, K + Q], statistics, drift histogram)`` from the detached
        similarities ``sims`` ``[M, M]`` (and ``queue_sims`` ``[M, K_queue]``) and the cache as it is
        (before this step's update)."""
        pos = Positives(sims, labels, n_views, self.cache_feat, self.cache_valid, sample_idx, queue, queue_sims)
        drift = rank_drift(pos)
        weights, ranked, drift_rows = WEIGHTINGS[self.weighting](pos, drift)
        stats, drift_hist = weight_statistics(pos, weights, ranked, drift, drift_rows, sims.shape[0])
        return pos, weights, stats, drift_hist

    @torch.no_grad()
    def weight_matrix(self, features, labels, sample_idx, queue=None):
        """The dense weights ``W`` the next call would use (cache untouched), ``[M, M]``, or with a queue
        ``[M, M + K_queue]`` (queue entry ``j`` in column ``M + j``); for tests and analysis."""
        contrast, labels, sample_idx, n_views = self._check_inputs(features, labels, sample_idx)
        z = F.normalize(upcast(contrast), dim=1)
        queue_sims = None if queue is None else z @ queue.feat.to(z.dtype).T
        pos, weights, _, _ = self.positive_weights(z @ z.T, labels, sample_idx, n_views, queue, queue_sims)
        n_cols = z.shape[0] + (0 if queue is None else queue.feat.shape[0])
        dense = torch.zeros(z.shape[0], n_cols, dtype=z.dtype, device=z.device)
        rows, columns, present = pos.rows, pos.rows, pos.present
        if queue is not None:
            columns = torch.cat([pos.rows, pos.queue_cols + z.shape[0]], 1)
            present = torch.cat([pos.present, pos.queue_present], 1)
        pair = pos.present[:, :, None] & present[:, None, :]
        dense[rows[:, :, None].expand_as(pair)[pair], columns[:, None, :].expand_as(pair)[pair]] = weights[pair]
        return dense

    def _update_cache(self, mean_views, sample_idx):
        """cache[i] = normalize(mean of the view-means of every occurrence of i); deterministic. ``sample_idx``
        on the host (which ids repeat decides the shapes)."""
        uniq, inverse = torch.unique(on_host(sample_idx), return_inverse=True)
        device = mean_views.device
        uniq, inverse = uniq.to(device, non_blocking=True), inverse.to(device, non_blocking=True)
        onehot = (inverse[None, :] == torch.arange(len(uniq), device=device)[:, None])
        summed = onehot.to(mean_views.dtype) @ mean_views          # a matmul, not an atomic scatter
        self.cache_feat[uniq] = F.normalize(summed, dim=1).to(self.cache_feat.dtype)
        self.cache_valid.index_fill_(0, uniq, True)       # not `[uniq] = True`: a host scalar copied (a wait)
