"""config/recipe.py (``--config FILE``): flags from a YAML recipe or a run's run.json, the command line overriding them,
one-line errors naming the key; every file of configs/ through the parser; a run started again from its run.json
into a new folder is bit for bit the same run (CPU)."""
import json
import os
import pathlib

import pytest
import torch

from config.options import parse_option
from helpers import FAST, ROOT, assert_one_line_error, load, only_run_folder, run_in_process, run_script

CONFIGS = sorted((pathlib.Path(ROOT) / 'configs').glob('*.yaml'))


def script_of(path):
    """A recipe's script, from its first line (``# main_supcon.py: ...``)."""
    first = path.read_text().splitlines()[0]
    return first.split('main_')[1].split('.py')[0]


def test_configs_exist_for_every_launcher_and_name_their_script_and_source():
    names = {p.name for p in CONFIGS}
    assert {'supcon_cifar.yaml', 'simclr_cifar.yaml', 'ce_cifar.yaml', 'rascal_cifar.yaml', 'carrot_supcon_cifar.yaml',
            'carrot_rascal_cifar.yaml', 'carrot_ce_cifar.yaml', 'linear_cifar.yaml', 'digits_supcon.yaml',
            'digits_linear.yaml', 'digits_ce.yaml'} <= names
    for dataset in ('stl10', 'imagenet100', 'tinyimagenet'):
        assert {f'supcon_{dataset}_resnet50.yaml', f'supcon_{dataset}_vits.yaml'} <= names
    for path in CONFIGS:
        assert script_of(path) in ('supcon', 'ce', 'linear') and 'Source' in path.read_text() or 'digits' in path.name
    for launcher in ('supcon_cifar', 'simclr_cifar', 'ce_cifar', 'rascal_cifar', 'carrot_cifar', 'linear_cifar',
                     'supcon_queue_cifar'):
        assert '--config configs/' in (pathlib.Path(ROOT) / 'scripts' / f'{launcher}.sh').read_text(), launcher


