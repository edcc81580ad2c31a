"""engine/run.py: the run set-up and the epoch loop through
the real scripts: resume that refuses contradictions, run folders, interrupts, failing checkpoint writes."""
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from helpers import (
    FAST,
    ROOT,
    assert_one_line_error,
    load,
    only_run_folder,
    own_process,
    read_metrics,
    run_in_process,
    run_script,
    scaled,
    script_env,
    signal_after_first_checkpoint,
    start_script,
)


def _digest(path):
    import hashlib
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def copy_of(run, save_folder):
    """A copy of the run folder ``run`` at the same place under ``save_folder``: a run these tests may change."""
    kind_dataset_name = os.path.join(*run.split(os.sep)[-3:])
    target = os.path.join(save_folder, kind_dataset_name)
    shutil.copytree(run, target)
    return target


@pytest.mark.slow
@pytest.mark.xdist_group('rascal')
def test_contradicting_resume_is_refused_and_leaves_the_run_untouched(shared_run, tmp_path):
    last = os.path.join(copy_of(shared_run('rascal')[0], tmp_path), 'last.pth')
    before = _digest(last)
    proc = run_in_process('main_supcon.py', '--method', 'SupCon', '--temp', 0.1, '--epochs', 3, '--resume', last,
                          *FAST)
    assert_one_line_error(proc, '--method', "'RASCAL', now 'SupCon'", '--temp', '0.07', '0.1')
    assert _digest(last) == before and sorted(os.listdir(os.path.dirname(last))).count('last.pth') == 1
    # flags that do not change the experiment may differ: a longer --epochs extends the run
    out = run_script('main_supcon.py', '--method', 'RASCAL', '--epochs', 3, '--resume', last, *FAST, '--print_freq', 5,
                     '--save_freq', 7)
    assert f'run folder: {os.path.dirname(last)}' in out.stdout and load(last)['epoch'] == 3


@pytest.mark.slow
def test_resume_alone_continues_the_run_with_its_recorded_flags(tmp_path):
    """``--resume <run>/last.pth`` with no other flag (as the interrupt line advises) continues a run started with
    non-default flags: the run's run.json gives them, and the result equals the uninterrupted run's. A flag on the
    command line that contradicts the record is refused, named; one a resume may change (--epochs) is taken."""
    flags = [*FAST, '--epochs', 2, '--save_freq', 1, '--learning_rate', 0.3, '--temp', 0.2, '--method', 'SimCLR']
    run_script('main_supcon.py', *flags, '--save_folder', tmp_path / 'a')
    a = only_run_folder(tmp_path / 'a')
    crashed = tmp_path / 'crashed'
    crashed.mkdir()
    shutil.copy(os.path.join(a, 'ckpt_epoch_1.pth'), crashed / 'last.pth')
    shutil.copy(os.path.join(a, 'run.json'), crashed / 'run.json')
    assert_one_line_error(run_in_process('main_supcon.py', '--resume', crashed / 'last.pth', '--temp', 0.5),
                          '--temp: the checkpoint has 0.2, now 0.5')
    out = run_script('main_supcon.py', '--resume', crashed / 'last.pth')
    assert 'epoch 2/2' in out.stdout
    want, got = load(os.path.join(a, 'last.pth')), load(crashed / 'last.pth')
    assert got['epoch'] == 2 and all(torch_equal(want['model'][k], v) for k, v in got['model'].items())


def torch_equal(a, b):
    import torch
    return torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.xdist_group('ce')
def test_a_new_run_never_overwrites_an_existing_one(shared_run, tmp_path):
    from conftest import SHARED_RUNS
    script, flags = SHARED_RUNS['ce']
    last = os.path.join(copy_of(shared_run('ce')[0], tmp_path), 'last.pth')
    before = _digest(last)
    proc = run_in_process(script, *flags, '--epochs', 2, '--save_folder', tmp_path)     # the same command again
    assert_one_line_error(proc, 'already holds a run', 'last.pth (epoch 2 of 2)', '--resume', '--trial',
                          '--save_folder')
    assert _digest(last) == before


