"""sweep.py (sweeping/plan.py, sweeping/launch.py): a sweep file's cells, names and commands; bad files as one line
before anything starts; a changed finished cell refused; real grids on digits that skip, resume and retry, a sweep
killed and called again that loses nothing, one cell of the ablation bit-equal to the old script's commands, and the
SLURM launcher against a real one-node cluster (tests/slurm_cluster.py)."""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed.run
import yaml

from helpers import (
    ROOT,
    assert_one_line_error,
    load,
    make_fake_cifar,
    own_process,
    own_python,
    run_in_process,
    run_script,
    scaled,
    script_env,
)

TINY = {'dataset': 'digits', 'batch_size': 128, 'num_workers': 0, 'print_freq': 1000, 'size': 8, 'augment': 'device',
        'model': 'resnet_nano', 'device': 'cpu', 'cosine': True, 'epochs': 2}


def write(path, **spec):
    """A sweep file of ``spec`` (name, base, methods, ... as keywords)."""
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def mini(path, **changes):
    """SupCon (with a linear evaluation) and CE (without one) on tiny digits, 2 seeds."""
    spec = dict(name='mini', base=dict(TINY),
                methods={'SupCon': {'method': 'SupCon', 'learning_rate': 0.2, 'temp': 0.1},
                         'CE': {'script': 'main_ce.py', 'learning_rate': 0.1}},
                seeds=[0, 1], linear={'epochs': 2, 'learning_rate': 0.3}, compare={'baseline': 'SupCon'})
    spec.update(changes)
    return write(path, **spec)


def read_sweep(path, save):
    from sweeping import plan as sweep_plan
    sweep = sweep_plan.read(str(path), str(save))
    sweep_plan.prepare(sweep, sweep.cells)
    return sweep


def sweep(*args, env=None, timeout=900):
    """``python sweep.py args`` in a process of its own (environment: the suite's, plus ``env``)."""
    return run_script('sweep.py', *args, check=False, timeout=timeout, env=env)


def records(folder):
    return {str(p.parent.relative_to(folder)): json.loads(p.read_text())['stages']
            for p in pathlib.Path(folder).rglob('cell.json')}


def assert_same_checkpoints(a, b):
    a, b = load(a), load(b)
    for key, value in a['model'].items():
        assert torch.equal(b['model'][key], value), key


def run_folder(save_folder):
    found = [d for d, _, files in os.walk(save_folder) if 'run.json' in files]
    assert len(found) == 1, found
    return found[0]


# ---------------------------------------------------------------- the file: cells, names, commands
def test_a_file_expands_into_named_cells_with_their_commands(tmp_path):
    path = mini(tmp_path / 's.yaml', grid={'setting': {'plain': {'label_granularity': 'fine'},
                                                       'coarse-to-fine': {'label_granularity': 'coarse'}},
                                           'imb_factor': [0.1, 0.01]},
                base={**TINY, 'dataset': 'digits_lt'},
                linear={'epochs': 1, 'learning_rate': 1, 'imb_factor': '{imb_factor}'})
    s = read_sweep(path, tmp_path / 'save')
    assert s.folder == str(tmp_path / 'save' / 'sweeps' / 'mini')
    assert len(s.cells) == 2 * 2 * 2 * 2
    cell = s.cells[0]
    assert cell.name == 'SupCon setting=plain imb_factor=0.1 seed 0'
    assert cell.folder == os.path.join(s.folder, 'runs', 'SupCon', 'setting=plain,imb_factor=0.1', 'seed_0')
    first, linear = cell.stages
    assert first.script == 'main_supcon.py' and linear.script == 'main_linear.py'
    value = lambda argv, flag: argv[argv.index(flag) + 1]       # noqa: E731
    assert [value(first.argv, f) for f in ('--label_granularity', '--imb_factor', '--seed')] == ['fine', '0.1', '0']
    assert '--label_granularity' not in linear.argv        # base and axes: each script takes the flags it has
    assert value(linear.argv, '--imb_factor') == '0.1'          # '{imb_factor}': the cell's own
    assert value(linear.argv, '--epochs') == '1'                # an evaluation's flag wins over base
    ce = next(c for c in s.cells if c.method == 'CE')
    assert [st.name for st in ce.stages] == ['pretrain']                    # main_ce.py evaluates itself
    assert first.run_folder.endswith('SupCon_digits_lt_resnet_nano_lr_0.2_decay_0.0001_bsz_128_temp_0.1_trial_0'
                                     '_imb_0.1_cosine_devaug')
    assert [c.name for c in s.select(['CE * seed 1'])][:1] == ['CE setting=plain imb_factor=0.1 seed 1']
    s = read_sweep(mini(tmp_path / 't.yaml', methods={'CE': {'script': 'main_ce.py', 'evaluate': True}}, compare=None),
                   tmp_path / 'save')
    assert [st.name for st in s.cells[0].stages] == ['pretrain', 'linear']


