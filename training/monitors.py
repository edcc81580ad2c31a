"""Collapse monitors: cheap statistics of features a step has already computed, and the run-time warning when a
representation has collapsed (the effective rank of a whole split's features: ``evaluation.knn.rankme``).

- :func:`collapse_statistics` (per step, every method): ``z_std``, the per-dimension standard deviation
  of the L2-normalized rows averaged over dimensions (lightly's ``std_of_l2_normalized``): about
  ``1/sqrt(D)`` when the rows are spread over the sphere, 0 when they all point the same way; and
  ``cos``, the mean cosine similarity over the ordered pairs ``i != j`` (1 when collapsed).
- :class:`CollapseWatch`: a one-time warning when the epoch means say the run has collapsed.

These are relative signals: SupCon's optimum puts each class on one point, so the features of a
well-trained C-class encoder have rank at most C - 1 and a ``z_std`` well below ``1/sqrt(D)``. Compare a
run with its own first epoch and with other runs, not with the isotropic value.
"""
import math

import torch
import torch.nn.functional as F


@torch.no_grad()
def collapse_statistics(h, name):
    """``{'collapse/z_std_<name>', 'collapse/cos_<name>'}`` of the rows of ``h`` ``[n, D]`` as 0-d
    float32 tensors (no host sync). ``cos`` is ``(||sum_i z_i||^2 - n) / (n (n - 1))``: no n x n matrix."""
    z = F.normalize(h.detach().float().reshape(h.shape[0], -1), dim=1)
    n = z.shape[0]
    if n < 2:
        zero = z.new_zeros(())
        return {f'collapse/z_std_{name}': zero, f'collapse/cos_{name}': zero}
    total = z.sum(0)
    return {f'collapse/z_std_{name}': z.std(dim=0).mean(),
            f'collapse/cos_{name}': ((total @ total) - n) / (n * (n - 1))}


class CollapseWatch:
    """Says once per run that the representation has collapsed, from the epoch means of training.

    Fires on the first epoch where ``train/collapse/z_std_enc`` is below ``z_std_ratio`` times its
    first-epoch value, where ``train/collapse/cos_enc`` (the batch's mean pairwise cosine) is above
    ``cos_max``, or where ``train/carrot/L`` (CARROT's lower wall, the 90 % quantile of the negative
    similarities) is above ``carrot_l_max``. The thresholds were chosen from the healthy and collapsed
    runs of the digits ablations (``docs/results.md``, "Choosing the collapse thresholds"). Its state
    travels in checkpoints.
    """

    def __init__(self, z_std_ratio=0.25, cos_max=0.99, carrot_l_max=0.99):
        self.z_std_ratio, self.cos_max, self.carrot_l_max = z_std_ratio, cos_max, carrot_l_max
        self.first_z_std, self.warned = None, False

    def check(self, epoch, metrics):
        """The warning (one line) the first time the epoch's ``metrics`` say collapse; ``None`` otherwise."""
        z_std = metrics.get('train/collapse/z_std_enc')
        if z_std is not None and self.first_z_std is None:
            self.first_z_std = z_std
        if self.warned:
            return None
        message = None
        carrot_l, cos = metrics.get('train/carrot/L'), metrics.get('train/collapse/cos_enc')
        if z_std is not None and self.first_z_std and z_std < self.z_std_ratio * self.first_z_std:
            message = (f'collapse/z_std_enc is {z_std:.4g}, below {self.z_std_ratio:g} x its first-epoch value '
                       f'{self.first_z_std:.4g}')
        elif cos is not None and cos > self.cos_max:
            message = f'collapse/cos_enc is {cos:.4f} (> {self.cos_max:g}): the encoder maps the batch to one direction'
        elif carrot_l is not None and carrot_l > self.carrot_l_max:
            message = (f'carrot/L is {carrot_l:.4f} (> {self.carrot_l_max:g}): the negatives themselves are '
                       'near-identical')
        if message is None:
            return None
        self.warned = True
        hint = ('with --carrot, keep the default --carrot_alpha_max 1 (or lower it) or use --carrot_weight; '
                if carrot_l is not None else '')
        return (f'warning: the representation looks collapsed at epoch {epoch}: {message}; {hint}'
                'try a lower --learning_rate or a higher --temp')

    def state_dict(self):
        return {'first_z_std': self.first_z_std, 'warned': self.warned}

    def load_state_dict(self, state):
        self.first_z_std, self.warned = state['first_z_std'], state['warned']


ABSURD_NLL = 10       # a test NLL above this many times chance level (ln C) is flagged


def probe_divergence(train_losses, n_classes, test_nll=None):
    """``None`` for a linear probe whose training converged, else one line saying what was measured: a loss that is
    not finite; a last epoch's mean training loss above chance level, ``ln C`` (the cross-entropy of a uniform
    prediction, about where a probe starts); or a test NLL above ``ABSURD_NLL`` times chance level (logits out of
    scale). It claims no more: a probe whose training loss oscillates may still rank the test images as a converged
    one does. ``train_losses``: the epochs' mean training losses, in order."""
    chance = math.log(n_classes)
    hint = 'lower --learning_rate (a plain probe, --probe_norm none, also feels the features\' scale: bn does not)'
    values = [*train_losses, *([] if test_nll is None else [test_nll])]
    if not all(math.isfinite(v) for v in values):
        where = 'its test NLL' if train_losses and all(math.isfinite(v) for v in train_losses) else 'its training loss'
        return f'the linear probe diverged: {where} is not finite; {hint}'
    if train_losses and train_losses[-1] > chance:
        nll = f'; test NLL {test_nll:.4g}' if test_nll is not None else ''
        return (f'the linear probe did not converge: its last epoch\'s mean training loss {train_losses[-1]:.4g} is '
                f'above chance level (ln {n_classes} = {chance:.3f}; first epoch {train_losses[0]:.4g}{nll}); {hint}')
    if test_nll is not None and test_nll > ABSURD_NLL * chance:
        return (f'the linear probe\'s test NLL {test_nll:.4g} is over {ABSURD_NLL} x chance level (ln {n_classes} = '
                f'{chance:.3f}; last training loss {train_losses[-1]:.4g}): its logits are out of scale; {hint}'
                if train_losses else f'the linear probe\'s test NLL {test_nll:.4g} is out of scale; {hint}')
    return None
