"""main_supcon.py end to end on the bundled digits: every method, the SimCLR loss family, CARROT, gradient
caching, the queue, and linear evaluation of the result (exact resume: tests/engine/test_resume.py). Runs that several
tests read are trained once per session (``shared_run``, tests/conftest.py)."""
import json
import os

import pytest
import torch
from conftest import CHUNKED, QUEUED, SMALL_DATA

from helpers import (
    CPU_AUGMENT,
    FAST,
    assert_one_line_error,
    load,
    method_modes,
    only_run_folder,
    read_metrics,
    run_in_process,
    run_script,
)

pytestmark = pytest.mark.slow    # runs the real scripts in subprocesses


@pytest.mark.xdist_group('supcon')
def test_supcon_then_linear_on_digits(shared_run, tmp_path):
    run, _ = shared_run('supcon')
    assert os.path.basename(run).startswith('SupCon_digits_resnet_nano_lr_0.05_decay_0.0001_bsz_64_temp_0.07')
    rows = read_metrics(run)
    assert [r['epoch'] for r in rows] == ['1', '2'] and float(rows[0]['train/loss']) > 0
    assert any(f.startswith('events') for f in os.listdir(os.path.join(run, 'tensorboard')))
    ckpt = load(os.path.join(run, 'last.pth'))   # weights_only=True
    assert ckpt['epoch'] == 2 and ckpt['config']['model'] == 'resnet_nano'

    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 2,
                     '--learning_rate', 1, '--save_folder', tmp_path / 'lin', *FAST)
    assert out.stdout.strip().splitlines()[-1].startswith('final test top-1: ')
    lin = only_run_folder(tmp_path / 'lin')
    results = json.load(open(os.path.join(lin, 'results.json')))
    assert 10 < results['final_test_acc'] <= 100
    assert {'test/acc', 'test/nll', 'train/acc', 'train/loss'} <= set(read_metrics(lin)[0])


@pytest.mark.parametrize('name', [pytest.param(n, marks=pytest.mark.xdist_group(n))
                                  for n in ('rascal', 'chunked', 'queue')])
def test_linear_reads_the_checkpoints_of_every_mode(shared_run, name):
    """main_linear.py's loading of a checkpoint that carries RASCAL's cache, was trained in chunks, or carries a
    queue and a key encoder: the encoder comes back equal to the checkpoint's (what follows the loading is the
    same for every checkpoint and runs end to end in test_supcon_then_linear_on_digits)."""
    import torch

    from config.options import parse_option
    from runtime.checkpoint import load_encoder
    last = os.path.join(shared_run(name)[0], 'last.pth')
    opt = parse_option('linear', ['--ckpt', last])
    opt.device = torch.device('cpu')
    from runtime.device import Runtime
    encoder, opt.model = load_encoder(opt.ckpt, opt.model, 'resnet50', Runtime(opt.device))
    saved = {k[len('encoder.'):]: v for k, v in load(last)['model'].items() if k.startswith('encoder.')}
    assert opt.model == 'resnet_nano' and encoder.state_dict().keys() == saved.keys()
    assert all(torch.equal(encoder.state_dict()[k], v) for k, v in saved.items())


def test_simclr_bf16_channels_last_linear_head(tmp_path):
    run_script('main_supcon.py', '--method', 'SimCLR', '--epochs', 2, '--amp', 'bf16', '--channels_last',
               '--temp', 0.5, '--head', 'linear', '--feat_dim', 32, '--save_freq', 1, '--trial', 7, '--cosine',
               '--warm', '--warm_epochs', 1, '--save_folder', tmp_path, *FAST, *CPU_AUGMENT)
    run = only_run_folder(tmp_path)
    assert 'SimCLR_digits' in run and run.endswith('trial_7_cosine_warm_warm_epochs_1_bf16')
    assert os.path.exists(os.path.join(run, 'ckpt_epoch_1.pth'))
    assert load(os.path.join(run, 'last.pth'))['model']['head.weight'].shape == (32, 64)      # resnet_nano's 64-d


RASCAL_STATS = ['avg_pos_per_anchor', 'cache_hit_rate', 'ranked_row_rate', 'rank_drift_mean', 'rank_drift_std',
         'w_entropy']


