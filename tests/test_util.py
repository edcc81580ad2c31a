"""util.py: SupContrast's learning-rate schedule and the RNG state round trip."""
import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from util import get_rng_state, lr_at_epoch, set_rng_state, warmup_learning_rate, warmup_target


def sched(**kw):
    base = dict(learning_rate=0.5, lr_decay_rate=0.1, lr_decay_epochs=[70, 80, 90], epochs=100, cosine=False,
                warm=False, warm_epochs=10, warmup_from=0.01)
    return SimpleNamespace(**{**base, **kw})


def test_step_decay():
    opt = sched()
    assert lr_at_epoch(opt, 70) == 0.5 and lr_at_epoch(opt, 71) == pytest.approx(0.05)
    assert lr_at_epoch(opt, 100) == pytest.approx(0.0005)


def test_cosine_to_eta_min():
    opt = sched(cosine=True)
    eta_min = 0.5 * 0.1 ** 3
    assert lr_at_epoch(opt, 100) == pytest.approx(eta_min)
    assert lr_at_epoch(opt, 50) == pytest.approx(eta_min + (0.5 - eta_min) / 2)


def test_warmup_per_iteration():
    opt = sched(cosine=True, warm=True)
    optim = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    warmup_learning_rate(opt, 1, 0, 5, optim)
    assert optim.param_groups[0]['lr'] == pytest.approx(0.01)
    warmup_learning_rate(opt, 10, 5, 5, optim)      # end of epoch 10 reaches the target
    assert optim.param_groups[0]['lr'] == pytest.approx(warmup_target(opt))
    eta_min = 0.5e-3
    assert warmup_target(opt) == pytest.approx(eta_min + (0.5 - eta_min) * (1 + math.cos(math.pi * 10 / 100)) / 2)
    warmup_learning_rate(opt, 11, 0, 5, optim)      # after warm-up: untouched
    assert optim.param_groups[0]['lr'] == pytest.approx(warmup_target(opt))


def test_rng_state_round_trip():
    state = get_rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a
