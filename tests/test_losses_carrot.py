"""CARROT against the plain reference of ``tests/reference.py``, written from docs/CARROT.md."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import reference
from losses import ClassGroups, SupConLoss, flatten_views
from losses_carrot import CARROT, FORMS, grad_balanced_total_loss, pair_quantiles


def carrot(h, y, *qs, form=None):
    """``(R, statistics)`` of one call (the loss reports its statistics in ``last_stats``)."""
    module = CARROT(*qs, form=form)
    return module(h, y), module.last_stats


def rand(n, d, seed=0, dtype=torch.float64):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize('form', FORMS)
@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('qs', [(0.9, 0.1), (0.75, 0.25), (1.0, 0.0)])
def test_matches_reference(seed, qs, form):
    h = rand(14, 6, seed)
    y = torch.randint(0, 3, (14,), generator=torch.Generator().manual_seed(seed))
    x1, x2 = h.clone().requires_grad_(True), h.clone().requires_grad_(True)
    reg, stats = carrot(x1, y, *qs, form=form)
    want, L, U = reference.carrot(x2, y, *qs)
    torch.testing.assert_close(reg.double(), want, rtol=1e-5, atol=1e-7)
    assert float(stats['L']) == pytest.approx(L, rel=1e-5) and float(stats['U']) == pytest.approx(U, rel=1e-5)
    reg.backward()
    want.backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-4, atol=1e-6)   # L, U detached in both


def test_ties_quantized():
    h = torch.tensor([[1., 0], [1, 0], [0, 1], [0, 1], [1, 1], [1, -1], [-1, 0], [1, 0]])
    y = torch.tensor([0, 1, 0, 1, 2, 2, 0, 1])
    reg, stats = carrot(h.double(), y)
    want, L, U = reference.carrot(h, y)
    torch.testing.assert_close(reg.double(), want.double(), rtol=1e-5, atol=1e-7)
    assert float(stats['L']) == pytest.approx(L, abs=1e-6) and float(stats['U']) == pytest.approx(U, abs=1e-6)


@pytest.mark.parametrize('q', [0.0, 0.1, 0.37, 0.5, 0.9, 0.999, 1.0])
def test_pair_quantiles_equal_torch_quantile(q):
    for seed in range(3):
        z = F.normalize(rand(30, 4, seed), dim=1)
        S = (z @ z.T).round(decimals=1)                     # rounding forces ties
        y = torch.randint(0, 4, (30,), generator=torch.Generator().manual_seed(seed))
        neg = y[:, None] != y[None, :]
        got = pair_quantiles(S, neg, (q,))[0]
        torch.testing.assert_close(got, torch.quantile(S[neg], q), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize('bins', [2, 3, 7, 4096])
def test_the_cpu_form_finds_every_bucket_it_needs(bins):
    """The CPU form reads the values of the buckets that hold the order statistics in one pass, as runs of
    consecutive buckets: with few buckets several statistics share one or sit in neighbours (one run), with many
    they sit apart (several runs); every case equals torch.quantile."""
    qs = (0.0, 0.05, 0.3, 0.31, 0.55, 0.8, 0.97, 1.0)
    for seed in range(3):
        z = F.normalize(rand(30, 4, seed), dim=1)
        S = (z @ z.T).clamp(-1, 1)
        y = torch.randint(0, 4, (30,), generator=torch.Generator().manual_seed(seed))
        neg = y[:, None] != y[None, :]
        got = pair_quantiles(S, neg, qs, bins=bins, sync_free=False)
        torch.testing.assert_close(got, torch.quantile(S[neg], torch.tensor(qs, dtype=S.dtype)), rtol=1e-6,
                                   atol=1e-9)


@pytest.mark.parametrize('rows', [1, 7, 40, 128])
def test_the_cpu_form_reads_the_triangle_in_chunks_of_any_size(rows):
    """The CPU form reads the upper triangle a chunk of ``rows`` rows at a time (the last chunk shorter, the diagonal
    block inside each chunk): every chunk size picks the order statistics of a sort of the triangle's valid values.
    Power: the diagonal and the lower triangle hold values below all the others, which a chunk that read them would
    pick as its smallest."""
    from losses_carrot import _bucket_select
    z = F.normalize(rand(40, 4, 3, dtype=torch.float32), dim=1)
    S = (z @ z.T).clamp(-0.9, 1)
    S = torch.where(torch.ones_like(S, dtype=torch.bool).triu(1), S, torch.full_like(S, -1.0))
    y = torch.randint(0, 4, (40,), generator=torch.Generator().manual_seed(3))
    neg = y[:, None] != y[None, :]
    want = S[neg.triu(1)].sort().values
    ranks = [0, 1, 57, 300, want.shape[0] - 1]
    got = _bucket_select(S, neg, ranks, 64, rows)
    assert [float(got[r]) for r in ranks] == [float(want[r]) for r in ranks]


@pytest.mark.parametrize('q', [0.0, 0.1, 0.37, 0.9, 1.0])
def test_the_sorted_form_of_a_compiled_graph_gives_the_same_values(q):
    """``sorted_quantiles`` (the form of fixed shapes a compiled graph uses: the triangle sorted, read at rank tensors
    from ``quantile_plan``) returns the CPU and the accelerator forms' values bit for bit, ties included."""
    from losses_carrot import quantile_plan, sorted_quantiles
    for seed in range(3):
        z = F.normalize(rand(40, 4, seed, dtype=torch.float32), dim=1)
        S = (z @ z.T).clamp(-1, 1)
        S[::3] = S[::3].round(decimals=1)
        S = torch.maximum(S, S.T)
        y = torch.randint(0, 4, (40,), generator=torch.Generator().manual_seed(seed))
        neg = y[:, None] != y[None, :]
        count = int(neg.triu(1).sum())
        lo, hi, frac = zip(*quantile_plan(count, (q, 0.5)))
        got = sorted_quantiles(S, neg, torch.tensor(lo), torch.tensor(hi), torch.tensor(frac, dtype=torch.float32))
        for sync_free in (False, True):
            assert torch.equal(got, pair_quantiles(S, neg, (q, 0.5), count=count, sync_free=sync_free))