@pytest.mark.parametrize('change, words', [
    (dict(colour='red'), ["unknown key 'colour'"]),
    (dict(slurm={'pyhton': 'python3'}), ["slurm: unknown key 'pyhton'", 'python']),
    (dict(slurm={'python': ''}), ['slurm.python: the command a job runs Python with']),
    (dict(lienar={'epochs': 1}), ["unknown key 'lienar'", 'did you mean linear']),
    (dict(methods={'SupCon': {'lerning_rate': 0.2}}), ['methods.SupCon: lerning_rate is not a flag of main_supcon.py',
                                                        'learning_rate']),
    (dict(methods={'SupCon': {'label_granularity': 'medium'}}), ['SupCon seed 0, pretrain (main_supcon.py)',
                                                                 "invalid choice: 'medium'"]),
    (dict(methods={'SupCon': {'method': 'SupCon', 'kcl_k': 3}}), ['SupCon seed 0', '--kcl_k needs --method KCL']),
    (dict(methods={}), ['methods is empty']),
    (dict(grid={'label_noise': []}), ['grid.label_noise is empty']),
    (dict(seeds=[]), ['seeds must be a non-empty list']),
    (dict(methods={'X': {'script': 'main_nothing.py'}}), ["methods.X.script: 'main_nothing.py' is not"]),
    (dict(methods={'X': {'evaluate': ['probe']}}), ["methods.X.evaluate: 'probe' is not an evaluation"]),
    (dict(compare={'baseline': 'SupKon'}), ["compare.baseline: 'SupKon' is not one of its rows"]),
    (dict(compare={'by': ['setting']}), ["compare.by: 'setting' is not an axis"]),
    (dict(base={**TINY, 'tempreature': 1}), ['base: tempreature is not a flag of']),
    (dict(linear={'imb_factor': '{imb_factor}'}), ['{imb_factor} names a flag that stage 1 does not set']),
    (dict(methods={'SupCon': {'save_folder': 'x'}}), ['save_folder is set by the sweep']),
    (dict(name='a/b'), ['name must be a folder name']),
    (dict(name='..'), ['name must be a folder name']),
    (dict(seeds=1000000000000), ['seeds: 1000000000000 seeds are more cells than a sweep plans']),
    (dict(grid={'a': list(range(40)), 'b': list(range(40))}), ['6400 cells (2 methods x 40 a x 40 b x 2 seeds)',
                                                              'split it into several files']),
    (dict(grid={'seed': [1, 2]}), ['grid.seed: the seeds are the file\'s seeds:']),
    (dict(grid={'learning_rate': [0.1, 0.5]}),
     ['grid.learning_rate sets learning_rate, which methods.SupCon sets too']),
    (dict(grid={'setting': {'a b': {'label_granularity': 'fine'}, 'a/b': {'label_granularity': 'coarse'}}}),
     ['grid.setting: two values give one folder name']),
    (dict(grid={'setting': {'x': {'lerning_rate': 0.1}}}), ['grid.setting.x: lerning_rate is not a flag']),
    (dict(evaluations={'pretrain': {'epochs': 1}}), ['evaluations.pretrain: pretrain is the folder of every cell']),
    (dict(linear=None, evaluations={'a b': {'epochs': 1}, 'a/b': {'epochs': 2}}, compare=None),
     ['evaluations: two names give one folder name']),
    ('repeated', ['the key seeds is repeated']),
    ('missing', ['not found']),
])
def test_a_bad_file_is_one_line_naming_it_and_nothing_starts(tmp_path, change, words):
    path = tmp_path / 's.yaml'
    if change == 'repeated':
        mini(path)
        path.write_text(path.read_text() + 'seeds: [3]\n')
    elif change != 'missing':
        mini(path, **change)
    proc = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save')
    assert_one_line_error(proc, *words)
    assert str(path) in proc.stderr and proc.returncode == 2
    assert not (tmp_path / 'save').exists()


def test_bad_command_lines_are_one_line(tmp_path):
    path = mini(tmp_path / 's.yaml')
    for args, words in ((['--jobs', '0'], ['--jobs must be >= 1']), (['--dry-run', '--status'], ['two views']),
                        (['--launcher', 'cloud'], ['invalid choice']), (['--job', '2'], ['unknown flag --job']),
                        (['--only', 'Nope *'], ['matches no cell'])):
        assert_one_line_error(run_in_process('sweep.py', path, *args), *words)


def fake_run(stage, **config):
    """A run folder where ``stage`` plans one, with run.json of the planned flags changed by ``config``."""
    os.makedirs(stage.run_folder)
    planned = dict(stage.planned['config'], **config)
    with open(os.path.join(stage.run_folder, 'run.json'), 'w') as f:
        json.dump({'run_name': 'x', 'config': planned, 'given': []}, f)
    return stage.run_folder


def test_a_cell_whose_flags_changed_after_it_ran_is_refused(tmp_path):
    """The file changed after a cell ran (another momentum, which its folder's name does not show): one line naming
    the cell and the difference, before anything starts; the same flags are no conflict."""
    path = mini(tmp_path / 's.yaml')
    s = read_sweep(path, tmp_path / 'save')
    fake_run(s.cells[0].stages[0], momentum=0.8)
    assert_one_line_error(run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save'),
                          'the cell SupCon seed 0 (pretrain) ran with other flags',
                          '--momentum: the run has 0.8, now 0.9', 'change the file back, or give the sweep a new name')
    shutil.rmtree(s.folder)
    fake_run(s.cells[0].stages[0])
    out = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save', '--dry-run')
    assert out.returncode == 0, out.stderr