@pytest.mark.xdist_group('rascal')
def test_rascal_statistics_and_cache(shared_run):
    run, _ = shared_run('rascal')
    rows = read_metrics(run)
    for s in RASCAL_STATS:
        assert f'train/rascal/{s}' in rows[0]
    assert float(rows[0]['train/rascal/cache_hit_rate']) == 0.0
    assert float(rows[1]['train/rascal/cache_hit_rate']) == 1.0
    assert float(rows[1]['train/rascal/ranked_row_rate']) > 0.5
    cache = load(os.path.join(run, 'last.pth'))['extra']['criterion']
    assert cache['cache_feat'].shape == (1437, 128) and bool(cache['cache_valid'].all())
    assert os.listdir(os.path.join(run, 'tensorboard'))


@pytest.mark.xdist_group('rascal')
def test_rascal_errors(shared_run):
    proc = run_in_process('main_supcon.py', '--rascal_weighting', 'current')
    assert proc.returncode == 2 and '--method RASCAL' in proc.stderr
    # resuming a RASCAL run with another head size: refused in one line, before anything is written
    last = os.path.join(shared_run('rascal')[0], 'last.pth')
    proc = run_in_process('main_supcon.py', '--method', 'RASCAL', '--epochs', 3, '--feat_dim', 64, '--resume', last,
                          *FAST)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


FAMILY_RUNS = [
    ('SimCLR', 'ntlogistic', ['--temp', '0.5'], 'SimCLR-ntlogistic_digits', '_temp_0.5_'),
    ('SimCLR', 'margin_triplet', [], 'SimCLR-margin_triplet_digits', '_margin_1.0_'),
    ('SupCon', 'margin_triplet', ['--margin', '0.5'], 'SupCon-margin_triplet_digits', '_margin_0.5_'),
]


def test_loss_family_run_names():
    from config.options import parse_option
    for method, loss, extra, name, scale in FAMILY_RUNS:
        folder = parse_option('supcon', ['--method', method, '--simclr_loss', loss, *extra]).run_folder
        assert name in folder and scale in folder, folder


def test_one_digits_epoch_of_a_margin_loss(tmp_path):
    """margin_triplet through the script (NT-Logistic trains in test_chunked_methods_train)."""
    method, loss, extra, name, scale = FAMILY_RUNS[2]
    run_script('main_supcon.py', '--method', method, '--simclr_loss', loss, *extra, '--epochs', 1,
               '--save_folder', tmp_path, *FAST)
    run = only_run_folder(tmp_path)
    assert name in run and scale in run
    assert float(read_metrics(run)[0]['train/loss']) > 0


CARROT_STATS = ['L', 'U', 'pos_mean', 'pos_max', 'frac_pos_above_U', 'frac_pos_below_L', 'alpha', 'reg']


@pytest.mark.parametrize('method', ['SupCon', 'RASCAL'])
def test_supcon_carrot_then_linear(tmp_path, method):
    extra = ['--carrot_on', 'head', '--carrot_alpha_max', 100] if method == 'RASCAL' else []
    run_script('main_supcon.py', '--method', method, '--carrot', *extra, '--epochs', 1,
               '--save_folder', tmp_path / 'pre', *FAST)
    run = only_run_folder(tmp_path / 'pre')
    assert '_carrot' in os.path.basename(run)
    rows = read_metrics(run)
    for s in CARROT_STATS:
        assert f'train/carrot/{s}' in rows[-1], s
    assert float(rows[-1]['train/carrot/alpha']) >= 0 and 0 < float(rows[-1]['train/carrot/U']) <= 0.999
    if method == 'RASCAL':
        assert float(rows[-1]['train/carrot/alpha']) <= 100
        return
    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 1,
                     '--save_folder', tmp_path / 'lin', *FAST)
    assert 'ECE' in out.stdout and 'NLL' in out.stdout
    res = json.load(open(os.path.join(only_run_folder(tmp_path / 'lin'), 'results.json')))
    assert 0 <= res['final_test_ece'] <= 1 and res['final_test_nll'] > 0


