"""Command-line options shared by ``main_supcon.py``, ``main_ce.py`` and ``main_linear.py``.

Flag names and defaults follow SupContrast; each script only differs in its
defaults (``SCRIPT_DEFAULTS``) and in a few script-specific flags. ``--method``'s
choices and each method's own flags come from the registry in ``methods.py``.

``parse_option`` parses, fills the defaults that depend on other flags, validates and
names the run folder; it touches no device, process group or file (``engine.setup``
does). Every field exists for every script (``FIELD_DEFAULTS`` for the flags a
script does not have), so code reads ``opt.x`` without a fallback.
"""
import argparse
import math
import os
import re

from data import DATASETS, coarse_labels, dataset_info
from methods import METHODS, apply_method_flags, get_method, method_flags
from networks import MODELS
from util import UserError

# SupContrast's per-script defaults.
SCRIPT_DEFAULTS = {
    'supcon': dict(epochs=1000, learning_rate=0.05, lr_decay_epochs='700,800,900',
                   lr_decay_rate=0.1, weight_decay=1e-4),
    'ce': dict(epochs=500, learning_rate=0.2, lr_decay_epochs='350,400,450',
               lr_decay_rate=0.1, weight_decay=5e-4),
    'linear': dict(epochs=100, learning_rate=0.1, lr_decay_epochs='60,75,90',
                   lr_decay_rate=0.2, weight_decay=0.0),
}
RUN_KIND = {'supcon': 'SupCon', 'ce': 'SupCE', 'linear': 'Linear'}