@pytest.mark.slow
def test_a_smoke_test_then_the_real_run_names_three_ways_on_and_the_schedule(tmp_path):
    """A 1-epoch smoke test of a cosine recipe, then the same recipe at 3 epochs: refused (run names leave out
    --epochs, as SupContrast's), naming --resume, --trial and --save_folder, and saying that --resume keeps the first
    epoch of a schedule laid out for 1 (not a fresh 3-epoch run's)."""
    args = [*FAST, '--cosine', '--save_folder', tmp_path]
    run_script('main_supcon.py', *args, '--epochs', 1)
    proc = run_in_process('main_supcon.py', *args, '--epochs', 3)
    assert_one_line_error(proc, 'already holds a run', 'epoch 1 of 1', '--resume', '--trial', '--save_folder',
                          'cosine schedule laid out for 1', 'fresh 3-epoch run')


@pytest.mark.slow
def test_the_lines_a_run_prints(tmp_path):
    """Step lines in SupContrast's form (batch and data time, the loss's last value and mean); one short line per
    epoch with the run's elapsed time and an estimate of what is left, the collapse statistics in brief (all of them
    in metrics.csv)."""
    out = run_script('main_supcon.py', *FAST, '--epochs', 2, '--print_freq', 5, '--save_folder', tmp_path).stdout
    steps = [line for line in out.splitlines() if line.startswith('SupCon: [')]
    assert steps and re.fullmatch(r'SupCon: \[1\]\[5/\d+\]\tBT [\d.]+ \([\d.]+\)\tDT [\d.]+ \([\d.]+\)\t'
                                  r'loss [\d.]+ \([\d.]+\)', steps[0]), steps[0]
    epochs = [line for line in out.splitlines() if line.startswith('epoch ')]
    assert len(epochs) == 2 and all(len(line) < 140 for line in epochs), epochs
    assert re.match(r'epoch 1/2 \([\d.]+s; 0:\d\d elapsed, about 0:\d\d left\): loss [\d.]+, lr [\d.]+ \| '
                    r'encoder z_std [\d.]+, cos [\d.]+$', epochs[0]), epochs[0]
    assert 'proj' not in epochs[0]
    rows = read_metrics(only_run_folder(tmp_path))
    assert {'train/collapse/z_std_proj', 'train/collapse/cos_proj', 'train/data_time'} <= set(rows[-1])
    ce = run_script('main_ce.py', *FAST, '--epochs', 1, '--save_folder', tmp_path / 'ce').stdout
    line = next(line for line in ce.splitlines() if line.startswith('epoch 1/1'))
    assert re.search(r': loss [\d.]+, train acc [\d.]+, lr [\d.]+, test acc [\d.]+', line), line   # each labelled
    # the epoch's time says what its test pass took beside its training (it is not in the training's time)
    assert re.match(r'epoch 1/1 \([\d.]+s \+ [\d.]+s evaluation; ', line), line


@pytest.mark.slow
@pytest.mark.xdist_group('tiny')
def test_a_run_folder_stands_for_its_last_checkpoint(tiny_ckpt, tmp_path):
    """``--ckpt <run>`` (main_linear.py, analyze.py) and ``--resume <run>``: its last.pth, said in one line."""
    run = os.path.dirname(tiny_ckpt)
    out = run_script('main_linear.py', '--ckpt', run, *FAST, '--epochs', 1, '--save_folder', tmp_path / 'lin')
    assert f'note: --ckpt {run} is a run folder: its last.pth' in out.stdout and 'final test top-1' in out.stdout
    copy = copy_of(run, tmp_path)
    out = run_script('main_supcon.py', '--resume', copy, *FAST, '--epochs', 2)
    assert f'--resume {copy} is a run folder' in out.stdout and load(os.path.join(copy, 'last.pth'))['epoch'] == 2
    out = run_script('analyze.py', '--ckpt', run, '--out', tmp_path / 'an', '--max_points', 50)
    assert 'is a run folder' in out.stdout and (tmp_path / 'an' / 'tsne.png').exists()
    assert_one_line_error(run_in_process('main_linear.py', '--ckpt', tmp_path), 'is a folder without a last.pth')


@pytest.mark.parametrize('folder', ['/proc/no_such_dir/runs', 'FILE'])
def test_unwritable_save_folder_fails_before_any_data(tmp_path, folder):
    if folder == 'FILE':
        folder = tmp_path / 'a_file'
        folder.write_text('not a folder')
    start = time.time()
    proc = run_in_process('main_supcon.py', '--save_folder', folder, '--dataset', 'cifar10', '--data_folder',
                          tmp_path / 'none')     # CIFAR is absent: the folder must be checked first
    assert_one_line_error(proc, 'run folder', str(folder), '--save_folder')
    assert time.time() - start < 60


