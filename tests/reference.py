"""The test oracles: every loss written as a plain per-row (per-pair) loop from its equation in docs/ or its
paper, with no vectorization to share bugs with the code under test; and one value-and-gradient check.

- :func:`contrastive`: SupCon / SimCLR's L_out (SupContrast semantics: labels, an explicit mask, or the other
  views of the same sample; contrast modes all/one), with a memory queue (docs/QUEUE.md) and with any weights
  over an anchor's positives (RASCAL).
- :func:`rascal_weights` and :func:`frac_rank_desc`: RASCAL's weightings (docs/RASCAL.md); :func:`rascal`: the
  loss and its cache update.
- :func:`ntlogistic`, :func:`triplet`: SimCLR's other two losses; :func:`carrot`: CARROT's regularizer
  (docs/CARROT.md).
- :func:`kcl`, :func:`sincere` (with a margin: epsilon-SupInfoNCE), :func:`supdcl`, :func:`spread`: the published
  variants of docs/FIELD.md.
- :func:`logit_adjusted`: logit-adjusted cross-entropy and balanced softmax; :func:`bcl`: BCL's contrastive term;
  :func:`paco`: PaCo's loss; :func:`tsc`: TSC's
  loss and :func:`best_assignment`, its matching by brute force.
- :func:`assert_value_and_grad_close`: a loss against its oracle, in value and gradient.
"""
import math

import torch
import torch.nn.functional as F


def assert_value_and_grad_close(fn, reference, inputs, rtol=1e-5, atol=1e-8):
    """``fn(x)`` and ``reference(x)`` (scalars) agree in value and in gradient w.r.t. ``inputs``; both finite.
    Returns ``fn``'s value."""
    x1, x2 = inputs.clone().requires_grad_(True), inputs.clone().requires_grad_(True)
    got, want = fn(x1), reference(x2)
    assert torch.isfinite(got)
    torch.testing.assert_close(got, want.to(got.dtype), rtol=rtol, atol=atol)
    got.backward()
    want.backward()
    assert torch.isfinite(x1.grad).all()
    torch.testing.assert_close(x1.grad, x2.grad.to(x1.grad.dtype), rtol=rtol, atol=atol)
    return got


# ---------------------------------------------------------------- L_out, one anchor at a time
def contrastive(features, labels=None, mask=None, queue=None, temperature=0.07, base_temperature=0.07, mode='all',
                weights=None, normalize=False):
    """``features`` ``[B, V, ...]``; rows are view-major (row ``v*B + b``). For each anchor, the contrast set is
    every other row and every valid entry of ``queue`` (a ``memory_queue.QueueView``). Positives: rows of the same
    label (``labels``), rows weighted by ``mask[i, j]`` (``mask``), or the other views of the same sample
    (neither); a queue entry is a positive when its label equals the anchor's (never without labels).
    ``weights(r, P, rows, vec)`` gives the weights over the positives ``P`` (columns ``('row', c)`` or
    ``('queue', j)``; ``vec(col)`` their vectors); default: the positives' mask weights normalized to sum 1
    (uniform with labels). ``mode='one'``: only view 0's rows are anchors. ``normalize``: L2-normalize the rows
    first (RASCAL does; SupConLoss takes them as given). An anchor without a positive adds 0 and still counts
    in the mean; an anchor with nothing to contrast is skipped."""
    bsz, n_views = features.shape[:2]
    f = features.reshape(bsz, n_views, -1)
    if normalize:
        f = F.normalize(f, dim=-1)
    rows = [f[b, v] for v in range(n_views) for b in range(bsz)]
    sample = [b for v in range(n_views) for b in range(bsz)]
    cols = [('row', c) for c in range(len(rows))]
    if queue is not None:
        cols += [('queue', j) for j in range(queue.feat.shape[0]) if bool(queue.valid[j])]

    def vec(col):
        return rows[col[1]] if col[0] == 'row' else queue.feat[col[1]].to(features.dtype)

    def raw_weight(r, col):
        if col[0] == 'queue':
            return float(labels is not None and int(queue.label[col[1]]) == int(labels[sample[r]]))
        i, j = sample[r], sample[col[1]]
        if labels is not None:
            return float(labels[i] == labels[j])
        if mask is not None:
            return float(mask[i, j])
        return float(i == j)

    anchors = range(len(rows)) if mode == 'all' else range(bsz)
    total = features.sum() * 0.0          # keeps the graph when no anchor has a positive
    for r in anchors:
        others = [c for c in cols if c != ('row', r)]
        if not others:
            continue
        log_denom = torch.logsumexp(torch.stack([rows[r] @ vec(c) / temperature for c in others]), 0)
        raw = [(c, raw_weight(r, c)) for c in others]
        P = [c for c, w in raw if w]
        if not P:
            continue
        W = weights(r, P, rows, vec) if weights else [w / sum(w for _, w in raw) for _, w in raw if w]
        total = total + sum(w * (rows[r] @ vec(c) / temperature - log_denom) for c, w in zip(P, W))
    return -(temperature / base_temperature) * total / len(anchors)