@pytest.mark.parametrize('q', [0.0, 0.1, 0.37, 0.9, 1.0])
def test_pair_quantile_forms_select_the_same_values(q):
    """The CPU form (histogram, then kthvalue in a bucket) and the accelerator form (topk on the whole triangle from
    the nearer side, no host read) pick the same order statistics: equal bit for bit, ties included."""
    for seed in range(3):
        z = F.normalize(rand(40, 4, seed, dtype=torch.float32), dim=1)
        S = (z @ z.T).clamp(-1, 1)
        S[::3] = S[::3].round(decimals=1)
        S = torch.maximum(S, S.T)                            # symmetric, with ties
        y = torch.randint(0, 4, (40,), generator=torch.Generator().manual_seed(seed))
        neg = y[:, None] != y[None, :]
        count = int(neg.triu(1).sum())
        cpu_form = pair_quantiles(S, neg, (q, 0.5), count=count, sync_free=False)
        accelerator_form = pair_quantiles(S, neg, (q, 0.5), count=count, sync_free=True)
        assert torch.equal(cpu_form, accelerator_form)


def test_large_batch_beyond_torch_quantile():
    """n = 4200 rows: 17.6 M negative pairs, past the 2**24 elements torch.quantile accepts."""
    z = F.normalize(rand(4200, 8, 1, dtype=torch.float32), dim=1)
    y = torch.arange(4200) % 1000
    neg = y[:, None] != y[None, :]
    S = z @ z.T
    got = pair_quantiles(S, neg, (0.9, 0.1))
    want = np.quantile(S[neg].double().numpy(), [0.9, 0.1])
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-6)
    reg, stats = carrot(z, y)
    assert torch.isfinite(reg) and float(stats['L']) == pytest.approx(float(want[0]), rel=1e-5)


