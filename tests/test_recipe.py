"""recipe.py (``--config FILE``): flags from a YAML recipe or a run's run.json, the command line overriding them,
one-line errors naming the key; every file of configs/ through the parser; a run started again from its run.json
into a new folder is bit for bit the same run (CPU)."""
import json
import os
import pathlib

import pytest
import torch

from helpers import FAST, ROOT, assert_one_line_error, load, only_run_folder, run_in_process, run_script
from options import parse_option

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
        assert getattr(opt, key) == value or key == 'dataset' and opt.dataset == value, key
    assert opt.config == str(path)


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
    """Issue 50: ``--config <run>/run.json --save_folder NEW`` reproduces the run bit for bit on a CPU, and the new
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