# ---------------------------------------------------------------- RASCAL (docs/RASCAL.md)
def frac_rank_desc(values):
    """Rank 0 = largest; ties share the mean of the positions they span."""
    return [sum(y > x for y in values) + (sum(y == x for y in values) - 1) / 2 for x in values]


def rascal_weights(weighting, cache_feat, cache_valid, sample_idx, queue=None):
    """``weights(r, P, rows, vec)`` for :func:`contrastive`: RASCAL's ``agreement`` / ``current`` / ``uniform``
    weights over the positives ``P`` of row ``r``. A row's dataset id is ``sample_idx[r % B]``, a queue entry's is
    its ``queue.idx``; ranks by the current similarities and by the cached ones; agreement falls back to uniform
    when a cache entry is missing or every weight is 0."""
    bsz = len(sample_idx)

    def sid(col):
        return int(sample_idx[col[1] % bsz]) if col[0] == 'row' else int(queue.idx[col[1]])

    def weights(r, P, rows, vec):
        m = len(P)
        uniform = [1.0 / m] * m
        if weighting == 'uniform':
            return uniform
        rank_cur = frac_rank_desc([float(rows[r].detach() @ vec(c).detach()) for c in P])
        if weighting == 'current':
            w = [1 - x / (m - 1) if m > 1 else 1.0 for x in rank_cur]
            return [x / sum(w) for x in w]
        anchor, ids = sid(('row', r)), [sid(c) for c in P]
        if not bool(cache_valid[anchor]) or not all(bool(cache_valid[i]) for i in ids):
            return uniform
        rank_old = frac_rank_desc([float(cache_feat[anchor] @ cache_feat[i]) for i in ids])
        w = [max(0.0, 1 - (abs(a - b) / (m - 1) if m > 1 else 0.0)) for a, b in zip(rank_cur, rank_old)]
        return [x / sum(w) for x in w] if sum(w) > 1e-12 else uniform
    return weights


def rascal(features, labels, sample_idx, cache_feat, cache_valid, tau=0.1, tau_base=0.07, weighting='agreement',
           queue=None):
    """RASCAL's loss and its cache after the step: ``(loss, cache_feat, cache_valid)``. The cache entry of each
    id in the batch becomes the normalized mean of its samples' normalized view means."""
    loss = contrastive(features, labels, queue=queue, temperature=tau, base_temperature=tau_base, normalize=True,
                       weights=rascal_weights(weighting, cache_feat, cache_valid, sample_idx, queue))
    bsz, n_views = features.shape[:2]
    z = F.normalize(features.reshape(bsz, n_views, -1), dim=-1)
    new_feat, new_valid = cache_feat.clone(), cache_valid.clone()
    for i in set(int(s) for s in sample_idx):
        occ = [b for b in range(bsz) if int(sample_idx[b]) == i]
        new_feat[i] = F.normalize(sum(z[b].detach().mean(0) for b in occ) / len(occ), dim=0)
        new_valid[i] = True
    return loss, new_feat, new_valid


