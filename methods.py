"""The contrastive methods of ``main_supcon.py``: one registry entry per ``--method``.

A method is a loss (a :class:`losses.Loss` in a file of its own) plus one :class:`Method` entry that
tells the rest of the code what the loss needs: its flags and their checks, whether it takes class
labels and dataset indices, and how runs are named. The training loop reads everything else from the
loss itself: its statistics from ``last_stats`` / ``last_hists``, and its state from its
``state_dict()`` (persistent buffers, such as RASCAL's cache), which travels in checkpoints whenever
it is not empty. ``main_supcon.py`` never branches on a method's name.

Adding a method (docs/DEVELOPING.md, "Adding a method")::

    from methods import Method, register
    register(Method('MyLoss', build=lambda temp, num_samples: MyLoss(temp),
                    flags={'--my_weight': dict(type=float, default=0.5, help='...')}))
"""
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from core.flags import UserError, call_hook, check
from losses import MarginalTripletLoss, NTLogisticLoss, SupConLoss
from losses_field import EpsSupInfoNCELoss, KCLLoss, SINCERELoss, SpreadLoss, SupDCLLoss
from losses_noise import RINCELoss, SelCLLoss, SymNCELoss
from losses_proto import BCLLoss, PaCoLoss, TSCLoss
from losses_rascal import WEIGHTINGS, RASCALLoss


@dataclass(frozen=True)
class Method:
    """What ``main_supcon.py`` needs to know about one ``--method``.

    Attributes:
        name: the ``--method`` value.
        build: a hook (``flags.call_hook``: its parameters name the option fields it reads, and
            ``num_samples``, the training set's size; ``class_counts`` and ``enc_dim``, see
            ``uses_encoder_features``) that returns the :class:`losses.Loss`. The loss is called
            as ``loss(features, labels)``
            or, with ``uses_ids``, ``loss(features, labels, ids)``: ``features`` ``[B, V, D]`` unit
            projections, ``labels`` ``[B]`` (``None`` without ``uses_labels``), ``ids`` ``[B]`` dataset
            indices. Under torchrun all three are the global batch.
        help: one line for ``--help``.
        uses_labels: the loss takes class labels (SimCLR does not; ``--carrot`` needs them).
        uses_ids: the loss takes dataset indices (the training set is wrapped in ``IndexedDataset``).
        takes_queue: the loss takes ``queue=`` (a :class:`memory_queue.QueueView`): ``--queue_size`` works.
        uses_encoder_features: the loss also takes ``h_enc=``, the encoder features ``[V*B, E]`` of the same rows
            (view-major; the global batch under torchrun), e.g. for a classifier of its own. A loss with
            parameters (a classifier, prototypes) needs nothing more: ``steps.Pretraining`` optimizes every
            parameter of the loss with the model's and its ``state_dict`` travels in checkpoints. Its ``build``
            hook may also name ``class_counts`` (training samples per class, ``[C]``) and ``enc_dim``.
        flags: the method's own flags, ``{'--flag': argparse keywords}``. Their ``default`` applies
            when the method is chosen; given with another method, such a flag is a one-line error.
            Methods may share a flag (same keywords).
        check: a hook run after the defaults are filled: raise :class:`flags.UserError` on a bad
            combination; it may return ``{field: value}`` for values that depend on other flags.
        run_name: a hook returning ``(method part, scale part)`` of the run folder's name
            (default: ``(name, 'temp_<--temp>')``).
        stats_prefix: the loss's statistics are logged as ``train/<stats_prefix><name>``.
        compiles: the loss step (the loss and the statistics, ``steps.Pretraining.loss_from_parts``, given the
            loss's ``host_plan``) traces without a graph break, so ``--compile`` makes the step's augmentation, model
            and loss one graph with its backward, where it runs in one process (with ``--carrot`` too where
            ``training.carrot.compiles_with`` says so);
            ``tests/training/test_compiled_step.py`` holds it at 0 breaks (a mode that reads the host by design,
            TSC's ``--tsc_assign step``, keeps its breaks).
    """
    name: str
    build: Callable[..., Any]
    help: str = ''
    uses_labels: bool = True
    uses_ids: bool = False
    takes_queue: bool = False
    uses_encoder_features: bool = False
    flags: dict[str, dict[str, Any]] = field(default_factory=dict)
    check: Optional[Callable[..., Optional[dict]]] = None
    run_name: Optional[Callable[..., tuple[str, str]]] = None
    stats_prefix: str = ''
    compiles: bool = False


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to the registry (``--method`` choices); a name may be registered once."""
    if method.name in METHODS:
        raise ValueError(f'method {method.name!r} is registered already')
    for flag, kwargs in method.flags.items():
        for other in METHODS.values():
            if flag in other.flags and other.flags[flag] != kwargs:
                raise ValueError(f'{flag} of {method.name} differs from {other.name}\'s')
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    return METHODS[name]


def method_flags():
    """``{'--flag': (argparse keywords, [names of the methods that own it])}`` over the registry."""
    out = {}
    for method in METHODS.values():
        for flag, kwargs in method.flags.items():
            out.setdefault(flag, (kwargs, []))[1].append(method.name)
    return out


def add_method_flags(group):
    """``--method`` and every method's own flags on ``group`` (a group of main_supcon.py's parser). A method's flag
    has no default on the parser: :func:`apply_method_flags` fills the chosen method's, and ``--help`` shows it."""
    group.add_argument('--method', choices=list(METHODS), default='SupCon',
                       help='; '.join(f'{m.name}: {m.help}' for m in METHODS.values() if m.help))
    for flag, (kwargs, owners) in method_flags().items():
        default = kwargs.get('default')
        text = kwargs.get('help', '')
        note = f' (default: {default})' if default is not None and '(default' not in text else ''
        group.add_argument(flag, **{**kwargs, 'default': None, 'help': f'({"/".join(owners)}) {text}{note}'})