@pytest.mark.parametrize('case', ['one_class', 'all_distinct', 'B1'])
def test_degenerate_batches(case):
    y = {'one_class': torch.zeros(6, dtype=torch.long), 'all_distinct': torch.arange(6),
         'B1': torch.tensor([3])}[case]
    h = rand(len(y), 5).requires_grad_(True)
    reg, stats = carrot(h, y)
    assert reg.item() == 0.0 and all(torch.isfinite(v) for v in stats.values())
    base = h.pow(2).sum()
    total, alpha = grad_balanced_total_loss(base, reg, h)
    total.backward()
    assert alpha.item() == 0.0 and torch.isfinite(h.grad).all()
    torch.testing.assert_close(h.grad, 2 * h.detach())


def _setup(seed=0):
    torch.manual_seed(seed)
    head = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 4)).double()
    h = rand(16, 6, seed).requires_grad_(True)
    y = torch.arange(16) % 3
    return head, h, y


def base_loss(head, h, y):
    f = F.normalize(head(h), dim=1)
    return SupConLoss(0.1)(f[:, None], y)


def test_alpha_is_ratio_of_gradient_norms_and_gradients_are_right():
    head, h, y = _setup()
    reg, _ = carrot(h, y, 0.75, 0.25)
    base = base_loss(head, h, y)
    (gb,) = torch.autograd.grad(base, h, retain_graph=True)
    (gr,) = torch.autograd.grad(reg, h, retain_graph=True)
    total, alpha = grad_balanced_total_loss(base, reg, h, params=head.parameters(), alpha_max=None)
    assert float(gr.norm()) > 0
    assert float(alpha) == pytest.approx(float(gb.norm() / (gr.norm() + 1e-12)), rel=1e-6)
    torch.testing.assert_close(total, base.detach() + alpha * reg.detach())
    total.backward()
    got = [h.grad.clone()] + [p.grad.clone() for p in head.parameters()]
    # the same with a plain backward of base + alpha * reg (alpha a constant)
    head2, h2, _ = _setup()
    head2.load_state_dict(head.state_dict())
    reg2, _ = carrot(h2, y, 0.75, 0.25)
    (base_loss(head2, h2, y) + alpha * reg2).backward()
    want = [h2.grad] + [p.grad for p in head2.parameters()]
    for a, b in zip(got, want):   # CARROT's similarities are float32: float32 tolerance
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_alpha_zero_inside_corridor_and_options():
    # two tight classes far apart: every positive between L and U
    # three classes in orthogonal planes: negatives exactly 0 (L = 0, U = 0.999), positives at 0.6
    h = torch.zeros(6, 6, dtype=torch.float64)
    for c in range(3):
        h[2 * c, 2 * c:2 * c + 2] = torch.tensor([1.0, 0.5])
        h[2 * c + 1, 2 * c:2 * c + 2] = torch.tensor([1.0, -0.5])
    h.requires_grad_(True)
    y = torch.tensor([0, 0, 1, 1, 2, 2])
    reg, stats = carrot(h, y)
    assert float(stats['L']) == 0 and float(stats['U']) == pytest.approx(0.999) and float(reg.detach()) == 0
    assert float(stats['frac_pos_above_U']) == 0 and float(stats['frac_pos_below_L']) == 0
    _, alpha = grad_balanced_total_loss(h.pow(2).sum(), reg, h)
    assert float(alpha) == 0.0
    head, h, y = _setup(1)
    reg, _ = carrot(h, y, 0.75, 0.25)
    _, fixed = grad_balanced_total_loss(base_loss(head, h, y), reg, h, params=head.parameters(), weight=0.3)
    assert float(fixed) == pytest.approx(0.3)
    reg, _ = carrot(h, y, 0.75, 0.25)
    _, capped = grad_balanced_total_loss(base_loss(head, h, y), reg, h, params=head.parameters(), alpha_max=1e-6)
    assert float(capped) == pytest.approx(1e-6)