# ---------------------------------------------------------------- SimCLR's loss family (Chen et al. 2020, Table 2)
def _rows(features, labels=None):
    """(rows, is_positive(i, j)) with view-major rows, one pair at a time."""
    bsz, n_views = features.shape[:2]
    rows = [features[b, v].reshape(-1) for v in range(n_views) for b in range(bsz)]
    sample = [b for v in range(n_views) for b in range(bsz)]
    if labels is None:
        return rows, lambda i, j: sample[i] == sample[j]
    return rows, lambda i, j: bool(labels[sample[i]] == labels[sample[j]])


def ntlogistic(features, labels=None, temperature=0.5):
    """Per anchor: ``-mean_P log sigmoid(s/t) - mean_N log sigmoid(-s/t)``; mean over anchors."""
    rows, same = _rows(features, labels)
    total = features.sum() * 0.0
    for i in range(len(rows)):
        pos, neg = [], []
        for j in range(len(rows)):
            if j == i:
                continue
            s = rows[i] @ rows[j] / temperature
            if same(i, j):
                pos.append(math.log(1.0) - torch.log1p(torch.exp(-s)))      # log sigmoid(s)
            else:
                neg.append(-torch.log1p(torch.exp(s)))                       # log sigmoid(-s)
        if pos:
            total = total - sum(pos) / len(pos)
        if neg:
            total = total - sum(neg) / len(neg)
    return total / len(rows)


def triplet(features, labels=None, margin=1.0):
    """Per anchor: ``mean_P mean_N max(s_in - s_ip + m, 0)`` (0 without a positive or a negative)."""
    rows, same = _rows(features, labels)
    total = features.sum() * 0.0
    for i in range(len(rows)):
        pos = [j for j in range(len(rows)) if j != i and same(i, j)]
        neg = [k for k in range(len(rows)) if k != i and not same(i, k)]
        if not pos or not neg:
            continue
        per_pos = []
        for p in pos:
            hinges = [F.relu(rows[i] @ rows[n] - rows[i] @ rows[p] + margin) for n in neg]  # relu: 0 slope at 0
            per_pos.append(sum(hinges) / len(neg))
        total = total + sum(per_pos) / len(pos)
    return total / len(rows)


# ---------------------------------------------------------------- CARROT (docs/CARROT.md)
def carrot(h, y, q_hi=0.9, q_lo=0.1):
    """Loops over ordered pairs; torch.quantile for the walls. Returns (reg, L, U) or (0, None, None)."""
    z = F.normalize(h.double(), dim=1)
    S = (z @ z.T).clamp(-1, 1)
    n = len(y)
    negs = [S[i, j].detach() for i in range(n) for j in range(n) if y[i] != y[j]]
    pos = [(i, j) for i in range(n) for j in range(n) if i != j and y[i] == y[j]]
    if not negs or not pos:
        return h.sum() * 0.0, None, None
    negs = torch.stack(negs)
    hi, lo = torch.quantile(negs, q_hi), torch.quantile(negs, q_lo)
    L = hi
    U = min(max(1 - max(hi - lo, 0), L + 1e-3), 0.999)
    terms = [F.relu(L - S[i, j]) ** 2 + F.relu(S[i, j] - U) ** 2 for i, j in pos]
    return torch.stack(terms).mean(), float(L), float(U)


# ---------------------------------------------------------------- the field (docs/FIELD.md), one anchor at a time
def _field_rows(features, labels, queue=None):
    """Rows ``(vector, label, sample)``: the batch's ``V*B`` rows (view-major), then the valid queue keys
    (sample ``None``: a queue key is never an anchor and never one of an anchor's own views)."""
    bsz, n_views = features.shape[:2]
    f = features.reshape(bsz, n_views, -1)
    out = [(f[b, v], int(labels[b]), b) for v in range(n_views) for b in range(bsz)]
    if queue is not None:
        out += [(queue.feat[j].to(features.dtype), int(queue.label[j]), None)
                for j in range(queue.feat.shape[0]) if bool(queue.valid[j])]
    return out, n_views * bsz


