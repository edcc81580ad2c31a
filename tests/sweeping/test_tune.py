"""Tuning in a sweep (sweeping/tuning/: spec.py, tuner.py, report.py), with real Optuna: bad
``tune:`` input as one line before anything runs; equal budgets; the chosen values the argmax of the trials' held-out
results; no trial reading the test split (a dataset without one); a seeded study proposing the same trials again, also
after ``kill -9``, with no trial redone and no budget exceeded; a pruned trial's run stopped early; the SLURM path on
the real one-node cluster; the expected-best curve against a brute-force computation."""
import itertools
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from test_sweep import SLURM, TINY, fake_run, sweep, write

from helpers import (
    ROOT,
    assert_one_line_error,
    make_fake_cifar,
    own_process,
    own_python,
    run_in_process,
    run_script,
    script_env,
)

SPACE = {'learning_rate': {'low': 0.02, 'high': 1.0, 'log': True}, 'temp': {'low': 0.05, 'high': 0.5, 'log': True}}


def tuned(path, **changes):
    """SupCon (with its linear evaluation) and CE, tuned with 3 trials each, 2 test seeds."""
    spec = dict(name='tuned', base={**TINY, 'epochs': 3},
                methods={'SupCon': {'method': 'SupCon', 'learning_rate': 0.2, 'temp': 0.1},
                         'CE': {'script': 'main_ce.py', 'learning_rate': 0.1}},
                seeds=[1, 2], linear={'epochs': 1, 'learning_rate': 1},
                tune={'trials': 3, 'space': SPACE, 'val_split': 0.2}, compare={'baseline': 'SupCon'})
    spec.update(changes)
    return write(path, **spec)


def ce_only(path, trials=3, epochs=1, **changes):
    """One CE study (one process per trial): the cheapest tuning."""
    spec = dict(name='ce', base={**TINY, 'epochs': epochs}, methods={'CE': {'script': 'main_ce.py'}}, seeds=[1],
                linear=None, compare=None, tune={'trials': trials, 'space': {'learning_rate': SPACE['learning_rate']},
                                                 'val_split': 0.2, 'pruning': False})
    spec.update(changes)
    return tuned(path, **spec)


def study(folder, method):
    return json.loads((pathlib.Path(folder) / 'tune' / method / 'study.json').read_text())


def results_of(trial_folder):
    return [json.loads(p.read_text()) for p in pathlib.Path(trial_folder).rglob('results.json')]


# ---------------------------------------------------------------- bad input: one line, nothing runs
@pytest.mark.parametrize('change, words', [
    ({'space': {'lerning_rate': {'low': 0.1, 'high': 1}}}, ['tune.space.lerning_rate', 'not a flag',
                                                             'learning_rate']),
    ({'space': {'learning_rate': {'low': 0.1, 'high': 0.1}}}, ['tune.space.learning_rate', 'empty']),
    ({'space': {'learning_rate': {'low': 1.0, 'high': 0.1}}}, ['tune.space.learning_rate', 'reversed']),
    ({'space': {'learning_rate': {'low': 0, 'high': 1, 'log': True}}}, ['log scale needs low > 0']),
    ({'space': {'seed': {'low': 0, 'high': 3}}}, ['set by the tuning itself']),
    ({'space': {}}, ['tune.space is empty']),
    ({'trials': 0}, ['tune.trials', 'budget', '>= 1']),
    ({'trials': 2.5}, ['tune.trials', 'budget']),
    ({'metric': 'final_test_acc'}, ['tune.metric', 'no trial writes', 'final_val_acc']),
    ({'val_split': 0}, ['tune.val_split', '(0, 1)']),
    ({'trails': 3}, ["unknown key 'trails'", 'trials']),
    ({'storage': 'results.db'}, ['tune.storage', 'RDB URL']),
    ({'pruning': {'min_epochs': 0}}, ['tune.pruning']),
    ({'pruning': {'min_epochs': 5}}, ['tune.pruning.min_epochs is 5', 'runs 3 epochs', 'never act']),
    # a value a script refuses (checked at both ends of every range and at every choice, before anything runs)
    ({'space': {'learning_rate': {'low': -1.0, 'high': 0.5}}}, ['tune.space.learning_rate', 'refuses -1.0',
                                                                '--learning_rate must be > 0']),
    ({'space': {'optimizer': {'choices': ['sgd', 'adamm']}}}, ['tune.space.optimizer', "refuses 'adamm'",
                                                               'invalid choice']),
    # confirmation, flatness and the pruning floor
    ({'confirm': {'top': 1}}, ['tune.confirm', 'give {top: K, seeds: N}']),
    ({'confirm': {'top': 0, 'seeds': 1}}, ['tune.confirm.top', '>= 1']),
    ({'confirm': {'top': 1, 'seeds': [0]}}, ['tune.confirm.seeds', 'the seed every trial ran with']),
    ({'confirm': {'top': 1, 'seeds': [1, 1]}}, ['tune.confirm.seeds', 'distinct']),
    ({'confirm': {'top': 2, 'seeds': 1}}, ['tune.confirm', '2 confirmation runs leave 1 of the 3 trials to search',
                                            'tune.trials to 4']),
    ({'flat_margin': -1}, ['tune.flat_margin must be a number >= 0']),
    ({'pruning': {'min_complete': -1}}, ['tune.pruning', 'min_complete >= 0']),
])
def test_bad_tune_input_is_one_line_naming_the_file_and_the_entry(tmp_path, change, words):
    path = tuned(tmp_path / 's.yaml', tune={'trials': 3, 'space': SPACE, **change})
    out = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save')
    assert_one_line_error(out, str(path), *words)
    assert not (tmp_path / 'save').exists()             # before anything runs