DISK_FULL_FROM = '''
import os, runpy, sys, tempfile
from_save = int(sys.argv.pop(1))
real_mkstemp, calls = tempfile.mkstemp, {'n': 0}
def mkstemp(*args, **kwargs):        # checkpoint.save_checkpoint's temporary file
    calls['n'] += 1
    fd, path = real_mkstemp(*args, **kwargs)
    if calls['n'] >= from_save:      # from this save on, writes go to /dev/full: ENOSPC
        os.close(fd)
        fd = os.open('/dev/full', os.O_WRONLY)
    return fd, path
tempfile.mkstemp = mkstemp
sys.path[0] = os.getcwd()            # the repository, as for main_supcon.py itself
sys.argv = ['main_supcon.py'] + sys.argv[1:]
runpy.run_path('main_supcon.py', run_name='__main__')
'''


def run_with_full_disk(from_save, tmp_path, epochs=3):
    """main_supcon.py on digits whose checkpoint writes fail with a real ENOSPC from the kernel (/dev/full)
    from the ``from_save``-th checkpoint on."""
    script = tmp_path / 'disk_full.py'
    script.write_text(DISK_FULL_FROM)
    return run_script(script, from_save, '--epochs', epochs, *FAST, '--save_folder', tmp_path / 'runs', check=False)


@pytest.mark.skipif(not os.path.exists('/dev/full'), reason='needs /dev/full')
@pytest.mark.slow
def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path):
    proc = run_with_full_disk(2, tmp_path, epochs=2)   # epoch 1 saved, epoch 2's last.pth hits a full disk
    assert_one_line_error(proc, 'cannot write checkpoint', 'No space left on device', 'MB free',
                          'previous one is intact')
    run = only_run_folder(tmp_path)
    assert load(os.path.join(run, 'last.pth'))['epoch'] == 1
    assert os.listdir(run).count('last.pth') == 1 and not [f for f in os.listdir(run) if f.startswith('.tmp')]


@pytest.mark.skipif(not os.path.exists('/dev/full'), reason='needs /dev/full')
@pytest.mark.slow
def test_a_full_disk_before_the_first_checkpoint_says_nothing_was_saved(tmp_path):
    proc = run_with_full_disk(1, tmp_path, epochs=1)
    assert_one_line_error(proc, 'cannot write checkpoint', 'No space left on device', 'nothing was saved yet')
    assert 'previous' not in proc.stderr and 'inline_container' not in proc.stderr
    assert not [f for _, _, files in os.walk(tmp_path) for f in files if f.endswith('.pth')]


@pytest.mark.slow
def test_sigterm_says_how_to_continue(tmp_path):
    proc, last, err = signal_after_first_checkpoint('main_ce.py', ['--epochs', 5, *FAST, '--save_folder', tmp_path],
                                                    tmp_path, signal.SIGTERM, delay=0.5)
    assert last is not None and proc.returncode == 143, err
    assert err.strip().splitlines() == [f'main_ce.py: interrupted; the last complete checkpoint is intact: '
                                        f'continue with --resume {last}']
    assert load(last)['epoch'] >= 1


@pytest.mark.slow
def test_deterministic_mode_runs_every_part(tmp_path):
    """``--deterministic`` (torch.use_deterministic_algorithms; an operation without a deterministic form raises)
    with RASCAL, CARROT, the queue, device augmentation and the kNN monitor, then CE + CARROT and a linear
    evaluation: no operation of ours is refused (on a CPU; tests/test_cuda.py repeats it on CUDA)."""
    run_script('main_supcon.py', *FAST, '--deterministic', '--method', 'RASCAL', '--carrot', '--queue_size', 256,
               '--augment', 'device', '--knn_every', 1, '--epochs', 1, '--save_folder', tmp_path / 'pre')
    last = os.path.join(only_run_folder(tmp_path / 'pre'), 'last.pth')
    out = run_script('main_linear.py', *FAST, '--deterministic', '--epochs', 1, '--ckpt', last,
                     '--save_folder', tmp_path / 'lin')
    assert 'final test top-1' in out.stdout
    out = run_script('main_ce.py', *FAST, '--deterministic', '--carrot', '--epochs', 1,
                     '--save_folder', tmp_path / 'ce')
    assert 'final test top-1' in out.stdout