def test_a_finished_cell_run_on_the_device_auto_chose_is_done(tmp_path):
    """A file without device: plans --device auto, and run.json records the device it resolved to (cpu): where the
    run ran, so a second call counts the finished cell as done instead of refusing it."""
    base = {k: v for k, v in TINY.items() if k != 'device'}
    path = mini(tmp_path / 's.yaml', base=base, methods={'CE': {'script': 'main_ce.py'}}, seeds=[0], linear=None,
                compare=None)
    run = fake_run(read_sweep(path, tmp_path / 'save').cells[0].stages[0], device='cpu')
    with open(os.path.join(run, 'results.json'), 'w') as f:
        f.write('{}')
    out = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save', '--dry-run')
    assert out.returncode == 0, out.stderr
    assert '1 stages: 1 done' in out.stdout


def test_an_interrupted_cell_is_checked_against_the_file_not_its_own_record(tmp_path):
    """A stage with a checkpoint is planned with --resume, and a resume replays the run.json beside it. The plan
    compares the file's own flags with the run: a flag the file no longer gives (--momentum 0.8, recorded as given)
    is refused, not taken back from the record."""
    path = mini(tmp_path / 's.yaml')
    s = read_sweep(path, tmp_path / 'save')
    run = fake_run(s.cells[0].stages[0], momentum=0.8)
    record = json.loads((pathlib.Path(run) / 'run.json').read_text())
    (pathlib.Path(run) / 'run.json').write_text(json.dumps({**record, 'given': ['momentum']}))
    torch.save({}, os.path.join(run, 'last.pth'))
    assert_one_line_error(run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save', '--dry-run'),
                          'the cell SupCon seed 0 (pretrain) ran with other flags',
                          '--momentum: the run has 0.8, now 0.9')


def test_a_finished_cell_whose_file_changed_never_counts_as_done(tmp_path):
    """A stage not yet finished continues under a longer --epochs (a resume may change it); a finished one (its
    results.json) recorded with another --epochs than the file's is refused in one line naming the flag, not counted
    as done with the old numbers."""
    path = mini(tmp_path / 's.yaml')
    s = read_sweep(path, tmp_path / 'save')
    run = fake_run(s.cells[0].stages[0], epochs=1)
    out = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save', '--dry-run')
    assert out.returncode == 0, out.stderr
    (pathlib.Path(run) / 'results.json').write_text('{}')
    assert_one_line_error(run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save', '--dry-run'),
                          'the cell SupCon seed 0 (pretrain) ran with other flags',
                          '--epochs: the finished run has 1, now 2')


def fake_results(sweep):
    """Every stage of ``sweep`` finished, with a results.json of a made-up accuracy."""
    for i, cell in enumerate(sweep.cells):
        for stage in cell.stages:
            if stage.reads is not None:
                stage.stage1_run = cell.stage(stage.reads).run_folder
            folder = fake_run(stage)
            with open(os.path.join(folder, 'results.json'), 'w') as f:
                json.dump({'final_test_acc': 90.0 + i + len(stage.name), 'final_test_ece': 0.1,
                           'config': {'seed': cell.seed}}, f)


def test_only_runs_a_selection_but_the_outputs_cover_every_cell(tmp_path):
    """--only picks what runs; table.md and sweep.json still hold every cell, the baseline and its differences."""
    path = mini(tmp_path / 's.yaml')
    s = read_sweep(path, tmp_path / 'save')
    fake_results(s)
    out = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save', '--only', 'CE *')
    assert out.returncode == 0, out.stderr
    table = (pathlib.Path(s.folder) / 'table.md').read_text()
    assert 'SupCon' in table and 'CE' in table and 'paired' in table.lower(), table
    assert len(json.loads((pathlib.Path(s.folder) / 'sweep.json').read_text())['cells']) == len(s.cells)


def test_a_metric_no_result_holds_is_one_line_and_the_outputs_are_written(tmp_path):
    path = mini(tmp_path / 's.yaml', compare={'baseline': 'SupCon', 'metric': 'final_tset_acc'})
    s = read_sweep(path, tmp_path / 'save')
    fake_results(s)
    out = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save')
    assert_one_line_error(out, "compare.metric 'final_tset_acc' is in no result", 'final_test_acc')
    assert out.returncode == 2 and (pathlib.Path(s.folder) / 'sweep.json').is_file()
    assert "No result holds the metric 'final_tset_acc'" in (pathlib.Path(s.folder) / 'table.md').read_text()


def test_the_table_says_why_an_entry_is_left_out(tmp_path):
    """A results.json cut short is left out with its reason (no traceback, every output written); a failed stage is
    listed as failed; a grid of pre-training alone calls its finished cells done, without a result of their own."""
    from sweeping import launch
    path = mini(tmp_path / 's.yaml', seeds=[0, 1, 2])
    s = read_sweep(path, tmp_path / 'save')
    fake_results(s)
    cut = pathlib.Path(s.cells[1].stages[1].result())
    cut.write_text(cut.read_text()[:20])
    shutil.rmtree(s.cells[2].stages[1].run())
    launch.write_record(s.cells[2].folder, 'linear', state='failed', exit=1)
    out = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save')
    assert "Traceback" not in out.stderr, out.stderr
    table = (pathlib.Path(s.folder) / 'table.md').read_text()
    assert 'cannot be read' in table and 'SupCon seed 1' in table, table
    assert 'Failed (left out; --retry-failed runs them again): SupCon seed 2.' in table, table

    alone = write(tmp_path / 'p.yaml', name='alone', base=dict(TINY), seeds=[0],
                  methods={'SupCon': {'method': 'SupCon', 'learning_rate': 0.2, 'temp': 0.1}})
    s = read_sweep(alone, tmp_path / 'save')
    stage = s.cells[0].stages[0]
    torch.save({}, os.path.join(fake_run(stage), 'last.pth'))
    launch.write_record(s.cells[0].folder, 'pretrain', state='done', exit=0)
    run_in_process('sweep.py', alone, '--save_folder', tmp_path / 'save')
    table = (pathlib.Path(s.folder) / 'table.md').read_text()
    assert 'Done without a result of their own' in table and 'Not done yet' not in table, table


