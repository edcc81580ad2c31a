"""config/options.py: parsing, defaults, validation and run names (in-process, no training), and bad input through the
real scripts: one line on stderr, non-zero exit, no traceback."""
import argparse

import pytest
import torch

from config.options import parse_option
from core.flags import UserError
from helpers import assert_one_line_error, method_flag_needs, run_in_process, run_script


def test_large_batch_forces_warmup_and_names_run():
    opt = parse_option('supcon', ['--batch_size', '512', '--cosine', '--trial', '7', '--device', 'cpu'])
    assert opt.warm and opt.run_folder.endswith('bsz_512_temp_0.07_trial_7_cosine_warm')
    assert opt.model == 'resnet_tiny' and opt.size == 16


def test_bad_options_raise_user_error():
    with pytest.raises(UserError, match='--epochs'):
        parse_option('ce', ['--epochs', '0'])
    with pytest.raises(UserError, match='--val_split'):
        parse_option('linear', ['--ckpt', 'x.pth', '--val_split', '1.5'])


def test_optimizer_and_schedule_flags_reach_the_optimizer():
    from core.flags import call_hook
    from training.schedule import Schedule, set_optimizer
    opt = parse_option('ce', ['--momentum', '0.8', '--weight_decay', '0.001', '--learning_rate', '0.4',
                              '--lr_decay_epochs', '2,4', '--lr_decay_rate', '0.5', '--device', 'cpu'])
    optim = set_optimizer([torch.zeros(1, requires_grad=True)], opt.learning_rate, opt.momentum, opt.weight_decay)
    group = optim.param_groups[0]
    assert group['momentum'] == 0.8 and group['weight_decay'] == 0.001
    call_hook(Schedule, opt).adjust(optim, 5)
    assert group['lr'] == pytest.approx(0.4 * 0.5 ** 2)


def test_carrot_quantile_flags_parse():
    opt = parse_option('supcon', ['--carrot', '--carrot_q_hi', '0.8', '--carrot_q_lo', '0.2', '--device', 'cpu'])
    assert (opt.carrot_q_hi, opt.carrot_q_lo, opt.carrot_on) == (0.8, 0.2, 'encoder')
    with pytest.raises(UserError, match='--carrot_q_hi'):
        parse_option('ce', ['--carrot', '--carrot_q_hi', '1.5', '--device', 'cpu'])


def test_mean_std_parsing():
    from core.flags import floats as _floats
    assert _floats('(0.4914, 0.4822, 0.4465)') == (0.4914, 0.4822, 0.4465)
    assert _floats('0.5') == (0.5, 0.5, 0.5)
    assert _floats('[1e-1,2,3]') == (0.1, 2.0, 3.0)
    for bad in ('(0.1, 0.2)', 'os.system("x")', ''):
        with pytest.raises(argparse.ArgumentTypeError):
            _floats(bad)


def test_flag_validation():
    assert parse_option('supcon', []).simclr_loss == 'ntxent'
    assert parse_option('supcon', ['--simclr_loss', 'margin_triplet']).margin == 1.0
    assert parse_option('supcon', ['--simclr_loss', 'ntlogistic', '--carrot']).carrot
    for argv, words in [
        (['--method', 'RASCAL', '--simclr_loss', 'ntlogistic'], '--simclr_loss'),
        (['--margin', '0.5'], '--margin needs'),
        (['--simclr_loss', 'margin_triplet', '--margin', '-1'], '--margin must'),
    ]:
        with pytest.raises(UserError, match=words):
            parse_option('supcon', argv)
    with pytest.raises(SystemExit):
        parse_option('supcon', ['--simclr_loss', 'infonce'])


def test_options_for_the_tools():
    from config.options import parse_option
    from core.flags import UserError
    for script, argv, words in [('supcon', ['--dataset', 'cifar10', '--label_granularity', 'coarse'], 'coarse'),
                                ('linear', ['--dataset', 'cifar10', '--eval_labels', 'coarse', '--ckpt', 'x'],
                                 'coarse'),
                                ('ce', ['--dataset', 'cifar10_lt', '--imb_factor', '0'], '--imb_factor'),
                                ('supcon', ['--knn_every', '-1'], '--knn_every'),
                                ('supcon', ['--knn_shots', '5'], 'give --knn_every')]:
        with pytest.raises(UserError, match=words):
            parse_option(script, argv)
    assert parse_option('ce', ['--dataset', 'cifar100_lt', '--label_granularity', 'coarse']).run_folder.endswith(
        '_coarse_imb_0.01')