def _logsumexp(values):
    return torch.logsumexp(torch.stack(values), 0)


def kcl(features, labels, drawn, temperature):
    """KCL: anchor ``i``'s positives are its own other views and the rows ``drawn[i]`` (a list of row indices);
    denominator every other row. Mean over the anchors; an anchor without a positive adds 0."""
    rows, n_rows = _field_rows(features, labels)
    total = features.sum() * 0.0
    for i in range(n_rows):
        zi, _, si = rows[i]
        others = [j for j in range(n_rows) if j != i]
        if not others:
            continue
        log_denom = _logsumexp([zi @ rows[j][0] / temperature for j in others])
        P = [j for j in others if rows[j][2] == si] + list(drawn[i])
        if P:
            total = total + sum(log_denom - zi @ rows[p][0] / temperature for p in P) / len(P)
    return total / n_rows


def per_positive(features, labels, queue, term):
    """Per anchor ``i`` the mean over its positives ``p`` (same label, not ``i``) of ``term(z_i.z_p, [z_i.z_n for the
    rows n of other labels])``, then the mean over the anchors (an anchor without a positive adds 0)."""
    rows, n_rows = _field_rows(features, labels, queue)
    total = features.sum() * 0.0
    for i in range(n_rows):
        zi, yi, _ = rows[i]
        P = [j for j in range(len(rows)) if j != i and rows[j][1] == yi]
        N = [j for j in range(len(rows)) if rows[j][1] != yi]
        if P:
            total = total + sum(term(zi @ rows[p][0], [zi @ rows[n][0] for n in N]) for p in P) / len(P)
    return total / n_rows


def sincere(features, labels, temperature, margin=0.0, queue=None):
    """SINCERE (``margin`` 0) / epsilon-SupInfoNCE: per positive ``p`` of anchor ``i``,
    ``log(exp(z_i.z_p/tau - eps) + sum_{n: other label} exp(z_i.z_n/tau)) - z_i.z_p/tau``, averaged over the
    positives, then over the anchors."""
    return per_positive(features, labels, queue, lambda sp, sn: _logsumexp(
        [sp / temperature - margin] + [v / temperature for v in sn]) - sp / temperature)


def supdcl(features, labels, temperature, queue=None):
    """Supervised DCL: per positive ``p``, ``log sum_{n: other label} exp(z_i.z_n/tau) - z_i.z_p/tau``, averaged
    over the positives, then over the anchors; an anchor without a positive or a negative adds 0."""
    rows, n_rows = _field_rows(features, labels, queue)
    total = features.sum() * 0.0
    for i in range(n_rows):
        zi, yi, _ = rows[i]
        P = [j for j in range(len(rows)) if j != i and rows[j][1] == yi]
        N = [j for j in range(len(rows)) if rows[j][1] != yi]
        if not P or not N:
            continue
        neg = _logsumexp([zi @ rows[n][0] / temperature for n in N])
        total = total + sum(neg - zi @ rows[p][0] / temperature for p in P) / len(P)
    return total / n_rows


def spread(features, labels, temperature, alpha, queue=None):
    """L_spread: ``(1 - alpha) SupCon + alpha cNCE``; SupCon as :func:`contrastive` with ``tau_base = tau``; cNCE:
    positives the anchor's own other views, denominator the other rows (and valid queue keys) of its label."""
    rows, n_rows = _field_rows(features, labels, queue)
    supcon = contrastive(features, labels, queue=queue, temperature=temperature, base_temperature=temperature)
    total = features.sum() * 0.0
    for i in range(n_rows):
        zi, yi, si = rows[i]
        own = [j for j in range(n_rows) if j != i and rows[j][2] == si]
        same = [j for j in range(len(rows)) if j != i and rows[j][1] == yi]
        if not own:
            continue
        lse = _logsumexp([zi @ rows[a][0] / temperature for a in same])
        total = total + sum(lse - zi @ rows[p][0] / temperature for p in own) / len(own)
    return (1 - alpha) * supcon + alpha * total / n_rows


