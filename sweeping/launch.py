"""Running a sweep's cells (docs/USAGE.md, "Sweeps"): each stage is its script in a process of its own, its output in
``<cell>/<stage>.log``, with ``--resume`` where its run folder has a checkpoint; what happened is recorded in
``<cell>/cell.json`` (written by whoever ran the stage: this machine, or a SLURM job).

Two launchers:

- :func:`run_local`: ``jobs`` stages at once on this machine, ``cores / jobs`` threads each; with several GPUs one
  run per GPU (``CUDA_VISIBLE_DEVICES``). A cell's evaluations start when its stage 1 is done. Ctrl-C or SIGTERM
  stops the running stages (their last checkpoints intact) and records them as interrupted; a stage killed with the
  sweep (SIGKILL) gets SIGTERM from the system (``PR_SET_PDEATHSIG``). The next call continues them.
- :func:`submit_slurm`: one SLURM job per cell through submitit (an array, throttled), running the cell's stages in
  order. A job that reaches its time limit or is preempted is requeued (submitit's ``checkpoint``) and continues each
  stage from its last.pth; a requeue from outside (``scontrol requeue``) does the same. A run over several tasks
  (``tasks_per_node``, ``nodes``) gets torch.distributed's environment from SLURM's, as torchrun would give it.

The record never depends on SLURM's accounting (``sacct``): a job writes its cell's record itself, and a job that is
gone from ``squeue`` without a record of its end is reported as failed, with its log.
"""
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from runtime import processes
from runtime.run_folder import is_held

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))      # the repository
RECORD = 'cell.json'
INTERRUPTED = (130, 143, -signal.SIGTERM, -signal.SIGINT)      # a script stopped by a signal: its checkpoint intact


# ---------------------------------------------------------------- the record of a cell
def shown(path):
    """A path as a user reads it: relative to here when below here, else absolute."""
    rel = os.path.relpath(path)
    return path if rel.startswith('..') else rel


def read_record(cell_folder):
    """``{stage: {'state', 'seconds', 'exit', 'last_line', 'attempts', 'slurm_job'?}}`` of a cell, ``{}`` before it
    ran."""
    try:
        with open(os.path.join(cell_folder, RECORD)) as f:
            return json.load(f).get('stages', {})
    except (OSError, ValueError, AttributeError):
        return {}


def write_record(cell_folder, stage, **entry):
    """Update ``stage``'s entry in the cell's record (through a temporary file and a rename: a reader never sees half
    a file; one writer per cell at a time)."""
    os.makedirs(cell_folder, exist_ok=True)
    record = read_record(cell_folder)
    record[stage] = {**record.get(stage, {}), **entry}
    tmp = os.path.join(cell_folder, f'.{RECORD}.{os.getpid()}.tmp')
    with open(tmp, 'w') as f:
        json.dump({'stages': record}, f, indent=2)
    os.replace(tmp, os.path.join(cell_folder, RECORD))


def state(stage, record):
    """What a stage is now: ``done`` (its results.json, or a finished stage 1 recorded as done), ``failed``
    (recorded), ``running`` (recorded, and its folder's lock is held), ``interrupted`` (a checkpoint to resume), or
    ``pending``."""
    entry = record.get(stage.name, {})
    if stage.result() or (entry.get('state') == 'done' and stage.checkpoint()):
        return 'done'
    if entry.get('state') == 'running' and held(stage):
        return 'running'
    if entry.get('state') == 'failed':
        return 'failed'
    return 'interrupted' if stage.checkpoint() else 'pending'


def held(stage):
    """Whether a process holds the stage's run folder now (its run's lock, run_folder.lock_folder)."""
    run = stage.run()
    return isinstance(run, str) and is_held(run)


def last_line(log):
    """The last line of a log that says something (an error's one line, the interrupt's line); not our own line
    before an attempt."""
    try:
        with open(log, errors='replace') as f:
            lines = [line.strip() for line in f.read().splitlines()[-200:]
                     if line.strip() and not line.startswith(ATTEMPT)]
    except OSError:
        return ''
    return lines[-1][:300] if lines else ''


# ---------------------------------------------------------------- one stage
def stage_env(threads=None, gpu=None, extra=None):
    """The environment of a stage's process: this one's, unbuffered output, ``threads`` per run where the user has
    not set ``OMP_NUM_THREADS`` (the user's setting wins), ``gpu`` as the only visible device."""
    env = {**os.environ, 'PYTHONUNBUFFERED': '1', **(extra or {})}
    if threads is not None and 'OMP_NUM_THREADS' not in os.environ:
        env['OMP_NUM_THREADS'] = env['MKL_NUM_THREADS'] = str(threads)
    if gpu is not None:
        env['CUDA_VISIBLE_DEVICES'] = str(gpu)
    return env


def _die_with_parent(parent):
    """In the child, before it runs the script: SIGTERM when the sweep (process ``parent``) dies, SIGKILL included,
    so no run is left behind holding its folder; at once if it died before this ran (Linux; elsewhere a no-op)."""
    try:
        import ctypes
        ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


