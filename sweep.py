"""A comparison grid as one file: methods x settings x seeds, both stages, then the paired comparison.

    python sweep.py sweeps/ablation_digits.yaml                       # run it here (--jobs N at once)
    python sweep.py sweeps/ablation_digits.yaml --launcher slurm --partition gpu --gpus_per_node 1
    python sweep.py sweeps/ablation_digits.yaml --status              # where it stands; nothing runs
    python sweep.py sweeps/ablation_digits.yaml --dry-run             # the plan and its commands

Every cell (a method, the grid's values, a seed) has a stable folder, ``<save_folder>/sweeps/<name>/runs/<method>/
<axis=value,...>/seed_<s>/``, with a folder per stage (``pretrain``, then each evaluation) and a log per stage. A
stage with its result is skipped, one with a checkpoint continues with ``--resume``, a failed one is listed with its
log's last line and runs again only under ``--retry-failed``: a sweep never deletes a result, and a call after an
interruption loses nothing and redoes nothing. At the end: ``table.md`` (compare.py: mean ± std, paired differences
from the baseline with their 95 % intervals, per group), ``figure.png`` and ``sweep.json`` (every cell: its flags,
state, time and folders). docs/USAGE.md, "Sweeps", has the file's schema.

With a ``tune:`` section the seeded cells wait for tuning: every method (per combination of the grid's values) first
gets the same budget of Optuna trials on a held-out part of the training set (sweeping/tuning/tuner.py; docs/USAGE.md,
"Tuning"), and the cells then run with each study's chosen values and read the test split once.
"""
import os
import shutil
import signal
import sys
import time

import core.requirements  # noqa: F401  (first: a Python without the requirements gets one line)

from config.cli import error_line
from core.flags import Parser, UserError
from runtime.run_folder import lock_folder
from sweeping import launch
from sweeping import plan as sweep_plan
from sweeping.launch import shown
from sweeping.plan import STAGE1
from sweeping.tuning.show import budget_words, dry_run_tuning, stage_commands, tuning_status

MAX_CPU_JOBS = 8         # --jobs by default on a machine without a GPU: the cores, up to this many

# What runs a sweep (torch, the scripts' parsers, the table's libraries) is imported where a call runs one, not here:
# --status reads the folders and records alone, in a second or two.


def parse_args(argv):
    p = Parser(description=__doc__.splitlines()[0], prog='sweep.py')
    p.add_argument('file', help='the sweep file (sweeps/*.yaml)')
    p.add_argument('--launcher', choices=['local', 'slurm'], default='local',
                   help='local: runs on this machine; slurm: one SLURM job per cell, through submitit')
    p.add_argument('--jobs', type=int, default=None,
                   help=f'local: stages at once (default: the GPUs, one run each, else the cores up to {MAX_CPU_JOBS}, '
                        'one thread each); threads per run: cores / jobs')
    p.add_argument('--dry-run', action='store_true', help='print the plan (cells, states, commands); run nothing')
    p.add_argument('--status', action='store_true', help='print the state of every cell; run nothing')
    p.add_argument('--only', action='append', default=[], metavar='PATTERN',
                   help="only the cells whose name matches (a shell pattern: 'SupCon *', '* seed 0'); repeatable")
    p.add_argument('--retry-failed', action='store_true', help='run failed stages again (they are skipped otherwise)')
    p.add_argument('--save_folder', default=None, help='root of the sweep folder (default: the file\'s, else ./save)')
    slurm = p.add_argument_group('the SLURM launcher (also the file\'s slurm: section; these win)')
    slurm.add_argument('--partition', default=None, help='SLURM partition')
    slurm.add_argument('--time_min', type=int, default=None, help='time limit of a job in minutes (default 60); a job '
                                                                  'that reaches it is requeued and continues')
    slurm.add_argument('--gpus_per_node', type=int, default=None, help='GPUs of a job (per node)')
    slurm.add_argument('--cpus_per_task', type=int, default=None, help='CPUs of each task (default 1)')
    slurm.add_argument('--mem_gb', type=float, default=None, help='memory of a job (per node)')
    slurm.add_argument('--nodes', type=int, default=None, help='nodes of a job (default 1)')
    slurm.add_argument('--tasks_per_node', type=int, default=None,
                       help='processes per node of a job: above 1 a run is distributed (DDP), one process per task')
    slurm.add_argument('--array_parallelism', type=int, default=None, help='jobs of the array running at once')
    slurm.add_argument('--slurm_setup', action='append', default=None, metavar='LINE',
                       help='a line the job script runs first (module load ..., source env/bin/activate); repeatable')
    slurm.add_argument('--no_wait', action='store_true', help='submit and return (--status shows the jobs; a later '
                                                              'call writes the table)')
    slurm.add_argument('--poll_s', type=float, default=15, help='how often the waiting launcher looks at its jobs')
    args = p.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        p.error(f'--jobs must be >= 1, got {args.jobs}')
    if args.dry_run and args.status:
        p.error('--dry-run and --status are two views: give one')
    if not args.poll_s > 0:
        p.error(f'--poll_s must be > 0, got {args.poll_s}')
    for key in ('time_min', 'gpus_per_node', 'cpus_per_task', 'nodes', 'tasks_per_node', 'array_parallelism'):
        value = getattr(args, key)
        if value is not None and value < (0 if key == 'gpus_per_node' else 1):
            p.error(f'--{key} must be >= {0 if key == "gpus_per_node" else 1}, got {value}')
    return args