@pytest.mark.parametrize('path', CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_recipe_parses_and_sets_its_flags(path):
    import yaml
    script = script_of(path)
    extra = ['--data_folder', '/data'] + (['--ckpt', '/nowhere/last.pth'] if script == 'linear' else [])
    opt = parse_option(script, ['--config', str(path), *extra])
    for key, value in yaml.safe_load(path.read_text()).items():
        if key == 'script':                      # every recipe names its script
            assert value == f'main_{script}.py'
            continue
        assert getattr(opt, key) == value or key == 'dataset' and opt.dataset == value, key
    assert opt.config == str(path)


def test_a_recipe_for_another_script_is_refused_in_one_line():
    """configs/digits_linear.yaml names main_linear.py: main_supcon.py refuses it, naming the script to run, rather
    than starting a 10-epoch SupCon run at lr 1."""
    from helpers import assert_one_line_error, run_in_process
    for script in ('main_supcon.py', 'main_ce.py'):
        assert_one_line_error(run_in_process(script, '--config', 'configs/digits_linear.yaml'),
                              'configs/digits_linear.yaml is a recipe for main_linear.py', f'not {script}',
                              'run python main_linear.py --config configs/digits_linear.yaml')
    assert yaml_keys('configs/digits_supcon.yaml')['script'] == 'main_supcon.py'


def yaml_keys(path):
    import yaml
    return yaml.safe_load((pathlib.Path(ROOT) / path).read_text())


def test_the_command_line_overrides_the_file_and_the_file_counts_as_given(tmp_path):
    recipe = tmp_path / 'r.yaml'
    recipe.write_text('batch_size: 64\nlearning_rate: 0.3\ncosine: true\nlr_decay_epochs: [5, 8]\n'
                      'mean: [0.5, 0.5, 0.5]\n')
    opt = parse_option('supcon', ['--config', str(recipe), '--learning_rate', '0.1'])
    assert (opt.batch_size, opt.learning_rate, opt.cosine, opt.lr_decay_epochs) == (64, 0.1, True, [5, 8])
    assert opt.mean == (0.5, 0.5, 0.5)


@pytest.mark.parametrize('text, words', [
    ('nosuch: 3\n', ('unknown key', 'nosuch')),
    ('batch_size: many\n', ('--batch_size', 'invalid int value', "'many'")),
    ('ckpt: x.pth\n', ('ckpt is a flag of main_linear.py', 'not main_supcon.py')),
    ('cosine: 3\n', ('cosine is an on/off flag',)),
    ('- a\n- b\n', ('a mapping',)),
    ('batch_size: [1\n', ('cannot be read',)),
    ('method: NoSuch\n', ('--method', 'invalid choice')),
])
def test_a_bad_recipe_is_one_line_naming_the_key_and_the_file(tmp_path, text, words):
    recipe = tmp_path / 'bad.yaml'
    recipe.write_text(text)
    assert_one_line_error(run_in_process('main_supcon.py', '--config', recipe, '--save_folder', tmp_path),
                          str(recipe), *words)


def test_a_missing_file_and_another_scripts_run_json_are_one_line(tmp_path):
    assert_one_line_error(run_in_process('main_supcon.py', '--config', tmp_path / 'none.yaml'), 'not found')
    run_json = tmp_path / 'run.json'
    run_json.write_text(json.dumps({'run_name': 'x', 'config': {'script': 'ce', 'batch_size': 64}}))
    assert_one_line_error(run_in_process('main_supcon.py', '--config', run_json, '--save_folder', tmp_path),
                          'run.json of a main_ce.py run')


@pytest.mark.slow
@pytest.mark.parametrize('script, flags', [('main_supcon.py', ['--method', 'KCL', '--kcl_k', 3]),
                                           ('main_ce.py', ['--label_fraction', 0.5, '--warm', '--warm_epochs', 1])],
                         ids=['supcon-kcl', 'ce-fraction-warm'])
def test_a_run_started_again_from_its_run_json_is_the_same_run(tmp_path, script, flags):
    """``--config <run>/run.json --save_folder NEW`` reproduces the run bit for bit on a CPU, and the new
    run's run.json records the file it came from."""
    run_script(script, *FAST, '--epochs', 2, *flags, '--save_folder', tmp_path / 'a')
    first = only_run_folder(tmp_path / 'a')
    run_script(script, '--config', os.path.join(first, 'run.json'), '--save_folder', tmp_path / 'b')
    second = only_run_folder(tmp_path / 'b')
    assert os.path.basename(first) == os.path.basename(second)
    a, b = load(os.path.join(first, 'last.pth')), load(os.path.join(second, 'last.pth'))
    for key, value in a['model'].items():
        assert torch.equal(b['model'][key], value), key
    with open(os.path.join(second, 'run.json')) as f:
        assert json.load(f)['config']['config'] == os.path.join(first, 'run.json')
    if '--kcl_k' in flags:        # the real run.json with another method: its KCL flags were given, so they stay
        assert_one_line_error(run_in_process(script, '--config', os.path.join(first, 'run.json'), '--method', 'SupCon',
                                             '--save_folder', tmp_path / 'c'), '--kcl_k', 'set by --config')
        run_json = os.path.join(first, 'run.json')
        with open(run_json) as f:
            identity = json.load(f)
        identity['given'].remove('kcl_k')         # as if the run had taken KCL's default k
        with open(run_json, 'w') as f:
            json.dump(identity, f)
        opt = parse_option('supcon', ['--config', run_json, '--method', 'SupCon'])
        assert opt.method == 'SupCon' and opt.kcl_k is None


# ---------------------------------------------------------------- files read strictly (docs/USAGE.md, "Recipes")
@pytest.mark.parametrize('case, words', [
    ('folder', ['is a folder']),
    ('empty name', ['--config needs a file name']),
    ('pipe', ['is not a regular file']),
    ('twice', ['--config is given 2 times']),
    ('names a recipe', ['names another recipe', 'other.yaml']),
    ('repeated key', ['the key batch_size is repeated (line 3)']),
    ('repeated key in json', ['the key batch_size is repeated']),
    ('help', ["unknown key 'help'"]),
    ('abbreviated key', ["unknown key 'epoch'"]),
    ('method flag of another method', ['--kcl_k', 'set by --config']),
])
def test_odd_config_input_is_one_line_naming_the_file_and_the_cause(tmp_path, case, words):
    recipe = tmp_path / 'r.yaml'
    texts = {'names a recipe': 'config: other.yaml\n', 'repeated key': 'epochs: 2\nbatch_size: 8\nbatch_size: 16\n',
             'help': 'help: true\n', 'abbreviated key': 'epoch: 5\n', 'method flag of another method': 'kcl_k: 3\n'}
    args = ['--config', recipe]
    if case == 'folder':
        args = ['--config', tmp_path]
    elif case == 'empty name':
        args = ['--config', '']
    elif case == 'pipe':
        os.mkfifo(tmp_path / 'fifo')
        args = ['--config', tmp_path / 'fifo']
    elif case == 'twice':
        recipe.write_text('epochs: 2\n')
        args = ['--config', recipe, '--config', recipe]
    elif case == 'repeated key in json':
        recipe = tmp_path / 'r.json'
        recipe.write_text('{"batch_size": 8, "batch_size": 16}')
        args = ['--config', recipe]
    else:
        recipe.write_text(texts[case])
    proc = run_in_process('main_supcon.py', *args, '--save_folder', tmp_path / 'save')
    assert_one_line_error(proc, *words)
    if case not in ('empty name', 'twice'):
        assert str(args[1]) in proc.stderr            # the file is named


def test_flags_are_taken_by_their_full_names_only(tmp_path):
    """Abbreviations are refused on the command line as in a recipe, and an unknown flag names the nearest ones."""
    assert_one_line_error(run_in_process('main_supcon.py', '--epoch', '-1', '--save_folder', tmp_path),
                          'unknown flag --epoch', 'did you mean --epochs')
    assert_one_line_error(run_in_process('main_supcon.py', '--lr', '0.1', '--save_folder', tmp_path),
                          'unknown flag --lr', '--learning_rate', '--lr_decay_rate')
    assert_one_line_error(run_in_process('main_linear.py', '--temperature', '0.1'), 'unknown flag --temperature')
    assert_one_line_error(run_in_process('compare.py', 'x', '--base', 'y'), 'unknown flag --base', '--baseline')


# ---------------------------------------------------------------- run.json replays the flags given, not derived ones
def write_run_json(path, opt):
    """run.json as engine.prepare_run_folder writes it for ``opt``."""
    from engine.run import run_identity
    path.write_text(json.dumps(run_identity(opt)))
    return path


def fake_stage1_checkpoint(path, *flags):
    """A checkpoint whose configuration is a main_supcon.py run's (what main_linear.py adopts from --ckpt)."""
    from config.resume import config_dict
    torch.save({'model': {}, 'config': config_dict(parse_option('supcon', list(map(str, flags))))}, path)
    return str(path)


def without_files(config):
    return {k: v for k, v in config.items() if k != 'config'}


@pytest.mark.parametrize('script, flags, override, changed', [
    ('supcon', ['--size', '16'], ['--size', '128'], {'stem': 'imagenet'}),                  # size -> stem
    ('supcon', ['--method', 'KCL'], ['--method', 'SupCon'], {'kcl_k': None}),              # method -> its own flags
    ('supcon', ['--batch_size', '1024'], ['--batch_size', '128'], {'warm': False}),         # batch -> warm-up
    ('ce', ['--dataset', 'digits'], ['--dataset', 'cifar10'], {'size': 32, 'model': 'resnet50'}),    # dataset
    ('linear', ['--finetune', '--learning_rate', '0.1'], ['--learning_rate', '1'], {'encoder_lr': 0.1}),   # lr
    ('linear', ['--shots', '5'], ['--seed', '3'], {}),
    ('supcon', ['--stem', 'cifar', '--size', '16'], ['--size', '128'], {'stem': 'cifar'}),  # a given stem stays
])
def test_config_run_json_with_an_override_is_the_command_line_with_it(tmp_path, script, flags, override, changed):
    """``--config <run>/run.json --X v`` gives the run.json of the original command line plus ``--X v``: the derived
    values are worked out again (a stem from the size, the encoder's learning rate, a method's defaults, the
    warm-up from the batch, the size and model from the dataset)."""
    from engine.run import run_identity
    if script == 'linear':
        flags = ['--ckpt', fake_stage1_checkpoint(tmp_path / 'stage1.pth', '--epochs', 1), *flags]
    save = ['--save_folder', str(tmp_path / 'save')]       # where a run goes is not replayed (recipe.RUN_ONLY)
    flags = [*flags, *save]
    run_json = write_run_json(tmp_path / 'run.json', parse_option(script, flags))
    replayed = run_identity(parse_option(script, ['--config', str(run_json), *save, *override]))
    direct = run_identity(parse_option(script, [*flags, *override]))
    assert without_files(replayed['config']) == without_files(direct['config'])
    assert set(replayed['given']) - {'config'} == set(direct['given'])
    assert replayed['run_name'] == direct['run_name']
    for key, value in changed.items():
        assert direct['config'][key] == value, key


def test_an_older_run_json_replays_derived_values_and_says_so(tmp_path, capsys):
    """A run.json without the record (written before it existed) replays every value that differs from the defaults,
    derived ones included, with one line saying so."""
    opt = parse_option('supcon', ['--size', '16', '--save_folder', str(tmp_path)])
    identity = json.loads(write_run_json(tmp_path / 'run.json', opt).read_text())
    del identity['given']
    (tmp_path / 'run.json').write_text(json.dumps(identity))
    capsys.readouterr()
    again = parse_option('supcon', ['--config', str(tmp_path / 'run.json'), '--size', '128'])
    assert again.stem == 'cifar'                   # replayed as given
    err = capsys.readouterr().err
    assert 'written before run.json recorded the flags given' in err and len(err.strip().splitlines()) == 1