def logit_adjusted(logits, labels, class_counts, tau):
    """Logit-adjusted cross-entropy: per row ``-log( exp(f_y + tau log pi_y) / sum_c exp(f_c + tau log pi_c) )``,
    ``pi_c = max(n_c, 1) / sum_c max(n_c, 1)``; mean over rows."""
    counts = [max(float(n), 1.0) for n in class_counts]
    prior = [n / sum(counts) for n in counts]
    total = logits.sum() * 0.0
    for row, y in zip(logits, labels):
        shifted = [row[c] + tau * math.log(prior[c]) for c in range(len(prior))]
        total = total + torch.logsumexp(torch.stack(shifted), 0) - shifted[int(y)]
    return total / logits.shape[0]


def bcl(features, labels, prototypes, temperature):
    """BCL's balanced contrastive term: anchor ``i`` (a batch row) against every other row and every prototype
    (``prototypes[c]`` has label ``c``); the denominator averages each class's terms (divided by that class's count
    among them), positives are the others of ``i``'s label (prototype included); mean over positives, then rows."""
    rows, n_rows = _field_rows(features, labels)
    columns = rows + [(prototypes[c], c, None) for c in range(prototypes.shape[0])]
    total = features.sum() * 0.0
    for i in range(n_rows):
        zi, yi, _ = rows[i]
        others = [j for j in range(len(columns)) if j != i]
        count = {}
        for j in others:
            count[columns[j][1]] = count.get(columns[j][1], 0) + 1
        denominator = sum(torch.exp(zi @ columns[j][0] / temperature) / count[columns[j][1]] for j in others)
        P = [j for j in others if columns[j][1] == yi]
        total = total + sum(torch.log(denominator) - zi @ columns[p][0] / temperature for p in P) / len(P)
    return total / n_rows


def paco(features, labels, class_logits, temperature, alpha, beta, gamma, queue=None):
    """PaCo: anchor ``i`` (a batch row) against its ``C`` class entries (``class_logits[i]``), every other row and
    the valid queue keys (``gamma`` times their exponentials in the denominator); positives: its class entry
    (weight ``beta``) and the rows and keys of its label (weight ``alpha`` each); weighted mean of the positives'
    log-probabilities, then mean over the rows."""
    rows, n_rows = _field_rows(features, labels, queue)
    total = features.sum() * 0.0
    for i in range(n_rows):
        zi, yi, _ = rows[i]
        others = [j for j in range(len(rows)) if j != i]
        denominator = sum(torch.exp(class_logits[i, c]) for c in range(class_logits.shape[1]))
        denominator = denominator + gamma * sum((torch.exp(zi @ rows[j][0] / temperature) for j in others),
                                                torch.zeros((), dtype=features.dtype))
        terms = [(beta, class_logits[i, yi])] + [(alpha, zi @ rows[j][0] / temperature)
                                                 for j in others if rows[j][1] == yi]
        weight = sum(w for w, _ in terms)
        total = total + sum(w * (torch.log(denominator) - logit) for w, logit in terms) / weight
    return total / n_rows


def tsc(features, labels, drawn, targets, assignment, temperature, weight):
    """TSC: anchor ``i`` against every other row and every target; positives: its own other views and the rows
    ``drawn[i]`` (weight 1 each) and its class's target ``targets[assignment[y_i]]`` (weight ``weight``); the
    weighted sum of the positives' ``log denominator - logit`` over their count plus one (the target counts as one
    positive whatever its weight, as in the authors' code), then mean over the rows."""
    rows, n_rows = _field_rows(features, labels)
    total = features.sum() * 0.0
    for i in range(n_rows):
        zi, yi, si = rows[i]
        logits = [zi @ rows[j][0] / temperature for j in range(n_rows) if j != i]
        logits += [zi @ targets[c] / temperature for c in range(targets.shape[0])]
        log_den = _logsumexp(logits)
        terms = [(1.0, zi @ rows[p][0] / temperature) for p in range(n_rows) if p != i and rows[p][2] == si]
        terms += [(1.0, zi @ rows[p][0] / temperature) for p in drawn[i]]
        terms += [(weight, zi @ targets[int(assignment[yi])] / temperature)]
        total = total + sum(w * (log_den - logit) for w, logit in terms) / len(terms)
    return total / n_rows


