"""losses_proto.py (BCL, PaCo, TSC) against the per-row loops of tests/reference.py (values and gradients, float64,
for the features, prototypes and class logits), on random batches and on hand-built edge cases; each loss module
against its parts; TSC's targets and its matching (against brute force)."""
import functools

import pytest
import torch
import torch.nn.functional as F

import reference
from helpers import LOSS_CASES, loss_case, loss_queue, unit
from losses_field import kcl_positives
from losses_proto import BCLLoss, PaCoLoss, TSCLoss, assign_targets, bcl_loss, paco_loss, tsc_loss, uniform_targets

TAU = 0.5
N_CLASSES = 10
CASES = LOSS_CASES


def case(name, seed=0, d=6):
    """A loss case of tests/helpers.py with ``N_CLASSES`` unit prototypes."""
    return (*loss_case(name, seed, d), unit(N_CLASSES, d, seed=seed + 1))


@pytest.mark.parametrize('name', list(CASES))
def test_bcl_term_matches_the_loop(name):
    feats, labels, protos = case(name)
    reference.assert_value_and_grad_close(lambda f: bcl_loss(f, labels, protos, TAU),
                                          lambda f: reference.bcl(f, labels, protos, TAU), feats)
    reference.assert_value_and_grad_close(lambda p: bcl_loss(feats, labels, p, TAU),
                                          lambda p: reference.bcl(feats, labels, p, TAU), protos)


def test_bcl_term_by_hand_and_its_power():
    """One sample of class 0 (two views) and prototypes of classes 0 and 1: anchor i's others are its other view
    (class 0), p_0 (class 0) and p_1 (class 1): the denominator is (e^{s_v} + e^{s_0}) / 2 + e^{s_1}. And the loss
    is not SupCon's with the prototypes as rows (class-averaging changes it)."""
    feats, protos = unit(1, 2, 4, seed=3), unit(2, 4, seed=4)
    labels = torch.tensor([0])
    z = [feats[0, 0], feats[0, 1]]
    want = 0.0
    for i in range(2):
        s_v, s_0, s_1 = (z[i] @ z[1 - i]) / TAU, (z[i] @ protos[0]) / TAU, (z[i] @ protos[1]) / TAU
        log_den = torch.log((torch.exp(s_v) + torch.exp(s_0)) / 2 + torch.exp(s_1))
        want = want + ((log_den - s_v) + (log_den - s_0)) / 2 / 2
    torch.testing.assert_close(bcl_loss(feats, labels, protos, TAU), want)
    unaveraged = reference.contrastive(torch.cat([feats, protos[:, None].expand(2, 2, 4)]), torch.tensor([0, 0, 1]),
                                       temperature=TAU, base_temperature=TAU)
    assert not torch.isclose(bcl_loss(feats, labels, protos, TAU), unaveraged)


@pytest.mark.parametrize('classifier', ['cosine', 'linear'])
def test_bcl_loss_is_weighted_logit_adjusted_ce_plus_the_term_and_trains_its_parameters(classifier):
    """BCLLoss = ce_weight * LA-CE(f(h)) on every view + bcl_weight * the term over normalize(g(W)), ``f`` the
    cosine classifier ``s * cos(h, w_c)`` (written here per row and class) or ``W h + b``; its classifier
    and prototype head get gradients (they are what the optimizer adds to the model's)."""
    torch.manual_seed(0)
    counts = [40, 20, 10, 5, 1]
    loss = BCLLoss(counts, enc_dim=8, feat_dim=6, temperature=TAU, ce_weight=2.0, bcl_weight=0.6,
                   classifier=classifier).double()
    feats, labels, _ = case('random')
    h = torch.randn(2 * 12, 8, dtype=torch.float64)
    got = loss(feats, labels, h_enc=h)
    w = loss.classifier.weight
    protos = F.normalize(loss.prototype_head(w), dim=1)
    if classifier == 'cosine':
        logits = torch.stack([torch.stack([30.0 * (h[i] @ w[c]) / (h[i].norm() * w[c].norm())
                                           for c in range(len(counts))]) for i in range(h.shape[0])])
    else:
        logits = h @ w.T + loss.classifier.bias
    want = (2.0 * reference.logit_adjusted(logits, labels.repeat(2), counts, 1.0)
            + 0.6 * reference.bcl(feats, labels, protos, TAU))
    torch.testing.assert_close(got, want)
    got.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in loss.parameters())
    assert set(loss.last_stats) == {'ce', 'contrastive'}
    with pytest.raises(ValueError, match='encoder features'):
        loss(feats, labels)
    with pytest.raises(ValueError, match='classifier in'):
        BCLLoss(counts, 8, 6, classifier='normed')


