"""schedule.py: SupContrast's learning-rate schedule."""
import math

import pytest
import torch

from schedule import Schedule


def sched(**kw):
    base = dict(learning_rate=0.5, lr_decay_rate=0.1, lr_decay_epochs=[70, 80, 90], epochs=100, cosine=False,
                warm=False, warm_epochs=10, warmup_from=0.01)
    return Schedule(**{**base, **kw})


def test_step_decay():
    opt = sched()
    assert opt.lr_at(70) == 0.5 and opt.lr_at(71) == pytest.approx(0.05)
    assert opt.lr_at(100) == pytest.approx(0.0005)


def test_cosine_to_eta_min():
    opt = sched(cosine=True)
    eta_min = 0.5 * 0.1 ** 3
    assert opt.lr_at(100) == pytest.approx(eta_min)
    assert opt.lr_at(50) == pytest.approx(eta_min + (0.5 - eta_min) / 2)


def test_warmup_per_iteration():
    opt = sched(cosine=True, warm=True)
    optim = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    opt.warmup(optim, 1, 0, 5)
    assert optim.param_groups[0]['lr'] == pytest.approx(0.01)
    opt.warmup(optim, 10, 5, 5)      # end of epoch 10 reaches the target
    assert optim.param_groups[0]['lr'] == pytest.approx(opt.warmup_target())
    eta_min = 0.5e-3
    assert opt.warmup_target() == pytest.approx(eta_min + (0.5 - eta_min) * (1 + math.cos(math.pi * 10 / 100)) / 2)
    opt.warmup(optim, 11, 0, 5)      # after warm-up: untouched
    assert optim.param_groups[0]['lr'] == pytest.approx(opt.warmup_target())