# ---------------------------------------------------------------- every flag, a wrong type and out-of-range values
# Values a flag accepts on purpose, with the reason (anything else must be refused in one line).
ACCEPTED = {
    ('--seed', '-1'): 'any integer is a seed', ('--seed', '0'): 'the default seed',
    ('--momentum', '0'): 'plain SGD', ('--weight_decay', '0'): 'no weight decay',
    ('--warm_epochs', '0'): 'no warm-up, also above batch 256',
    ('--val_split', '0'): 'no held-out split (the default)', ('--knn_every', '0'): 'the monitor off (the default)',
    ('--image_cache', '0'): 'no cache (the default)', ('--num_small_crops', '0'): 'no multi-crop (the default)',
    ('--knn_shots', '0'): 'the few-shot monitor off (the default)',
    ('--carrot_q_lo', '0'): 'the minimum negative similarity',
    ('--carrot_alpha_max', 'inf'): 'no cap (the first CARROT definition)',
    ('--carrot_weight', '0'): 'CARROT only measured (its statistics), not trained', ('--margin', '0'): 'a valid margin',
    ('--mean', '-1'): 'any number is a per-channel mean', ('--mean', '0'): 'the same',
    ('--num_workers', '0'): 'load in the main process', ('--chunk_size', '0'): 'gradient caching off (the default)',
    ('--queue_size', '0'): 'no queue (the default)', ('--moco_m', '0'): 'no key encoder: the keys are the queries',
    ('--label_noise', '0'): 'no label noise (the default)', ('--train_subset', '0'): 'the whole training split',
    ('--subset_seed', '0'): 'the default seed of the subset',
    ('--shot_seed', '-1'): 'any integer is a seed', ('--shot_seed', '0'): 'the default seed of the draws',
    ('--supcon_weight', '0'): 'one-stage SupCon off (the default)', ('--kcl_k', '0'): 'KCL: the own views only',
    ('--eps_margin', '0'): 'epsilon-SupInfoNCE is SINCERE', ('--spread_alpha', '0'): 'L_spread is SupCon',
    ('--la_tau', '0'): 'logit adjustment is plain cross-entropy',
    ('--tsc_weight', '0'): 'TSC without its targets is KCL',
    ('--paco_gamma', '0'): 'PaCo, the class entries without the samples in the denominator',
    ('--paco_alpha', '0'): 'PaCo without same-label samples among the positives',
    ('--bcl_weight', '0'): 'BCL with its cross-entropy alone',
    ('--bcl_ce_weight', '0'): 'BCL with its balanced contrastive term alone',
    ('--symnce_beta', '0'): 'SymNCE without its reverse term is SupCon',
    ('--selcl_alpha', '0'): 'Sel-CL keeps as many per class as the class with the fewest agreeing examples',
    ('--selcl_beta', '0'): 'Sel-CL: every pair of selected same-label examples passes the threshold',
    ('--sce_alpha', '0'): 'SCE with its reverse term alone', ('--sce_beta', '0'): 'SCE is cross-entropy (scaled)',
}
NEEDS = {   # flags that only mean something with another flag: given alone they are refused
    **method_flag_needs(),        # a method's own flag needs its --method (the registry says which)
    '--margin': ['--simclr_loss', 'margin_triplet'],
    '--carrot_alpha_max': ['--carrot'], '--carrot_weight': ['--carrot'], '--carrot_on': ['--carrot'],
    '--moco_m': ['--queue_size', '1024'], '--shuffle_bn_splits': ['--queue_size', '1024'],
    '--la_tau': ['--loss', 'logit_adjusted'], '--gce_q': ['--loss', 'gce'],
    '--sce_alpha': ['--loss', 'sce'], '--sce_beta': ['--loss', 'sce'],
}