def test_bcls_cosine_classifier_keeps_its_logits_bounded_where_a_linear_one_explodes():
    """Why BCL collapsed at the field's recipe (ResNet-18, lr 0.2; docs/FIELD.md, "BCL"): one SGD step moves a linear
    classifier's logits by about lr * |h|^2, hundreds for a ResNet-18's 512 non-negative features, so its
    cross-entropy explodes; the authors' cosine classifier's logits stay within its scale, 30. Three steps of the
    loss's own parameters at lr 0.2 on fixed features of that size."""
    g = torch.Generator().manual_seed(0)
    h = 3 * torch.randn(64, 512, generator=g).relu()                       # |h| about 48, as measured
    feats = F.normalize(torch.randn(32, 2, 16, generator=g), dim=-1)
    labels = torch.arange(32) % 10
    largest = {}
    for classifier in ('cosine', 'linear'):
        torch.manual_seed(0)
        loss = BCLLoss([10] * 10, enc_dim=512, feat_dim=16, classifier=classifier)
        optimizer = torch.optim.SGD(loss.parameters(), lr=0.2, momentum=0.9)
        for _ in range(3):
            optimizer.zero_grad()
            loss(feats, labels, h_enc=h).backward()
            optimizer.step()
        largest[classifier] = loss.classifier(h).abs().max().item()
    assert largest['cosine'] <= 30 + 1e-4 and largest['linear'] > 100, largest


# ---------------------------------------------------------------- PaCo
@pytest.mark.parametrize('name', list(CASES))
@pytest.mark.parametrize('alpha, beta, gamma', [(0.01, 1.0, 1.0), (0.5, 2.0, 0.5), (1.0, 1.0, 0.0)])
@pytest.mark.parametrize('with_queue', [False, True])
def test_paco_matches_the_loop(name, alpha, beta, gamma, with_queue):
    feats, labels = loss_case(name)
    logits = torch.randn(feats.shape[0] * feats.shape[1], N_CLASSES, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(2))
    queue = loss_queue() if with_queue else None
    args = (TAU, alpha, beta, gamma, queue)
    reference.assert_value_and_grad_close(lambda f: paco_loss(f, labels, logits, *args),
                                          lambda f: reference.paco(f, labels, logits, *args), feats)
    reference.assert_value_and_grad_close(lambda c: paco_loss(feats, labels, c, *args),
                                          lambda c: reference.paco(feats, labels, c, *args), logits)


def test_paco_by_hand_and_its_parts():
    """One sample of class 1 (two views), 2 classes, no queue: row i's denominator is e^{l_i0} + e^{l_i1} +
    gamma e^{s}, its positives its class entry (beta) and its other view (alpha). Power: the class entries and
    gamma change the value."""
    feats, labels = unit(1, 2, 4, seed=5), torch.tensor([1])
    logits = torch.tensor([[0.3, -0.2], [1.0, 0.5]], dtype=torch.float64)
    s = feats[0, 0] @ feats[0, 1] / TAU
    want = 0.0
    for i in range(2):
        log_den = torch.log(torch.exp(logits[i]).sum() + 0.5 * torch.exp(s))
        want = want + (log_den - (2.0 * logits[i, 1] + 0.3 * s) / 2.3) / 2
    torch.testing.assert_close(paco_loss(feats, labels, logits, TAU, 0.3, 2.0, 0.5), want)
    assert not torch.isclose(paco_loss(feats, labels, logits, TAU, 0.3, 2.0, 1.0), want)
    assert not torch.isclose(paco_loss(feats, labels, logits.flip(1), TAU, 0.3, 2.0, 0.5), want)


@pytest.mark.parametrize('prior', [True, False], ids=['PaCo', 'GPaCo'])
def test_paco_loss_module_adds_the_prior_and_trains_its_classifier(prior):
    """PaCoLoss = paco_loss over the classifier's logits of the normalized encoder features, plus log pi for
    PaCo (not GPaCo); the classifier gets gradients; bad arguments are refused."""
    torch.manual_seed(0)
    counts = [40, 20, 10, 5, 1, 0, 3, 3, 3, 3]
    loss = PaCoLoss(counts, enc_dim=8, temperature=TAU, alpha=0.2, beta=1.0, gamma=1.0, prior=prior).double()
    feats, labels = loss_case('random')
    h = torch.randn(2 * 12, 8, dtype=torch.float64)
    queue = loss_queue()
    got = loss(feats, labels, h_enc=h, queue=queue)
    pi = torch.tensor(counts, dtype=torch.float64).clamp(min=1)
    logits = loss.classifier(F.normalize(h, dim=1)) + (torch.log(pi / pi.sum()) if prior else 0)
    torch.testing.assert_close(got, reference.paco(feats, labels, logits, TAU, 0.2, 1.0, 1.0, queue))
    got.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in loss.parameters())
    assert set(loss.last_stats) == {'class_acc'}
    with pytest.raises(ValueError, match='encoder features'):
        loss(feats, labels)
    for bad in (dict(beta=0.0), dict(alpha=-1.0), dict(gamma=float('inf')), dict(temperature=0.0)):
        with pytest.raises(ValueError):
            PaCoLoss(counts, 8, **bad)