# ---------------------------------------------------------------- resume: finished runs, roll-backs, stage 2's input
@pytest.mark.slow
def test_stage_two_takes_its_input_from_stage_one_and_a_linear_run_resumes(tmp_path):
    """main_linear.py takes --size (and --model, --mean, --std) from the stage-1
    checkpoint and refuses a contradicting --size in one line; its run resumes with its own flags (extended by
    --epochs), and resuming a finished run changes nothing (one line, exit 0)."""
    import json
    run_script('main_supcon.py', '--size', 8, '--epochs', 1, '--save_folder', tmp_path / 'pre', *FAST)
    ckpt = os.path.join(only_run_folder(tmp_path / 'pre'), 'last.pth')
    lin_args = ['--ckpt', ckpt, '--learning_rate', 1, '--save_folder', tmp_path / 'lin', *FAST]
    run_script('main_linear.py', *lin_args, '--epochs', 2)
    lin = only_run_folder(tmp_path / 'lin')
    results = os.path.join(lin, 'results.json')
    assert json.load(open(results))['config']['size'] == 8
    assert_one_line_error(run_in_process('main_linear.py', *lin_args, '--epochs', 2, '--size', 16),
                          '--size 16 contradicts the stage-1 checkpoint')
    before = _digest(results), _digest(os.path.join(lin, 'last.pth'))
    done = run_script('main_linear.py', *lin_args, '--epochs', 2, '--resume', os.path.join(lin, 'last.pth'))
    assert done.stdout.strip().splitlines() == [f'{os.path.join(lin, "last.pth")}: the run is finished (epoch 2, '
                                                f'--epochs 2): nothing to do']
    assert (_digest(results), _digest(os.path.join(lin, 'last.pth'))) == before
    more = run_script('main_linear.py', *lin_args, '--epochs', 3, '--resume', os.path.join(lin, 'last.pth'))
    assert f'resumed from {os.path.join(lin, "last.pth")} at epoch 2' in more.stdout
    assert [r['epoch'] for r in read_metrics(lin)] == ['1', '2', '3']


@pytest.mark.slow
def test_resuming_an_older_checkpoint_is_refused(tmp_path):
    """Resuming ckpt_epoch_1.pth of a run whose last.pth is at epoch 2 would roll it back."""
    args = ['--epochs', 2, '--save_freq', 1, '--size', 8, '--batch_size', 256, '--num_workers', 0,
            '--print_freq', 1000, '--device', 'cpu']
    run_script('main_ce.py', *args, '--save_folder', tmp_path)
    run = only_run_folder(tmp_path)
    before = _digest(os.path.join(run, 'last.pth'))
    proc = run_in_process('main_ce.py', *args, '--resume', os.path.join(run, 'ckpt_epoch_1.pth'))
    assert_one_line_error(proc, 'is at epoch 2, past --resume', 'roll the run back')
    assert _digest(os.path.join(run, 'last.pth')) == before and len(read_metrics(run)) == 2


# ---------------------------------------------------------------- run folders: one process, one experiment, short names
SMALL = ['--size', 8, '--epochs', 1, *FAST]


def test_a_run_folder_is_held_by_one_process(tmp_path):
    """A run folder is locked before any work; a second process on it gets one line naming the
    holder (here a lock this test holds, as a running script does) and writes nothing there."""
    import fcntl

    from config.options import parse_option
    folder = parse_option('supcon', list(map(str, [*SMALL, '--save_folder', tmp_path]))).run_folder
    os.makedirs(folder)
    with open(os.path.join(folder, '.lock'), 'w') as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write('pid 4242 on elsewhere since today (main_supcon.py --seed 1)\n')
        held.flush()
        proc = run_in_process('main_supcon.py', *SMALL, '--save_folder', tmp_path)
    assert_one_line_error(proc, f'{folder} is in use by pid 4242 on elsewhere', '--seed 1', '--trial')
    assert sorted(os.listdir(folder)) == ['.lock']


