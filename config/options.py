"""Command-line options of ``main_supcon.py``, ``main_ce.py`` and ``main_linear.py``: SupContrast's flag names and
defaults (per script: ``SCRIPT_DEFAULTS``), from three sources: the core flags below (run, data, model,
optimization); ``--method`` and each method's flags (``methods.py``); the features (``FEATURES``), each declaring its
flags, checks, run-name part and resume rules next to the code that reads them (``core.flags.Feature``).
``parse_option`` parses, fills the defaults that depend on other flags, validates and names the run folder; it
touches no device, process group or file (``engine.run.setup`` does). Every field exists for every script
(``FIELD_DEFAULTS``), so code reads ``opt.x`` without a fallback.
"""
import argparse
import functools
import math
import os
import re
import sys

from config.encoder_options import ENCODER, adopt_stage1_settings, default_stem, encoder_tag
from config.recipe import config_argv, recipe_of
from core.flags import (
    SCRIPTS,
    HelpFormatter,
    Parser,
    UserError,
    call_hook,
    check,
    check_temperature,
    dest,
    epoch_list,
    floats,
)
from data import AUGMENT, DATASETS, HELD_OUT, LABEL_FRACTION, LABEL_NOISE, LABELS, LONG_TAIL, MULTICROP, dataset_info
from data.labels import TRAIN_SUBSET
from evaluation.knn import MONITOR
from evaluation.probes import FINETUNE, LINEAR_PROBE, PROBES
from methods import METHODS, add_method_flags, apply_method_flags, get_method
from runtime.checkpoint import run_checkpoint
from runtime.device import COMPILE, PRECISION, REPRODUCIBILITY
from runtime.run_folder import fit_name
from tracking.trackers import TRACKER
from training.carrot import CARROT_FLAGS
from training.chunks import CHUNKS
from training.memory_queue import QUEUE
from training.schedule import OPTIMIZER, SCHEDULE
from training.steps import CE_LOSS, ONE_STAGE

# The features, in the order of their parts of the run name (SupContrast's order, then ours); the encoder's part is
# in the middle of the name (encoder_options.encoder_tag), its checks first.
FEATURES = [ENCODER, LABELS, LONG_TAIL, TRAIN_SUBSET, LABEL_NOISE, QUEUE, CARROT_FLAGS, CE_LOSS, ONE_STAGE, SCHEDULE,
            PRECISION, AUGMENT, CHUNKS, MONITOR, PROBES, REPRODUCIBILITY, COMPILE, OPTIMIZER, LABEL_FRACTION, FINETUNE,
            MULTICROP, LINEAR_PROBE, HELD_OUT, TRACKER]

SCRIPT_DEFAULTS = {     # SupContrast's, per script
    'supcon': dict(epochs=1000, learning_rate=0.05, lr_decay_epochs='700,800,900', lr_decay_rate=0.1,
                   weight_decay=1e-4),
    'ce': dict(epochs=500, learning_rate=0.2, lr_decay_epochs='350,400,450', lr_decay_rate=0.1, weight_decay=5e-4),
    'linear': dict(epochs=100, learning_rate=0.1, lr_decay_epochs='60,75,90', lr_decay_rate=0.2, weight_decay=0.0),
}
RUN_KIND = {'supcon': 'SupCon', 'ce': 'SupCE', 'linear': 'Linear'}
DESCRIPTION = dict(supcon='Stage 1: contrastive pre-training (SupCon / SimCLR / RASCAL).', ce='Cross-entropy baseline.',
                   linear='Stage 2: linear evaluation of a frozen stage-1 encoder.')