def _typed_flags(script):
    from config.options import build_parser
    for action in build_parser(script)._actions:
        flag = action.option_strings[-1] if action.option_strings else None
        if flag and action.type is not None:
            yield flag, action


def _outcome(script, argv, capsys):
    """(accepted, stderr lines) of parsing ``argv`` through run_cli (exit status and output as the scripts)."""
    from config.cli import run_cli
    try:
        run_cli(lambda: parse_option(script, argv))
    except SystemExit as e:
        assert e.code not in (0, None)
        return False, capsys.readouterr().err.strip().splitlines()
    capsys.readouterr()
    return True, []


@pytest.mark.parametrize('script', ['supcon', 'ce', 'linear'])
def test_every_flag_refuses_bad_values_in_one_line(script, capsys):
    base = ['--ckpt', 'x.pth'] if script == 'linear' else []
    checked = 0
    for flag, action in _typed_flags(script):
        needs = NEEDS.get(flag, [])
        if flag == '--ckpt':
            continue
        candidates = ['abc'] if action.type is not str else []
        if action.type in (int, float) or flag in ('--lr_decay_epochs', '--mean', '--std'):
            candidates += ['-1', '0'] + (['nan', 'inf', '-inf'] if action.type is float else [])
        for value in candidates:
            accepted, lines = _outcome(script, base + needs + [flag, value], capsys)
            if accepted:
                assert (flag, value) in ACCEPTED or (action.choices and value in action.choices), \
                    f'{script}: {flag} {value} was accepted'
            else:
                assert len(lines) == 1 and 'error' in lines[0] and 'Traceback' not in lines[0], (flag, value, lines)
            checked += 1
    assert checked > 20


# ---------------------------------------------------------------- bad input through the real scripts

BAD = {
    'unknown_dataset': (['main_supcon.py', '--dataset', 'mnist'], ['--dataset']),
    'unknown_model': (['main_ce.py', '--model', 'vgg'], ['--model']),
    'batch_size_0': (['main_supcon.py', '--batch_size', 0], ['--batch_size']),
    'negative_temp': (['main_supcon.py', '--temp', -0.5], ['--temp']),
    'mean_not_numbers': (['main_supcon.py', '--mean', '__import__("os")'], ['--mean']),
    'cifar_missing': (['main_ce.py', '--dataset', 'cifar10', '--model', 'resnet_tiny'], ['--data_folder']),
    'path_missing': (['main_supcon.py', '--dataset', 'path', '--data_folder', '/nonexistent',
                      '--mean', '0.5', '--std', '0.5'], ['train']),
    'path_needs_mean': (['main_supcon.py', '--dataset', 'path', '--data_folder', '/tmp'], ['--mean']),
    'linear_no_ckpt': (['main_linear.py'], ['--ckpt']),
    'linear_missing_ckpt': (['main_linear.py', '--ckpt', '/nonexistent/last.pth'], ['not found']),
    'resume_missing': (['main_ce.py', '--resume', '/nonexistent/last.pth'], ['not found']),
    'bad_device': (['main_ce.py', '--device', 'tpu'], ['--device']),
    'chunk_negative': (['main_supcon.py', '--chunk_size', -1], ['--chunk_size']),
    'queue_smaller_than_batch': (['main_supcon.py', '--queue_size', 100, '--batch_size', 128],
                                 ['--queue_size 100', '128']),
    'moco_m_one': (['main_supcon.py', '--queue_size', 1024, '--moco_m', 1], ['--moco_m']),
    'moco_m_without_queue': (['main_supcon.py', '--moco_m', 0.9], ['--moco_m needs --queue_size']),
    'queue_with_margin_triplet': (['main_supcon.py', '--queue_size', 1024, '--simclr_loss', 'margin_triplet'],
                                  ['--queue_size needs --simclr_loss ntxent']),
    'chunk_larger_than_batch': (['main_ce.py', '--chunk_size', 300, '--batch_size', 256], ['--chunk_size', '256']),
    'compile_backend_unknown': (['main_supcon.py', '--compile', '--compile_backend', 'nope'],
                                ['--compile_backend nope', 'aot_eager']),
    'compile_backend_without_compile': (['main_ce.py', '--compile_backend', 'eager'],
                                        ['--compile_backend needs --compile']),
    'compile_mode_without_compile': (['main_supcon.py', '--compile_mode', 'reduce-overhead'],
                                     ['--compile_mode needs --compile']),
    'compile_mode_of_another_backend': (['main_ce.py', '--compile', '--compile_backend', 'aot_eager', '--compile_mode',
                                         'reduce-overhead'], ['--compile_mode reduce-overhead', 'inductor']),
}