def apply_method_flags(opt):
    """Fill the chosen method's flag defaults; a flag of another method is a one-line error."""
    method = get_method(opt.method)
    for flag, (kwargs, owners) in method_flags().items():
        dest = flag.lstrip('-')
        if opt.method in owners:
            if getattr(opt, dest) is None:
                setattr(opt, dest, kwargs.get('default'))
        elif getattr(opt, dest) is not None:
            raise UserError(f'{flag} needs --method {" or ".join(owners)} (got --method {opt.method})')
    if method.check is not None:
        vars(opt).update(call_hook(method.check, opt) or {})


# ---------------------------------------------------------------- SupCon and SimCLR (and their loss family)
SIMCLR_FAMILY_FLAGS = {
    '--simclr_loss': dict(choices=['ntxent', 'ntlogistic', 'margin_triplet'], default='ntxent',
                          help='contrastive loss of SupCon/SimCLR: NT-Xent (SupConLoss, default), NT-Logistic, '
                               'or Marginal Triplet; with SupCon, same-class samples are positives'),
    '--margin': dict(type=float, default=None, help='margin of margin_triplet (default 1.0)'),
}


def _check_simclr_family(margin, simclr_loss, queue_size):
    if margin is not None and simclr_loss != 'margin_triplet':
        raise UserError('--margin needs --simclr_loss margin_triplet')
    if simclr_loss == 'margin_triplet':
        margin = 1.0 if margin is None else margin
        if not margin >= 0:
            raise UserError(f'--margin must be >= 0, got {margin}')
    if queue_size and simclr_loss != 'ntxent':
        raise UserError(f'--queue_size needs --simclr_loss ntxent (the queue is defined for NT-Xent), '
                        f'got {simclr_loss}')
    return {'margin': margin}


def _build_simclr_family(simclr_loss, temp, margin):
    if simclr_loss == 'ntlogistic':
        return NTLogisticLoss(temperature=temp)
    if simclr_loss == 'margin_triplet':
        return MarginalTripletLoss(margin=margin)
    return SupConLoss(temperature=temp)


def _simclr_family_name(method, simclr_loss, margin, temp):
    name = method + ('' if simclr_loss == 'ntxent' else f'-{simclr_loss}')
    return name, (f'margin_{margin}' if simclr_loss == 'margin_triplet' else f'temp_{temp}')


register(Method('SupCon', _build_simclr_family, help='supervised contrastive (Khosla et al. 2020)',
                takes_queue=True, flags=SIMCLR_FAMILY_FLAGS, check=_check_simclr_family, run_name=_simclr_family_name,
                compiles=True))
register(Method('SimCLR', _build_simclr_family, help='self-supervised (Chen et al. 2020): no labels',
                uses_labels=False, takes_queue=True, flags=SIMCLR_FAMILY_FLAGS, check=_check_simclr_family,
                run_name=_simclr_family_name, compiles=True))