# Fields of flags that a script does not have, and of the run's set-up (``engine.setup`` sets those).
FIELD_DEFAULTS = dict(method=None, label_granularity='fine', eval_labels='fine', carrot=False, carrot_on=None,
                      carrot_q_hi=0.9, carrot_q_lo=0.1, carrot_weight=None, carrot_alpha_max=None, ckpt='',
                      val_split=0.0, head=None, feat_dim=None, temp=None, knn_every=0, knn_k=200, knn_t=0.1, knn_shots=0,
                      chunk_size=0, queue_size=0, moco_m=None, shuffle_bn_splits=None, world_size=1, rank=0,
                      shots=None, shot_draws=5, shot_seed=0, within_superclass=False)


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (no usage block) with exit status 2."""

    def error(self, message):
        self.exit(2, f'{self.prog}: error: {message}\n')


def _floats(text):
    """Parse '(0.4914, 0.4822, 0.4465)', '0.5,0.5,0.5' or '0.5' into a tuple of floats (never eval)."""
    values = re.findall(r'[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?', text)
    leftover = re.sub(r'[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[\s,()\[\]]', '', text)
    if leftover or len(values) not in (1, 3):
        raise argparse.ArgumentTypeError(f'expected 1 or 3 numbers such as "(0.5, 0.5, 0.5)", got {text!r}')
    values = tuple(float(v) for v in values)
    return values * 3 if len(values) == 1 else values


def _int_list(text):
    try:
        epochs = [int(x) for x in text.split(',') if x.strip()]
    except ValueError:
        epochs = [0]
    if not all(e >= 1 for e in epochs):
        raise argparse.ArgumentTypeError(f'expected comma-separated epochs >= 1 such as 700,800,900, got {text!r}')
    return epochs


def build_parser(script):
    d = SCRIPT_DEFAULTS[script]
    p = Parser(description={'supcon': 'Stage 1: contrastive pre-training (SupCon / SimCLR).',
                            'ce': 'Cross-entropy baseline.',
                            'linear': 'Stage 2: linear evaluation of a frozen stage-1 encoder.'}[script])
    p.add_argument('--print_freq', type=int, default=10, help='log a line every N iterations without a progress bar')
    p.add_argument('--save_freq', type=int, default=50, help='keep a checkpoint every N epochs (last.pth is written every epoch)')
    p.add_argument('--batch_size', type=int, default=256, help='batch size (the global batch under torchrun)')
    p.add_argument('--num_workers', type=int, default=16, help='data loading workers (capped at the CPU count)')
    p.add_argument('--epochs', type=int, default=d['epochs'])
    p.add_argument('--learning_rate', type=float, default=d['learning_rate'])
    p.add_argument('--lr_decay_epochs', type=_int_list, default=d['lr_decay_epochs'])
    p.add_argument('--lr_decay_rate', type=float, default=d['lr_decay_rate'])
    p.add_argument('--weight_decay', type=float, default=d['weight_decay'])
    p.add_argument('--momentum', type=float, default=0.9)
    p.add_argument('--model', choices=sorted(MODELS), default=None,
                   help='default: resnet_tiny for digits, resnet50 otherwise')
    p.add_argument('--dataset', choices=DATASETS, default='digits')
    p.add_argument('--mean', type=_floats, default=None, help='per-channel mean, e.g. "(0.5, 0.5, 0.5)"')
    p.add_argument('--std', type=_floats, default=None, help='per-channel std, e.g. "(0.25, 0.25, 0.25)"')
    p.add_argument('--data_folder', default=None, help='default: ./datasets/')
    p.add_argument('--imb_factor', type=float, default=0.01,
                   help='cifar10_lt/cifar100_lt: smallest/largest class size of the training set')
    p.add_argument('--label_noise', type=float, default=0.0,
                   help='symmetric label noise: this fraction of the training labels replaced by another class, '
                        'seeded by --seed and recorded in <run>/label_noise.json; test labels stay clean')
    if script == 'linear':
        p.add_argument('--eval_labels', choices=['fine', 'coarse'], default='fine',
                       help='labels of the linear classifier (fine: CIFAR-100 classes / digits)')
    else:
        p.add_argument('--label_granularity', choices=['fine', 'coarse'], default='fine',
                       help='train on coarse labels: the 20 CIFAR-100 superclasses, or 5 digit groups')
    p.add_argument('--size', type=int, default=None, help='image size (default: 16 for digits, 32 otherwise)')
    if script == 'supcon':
        p.add_argument('--method', choices=list(METHODS), default='SupCon',
                       help='; '.join(f'{m.name}: {m.help}' for m in METHODS.values() if m.help))
        for flag, (kwargs, owners) in method_flags().items():
            kwargs = {**kwargs, 'default': None, 'help': f'({"/".join(owners)}) {kwargs.get("help", "")}'}
            p.add_argument(flag, **kwargs)
        p.add_argument('--temp', type=float, default=0.07, help='loss temperature (not used by margin_triplet)')
        p.add_argument('--head', choices=['mlp', 'linear'], default='mlp')
        p.add_argument('--knn_every', type=int, default=0,
                       help='every N epochs, weighted kNN accuracy of encoder features on the test split (0: off)')
        p.add_argument('--knn_k', type=int, default=200, help='kNN monitor: neighbours')
        p.add_argument('--knn_t', type=float, default=0.1, help='kNN monitor: temperature of the vote weights')
        p.add_argument('--knn_shots', type=int, default=0,
                       help='kNN monitor: also the accuracy with only K labelled training images per class (0: off)')
        p.add_argument('--feat_dim', type=int, default=128)
        p.add_argument('--queue_size', type=int, default=0,
                       help='memory queue of this many keys from earlier batches (docs/QUEUE.md; 0: off)')
        p.add_argument('--moco_m', type=float, default=None,
                       help='with --queue_size: momentum of the key encoder (default 0.999); 0: no key encoder, '
                            'the keys are the detached queries')
        p.add_argument('--shuffle_bn_splits', type=int, default=None,
                       help='with a key encoder in one process: BatchNorm over this many shuffled sub-batches '
                            'of the keys (default 8)')
    if script in ('supcon', 'ce'):
        p.add_argument('--chunk_size', type=int, default=0,
                       help='gradient caching: run the encoder on chunks of this many samples (all their views) '
                            'and get the full-batch gradient with the memory of one chunk (0: off)')
        p.add_argument('--carrot', action='store_true', help='add the CARROT corridor regularizer (needs labels)')
        if script == 'supcon':
            p.add_argument('--carrot_on', choices=['encoder', 'head'], default=None,
                           help='CARROT on the encoder output (default) or the projection output')
        p.add_argument('--carrot_q_hi', type=float, default=0.9, help='CARROT: negative quantile for L')
        p.add_argument('--carrot_q_lo', type=float, default=0.1, help='CARROT: lower negative quantile')
        p.add_argument('--carrot_weight', type=float, default=None,
                       help='CARROT: fixed weight instead of gradient balancing')
        p.add_argument('--carrot_alpha_max', type=float, default=None,
                       help='CARROT: cap on the balanced weight (default 1; inf: no cap, the first definition)')
    if script == 'linear':
        p.add_argument('--ckpt', default='', help='stage-1 checkpoint (ours or the original SupContrast\'s)')
        p.add_argument('--val_split', type=float, default=0.0,
                       help='hold out this fraction of train for model selection (0: none)')
        p.add_argument('--shots', type=int, default=None,
                       help='few-shot probe instead of SGD training: a logistic regression on frozen features of K '
                            'labelled training images per class, and a K-shot kNN (docs/PROBES.md)')
        p.add_argument('--shot_draws', type=int, default=5, help='--shots: draws of the K-shot set, averaged')
        p.add_argument('--shot_seed', type=int, default=0, help='--shots: seed of the draws (their own, not --seed)')
        p.add_argument('--within_superclass', action='store_true',
                       help='also report fine-label kNN accuracy within each test image\'s own superclass '
                            '(datasets with coarse labels)')
    p.add_argument('--cosine', action='store_true', help='cosine annealing')
    p.add_argument('--syncBN', action='store_true', help='synchronized BatchNorm across torchrun processes (CUDA)')
    p.add_argument('--warm', action='store_true', help='10-epoch linear warm-up for large batches')
    p.add_argument('--trial', default='0', help='id for recording multiple runs')
    p.add_argument('--seed', type=int, default=0, help='random seed (same seed, same result on CPU)')
    p.add_argument('--device', default='auto', help='auto (cuda if available), cpu, cuda, cuda:N')
    p.add_argument('--resume', default='', help='checkpoint (e.g. <run>/last.pth) to continue from')
    p.add_argument('--amp', choices=['none', 'bf16', 'fp16'], default='none', help='mixed precision')
    p.add_argument('--channels_last', action='store_true', help='channels-last memory format')
    p.add_argument('--augment', choices=['cpu', 'device'], default='cpu',
                   help='training augmentation: cpu (per image, PIL, DataLoader workers: SupContrast\'s) or device '
                        '(the same pipeline batched on --device; in-memory datasets; docs/AUGMENT.md)')
    p.add_argument('--save_folder', default='./save', help='root of the run folders')
    return p


def _check(cond, message):
    if not cond:
        raise UserError(message)


# float flags that may be infinite (every other float flag must be a finite number)
MAY_BE_INFINITE = ('carrot_alpha_max',)


def validate(opt, script):
    for key, value in vars(opt).items():
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            _check(key in MAY_BE_INFINITE and not math.isnan(value), f'--{key} must be a finite number, got {value}')
    _check(opt.batch_size >= 1, f'--batch_size must be >= 1, got {opt.batch_size}')
    _check(opt.epochs >= 1, f'--epochs must be >= 1, got {opt.epochs}')
    _check(opt.learning_rate > 0, f'--learning_rate must be > 0, got {opt.learning_rate}')
    _check(opt.num_workers >= 0, f'--num_workers must be >= 0, got {opt.num_workers}')
    _check(opt.print_freq >= 1 and opt.save_freq >= 1, '--print_freq and --save_freq must be >= 1')
    _check(opt.size >= 1, f'--size must be >= 1, got {opt.size}')
    _check(opt.weight_decay >= 0 and opt.momentum >= 0, '--weight_decay and --momentum must be >= 0')
    _check(opt.lr_decay_rate > 0, f'--lr_decay_rate must be > 0, got {opt.lr_decay_rate}')
    _check(0 < opt.imb_factor <= 1, f'--imb_factor must be in (0, 1], got {opt.imb_factor}')
    _check(0 <= opt.label_noise < 1, f'--label_noise must be in [0, 1), got {opt.label_noise}')
    _check(0 <= opt.carrot_q_lo < opt.carrot_q_hi <= 1,
           f'need 0 <= --carrot_q_lo < --carrot_q_hi <= 1, got {opt.carrot_q_lo} and {opt.carrot_q_hi}')
    if script == 'supcon':
        _check(opt.temp > 0, f'--temp must be > 0, got {opt.temp}')
        _check(opt.feat_dim >= 1, f'--feat_dim must be >= 1, got {opt.feat_dim}')
        validate_queue(opt)
    if script in ('supcon', 'ce'):
        validate_carrot(opt, script)
        _check(0 <= opt.chunk_size <= opt.batch_size,
               f'--chunk_size must be in [0, --batch_size {opt.batch_size}] (0: off), got {opt.chunk_size}')
    if script == 'linear':
        _check(opt.ckpt, '--ckpt is required: the stage-1 checkpoint to evaluate')
        _check(0 <= opt.val_split < 1, f'--val_split must be in [0, 1), got {opt.val_split}')
        _check(opt.shots is None or opt.shots >= 1, f'--shots must be >= 1 (K labelled images per class), got {opt.shots}')
        _check(opt.shot_draws >= 1, f'--shot_draws must be >= 1, got {opt.shot_draws}')
        _check(opt.shots is None or opt.val_split == 0, '--shots fits the probe to convergence: --val_split has no use')
        if opt.within_superclass:
            coarse_labels(opt.dataset)    # a one-line error for datasets without superclasses
    info = dataset_info(opt.dataset)
    if info.mean_std is None:
        _check(opt.mean and opt.std, f'--dataset {opt.dataset} needs --mean and --std, e.g. --mean "(0.5, 0.5, 0.5)"')
    if opt.augment == 'device':
        in_memory = ', '.join(name for name, row in DATASETS.items() if row.in_memory)
        _check(info.in_memory, f'--augment device needs a dataset held in memory ({in_memory}); --dataset '
                               f'{opt.dataset} decodes image files in DataLoader workers: use --augment cpu')
    if info.needs_folder:
        _check(opt.data_folder, f'--dataset {opt.dataset} needs --data_folder with train/ and val/ '
                                f'ImageFolder sub-folders')
    if 'coarse' in (opt.label_granularity, opt.eval_labels):
        coarse_labels(opt.dataset)    # a one-line error for datasets without superclasses
    if script == 'supcon':
        _check(opt.knn_every >= 0 and opt.knn_k >= 1 and opt.knn_t > 0,
               '--knn_every must be >= 0, --knn_k >= 1 and --knn_t > 0')
        _check(opt.knn_shots >= 0, f'--knn_shots must be >= 0 (K labelled images per class; 0: off), got {opt.knn_shots}')
        _check(not opt.knn_shots or opt.knn_every, '--knn_shots is a setting of the kNN monitor: give --knn_every N too')
    if opt.std is not None:
        _check(all(v > 0 for v in opt.std), f'--std must be > 0, got {opt.std}')


def validate_queue(opt):
    _check(opt.queue_size >= 0, f'--queue_size must be >= 0 (0: off), got {opt.queue_size}')
    if not opt.queue_size:
        given = [f for f in ('moco_m', 'shuffle_bn_splits') if getattr(opt, f) is not None]
        _check(not given, f'--{given[0] if given else ""} needs --queue_size')
        return
    _check(get_method(opt.method).takes_queue, f'--queue_size is not defined for --method {opt.method}')
    _check(opt.queue_size >= opt.batch_size,
           f'--queue_size {opt.queue_size} is smaller than the (global) batch {opt.batch_size}: '
           f'one step would overwrite its own keys')
    opt.moco_m = 0.999 if opt.moco_m is None else opt.moco_m
    _check(0 <= opt.moco_m < 1, f'--moco_m must be in [0, 1), got {opt.moco_m}')
    _check(opt.shuffle_bn_splits is None or opt.moco_m > 0, '--shuffle_bn_splits needs a key encoder (--moco_m > 0)')
    opt.shuffle_bn_splits = 8 if opt.shuffle_bn_splits is None and opt.moco_m > 0 else opt.shuffle_bn_splits
    _check(opt.shuffle_bn_splits is None or opt.shuffle_bn_splits >= 1,
           f'--shuffle_bn_splits must be >= 1, got {opt.shuffle_bn_splits}')


def validate_carrot(opt, script):
    if not opt.carrot:
        given = [f for f in ('carrot_on', 'carrot_weight', 'carrot_alpha_max') if getattr(opt, f) is not None]
        _check(not given, f'--{given[0] if given else ""} needs --carrot')
        return
    if script == 'supcon' and not get_method(opt.method).uses_labels:
        with_labels = ' or '.join(m.name for m in METHODS.values() if m.uses_labels)
        raise UserError(f'--carrot needs class labels: use it with --method {with_labels}, not {opt.method}')
    _check(opt.carrot_weight is None or opt.carrot_weight >= 0, '--carrot_weight must be >= 0')
    _check(opt.carrot_weight is None or opt.carrot_alpha_max is None,
           '--carrot_alpha_max caps the balanced weight; with a fixed --carrot_weight it has no effect: give one')
    if opt.carrot_weight is None and opt.carrot_alpha_max is None:
        opt.carrot_alpha_max = 1.0
    _check(opt.carrot_alpha_max is None or opt.carrot_alpha_max > 0,
           f'--carrot_alpha_max must be > 0 (inf: no cap), got {opt.carrot_alpha_max}')
    if script == 'supcon' and opt.carrot_on is None:
        opt.carrot_on = 'encoder'


def run_name(opt, script):
    """SupContrast's naming of a run folder from its settings."""
    if script == 'supcon':
        method, scale = get_method(opt.method).name_parts(opt)
        name = (f'{method}_{opt.dataset}_{opt.model}_lr_{opt.learning_rate}_decay_{opt.weight_decay}'
                f'_bsz_{opt.batch_size}_{scale}_trial_{opt.trial}')
    elif script == 'ce':
        name = (f'SupCE_{opt.dataset}_{opt.model}_lr_{opt.learning_rate}_decay_{opt.weight_decay}'
                f'_bsz_{opt.batch_size}_trial_{opt.trial}')
    else:
        pretrain = os.path.basename(os.path.dirname(os.path.abspath(opt.ckpt)))
        stem = os.path.splitext(os.path.basename(opt.ckpt))[0]
        name = f'{pretrain}_{stem}_lr_{opt.learning_rate}_bsz_{opt.batch_size}_trial_{opt.trial}'
        if opt.shots:
            name = f'{pretrain}_{stem}_shots_{opt.shots}_draws_{opt.shot_draws}_seed_{opt.shot_seed}_trial_{opt.trial}'
    if opt.label_granularity == 'coarse':
        name += '_coarse'
    if opt.eval_labels == 'coarse':
        name += '_evalcoarse'
    if dataset_info(opt.dataset).long_tail:
        name += f'_imb_{opt.imb_factor}'
    if opt.label_noise:
        name += f'_noise_{opt.label_noise}'
    if opt.queue_size:
        name += f'_queue_{opt.queue_size}_m_{opt.moco_m}'
    if opt.carrot:
        name += '_carrot' + ('-head' if opt.carrot_on == 'head' else '')
    if opt.cosine:
        name += '_cosine'
    if opt.warm:
        name += '_warm'
    if opt.amp != 'none':
        name += f'_{opt.amp}'
    if opt.augment == 'device':
        name += '_devaug'
    return name


