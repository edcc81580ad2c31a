"""RASCAL: Rank-Agreement Supervised Contrastive Alignment Loss (``../shared/spec/RASCAL.md``)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from losses import class_blocks, flatten_views, upcast

WEIGHTINGS = ('agreement', 'current', 'uniform')
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


class RASCALLoss(nn.Module):
    """SupCon L_out whose average over an anchor's positives is weighted by rank agreement.

    Spec: ``RASCAL.md``. With rows ``r`` (``M = V*B``, view-major), unit features ``z``,
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
    returns a scalar (float32 under autocast). ``last_stats`` holds the spec's statistics
    as 0-d tensors (no host sync); ``last_drift_hist`` the drift counts over
    ``DRIFT_BINS`` equal bins of ``[0, 1]``.
    """

    def __init__(self, num_samples, feat_dim, temperature=0.07, base_temperature=0.07,
                 weighting='agreement', persistent_cache=False):
        super().__init__()
        if int(num_samples) < 1 or int(feat_dim) < 1:
            raise ValueError(f'num_samples and feat_dim must be >= 1, got {num_samples} and {feat_dim}')
        if not temperature > 0 or not base_temperature > 0:
            raise ValueError(f'temperatures must be > 0, got {temperature} and {base_temperature}')
        if weighting not in WEIGHTINGS:
            raise ValueError(f'weighting must be one of {WEIGHTINGS}, got {weighting!r}')
        self.num_samples, self.feat_dim = int(num_samples), int(feat_dim)
        self.temperature, self.base_temperature = temperature, base_temperature
        self.weighting = weighting
        self.register_buffer('cache_feat', torch.zeros(self.num_samples, self.feat_dim),
                             persistent=persistent_cache)
        self.register_buffer('cache_valid', torch.zeros(self.num_samples, dtype=torch.bool),
                             persistent=persistent_cache)
        self.last_stats = {}
        self.last_drift_hist = None

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
        labels, sample_idx = labels.reshape(-1), sample_idx.reshape(-1)
        if labels.shape[0] != bsz or sample_idx.shape[0] != bsz:
            raise ValueError(f'labels ({labels.shape[0]}) and sample_idx ({sample_idx.shape[0]}) '
                             f'must have one entry per sample ({bsz})')
        if bool(((sample_idx < 0) | (sample_idx >= self.num_samples)).any()):
            raise ValueError(f'sample_idx must lie in [0, {self.num_samples})')
        return contrast, labels, sample_idx, bsz, n_views

    def forward(self, features, labels, sample_idx):
        contrast, labels, sample_idx, bsz, n_views = self._check_inputs(features, labels, sample_idx)
        with torch.autocast(device_type=features.device.type, enabled=False):
            z = F.normalize(upcast(contrast), dim=1)
            m_rows = z.shape[0]
            sims = z @ z.T                                   # reused for the denominator and ranking
            if m_rows > 1:
                logits = (sims / self.temperature).fill_diagonal_(-float('inf'))
                log_denom = torch.logsumexp(logits, dim=1)   # log sum_{a != r} exp(z_r.z_a / tau)
            else:                                            # nothing to contrast with
                log_denom = sims.new_zeros(1)
            with torch.no_grad():
                rows, present, w_blk, stats = self._block_weights(sims.detach(), labels, sample_idx, bsz, n_views)
            # sum_c W[r,c] log_prob[r,c] = z_r.(sum_c W[r,c] z_c)/tau - (sum_c W[r,c]) log_denom[r], per class block
            zb = z[rows]                                     # [C, K, D]
            pos_term = (zb * torch.bmm(w_blk, zb)).sum(-1) / self.temperature
            per_row = (pos_term - w_blk.sum(-1) * log_denom[rows]) * present
            loss = -(self.temperature / self.base_temperature) * per_row.sum() / m_rows
            with torch.no_grad():
                self._update_cache(z.detach().reshape(n_views, bsz, -1).mean(0), sample_idx)
        self.last_stats = stats
        return loss

    @torch.no_grad()
    def weight_matrix(self, features, labels, sample_idx):
        """The dense ``[M, M]`` weights ``W`` the next call would use (cache untouched); for tests and analysis."""
        contrast, labels, sample_idx, bsz, n_views = self._check_inputs(features, labels, sample_idx)
        z = F.normalize(upcast(contrast), dim=1)
        rows, present, w_blk, _ = self._block_weights(z @ z.T, labels, sample_idx, bsz, n_views)
        dense = torch.zeros(z.shape[0], z.shape[0], dtype=z.dtype, device=z.device)
        pair = present[:, :, None] & present[:, None, :]
        dense[rows[:, :, None].expand_as(pair)[pair], rows[:, None, :].expand_as(pair)[pair]] = w_blk[pair]
        return dense

    # ------------------------------------------------------------------ weights
    def _block_weights(self, sims, labels, sample_idx, bsz, n_views):
        """Weights per class block: rows sorted by label, each class padded to K rows.

        Returns ``rows`` ``[C, K]`` (row indices, padding clamped to 0), ``present``
        ``[C, K]`` (not padding), ``w_blk`` ``[C, K, K]`` (``W`` restricted to the block;
        zero on padding and the diagonal) and the statistics.
        """
        device, dtype = sims.device, sims.dtype
        m_rows = sims.shape[0]
        valid_b = self.cache_valid[sample_idx]
        cache_b = self.cache_feat[sample_idx].to(dtype)
        old_b = cache_b @ cache_b.T                                # [B, B]

        rows, present, _ = class_blocks(labels.repeat(n_views))   # [C, K]
        k = rows.shape[1]
        blk_pos = present[:, :, None] & present[:, None, :] & ~torch.eye(k, dtype=torch.bool, device=device)
        m_blk = blk_pos.sum(-1)                                    # m_r per block row
        cur = sims[rows[:, :, None], rows[:, None, :]]             # [C, K, K]
        bpos = rows % bsz
        old = old_b[bpos[:, :, None], bpos[:, None, :]]
        row_valid = valid_b[bpos]                                  # anchor's own entry
        cache_ok = row_valid & ~(blk_pos & ~row_valid[:, None, :]).any(-1)

        denom = (m_blk - 1).clamp(min=1).to(dtype)[..., None]
        rank_cur = fractional_rank_desc(cur, blk_pos)
        drift = (rank_cur - fractional_rank_desc(old, blk_pos)).abs() / denom * (m_blk >= 2)[..., None]
        uniform = blk_pos.to(dtype) / m_blk.clamp(min=1).to(dtype)[..., None]
        has_pos = m_blk >= 1
        if self.weighting == 'agreement':
            w = (1 - drift).clamp(min=0) * blk_pos
            w_sum = w.sum(-1, keepdim=True)
            ranked = has_pos & cache_ok & (w_sum.squeeze(-1) > 1e-12)
            w_blk = torch.where(ranked[..., None], w / w_sum.clamp(min=1e-12), uniform)
            drift_rows = ranked
        elif self.weighting == 'current':
            w = torch.where((m_blk >= 2)[..., None], 1 - rank_cur / denom, torch.ones_like(rank_cur)) * blk_pos
            ranked = has_pos
            w_blk = w / w.sum(-1, keepdim=True).clamp(min=1e-12)
            drift_rows = has_pos & cache_ok
        else:
            ranked = torch.zeros_like(has_pos)
            w_blk = uniform
            drift_rows = has_pos & cache_ok

        # Statistics, all as tensors (the caller syncs once).
        pair_mask = (drift_rows & (m_blk >= 2))[..., None] & blk_pos
        drifts = drift[pair_mask]
        n_drift = pair_mask.sum().clamp(min=1)
        drift_mean = drifts.sum() / n_drift
        drift_std = (((drifts - drift_mean) ** 2).sum() / n_drift).sqrt()
        multi = m_blk >= 2
        ent = -(w_blk * torch.log(w_blk.clamp(min=1e-30))).sum(-1)
        self.last_drift_hist = torch.histc(drifts.float(), bins=DRIFT_BINS, min=0, max=1)
        stats = {
            'avg_pos_per_anchor': m_blk.sum().to(torch.float32) / m_rows,
            'cache_hit_rate': valid_b.float().mean(),
            'ranked_row_rate': (ranked & has_pos).sum() / has_pos.sum().clamp(min=1),
            'rank_drift_mean': drift_mean,
            'rank_drift_std': drift_std,
            'w_entropy': (ent * multi).sum() / multi.sum().clamp(min=1),
        }
        return rows, present, w_blk, stats

    def _update_cache(self, mean_views, sample_idx):
        """cache[i] = normalize(mean of the view-means of every occurrence of i); deterministic."""
        uniq, inverse = torch.unique(sample_idx, return_inverse=True)
        onehot = (inverse[None, :] == torch.arange(len(uniq), device=sample_idx.device)[:, None])
        summed = onehot.to(mean_views.dtype) @ mean_views          # a matmul, not an atomic scatter
        self.cache_feat[uniq] = F.normalize(summed, dim=1).to(self.cache_feat.dtype)
        self.cache_valid[uniq] = True