def _core_flags(p, script):
    d = SCRIPT_DEFAULTS[script]
    run = p.add_argument_group('run')
    run.add_argument('--print_freq', type=int, default=10, help='log a line every N iterations without a progress bar')
    run.add_argument('--save_freq', type=int, default=50,
                     help='keep a checkpoint every N epochs (last.pth is written every epoch)')
    run.add_argument('--trial', default='0', help='id for recording multiple runs')
    run.add_argument('--seed', type=int, default=0, help='random seed (same seed, same result on CPU)')
    run.add_argument('--device', default='auto', help='auto (cuda if available), cpu, cuda, cuda:N')
    run.add_argument('--resume', default='', help='checkpoint (e.g. <run>/last.pth) to continue from')
    run.add_argument('--save_folder', default='./save', help='root of the run folders')
    run.add_argument('--config', default=None,
                     help='a YAML recipe (configs/) or a run\'s run.json: its keys are flag names; flags on the '
                          'command line override it')
    run.add_argument('--syncBN', action='store_true', help='synchronized BatchNorm across torchrun processes (CUDA)')
    data = p.add_argument_group('data')
    data.add_argument('--dataset', choices=DATASETS, default='digits', help='the dataset (the table: data/sources.py)')
    data.add_argument('--data_folder', default=None, help='where the dataset\'s files are (default: the dataset\'s)')
    data.add_argument('--mean', type=floats, default=None, help='per-channel mean, e.g. "(0.5, 0.5, 0.5)" '
                                                                 '(default: the dataset\'s)')
    data.add_argument('--std', type=floats, default=None, help='per-channel std, e.g. "(0.25, 0.25, 0.25)" '
                                                                '(default: the dataset\'s)')
    data.add_argument('--size', type=int, default=None, help='image size (default: the dataset\'s, data/sources.py)')
    data.add_argument('--batch_size', type=int, default=256, help='batch size (the global batch under torchrun)')
    data.add_argument('--num_workers', type=int, default=16, help='data loading workers (capped at the CPU count)')
    model = p.add_argument_group('model and loss')
    if script == 'supcon':
        add_method_flags(model)
    if script in ('supcon', 'ce'):      # main_ce.py: one-stage SupCon (--supcon_weight)
        model.add_argument('--temp', type=float, default=0.07,
                           help='SupCon temperature (not used by margin_triplet; main_ce.py: with --supcon_weight)')
        model.add_argument('--head', choices=['mlp', 'linear'], default='mlp', help='projection head')
        model.add_argument('--feat_dim', type=int, default=128, help='projection dimension')
    if script == 'linear':
        model.add_argument('--ckpt', default='', help='stage-1 checkpoint (ours or the original SupContrast\'s)')
    optim = p.add_argument_group('optimization (SGD)')
    optim.add_argument('--epochs', type=int, default=d['epochs'], help='training epochs')
    optim.add_argument('--learning_rate', type=float, default=d['learning_rate'], help='base learning rate')
    optim.add_argument('--lr_decay_epochs', type=epoch_list, default=d['lr_decay_epochs'],
                       help='step decay at these epochs (without --cosine)')
    optim.add_argument('--lr_decay_rate', type=float, default=d['lr_decay_rate'],
                       help='step decay factor; with --cosine the final learning rate is lr * rate^3')
    optim.add_argument('--weight_decay', type=float, default=d['weight_decay'], help='weight decay')
    optim.add_argument('--momentum', type=float, default=0.9, help='SGD momentum')


def build_parser(script):
    """The parser of ``script`` ('supcon', 'ce', 'linear'): the core flags, then one group per feature."""
    p = Parser(description=DESCRIPTION[script], formatter_class=HelpFormatter)
    _core_flags(p, script)
    for feature in FEATURES:
        flags = feature.flags_of(script)
        if flags:
            group = p.add_argument_group(feature.name)
            for flag, kwargs in flags.items():
                group.add_argument(flag, **kwargs)
    return p


@functools.lru_cache(maxsize=None)
def _parser(script, suppressed, methods):
    p = build_parser(script)
    for action in p._actions if suppressed else ():
        action.default = argparse.SUPPRESS
    return p


def parser_of(script, suppressed=False):
    """``script``'s parser, built once per process and registry (a method registered later has its flags), only
    read (``suppressed``: without defaults)."""
    return _parser(script, suppressed, tuple(METHODS))