def test_other_bad_tuning_files_are_one_line(tmp_path):
    """An axis over a tuned flag; a method's own space without tune:; SupCon without an evaluation to select on."""
    space = {**SPACE, 'weight_decay': {'low': 1e-5, 'high': 1e-3, 'log': True}}
    cases = [(tuned(tmp_path / 'a.yaml', grid={'weight_decay': [0, 1e-4]}, tune={'trials': 3, 'space': space}),
              'grid.weight_decay sets weight_decay, which tune: searches'),
             (tuned(tmp_path / 'b.yaml', tune=None, methods={'SupCon': {'tune': {'temp': {'low': 0.1, 'high': 1}}}}),
              "a method's own search space needs the file's tune: section"),
             (tuned(tmp_path / 'c.yaml', linear=None, compare=None), 'methods.SupCon is tuned on its evaluation'),
             # a study over an empty space; a method's own flag its runs take only with another flag
             (tuned(tmp_path / 'd.yaml', methods={'CE': {'script': 'main_ce.py'}}, compare=None,
                    tune={'trials': 3, 'space': {'temp': SPACE['temp']}}),
              'methods.CE would tune nothing: main_ce.py takes none of tune.space\'s flags (temp)'),
             (tuned(tmp_path / 'e.yaml', methods={'CE': {'script': 'main_ce.py', 'tune': {'temp': SPACE['temp']}}},
                    compare=None), 'methods.CE.tune.temp: main_ce.py does not take --temp')]
    for path, words in cases:
        assert_one_line_error(run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save'), words)


def test_a_tuned_sweep_tests_on_seeds_that_no_trial_or_confirmation_ran_with(tmp_path):
    """seeds: N of a tuned file is the N seeds after the tuning's (tune.seed, then confirm:'s seeds); a list that
    holds one of those is one line. A file without tune: keeps 0..N-1."""
    from sweeping import plan as sweep_plan
    confirm = {'trials': 5, 'space': SPACE, 'val_split': 0.2, 'seed': 4, 'confirm': {'top': 1, 'seeds': [0, 9]}}
    for tune, seeds, want in [({'trials': 3, 'space': SPACE, 'val_split': 0.2}, 3, [1, 2, 3]),
                              (confirm, 2, [10, 11]), (confirm, [1, 2, 5], [1, 2, 5]), (None, 2, [0, 1])]:
        path = tuned(tmp_path / 's.yaml', seeds=seeds, tune=tune)
        cells = sweep_plan.read(str(path), str(tmp_path / 'save')).cells
        assert sorted({c.seed for c in cells}) == want
    path = tuned(tmp_path / 's.yaml', seeds=[1, 9], tune=confirm)
    assert_one_line_error(run_in_process('sweep.py', path, '--dry-run', '--save_folder', tmp_path / 'save'),
                          'seeds: 9 is a seed the tuning ran with', '0, 4, 9', 'seeds: N')


def test_a_sweep_without_tune_does_not_import_optuna(tmp_path):
    """(In a script forked from the suite's script server, which imports torch but not Optuna: a fresh interpreter
    would spend seconds importing torch for the plan's commands.)"""
    path = write(tmp_path / 's.yaml', name='plain', base=TINY, methods={'CE': {'script': 'main_ce.py'}}, seeds=[0])
    script = tmp_path / 'plan.py'
    script.write_text(f'import sys\nsys.path.insert(0, {ROOT!r})\nimport sweep\ntry:\n'
                      '    sweep.main([sys.argv[1], "--dry-run", "--save_folder", sys.argv[2]])\n'
                      'finally:\n    print("optuna" in sys.modules)\n')
    out = run_script(str(script), path, tmp_path / 'save', check=False, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == 'False', out.stdout + out.stderr


def test_the_status_of_a_tuned_sweep_imports_neither_torch_nor_optuna(tmp_path):
    path = tuned(tmp_path / 's.yaml')
    code = ('import sys; import sweep\ntry:\n    sweep.main([sys.argv[1], "--status", "--save_folder", sys.argv[2]])\n'
            'finally:\n    print("torch" in sys.modules, "optuna" in sys.modules)')
    out = subprocess.run([sys.executable, '-c', code, str(path), str(tmp_path / 'save')], cwd=ROOT,
                         capture_output=True, text=True, env=script_env(), timeout=300)
    assert out.stdout.strip().splitlines()[-1] == 'False False', out.stdout + out.stderr
    assert 'SupCon: 0 of 3 trials' in out.stdout and '| SupCon seed 1 | tuning | tuning |' in out.stdout


def test_the_expected_best_of_n_trials_is_the_mean_maximum_over_all_draws():
    """Dodge et al.'s formula against the mean of max over every n-tuple drawn with replacement."""
    from sweeping.tuning.report import expected_best
    values = [81.0, 83.5, 79.25, 83.5, 90.0]
    for n in range(1, 4):
        draws = list(itertools.product(values, repeat=n))
        assert expected_best(values, n) == pytest.approx(np.mean([max(d) for d in draws]))
        assert expected_best(values, n, larger_is_better=False) == pytest.approx(np.mean([min(d) for d in draws]))


def test_flatness_against_hand_computed_cases():
    """A study is flat when the best of its first three quarters of trials (in the order run, rounded up) is within
    the margin of its best: a best that came last, by more than the margin, is not flat."""
    from sweeping.tuning.report import flatness

    def trials(*values):
        return [{'number': i, 'state': 'pruned' if v is None else 'complete', 'value': v} for i, v in enumerate(values)]
    assert flatness(trials(80, 90, 85, 99), 0.5) == (False, 90, 99)          # the best came last
    assert flatness(trials(99, 90, 85, 80), 0.5) == (True, 99, 99)           # ... first
    assert flatness(trials(80, 90, 85, 90.4), 0.5) == (True, 90, 90.4)       # within the margin
    assert flatness(trials(1, 2, 3, 4, 5, 6, 7, 6), 0.5) == (False, 6, 7)    # of 8 trials, the first 6 are 3/4
    assert flatness(trials(1, 2, 3, 4, 5, 6, 7, 6), 1) == (True, 6, 7)
    assert flatness(list(reversed(trials(80, 90, 85, 99))), 0.5) == (False, 90, 99)    # by number, not list order
    assert flatness(trials(None, None, None, 70), 0.5) == (False, None, 70)  # nothing measured early
    assert flatness(trials(None, None), 0.5) is None
    assert flatness(trials(0.5, 0.3, 0.4, 0.2), 0.05, larger_is_better=False) == (False, 0.3, 0.2)


def test_a_method_tunes_the_flags_its_runs_take(tmp_path):
    """The shared space applies where a method's script takes the flag (CE has no temperature without
    --supcon_weight); a method's own tune: key adds its flags."""
    from sweeping import plan as sweep_plan
    path = tuned(tmp_path / 's.yaml', methods={
        'SupCon': {'method': 'SupCon'}, 'CE': {'script': 'main_ce.py'},
        'SupCon+CARROT': {'method': 'SupCon', 'carrot': True, 'tune': {'carrot_q_hi': {'low': 0.8, 'high': 0.95}}}})
    spec = sweep_plan.read(str(path), str(tmp_path / 'save')).tune
    assert list(spec.space_of('SupCon')) == ['learning_rate', 'temp']
    assert list(spec.space_of('CE')) == ['learning_rate']
    assert list(spec.space_of('SupCon+CARROT')) == ['learning_rate', 'temp', 'carrot_q_hi']


# ---------------------------------------------------------------- a tuned sweep, end to end
@pytest.fixture(scope='module')
def tuned_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp('tuned')
    path = tuned(root / 's.yaml', base={**TINY, 'epochs': 2}, seeds=[1])
    out = sweep(path, '--save_folder', root / 'save', '--jobs', 2)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return path, root / 'save' / 'sweeps' / 'tuned', out


@pytest.mark.slow
def test_every_method_gets_the_budget_and_the_cells_run_the_argmax(tuned_sweep):
    """Each study has exactly its 3 trials; best.json is the trial with the highest held-out result (read from the
    trials' own results.json); the seeded cells ran with those values on the whole training set and read the test
    split; no trial read it."""
    path, folder, out = tuned_sweep
    for method, flags in (('SupCon', ['learning_rate', 'temp']), ('CE', ['learning_rate'])):
        record = study(folder, method)
        assert len(record['trials']) == 3 and {t['state'] for t in record['trials']} <= {'complete', 'pruned'}
        scores = {}
        for trial in record['trials']:
            for result in results_of(folder / 'tune' / method / f'trial_{trial["number"]}'):
                assert result['test_split_read'] is False and result['selected_on'] == 'held-out'
                if trial['state'] == 'complete':
                    scores[trial['number']] = result['final_val_acc']
        best = json.loads((folder / 'tune' / method / 'best.json').read_text())
        assert best['value'] == max(scores.values()) and scores[best['trial']] == best['value']
        chosen = next(t for t in record['trials'] if t['number'] == best['trial'])['params']
        assert sorted(best['flags']) == flags and best['flags'] == chosen
        for run in (folder / 'runs' / method).rglob('run.json'):
            config = json.loads(run.read_text())['config']
            if 'pretrain' in str(run):
                assert all(config[k] == v for k, v in chosen.items()) and config['val_split'] == 0
        cell_results = list((folder / 'runs' / method).rglob('results.json'))
        assert cell_results
        for result in (json.loads(p.read_text()) for p in cell_results):   # the test split read once, at the end
            if 'test_read' in result:
                assert result['test_read'] == 'once, after the last epoch' and result['selected_on'] == 'last epoch'
        for trial in record['trials']:      # a trial's runs are named after it (--trial): one meaning of "trial"
            runs = [p.parent.name for p in (folder / 'tune' / method / f'trial_{trial["number"]}').rglob('run.json')]
            assert runs and all(set(re.findall(r'_trial_(\d+)', r)) == {str(trial['number'])} for r in runs), runs
        for run in (folder / 'runs' / method).rglob('run.json'):          # the kNN monitor too: test read at the end
            assert json.loads(run.read_text())['config']['test_every'] == 'end'
        for metrics in (folder / 'tune' / method).rglob('metrics.csv'):
            header = metrics.read_text().splitlines()[0]
            assert 'test/' not in header and 'knn/acc' not in header.split(',')
    table = (folder / 'table.md').read_text()
    assert '## Tuning' in table and '| SupCon | learning_rate' in table and '3 of 3' in table
    assert (folder / 'tuning.png').is_file() and 'tuning' in json.loads((folder / 'sweep.json').read_text())
    status = sweep(path, '--save_folder', folder.parent.parent, '--status')
    assert 'SupCon: 3 of 3 trials' in status.stdout and 'chosen' in status.stdout


@pytest.mark.slow
@pytest.mark.parametrize('floor', [0, 2])
def test_a_pruned_trial_is_stopped_early(tmp_path, floor):
    """A study whose earlier trial reported 100 % at every epoch: the next trial's first epoch is below it, successive
    halving prunes it, and its run stops there (its metrics.csv ends before --epochs 6, the rungs being at epochs 1,
    2 and 4). With the floor ``min_complete: 2`` (one trial finished so far) the same trial is not pruned: it runs
    its 6 epochs."""
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.storages.journal import JournalFileBackend
    epochs = 6
    path = ce_only(tmp_path / 's.yaml', trials=2, epochs=epochs, tune={
        'trials': 2, 'space': {'learning_rate': SPACE['learning_rate']}, 'pruning': {'min_epochs': 1,
                                                                                     'reduction': 2,
                                                                                     'min_complete': floor}})
    folder = tmp_path / 'save' / 'sweeps' / 'ce'
    (folder / 'tune').mkdir(parents=True)
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(folder / 'tune' / 'optuna.journal')))
    study_ = optuna.create_study(study_name='ce:CE', storage=storage, direction='maximize',
                                 pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2))
    trial = study_.ask({'learning_rate': FloatDistribution(0.02, 1.0, log=True)})
    for epoch in range(1, epochs + 1):
        trial.report(100.0, epoch)
        assert not trial.should_prune()          # the pruner records the rungs it passed
    study_.tell(trial, 100.0)
    started = time.time()
    out = sweep(path, '--save_folder', tmp_path / 'save', '--jobs', 1)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    if floor:
        assert 'pruned: trial' not in out.stdout
        assert [t['state'] for t in study(folder, 'CE')['trials']] == ['complete'] * 2
        rows = next((folder / 'tune' / 'CE' / 'trial_1').rglob('metrics.csv')).read_text().splitlines()
        assert len(rows) == epochs + 1
        return
    assert 'pruned: trial 1 of CE after epoch' in out.stdout
    # the lines in the order things happened: the last trial's pruning, then the study's choice
    assert out.stdout.index('pruned: trial 1 of CE') < out.stdout.index('chosen for CE')
    record = study(folder, 'CE')
    assert [t['state'] for t in record['trials']] == ['complete', 'pruned']
    cell = json.loads((folder / 'tune' / 'CE' / 'trial_1' / 'cell.json').read_text())
    assert cell['stages']['pretrain']['state'] == 'pruned'
    rows = next((folder / 'tune' / 'CE' / 'trial_1').rglob('metrics.csv')).read_text().splitlines()
    assert 2 <= len(rows) < epochs + 1          # a header and the epochs to the rung that pruned it, not 6
    assert json.loads((folder / 'tune' / 'CE' / 'best.json').read_text())['trial'] == 0
    assert time.time() - started < 300


