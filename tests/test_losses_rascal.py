"""RASCALLoss against the per-row reference of ``tests/reference.py``, written from docs/RASCAL.md."""
import math

import pytest
import torch
import torch.nn.functional as F

import reference
from helpers import unit
from losses import SupConLoss
from losses_rascal import RASCALLoss, fractional_rank_desc
from reference import assert_value_and_grad_close


# ------------------------------------------------------------------ helpers
def quantized(*shape, seed=0, nonzeros=4):
    """Unit vectors with `nonzeros` entries of +-0.5: exact dot products, many ties."""
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    n = math.prod(shape[:-1])
    out = torch.zeros(n, d, dtype=torch.float64)
    for i in range(n):
        support = torch.randperm(d, generator=g)[:nonzeros]
        out[i, support] = torch.where(torch.rand(nonzeros, generator=g) < 0.5, -0.5, 0.5).double()
    return out.reshape(*shape)


def make_loss(n, d, weighting, cache_feat=None, cache_valid=None, tau=0.1, tau_base=0.07):
    loss = RASCALLoss(n, d, temperature=tau, base_temperature=tau_base, weighting=weighting).double()
    if cache_feat is not None:
        loss.cache_feat.copy_(cache_feat)
        loss.cache_valid.copy_(cache_valid)
    return loss


def check(features, labels, sample_idx, n, cache_feat, cache_valid, weighting, **kw):
    d = features.reshape(features.shape[0], features.shape[1], -1).shape[-1]
    crit = make_loss(n, d, weighting, cache_feat, cache_valid, **kw)
    _, want_feat, want_valid = reference.rascal(features, labels, sample_idx, cache_feat, cache_valid,
                                                weighting=weighting, **kw)
    got = assert_value_and_grad_close(lambda x: crit(x, labels, sample_idx),
                                      lambda x: reference.rascal(x, labels, sample_idx, cache_feat, cache_valid,
                                                                 weighting=weighting, **kw)[0], features)
    torch.testing.assert_close(crit.cache_feat, want_feat, rtol=1e-6, atol=1e-9)
    assert torch.equal(crit.cache_valid, want_valid)
    return crit, got


def random_case(bsz, n_views, n_classes, n=40, d=8, seed=0, fill=1.0, quant=False):
    g = torch.Generator().manual_seed(seed)
    feats = quantized(bsz, n_views, d, seed=seed) if quant else unit(bsz, n_views, d, seed=seed)
    labels = torch.randint(0, n_classes, (bsz,), generator=g)
    sample_idx = torch.randperm(n, generator=g)[:bsz]
    cache = quantized(n, d, seed=seed + 1) if quant else unit(n, d, seed=seed + 1)
    valid = torch.rand(n, generator=g) < fill
    return feats, labels, sample_idx, n, cache, valid


# ------------------------------------------------------------------ equality with the reference
@pytest.mark.parametrize('weighting', ['agreement', 'current', 'uniform'])
@pytest.mark.parametrize('n_views', [1, 2, 3])
def test_random_batches_warm_cache(weighting, n_views):
    check(*random_case(10, n_views, 3, seed=n_views), weighting=weighting)


@pytest.mark.parametrize('weighting', ['agreement', 'current', 'uniform'])
def test_quantized_features_and_cache_force_ties(weighting):
    for seed in range(3):
        check(*random_case(12, 2, 2, seed=seed, quant=True, d=16), weighting=weighting)


@pytest.mark.parametrize('weighting', ['agreement', 'current'])
def test_partly_filled_cache_falls_back(weighting):
    case = random_case(14, 2, 3, seed=5, fill=0.6)
    crit, _ = check(*case, weighting=weighting)
    if weighting == 'agreement':
        assert 0 < crit.last_stats['ranked_row_rate'] < 1


@pytest.mark.parametrize('weighting', ['agreement', 'current', 'uniform'])
def test_singletons_b1_and_three_views(weighting):
    feats, _, idx, n, cache, valid = random_case(6, 3, 2, seed=7)
    check(feats, torch.arange(6), idx, n, cache, valid, weighting=weighting)            # all singletons
    check(feats[:1], torch.tensor([1]), idx[:1], n, cache, valid, weighting=weighting)  # B = 1, V = 3
    crit, loss = check(feats[:1, :1], torch.tensor([1]), idx[:1], n, cache, valid, weighting=weighting)
    assert loss.item() == 0.0                                                            # B = 1, V = 1