def given_flags(script, argv):
    """The destinations of the flags given on the command line ``argv`` (parsed again without defaults)."""
    return set(vars(parser_of(script, suppressed=True).parse_args(argv)))


# Every field of every script: what a script without a flag reads, and the run's set-up (``engine.setup``).
FIELD_DEFAULTS = {**{k: v for script in SCRIPTS for k, v in vars(build_parser(script).parse_args([])).items()},
                  **{k: v for feature in FEATURES for k, v in feature.absent().items()},     # `absent` values
                  'method': None, 'world_size': 1, 'rank': 0, 'stage1_label_noise': None, 'held_out_noise': None}
SCRIPT_FLAGS = {script: {a.dest for a in build_parser(script)._actions if a.option_strings} for script in SCRIPTS}
# float flags that may be infinite (every other float flag must be a finite number)
MAY_BE_INFINITE = {dest(flag) for feature in FEATURES for flag, kw in feature.flags.items() if kw.get('infinite_ok')}


def validate(opt, script, given):
    for key, value in vars(opt).items():
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            check(key in MAY_BE_INFINITE and not math.isnan(value), f'--{key} must be a finite number, got {value}')
        # every integer flag reaches torch or NumPy as a 64-bit integer (seeds, sizes, counts)
        check(not any(isinstance(v, int) and not -2 ** 63 <= v < 2 ** 63 for v in values),
              f'--{key} is out of range (a 64-bit integer), got {value}')
    check(opt.batch_size >= 1, f'--batch_size must be >= 1, got {opt.batch_size}')
    check(opt.epochs >= 1, f'--epochs must be >= 1, got {opt.epochs}')
    check(opt.learning_rate > 0, f'--learning_rate must be > 0, got {opt.learning_rate}')
    check(opt.num_workers >= 0, f'--num_workers must be >= 0, got {opt.num_workers}')
    check(opt.print_freq >= 1 and opt.save_freq >= 1, '--print_freq and --save_freq must be >= 1')
    check(opt.size >= 1, f'--size must be >= 1, got {opt.size}')
    check(opt.weight_decay >= 0 and opt.momentum >= 0, '--weight_decay and --momentum must be >= 0')
    check(opt.lr_decay_rate > 0, f'--lr_decay_rate must be > 0, got {opt.lr_decay_rate}')
    if script in ('supcon', 'ce'):
        check_temperature('--temp', opt.temp)
        check(opt.feat_dim >= 1, f'--feat_dim must be >= 1, got {opt.feat_dim}')
    if script == 'linear':
        check(opt.ckpt, '--ckpt is required: the stage-1 checkpoint to evaluate')
    info = dataset_info(opt.dataset)
    if info.mean_std is None:
        check(opt.mean and opt.std, f'--dataset {opt.dataset} needs --mean and --std, e.g. --mean "(0.5, 0.5, 0.5)"')
    check(opt.std is None or all(v > 0 for v in opt.std), f'--std must be > 0, got {opt.std}')
    if info.needs_folder:
        check(opt.data_folder, f'--dataset {opt.dataset} needs --data_folder with train/ and val/ '
                               f'ImageFolder sub-folders')
    method = get_method(opt.method) if script == 'supcon' else None
    if info.labelled is not None:
        without = ', '.join(m.name for m in METHODS.values() if not m.uses_labels)
        check(method is not None and not method.uses_labels,
              f'--dataset {opt.dataset} has unlabelled images: pre-train on it with a method without labels '
              f'(main_supcon.py --method {without}); evaluate on --dataset {info.labelled}')
    for feature in FEATURES:
        if feature.check is not None and script in feature.scripts:
            vars(opt).update(call_hook(feature.check, opt, script=script, given=given, method_entry=method) or {})