def test_yaml_merge_keys_are_read(tmp_path):
    path = tmp_path / 's.yaml'
    mini(path)
    text = path.read_text().replace('methods:\n', 'common: &common {learning_rate: 0.3}\nmethods:\n', 1)
    path.write_text(text.replace("  SupCon:\n    method: SupCon\n    learning_rate: 0.2\n",
                                 "  SupCon:\n    <<: *common\n    method: SupCon\n"))
    with pytest.raises(Exception, match='unknown key .common.'):      # a top-level anchor is still a key
        read_sweep(path, tmp_path / 'save')
    path.write_text(text.replace('common: &common {learning_rate: 0.3}\n', '').replace(
        "  SupCon:\n    method: SupCon\n    learning_rate: 0.2\n",
        "  SupCon: &supcon\n    method: SupCon\n    learning_rate: 0.2\n  SupCon-lr:\n    <<: *supcon\n"
        "    learning_rate: 0.5\n"))
    s = read_sweep(path, tmp_path / 'save')
    lr = {c.method: c.stages[0].argv[c.stages[0].argv.index('--learning_rate') + 1] for c in s.cells}
    assert lr == {'SupCon': '0.2', 'SupCon-lr': '0.5', 'CE': '0.1'}


def test_where_a_sweep_cannot_start_is_one_line(tmp_path):
    """A --save_folder that cannot be written (here: under a file) and --launcher slurm where SLURM is not installed:
    one line each, and nothing written."""
    path = mini(tmp_path / 's.yaml')
    (tmp_path / 'file').write_text('')
    assert_one_line_error(sweep(path, '--save_folder', tmp_path / 'file' / 'save'),
                          "cannot write the sweep's folder", 'give a --save_folder that can be written')
    out = sweep(path, '--save_folder', tmp_path / 'save', '--launcher', 'slurm',
                env={'PATH': os.path.dirname(sys.executable)})
    assert_one_line_error(out, '--launcher slurm: SLURM is not here', 'sbatch')
    assert not (tmp_path / 'save' / 'sweeps' / 'mini' / '.lock').exists()


def test_the_plan_prints_commands_that_paste_and_the_record_sums_attempts(tmp_path):
    """--dry-run's commands are shell-quoted with the interpreter that runs the sweep (a folder with a space pastes);
    a stage's seconds in cell.json add up its attempts, and its log's last line is kept when it is done."""
    from sweeping import launch
    path = mini(tmp_path / 's.yaml', seeds=[0])
    out = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'with space', '--dry-run')
    line = next(x for x in out.stdout.splitlines() if x.startswith('  SupCon seed 0, pretrain: '))
    import shlex
    argv = shlex.split(line.split(': ', 1)[1])
    assert argv[0] == sys.executable and str(tmp_path / 'with space') in argv[argv.index('--save_folder') + 1]
    s = read_sweep(path, tmp_path / 'save')
    cell, stage = s.cells[0], s.cells[0].stages[0]
    log = tmp_path / 'stage.log'
    log.write_text('epoch 1/2\nmain_supcon.py: interrupted\n')
    launch.finish_stage(cell, stage, 143, str(log), time.time() - 128)
    folder = fake_run(stage)
    (pathlib.Path(folder) / 'last.pth').write_text('')
    log.write_text('epoch 2/2\ncheckpoint: last.pth\n')
    launch.finish_stage(cell, stage, 0, str(log), time.time() - 73)
    entry = launch.read_record(cell.folder)['pretrain']
    assert entry['state'] == 'done' and 200 <= entry['seconds'] < 203
    assert entry['last_line'] == 'checkpoint: last.pth'


def test_the_plan_and_the_status_say_what_is_done_and_what_will_run(tmp_path):
    """--dry-run and --status run nothing; a stage with its result is done, one with a checkpoint is continued with
    --resume, a failed one waits for --retry-failed."""
    from sweeping import launch
    path = mini(tmp_path / 's.yaml')
    s = read_sweep(path, tmp_path / 'save')
    done, stopped, failed = s.cells[0], s.cells[1], s.cells[2]          # SupCon 0, SupCon 1, CE 0
    for stage in done.stages:
        (pathlib.Path(fake_run(stage)) / 'results.json').write_text('{"final_test_acc": 50.0}')
    (pathlib.Path(fake_run(stopped.stages[0])) / 'last.pth').write_text('')
    launch.write_record(failed.folder, 'pretrain', state='failed', last_line='main_ce.py: error: boom')
    out = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save', '--dry-run')
    assert out.returncode == 0, out.stderr
    assert '| SupCon seed 0 | done | done |' in out.stdout and '| SupCon seed 1 | interrupted | pending |' in out.stdout
    assert '| CE seed 0 | failed: main_ce.py: error: boom |' in out.stdout
    assert 'would run 3 stages' in out.stdout        # SupCon 1 (resumed) and its linear, CE 1
    resumed = [line for line in out.stdout.splitlines() if line.startswith('  SupCon seed 1, pretrain')]
    assert resumed and '--resume' in resumed[0]
    assert not any(line.startswith('  SupCon seed 0') for line in out.stdout.splitlines())
    out = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save', '--dry-run', '--retry-failed')
    assert 'would run 4 stages' in out.stdout
    status = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save', '--status')
    assert 'sweep mini: 4 cells (6 stages: 2 done, 1 interrupted, 1 failed, 2 pending)' in status.stdout
    assert not (pathlib.Path(s.folder) / 'sweep.json').exists()         # nothing written