def test_empty_cache_first_call_is_supcon():
    feats, labels, idx, n, _, _ = random_case(10, 2, 3, seed=9)
    crit = RASCALLoss(n, 8, temperature=0.1, base_temperature=0.07).double()
    got = crit(feats, labels, idx)
    torch.testing.assert_close(got, SupConLoss(0.1, base_temperature=0.07)(feats, labels))
    assert crit.last_stats['cache_hit_rate'] == 0 and crit.last_stats['ranked_row_rate'] == 0


@pytest.mark.parametrize('n_views', [1, 2, 3])
def test_uniform_equals_supcon(n_views):
    feats, labels, idx, n, cache, valid = random_case(16, n_views, 4, seed=11)
    got = make_loss(n, 8, 'uniform', cache, valid, tau=0.2, tau_base=0.2)(feats, labels, idx)
    torch.testing.assert_close(got, SupConLoss(0.2, 'all', 0.2)(feats, labels), rtol=1e-6, atol=1e-9)


def test_weights_carry_no_gradient():
    """The gradient equals that of sum W * log_prob with W taken as constants."""
    feats, labels, idx, n, cache, valid = random_case(10, 2, 2, seed=13)
    x = feats.clone().requires_grad_(True)
    crit = make_loss(n, 8, 'agreement', cache, valid)
    crit(x, labels, idx).backward()
    # recompute with W read from the implementation and frozen
    W = make_loss(n, 8, 'agreement', cache, valid).weight_matrix(feats, labels, idx)
    eye = torch.eye(20, dtype=torch.bool)
    y = feats.clone().requires_grad_(True)
    zy = F.normalize(y.transpose(0, 1).reshape(20, 8), dim=1)
    logits = (zy @ zy.T / 0.1).masked_fill(eye, -float('inf'))
    log_prob = (logits - torch.logsumexp(logits, 1, keepdim=True)).masked_fill(eye, 0)
    (-(0.1 / 0.07) * (W * log_prob).sum() / 20).backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------------ cache semantics
def test_cache_used_before_update_and_written_after():
    feats, labels, idx, n, cache, valid = random_case(8, 2, 2, seed=17)
    crit = make_loss(n, 8, 'agreement', cache, valid)
    before = crit.cache_feat.clone()
    want, _, _ = reference.rascal(feats, labels, idx, before, valid)
    torch.testing.assert_close(crit(feats, labels, idx), want)     # weights from the old cache
    expected = F.normalize(F.normalize(feats, dim=-1).mean(1), dim=1)
    torch.testing.assert_close(crit.cache_feat[idx], expected)
    assert crit.cache_valid[idx].all()


def test_duplicate_ids_are_deterministic():
    feats = unit(6, 2, 8, seed=19)
    labels = torch.tensor([0, 1, 0, 1, 0, 1])
    idx = torch.tensor([3, 5, 3, 7, 3, 5])
    results = []
    for perm in (torch.arange(6), torch.tensor([4, 1, 0, 3, 2, 5])):
        crit = make_loss(10, 8, 'agreement')
        crit(feats[perm], labels[perm], idx[perm])
        results.append(crit.cache_feat.clone())
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=1e-12)
    z = F.normalize(feats, dim=-1).mean(1)
    torch.testing.assert_close(results[0][3], F.normalize(z[[0, 2, 4]].mean(0), dim=0))


def test_view_alignment():
    """Labels and ids must be repeated view-major (repeat), like the rows; repeat_interleave is wrong."""
    feats, _, idx, n, cache, valid = random_case(3, 2, 2, seed=23)
    labels = torch.tensor([0, 0, 1])
    crit = make_loss(n, 8, 'agreement', cache, valid)
    got = crit(feats, labels, idx)
    want, _, _ = reference.rascal(feats, labels, idx, cache, valid)
    torch.testing.assert_close(got, want)
    # the same batch laid out sample-major gives a different loss: the test above has power
    wrong = feats.reshape(6, 8)[torch.tensor([0, 3, 1, 4, 2, 5])].reshape(2, 3, 8).transpose(0, 1)
    other = make_loss(n, 8, 'agreement', cache, valid)(wrong, labels, idx)
    assert not torch.allclose(got, other)


