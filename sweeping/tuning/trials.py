"""The launchers of a tuning's trials (``sweeping/tuning/tuner.py``): a trial's stages in order on this machine
(:class:`LocalTrial`, one process at a time) or as one SLURM job (:class:`SlurmTrial`), each told to stop when the
pruner or an interrupt says so; and a run's per-epoch values as its ``metrics.csv`` holds them, which the pruner
reads."""
import contextlib
import csv
import io
import os
import signal
import subprocess
import time

from sweeping import launch


class LocalTrial:
    """A trial's stages in order on this machine, one process at a time (``threads`` threads, ``gpu``)."""

    def __init__(self, cell, threads, gpu):
        self.cell, self.env, self.index, self.proc = cell, launch.stage_env(threads, gpu), 0, None
        self.start_next()

    def start_next(self):
        record = launch.read_record(self.cell.folder)
        stages = self.cell.stages
        while self.index < len(stages) and launch.state(stages[self.index], record) == 'done':
            self.index += 1
        self.proc = None
        if self.index < len(stages):
            stage = stages[self.index]
            if stage.reads is not None:
                stage.stage1_run = self.cell.stage(stage.reads).run()
            self.proc, self.log, self.started = launch.start_stage(self.cell, stage, self.env)

    @property
    def stage(self):
        return self.cell.stages[min(self.index, len(self.cell.stages) - 1)]

    def poll(self):
        """``None`` while a stage runs; else how the trial ended: ``done``, ``failed`` or ``interrupted``."""
        if self.proc is None:
            return 'done'
        code = self.proc.poll()
        if code is None:
            return None
        outcome = launch.finish_stage(self.cell, self.stage, code, self.log, self.started)
        if outcome != 'done':
            return outcome
        self.index += 1
        self.start_next()
        return 'done' if self.proc is None else None

    def stop(self, why='interrupted'):
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(OSError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        outcome = launch.finish_stage(self.cell, self.stage, self.proc.returncode, self.log, self.started,
                                         interrupted=True)
        if outcome != 'done':        # a stage that finished as the signal came (exit 0, its results) stays done
            launch.write_record(self.cell.folder, self.stage.name, state=why)


class SlurmTrial:
    """A trial as one SLURM job (the sweep's ``CellJob``: its stages in order, requeued at its time limit)."""

    def __init__(self, cell, executor, threads):
        self.cell = cell
        self.job = str(executor.submit(launch.CellJob(cell, threads)).job_id)
        launch.write_record(cell.folder, '_slurm', job=self.job, submitted=time.time())

    @property
    def stage(self):
        record = launch.read_record(self.cell.folder)
        return next((s for s in self.cell.stages if launch.state(s, record) != 'done'), self.cell.stages[-1])

    def poll(self):
        if launch.queued({self.job}):
            return None
        record = launch.read_record(self.cell.folder)
        states = [launch.state(s, record) for s in self.cell.stages]
        if all(s == 'done' for s in states):
            return 'done'
        return 'failed' if 'failed' in states else 'interrupted'

    def stop(self, why='interrupted'):
        subprocess.run(['scancel', self.job], capture_output=True, timeout=60)
        deadline = time.time() + 120
        while launch.queued({self.job}) and time.time() < deadline:
            time.sleep(1)
        stage = self.stage
        if stage.name in launch.read_record(self.cell.folder):
            launch.write_record(self.cell.folder, stage.name, state=why)


def epoch_values(run_folder, key):
    """``{epoch: value}`` of ``key`` in a run's metrics.csv, from whole lines only (the file may be being written)."""
    try:
        with open(os.path.join(run_folder, 'metrics.csv'), newline='') as f:
            text = f.read()
    except OSError:
        return {}
    text = text[:text.rfind('\n') + 1]
    out = {}
    for row in csv.DictReader(io.StringIO(text)):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            if row.get(key):
                out[int(row['epoch'])] = float(row[key])
    return out



def local_launch(jobs):
    """``start_trial(cell)`` of trials on this machine: ``cores / jobs`` threads each, one GPU each where there are
    several."""
    gpus = launch.visible_gpus()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    counter = iter(range(10 ** 9))

    def start_trial(cell):
        gpu = gpus[next(counter) % len(gpus)] if gpus else None
        return LocalTrial(cell, threads, gpu)
    return start_trial


def slurm_launch(sweep, settings):
    ex = launch.executor(os.path.join(sweep.folder, 'tune'), {**settings, 'job_name': f'tune_{sweep.name}'})
    threads = int(settings.get('cpus_per_task', 1))
    return lambda cell: SlurmTrial(cell, ex, threads)
