"""The run around a trainer, shared by the three scripts: its set-up (device, torchrun, seed, the run folder and its
identity, ``--resume``'s checks) and its epochs (:func:`fit`: the schedule, the trainer's epoch and evaluation, the
collapse watch, logging, checkpoints, ``--resume``), then ``results.json``. The loop inside an epoch is
``training/loop.py``'s, the step the trainer's (``training/steps.py``, ``evaluation/probes.py``)."""
import json
import os
import time
from typing import Optional

import torch

from config.resume import config_dict, resume_conflicts
from core.flags import UserError, call_hook
from data import held_out_labels
from runtime.checkpoint import load_checkpoint, load_model_state, save_checkpoint
from runtime.device import describe_path, keep_freed_memory, resolve_device, set_deterministic
from runtime.distributed import all_gather_object, barrier, init_distributed, is_main, rank, world_size
from runtime.rng import GENERATORS, get_rng_state, rank_rng_state, set_rng_state, set_seed
from runtime.run_folder import RUN, RUN_IDENTITY, hold_run_folder, writable_folder
from runtime.run_log import RunLogger, read_metrics
from tracking.trackers import finish as finish_trackers
from tracking.trackers import open_for_run as open_trackers
from tracking.trackers import parse_trackers
from training.loop import Optimization, Trainer
from training.monitors import CollapseWatch
from util import clock


def setup(opt, run_folder=True):
    """Set the run up after ``parse_option``, before any data is loaded: with ``--resume`` check that
    the checkpoint is this script's and defines the same experiment; create the run folder and check that
    it can be written (``run_folder=False``: skip both, for tests); resolve ``--device``; under torchrun
    join the process group (this rank's device, the local batch, other ranks' stdout silenced); seed
    this process (``seed + rank``: each process augments differently, DDP syncs the weights)."""
    set_deterministic(opt.deterministic)        # before the first CUDA call (cuBLAS reads its workspace setting)
    opt.device = resolve_device(opt.device)
    if opt.device.type == 'cuda' and opt.device.index is not None:
        torch.cuda.set_device(opt.device)       # the device whose RNG state checkpoints hold
    if opt.device.type == 'cpu' and opt.augment == 'device':
        keep_freed_memory()                 # the batched augmentation's temporaries without a page fault at each use
    if run_folder:
        check_resume(opt)
    init_distributed(opt)
    if run_folder:
        prepare_run_folder(opt)
        print(describe_path(opt.device, opt.augment, opt.amp, opt.channels_last, opt.compile))
    set_seed(opt.seed + opt.rank)
    return opt


def check_resume(opt):
    """With ``--resume``: the checkpoint was written by this script and its experiment-defining flags
    equal this command line's (one :class:`UserError` naming every difference); it is not older than the run
    folder's ``last.pth`` (resuming it would roll the run back: refused); and a run already at ``--epochs`` is
    finished: one line says so and the process exits 0 without touching anything."""
    if not opt.resume:
        return
    ckpt = load_checkpoint(opt.resume, 'checkpoint for --resume')
    config, epoch = ckpt['config'], int(ckpt.get('epoch', 0))
    script = config.get('script')
    if script and script != opt.script:
        raise UserError(f'{opt.resume} was written by main_{script}.py, not main_{opt.script}.py')
    conflicts = resume_conflicts(config, config_dict(opt))
    if conflicts:
        raise UserError(f'{opt.resume} is another experiment; resume it with its own flags ({"; ".join(conflicts)}), '
                        f'or start a new run without --resume')
    last = os.path.join(opt.run_folder, 'last.pth')
    if os.path.isfile(last) and not os.path.samefile(last, opt.resume):
        newer = int(load_checkpoint(last, 'the run\'s last.pth').get('epoch', 0))
        if newer > epoch:
            raise UserError(f'{last} is at epoch {newer}, past --resume {opt.resume} (epoch {epoch}): resuming would '
                            f'roll the run back; resume {last}, or copy the checkpoint into a new folder to branch')
    if epoch >= opt.epochs:
        if os.environ.get('RANK', '0') == '0':
            print(f'{opt.resume}: the run is finished (epoch {epoch}, --epochs {opt.epochs}): nothing to do')
        raise SystemExit(0)