# ---------------------------------------------------------------- TSC
def drawn_lists(chosen, valid):
    return [[int(c) for c, ok in zip(row, oks) if ok] for row, oks in zip(chosen, valid)]


@pytest.mark.parametrize('name', list(CASES))
@pytest.mark.parametrize('k', [0, 2])
@pytest.mark.parametrize('weight', [0.0, 1.0, 2.5])
def test_tsc_matches_the_loop(name, k, weight):
    feats, labels = loss_case(name)
    chosen, valid = kcl_positives(labels, feats.shape[1], k, torch.Generator().manual_seed(1))
    targets = unit(N_CLASSES, 6, seed=9)
    assignment = torch.randperm(N_CLASSES, generator=torch.Generator().manual_seed(3))
    args = (targets, assignment, TAU, weight)
    reference.assert_value_and_grad_close(lambda f: tsc_loss(f, labels, chosen, valid, *args),
                                          lambda f: reference.tsc(f, labels, drawn_lists(chosen, valid), *args),
                                          feats)


@pytest.mark.parametrize('n_classes, dim', [(2, 4), (5, 8), (10, 16), (3, 2), (4, 3), (12, 3)])
def test_targets_are_a_regular_simplex_and_seeded(n_classes, dim):
    """With C <= D + 1 the targets are the regular simplex (every pair at cosine -1/(C-1)); beyond it (12 points on
    the 2-sphere) the optimization finds the icosahedron (nearest pairs at cosine 1/sqrt(5)); a seed gives the
    same targets, another seed others (2,000 of the 10,000 steps: the icosahedron is reached by then)."""
    targets = functools.partial(uniform_targets, n_classes, dim, steps=2000)
    u = targets(seed=4)
    cos = (u @ u.T)[~torch.eye(n_classes, dtype=torch.bool)]
    if n_classes <= dim + 1:
        torch.testing.assert_close(cos, torch.full_like(cos, -1 / (n_classes - 1)), atol=1e-5, rtol=0)
    else:
        assert float(cos.max()) < 1 / 5 ** 0.5 + 1e-3
    torch.testing.assert_close(u.norm(dim=1), torch.ones(n_classes))
    assert torch.equal(u, targets(seed=4))
    assert not torch.equal(u, targets(seed=5))


def test_targets_beyond_the_simplex_as_the_authors_optimize_them():
    """With C >> D the targets come from the authors' Adam steps (lr 1e-3, T = 0.07; 10,000 by default, 2,000
    here): 64 classes in 6 dimensions end far more spread than they start and than after 100 steps (the power
    check: a short optimization, as the pre-issue-41 one was at large C, leaves them closer). The figures at
    C = 1000, D = 128 are in docs/FIELD.md, "TSC"."""
    from losses_proto import target_spread
    start = F.normalize(torch.randn(64, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64), dim=1)
    done, early = uniform_targets(64, 6, seed=0, steps=2000), uniform_targets(64, 6, seed=0, steps=100)
    (cos_start, energy_start), (cos_done, energy_done) = target_spread(start), target_spread(done)
    cos_early, energy_early = target_spread(early)
    assert energy_done < energy_early - 1 < energy_start - 2
    assert cos_done < 0.6 < 0.75 < cos_early < cos_start


@pytest.mark.parametrize('seed', range(4))
def test_the_assignment_is_the_best_matching(seed):
    """Hungarian matching = the best permutation by brute force (5 classes, one absent); power: the identity is
    not always the best."""
    g = torch.Generator().manual_seed(seed)
    means, targets = torch.randn(5, 6, generator=g, dtype=torch.float64), unit(5, 6, seed=seed)
    present = torch.tensor([True, True, False, True, True])
    got = assign_targets(means, present, targets)
    want = reference.best_assignment(means, present, targets)
    cos = F.normalize(means, dim=1) @ targets.double().T
    score = lambda perm: sum(float(cos[c, t]) for c in range(5) if present[c] for t in [int(perm[c])])
    assert sorted(got.tolist()) == list(range(5)) and score(got) == pytest.approx(score(want))
    assert score(got) >= score(torch.arange(5)) - 1e-12