# ---------------------------------------------------------------- RASCAL
def _build_rascal(num_samples, feat_dim, temp, rascal_weighting):
    # the cache is sized by the dataset and the head; it travels in checkpoints
    return RASCALLoss(num_samples, feat_dim, temperature=temp, base_temperature=temp,
                      weighting=rascal_weighting, persistent_cache=True)


def _rascal_name(rascal_weighting, temp):
    suffix = '' if rascal_weighting == 'agreement' else f'-{rascal_weighting}'
    return f'RASCAL{suffix}', f'temp_{temp}'


register(Method('RASCAL', _build_rascal, help='rank-agreement weighted SupCon (docs/RASCAL.md)', uses_ids=True,
                takes_queue=True,
                flags={'--rascal_weighting': dict(choices=list(WEIGHTINGS), default='agreement',
                                                  help='RASCAL positive weights (default agreement; '
                                                       'current/uniform are ablations)')},
                run_name=_rascal_name, stats_prefix='rascal/', compiles=True))



# ---------------------------------------------------------------- the published variants (docs/FIELD.md)
KCL_K = {'--kcl_k': dict(type=int, default=6,
                         help='KCL/TSC: same-class positives drawn per anchor (default 6, the paper\'s k)')}


def _check_kcl_k(kcl_k):
    check(kcl_k >= 0, f'--kcl_k must be >= 0, got {kcl_k}')


register(Method('KCL', lambda kcl_k, temp, seed: KCLLoss(kcl_k, temperature=temp, seed=seed),
                help='K-positive contrastive (Kang et al. 2021): own view + k drawn same-class positives',
                flags=KCL_K, check=_check_kcl_k, compiles=True,
                run_name=lambda kcl_k, temp: (f'KCL_k_{kcl_k}', f'temp_{temp}')))
register(Method('SINCERE', lambda temp: SINCERELoss(temperature=temp), takes_queue=True, compiles=True,
                help='SINCERE (Feeney & Hughes): no same-class sample in a positive\'s denominator'))
register(Method('EpsSupInfoNCE', lambda eps_margin, temp: EpsSupInfoNCELoss(eps_margin, temperature=temp),
                takes_queue=True, compiles=True, help='epsilon-SupInfoNCE (Barbano et al. 2023): SINCERE with a margin',
                flags={'--eps_margin': dict(type=float, default=0.1,
                                            help='epsilon-SupInfoNCE: the margin eps in logits, as the authors\' '
                                                 'code (eps * temp in cosine similarity)')},
                check=lambda eps_margin: check(eps_margin >= 0, f'--eps_margin must be >= 0, got {eps_margin}'),
                run_name=lambda eps_margin, temp: (f'EpsSupInfoNCE_eps_{eps_margin}_logit', f'temp_{temp}')))
register(Method('SupDCL', lambda temp: SupDCLLoss(temperature=temp), takes_queue=True, compiles=True,
                help='supervised decoupled contrastive (Yeh et al. 2022): other classes only in the denominator'))
register(Method('Spread', lambda spread_alpha, temp: SpreadLoss(spread_alpha, temperature=temp), takes_queue=True,
                compiles=True,
                help='L_spread (Chen et al. 2022): SupCon + class-conditional InfoNCE against class collapse',
                flags={'--spread_alpha': dict(type=float, default=0.5,
                                              help='L_spread: weight of the class-conditional term, in [0, 1] '
                                                   '(default 0.5)')},
                check=lambda spread_alpha: check(0 <= spread_alpha <= 1,
                                                 f'--spread_alpha must be in [0, 1], got {spread_alpha}'),
                run_name=lambda spread_alpha, temp: (f'Spread_alpha_{spread_alpha}', f'temp_{temp}')))


# ---------------------------------------------------------------- with parameters of their own (docs/FIELD.md, "BCL")
def _check_bcl(bcl_ce_weight, bcl_weight):
    check(bcl_ce_weight >= 0 and bcl_weight >= 0 and bcl_ce_weight + bcl_weight > 0,
          f'--bcl_ce_weight and --bcl_weight must be >= 0 and not both 0, got {bcl_ce_weight} and {bcl_weight}')