@pytest.mark.parametrize('case', sorted(BAD))
def test_bad_input(case, tmp_path):
    argv, words = BAD[case]
    extra = ['--data_folder', tmp_path / 'none'] if case == 'cifar_missing' else []
    proc = run_in_process(argv[0], *argv[1:], '--save_folder', tmp_path, *extra)
    assert_one_line_error(proc, *words)


@pytest.mark.slow
def test_bad_input_through_a_real_interpreter(tmp_path):
    """The same path in a subprocess (the entry point, sys.argv[0] as the program's name)."""
    assert_one_line_error(run_script('main_supcon.py', '--batch_size', 0, '--save_folder', tmp_path, check=False),
                          'main_supcon.py: error', '--batch_size')


@pytest.mark.parametrize('argv, words', [
    (['main_supcon.py', '--method', 'SimCLR', '--carrot'], ['class labels']),
    (['main_supcon.py', '--carrot_on', 'head'], ['--carrot']),
    (['main_ce.py', '--carrot', '--carrot_q_lo', 0.95], ['--carrot_q_lo']),
])
def test_carrot_errors(argv, words):
    proc = run_in_process(*argv)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    for w in words:
        assert w in proc.stderr


def test_integers_beyond_64_bits_are_refused_in_one_line(capsys):
    """--seed 1180591620717411303424 overflowed inside torch (a traceback)."""
    for script, flag in [('supcon', '--seed'), ('linear', '--shot_seed'), ('ce', '--epochs')]:
        base = ['--ckpt', 'x.pth'] if script == 'linear' else []
        accepted, lines = _outcome(script, base + [flag, '1180591620717411303424'], capsys)
        assert not accepted and len(lines) == 1 and f'{flag} is out of range' in lines[0]


def test_label_noise_kind_names_the_run_and_needs_noise():
    """--label_noise_kind pairflip is in the run name (symmetric, the default, keeps the old names); given without
    --label_noise it is a one-line error."""
    from config.options import parse_option
    from core.flags import UserError
    assert parse_option('supcon', ['--label_noise', '0.4', '--label_noise_kind', 'pairflip']).run_folder.endswith(
        '_noise_pairflip_0.4')
    assert parse_option('supcon', ['--label_noise', '0.4']).run_folder.endswith('_noise_0.4')
    with pytest.raises(UserError, match='--label_noise_kind needs --label_noise > 0'):
        parse_option('supcon', ['--label_noise_kind', 'pairflip'])


@pytest.mark.skipif(torch.cuda.is_available(), reason='this machine has a CUDA device')
def test_a_cuda_device_that_is_not_there_is_one_line_before_the_precision_asks_it(tmp_path):
    """--device cuda without a GPU: --amp auto asks the device's bf16 support while the options are parsed; the device
    check comes first (it was a traceback from torch's driver check)."""
    for script in ('main_supcon.py', 'main_ce.py'):
        for args in (['--device', 'cuda'], ['--device', 'cuda:1', '--amp', 'auto']):
            assert_one_line_error(run_in_process(script, *args, '--save_folder', tmp_path), 'no CUDA device')


def test_the_probes_default_is_normalized_and_stage_one_records_keep_theirs():
    """main_linear.py's --probe_norm defaults to bn (scale-robust); the scripts without the flag read ``none``
    (its ``absent`` value), so their options, run names and records are what they were before the default changed."""
    linear = parse_option('linear', ['--ckpt', 'x.pth'])
    assert linear.probe_norm == 'bn' and linear.run_name.endswith('_bnprobe')
    assert parse_option('linear', ['--ckpt', 'x.pth', '--probe_norm', 'none']).run_name.endswith('_trial_0')
    for script in ('supcon', 'ce'):
        opt = parse_option(script, [])
        assert opt.probe_norm == 'none' and 'probe' not in opt.run_name