# ---------------------------------------------------------------- the published variants (docs/FIELD.md)
FEATURES = {   # method -> flags: each with one of the features its definition allows
    'KCL': ['--kcl_k', 2, '--chunk_size', 40],
    'SINCERE': ['--queue_size', 256, '--moco_m', 0],
    'EpsSupInfoNCE': ['--eps_margin', 0.2, '--carrot'],
    'SupDCL': ['--carrot', '--carrot_on', 'head'],
    'Spread': ['--spread_alpha', 0.3, '--queue_size', 256],
    'BCL': ['--dataset', 'digits_lt', '--imb_factor', 0.1, '--chunk_size', 40, '--carrot'],   # parameters of its own
    'PaCo': ['--dataset', 'digits_lt', '--imb_factor', 0.1, '--queue_size', 256, '--moco_m', 0.9, '--chunk_size', 40],
    'TSC': ['--kcl_k', 3, '--carrot'],      # targets re-assigned each epoch: the assignment is resumed too
    # its selection after epoch 1 (bank, snapshot, threshold) is resumed too; the key encoder's keys as partners
    'SelCL': ['--selcl_k', 10, '--queue_size', 256, '--moco_m', 0.9],
    'RINCE': ['--rince_q', 0.2, '--chunk_size', 40, '--carrot'],
}


def field():
    """Every method of the registry but ours (tested above): its flags in :data:`FEATURES`, else its richest mode of
    ``helpers.method_modes`` (a queue of 256 keys, this test's batch, and CARROT where it takes them), so a newly
    registered method is trained, resumed and evaluated here too."""
    richest = {}
    for argv in method_modes(queue=('--queue_size', '256'), skip=('SupCon', 'SimCLR', 'RASCAL')).values():
        if len(argv[2:]) >= len(richest.get(argv[1], [])):
            richest[argv[1]] = argv[2:]
    return {**richest, **FEATURES}


FIELD = field()


@pytest.mark.parametrize('method', list(FIELD))
def test_field_method_trains_resumes_exactly_and_evaluates(method, tmp_path):
    """2 epochs through main_supcon.py (device augmentation); epoch 1's checkpoint, copied into a fresh folder and
    resumed, reaches the
    same weights bit for bit (and KCL's draw count); then main_linear.py evaluates the encoder."""
    import shutil

    import torch
    args = ['--method', method, *FIELD[method], *FAST, '--batch_size', 256, '--save_freq', 1]
    run_script('main_supcon.py', *args, '--epochs', 2, '--save_folder', tmp_path / 'a')
    run = only_run_folder(tmp_path / 'a')
    assert os.path.basename(run).startswith(method)
    rows = read_metrics(run)
    assert [r['epoch'] for r in rows] == ['1', '2'] and all(float(r['train/loss']) == float(r['train/loss'])
                                                             for r in rows)
    copy = tmp_path / 'b' / os.path.relpath(run, tmp_path / 'a')
    os.makedirs(copy)
    shutil.copy(os.path.join(run, 'ckpt_epoch_1.pth'), copy / 'last.pth')
    run_script('main_supcon.py', *args, '--epochs', 2, '--resume', copy / 'last.pth')
    want, got = load(os.path.join(run, 'last.pth')), load(copy / 'last.pth')
    assert got['epoch'] == 2
    assert all(torch.equal(got['model'][k], v) for k, v in want['model'].items())
    for part, state in want['extra'].items():      # the loss's own state: BCL's classifier, KCL's draw count
        assert all(torch.equal(got['extra'][part][k], v) if torch.is_tensor(v) else got['extra'][part][k] == v
                   for k, v in state.items()), part
    if method in ('KCL', 'TSC'):
        assert got['extra']['criterion']['_extra_state'] == want['extra']['criterion']['_extra_state'] == {'calls': 12}
    if method == 'TSC':       # the sums are cleared at each epoch's end, after the matching
        assert sorted(want['extra']['criterion']['assignment'].tolist()) == list(range(10))
        assert not want['extra']['criterion']['class_counts'].any() and 'train/tsc/target_cos' in rows[0]
    if method in ('BCL', 'PaCo'):      # its classifier is trained, saved and resumed
        assert 'classifier.weight' in want['extra']['criterion']
        assert {'BCL': 'train/bcl/ce', 'PaCo': 'train/paco/class_acc'}[method] in rows[0]
    out = run_script('main_linear.py', '--ckpt', os.path.join(run, 'last.pth'), '--epochs', 1, '--size', 8,
                     '--save_folder', tmp_path / 'lin', *FAST)
    assert out.stdout.strip().splitlines()[-1].startswith('final test top-1: ')