ATTEMPT = '=== attempt'      # the line a log gets before each attempt of its stage


def start_stage(cell, stage, env, rank=0):
    """Start ``stage`` of ``cell`` (its folders exist after this); returns ``(process, log path, start time)``. The
    record is rank 0's: another process of a distributed run (``rank``) writes its own log only."""
    os.makedirs(stage.save_folder, exist_ok=True)
    log = os.path.join(cell.folder, f'{stage.name}.log' if rank == 0 else f'{stage.name}.rank{rank}.log')
    command = stage.command()
    attempts = read_record(cell.folder).get(stage.name, {}).get('attempts', 0) + 1
    with open(log, 'a') as f:
        started = time.strftime('%Y-%m-%d %H:%M:%S')
        f.write(f'\n{ATTEMPT} {attempts}, {started}: {shlex.join([sys.executable, *command])}\n')
        f.flush()
        parent = os.getpid()
        proc = processes.start([sys.executable, *command], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env,
                               preexec_fn=lambda: _die_with_parent(parent))
    if rank == 0:
        write_record(cell.folder, stage.name, state='running', attempts=attempts, command=[sys.executable, *command],
                     log=log, started=time.time(), **({'slurm_job': os.environ['SLURM_JOB_ID']}
                                                      if 'SLURM_JOB_ID' in os.environ else {}))
    return proc, log, time.time()


def finish_stage(cell, stage, code, log, started, interrupted=False):
    """Record how ``stage`` ended; returns its state (``done``, ``failed``, ``interrupted``)."""
    if code == 0 and (stage.result() or stage.checkpoint()):
        outcome = 'done'
    elif interrupted or code in INTERRUPTED:
        outcome = 'interrupted'
    else:
        outcome = 'failed'
    before = read_record(cell.folder).get(stage.name, {}).get('seconds') or 0     # the earlier attempts'
    write_record(cell.folder, stage.name, state=outcome, exit=code, seconds=round(before + time.time() - started, 1),
                 last_line=last_line(log))
    return outcome


# ---------------------------------------------------------------- the local launcher
def visible_gpus():
    """The GPUs this machine shows (``CUDA_VISIBLE_DEVICES``'s entries where set), as the strings to give a run."""
    if os.environ.get('CUDA_VISIBLE_DEVICES') is not None:
        return [d for d in os.environ['CUDA_VISIBLE_DEVICES'].split(',') if d.strip()]
    try:
        import torch
        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