# ---------------------------------------------------------------- states
def states(sweep, cells):
    """``{(cell name, stage name): state}`` now (launch.state, and ``queued`` for a cell whose SLURM job is still
    in the queue)."""
    records = {cell.name: launch.read_record(cell.folder) for cell in cells}
    jobs = {r['_slurm']['job'] for r in records.values() if '_slurm' in r}
    held = launch.queued(jobs) if jobs else set()
    out = {}
    for cell in cells:
        record = records[cell.name]
        in_flight = '_slurm' in record and record['_slurm']['job'] in held
        for stage in cell.stages:
            now = 'tuning' if cell.waiting else launch.state(stage, record)
            out[(cell.name, stage.name)] = 'queued' if in_flight and now != 'done' else now
    return out


def to_run(cells, now, retry_failed):
    """``[(cell, [stages still to run])]``: a cell whose stage 1 failed (without --retry-failed) or is queued
    elsewhere is left out; so is a done stage."""
    tasks = []
    for cell in cells:
        wanted = []
        for stage in cell.stages:
            state = now[(cell.name, stage.name)]
            if state in ('done', 'queued', 'running', 'tuning') or (state == 'failed' and not retry_failed):
                if stage.name == STAGE1 and state != 'done':
                    break               # its evaluations wait for it
                continue
            wanted.append(stage)
        if wanted:
            tasks.append((cell, wanted))
    return tasks


def whole_work(trial_stages, ready, later, estimate):
    """The dry run's last line: every stage still to run (the trials', the cells' ready now, the seeded cells' after
    the tuning) and the file's own estimate of the time, where it gives one."""
    parts = [f'{n} {what}' for n, what in ((trial_stages, "of the trials"), (ready, "ready"),
                                           (later, "of the seeded cells after the tuning")) if n]
    total = trial_stages + ready + later
    return (f'\nin all: {total} stages' + (f' ({", ".join(parts)})' if len(parts) > 1 else '')
            + (f'; the file\'s estimate: {estimate}' if estimate else '; the file gives no estimate of the time'))


