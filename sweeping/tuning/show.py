"""The texts ``sweep.py --status`` and ``--dry-run`` print of a tuned sweep: the budget in words, each study's progress,
the commands of the trials and cells still to run, with a placeholder for each value a study has still to choose."""
import shlex
import sys

from sweeping.tuning.spec import study_folder


def budget_words(spec):
    """``'8 trials'``, or with ``confirm:`` ``'8 trials (6 searched, 2 confirming)'``."""
    return f'{spec.trials} trials' + (f' ({spec.search_trials} searched, {spec.confirm_runs} confirming the best '
                                      f'{spec.confirm["top"]} on more seeds)' if spec.confirm else '')


def tuning_status(sweep, cells):
    """One line per study of ``cells``: its trials by state and its best held-out value so far."""
    from runtime.run_folder import is_held
    from sweeping.tuning.status import progress_line, read_study
    live = is_held(sweep.folder)            # the tuning process holds the sweep's folder while it drives trials
    lines, seen = [f'tuning: {budget_words(sweep.tune)} per study, {sweep.tune.metric} on a held-out '
                   f'{sweep.tune.val_split:g} of the training set'], set()
    for cell in cells:
        key = (cell.method, tuple(cell.axes.items()))
        if key in seen:
            continue
        seen.add(key)
        folder = study_folder(sweep.folder, cell.method, cell.axes)
        label = ' '.join([cell.method, *(f'{k}={v}' for k, v in cell.axes.items())])
        record = {**read_study(folder), 'folder': folder}
        lines.append(f'  {label}: {progress_line(record, sweep.tune.search_trials, live)}')
    return '\n'.join(lines)


def placeholders(space):
    """``{flag: '<flag>'}`` for a study's space: the values it has still to choose."""
    return {flag: f'<{flag}>' for flag in space}


def stage_commands(sweep, cell, stages, trial_values=None):
    """A line per stage of ``cell``: its command to paste. A cell whose study has not chosen yet (``cell.waiting``),
    or a trial (``trial_values``: its space), shows a placeholder for each value still to choose, and for the stage-1
    run folder an evaluation reads (its name holds those values)."""
    from sweeping.entries import with_placeholders
    space = trial_values
    if space is None and cell.waiting:
        space = sweep.tune.space_of(cell.method)
    lines = []
    for stage in stages:
        stage1 = cell.stage(stage.reads) if stage.reads is not None else None
        if stage1 is not None:
            stage.stage1_run = ('<the stage-1 run folder>' if space else None) or stage1.run() or stage1.run_folder
        argv = stage.command()
        if space and stage.reads is None:
            argv = [argv[0], *with_placeholders(stage.script, argv[1:], placeholders(space))]
        lines.append(f'  {cell.name}, {stage.name}: {shlex.join([sys.executable, *argv])}')
    return lines


def dry_run_tuning(sweep, cells):
    """What ``--dry-run`` says of the tuning still to do: per study the trials left and the commands of its next
    trial, with a placeholder for each value the sampler chooses when the trial starts (the seeded cells' commands
    follow, with placeholders for the chosen values). Returns ``(text, the trials' stages still to run)``."""
    from sweeping.tuning import tuner as tuning
    from sweeping.tuning.status import read_study
    wanted = {(c.method, tuple(c.axes.items())) for c in cells if c.waiting}
    studies = [s for s in tuning.studies_of(sweep) if (s.method, tuple(s.chosen.items())) in wanted]
    lines = [f'\nwould tune first: {len(studies)} studies x {budget_words(sweep.tune)} (the trials not run yet, then '
             'the seeded cells with the chosen values); each trial runs these commands, <flag> chosen by the sampler '
             'when it starts:']
    n_stages = 0
    for study in studies:
        done = len(read_study(study.folder).get('trials', []))
        ranges = ', '.join(f'{flag} {describe_range(rng)}' for flag, rng in study.space.items())
        searched = sweep.tune.search_trials
        lines.append(f'  {study.label}: trials {done} to {searched - 1} of {searched} ({ranges})')
        low = {flag: rng.choices[0] if rng.choices is not None else rng.low for flag, rng in study.space.items()}
        cell = study.cell(done, low)
        n_stages += max(0, sweep.tune.trials - done) * len(cell.stages)     # the confirming runs are trials too
        lines += ['  ' + line for line in stage_commands(sweep, cell, cell.stages, study.space)]
    return '\n'.join(lines), n_stages


def describe_range(rng):
    if rng.choices is not None:
        return 'one of ' + ', '.join(map(str, rng.choices))
    return f'in [{rng.low:g}, {rng.high:g}]' + (' (log)' if rng.log else '') + (' (integer)' if rng.integer else '')