register(Method('BCL', lambda class_counts, enc_dim, feat_dim, temp, bcl_ce_weight, bcl_weight, bcl_classifier: BCLLoss(
                    class_counts, enc_dim, feat_dim, temperature=temp, ce_weight=bcl_ce_weight, bcl_weight=bcl_weight,
                    classifier=bcl_classifier),
                uses_encoder_features=True, stats_prefix='bcl/', compiles=True,
                help='balanced contrastive learning (Zhu et al. 2022): logit-adjusted CE on a classifier of its own + '
                     'class-averaged SupCon with one prototype per class',
                flags={'--bcl_ce_weight': dict(type=float, default=2.0,
                                               help='BCL: weight of the logit-adjusted cross-entropy (default 2.0)'),
                       '--bcl_weight': dict(type=float, default=0.6,
                                            help='BCL: weight of the balanced contrastive term (default 0.6)'),
                       '--bcl_classifier': dict(choices=['cosine', 'linear'], default='cosine',
                                                help='BCL: its classifier, the authors\' cosine classifier (scale 30) '
                                                     'or a plain linear layer (unbounded logits; collapses at lr 0.2 '
                                                     'on a ResNet-18: docs/FIELD.md, "BCL")')},
                check=_check_bcl,
                run_name=lambda bcl_ce_weight, bcl_weight, bcl_classifier, temp: (
                    f'BCL_ce_{bcl_ce_weight}_bcl_{bcl_weight}' + ('_linear' if bcl_classifier == 'linear' else ''),
                    f'temp_{temp}')))


PACO_FLAGS = {
    '--paco_alpha': dict(type=float, default=0.01,
                         help='PaCo/GPaCo: weight of each same-label sample among the positives (default 0.01, the '
                              'paper\'s CIFAR-LT setting)'),
    '--paco_beta': dict(type=float, default=1.0, help='PaCo/GPaCo: weight of the own-class entry (default 1.0)'),
    '--paco_gamma': dict(type=float, default=1.0,
                         help='PaCo/GPaCo: scale of the samples\' part of the denominator (default 1.0)'),
}


def _check_paco(paco_alpha, paco_beta, paco_gamma):
    check(all(math.isfinite(v) for v in (paco_alpha, paco_beta, paco_gamma))
          and paco_alpha >= 0 and paco_beta > 0 and paco_gamma >= 0,
          f'--paco_alpha and --paco_gamma must be >= 0 and --paco_beta > 0 (finite), got {paco_alpha}, '
          f'{paco_beta} and {paco_gamma}')


def _paco(prior):
    def build(class_counts, enc_dim, temp, paco_alpha, paco_beta, paco_gamma):
        return PaCoLoss(class_counts, enc_dim, temperature=temp, alpha=paco_alpha, beta=paco_beta, gamma=paco_gamma,
                        prior=prior)

    def run_name(paco_alpha, paco_beta, paco_gamma, temp):
        return f'{"PaCo" if prior else "GPaCo"}_a_{paco_alpha}_b_{paco_beta}_g_{paco_gamma}', f'temp_{temp}'
    return build, run_name


for _name, _prior, _help in (
        ('PaCo', True, 'parametric contrastive learning (Cui et al. 2021): class entries from a classifier of its own '
                       '(plus the log class prior) in every contrast set'),
        ('GPaCo', False, 'PaCo without the class prior (its balanced-data form, Cui et al. 2023)')):
    _build, _run_name = _paco(_prior)
    register(Method(_name, _build, help=_help, takes_queue=True, uses_encoder_features=True, stats_prefix='paco/',
                    flags=PACO_FLAGS, check=_check_paco, run_name=_run_name, compiles=True))


def _check_tsc(kcl_k, tsc_weight):
    _check_kcl_k(kcl_k)
    check(math.isfinite(tsc_weight) and tsc_weight >= 0, f'--tsc_weight must be finite and >= 0, got {tsc_weight}')


register(Method('TSC', lambda class_counts, feat_dim, kcl_k, temp, tsc_weight, tsc_assign, seed, device: TSCLoss(
                    len(class_counts), feat_dim, kcl_k, temperature=temp, weight=tsc_weight, seed=seed,
                    assign=tsc_assign, device=device),
                help='targeted supervised contrastive (Li et al. 2022): KCL + class targets spread on the sphere, '
                     'assigned to classes each epoch (or each step)', stats_prefix='tsc/', compiles=True,
                flags={**KCL_K, '--tsc_weight': dict(type=float, default=1.0,
                                                     help='TSC: weight lambda of the own-class target among the '
                                                          'positives, which counts as one positive (default 1.0)'),
                       '--tsc_assign': dict(choices=['epoch', 'step'], default='epoch',
                                            help='TSC: re-assign the targets after every epoch to that epoch\'s class '
                                                 'means, or after every step to moving-average centroids (the '
                                                 'authors\'; a host read per step)')},
                check=_check_tsc,
                run_name=lambda kcl_k, tsc_weight, tsc_assign, temp: (
                    f'TSC_k_{kcl_k}_w_{tsc_weight}' + ('_assign_step' if tsc_assign == 'step' else ''),
                    f'temp_{temp}')))