def test_tsc_module_sums_classes_reassigns_each_epoch_and_resumes():
    """TSCLoss = tsc_loss with its targets and assignment; it sums each class's projections over an epoch,
    end_epoch() re-assigns (the best matching of those means) and clears the sums; its state (targets,
    assignment, sums, draw count) round-trips through state_dict."""
    loss = TSCLoss(N_CLASSES, 16, k=2, temperature=TAU, weight=1.0, seed=3)
    feats, labels = loss_case('random', d=16)
    got = loss(feats, labels)
    chosen, valid = kcl_positives(labels, 2, 2, loss.generator(0))
    torch.testing.assert_close(got, tsc_loss(feats, labels, chosen, valid, loss.targets, loss.assignment, TAU, 1.0))
    rows = labels.repeat(2)
    z = feats.transpose(0, 1).reshape(-1, 16)
    for c in range(N_CLASSES):
        torch.testing.assert_close(loss.class_sums[c], (z[rows == c].sum(0) if (rows == c).any() else
                                   torch.zeros(16, dtype=torch.float64)).float())
    clone = TSCLoss(N_CLASSES, 16, k=2, temperature=TAU, seed=99)
    clone.load_state_dict(loss.state_dict())
    assert torch.equal(clone.targets, loss.targets) and clone.calls == 1
    want = assign_targets(loss.class_sums, loss.class_counts > 0, loss.targets)
    loss.end_epoch()
    assert torch.equal(loss.assignment, want) and not loss.class_sums.any() and not loss.class_counts.any()
    perm = torch.randperm(N_CLASSES, generator=torch.Generator().manual_seed(1))      # power: means on targets
    assert not torch.equal(perm, torch.arange(N_CLASSES))
    loss.class_sums.copy_(3 * loss.targets[perm])
    loss.class_counts.fill_(3)
    loss.end_epoch()
    assert torch.equal(loss.assignment, perm)
    assert 'target_cos' in loss.last_stats
    with pytest.raises(ValueError):
        TSCLoss(N_CLASSES, 16, weight=-1.0)


def test_tsc_assign_step_follows_moving_average_centroids():
    """``assign='step'`` (the authors' schedule): each step's loss uses the assignment made after the step before;
    a class's centroid is its first batch mean, then 0.9 * centroid + 0.1 * batch mean; the matching against the
    centroids is made after every step; end_epoch leaves it; the state round-trips. Power: the first re-assignment
    is not the identity."""
    loss = TSCLoss(N_CLASSES, 16, k=2, temperature=TAU, seed=3, assign='step', ema=0.9)
    z_of = lambda f: f.transpose(0, 1).reshape(-1, 16).float()
    means = []
    for seed in range(2):
        feats, labels = loss_case('random', seed=seed, d=16)
        before = loss.assignment.clone()
        chosen, valid = kcl_positives(labels, 2, 2, loss.generator(loss.calls))
        got = loss(feats, labels)
        torch.testing.assert_close(got, tsc_loss(feats, labels, chosen, valid, loss.targets, before, TAU, 1.0))
        rows = labels.repeat(2)
        means.append({c: z_of(feats)[rows == c].mean(0) for c in range(N_CLASSES) if (rows == c).any()})
        assert torch.equal(loss.assignment, assign_targets(loss.centroids, loss.seen, loss.targets))
        if seed == 0:
            assert not torch.equal(loss.assignment, before)
    for c in range(N_CLASSES):
        first, second = means[0].get(c), means[1].get(c)
        want = (0.9 * first + 0.1 * second if first is not None and second is not None else
                first if first is not None else second)
        if want is not None:
            torch.testing.assert_close(loss.centroids[c], want, rtol=1e-5, atol=1e-6)
    kept = loss.assignment.clone()
    loss.end_epoch()
    assert torch.equal(loss.assignment, kept)
    clone = TSCLoss(N_CLASSES, 16, k=2, temperature=TAU, seed=3, assign='step')
    clone.load_state_dict(loss.state_dict())
    assert torch.equal(clone.centroids, loss.centroids) and torch.equal(clone.seen, loss.seen)
    with pytest.raises(ValueError):
        TSCLoss(N_CLASSES, 16, assign='sometimes')


def test_the_terms_are_float32_under_autocast():
    """bcl_loss, paco_loss and tsc_loss give their float32 value inside a bfloat16 autocast region."""
    feats, labels = loss_case('random', d=16)
    feats = feats.float()
    protos, logits = unit(N_CLASSES, 16, seed=4).float(), torch.randn(24, N_CLASSES)
    chosen, valid = kcl_positives(labels, 2, 2, torch.Generator().manual_seed(0))
    calls = [lambda: bcl_loss(feats, labels, protos, TAU), lambda: paco_loss(feats, labels, logits, TAU),
             lambda: tsc_loss(feats, labels, chosen, valid, protos, torch.arange(N_CLASSES), TAU)]
    for call in calls:
        plain = call()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            under = call()
        assert under.dtype == torch.float32 and torch.equal(under, plain)
