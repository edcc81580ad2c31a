"""training/memory_queue.py and the losses' queue argument: SupConLoss and RASCALLoss with a memory queue against the
per-row loops of ``tests/reference.py`` (docs/QUEUE.md); the queue's pointer and wrap-around; the momentum update."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import reference
from helpers import unit
from losses import SupConLoss
from losses_rascal import RASCALLoss
from reference import assert_value_and_grad_close
from training.memory_queue import MemoryQueue, MomentumEncoder, QueueView, key_features, sample_keys


def make_queue(k, d, n_valid, n_classes=3, n_ids=40, seed=0):
    """A queue of ``k`` entries, the first ``n_valid`` written (ids in [0, n_ids))."""
    g = torch.Generator().manual_seed(seed)
    valid = torch.arange(k) < n_valid
    return QueueView(unit(k, d, seed=seed + 50), torch.randint(0, n_classes, (k,), generator=g),
                     torch.randint(0, n_ids, (k,), generator=g), valid)


def check(loss_fn, features, labels, queue, weights=None):
    """``loss_fn`` against ``reference.contrastive`` with the queue (RASCAL's: normalized rows and ``weights``)."""
    kw = dict(temperature=0.1, base_temperature=0.07, weights=weights, normalize=weights is not None)
    assert_value_and_grad_close(loss_fn, lambda x: reference.contrastive(x, labels, queue=queue, **kw), features)


@pytest.mark.parametrize('n_valid', [0, 5, 12, 20])          # empty, partly filled, full
@pytest.mark.parametrize('supervised', [True, False])
def test_supcon_with_a_queue_matches_the_reference(n_valid, supervised):
    feats = unit(10, 2, 8, seed=n_valid)
    labels = torch.randint(0, 3, (10,), generator=torch.Generator().manual_seed(n_valid))
    queue = make_queue(20, 8, n_valid)
    loss = SupConLoss(temperature=0.1, base_temperature=0.07)
    y = labels if supervised else None
    check(lambda x: loss(x, y, queue=queue), feats, y, queue)


def test_an_empty_queue_equals_no_queue_exactly():
    feats, labels = unit(12, 2, 8, seed=3, dtype=torch.float32), torch.arange(12) % 4
    empty = make_queue(16, 8, 0)
    for y in (labels, None):
        assert torch.equal(SupConLoss(0.1)(feats, y, queue=empty), SupConLoss(0.1)(feats, y))
    cache_feat, ids = unit(40, 8, seed=4, dtype=torch.float32), torch.randperm(40)[:12]
    a, b = RASCALLoss(40, 8, 0.1, 0.1), RASCALLoss(40, 8, 0.1, 0.1)
    for crit in (a, b):
        crit.cache_feat.copy_(cache_feat)
        crit.cache_valid.fill_(True)
    got, want = a(feats, labels, ids, queue=empty), b(feats, labels, ids)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert torch.equal(a.cache_feat, b.cache_feat)


def rascal_weights(cache_feat, cache_valid, sample_idx, queue):
    """The agreement weights of docs/RASCAL.md over P(r), where a queue positive's sample is its dataset id."""
    return reference.rascal_weights('agreement', cache_feat, cache_valid, sample_idx, queue)


@pytest.mark.parametrize('fill', [1.0, 0.7])      # 0.7: some queue entries' (and samples') cache entries missing
@pytest.mark.parametrize('n_valid', [6, 20])
def test_rascal_with_queue_positives_matches_the_reference(fill, n_valid):
    g = torch.Generator().manual_seed(int(fill * 10) + n_valid)
    feats, labels = unit(8, 2, 8, seed=n_valid), torch.randint(0, 3, (8,), generator=g)
    sample_idx = torch.randperm(40, generator=g)[:8]
    cache_feat, cache_valid = unit(40, 8, seed=9), torch.rand(40, generator=g) < fill
    queue = make_queue(20, 8, n_valid, n_ids=40, seed=n_valid)
    crit = RASCALLoss(40, 8, temperature=0.1, base_temperature=0.07).double()
    crit.cache_feat.copy_(cache_feat)
    crit.cache_valid.copy_(cache_valid)
    dense = crit.weight_matrix(feats, labels, sample_idx, queue=queue)
    assert dense.shape == (16, 36) and dense[:, 16:].sum() > 0          # queue positives carry weight
    check(lambda x: crit(x, labels, sample_idx, queue=queue), feats, labels, queue,
          weights=rascal_weights(cache_feat, cache_valid, sample_idx, queue))
    assert crit.last_stats['ranked_row_rate'] < 1 if fill < 1 else crit.last_stats['ranked_row_rate'] == 1


def test_queue_pointer_wrap_around_and_statistics():
    q = MemoryQueue(5, 3)
    q.enqueue(torch.ones(3, 3), torch.tensor([0, 1, 2]), torch.tensor([10, 11, 12]))
    assert int(q.ptr) == 3 and q.valid.tolist() == [True] * 3 + [False] * 2
    assert float(q.statistics()['queue/fill']) == pytest.approx(0.6)
    q.enqueue(2 * torch.eye(3), torch.tensor([3, 4, 5]), torch.tensor([13, 14, 15]))   # wraps: slots 3, 4, 0
    assert int(q.ptr) == 1 and q.idx.tolist() == [15, 11, 12, 13, 14] and q.label.tolist() == [5, 1, 2, 3, 4]
    torch.testing.assert_close(q.feat[0], torch.tensor([0., 0., 1.]))              # stored normalized
    stats = q.statistics(torch.tensor([1, 1, 9]))
    assert float(stats['queue/pos_per_anchor']) == pytest.approx(2 / 3)
    assert float(stats['queue/key_age']) == pytest.approx((1 + 2 + 2 + 1 + 1) / 5)   # written at steps 0 and 1
    q.enqueue(torch.ones(2, 3), torch.tensor([7, 7]), torch.tensor([1, 2]))          # a partial batch
    assert int(q.ptr) == 3
    state = q.state_dict()
    assert {'feat', 'label', 'idx', 'valid', 'written', 'ptr', 'steps'} <= set(state)
    again = MemoryQueue(5, 3)
    again.load_state_dict(state)
    assert torch.equal(again.feat, q.feat) and int(again.ptr) == 3
    with pytest.raises(ValueError, match='do not fit'):
        q.enqueue(torch.ones(6, 3), torch.zeros(6), torch.zeros(6))


def test_momentum_update_equals_its_formula():
    torch.manual_seed(0)
    query = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    key = MomentumEncoder(query, 0.9)
    assert all(torch.equal(a, b) for a, b in zip(key.model.parameters(), query.parameters()))
    assert not any(p.requires_grad for p in key.model.parameters())
    before = [p.clone() for p in key.model.parameters()]
    with torch.no_grad():
        for p in query.parameters():
            p.add_(1.0)
    query(torch.randn(8, 4))                                   # moves the BatchNorm running statistics
    key.update(query)
    for k, b, q in zip(key.model.parameters(), before, query.parameters()):
        torch.testing.assert_close(k, 0.9 * b + 0.1 * q)
    for k, q in zip(key.model.buffers(), query.buffers()):
        assert torch.equal(k, q)
    with pytest.raises(ValueError):
        MomentumEncoder(query, 1.0)


def test_shuffled_key_features_come_back_in_order():
    """One process: shuffled sub-batches; with BatchNorm in eval mode the result is the plain forward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).eval()
    x = torch.randn(12, 4)
    got = key_features(model, x, 3, lambda m, part: m(part))
    torch.testing.assert_close(got, model(x))
    model.train()        # train mode: each shuffled sub-batch is normalized by its own statistics
    assert not torch.allclose(key_features(model, x, 3, lambda m, part: m(part)), model(x))
    keys = sample_keys(torch.stack([x, -x + 2], 1))
    torch.testing.assert_close(keys, F.normalize((x + (-x + 2)) / 2, dim=1))


def dense_reference_weights(cache_feat, cache_valid, feats, labels, sample_idx, queue):
    """The reference agreement weights as a dense ``[M, M + K]`` matrix (queue entry ``j`` in column ``M + j``)."""
    bsz, n_views = feats.shape[:2]
    z = F.normalize(feats, dim=-1)
    rows = [z[b, v] for v in range(n_views) for b in range(bsz)]
    lab = [int(labels[r % bsz]) for r in range(len(rows))]
    cols = [('row', c) for c in range(len(rows))] + [('queue', j) for j in range(queue.feat.shape[0])
                                                      if bool(queue.valid[j])]
    vec = lambda col: rows[col[1]] if col[0] == 'row' else queue.feat[col[1]].to(feats.dtype)
    weights = rascal_weights(cache_feat, cache_valid, sample_idx, queue)
    dense = torch.zeros(len(rows), len(rows) + queue.feat.shape[0], dtype=torch.float64)
    for r in range(len(rows)):
        P = [c for c in cols if c != ('row', r) and
             (lab[c[1]] if c[0] == 'row' else int(queue.label[c[1]])) == lab[r]]
        for c, w in zip(P, weights(r, P, rows, vec) if P else []):
            dense[r, c[1] if c[0] == 'row' else len(rows) + c[1]] = w
    return dense


def shared_id_case(dtype):
    """A batch of 8 samples (2 views, 2 classes) whose ids 10..17 are all valid in the cache, and a queue
    whose first entries carry batch ids with the batch's labels, at queue positions of the other parity
    than the samples' batch positions: every anchor ties a batch positive with a queue positive."""
    feats, labels = unit(8, 2, 8, seed=1, dtype=dtype), torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
    sample_idx = torch.arange(10, 18)
    cache_feat = unit(40, 8, seed=2, dtype=dtype)
    cache_valid = torch.ones(40, dtype=torch.bool)
    q_idx = torch.tensor([-1, 10, -1, 11, 14, 13, 20, 21, 22, 23])       # ids 10, 11 at odd, 14, 13 at other slots
    q_label = torch.tensor([0, 0, 1, 1, 0, 1, 0, 1, 0, 1])
    queue = QueueView(unit(10, 8, seed=3), q_label, q_idx.clamp(min=0), q_idx >= 0)
    return feats, labels, sample_idx, cache_feat, cache_valid, queue


def one_ulp_off_matmul(monkeypatch):
    """Simulate another machine's BLAS: every 2-D matrix product rounds its odd output columns up by one ulp
    (a kernel whose edge tiles accumulate in another order). One-dimensional dot products, which the
    references use, are untouched."""
    plain = torch.Tensor.__matmul__

    def matmul(a, b):
        out = plain(a, b)
        if a.dim() == 2 and b.dim() == 2 and out.is_floating_point():
            odd = (torch.arange(out.shape[1]) % 2 == 1).to(out.device)
            d = out.detach()
            out = out + torch.where(odd, torch.nextafter(d, torch.full_like(d, float('inf'))) - d, 0)
        return out
    monkeypatch.setattr(torch.Tensor, '__matmul__', matmul)


@pytest.mark.parametrize('other_machine', [False, True])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_positives_sharing_an_id_tie_on_every_machine(dtype, other_machine, monkeypatch):
    """docs/RASCAL.md, "Ties": cached similarities of columns that share a dataset id (both views of a sample,
    the same sample in the batch and in the queue) are one number, whatever the matrix products round.
    Power: the code before this test computed the batch and queue blocks in two products, and it fails here
    with ``other_machine`` (and failed on a fresh machine without it)."""
    feats, labels, sample_idx, cache_feat, cache_valid, queue = shared_id_case(dtype)
    if other_machine:
        one_ulp_off_matmul(monkeypatch)
    crit = RASCALLoss(40, 8, temperature=0.1, base_temperature=0.07).to(dtype)
    crit.cache_feat.copy_(cache_feat)
    crit.cache_valid.copy_(cache_valid)
    z = F.normalize(feats, dim=-1).transpose(0, 1).reshape(16, 8)
    from losses_rascal import Positives
    pos = Positives(z @ z.T, crit.host_plan(labels, sample_idx, 2, queue), crit.cache_feat, crit.cache_valid, queue,
                    z @ queue.feat.to(dtype).T)
    col_ids = torch.cat([sample_idx.repeat(2)[pos.rows], queue.idx[pos.queue_cols]], 1)     # [C, K + Q]
    same_id = (col_ids[:, :, None] == col_ids[:, None, :]) & pos.pairs.any(1)[:, :, None] & pos.pairs.any(1)[:, None, :]
    assert int(same_id.sum()) > 2 * col_ids.numel()       # ties exist between different columns, by construction
    for c in range(same_id.shape[0]):
        for r in range(pos.rows.shape[1]):
            if not bool(pos.present[c, r]):
                continue
            v = pos.cached[c, r]
            a, b = same_id[c].nonzero(as_tuple=True)
            assert torch.equal(v[a], v[b]), 'two columns with one id have different cached similarities'
    want = dense_reference_weights(cache_feat, cache_valid, feats, labels, sample_idx, queue)
    got = crit.weight_matrix(feats, labels, sample_idx, queue=queue).double()
    assert want[:, 16:].sum() > 0
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-12)
    tol = dict(rtol=1e-4, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-6, atol=1e-9)
    x1, x2 = feats.clone().requires_grad_(True), feats.clone().requires_grad_(True)
    got_loss = crit(x1, labels, sample_idx, queue=queue)
    want_loss = reference.contrastive(x2, labels, queue=queue, temperature=0.1, normalize=True,
                                      weights=rascal_weights(cache_feat, cache_valid, sample_idx, queue))
    torch.testing.assert_close(got_loss, want_loss.to(dtype), **tol)
    got_loss.backward()
    want_loss.backward()
    torch.testing.assert_close(x1.grad, x2.grad, **tol)