def status_table(sweep, cells, now):
    stages = [STAGE1, *sweep.evaluations]
    lines = ['| cell | ' + ' | '.join(stages) + ' | folder |', '| --- |' + ' --- |' * (len(stages) + 1)]
    for cell in cells:
        record = launch.read_record(cell.folder)
        row = []
        for name in stages:
            if cell.stage(name) is None:
                row.append('')
                continue
            state = now[(cell.name, name)]
            entry = record.get(name, {})
            text = state + (f' ({entry["seconds"]:.0f} s)' if state == 'done' and entry.get('seconds') else '')
            if state == 'failed':
                text += f': {entry.get("last_line", "")[:90]}'
            row.append(text)
        lines.append(f'| {cell.name} | ' + ' | '.join(row) + f' | {shown(cell.folder)} |')
    return '\n'.join(lines), stage_counts(now)


def stage_counts(now):
    """``'10 stages: 4 done, 2 interrupted, 4 pending'``: the states of the stages ``now`` (one unit: stages)."""
    counts = {}
    for state in now.values():
        counts[state] = counts.get(state, 0) + 1
    order = ('done', 'running', 'queued', 'interrupted', 'failed', 'pending', 'tuning')
    label = {'tuning': 'waiting for the tuning'}
    return f'{len(now)} stages: ' + ', '.join(f'{counts[s]} {label.get(s, s)}' for s in order if s in counts)


# ---------------------------------------------------------------- progress
class Progress:
    """Stages done / running / failed / left, time so far and left: a bar on a terminal, a line per event in a log.
    The estimate weighs each stage left by the mean time of the finished stages of its kind (a pre-training, an
    evaluation), scaled by the wall time the finished ones took (so it follows --jobs)."""

    def __init__(self, name, stages):
        from tqdm import tqdm
        self.start, self.running = time.time(), set()
        self.left = {key: self.kind(key[1]) for key in stages}
        self.took = {}                       # kind -> [seconds of each finished stage]
        self.counts = {'done': 0, 'failed': 0, 'interrupted': 0}
        self.bar = tqdm(total=len(stages), desc=f'sweep {name}', unit='stage', dynamic_ncols=True, disable=None)

    @staticmethod
    def kind(stage_name):
        return 'pretrain' if stage_name == STAGE1 else 'evaluation'

    def eta(self, elapsed):
        """Seconds left: the work left (each stage its kind's mean; a running one half of it) over the work done,
        times the wall time so far; ``None`` before a stage finished."""
        done = sum(sum(t) for t in self.took.values())
        if not done:
            return None
        every = [t for times in self.took.values() for t in times]
        mean = {k: sum(t) / len(t) for k, t in self.took.items()}
        work = sum(mean.get(k, sum(every) / len(every)) * (0.5 if key in self.running else 1)
                   for key, k in self.left.items())
        return elapsed * work / done

    def line(self):
        from util import clock
        elapsed = time.time() - self.start
        waiting = len(self.left) - len(self.running)
        eta = self.eta(elapsed)
        return (f'{self.counts["done"]} done, {len(self.running)} running, {self.counts["failed"]} failed, '
                f'{waiting} left; {clock(elapsed)} so far' + (f', about {clock(eta)} left' if eta is not None else ''))

    def __call__(self, kind, cell, stage, **info):
        key = (cell.name, stage.name)
        if kind == 'start':
            self.running.add(key)
            text = f'start: {cell.name}, {stage.name}' + (f' (GPU {info["gpu"]})' if info.get('gpu') else '')
        else:
            self.running.discard(key)
            self.counts[kind] += 1
            if kind in ('done', 'failed'):
                self.left.pop(key, None)
                self.took.setdefault(self.kind(stage.name), []).append(info.get('seconds') or 0)
            if kind == 'done':
                self.bar.update(1)
            text = f'{kind}: {cell.name}, {stage.name} ({info.get("seconds") or 0:.0f} s)'
            if kind != 'done':
                text += f': {info.get("line", "")}'
        self.bar.set_postfix_str(self.line())
        if self.bar.disable or kind != 'start':
            self.write(f'{text} | {self.line()}')

    def write(self, text):
        if self.bar.disable:
            print(text, flush=True)
        else:
            self.bar.write(text)

    def close(self):
        self.bar.close()