def parse_option(script, argv=None):
    """Parse, fill dataset- and method-dependent defaults, validate, and name the run folder.

    Nothing here touches a device, a process group or a file: ``engine.setup(opt)`` does."""
    opt = argparse.Namespace(**{**FIELD_DEFAULTS, **vars(build_parser(script).parse_args(argv))})
    opt.script = script
    info = dataset_info(opt.dataset)
    if opt.model is None and script != 'linear':  # main_linear takes the checkpoint's
        opt.model = info.model
    if opt.size is None:
        opt.size = info.size
    if script == 'supcon':
        apply_method_flags(opt)
    validate(opt, script)
    if opt.data_folder is None:
        opt.data_folder = './datasets/'

    opt.num_workers = min(opt.num_workers, os.cpu_count() or 1)
    opt.local_batch_size = opt.batch_size    # engine.setup divides it over torchrun processes
    # SupContrast: large batches always warm up; 10 epochs from 0.01.
    if opt.batch_size > 256:
        opt.warm = True
    opt.warm_epochs, opt.warmup_from = 10, 0.01
    if opt.resume:
        opt.run_folder = os.path.dirname(os.path.abspath(opt.resume))
    else:
        opt.run_folder = os.path.join(opt.save_folder, RUN_KIND[script], opt.dataset, run_name(opt, script))
    return opt