def test_the_status_reads_the_records_without_torch(tmp_path):
    """--status reads the folders and records alone: neither torch nor a script's parser is imported (a look at a
    sweep takes a fraction of a second, also on a busy machine)."""
    path = mini(tmp_path / 's.yaml')
    code = ('import runpy, sys\n'
            f'sys.argv = ["sweep.py", {str(path)!r}, "--status", "--save_folder", {str(tmp_path / "save")!r}]\n'
            'try:\n    runpy.run_path("sweep.py", run_name="__main__")\nexcept SystemExit as e:\n    code = e.code\n'
            'print("torch" in sys.modules, "config.options" in sys.modules, code)\n')
    out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines()[-1] == 'False False 0', out.stdout + out.stderr
    assert 'sweep mini: 4 cells (6 stages: 6 pending)' in out.stdout


# ---------------------------------------------------------------- real grids on digits
@pytest.mark.slow
def test_a_sweep_runs_its_grid_and_a_second_call_redoes_nothing(tmp_path):
    path = mini(tmp_path / 's.yaml')
    out = sweep(path, '--save_folder', tmp_path / 'save', '--jobs', 2)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    folder = tmp_path / 'save' / 'sweeps' / 'mini'
    assert 'sweep mini: 6 of 6 stages done' in out.stdout
    for name in ('table.md', 'figure.png', 'sweep.json', 'sweep_file.yaml'):
        assert (folder / name).is_file(), name
    table = (folder / 'table.md').read_text()
    assert '| SupCon | 2 |' in table and '| CE | 2 |' in table and '(baseline)' in table and '(n=2)' in table
    record = json.loads((folder / 'sweep.json').read_text())
    assert len(record['cells']) == 4 and all(s['state'] == 'done' for c in record['cells']
                                             for s in c['stages'].values())
    assert record['cells'][0]['stages']['linear']['result'].endswith('results.json')
    before = records(folder)
    logs = {p: p.read_text() for p in folder.rglob('*.log')}
    again = sweep(path, '--save_folder', tmp_path / 'save')
    assert again.returncode == 0 and '0 stages to run' in again.stdout
    assert records(folder) == before and {p: p.read_text() for p in folder.rglob('*.log')} == logs


@pytest.mark.slow
def test_a_failed_stage_waits_for_retry_failed(tmp_path):
    """A stage that fails (CIFAR files not there yet) is listed with its log's last line and left alone by the next
    call; --retry-failed runs it again once the files are there. Its evaluation waits for it."""
    data = tmp_path / 'data'
    path = mini(tmp_path / 's.yaml', base={**TINY, 'dataset': 'cifar10', 'data_folder': str(data)},
                methods={'SupCon': {'method': 'SupCon'}}, seeds=[0], compare=None)
    out = sweep(path, '--save_folder', tmp_path / 'save')
    assert out.returncode == 1
    assert 'failed: SupCon seed 0, pretrain: main_supcon.py: error: cifar10 not found' in out.stderr
    again = sweep(path, '--save_folder', tmp_path / 'save')
    assert again.returncode == 1 and '0 stages to run, 1 failed before (--retry-failed runs them)' in again.stdout
    make_fake_cifar(data)
    retried = sweep(path, '--save_folder', tmp_path / 'save', '--retry-failed')
    assert retried.returncode == 0, retried.stdout[-2000:]
    stages = records(tmp_path / 'save' / 'sweeps' / 'mini')['runs/SupCon/seed_0']
    assert stages['pretrain']['attempts'] == 2 and stages['pretrain']['state'] == stages['linear']['state'] == 'done'