def best_assignment(class_means, present, targets):
    """The class -> target permutation maximizing the summed cosine of the present classes' means with their
    targets, by trying every permutation (small C only)."""
    import itertools
    means = F.normalize(class_means.double(), dim=1)
    cos = means @ targets.double().T
    best = max(itertools.permutations(range(targets.shape[0])),
               key=lambda perm: sum(float(cos[c, t]) for c, t in enumerate(perm) if present[c]))
    return torch.tensor(best)


# ---------------------------------------------------------------- built for noisy labels (docs/FIELD.md)
def symnce(features, labels, temperature, beta, queue=None):
    """SymNCE: SupCon's L_out (tau_base = tau) plus ``beta`` times, per anchor, ``-mean_{p: same label} e_ip +
    mean_{n: other label} e_in``, ``e = exp((z_i.z_j - 1)/tau)`` (an empty mean is 0); mean over the anchors."""
    rows, n_rows = _field_rows(features, labels, queue)
    total = features.sum() * 0.0
    for i in range(n_rows):
        zi, yi, _ = rows[i]
        e = [torch.exp((zi @ rows[j][0] - 1) / temperature) for j in range(len(rows)) if j != i]
        same = [rows[j][1] == yi for j in range(len(rows)) if j != i]
        pos = [v for v, s in zip(e, same) if s]
        neg = [v for v, s in zip(e, same) if not s]
        if neg:
            total = total + sum(neg) / len(neg)
        if pos:
            total = total - sum(pos) / len(pos)
    # SupConLoss gives a lone row (B = 1, one view) 0, queue or not
    supcon = (contrastive(features, labels, queue=queue, temperature=temperature, base_temperature=temperature)
              if n_rows > 1 else total * 0)
    return supcon + beta * total / n_rows


def rince(features, labels, temperature, q, lam, queue=None):
    """Supervised RINCE: per positive ``p`` of anchor ``i``, ``-exp(s_ip)^q / q + (lam (exp(s_ip) + sum_{n: other
    label} exp(s_in)))^q / q``, averaged over the positives, then over the anchors (none: 0)."""
    def term(sp, sn):
        pos = torch.exp(sp / temperature)
        dens = pos + sum((torch.exp(v / temperature) for v in sn), pos * 0)
        return -pos ** q / q + (lam * dens) ** q / q
    return per_positive(features, labels, queue, term)


def selcl(features, labels, ids, partner, temperature, queue=None):
    """Sel-CL's step: ``partner(id_a, label_a, id_b, label_b)`` says whether two samples are confident partners.
    Per sample, with a partner (another sample of the batch, or a valid queue key of another id): per view, the mean
    over its own other views and its partners' rows (and partner keys) of ``log_denom - s``; without: the same over
    its own other views only; ``log_denom`` over every other row and the valid keys. Mean over the views, then the
    samples."""
    bsz, n_views = features.shape[:2]
    rows = [(features[b, v], b) for v in range(n_views) for b in range(bsz)]
    keys = [] if queue is None else [(queue.feat[j].to(features.dtype), int(queue.idx[j]), int(queue.label[j]))
                                     for j in range(queue.feat.shape[0]) if bool(queue.valid[j])]
    total = features.sum() * 0.0
    for b in range(bsz):
        batch_partners = [c for c in range(bsz) if c != b and partner(int(ids[b]), int(labels[b]), int(ids[c]),
                                                                     int(labels[c]))]
        key_partners = [k for k in keys if k[1] != int(ids[b]) and partner(int(ids[b]), int(labels[b]), k[1], k[2])]
        has = bool(batch_partners or key_partners)
        per_view = []
        for v in range(n_views):
            i = v * bsz + b
            zi = rows[i][0]
            logits = [zi @ rows[j][0] / temperature for j in range(len(rows)) if j != i]
            logits += [zi @ k[0] / temperature for k in keys]
            if not logits:
                per_view.append(zi.sum() * 0)
                continue
            log_denom = _logsumexp(logits)
            P = [zi @ rows[j][0] / temperature for j in range(len(rows))
                 if j != i and (rows[j][1] == b or (has and rows[j][1] in batch_partners))]
            if has:
                P += [zi @ k[0] / temperature for k in key_partners]
            per_view.append(sum(log_denom - s for s in P) / len(P) if P else zi.sum() * 0)
        total = total + sum(per_view) / n_views
    return total / bsz