# ---------------------------------------------------------------- built for noisy labels (docs/FIELD.md)
def _finite_in(value, low, high, flag, low_open=False):
    ok = math.isfinite(value) and (low < value if low_open else low <= value) and value <= high
    check(ok, f'{flag} must be in {"(" if low_open else "["}{low}, {high}], got {value}')


register(Method('SymNCE', lambda symnce_beta, temp: SymNCELoss(symnce_beta, temperature=temp), takes_queue=True,
                compiles=True, stats_prefix='symnce/',
                help='symmetric InfoNCE (Cui et al. 2025): SupCon + beta x a reverse term, robust to label noise',
                flags={'--symnce_beta': dict(type=float, default=1.0,
                                             help='SymNCE: weight beta of the reverse term (default 1.0; 0 is '
                                                  'SupCon)')},
                check=lambda symnce_beta: check(math.isfinite(symnce_beta) and symnce_beta >= 0,
                                                f'--symnce_beta must be finite and >= 0, got {symnce_beta}'),
                run_name=lambda symnce_beta, temp: (f'SymNCE_beta_{symnce_beta}', f'temp_{temp}')))


def _check_rince(rince_q, rince_lambda):
    _finite_in(rince_q, 0, 1, '--rince_q', low_open=True)
    _finite_in(rince_lambda, 0, 1, '--rince_lambda', low_open=True)


register(Method('RINCE', lambda rince_q, rince_lambda, temp: RINCELoss(rince_q, rince_lambda, temperature=temp),
                takes_queue=True, compiles=True, check=_check_rince,
                help='robust InfoNCE (Chuang et al. 2022), supervised: each positive against the negatives',
                flags={'--rince_q': dict(type=float, default=0.5,
                                         help='RINCE: q in (0, 1] (default 0.5; toward 0: InfoNCE, 1: robust)'),
                       '--rince_lambda': dict(type=float, default=0.01,
                                              help='RINCE: lambda in (0, 1], the density term\'s weight (default '
                                                   '0.01)')},
                run_name=lambda rince_q, rince_lambda, temp: (f'RINCE_q_{rince_q}_lam_{rince_lambda}',
                                                              f'temp_{temp}')))


def _check_selcl(selcl_k, selcl_alpha, selcl_beta, selcl_warmup):
    check(selcl_k >= 1, f'--selcl_k must be >= 1, got {selcl_k}')
    _finite_in(selcl_alpha, 0, 1, '--selcl_alpha')
    _finite_in(selcl_beta, 0, 1, '--selcl_beta')
    check(selcl_warmup >= 1, f'--selcl_warmup must be >= 1 (a selection needs an epoch\'s features), '
                             f'got {selcl_warmup}')


register(Method('SelCL', lambda num_samples, feat_dim, class_counts, selcl_k, selcl_alpha, selcl_beta, selcl_warmup,
                temp: SelCLLoss(num_samples, feat_dim, len(class_counts), k=selcl_k, alpha=selcl_alpha,
                                beta=selcl_beta, warmup=selcl_warmup, temperature=temp),
                uses_ids=True, takes_queue=True, stats_prefix='selcl/', check=_check_selcl,
                help='Sel-CL (Li et al. 2022): SupCon over confident pairs chosen by a kNN vote each epoch, the '
                     'instance term for the rest',
                flags={'--selcl_k': dict(type=int, default=250,
                                         help='Sel-CL: neighbours of the kNN vote (default 250, the authors\')'),
                       '--selcl_alpha': dict(type=float, default=0.5,
                                             help='Sel-CL: the quantile over classes of the agreeing examples that '
                                                  'sets how many each class keeps (default 0.5, the median)'),
                       '--selcl_beta': dict(type=float, default=0.25,
                                            help='Sel-CL: the quantile of the selected pairs\' similarities that is '
                                                 'the pairs\' threshold (default 0.25)'),
                       '--selcl_warmup': dict(type=int, default=1,
                                              help='Sel-CL: epochs of the instance term alone before the first '
                                                   'selection (default 1, the authors\')')},
                run_name=lambda selcl_k, selcl_alpha, selcl_beta, selcl_warmup, temp: (
                    f'SelCL_k_{selcl_k}_a_{selcl_alpha}_b_{selcl_beta}_w_{selcl_warmup}', f'temp_{temp}')))
