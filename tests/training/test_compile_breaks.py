"""What ``torch.compile`` would make of each method's loss step on a CPU: the graph breaks of
``Pretraining.loss_from_parts`` (the loss, CARROT, the statistics) counted by ``torch._dynamo.explain``, per method mode
(``helpers.method_modes``). ``--compile`` compiles the encoder and the heads only; the table below is where a step
compiled whole would break today (docs/USAGE.md, "torch.compile"). A mode at 0 must stay at 0; the others may
not break more often than recorded, so a change that adds a break fails."""
import pytest
import torch

from helpers import STEP_BSZ, build_training, method_modes

pytestmark = pytest.mark.slow

# measured with torch 2.14 (the breaks: the host plans built from labels and ids with torch.unique, RASCAL's id
# check, per-class blocks of data-dependent size, CARROT's torch.autograd.grad and quantiles)
BREAKS = {
    'SupCon': 0, 'SupCon + queue + CARROT': 16, 'SupCon --simclr_loss=ntlogistic': 0,
    'SupCon --simclr_loss=margin_triplet': 0,
    'SimCLR': 0, 'SimCLR + queue': 0, 'SimCLR --simclr_loss=ntlogistic': 0, 'SimCLR --simclr_loss=margin_triplet': 0,
    'RASCAL': 15, 'RASCAL + queue + CARROT': 34, 'RASCAL --rascal_weighting=current': 15,
    'RASCAL --rascal_weighting=uniform': 15,
    'KCL': 10, 'KCL + CARROT': 26, 'SINCERE': 10, 'SINCERE + queue + CARROT': 21,
    'EpsSupInfoNCE': 10, 'EpsSupInfoNCE + queue + CARROT': 21, 'SupDCL': 0, 'SupDCL + queue + CARROT': 16,
    'Spread': 10, 'Spread + queue + CARROT': 21, 'BCL': 0, 'BCL + CARROT': 16, 'BCL --bcl_classifier=linear': 0,
    'PaCo': 0, 'PaCo + queue + CARROT': 16, 'GPaCo': 0, 'GPaCo + queue + CARROT': 16,
    'TSC': 10, 'TSC + CARROT': 26, 'TSC --tsc_assign=step': 14,
}


def graph_breaks(training):
    """The graph breaks of one ``loss_from_parts`` on a batch of ``STEP_BSZ`` samples, 2 views, 3 classes."""
    torch.manual_seed(1)
    h_enc = torch.randn(2 * STEP_BSZ, training.model.dim, requires_grad=True)
    h_proj = torch.randn(2 * STEP_BSZ, 128, requires_grad=True)
    labels, ids = torch.randint(0, 3, (STEP_BSZ,)), torch.randperm(200)[:STEP_BSZ]
    torch._dynamo.reset()
    explained = torch._dynamo.explain(
        lambda h, p: training.loss_from_parts(h, p, labels, ids, 2)[0])(h_enc, h_proj)
    return explained.graph_break_count


@pytest.mark.parametrize('mode', list(method_modes()))
def test_the_loss_step_breaks_no_more_often_than_recorded(mode):
    assert mode in BREAKS, f'{mode}: count its graph breaks (graph_breaks) and record them in BREAKS'
    breaks = graph_breaks(build_training(method_modes()[mode]))
    assert breaks <= BREAKS[mode], f'{mode}: {breaks} graph breaks, {BREAKS[mode]} recorded'


def test_a_host_read_in_the_loss_is_counted(monkeypatch):
    """The power check: a loss that reads a value on the host (``float(loss)``) breaks the graph."""
    training = build_training(['--method', 'SupCon'])
    assert graph_breaks(training) == 0
    forward = type(training.criterion).forward

    def reads_the_host(self, *args, **kwargs):
        loss = forward(self, *args, **kwargs)
        return loss * (1.0 if float(loss) > -1 else 0.0)
    monkeypatch.setattr(type(training.criterion), 'forward', reads_the_host)
    assert graph_breaks(training) >= 1