def prepare_run_folder(opt):
    """Create ``opt.run_folder``, check that files can be written there, and hold it for this run
    (``docs/USAGE.md``, "Run folders"): rank 0 takes the folder's lock (:func:`hold_run_folder`) before it looks
    at anything else there, so a second process started on the same folder stops with one line naming the
    holder; a new run (no ``--resume``) is refused where the folder holds a checkpoint, or the identity
    (``run.json``) of another experiment (a flag that changes the result differs). The folder's identity is then
    written. Interrupts then say how to continue (``run_folder.RUN``)."""
    folder = writable_folder(opt.run_folder, '--save_folder (the run folder)')
    problem = None
    if is_main():
        problem = hold_run_folder(folder) or run_folder_conflict(opt)
    problem = all_gather_object(problem)[0]       # every process stops if rank 0 cannot have the folder
    if problem:
        raise UserError(problem)
    if is_main():
        with open(os.path.join(folder, RUN_IDENTITY), 'w') as f:
            json.dump(run_identity(opt), f, indent=2)
    RUN['folder'] = folder




def run_identity(opt):
    """What ``run.json`` holds: the run's name in full, every option (``config``), and the flags its command line
    or recipe gave (``given``: what ``--config <run>/run.json`` replays, config/recipe.py)."""
    return {'run_name': opt.run_name, 'config': config_dict(opt), 'given': list(opt.given_flags)}


def run_folder_conflict(opt):
    """Why a new run (no ``--resume``) cannot start in ``opt.run_folder``, or ``None``: the folder holds a
    checkpoint, or the records (metrics, TensorBoard, results) of another experiment, by its identity. A folder
    that an interrupted attempt of this same experiment left before its first checkpoint is taken over (its metrics
    start afresh), as is one whose attempt stopped before it recorded anything."""
    folder = opt.run_folder
    if opt.resume:
        return None
    last = os.path.join(folder, 'last.pth')
    if os.path.isfile(last):
        return f'{folder} already holds a run: {ways_on(last, opt.epochs)}'
    identity = os.path.join(folder, RUN_IDENTITY)
    records = set(os.listdir(folder)) - {'.lock', RUN_IDENTITY}
    if not os.path.isfile(identity) or not records:      # an attempt that stopped before it recorded anything
        return None
    try:
        with open(identity) as f:
            saved = json.load(f)['config']
    except (OSError, ValueError, KeyError, TypeError):
        return f'{identity} is not a run identity this project wrote: choose a new --trial or --save_folder'
    differences = resume_conflicts(saved, config_dict(opt), holder='the folder')
    if differences:
        return (f'{folder} holds another experiment ({"; ".join(differences)}): start this one with a new --trial '
                f'or --save_folder')
    return None


def ways_on(last, epochs):
    """The three ways on from a folder that holds a run (``last``, its last.pth): ``--resume`` it (saying when that
    makes another learning-rate schedule than a fresh run of ``epochs``), a new ``--trial``, a new ``--save_folder``."""
    try:
        ckpt = load_checkpoint(last, 'the run\'s last.pth')
        done, config = int(ckpt.get('epoch', 0)), ckpt.get('config') or {}
    except UserError:
        done, config = None, {}
    planned = config.get('epochs')
    held = f' (epoch {done} of {planned})' if done is not None and planned else ''
    text = (f'last.pth{held}; continue it with --resume {last}, or start another run beside it with a new --trial '
            f'or --save_folder')
    if config.get('cosine') and planned and planned != epochs:
        text += (f' (--resume --epochs {epochs} keeps the first {done} epochs of a cosine schedule laid out for '
                 f'{planned}: not the schedule of a fresh {epochs}-epoch run, which a new --trial gives)')
    return text