def selcl_selection_authors(feat, labels, k, alpha, beta, n_classes):
    """Sel-CL's selection as the authors' ``pair_selection`` (ShikunLi/Sel-CL, utils/utils_noise.py) computes it,
    one step after another, with two readings: a row's own entry is left out of its neighbours (the code's evident
    intent, which its row-by-column indexing achieves for its first batch only) and ties are broken by the smaller
    index. Returns ``(selected [N] bool, threshold)``."""
    n = feat.shape[0]
    sim = feat.double() @ feat.double().T

    def knn_shares(vote_labels):
        shares = []
        for i in range(n):
            order = sorted((j for j in range(n) if j != i), key=lambda j: (-float(sim[i, j]), j))[:k]
            counts = [0.0] * n_classes
            for j in order:
                counts[int(vote_labels[j])] += 1.0
            shares.append([c / len(order) for c in counts])
        return shares
    first = knn_shares(labels)
    corrected = [max(range(n_classes), key=lambda c: (row[c], -c)) for row in first]
    second = knn_shares(corrected)
    agreement = [float(max(range(n_classes), key=lambda c: (row[c], -c)) == int(labels[i]))
                 for i, row in enumerate(second)]
    discrepancy = [-math.log(min(max(row[int(labels[i])], 1e-2), 1 - 1e-2)) for i, row in enumerate(second)]
    clean_per_class = torch.tensor([sum(a for a, y in zip(agreement, labels) if int(y) == c)
                                    for c in range(n_classes)])
    if alpha == 0.5:
        m = float(torch.median(clean_per_class))
    else:
        m = float(torch.quantile(clean_per_class.double(), alpha))
    selected = [False] * n
    for c in range(n_classes):
        members = [i for i in range(n) if int(labels[i]) == c]
        take = int(min(m, len(members)))
        for i in sorted(members, key=lambda i: (discrepancy[i], i))[:take]:
            selected[i] = True
    pair_sims = [float(sim[i, j]) for i in range(n) for j in range(n)
                 if selected[i] and selected[j] and int(labels[i]) == int(labels[j])]
    import numpy
    threshold = float(numpy.quantile(pair_sims, beta)) if pair_sims else math.inf
    return torch.tensor(selected), threshold


def gce(logits, labels, q):
    """GCE: per row ``(1 - softmax(f)[y]^q) / q``, mean over rows."""
    total = logits.sum() * 0.0
    for row, y in zip(logits, labels):
        p = torch.exp(row[int(y)]) / sum(torch.exp(v) for v in row)
        total = total + (1 - p ** q) / q
    return total / logits.shape[0]


def sce(logits, labels, alpha, beta, clip=-4.0):
    """SCE: per row ``alpha (-log p_y) + beta (-sum_c p_c log y_c)`` with ``log 0 = clip``, mean over rows."""
    total = logits.sum() * 0.0
    for row, y in zip(logits, labels):
        p = [torch.exp(v) / sum(torch.exp(u) for u in row) for v in row]
        rce = -sum(p[c] * (0.0 if c == int(y) else clip) for c in range(len(p)))
        total = total + alpha * -torch.log(p[int(y)]) + beta * rce
    return total / logits.shape[0]