# ------------------------------------------------------------------ statistics
def window(pos, d=8):
    v = torch.zeros(d, dtype=torch.float64)
    v[pos:pos + 4] = 0.5
    return v


def test_statistics_on_hand_built_batch():
    """4 samples of one class on a line at 0,1,2,3 (dot = (4 - distance)/4); cache at 0,2,1,3."""
    feats = torch.stack([window(p) for p in (0, 1, 2, 3)])[:, None]
    cache = torch.stack([window(p) for p in (0, 2, 1, 3)])
    crit = make_loss(4, 8, 'agreement', cache, torch.ones(4, dtype=torch.bool))
    crit(feats, torch.zeros(4, dtype=torch.long), torch.arange(4))
    s = {k: float(v) for k, v in crit.last_stats.items()}
    # row weights by hand: [1/4, 1/4, 1/2], [1/6, 2/3, 1/6], [1/6, 2/3, 1/6], [1/2, 1/4, 1/4]
    drifts = torch.tensor([.5, .5, 0, .75, 0, .75, .75, 0, .75, 0, .5, .5], dtype=torch.float64)
    ent = lambda w: -sum(x * math.log(x) for x in w)
    assert s['avg_pos_per_anchor'] == 3 and s['cache_hit_rate'] == 1 and s['ranked_row_rate'] == 1
    assert s['rank_drift_mean'] == pytest.approx(5 / 12)
    assert s['rank_drift_std'] == pytest.approx(drifts.std(correction=0).item())
    assert s['w_entropy'] == pytest.approx((2 * ent([.25, .25, .5]) + 2 * ent([1 / 6, 2 / 3, 1 / 6])) / 4)
    assert int(crit.last_hists['rank_drift'].sum()) == 12


def test_fractional_rank_helper():
    v = torch.tensor([[0.3, 0.9, 0.3, 0.1, 5.0]])
    valid = torch.tensor([[True, True, True, True, False]])
    assert fractional_rank_desc(v, valid)[0, :4].tolist() == [1.5, 0.0, 1.5, 3.0]
    # against the reference on rows with many ties (values from {0, 1, 2})
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 3, (20, 7), generator=g).double()
    got = fractional_rank_desc(rows, torch.ones_like(rows, dtype=torch.bool))
    assert got.tolist() == [reference.frac_rank_desc(r.tolist()) for r in rows]


# ------------------------------------------------------------------ dtypes, errors, state
def test_bf16_autocast_computes_in_float32():
    feats, labels, idx, n, cache, valid = random_case(12, 2, 3, seed=29)
    want = make_loss(n, 8, 'agreement', cache, valid).float()(feats.float(), labels, idx)
    crit = make_loss(n, 8, 'agreement', cache, valid).float()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        got = crit(feats.float(), labels, idx)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match='weighting'):
        RASCALLoss(10, 4, weighting='random')
    with pytest.raises(ValueError, match='> 0'):
        RASCALLoss(10, 4, temperature=0)
    crit = RASCALLoss(10, 4)
    with pytest.raises(ValueError, match='feat_dim'):
        crit(torch.randn(3, 2, 5), torch.zeros(3), torch.arange(3))
    with pytest.raises(ValueError, match=r'\[0, 10\)'):
        crit(torch.randn(3, 2, 4), torch.zeros(3), torch.tensor([0, 1, 10]))
    with pytest.raises(ValueError, match='one entry per sample'):
        crit(torch.randn(3, 2, 4), torch.zeros(2), torch.arange(3))
    with pytest.raises(ValueError, match='at least 3'):
        crit(torch.randn(3, 4), torch.zeros(3), torch.arange(3))


def test_persistent_cache_in_state_dict():
    assert 'cache_feat' not in RASCALLoss(5, 4).state_dict()
    a = RASCALLoss(5, 4, persistent_cache=True)
    a(unit(3, 2, 4, dtype=torch.float32), torch.zeros(3), torch.arange(3))
    b = RASCALLoss(5, 4, persistent_cache=True)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.cache_feat, b.cache_feat) and b.cache_valid[:3].all()
    with pytest.raises(ValueError, match='dataset or --feat_dim'):
        RASCALLoss(6, 4, persistent_cache=True).load_state_dict(a.state_dict())