@pytest.mark.slow
def test_a_seeded_study_proposes_the_same_trials_again_even_after_kill_9(tmp_path):
    """A call with --jobs 1 runs three trials. Another, in a fresh folder, is killed (SIGKILL) while trial 1 runs; the
    next call keeps trial 0 (not run again), continues trial 1 from its checkpoint, asks trial 2 and no more: the same
    trials as the first call's (seeded by the file's seed and the trial's number), the same choice."""
    path = ce_only(tmp_path / 's.yaml', epochs=3)
    out = sweep(path, '--save_folder', tmp_path / 'a', '--jobs', 1)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    params = [[t['params'] for t in study(tmp_path / 'a' / 'sweeps' / 'ce', 'CE')['trials']]]
    assert len(params[0]) == 3 and params[0][0] != params[0][1]
    folder = tmp_path / 'k' / 'sweeps' / 'ce'
    proc = subprocess.Popen([*own_process('sweep.py'), str(path), '--save_folder', str(tmp_path / 'k'), '--jobs',
                             '1'], cwd=ROOT, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not list((folder / 'tune' / 'CE' / 'trial_1').rglob('last.pth')):
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    time.sleep(1)
    before = json.loads((folder / 'tune' / 'CE' / 'trial_0' / 'cell.json').read_text())
    out = sweep(path, '--save_folder', tmp_path / 'k', '--jobs', 1)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    record = study(folder, 'CE')
    assert [t['params'] for t in record['trials']] == params[0]               # no trial past the budget
    assert json.loads((folder / 'tune' / 'CE' / 'trial_0' / 'cell.json').read_text()) == before   # not redone
    resumed = json.loads((folder / 'tune' / 'CE' / 'trial_1' / 'cell.json').read_text())['stages']['pretrain']
    assert resumed['attempts'] == 2 and '--resume' in resumed['command']
    best = [json.loads((root / 'sweeps' / 'ce' / 'tune' / 'CE' / 'best.json').read_text())
            for root in (tmp_path / 'a', tmp_path / 'k')]
    assert best[0] == best[1]


@pytest.mark.slow
def test_tuning_needs_no_test_split_and_an_rdb_holds_its_study(tmp_path):
    """On CIFAR files without their test batch the tuning runs to its choice (no trial reads the test split); the
    seeded cells, which read it once, then stop with the one line naming the missing file. The study is in the RDB
    that storage: names (SQLite here; PostgreSQL the same way, for optuna-dashboard), not in the journal file."""
    import optuna
    data = make_fake_cifar(tmp_path / 'data', n_train=100)
    os.remove(os.path.join(data, 'cifar-10-batches-py', 'test_batch'))
    base = {**TINY, 'dataset': 'cifar10', 'data_folder': str(data), 'model': 'resnet_tiny', 'epochs': 1}
    url = f'sqlite:///{tmp_path / "studies.db"}'
    path = ce_only(tmp_path / 's.yaml', base=base, tune={'trials': 2, 'space': {'learning_rate':
                                                                                 SPACE['learning_rate']},
                                                          'storage': url})
    out = sweep(path, '--save_folder', tmp_path / 'save', '--jobs', 1)
    folder = tmp_path / 'save' / 'sweeps' / 'ce'
    assert [t['state'] for t in study(folder, 'CE')['trials']] == ['complete', 'complete']
    assert (folder / 'tune' / 'CE' / 'best.json').is_file()
    assert out.returncode == 1 and 'test_batch' in out.stderr
    assert len(optuna.load_study(study_name='ce:CE', storage=url).trials) == 2
    assert not (folder / 'tune' / 'optuna.journal').exists()


@pytest.mark.slow
@pytest.mark.xdist_group('slurm')
def test_tuning_through_slurm(slurm, tmp_path):
    """The trials as SLURM jobs on the one-node cluster: the budget, the held-out choice, the cells after it."""
    path = ce_only(tmp_path / 's.yaml', trials=2, slurm={'python': own_python()})    # the jobs fork their stages
    out = sweep(path, '--save_folder', tmp_path / 'save', *SLURM, '--jobs', 2, env=slurm.env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    folder = tmp_path / 'save' / 'sweeps' / 'ce'
    assert [t['state'] for t in study(folder, 'CE')['trials']] == ['complete', 'complete']
    for trial in (0, 1):
        assert json.loads((folder / 'tune' / 'CE' / f'trial_{trial}' / 'cell.json').read_text())['stages']['_slurm']
    assert (folder / 'table.md').is_file() and yaml.safe_load((folder / 'sweep_file.yaml').read_text())['tune']


def test_a_raised_budget_chooses_again(tmp_path):
    """best.json counts for the budget it was chosen with: a file that raises trials: has its cells wait again."""
    from sweeping import plan as sweep_plan
    from sweeping.tuning.spec import study_folder
    path = ce_only(tmp_path / 's.yaml', trials=3)
    sweep_ = sweep_plan.read(str(path), str(tmp_path / 'save'))
    folder = pathlib.Path(study_folder(sweep_.folder, 'CE', {}))
    folder.mkdir(parents=True)
    (folder / 'best.json').write_text(json.dumps({'flags': {'learning_rate': 0.3}, 'budget': 3}))
    assert sweep_.tune.tuned(sweep_.folder, 'CE', {}) == {'learning_rate': 0.3}
    again = sweep_plan.read(str(path), str(tmp_path / 'save'))
    assert not again.cells[0].waiting and '0.3' in again.cells[0].stages[0].argv
    sweep_plan.prepare(again, again.cells)
    fake_run(again.cells[0].stages[0])                         # the cell ran with the chosen values
    (folder / 'best.json').write_text(json.dumps({'flags': {'learning_rate': 0.3}, 'budget': 2}))
    assert sweep_.tune.tuned(sweep_.folder, 'CE', {}) is None
    waiting = sweep_plan.read(str(path), str(tmp_path / 'save'))
    assert waiting.cells[0].waiting
    sweep_plan.prepare(waiting, waiting.cells)     # its values are not known yet: no conflict with the run it holds


def tuner_of(path, save, say=None):
    """The sweep's Tuner, built as ``sweep.py`` builds it (no trial is started)."""
    from sweeping import plan as sweep_plan
    from sweeping.tuning import tuner as tuning
    sweep_ = sweep_plan.read(str(path), str(save))
    return tuning.Tuner(sweep_, tuning.studies_of(sweep_), say=say or (lambda text: None)), sweep_


def test_a_storage_that_cannot_be_opened_is_one_line_before_any_trial(tmp_path):
    for url in ('sqlite:////proc/nope/x.db', 'foo://bar/baz'):
        path = ce_only(tmp_path / 's.yaml', tune={'trials': 2, 'space': {'learning_rate': SPACE['learning_rate']},
                                                   'storage': url})
        out = sweep(path, '--save_folder', tmp_path / 'save')
        assert_one_line_error(out, 's.yaml: tune.storage', url, 'cannot be opened')
        assert not list((tmp_path / 'save').rglob('trial.json'))


def test_a_journal_cut_mid_write_is_trimmed_with_a_note(tmp_path):
    """A crash mid-write leaves the journal's last record without its newline: the next call drops that record (its
    write never completed) with a note and continues the study; the trials asked before it are still there."""
    from sweeping.tuning import tuner as tuning
    tuner, sweep_ = tuner_of(ce_only(tmp_path / 's.yaml', trials=3), tmp_path / 'save')
    (study, opt_study), = tuner.studies
    first = tuner.ask(study, opt_study)
    journal = pathlib.Path(sweep_.folder) / 'tune' / tuning.JOURNAL
    with open(journal, 'ab') as f:
        f.write(b'{"op_code": 4, "worker_id": "x", "trial_id": 1, "par')      # 40-odd bytes of a record
    notes = []
    again, _ = tuner_of(tmp_path / 's.yaml', tmp_path / 'save', say=notes.append)
    assert [t.number for t in again.studies[0][1].trials] == [first.number]
    assert len(notes) == 1 and 'cut short' in notes[0] and journal.read_bytes().endswith(b'\n')


def test_a_budget_lowered_below_what_ran_is_refused(tmp_path):
    """trials: 3 lowered to 1 after three trials: the next call is refused in one line (a choice among three would
    not respect a budget of one), and --status says so instead of "3 of 1 trials"."""
    from core.flags import UserError
    tuner, sweep_ = tuner_of(ce_only(tmp_path / 's.yaml', trials=3), tmp_path / 'save')
    (study, opt_study), = tuner.studies
    for _ in range(3):
        tuner.ask(study, opt_study)
    record = tuner.record(study, opt_study)
    ce_only(tmp_path / 's.yaml', trials=1)
    with pytest.raises(UserError, match='tune.trials is 1, but CE already ran 3 trials'):
        tuner_of(tmp_path / 's.yaml', tmp_path / 'save')
    from sweeping.tuning.status import progress_line
    assert progress_line(record, 1).startswith('3 trials, more than the file\'s budget of 1: refused')


def test_a_trial_held_as_running_with_nothing_running_is_interrupted(tmp_path):
    """--status after an interrupt: the study's record still says running, but no process holds the sweep's folder,
    so the trial is shown as interrupted (the next call continues it), as USAGE's states say."""
    from runtime.run_folder import lock_folder
    from sweeping.tuning.status import progress_line
    record = {'trials': [{'state': 'complete', 'value': 90.0, 'number': 0}, {'state': 'running', 'number': 1}],
              'best': {'value': 90.0, 'number': 0}, 'folder': str(tmp_path)}
    assert progress_line(record, 3, live=False).startswith('2 of 3 trials: 1 complete, 1 interrupted')
    assert '1 running' in progress_line(record, 3, live=True)
    path = ce_only(tmp_path / 's.yaml', trials=3)
    folder = tmp_path / 'save' / 'sweeps' / 'ce'
    (folder / 'tune' / 'CE').mkdir(parents=True)
    (folder / 'tune' / 'CE' / 'study.json').write_text(json.dumps(record))
    status = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save', '--status')
    assert 'CE: 2 of 3 trials: 1 complete, 1 interrupted' in status.stdout, status.stdout
    held, _ = lock_folder(str(folder))                  # a process drives the sweep: its trial is running
    try:
        status = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save', '--status')
        assert 'CE: 2 of 3 trials: 1 complete, 1 running' in status.stdout, status.stdout
    finally:
        held.close()


def test_a_trial_never_runs_in_a_folder_of_other_values(tmp_path):
    """A journal that lost its last records asks trial 0 again with new values: the folder of the old trial 0 (other
    values, a checkpoint the run would resume) is moved aside with a note, never resumed under the new values nor
    deleted; a folder of the same values is the trial's own and stays (it resumes)."""
    notes = []
    tuner, _ = tuner_of(ce_only(tmp_path / 's.yaml', trials=3), tmp_path / 'save', say=notes.append)
    (study, opt_study), = tuner.studies
    trial = tuner.ask(study, opt_study)
    folder = pathlib.Path(study.cell(trial.number, dict(trial.params)).folder)
    folder.mkdir(parents=True)
    (folder / 'trial.json').write_text(json.dumps({'number': 0, 'params': {'learning_rate': 0.086}}))
    (folder / 'last.pth').write_text('the old run')
    tuner.start(study, opt_study, trial, start_trial=lambda cell: None)
    aside = folder.parent / f'{folder.name}.other_values_1'
    assert (aside / 'last.pth').read_text() == 'the old run' and not (folder / 'last.pth').exists()
    assert json.loads((folder / 'trial.json').read_text())['params'] == dict(trial.params)
    assert any('other values' in n for n in notes)
    tuner.running.clear()
    tuner.start(study, opt_study, trial, start_trial=lambda cell: None)          # its own values: nothing moves
    assert not (folder.parent / f'{folder.name}.other_values_2').exists()


def test_the_dry_run_of_a_tuned_sweep_prints_every_command_with_placeholders(tmp_path):
    """--dry-run of a file with tune: prints each study's next trial's commands and the seeded cells' commands, with
    <flag> for each value still to choose; with the values filled in, a trial's command is the one the tuning runs
    and a cell's the one the sweep runs once the study has chosen them."""
    from sweeping import plan as sweep_plan
    from sweeping.tuning import tuner as tuning
    path = tuned(tmp_path / 's.yaml')
    out = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'save', '--dry-run')
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert 'SupCon: trials 0 to 2 of 3 (learning_rate in [0.02, 1] (log), temp in [0.05, 0.5] (log))' in out.stdout
    assert 'after tuning, would run 6 stages of the seeded cells' in out.stdout
    assert 'would run 0 stages' not in out.stdout                # (it said so after listing the trials' commands)
    sweep_ = sweep_plan.read(str(path), str(tmp_path / 'save'))
    values = {'learning_rate': 0.125, 'temp': 0.25}
    fill = {f"'<{k}>'": str(v) for k, v in values.items()}

    def printed(prefix):
        line = next(x for x in lines if x.strip().startswith(prefix)).split(': ', 1)[1]
        for k, v in fill.items():
            line = line.replace(k, v)
        return line.split()[2:]              # after the interpreter and the script
    study_ = next(s for s in tuning.studies_of(sweep_) if s.method == 'SupCon')
    trial = study_.cell(0, values)
    assert printed('SupCon trial=0 seed 0, pretrain:') == trial.stages[0].command()[1:]
    best = tmp_path / 'save' / 'sweeps' / 'tuned' / 'tune' / 'SupCon' / 'best.json'
    best.parent.mkdir(parents=True, exist_ok=True)
    best.write_text(json.dumps({'flags': values, 'trial': 0, 'value': 90.0, 'budget': 3}))     # the study chose
    chosen = sweep_plan.read(str(path), str(tmp_path / 'save'))
    cell = next(c for c in chosen.cells if c.method == 'SupCon' and c.seed == 1)
    assert not cell.waiting and printed('SupCon seed 1, pretrain:') == cell.stages[0].command()[1:]
    assert "--ckpt '<the stage-1 run folder>/last.pth'" in out.stdout
    assert "--test_every end" in next(x for x in lines if 'SupCon seed 1, linear:' in x)
    # the whole work in one line: the trials' stages (every study's budget, confirmations included) and the cells'
    studies = tuning.studies_of(sweep_)
    trial_stages = sum(sweep_.tune.trials * len(s.cell(0, values).stages) for s in studies)
    assert f'in all: {trial_stages + 6} stages ({trial_stages} of the trials, 6 of the seeded cells after the ' \
           'tuning); the file gives no estimate of the time' in out.stdout
    assert 'stages: 6 waiting for the tuning)' in lines[0], lines[0]
    path.write_text(path.read_text() + 'estimate: about 2 minutes at --jobs 2\n')
    out = run_in_process('sweep.py', path, '--save_folder', tmp_path / 'other', '--dry-run')
    assert out.stdout.strip().endswith("; the file's estimate: about 2 minutes at --jobs 2"), out.stdout[-300:]


@pytest.mark.slow
def test_confirmation_runs_count_in_the_budget_choose_by_the_mean_and_resume_without_redoing(tmp_path):
    """confirm: {top: 2, seeds: 1} with a budget of 4: Optuna asks 2 trials, then each is re-run once on seed 1 (4 runs
    in all, the budget); best.json is the trial with the higher mean of its two seeds' held-out results (read from the
    runs' own results.json). A call killed (SIGKILL) during the second confirmation run, then called again, redoes
    neither the trials nor the first confirmation, and chooses the same."""
    path = ce_only(tmp_path / 's.yaml', epochs=1, seeds=[2], tune={
        'trials': 4, 'space': {'learning_rate': SPACE['learning_rate']}, 'val_split': 0.2, 'pruning': False,
        'confirm': {'top': 2, 'seeds': 1}})
    folder = tmp_path / 'save' / 'sweeps' / 'ce'
    proc = subprocess.Popen([*own_process('sweep.py'), str(path), '--save_folder', str(tmp_path / 'save'), '--jobs',
                             '1'], cwd=ROOT, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline, confirm = time.time() + 600, folder / 'tune' / 'CE' / 'confirm'
    while time.time() < deadline and len([p for p in confirm.rglob('cell.json')]) < 2:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    time.sleep(1)
    cells = sorted(confirm.glob('trial_*_seed_1'))
    assert len(cells) == 2, cells
    finished = [c for c in cells if list(c.rglob('results.json'))]     # the first confirmation, ended before the kill
    assert len(finished) == 1, finished
    records = [*(folder / 'tune' / 'CE').glob('trial_*/cell.json'), finished[0] / 'cell.json']
    before = {p: p.read_text() for p in records}
    out = sweep(path, '--save_folder', tmp_path / 'save', '--jobs', 1)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert [p for p, text in before.items() if p.read_text() != text] == []      # nothing redone
    record = study(folder, 'CE')
    assert len(record['trials']) == 2 and record['searched'] == 2 and record['budget'] == 4
    assert [r['state'] for r in record['confirmations']] == ['complete', 'complete']
    runs = list((folder / 'tune' / 'CE').rglob('results.json'))
    assert len(runs) == 4                                                     # the budget, confirmation included
    means = {}
    for trial in record['trials']:
        values = [r['final_val_acc'] for r in results_of(folder / 'tune' / 'CE' / f'trial_{trial["number"]}')]
        values += [r['final_val_acc'] for r in results_of(confirm / f'trial_{trial["number"]}_seed_1')]
        for r in results_of(confirm / f'trial_{trial["number"]}_seed_1'):
            assert r['config']['seed'] == 1 and r['test_split_read'] is False
        means[trial['number']] = sum(values) / 2
    best = json.loads((folder / 'tune' / 'CE' / 'best.json').read_text())
    assert best['trial'] == max(means, key=lambda n: (means[n], -n))
    assert best['value'] == pytest.approx(max(means.values()))
    assert best['confirmed']['seeds'] == [0, 1] and best['confirm'] == {'top': 2, 'seeds': [1]}
    assert 'mean of 2 seeds' in (folder / 'table.md').read_text()


def test_val_noise_same_gives_the_trials_held_out_part_the_runs_label_noise(tmp_path):
    """tune: val_noise: same: a trial whose run trains with --label_noise (a grid value) selects on held-out labels with
    that noise (both stages get --val_noise same); a run without noise keeps them clean; the seeded cells hold nothing
    out. A value other than clean or same is one line."""
    from sweeping import plan as sweep_plan
    from sweeping.tuning import tuner as tuning
    path = tuned(tmp_path / 's.yaml', grid={'noise': {'0': {'label_noise': 0}, '0.4': {'label_noise': 0.4}}},
                 tune={'trials': 3, 'space': SPACE, 'val_noise': 'same'})
    sweep_ = sweep_plan.read(str(path), str(tmp_path / 'save'))
    for study_ in tuning.studies_of(sweep_):
        cell = study_.cell(0, {'learning_rate': 0.1, 'temp': 0.1} if study_.method == 'SupCon' else
                           {'learning_rate': 0.1})
        noisy = study_.chosen['noise'] == '0.4'
        for stage in cell.stages:
            assert ('--val_noise' in stage.argv) == noisy, (study_.label, stage.name, stage.argv)
    assert all('--val_noise' not in s.argv for c in sweep_.cells for s in c.stages)
    table = tuned(tmp_path / 'b.yaml', tune={'trials': 3, 'space': SPACE, 'val_noise': 'noisy'})
    assert_one_line_error(run_in_process('sweep.py', table, '--save_folder', tmp_path / 'save'),
                          'tune.val_noise: clean or same')


def test_the_parallel_coordinate_plot_shows_every_trial_and_its_colour_bar_clear_of_the_ticks():
    """Optuna's plot as the report draws it: the worst trial's line is not near-white (Optuna's Blues starts at white),
    and the colour bar starts right of the last parameter axis's tick labels. Power: Optuna's own colours fail the
    first check."""
    import warnings

    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as plots

    from sweeping.tuning.report import readable_parallel_coordinate
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study_ = optuna.create_study(direction='maximize', sampler=optuna.samplers.RandomSampler(seed=0))
    study_.optimize(lambda t: 90 + t.suggest_float('learning_rate', 0.02, 1, log=True)
                    + t.suggest_float('temp', 0.05, 0.5, log=True), n_trials=6)

    def drawn(fix):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            ax = plots.plot_parallel_coordinate(study_)
        figure = ax.figure
        figure.set_size_inches(8, 4.4)
        figure.tight_layout()
        if fix:
            readable_parallel_coordinate(ax)
        figure.canvas.draw()
        return ax, figure

    def lightest(ax):
        lines = ax.collections[0]
        return max(sum(c[:3]) / 3 for c in lines.get_cmap()(lines.norm(lines.get_array())))
    ax, figure = drawn(fix=False)
    assert lightest(ax) > 0.9                                             # power: near-white
    plt.close(figure)
    ax, figure = drawn(fix=True)
    assert lightest(ax) < 0.85                                            # a light blue, visible on white
    renderer = figure.canvas.get_renderer()
    bar = next(a for a in figure.axes if a.get_label() == '<colorbar>')
    ticks = max(label.get_window_extent(renderer).x1 for a in figure.axes if a is not bar
                for label in a.get_yticklabels() if label.get_text())
    assert bar.get_window_extent(renderer).x0 > ticks
    plt.close(figure)


def _tuner_with(tmp_path, metric, outcomes, confirm=None):
    """A Tuner of a CE study whose search trials ended as ``outcomes`` (a value, or 'diverged' recorded as the
    tuner records one), recorded once; returns (tuner, study, its best.json or None)."""
    import optuna

    from sweeping import plan as sweep_plan
    from sweeping.tuning import tuner as tuning
    spec = {'trials': len(outcomes) + (confirm['top'] * confirm['seeds'] if confirm else 0),
            'space': {'learning_rate': SPACE['learning_rate']}, 'val_split': 0.2, 'pruning': False, 'metric': metric,
            **({'confirm': confirm} if confirm else {})}
    tmp_path.mkdir(parents=True, exist_ok=True)
    sweep_ = sweep_plan.read(str(ce_only(tmp_path / 's.yaml', seeds=[9], tune=spec)), str(tmp_path / 'save'))
    tuner = tuning.Tuner(sweep_, tuning.studies_of(sweep_), say=lambda text: None)
    study_, opt_study = tuner.studies[0]
    for outcome in outcomes:
        trial = tuner.ask(study_, opt_study)
        if outcome == 'diverged':
            trial.set_user_attr('diverged', 'error: the loss diverged')
            if metric == 'final_val_acc':
                opt_study.tell(trial, 0.0)
            else:
                opt_study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            opt_study.tell(trial, outcome)
    tuner.record(study_, opt_study)
    best = pathlib.Path(study_.folder) / 'best.json'
    return tuner, study_, json.loads(best.read_text()) if best.exists() else None


def test_a_minimized_objective_chooses_the_smallest_value(tmp_path):
    """metric: final_val_nll: best.json is the trial of the smallest NLL (ties: the earlier); final_val_acc the
    largest. Power: choosing by the largest NLL picks trial 1."""
    _, _, best = _tuner_with(tmp_path / 'nll', 'final_val_nll', [2.3520, 2.3530, 2.3510, 2.3510])
    assert (best['trial'], best['value']) == (2, 2.3510)
    _, _, best = _tuner_with(tmp_path / 'acc', 'final_val_acc', [71.0, 73.5, 73.5, 70.0])
    assert (best['trial'], best['value']) == (1, 73.5)


def test_confirm_when_every_trial_diverged_chooses_or_says_why_not(tmp_path):
    """With confirm: and every searched trial diverged there is nothing to confirm: a maximized objective chooses
    among the diverged trials (all at the lowest score: the first), with no confirmation run; a minimized one has no
    value to choose from and says so in one line, not 'a trial crashed'."""
    tuner, study_, best = _tuner_with(tmp_path / 'acc', 'final_val_acc', ['diverged'] * 3,
                                      confirm={'top': 1, 'seeds': 1})
    assert best is not None and best['trial'] == 0 and not tuner.confirm.of(*tuner.studies[0])
    tuner, study_, best = _tuner_with(tmp_path / 'nll', 'final_val_nll', ['diverged'] * 3,
                                      confirm={'top': 1, 'seeds': 1})
    assert best is None and tuner.without_choice == {study_.name}
    path = tmp_path / 'nll' / 's.yaml'
    assert_one_line_error(run_in_process('sweep.py', path, '--save_folder', tmp_path / 'nll' / 'save'),
                          'every trial of', 'diverged, leaving no value to choose from', 'narrow the space')


def test_a_trial_stage_that_finished_as_the_stop_came_stays_done(tmp_path):
    """A trial told to stop whose stage exits 0 with its results as the signal lands (it had finished) is recorded
    done, not interrupted with exit 0 (which --status and sweep.json then contradicted). Power: a stage that the
    signal does stop is recorded with the reason given."""
    from sweeping import launch
    from sweeping import plan as sweep_plan
    from sweeping.tuning.trials import LocalTrial
    path = write(tmp_path / 's.yaml', name='plain', base=TINY, methods={'CE': {'script': 'main_ce.py'}}, seeds=[0])
    sweep_ = sweep_plan.read(str(path), str(tmp_path / 'save'))
    sweep_plan.prepare(sweep_, sweep_.cells)
    cell = sweep_.cells[0]
    stage = cell.stages[0]
    for finished, want in ((True, 'done'), (False, 'pruned')):
        folder = fake_run(stage) if finished else None
        if finished:
            with open(os.path.join(folder, 'results.json'), 'w') as f:
                f.write('{}')
        trial = LocalTrial.__new__(LocalTrial)
        trial.cell, trial.index, trial.started = cell, 0, time.time()
        trial.log = str(tmp_path / 'log.txt')
        open(trial.log, 'w').close()
        code = 0 if finished else 143          # exit 0: its work was done when SIGTERM came
        trial.proc = subprocess.Popen([sys.executable, '-c', 'import signal, sys, time; signal.signal(signal.SIGTERM, '
                                       f'lambda *a: sys.exit({code})); print(flush=True); time.sleep(60)'],
                                      stdout=subprocess.PIPE)
        trial.proc.stdout.readline()            # the handler is in place
        trial.stop('pruned')
        assert launch.read_record(cell.folder)[stage.name]['state'] == want
        shutil.rmtree(cell.folder)