def run_name(opt, script):
    """SupContrast's naming of a run folder from its settings."""
    if script == 'supcon':
        entry = get_method(opt.method)
        method, scale = call_hook(entry.run_name, opt) if entry.run_name else (entry.name, f'temp_{opt.temp}')
        name = (f'{method}_{opt.dataset}_{encoder_tag(opt.model, opt.stem, opt.size, opt.model_args)}_lr_'
                f'{opt.learning_rate}_decay_{opt.weight_decay}_bsz_{opt.batch_size}_{scale}_trial_{opt.trial}')
    elif script == 'ce':
        name = (f'SupCE_{opt.dataset}_{encoder_tag(opt.model, opt.stem, opt.size, opt.model_args)}_lr_'
                f'{opt.learning_rate}_decay_{opt.weight_decay}_bsz_{opt.batch_size}_trial_{opt.trial}')
    else:
        pretrain = os.path.basename(os.path.dirname(os.path.abspath(opt.ckpt)))
        stem = os.path.splitext(os.path.basename(opt.ckpt))[0]
        name = f'{pretrain}_{stem}_lr_{opt.learning_rate}_bsz_{opt.batch_size}_trial_{opt.trial}'
        if opt.shots:
            name = f'{pretrain}_{stem}_shots_{opt.shots}_draws_{opt.shot_draws}_seed_{opt.shot_seed}_trial_{opt.trial}'
    name += ''.join(call_hook(f.run_name, opt) for f in FEATURES if f.run_name is not None)
    return name + (f'_seed_{opt.seed}' if opt.seed else '')


def parse_option(script, argv=None):
    """Parse, fill dataset- and method-dependent defaults, validate, and name the run folder.

    Nothing here touches a device or a process group (``engine.setup(opt)`` does); the only file read is
    main_linear.py's ``--ckpt`` configuration (:func:`adopt_stage1_settings`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    config, source = recipe_of(argv)
    # --config FILE (or the resumed run's run.json): its flags first, the command line's after them
    from_file = config_argv(config, script, build_parser(script), FIELD_DEFAULTS, SCRIPT_FLAGS) if config else []
    argv = [*from_file, *argv]
    opt = argparse.Namespace(**{**FIELD_DEFAULTS, **vars(parser_of(script).parse_args(argv))})
    given = given_flags(script, argv)
    opt.given_flags = sorted(given)          # what run.json records, for --config <run>/run.json (config/recipe.py)
    opt.script = script
    opt.ckpt = run_checkpoint(opt.ckpt, '--ckpt')
    opt.resume = run_checkpoint(opt.resume, '--resume')
    if script == 'linear' and opt.ckpt and os.path.isfile(opt.ckpt):    # a missing file: one line, later
        adopt_stage1_settings(opt, given)
    info = dataset_info(opt.dataset)
    if opt.model is None and script != 'linear':  # main_linear takes the checkpoint's
        opt.model = info.model
    opt.size = info.size if opt.size is None else opt.size
    if opt.stem is None and not str(opt.model or '').startswith('timm:'):
        opt.stem = default_stem(opt.size)
    try:
        if script == 'supcon':
            apply_method_flags(opt)
        validate(opt, script, given)
    except UserError as e:             # a flag the file set, named as such
        from_config = given_flags(script, from_file) - given_flags(script, argv[len(from_file):])
        named = [f'--{d}' for d in sorted(from_config) if re.search(rf'--{d}\b', str(e))]
        if named:
            raise UserError(f'{e} ({", ".join(named)} set by {source})') from None
        raise
    opt.data_folder = (info.data_folder or './datasets/') if opt.data_folder is None else opt.data_folder
    opt.num_workers = min(opt.num_workers, os.cpu_count() or 1)
    opt.local_batch_size = opt.batch_size    # engine.setup divides it over torchrun processes
    opt.run_name = run_name(opt, script)
    if opt.resume:
        opt.run_folder = os.path.dirname(os.path.abspath(opt.resume))
    else:
        opt.run_folder = os.path.join(opt.save_folder, RUN_KIND[script], opt.dataset, fit_name(opt.run_name))
    return opt