def fit(opt, trainer: Trainer, optim: Optimization, loader, select: Optional[str] = None
        ) -> tuple[dict, Optional[dict]]:
    """Run epochs ``1..opt.epochs`` (or continue from ``--resume``) of ``trainer`` (a :class:`loop.Trainer`) over
    ``loader``.

    Each epoch: the schedule's learning rate, ``trainer.train_epoch(loader, optim, epoch)``, then
    ``trainer.evaluate_epoch(epoch)``; ``select`` names the metric whose maximum picks the best epoch. Checkpoints hold
    ``trainer.model`` and ``trainer.checkpointed()`` (a loss's buffers, the queue, ...); ``optim``: the optimizer, the
    ``GradScaler`` (its scale travels in checkpoints under ``--amp fp16``) and the schedule. ``<run>/last.pth`` is
    written every epoch, ``ckpt_epoch_N.pth`` every ``--save_freq`` epochs. Returns ``(last metrics, best metrics)``.

    Under torchrun, ``trainer.model`` is the unwrapped module; every process resumes from the same
    checkpoint (its own RNG state from the saved list), and only rank 0 logs and writes. What cannot
    be restored exactly on this machine (RNG states of other devices or another number of processes,
    a scaler state of a run without fp16) is re-seeded or started afresh, with a notice printed and
    written to ``<run>/warnings.txt``.
    """
    model, extra = trainer.model, trainer.checkpointed()
    optimizer, scaler, schedule = optim
    start, best = 1, None
    watch = CollapseWatch()
    notices = []
    if opt.resume:
        ckpt = load_checkpoint(opt.resume, 'checkpoint for --resume')    # checked by setup (check_resume)
        load_model_state(model, ckpt, opt.model, opt.resume)
        try:
            optimizer.load_state_dict(ckpt['optimizer'])
            for name, obj in extra.items():
                obj.load_state_dict(ckpt['extra'][name])
            start, best = ckpt['epoch'] + 1, ckpt.get('best')
            notices += resume_rng(ckpt, start, opt.seed)
            if scaler is not None and scaler.is_enabled():
                if ckpt.get('scaler'):
                    scaler.load_state_dict(ckpt['scaler'])
                else:
                    notices.append('the fp16 loss scale starts afresh (the checkpoint holds no GradScaler state)')
            if 'collapse_watch' in ckpt:
                watch.load_state_dict(ckpt['collapse_watch'])
        except (KeyError, ValueError, RuntimeError, TypeError) as e:
            raise UserError(f'{opt.resume} cannot be resumed: {str(e).splitlines()[0][:200]}') from None
        print(f'resumed from {opt.resume} at epoch {start - 1}')
    logger = None
    if is_main():      # TensorBoard and the --tracker runs (W&B, MLflow: tracking/trackers.py), with the flags
        logger = RunLogger(opt.run_folder, start, 'tensorboard' in parse_trackers(opt.tracker),
                           call_hook(open_trackers, opt, config=config_dict(opt), resumed=start > 1))
    for notice in notices:
        print(f'note: {notice}', flush=True)
        if logger is not None:
            logger.note(start - 1, f'on resume: {notice}')
    metrics = {}
    started = time.time()
    for epoch in range(start, opt.epochs + 1):
        schedule.adjust(optimizer, epoch)
        metrics = trainer.train_epoch(loader, optim, epoch)
        metrics['train/lr'] = optimizer.param_groups[0]['lr']
        evaluated = time.time()
        measured = trainer.evaluate_epoch(epoch)
        evaluation = time.time() - evaluated if measured else None       # the epoch's test / held-out / kNN pass
        metrics.update(measured)
        if select is not None and select in metrics and (best is None or metrics[select] > best[select]):
            best = {**{k: v for k, v in metrics.items() if not k.startswith('hist/')}, 'epoch': epoch}
        rng = all_gather_object(get_rng_state())     # every process's, for an exact --resume
        warning = watch.check(epoch, metrics)        # the same on every process (metrics are global means)
        if logger is None:
            continue
        if warning:
            print(warning, flush=True)
            logger.note(epoch, warning)
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not k.startswith('hist/')}
        logger.log(epoch, scalars, {k[5:]: v for k, v in metrics.items() if k.startswith('hist/')})
        elapsed = time.time() - started
        print(epoch_line(epoch, opt.epochs, scalars, elapsed, elapsed / (epoch - start + 1) * (opt.epochs - epoch),
                         evaluation), flush=True)
        state = {'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'epoch': epoch,
                 'config': config_dict(opt), 'rng': rng[0], 'best': best,
                 'extra': {name: obj.state_dict() for name, obj in extra.items()},
                 'collapse_watch': watch.state_dict()}
        if scaler is not None and scaler.is_enabled():
            state['scaler'] = scaler.state_dict()
        if len(rng) > 1:
            state['rng_ranks'] = rng
        save_checkpoint(os.path.join(opt.run_folder, 'last.pth'), state)
        if epoch % opt.save_freq == 0:
            save_checkpoint(os.path.join(opt.run_folder, f'ckpt_epoch_{epoch}.pth'), state)
    if logger is not None:
        logger.close()
    barrier()     # the checkpoint is on disk before any process returns
    return metrics, best


# what the epoch line shows (everything is in metrics.csv and TensorBoard): the loss, accuracies, the learning rate
SHOWN = {'train/loss': 'loss', 'train/acc': 'train acc', 'train/lr': 'lr', 'val/acc': 'val acc',   # key -> its label
         'test/acc': 'test acc', 'knn/val_acc': 'kNN val acc', 'knn/acc': 'kNN acc',
         'train/amp/skipped': 'fp16 skipped'}