# ---------------------------------------------------------------- the command
def hold(folder):
    """The sweep folder's lock for this process (one sweep call at a time runs a sweep; run_folder.lock_folder); a
    :class:`UserError` naming the holder otherwise."""
    try:
        os.makedirs(folder, exist_ok=True)
        f, holder = lock_folder(folder)
    except OSError as e:
        raise UserError(f'cannot write the sweep\'s folder {folder} ({e.strerror or e}): give a --save_folder that '
                        'can be written') from None
    if holder is not None:
        raise UserError(f'{folder} is in use by {holder}: wait for it, or look with --status')
    return f


def slurm_settings(sweep, args):
    settings = dict(sweep.slurm)
    for key in ('partition', 'time_min', 'gpus_per_node', 'cpus_per_task', 'mem_gb', 'nodes', 'tasks_per_node',
                'array_parallelism'):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if args.slurm_setup is not None:
        settings['setup'] = args.slurm_setup
    settings['job_name'] = f'sweep_{sweep.name}'
    return settings


def wait_slurm(cells, job_ids, progress, poll_s):
    """Wait for the submitted cells, from their records and ``squeue``; a job gone from the queue without a record of
    its end is recorded as failed (its SLURM output named)."""
    seen = {}
    pending = {c.name: c for c in cells if c.name in job_ids}
    while pending:
        held = launch.queued(set(job_ids[name] for name in pending))
        for name, cell in list(pending.items()):
            record = launch.read_record(cell.folder)
            for stage in cell.stages:                       # what the job recorded since the last look
                entry = record.get(stage.name, {})
                now = (entry.get('state'), entry.get('attempts'))
                if now[0] is None or seen.get((name, stage.name)) == now:
                    continue
                seen[(name, stage.name)] = now
                if now[0] == 'running':
                    progress('start', cell, stage)
                else:
                    progress(now[0], cell, stage, seconds=entry.get('seconds'), line=entry.get('last_line', ''))
            if job_ids[name] in held:
                continue
            record = launch.read_record(cell.folder)
            for stage in cell.stages:
                if launch.state(stage, record) not in ('done', 'failed'):
                    output = record.get('_slurm', {}).get('stdout', 'under the sweep folder, slurm/')
                    line = f'the SLURM job {job_ids[name]} ended before this stage was done (its output: {output})'

                    launch.write_record(cell.folder, stage.name, state='failed', last_line=line)
                    progress('failed', cell, stage, line=line)
                    break
            del pending[name]
        if pending:
            time.sleep(poll_s)


def local_jobs(jobs):
    """``--jobs``, or by default the GPUs (one run each), else the cores up to 8."""
    if jobs:
        return jobs
    import torch
    return torch.cuda.device_count() or min(os.cpu_count() or 1, MAX_CPU_JOBS)