def test_the_seed_names_the_run_and_a_folder_refuses_another_experiment(tmp_path):
    """--seed is in the run name (not when it is the default 0, SupContrast's names); a flag
    that is not in the name but changes the result (here --momentum) makes the folder refuse a second experiment
    even before the first wrote a checkpoint; the same experiment takes over what an attempt without a checkpoint
    left."""
    from config.options import parse_option
    from engine.run import RUN_IDENTITY, prepare_run_folder
    from runtime.run_folder import release_run_folder

    def opt_of(*args):
        return parse_option('supcon', list(map(str, [*SMALL, '--save_folder', tmp_path, *args])))
    assert opt_of('--seed', 2).run_folder.endswith('trial_0_devaug_seed_2')      # SMALL: --augment device
    assert opt_of().run_folder.endswith('trial_0_devaug')
    first = opt_of()
    first.rank = 0
    prepare_run_folder(first)          # an attempt interrupted in its first epoch: TensorBoard, no checkpoint
    release_run_folder()
    os.makedirs(os.path.join(first.run_folder, 'tensorboard'))
    assert json_of(os.path.join(first.run_folder, RUN_IDENTITY))['config']['momentum'] == 0.9
    proc = run_in_process('main_supcon.py', *SMALL, '--save_folder', tmp_path, '--momentum', 0.5)
    assert_one_line_error(proc, 'holds another experiment', "--momentum: the folder has 0.9, now 0.5", '--trial')
    run_script('main_supcon.py', *SMALL, '--save_folder', tmp_path)     # the same experiment: taken over
    assert load(os.path.join(first.run_folder, 'last.pth'))['epoch'] == 1


def json_of(path):
    import json
    with open(path) as f:
        return json.load(f)


@pytest.mark.slow
def test_two_runs_started_at_once_on_one_folder(tmp_path):
    """The same command started twice at once: one run trains, the other stops with one line
    (the folder is in use, or, if the first finished already, holds a run); one TensorBoard file."""
    cmd = [*own_process(os.path.join(ROOT, 'main_supcon.py')), *map(str, [*SMALL, '--epochs', 2,
                                                                            '--save_folder', tmp_path])]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=script_env()) for _ in range(2)]
    done = [(p.wait(timeout=scaled(600)), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in done) == [0, 2], done
    err = next(e for code, e in done if code == 2).strip().splitlines()
    assert len(err) == 1 and ('is in use by pid' in err[0] or 'already holds a run' in err[0]), err
    run = only_run_folder(tmp_path)
    assert len(os.listdir(os.path.join(run, 'tensorboard'))) == 1 and load(os.path.join(run, 'last.pth'))['epoch'] == 2


@pytest.mark.slow
def test_a_long_trial_fits_at_both_stages(tmp_path):
    """A --trial that makes a 300-byte run name: stage 1's folder name is shortened with a hash
    (the full name in run.json), and stage 2, whose name adds to stage 1's, runs too."""
    trial = 't' * 240
    run_script('main_supcon.py', *SMALL, '--trial', trial, '--save_folder', tmp_path / 'pre')
    pre = only_run_folder(tmp_path / 'pre')
    assert len(os.path.basename(pre)) == 255 and json_of(os.path.join(pre, 'run.json'))['run_name'].endswith(
        f'{trial}_devaug')
    run_script('main_linear.py', '--ckpt', os.path.join(pre, 'last.pth'), '--epochs', 1, *FAST,
               '--save_folder', tmp_path / 'lin')
    assert len(os.path.basename(only_run_folder(tmp_path / 'lin'))) == 255


@pytest.mark.slow
def test_a_burst_of_sigterms_gives_one_line(tmp_path):
    """Many SIGTERMs in a row (a cluster's scheduler, a shell loop) while the run winds down
    and writes: one line on stderr, however many signals, and the checkpoint intact."""
    args = ['--epochs', 50, *FAST, '--save_folder', tmp_path]
    proc = start_script('main_ce.py', args)
    deadline, last = time.time() + 300, None
    while time.time() < deadline and proc.poll() is None and last is None:
        last = next((os.path.join(d, 'last.pth') for d, _, fs in os.walk(tmp_path) if 'last.pth' in fs), None)
        time.sleep(0.02)
    for _ in range(200):
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.002)
    _, err = proc.communicate(timeout=120)
    assert last is not None and proc.returncode == 143, err
    assert err.strip().splitlines() == [f'main_ce.py: interrupted; the last complete checkpoint is intact: '
                                        f'continue with --resume {last}'], err
    assert load(last)['epoch'] >= 1