def epoch_line(epoch, epochs, scalars, elapsed, left, evaluation=None):
    """One short line per epoch: its time (training, and the evaluation after it, ``evaluation`` seconds, when there
    was one), the run's elapsed time and an estimate of what is left, the :data:`SHOWN` metrics and the encoder's
    collapse statistics in brief (the rest: metrics.csv, TensorBoard)."""
    shown = ', '.join(f'{label} {scalars[k]:.4g}' for k, label in SHOWN.items() if k in scalars)
    collapse = [f'{name} {scalars[f"train/collapse/{name}_enc"]:.3g}' for name in ('z_std', 'cos')
                if f'train/collapse/{name}_enc' in scalars]
    if collapse:
        shown += ' | encoder ' + ', '.join(collapse)
    took = f'{scalars["train/epoch_time"]:.1f}s'
    if evaluation is not None:
        took += f' + {evaluation:.1f}s evaluation'
    return f'epoch {epoch}/{epochs} ({took}; {clock(elapsed)} elapsed, about {clock(left)} left): {shown}'


def resume_rng(ckpt, start, seed):
    """Restore this process's RNG states from ``ckpt``; returns the notices of what had to be re-seeded (seeded
    from ``seed``, the rank and the epoch ``start`` the run continues with, so a re-seeded resume is reproducible
    too)."""
    reseed = seed + 1_000_003 * start + 7_919 * rank()
    state, why = rank_rng_state(ckpt, rank(), world_size())
    if state is None:
        set_seed(reseed)
        for g in GENERATORS.values():
            g.manual_seed(reseed % 2 ** 63)
        return [f'every RNG re-seeded ({why})']
    return set_rng_state(state, reseed)


def write_results(opt, last, best, select, **extra):
    """``<run>/results.json``: the final and the selected epoch's metrics of the parts measured (``test/...``,
    ``val/...``: per-class and shot-group accuracies too when present), which metric selected the epoch and on which
    part (``selected_on``: ``held-out`` or ``test``, SupContrast's habit), whether the test split was read, and the
    run's settings; what ``compare.py`` and the sweeps read. Rank 0 only."""
    if not is_main():
        return
    results = {f'final_{k.replace("/", "_")}': v for k, v in last.items() if k.startswith(('test/', 'val/'))}
    read = 'test/acc' in last
    once = read and opt.test_every == 'end'
    results.update(best_epoch=best['epoch'], selected_by=select,
                   selected_on='held-out' if select.startswith('val/') else 'last epoch' if once else 'test',
                   test_split_read=read, test_read=test_reads(opt.run_folder, opt.epochs) if read else 'never')
    if 'val/acc' in last:          # --val_noise: whether the part that selected had clean labels
        results['held_out_labels'] = held_out_labels(opt.held_out_noise)
    for part in ('test', 'val'):
        if f'{part}/acc' in best:
            results[f'best_epoch_{part}_acc'] = best[f'{part}/acc']
    results.update(config=config_dict(opt), **extra)
    if select != 'test/acc':
        results[f'best_{select.replace("/", "_")}'] = best[select]
    path = os.path.join(opt.run_folder, 'results.json')
    with open(path, 'w') as f:
        json.dump(results, f, indent=2)
    finish_trackers({k: v for k, v in results.items() if k != 'config'}, path)
    return results



def test_reads(folder, epochs):
    """When the test split was read, from the run's metrics.csv (every epoch it measured, a resumed run's earlier
    epochs included): ``once, after the last epoch``, ``every epoch``, or ``at epochs 1, 2 and 5``."""
    epochs_read = [int(r['epoch']) for r in read_metrics(folder) if r.get('test/acc')]
    if epochs_read in ([], [epochs]):          # (a run without metrics.csv: its one evaluation)
        return 'once, after the last epoch'
    if epochs_read == list(range(1, epochs + 1)):
        return 'every epoch'
    return 'at epochs ' + ', '.join(map(str, epochs_read[:-1])) + f' and {epochs_read[-1]}'


def report_selection(last, best, select, test_once=False):
    """The lines a classifier's run ends with: the selected epoch (on the held-out part, ``val``, or the test split;
    ``test_once``: under ``--test_every end`` the test split was read after the last epoch only), then the final
    figures of each part it measured, the test split's last."""
    part = select.split('/')[0]
    if test_once and part == 'test':      # nothing was selected: the last epoch, the test split read once
        print(f'the test split was read once, after the last epoch ({best["epoch"]})')
    else:
        line = f'best {part} top-1: {best[select]:.2f} (epoch {best["epoch"]})'
        if part == 'val' and 'test/acc' in best:
            line += f', test top-1 there: {best["test/acc"]:.2f}'
        print(line)
        if test_once and 'test/acc' in last:
            print('the test split was read once, after the last epoch (--test_every end)')
    if 'test/acc' not in last:
        print('the test split was not read (--eval_split val)')
    for p in ('val', 'test'):
        if f'{p}/acc' in last:
            print(f'final {p} top-1: {last[f"{p}/acc"]:.2f}, NLL {last[f"{p}/nll"]:.4f}, '
                  f'ECE (15 bins) {last[f"{p}/ece"]:.4f}')