def test_bf16_autocast_similarities_in_float32():
    h, y = rand(12, 8, 3, dtype=torch.float32), torch.arange(12) % 3
    want, _ = carrot(h, y, 0.75, 0.25)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        got, stats = carrot(h.bfloat16(), y, 0.75, 0.25)
        same, _ = carrot(h, y, 0.75, 0.25)
    assert got.dtype == torch.float32 and stats['L'].dtype == torch.float32
    torch.testing.assert_close(same, want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got, want, rtol=0.1, atol=1e-3)


def test_multiview_label_order():
    """flatten_views flattens [B, V, D] view-major and labels.repeat(V) matches it; the other order differs."""
    feats = torch.randn(5, 2, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 2])
    h, y = flatten_views(feats)[0], labels.repeat(2)
    rows = [feats[b, v] for v in range(2) for b in range(5)]
    assert torch.equal(h, torch.stack(rows)) and y.tolist() == [0, 0, 1, 1, 2] * 2
    good, _ = carrot(h, y, 0.75, 0.25)
    wrong, _ = carrot(h, labels.repeat_interleave(2), 0.75, 0.25)
    want, _, _ = reference.carrot(torch.stack(rows), [int(labels[b]) for v in range(2) for b in range(5)], 0.75, 0.25)
    torch.testing.assert_close(good.double(), want, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(good, wrong)


def test_bad_arguments():
    with pytest.raises(ValueError, match='q_lo < q_hi'):
        CARROT(q_hi=0.1, q_lo=0.9)
    with pytest.raises(ValueError, match='flatten'):
        CARROT()(torch.randn(2, 2, 3), torch.zeros(2))
    with pytest.raises(ValueError, match='labels'):
        CARROT()(torch.randn(4, 3), torch.zeros(3))
    with pytest.raises(ValueError, match='3 labels for 4 rows'):          # a plan of another batch
        CARROT()(torch.randn(4, 3), None, CARROT().host_plan(torch.zeros(3), 'cpu'))


@pytest.mark.parametrize('alpha_max', [1.0, float('inf'), None])
def test_cap_on_the_balanced_ratio(alpha_max):
    """The default cap 1 and no cap (inf or None) against the reference ratio; a fixed weight is not capped."""
    for seed, scale in [(0, 1.0), (1, 1.0), (2, 0.01), (3, 0.01)]:     # ratios about 10 and about 0.1
        head, h, y = _setup(seed)
        reg, _ = carrot(h, y, 0.75, 0.25)
        base = scale * base_loss(head, h, y)
        (gb,) = torch.autograd.grad(base, h, retain_graph=True)
        (gr,) = torch.autograd.grad(reg, h, retain_graph=True)
        ratio = float(gb.norm() / (gr.norm() + 1e-12))
        kw = {} if alpha_max == 1.0 else {'alpha_max': alpha_max}      # 1 is the default
        balance = {}
        _, alpha = grad_balanced_total_loss(base, reg, h, params=head.parameters(), stats=balance, **kw)
        want = min(ratio, alpha_max) if alpha_max is not None else ratio
        assert float(alpha) == pytest.approx(want, rel=1e-6)
        assert float(balance['ratio']) == pytest.approx(ratio, rel=1e-6)          # the uncapped ratio, logged
        assert float(balance['cap_binds']) == float(alpha_max is not None and ratio > alpha_max)
    head, h, y = _setup(0)
    reg, _ = carrot(h, y, 0.75, 0.25)
    balance = {}
    _, fixed = grad_balanced_total_loss(base_loss(head, h, y), reg, h, params=head.parameters(), weight=5.0,
                                        stats=balance)
    assert float(fixed) == 5.0 and float(balance['cap_binds']) == 0 and float(balance['ratio']) > 0


def _fp16_balance_case(dtype, scale=None):
    """A base loss and a regularizer (float32, as the losses compute) of a float16 leaf ``h`` whose gradients are
    ~1e-9 (below float16's smallest number, 6e-8): ``(total, alpha, h, w, h0)``."""
    g = torch.Generator().manual_seed(0)
    h0 = torch.randn(8, 4, generator=g, dtype=torch.float64) * 0.5
    w = torch.randn(8, 4, generator=g, dtype=torch.float64)
    h = h0.to(dtype).requires_grad_(True)
    up = h.double() if dtype == torch.float64 else h.float()             # float16 activations, a float32 loss
    base = (up * w.to(up.dtype)).sum() * 1e-9                            # d base / d h = 1e-9 w
    reg = up.square().sum() * 2e-9                                       # d reg / d h = 4e-9 h
    total, alpha = grad_balanced_total_loss(base, reg, h, alpha_max=None, scale=scale)
    return total, alpha, h, w, h0


def test_fp16_balance_uses_the_loss_scale():
    """``--amp fp16 --carrot``: with the GradScaler's scale the weight and the gradient into ``h`` match float64;
    power: without it (the old form) the float16 gradients underflow and alpha is 0 or noise."""
    scale = torch.tensor(65536.0)
    _, alpha64, _, w, h0 = _fp16_balance_case(torch.float64)
    want_alpha = float(alpha64)
    want_grad = 1e-9 * w + want_alpha * 4e-9 * h0.half().double()
    total, alpha, h, _, _ = _fp16_balance_case(torch.float16, scale)
    assert float(alpha) == pytest.approx(want_alpha, rel=2e-3)
    (total.float() * scale).backward()                                    # the scaler's backward
    got = h.grad.double() / float(scale)
    torch.testing.assert_close(got, want_grad, rtol=2e-2, atol=1e-12)
    assert h.grad.dtype == torch.float16 and bool(torch.isfinite(h.grad).all())
    # the unscaled form: gradients of float16 tensors below 6e-8 are 0
    total, alpha, h, _, _ = _fp16_balance_case(torch.float16, None)
    assert float(alpha) != pytest.approx(want_alpha, rel=0.1)
    (total.float() * scale).backward()
    assert not torch.allclose(h.grad.double() / float(scale), want_grad, rtol=0.1, atol=1e-12)


@pytest.mark.parametrize('counts', [(5, 5, 5, 5), (9, 4, 2, 1, 1), (12, 1, 3)])
def test_the_positives_two_forms_give_the_same_value_gradient_and_statistics(counts):
    """The masked [n, n] pass (an accelerator's form) and the same-class blocks grouped by size (a CPU's, the
    default there) sum the same terms: equal value, gradient and statistics, balanced or long-tailed classes (blocks
    of different sizes, padded). CARROT computes in float32, so the two orders of summation agree to its rounding:
    1e-5 relative on sums of at most a few hundred terms (float32's 6e-8 unit roundoff times the terms, with room).
    Power: a form that drops the blocks of one size group is caught."""
    y = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    y = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(1))]
    h = rand(len(y), 7, seed=len(counts))
    out = {}
    for form in FORMS:
        x = h.clone().requires_grad_(True)
        reg, stats = carrot(x, y, form=form)
        reg.backward()
        out[form] = reg, x.grad, stats
    (r1, g1, s1), (r2, g2, s2) = out['masked'], out['blocks']
    torch.testing.assert_close(r1, r2, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(g1, g2, rtol=1e-4, atol=1e-6)
    for key in s1:
        torch.testing.assert_close(s1[key].double(), s2[key].double(), rtol=1e-5, atol=1e-7)
    assert CARROT().form is None and r1 > 0
    if len(set(counts)) > 1:         # power: one size group's blocks left out
        import losses_carrot
        real = losses_carrot.class_groups

        def fewer(*args):
            groups = real(*args)
            return ClassGroups(groups.blocks[:-1], groups.position, groups.counts)
        losses_carrot.class_groups = fewer
        try:
            wrong = carrot(h, y, form='blocks')[0]
        finally:
            losses_carrot.class_groups = real
        assert not torch.allclose(wrong, r1)
