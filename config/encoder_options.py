"""The encoder's command line (``--model``, ``--stem``, ``--model_args``): the flags' type and checks (timm's
arguments and input sizes tried once, ``networks.timm_problem``), the encoder's part of a run name, and what
``main_linear.py`` takes from its stage-1 checkpoint (``adopt_stage1_settings``)."""
import argparse

from core.flags import Feature, UserError, check
from data import DATASETS, dataset_info, mean_std
from networks import MODELS, STEMS, is_model_name, parse_model_args, timm_problem
from runtime.checkpoint import load_checkpoint


def model_name(text):
    """``--model``'s type: one of our encoders or ``timm:<name>``."""
    if not is_model_name(text):
        raise argparse.ArgumentTypeError(f'{text!r} is not one of {", ".join(sorted(MODELS))}, nor timm:<name>')
    return text


def encoder_tag(model, stem, size, model_args):
    """The encoder's part of a run name: the model (``timm:`` as ``timm-``), a stem other than the size's default,
    and timm's arguments (``depth=2,patch_size=8`` as ``depth-2_patch_size-8``)."""
    tag = model.replace(':', '-')
    if stem is not None and stem != default_stem(size):
        tag += f'_stem_{stem}'
    if model_args:
        tag += '_' + model_args.replace('=', '-').replace(',', '_').replace('/', '-')
    return tag


# How a stage-1 encoder saw its images: main_linear.py takes these (and --model) from its --ckpt
STAGE1_INPUT = ('model', 'stem', 'model_args', 'size', 'mean', 'std')


def default_stem(size):
    """``--stem`` when not given: the ImageNet stem from 128 px up (a quarter of the resolution), else CIFAR's."""
    return 'imagenet' if size >= 128 else 'cifar'


def _check_model(model, stem, model_args, size, given):
    """The encoder's flags: a timm name that exists, ``--stem`` for our ResNets only, ``--model_args`` that parse, are
    for timm models only and that timm accepts for ``--size`` images (networks.timm_problem). Nothing to check in
    main_linear.py before its checkpoint names the model."""
    if model is None:
        return
    try:
        parse_model_args(model_args)
    except ValueError as e:
        raise UserError(str(e)) from None
    if model.startswith('timm:'):
        check('stem' not in given, f'--stem is for our ResNets; {model} has its own first layers')
        import timm
        check(timm.is_model(model[len('timm:'):]), f'timm has no model {model[len("timm:"):]!r} '
                                                  '(python -c "import timm; print(timm.list_models())")')
        problem = timm_problem(model[len('timm:'):], size, model_args)
        check(problem is None, problem)
    else:
        check(not model_args, f'--model_args is for timm models (timm:<name>), not {model}')


def adopt_stage1_settings(opt, given):
    """main_linear.py: ``--model``, ``--size``, ``--mean`` and ``--std`` as the stage-1 checkpoint's configuration
    has them (its dataset's normalization when it used the default); a different value given on the command line
    is a one-line error. Without ``--dataset`` (and ``--data_folder``) the encoder is evaluated on the dataset it was
    trained on, not on the flag's default. Checkpoints without a configuration (SupContrast's) leave the flags as
    they are."""
    config = load_checkpoint(opt.ckpt, 'stage-1 checkpoint (--ckpt)').get('config') or {}
    if 'dataset' not in given and config.get('dataset') in DATASETS:     # not digits, the flag's default, silently
        opt.dataset = dataset_info(config['dataset']).labelled or config['dataset']    # stl10_unlabeled: stl10
        if 'data_folder' not in given and config.get('data_folder') is not None:
            opt.data_folder = config['data_folder']
    saved = {key: config.get(key) for key in STAGE1_INPUT}
    if config and 'stem' not in config:               # written before --stem existed: every ResNet had CIFAR's
        saved['stem'] = 'cifar'
    if config and saved['model_args'] is None:
        saved['model_args'] = ''
    if str(saved.get('model') or '').startswith('timm:'):
        saved['stem'] = None
    if config.get('dataset') in DATASETS and dataset_info(config['dataset']).mean_std is not None:
        saved['mean'], saved['std'] = mean_std(config['dataset'], config.get('mean'), config.get('std'))
    for key, value in saved.items():
        if value is None:
            continue
        value = tuple(value) if isinstance(value, list) else value
        now = getattr(opt, key)
        check(key not in given or now == value or (isinstance(value, tuple) and tuple(now) == value),
              f'--{key} {now} contradicts the stage-1 checkpoint {opt.ckpt}, whose encoder was trained with '
              f'{value}: leave --{key} out')
        setattr(opt, key, value)
    adopt_held_out(opt, given, config)


def adopt_held_out(opt, given, config):
    """main_linear.py trains on its stage-1 run's ``--train_subset`` and holds out what that run held out
    (``--val_split``, ``--split_seed``), unless told otherwise: a stage-1 run that held out images makes them the
    probe's held-out part by default; another held-out part is a one-line error (the encoder trained on some of it);
    held-out images the encoder trained on get a note."""
    if config.get('label_noise'):                     # --val_noise same: the held-out labels get this noise
        opt.stage1_label_noise = [config['label_noise'], config.get('label_noise_kind', 'symmetric')]
    if config.get('dataset') != opt.dataset:          # another dataset's held-out part is not this one's
        return
    if config.get('train_subset') and 'train_subset' not in given and 'subset_seed' not in given:
        opt.train_subset, opt.subset_seed = config['train_subset'], config.get('subset_seed', 0)
    held = config.get('val_split') or 0
    if held and 'val_split' not in given and 'split_seed' not in given:
        opt.val_split, opt.split_seed = held, config.get('split_seed', 0)
        return
    if held and opt.val_split and (opt.val_split, opt.split_seed) != (held, config.get('split_seed', 0)):
        raise UserError(f'--val_split {opt.val_split} --split_seed {opt.split_seed} holds out other images than the '
                        f'stage-1 run {opt.ckpt} did (--val_split {held} --split_seed {config.get("split_seed", 0)}), '
                        f'and its encoder trained on some of them: leave both flags out')
    if config and not held and opt.val_split:
        print(f'note: the stage-1 run {opt.ckpt} held out no images: its encoder trained on this probe\'s held-out '
              f'part too (--val_split in main_supcon.py / main_ce.py holds it out there)', flush=True)


ENCODER = Feature(
    'encoder', check=_check_model,
    flags={'--model': dict(type=model_name, default=None, metavar='{' + ','.join(sorted(MODELS)) + ',timm:NAME}',
                           help='encoder: one of ours, or any timm model by name (timm:vit_small_patch16_224, '
                                'timm:convnext_tiny, ...; no pretrained weights) (default: resnet_tiny for digits, '
                                'resnet50 otherwise; main_linear.py: the checkpoint\'s)'),
           '--stem': dict(choices=STEMS, default=None,
                          help='our ResNets\' first layers: cifar (3x3 conv, stride 1) or imagenet (7x7 conv, '
                               'stride 2, max-pool) (default: imagenet from --size 128 up, else cifar; main_linear.py: '
                               'the checkpoint\'s)'),
           '--model_args': dict(default='', help='timm models: key=value pairs for timm.create_model, e.g. '
                                                 '"depth=2,patch_size=8" (main_linear.py: the checkpoint\'s)')})