def tune(sweep, cells, args):
    """The tuning phase: every study of ``cells`` driven to its budget; 0 when all are finished, else the sweep's
    exit code (a trial crashed: 1, the next call retries it; an interrupt: 130 or 143)."""
    from sweeping.tuning import trials
    from sweeping.tuning import tuner as tuning
    wanted = {(c.method, tuple(c.axes.items())) for c in cells if c.waiting}
    studies = [s for s in tuning.studies_of(sweep) if (s.method, tuple(s.chosen.items())) in wanted]
    print(f'tuning: {len(studies)} studies x {budget_words(sweep.tune)} ({sweep.tune.metric} on a held-out '
          f'{sweep.tune.val_split:g} of the training set); folder {shown(os.path.join(sweep.folder, "tune"))}',
          flush=True)
    tuner = tuning.Tuner(sweep, studies, say=lambda text: print(f'tune: {text}', flush=True))
    if args.launcher == 'local':
        jobs = local_jobs(args.jobs)
        start_trial = trials.local_launch(jobs)
    else:
        settings = slurm_settings(sweep, args)
        jobs = args.jobs or int(settings.get('array_parallelism', 4))
        start_trial = trials.slurm_launch(sweep, settings)
    try:
        unfinished = tuner.run(jobs, start_trial, poll_s=0.5 if args.launcher == 'local' else args.poll_s)
    except launch.Stop as e:
        print(f'sweep.py: interrupted while tuning; the running trials stopped with their last checkpoints intact: '
              f'python sweep.py {args.file} continues them', file=sys.stderr)
        return 143 if e.signum == 15 else 130
    print(tuning_status(sweep, cells), flush=True)
    hopeless = [s for s in unfinished if s.name in tuner.without_choice]
    if hopeless:
        print(f'sweep.py: error: every trial of {", ".join(s.label for s in hopeless)} diverged, leaving no value to '
              f'choose from: narrow the space (a lower learning rate) in {args.file}, or give the budget more trials',
              file=sys.stderr)
        return 1
    if unfinished:
        print(f'sweep.py: tuning not finished for {", ".join(s.label for s in unfinished)} (a trial crashed: its '
              f'log is in its trial folder); python sweep.py {args.file} retries it', file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sweep = sweep_plan.read(args.file, args.save_folder, check=not args.status)
    cells = sweep.select(args.only)
    if not args.status:
        sweep_plan.prepare(sweep, cells)
    now = states(sweep, cells)
    if args.status or args.dry_run:
        table, summary = status_table(sweep, cells, now)
        print(f'sweep {sweep.name}: {len(cells)} cells ({summary}); folder {shown(sweep.folder)}')
        if sweep.tune is not None:
            print(tuning_status(sweep, cells))
        print(table)
        if args.dry_run:
            trial_stages = 0
            if any(c.waiting for c in cells):
                text, trial_stages = dry_run_tuning(sweep, cells)
                print(text)
            tasks = to_run(cells, now, args.retry_failed)
            ready = sum(len(s) for _, s in tasks)
            if tasks or not any(c.waiting for c in cells):     # (a tuned file's: the trials' commands said it all)
                print(f'\nwould run {ready} stages (each cell\'s pre-training and its evaluations)')
            for cell, stages in tasks:
                print(*stage_commands(sweep, cell, stages), sep='\n')
            after = [c for c in cells if c.waiting]
            later = sum(len(c.stages) for c in after)
            if after:
                print(f'\nafter tuning, would run {later} stages of the seeded cells, '
                      f'<flag> the value its study chooses (best.json):')
                for cell in after:
                    print(*stage_commands(sweep, cell, cell.stages), sep='\n')
            print(whole_work(trial_stages, ready, later, sweep.estimate))
        else:
            for name in ('table.md', 'figure.png', 'sweep.json'):
                if os.path.isfile(os.path.join(sweep.folder, name)):
                    print(f'{name}: {shown(os.path.join(sweep.folder, name))}')
        return 0
    if args.launcher == 'slurm':
        missing = [c for c in ('sbatch', 'squeue', 'scancel') if shutil.which(c) is None]
        if missing:
            raise UserError(f'--launcher slurm: SLURM is not here ({", ".join(missing)} not found): run the sweep on '
                            'a SLURM login node, or use --launcher local')
    if sweep.tune is not None and args.no_wait and any(c.waiting for c in cells):
        raise UserError('--no_wait: tuning drives its trials from this process (each trial is asked when a slot is '
                        'free): run the call without --no_wait, or once tuning is done')
    lock = hold(sweep.folder)
    with open(os.path.join(sweep.folder, 'sweep_file.yaml'), 'w') as f:
        f.write(sweep.text)               # the file as this call read it
    if any(c.waiting for c in cells):
        code = tune(sweep, cells, args)
        if code:
            lock.close()
            return code
        sweep = sweep_plan.read(args.file, args.save_folder)      # the cells with the chosen values
        cells = sweep.select(args.only)
        sweep_plan.prepare(sweep, cells)
        now = states(sweep, cells)
    tasks = to_run(cells, now, args.retry_failed)
    failed_before = [k for k, s in now.items() if s == 'failed' and not args.retry_failed]
    total = sum(len(stages) for _, stages in tasks)
    print(f'sweep {sweep.name}: {len(cells)} cells ({stage_counts(now)}); {total} stages to run'
          + (f', {len(failed_before)} failed before (--retry-failed runs them)' if failed_before else '')
          + f'; folder {shown(sweep.folder)}', flush=True)
    progress = Progress(sweep.name, [(cell.name, stage.name) for cell, stages in tasks for stage in stages])
    code = 0
    try:
        if args.launcher == 'local':
            launch.run_local(tasks, local_jobs(args.jobs), progress)
        elif tasks:
            job_ids = launch.submit_slurm([c for c, _ in tasks], sweep.folder, slurm_settings(sweep, args))
            progress.write(f'submitted {len(job_ids)} SLURM jobs ({", ".join(sorted(set(job_ids.values()))[:4])}'
                           f'{", ..." if len(job_ids) > 4 else ""}); their output: {sweep.folder}/slurm/')
            if args.no_wait:
                progress.close()
                print(f'not waiting: python sweep.py {args.file} --status shows them; call again for the table')
                return 0
            wait_slurm([c for c, _ in tasks], job_ids, progress, args.poll_s)
    except launch.Stop as e:
        progress.close()
        print(f'sweep.py: interrupted; the running stages stopped with their last checkpoints intact: python sweep.py '
              f'{args.file} continues them', file=sys.stderr)
        code = 143 if e.signum == 15 else 130
    except KeyboardInterrupt:
        progress.close()
        if args.launcher == 'slurm':
            print(f'sweep.py: stopped waiting; the SLURM jobs go on (python sweep.py {args.file} --status)',
                  file=sys.stderr)
        code = 130
    finally:
        progress.close()
    now = states(sweep, cells)
    from sweeping.report import write_results
    written, problems = write_results(sweep, sweep.cells, states(sweep, sweep.cells))     # every cell, not --only's
    from sweeping.tracking import log_sweep
    log_sweep(sweep, written)           # its table and figures on the sweep's own tracker run, where its runs log
    if lock is not None:
        lock.close()
    failed = [k for k, s in now.items() if s == 'failed']
    left = [k for k, s in now.items() if s not in ('done', 'failed')]
    for cell_name, stage_name in failed:
        cell = next(c for c in cells if c.name == cell_name)
        line = launch.read_record(cell.folder).get(stage_name, {}).get('last_line', '')
        print(f'failed: {cell_name}, {stage_name}: {line} (log: '
              f'{shown(os.path.join(cell.folder, stage_name + ".log"))})', file=sys.stderr)
    print(f'sweep {sweep.name}: {sum(1 for s in now.values() if s == "done")} of {len(now)} stages done'
          + (f', {len(failed)} failed (--retry-failed runs them again)' if failed else '')
          + (f', {len(left)} not done' if left else '') + '; '
          + ', '.join(f'{name}: {shown(path)}' for name, path in written.items()))
    for problem in problems:
        print(f'sweep.py: error: {problem}', file=sys.stderr)
    return code or (2 if problems else 1 if failed or left else 0)


def _interrupt(signum, frame):
    raise KeyboardInterrupt()


def cli():
    """``main`` with bad input as one line (exit 2) and an interrupt outside the running stages as one line (130)."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = main()
    except UserError as e:
        print(f'sweep.py: error: {error_line(e)}', file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print('sweep.py: interrupted before any stage ran', file=sys.stderr)
        code = 130
    except BrokenPipeError:          # the output's reader went away (| head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)


if __name__ == '__main__':
    cli()