def test_field_method_errors():
    for args, words in [(['--method', 'KCL', '--queue_size', 64], '--queue_size is not defined for --method KCL'),
                        (['--method', 'KCL', '--kcl_k', -1], '--kcl_k must be >= 0'),
                        (['--method', 'EpsSupInfoNCE', '--eps_margin', -0.1], '--eps_margin must be >= 0'),
                        (['--method', 'Spread', '--spread_alpha', 2], '--spread_alpha must be in [0, 1]'),
                        (['--method', 'SupCon', '--kcl_k', 2], '--kcl_k needs --method KCL'),
                        (['--method', 'BCL', '--bcl_weight', -1], '--bcl_ce_weight and --bcl_weight must be >= 0'),
                        (['--method', 'BCL', '--queue_size', 64], '--queue_size is not defined for --method BCL'),
                        (['--method', 'PaCo', '--paco_beta', 0], '--paco_beta > 0'),
                        (['--method', 'SupCon', '--paco_alpha', 0.1], '--paco_alpha needs --method PaCo or GPaCo'),
                        (['--method', 'TSC', '--tsc_weight', -1], '--tsc_weight must be finite and >= 0'),
                        (['--method', 'TSC', '--queue_size', 64], '--queue_size is not defined for --method TSC')]:
        assert_one_line_error(run_in_process('main_supcon.py', *args), words)


# ---------------------------------------------------------------- gradient caching end to end
@pytest.mark.parametrize('script,args', [
    ('main_supcon.py', ['--method', 'SimCLR', '--simclr_loss', 'ntlogistic', '--amp', 'bf16', *SMALL_DATA]),
    ('main_supcon.py', ['--method', 'RASCAL', '--rascal_weighting', 'current', '--carrot']),
    ('main_ce.py', ['--carrot', '--amp', 'fp16', *SMALL_DATA]),
])
def test_chunked_methods_train(tmp_path, script, args):
    run_script(script, *args, '--epochs', 1, '--save_folder', tmp_path, *CHUNKED)
    run = only_run_folder(tmp_path)
    assert 'RASCAL-current_digits' in run if 'RASCAL' in args else True
    row = read_metrics(run)[0]
    assert float(row['train/loss']) > 0 and float(row['train/collapse/z_std_enc']) > 0


# ---------------------------------------------------------------- the memory queue end to end
@pytest.mark.xdist_group('queue')
def test_queue_statistics_and_state(shared_run):
    run, _ = shared_run('queue')
    ckpt = load(os.path.join(run, 'last.pth'))
    assert {'queue', 'key_encoder'} <= set(ckpt['extra']) and bool(ckpt['extra']['queue']['valid'].all())
    row = read_metrics(run)[-1]
    assert float(row['train/queue/fill']) == 1.0 and 0 < float(row['train/queue/key_query_cos']) <= 1
    assert float(row['train/queue/pos_per_anchor']) > 10 and float(row['train/queue/key_age']) > 1


@pytest.mark.parametrize('args', [['--method', 'SimCLR', '--moco_m', 0],
                                  ['--method', 'RASCAL', '--rascal_weighting', 'uniform', '--carrot',
                                   '--chunk_size', 24]])
def test_queue_with_other_methods(tmp_path, args):
    run_script('main_supcon.py', *args, '--epochs', 1, '--save_folder', tmp_path, *QUEUED)
    run = only_run_folder(tmp_path)
    assert '_queue_256_m_' in run
    assert 'RASCAL-uniform_digits' in run if 'RASCAL' in args else True
    row = read_metrics(run)[0]
    assert float(row['train/queue/fill']) > 0.8 and float(row['train/loss']) > 0    # the epoch mean: filling at first
    if 'SimCLR' in args:
        assert float(row['train/queue/pos_per_anchor']) == 0 and 'train/queue/key_query_cos' not in row


