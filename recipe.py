"""``--config FILE``: flags from a file. A YAML recipe (``configs/``) or a run's own ``run.json`` whose keys are flag
names (``batch_size: 1024``, ``cosine: true``, ``lr_decay_epochs: [700, 800, 900]``) sets those flags; flags on the
command line come after it and override it. An unknown key, a key of another script or a value of the wrong type is
one line naming the key and the file.

A ``run.json`` (``engine.prepare_run_folder`` writes one into every run folder) holds every option of its run; what
describes one process or is derived from other flags (the run folder, the device, the torchrun rank, ...) and the
options at their defaults are not taken from it, so ``--config <run>/run.json --save_folder NEW`` starts the same
experiment in a new folder (bit for bit on a CPU: ``tests/test_recipe.py``).
"""
import argparse
import json
import os

from flags import UserError

# options in a run.json that are not the experiment's flags: derived from others, or about this process and machine
RUN_ONLY = {'script', 'run_name', 'run_folder', 'world_size', 'rank', 'local_batch_size', 'warmup_from', 'device',
            'resume', 'save_folder', 'config'}


def config_path(argv):
    """The ``--config`` value on the command line ``argv``, or ``None``."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument('--config', default=None)
    return p.parse_known_args(argv)[0].config


def read_config(path):
    """``(mapping, from_run)``: a YAML file's mapping, or a run.json's ``config`` (``from_run``)."""
    if not os.path.isfile(path):
        raise UserError(f'--config {path} not found')
    try:
        with open(path) as f:
            text = f.read()
        if path.endswith('.json'):
            data = json.loads(text)
        else:
            import yaml
            data = yaml.safe_load(text)
    except Exception as e:             # unreadable, not JSON, not YAML
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f'--config {path} cannot be read ({reason})') from None
    from_run = isinstance(data, dict) and isinstance(data.get('config'), dict) and 'run_name' in data
    data = data['config'] if from_run else ({} if data is None else data)
    if not isinstance(data, dict):
        raise UserError(f'--config {path} must hold "flag: value" lines (a mapping), not a {type(data).__name__}')
    return data, from_run


def tokens(action, value, key, path):
    """The command-line tokens of one ``key: value`` for the parser's ``action``."""
    flag = action.option_strings[0]
    if action.nargs == 0:                              # store_true
        if not isinstance(value, bool):
            raise UserError(f'--config {path}: {key} is an on/off flag: true or false, not {value!r}')
        return [flag] if value else []
    if isinstance(value, dict) or isinstance(value, bool):
        raise UserError(f'--config {path}: {key} takes a {getattr(action.type, "__name__", "value")}, not '
                        f'{value!r}')
    text = ','.join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return [flag, text]


def config_argv(path, script, parser, field_defaults, flags_of_scripts):
    """The command-line tokens that ``--config path`` stands for in ``script``'s ``parser`` (a fresh one: its
    ``error`` is replaced). ``field_defaults``: every option's default (``options.FIELD_DEFAULTS``);
    ``flags_of_scripts``: ``{script: its flags' destinations}``."""
    data, from_run = read_config(path)
    if from_run and data.get('script') not in (None, script):
        raise UserError(f'--config {path} is the run.json of a main_{data["script"]}.py run, not main_{script}.py')
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != 'help'}
    defaults = vars(parser.parse_args([]))
    argv = []
    for key, value in data.items():
        dest = str(key).lstrip('-').replace('-', '_')
        if from_run and dest in RUN_ONLY:
            continue                                    # derived, or about the process that ran it
        if dest not in actions:
            if from_run and value == field_defaults.get(dest, value):
                continue                                # another script's option, at its default
            owners = [s for s, dests in flags_of_scripts.items() if dest in dests]
            raise UserError(f'--config {path}: {key} is a flag of main_{owners[0]}.py, not main_{script}.py' if owners
                            else f'--config {path}: unknown key {key!r} (the keys are flag names, e.g. batch_size)')
        if value is None or value == defaults.get(dest):
            continue                                    # at this script's default: not "given"
        argv += tokens(actions[dest], value, key, path)

    def error(message):
        raise UserError(f'--config {path}: {message}')
    parser.error = error                                # the values' types, named by the file
    parser.parse_args(argv)
    return argv