class Stop(Exception):
    """Ctrl-C or SIGTERM reached the sweep: stop the running stages."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def run_local(tasks, jobs, on_event):
    """Run ``tasks`` (``[(cell, [stage, ...])]``: the stages of each cell still to run, stage 1 first) ``jobs`` at a
    time. ``on_event(kind, cell, stage, **info)`` is told of each start and end; a cell's evaluations start when its
    stage 1 is done, and are left when it is not. Raises :class:`Stop` after stopping the running stages when a
    signal came."""
    gpus = visible_gpus()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    ready = [(cell, stages[0]) for cell, stages in tasks]
    waiting = {cell.name: stages[1:] for cell, stages in tasks}
    running, free = {}, list(range(jobs))

    def stop(signum, frame):
        raise Stop(signum)
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while ready or running:
            while ready and free:
                cell, stage = ready.pop(0)
                if stage.reads is not None:
                    stage.stage1_run = cell.stage(stage.reads).run()
                slot = free.pop(0)
                gpu = gpus[slot % len(gpus)] if gpus else None
                proc, log, started = start_stage(cell, stage, stage_env(threads, gpu))
                running[proc] = (cell, stage, log, started, slot)
                on_event('start', cell, stage, gpu=gpu)
            time.sleep(0.2)
            for proc in [p for p in running if p.poll() is not None]:
                cell, stage, log, started, slot = running.pop(proc)
                free.append(slot)
                outcome = finish_stage(cell, stage, proc.returncode, log, started)
                on_event(outcome, cell, stage, seconds=time.time() - started, line=last_line(log))
                if stage.reads is None:       # stage 1: its evaluations start now, before other cells, if it is done
                    evaluations = waiting.pop(cell.name, [])
                    if outcome == 'done':
                        ready[:0] = [(cell, s) for s in evaluations]
    except Stop as e:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for proc in running:
            with contextlib.suppress(OSError):          # one that has just ended
                proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 120
        for proc, (cell, stage, log, started, _) in running.items():
            try:
                proc.wait(max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            finish_stage(cell, stage, proc.returncode, log, started, interrupted=True)
            on_event('interrupted', cell, stage, seconds=time.time() - started, line=last_line(log))
        raise Stop(e.signum) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# ---------------------------------------------------------------- the SLURM launcher (submitit)
def distributed_env():
    """torch.distributed's environment (as torchrun sets it) for this SLURM task when its job has several tasks;
    ``{}`` for one. The port is the job's own (drawn from its id: the same after a requeue)."""
    import submitit
    job = submitit.JobEnvironment()
    if job.num_tasks <= 1:
        return {}
    port = os.environ.get('MASTER_PORT') or str(20000 + int(str(job.job_id).split('_')[0]) % 40000)
    return {'MASTER_ADDR': job.hostnames[0], 'MASTER_PORT': port, 'RANK': str(job.global_rank),
            'WORLD_SIZE': str(job.num_tasks), 'LOCAL_RANK': str(job.local_rank),
            'LOCAL_WORLD_SIZE': str(job.num_tasks // job.num_nodes)}


class CellJob:
    """A SLURM job's work: the stages of one cell in order, each continued from its last.pth. submitit calls
    :meth:`checkpoint` when the job reaches its time limit or is preempted, and requeues what it returns (this same
    job: the stages resume from their checkpoints)."""

    def __init__(self, cell, threads=None):
        self.cell, self.threads = cell, threads

    def __call__(self):
        cell = self.cell
        env = distributed_env()
        rank = int(env.get('RANK', '0'))
        for stage in cell.stages:
            record = read_record(cell.folder)
            if state(stage, record) == 'done':
                continue
            if stage.reads is not None:
                stage.stage1_run = cell.stage(stage.reads).run()
            proc, log, started = start_stage(cell, stage, stage_env(self.threads, extra=env), rank)
            code = proc.wait()
            if rank != 0:
                continue
            outcome = finish_stage(cell, stage, code, log, started)
            if outcome != 'done':
                return f'{cell.name}: {stage.name} {outcome} ({last_line(log)})'
        return f'{cell.name}: done'

    def checkpoint(self):
        import submitit
        return submitit.helpers.DelayedSubmission(CellJob(self.cell, self.threads))


def executor(folder, settings):
    """A submitit executor for the SLURM cluster with the sweep's ``settings`` (``slurm:`` of the file and the
    command line)."""
    import submitit
    # python: the command a job runs Python with (and its stages: sys.executable there); default this interpreter
    ex = submitit.AutoExecutor(folder=os.path.join(folder, 'slurm', '%j'), cluster='slurm',
                               slurm_python=settings.get('python'))
    params = {'timeout_min': int(settings.get('time_min', 60)), 'nodes': int(settings.get('nodes', 1)),
              'tasks_per_node': int(settings.get('tasks_per_node', 1)),
              'cpus_per_task': int(settings.get('cpus_per_task', 1)),
              'slurm_array_parallelism': int(settings.get('array_parallelism', 256)),
              'slurm_setup': [f'cd {ROOT}', *list(settings.get('setup') or [])], 'name': settings.get('job_name')}
    if settings.get('gpus_per_node'):
        params['gpus_per_node'] = int(settings['gpus_per_node'])
    if settings.get('mem_gb'):
        params['mem_gb'] = float(settings['mem_gb'])
    for key in ('partition', 'account', 'qos', 'constraint'):
        if settings.get(key):
            params[f'slurm_{key}'] = settings[key]
    if settings.get('additional_parameters'):
        params['slurm_additional_parameters'] = dict(settings['additional_parameters'])
    ex.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return ex


def submit_slurm(cells, folder, settings):
    """One job per cell (an array of ``len(cells)`` tasks, ``array_parallelism`` at a time); returns ``{cell name:
    job id}`` and records each job in its cell's record."""
    ex = executor(folder, settings)
    threads = int(settings.get('cpus_per_task', 1))
    jobs = []
    with ex.batch():
        for cell in cells:
            jobs.append(ex.submit(CellJob(cell, threads)))
    ids = {}
    for cell, job in zip(cells, jobs):
        ids[cell.name] = str(job.job_id)
        write_record(cell.folder, '_slurm', job=str(job.job_id), submitted=time.time(),
                     stdout=str(job.paths.stdout))
    return ids


def queued(job_ids):
    """The ids of ``job_ids`` (``123`` or an array's ``123_4``) that SLURM still holds (pending, requeued, running),
    from ``squeue`` alone (one line per array task: ``-r``)."""
    if not job_ids:
        return set()
    arrays = sorted({j.split('_')[0] for j in job_ids})
    try:
        out = subprocess.run(['squeue', '-h', '-r', '-o', '%i %T', '-j', ','.join(arrays)], capture_output=True,
                             text=True, timeout=60)
    except OSError:
        return set()                    # no SLURM here: none of them is queued where this runs
    except subprocess.TimeoutExpired:
        return set(job_ids)             # cannot tell: still there
    if out.returncode != 0 and 'Invalid job id' not in out.stderr:
        return set(job_ids)
    held = {line.split()[0] for line in out.stdout.splitlines() if line.strip() and line.split()[1] not in (
        'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'OUT_OF_MEMORY', 'NODE_FAIL', 'BOOT_FAIL', 'DEADLINE')}
    return {j for j in job_ids if j in held}