def child_processes(pid):
    out = subprocess.run(['ps', '-o', 'pid=', '--ppid', str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def script_pids(folder):
    """The pids of the training scripts whose command names ``folder``."""
    out = subprocess.run(['pgrep', '-f', str(folder)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split() if int(p) != os.getpid()]


@pytest.mark.slow
def test_a_killed_sweep_called_again_loses_nothing_and_redoes_nothing(tmp_path):
    """SIGTERM, then SIGKILL, while a cell is mid-run: no script is left running, and the next call finishes every
    cell, runs no finished stage again, and the killed cell ends bit-equal to an uninterrupted run."""
    path = mini(tmp_path / 's.yaml', base={**TINY, 'batch_size': 64, 'epochs': 3}, linear=None, compare=None,
                methods={'SupCon': {'method': 'SupCon', 'learning_rate': 0.2, 'temp': 0.1}}, seeds=[0, 1, 2])
    folder = tmp_path / 'save' / 'sweeps' / 'mini'
    proc = subprocess.Popen([*own_process('sweep.py'), str(path), '--save_folder', str(tmp_path / 'save'),
                             '--jobs', '1'], cwd=ROOT, env=script_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:       # seed 0 done, seed 1 past its first checkpoint
        if list((folder / 'runs' / 'SupCon' / 'seed_1').rglob('last.pth')):
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    deadline = time.time() + 30
    while script_pids(folder) and time.time() < deadline:
        time.sleep(0.2)
    assert not script_pids(folder)            # none left behind holding a folder
    before = records(folder)
    assert before['runs/SupCon/seed_0']['pretrain']['state'] == 'done'
    assert before['runs/SupCon/seed_1']['pretrain']['state'] in ('running', 'interrupted')
    out = sweep(path, '--save_folder', tmp_path / 'save')
    assert out.returncode == 0, out.stdout[-3000:]
    after = records(folder)
    assert after['runs/SupCon/seed_0'] == before['runs/SupCon/seed_0']          # not run again
    assert after['runs/SupCon/seed_1']['pretrain']['attempts'] == 2
    assert '--resume' in after['runs/SupCon/seed_1']['pretrain']['command']
    command = before['runs/SupCon/seed_1']['pretrain']['command'][1:]
    command[command.index('--save_folder') + 1] = str(tmp_path / 'whole')
    run_script(*command)
    assert_same_checkpoints(os.path.join(run_folder(folder / 'runs' / 'SupCon' / 'seed_1'), 'last.pth'),
                            os.path.join(run_folder(tmp_path / 'whole'), 'last.pth'))


@pytest.mark.slow
def test_a_cell_of_the_ablation_equals_the_old_scripts_run(tmp_path):
    """sweeps/ablation_digits.yaml (1 epoch, 1 linear epoch, 8 px here) runs a cell with exactly the flags
    scripts/ablation_digits.sh gave it: digits_run's common flags, the method's, --label_granularity, --epochs and
    the learning rate and temperature; then linear evaluation. Both stages are bit-equal (CPU, one thread)."""
    spec = yaml.safe_load((pathlib.Path(ROOT) / 'sweeps' / 'ablation_digits.yaml').read_text())
    spec['base'].update(epochs=1, size=8)
    spec['linear']['epochs'] = 1
    path = write(tmp_path / 'ablation.yaml', **spec)
    out = sweep(path, '--save_folder', tmp_path / 'save', '--only', 'RASCAL-current setting=coarse-to-fine seed 1')
    assert out.returncode == 0, out.stdout[-3000:]
    cell = tmp_path / 'save' / 'sweeps' / 'ablation_digits' / 'runs' / 'RASCAL-current' / 'setting=coarse-to-fine'
    old = tmp_path / 'old'           # what scripts/ablation_digits.sh ran (digits_run, LINEAR_ALWAYS=1)
    common = ['--dataset', 'digits', '--batch_size', 128, '--cosine', '--num_workers', 0, '--seed', 1,
              '--print_freq', 1000, '--size', 8]
    run_script('main_supcon.py', *common, '--save_folder', old / 'pretrain', '--method', 'RASCAL',
               '--rascal_weighting', 'current', '--label_granularity', 'coarse', '--epochs', 1, '--learning_rate', 0.2,
               '--temp', 0.1)
    ckpt = os.path.join(run_folder(old / 'pretrain'), 'last.pth')
    run_script('main_linear.py', *common, '--epochs', 1, '--learning_rate', 1, '--probe_norm', 'none', '--ckpt', ckpt,
               '--save_folder', old / 'linear')       # the plain probe the script ran (the file says so)
    for stage in ('pretrain', 'linear'):
        new_run, old_run = run_folder(cell / 'seed_1' / stage), run_folder(old / stage)
        assert os.path.basename(new_run) == os.path.basename(old_run)
        assert_same_checkpoints(os.path.join(new_run, 'last.pth'), os.path.join(old_run, 'last.pth'))
    new, old_result = (json.loads((pathlib.Path(run_folder(f)) / 'results.json').read_text())
                       for f in (cell / 'seed_1' / 'linear', old / 'linear'))
    assert [new[k] for k in ('final_test_acc', 'final_test_nll')] == [old_result[k] for k in ('final_test_acc',
                                                                                             'final_test_nll')]


# ---------------------------------------------------------------- the SLURM launcher, on a real one-node cluster
SLURM = ['--launcher', 'slurm', '--poll_s', '0.5', '--time_min', 10]


@pytest.mark.slow
@pytest.mark.xdist_group('slurm')
def test_a_sweep_through_slurm_equals_the_local_one(slurm, tmp_path):
    """A sweep of 2 methods (SupCon with its linear evaluation, CE) through --launcher slurm: one job per cell, every
    stage's checkpoint and result equal to --launcher local's. (One seed. The job's Python forks its stages,
    ``helpers.own_python``.)"""
    path = mini(tmp_path / 's.yaml', base={**TINY, 'epochs': 1}, seeds=[0], slurm={'python': own_python()})
    via_slurm = sweep(path, '--save_folder', tmp_path / 'slurm', *SLURM, env=slurm.env)
    assert via_slurm.returncode == 0, via_slurm.stdout[-3000:] + via_slurm.stderr[-3000:]
    assert 'submitted 2 SLURM jobs' in via_slurm.stdout
    local = sweep(path, '--save_folder', tmp_path / 'local', '--jobs', 2)
    assert local.returncode == 0
    runs = lambda root: sorted(str(p.relative_to(root)) for p in root.rglob('last.pth'))     # noqa: E731
    a, b = tmp_path / 'slurm' / 'sweeps' / 'mini' / 'runs', tmp_path / 'local' / 'sweeps' / 'mini' / 'runs'
    assert runs(a) == runs(b) and len(runs(a)) == 3
    for rel in runs(a):
        assert_same_checkpoints(a / rel, b / rel)
    for result in a.rglob('results.json'):
        assert json.loads(result.read_text())['final_test_acc'] == \
            json.loads((b / result.relative_to(a)).read_text())['final_test_acc']
    assert all(r['_slurm']['job'] for r in records(a.parent).values())


@pytest.mark.slow
@pytest.mark.xdist_group('slurm')
def test_a_requeued_slurm_job_resumes_and_ends_equal(slurm, tmp_path):
    """``scontrol requeue`` while a stage runs (as a preemption or a time limit does): the stage stops with its last
    checkpoint, the job waits (BeginTime) until released, runs again with SLURM_RESTART_COUNT=1 and continues the
    stage from last.pth; it ends bit-equal to an uninterrupted run. The job runs the real interpreter (``slurm:
    python:``), its stage a process of the job's own that SLURM stops.)"""
    path = mini(tmp_path / 's.yaml', base={**TINY, 'batch_size': 64, 'epochs': 3}, linear=None, compare=None,
                methods={'CE': {'script': 'main_ce.py', 'learning_rate': 0.1}}, seeds=[0],
                slurm={'python': sys.executable})
    proc = subprocess.Popen([*own_process('sweep.py'), str(path), '--save_folder', str(tmp_path / 'slurm'), *map(
        str, SLURM)], cwd=ROOT, env={**script_env(), **slurm.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)       # forked: the test signals the job, not the sweep
    cell = tmp_path / 'slurm' / 'sweeps' / 'mini' / 'runs' / 'CE' / 'seed_0'
    deadline = time.time() + 300
    while time.time() < deadline and not list(cell.rglob('last.pth')):
        time.sleep(0.1)
    job = json.loads((cell / 'cell.json').read_text())['stages']['_slurm']['job']
    slurm.run('scontrol', 'requeue', job)
    while time.time() < deadline and 'BeginTime' not in slurm.run('squeue', '-h', '-o', '%r', '-j', job).stdout:
        time.sleep(0.2)
    slurm.run('scontrol', 'update', f'JobId={job}', 'StartTime=now')
    out, _ = proc.communicate(timeout=scaled(300))
    assert proc.returncode == 0, out[-3000:]
    log = (cell / 'pretrain.log').read_text()
    assert 'attempt 2' in log and 'resumed from' in log and 'interrupted' in log
    stages = json.loads((cell / 'cell.json').read_text())['stages']
    assert stages['pretrain']['state'] == 'done' and stages['pretrain']['attempts'] == 2
    assert stages['pretrain']['command'][0] == sys.executable          # the job's python (slurm: python:)
    whole = sweep(path, '--save_folder', tmp_path / 'local')
    assert whole.returncode == 0
    assert_same_checkpoints(os.path.join(run_folder(cell), 'last.pth'), os.path.join(run_folder(
        tmp_path / 'local' / 'sweeps' / 'mini' / 'runs' / 'CE' / 'seed_0'), 'last.pth'))


@pytest.mark.slow
@pytest.mark.xdist_group('slurm')
def test_a_two_task_slurm_job_is_the_torchrun_run(slurm, tmp_path):
    """--tasks_per_node 2: one run over two processes (gloo on the CPU), their environment from SLURM's as torchrun
    gives it; bit-equal to the same command under torchrun with 2 processes. (A 2-process run is not a 1-process run:
    each process draws its own augmentations; one step's equality with one process on the concatenated batch is
    tests/runtime/test_distributed.py's.)"""
    path = mini(tmp_path / 's.yaml', base={**TINY, 'epochs': 1}, linear=None, compare=None, seeds=[0],
                methods={'SupCon': {'method': 'SupCon', 'learning_rate': 0.2, 'temp': 0.1}},
                slurm={'python': own_python()})
    out = sweep(path, '--save_folder', tmp_path / 'slurm', *SLURM, '--tasks_per_node', 2, env=slurm.env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    cell = tmp_path / 'slurm' / 'sweeps' / 'mini' / 'runs' / 'SupCon' / 'seed_0'
    ckpt = load(os.path.join(run_folder(cell), 'last.pth'))
    assert ckpt['config']['world_size'] == 2
    command = json.loads((cell / 'cell.json').read_text())['stages']['pretrain']['command'][1:]
    command[command.index('--save_folder') + 1] = str(tmp_path / 'torchrun')
    run_script(torch.distributed.run.__file__, '--standalone', '--nproc_per_node', '2', *command, timeout=300)
    assert_same_checkpoints(os.path.join(run_folder(cell), 'last.pth'),
                            os.path.join(run_folder(tmp_path / 'torchrun'), 'last.pth'))


def test_the_figure_explains_its_colours_and_keeps_to_what_the_metric_can_take(tmp_path, monkeypatch):
    """A legend says what the colours, the dashed line and the numbers are; with 2 seeds (t = 12.7) the accuracy axis
    stays within 0..100, the intervals drawn to its ends and marked; the differences sit in the right margin, off
    the baseline's line; the title fits the figure."""
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib.figure import Figure

    from sweeping.report import figure
    figures = []
    monkeypatch.setattr(Figure, 'savefig', lambda fig, *a, **k: figures.append(fig))
    runs = {'SupCon': [60.0, 99.0], 'Better': [70.0, 99.9], 'Worse': [10.0, 60.0]}
    rows = [(label, [{'final_test_acc': v, 'config': {'seed': s}} for s, v in enumerate(values)])
            for label, values in runs.items()]
    figure([('', rows, 'SupCon')], 'final_test_acc', str(tmp_path / 'f.png'), 'a sweep with a long name ' * 3)
    fig = figures[0]
    ax = fig.axes[0]
    left, right = ax.get_xlim()
    assert 0 <= left and right <= 100
    assert any(line.get_marker() in ('<', '>') for line in ax.lines)          # an interval cut at the axis's end
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "the baseline's mean" in texts and 'no difference shown (Holm p >= 0.05)' in texts
    assert "interval past the axis's end" in texts
    notes = [a for a in ax.texts if a.get_text().startswith(('+', '-'))]
    assert notes and all(a.xy[0] > 1 for a in notes)           # in the margin (axes fraction), not on the data
    fig.canvas.draw()
    box, whole = fig._suptitle.get_window_extent(), fig.bbox
    assert whole.x0 <= box.x0 and box.x1 <= whole.x1


def test_a_cell_whose_pretraining_failed_is_failed_in_the_table(tmp_path):
    """The table judges a cell by its evaluation stage, which waits forever when its pre-training failed: such a cell
    is listed with the failures (--retry-failed), as --status lists it, not as "not done yet"."""
    from sweeping import report
    sweep_ = read_sweep(mini(tmp_path / 's.yaml'), tmp_path / 'save')
    now = {(c.name, s.name): 'pending' for c in sweep_.cells for s in c.stages}
    supcon = [c for c in sweep_.cells if c.method == 'SupCon']
    first, done = supcon[0], supcon[1]
    now[(first.name, first.stages[0].name)] = 'failed'                  # its pre-training failed
    for stage in done.stages:                                            # the other seed has its result
        folder = fake_run(stage)
        with open(os.path.join(folder, 'results.json'), 'w') as f:
            json.dump({'final_test_acc': 90.0}, f)
        now[(done.name, stage.name)] = 'done'
    report.write_results(sweep_, sweep_.cells, now)
    lines = (pathlib.Path(sweep_.folder) / 'table.md').read_text().splitlines()
    failed = next(line for line in lines if line.startswith('Failed'))
    assert f'SupCon seed {first.seed}' in failed and '--retry-failed' in failed
    waiting = next(line for line in lines if line.startswith('Not done yet'))
    assert f'SupCon seed {first.seed}' not in waiting and 'CE seed' in waiting


def test_every_bundled_sweep_file_plans(tmp_path):
    """Each file in sweeps/ (the GPU files sweeps/noise_fashion_gpu.yaml and noise_field_fashion_gpu.yaml among them)
    reads, and every stage's flags, the evaluations' included, pass its script's parser (``plan.prepare``, as
    ``python sweep.py FILE --dry-run`` checks them on a CPU before a run). Power: an evaluation's flag written inside
    a placeholder's string (``imb_factor: '{imb_factor, probe_norm: none}'``) fails it."""
    import glob

    from sweeping import plan as sweep_plan
    files = sorted(glob.glob(os.path.join(ROOT, 'sweeps', '*.yaml')))
    assert any(f.endswith('noise_fashion_gpu.yaml') for f in files)
    for path in files:
        sweep_ = sweep_plan.read(path, str(tmp_path / 'save'))
        assert sweep_.cells, path
        one_seed = {(c.method, tuple(c.axes.items())): c for c in sweep_.cells}    # the seeds differ by --seed only
        sweep_plan.prepare(sweep_, list(one_seed.values()))
    broken = tmp_path / 'broken.yaml'
    text = open(os.path.join(ROOT, 'sweeps', 'longtail_ablation_digits.yaml')).read()
    broken.write_text(text.replace("imb_factor: '{imb_factor}', probe_norm: none",
                                   "imb_factor: '{imb_factor, probe_norm: none}'"))
    with pytest.raises(sweep_plan.SweepError, match='invalid float value'):
        sweep_plan.prepare(*(lambda s: (s, s.cells))(sweep_plan.read(str(broken), str(tmp_path / 'save'))))


def test_the_jobs_default_reads_alike_in_help_and_usage(capsys):
    """`sweep.py --help` and docs/USAGE.md give the same default for --jobs: the cores up to MAX_CPU_JOBS."""
    import sweep as sweep_script
    with pytest.raises(SystemExit):
        sweep_script.parse_args(['--help'])
    text = ' '.join(capsys.readouterr().out.split())
    assert f'else the cores up to {sweep_script.MAX_CPU_JOBS},' in text
    usage = ' '.join(open(os.path.join(ROOT, 'docs', 'USAGE.md')).read().split())
    assert f'else the cores up to {sweep_script.MAX_CPU_JOBS}' in usage