# What may differ when a run is resumed: flags that do not change what is learned (a longer --epochs is
# how a run is extended; --amp, --channels_last and --chunk_size change precision, memory layout and memory
# use, not the experiment: like the number of torchrun processes, --chunk_size only changes BatchNorm's groups),
# and fields that describe this process rather than the experiment.
RESUME_MAY_CHANGE = {'epochs', 'print_freq', 'save_freq', 'num_workers', 'device', 'data_folder', 'save_folder',
                     'resume', 'trial', 'knn_every', 'knn_k', 'knn_t', 'knn_shots', 'amp', 'channels_last', 'chunk_size',
                     'script', 'run_folder', 'world_size', 'rank', 'local_batch_size', 'warm_epochs', 'warmup_from'}


def resume_conflicts(saved_config, opt):
    """``['--flag: the checkpoint has A, now B', ...]`` for the experiment-defining flags where the
    checkpoint's configuration and this command line differ (keys missing on either side are skipped)."""
    now = config_dict(opt)
    return [f'--{key}: the checkpoint has {saved_config[key]!r}, now {now[key]!r}'
            for key in sorted(set(now) & set(saved_config) - RESUME_MAY_CHANGE) if saved_config[key] != now[key]]


def config_dict(opt):
    """The options as a plain dict of str/int/float/bool/list (safe for ``weights_only`` loading)."""
    out = {}
    for key, value in vars(opt).items():
        if isinstance(value, tuple):
            value = list(value)
        if isinstance(value, (str, int, float, bool, list)) or value is None:
            out[key] = value
        else:
            out[key] = str(value)
    return out
