"""CARROT in a training step (``--carrot``; definition: ``docs/CARROT.md``): :class:`CarrotTerm`, the regularizer with
the settings of its weight, which ``steps.Pretraining`` and ``steps.CETraining`` add to their loss, and its flags."""
from core.flags import Feature, UserError, check
from losses_carrot import CARROT, grad_balanced_total_loss
from methods import METHODS
from runtime.device import traces_grad
from runtime.distributed import all_reduce_sum, gather_labels, gather_with_grad


class CarrotTerm:
    """``--carrot``: the CARROT regularizer (``losses_carrot.CARROT``, its quantiles ``--carrot_q_hi`` /
    ``--carrot_q_lo``) with the settings of its weight: a fixed ``weight`` (``--carrot_weight``) or the
    gradient-balanced alpha capped at ``alpha_max`` (``--carrot_alpha_max``)."""

    def __init__(self, q_hi, q_lo, weight=None, alpha_max=1.0):
        self.carrot, self.weight, self.alpha_max = CARROT(q_hi, q_lo), weight, alpha_max

    def host_plan(self, labels, device):
        """CARROT's host plan (``losses_carrot.CarrotPlan``) of the rows' ``labels`` (the global batch's under
        torchrun), on ``device``."""
        return self.carrot.host_plan(gather_labels(labels, device), device)

    def __call__(self, base, h, labels, params=(), scale=None, plan=None):
        """``base + alpha * CARROT(h, labels)`` and the step's statistics. ``params``: parameters between ``h`` and
        ``base`` (head, classifier); ``scale``: the loss scale of the step's backward (``--amp fp16``; the balance
        takes its gradients of the scaled terms); ``plan``: :meth:`host_plan`'s, when built already."""
        # under torchrun: corridor and R on the global batch, alpha from norms over the global batch
        reg = self.carrot(gather_with_grad(h), None if plan is not None else gather_labels(labels, h.device), plan)
        balance = {}
        total, alpha = grad_balanced_total_loss(base, reg, h, params=params, weight=self.weight,
                                                alpha_max=self.alpha_max, reduce_sum=all_reduce_sum, stats=balance,
                                                scale=scale)
        return total, {**{f'carrot/{k}': v for k, v in self.carrot.last_stats.items()}, 'carrot/alpha': alpha,
                       'carrot/ratio': balance['ratio'], 'carrot/cap_binds': balance['cap_binds']}


def compiles_with(carrot, chunk_size):
    """Whether a step with ``carrot`` (a :class:`CarrotTerm`, or ``None`` without ``--carrot``) can compile its loss:
    CARROT's balance is traced where the compiler traces ``torch.autograd.grad`` (``runtime.device.traces_grad``),
    and not with ``--chunk_size`` (its chunked backward takes the gradients eagerly)."""
    return carrot is None or (traces_grad() and not chunk_size)


def carrot_term(carrot, carrot_q_hi, carrot_q_lo, carrot_weight, carrot_alpha_max):
    """The :class:`CarrotTerm` of the command line (``None`` without ``--carrot``): a hook (``flags.call_hook``)."""
    return CarrotTerm(carrot_q_hi, carrot_q_lo, carrot_weight, carrot_alpha_max) if carrot else None


def _check_carrot(carrot, carrot_q_lo, carrot_q_hi, carrot_weight, carrot_alpha_max, method_entry, given):
    check(0 <= carrot_q_lo < carrot_q_hi <= 1,
          f'need 0 <= --carrot_q_lo < --carrot_q_hi <= 1, got {carrot_q_lo} and {carrot_q_hi}')
    if not carrot:
        stray = [f for f in ('carrot_on', 'carrot_weight', 'carrot_alpha_max') if f in given]
        check(not stray, f'--{stray[0] if stray else ""} needs --carrot')
        return
    if method_entry is not None and not method_entry.uses_labels:
        with_labels = ' or '.join(m.name for m in METHODS.values() if m.uses_labels)
        raise UserError(f'--carrot needs class labels: use it with --method {with_labels}, not {method_entry.name}')
    check(carrot_weight is None or carrot_weight >= 0, '--carrot_weight must be >= 0')
    check(carrot_weight is None or 'carrot_alpha_max' not in given,
          '--carrot_alpha_max caps the balanced weight; with a fixed --carrot_weight it has no effect: give one')
    check(carrot_alpha_max > 0, f'--carrot_alpha_max must be > 0 (inf: no cap), got {carrot_alpha_max}')


CARROT_FLAGS = Feature(
    'CARROT (docs/CARROT.md)', scripts=('supcon', 'ce'), check=_check_carrot,
    flags={'--carrot': dict(action='store_true', help='add the CARROT corridor regularizer (needs labels)'),
           '--carrot_on': dict(choices=['encoder', 'head'], default='encoder', scripts=('supcon',),
                               help='CARROT on the encoder output or the projection output'),
           '--carrot_q_hi': dict(type=float, default=0.9, help='CARROT: negative quantile for the lower wall L'),
           '--carrot_q_lo': dict(type=float, default=0.1,
                                 help='CARROT: lower negative quantile (U = 1 - (q_hi - q_lo))'),
           '--carrot_weight': dict(type=float, default=None,
                                   help='CARROT: a fixed weight instead of gradient balancing (default: balanced)'),
           '--carrot_alpha_max': dict(type=float, default=1.0, infinite_ok=True,
                                      help='CARROT: cap on the balanced weight (inf: no cap, the first definition)')},
    run_name=lambda carrot, carrot_on: ('_carrot' + ('-head' if carrot_on == 'head' else '')) if carrot else '')