@pytest.mark.slow
def test_a_timm_vit_trains_resumes_exactly_and_is_evaluated(tmp_path):
    """``--model timm:<name>`` through the real scripts: a 2-block ViT at 16 px pre-trains, 1 epoch +
    ``--resume`` equals 2 epochs bit for bit, main_linear.py rebuilds the encoder from the checkpoint (its
    ``--model_args`` and size) and evaluates it, main_ce.py trains it; wrong names and flags are one line."""
    vit = ['--model', 'timm:vit_tiny_patch16_224', '--model_args', 'depth=2,patch_size=8,embed_dim=32,num_heads=2',
           '--size', 16, '--augment', 'device', '--batch_size', 128, '--num_workers', 0, '--device', 'cpu',
           '--print_freq', 1000]
    run_script('main_supcon.py', *vit, '--epochs', 2, '--save_folder', tmp_path / 'whole')
    run_script('main_supcon.py', *vit, '--epochs', 1, '--save_folder', tmp_path / 'parts')
    part = os.path.join(only_run_folder(tmp_path / 'parts'), 'last.pth')
    run_script('main_supcon.py', *vit, '--epochs', 2, '--resume', part)
    whole = load(os.path.join(only_run_folder(tmp_path / 'whole'), 'last.pth'))
    resumed = load(part)
    assert 'timm-vit_tiny_patch16_224_depth-2' in only_run_folder(tmp_path / 'whole')
    assert any(k.startswith('encoder.blocks.1.') for k in whole['model'])
    for key, value in whole['model'].items():
        assert torch.equal(value, resumed['model'][key]), key
    out = run_script('main_linear.py', '--ckpt', part, '--epochs', 1, '--batch_size', 128, '--num_workers', 0,
                     '--augment', 'device', '--device', 'cpu', '--save_folder', tmp_path / 'lin')
    assert 'final test top-1' in out.stdout
    run_script('main_ce.py', *vit, '--epochs', 1, '--save_folder', tmp_path / 'ce')
    for args, words in [(['--model', 'timm:no_such_net'], 'timm has no model'),
                        (['--model', 'timm:resnet18', '--stem', 'imagenet'], '--stem is for our ResNets'),
                        (['--model', 'resnet18', '--model_args', 'depth=2'], '--model_args is for timm models'),
                        (['--model', 'timm:resnet18', '--model_args', 'depth'], 'key=value'),
                        (['--model', 'vgg'], '--model')]:
        assert_one_line_error(run_in_process('main_supcon.py', *args, '--save_folder', tmp_path / 'bad'), *words)
    assert_one_line_error(run_in_process('main_linear.py', '--ckpt', part, '--model_args', 'depth=3'),
                          '--model_args', 'contradicts')


@pytest.mark.slow
def test_compile_trains_and_its_checkpoints_load_without_it(tmp_path):
    """``--compile`` (torch.compile of the encoder and head, in place) trains; its checkpoint holds the plain
    parameter names, resumes without ``--compile`` (not part of the experiment) and loads in main_linear.py. The
    backend is aot_eager: the graphs inductor gets, without its code generation (with inductor this test took 70 s
    alone on a cold cache here, 26 s without: docs/results.md; the GPU check compiles with inductor on CUDA)."""
    args = ['--epochs', 1, '--batch_size', 128, '--size', 8, '--augment', 'device', '--num_workers', 0, '--device',
            'cpu', '--print_freq', 1000, '--save_folder', tmp_path / 'pre']
    run_script('main_supcon.py', '--compile', '--compile_backend', 'aot_eager', *args)
    ckpt = os.path.join(only_run_folder(tmp_path / 'pre'), 'last.pth')
    state = load(ckpt)
    assert state['config']['compile'] is True and state['config']['compile_backend'] == 'aot_eager'
    assert not any('_orig_mod' in key for key in state['model'])
    out = run_script('main_supcon.py', *args[2:], '--epochs', 2, '--resume', ckpt)
    assert 'resumed from' in out.stdout and load(ckpt)['epoch'] == 2
    out = run_script('main_supcon.py', *args[2:], '--epochs', 3, '--resume', ckpt, '--compile', 'off')
    assert 'resumed from' in out.stdout and load(ckpt)['epoch'] == 3 and load(ckpt)['config']['compile'] is False
    out = run_script('main_linear.py', '--ckpt', ckpt, '--epochs', 1, '--batch_size', 128, '--augment', 'device',
                     '--num_workers', 0, '--device', 'cpu', '--save_folder', tmp_path / 'lin')
    assert 'final test top-1' in out.stdout
