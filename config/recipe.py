"""``--config FILE``: flags from a file. A YAML recipe (``configs/``) or a run's own ``run.json`` whose keys are flag
names (``batch_size: 1024``, ``cosine: true``, ``lr_decay_epochs: [700, 800, 900]``) sets those flags; flags on the
command line come after it and override it. Files are read strictly (docs/USAGE.md, "Recipes"): an unknown key, a key
of another script, a repeated key, a value of the wrong type, a recipe naming another recipe, a folder, a pipe, an
empty name or a second ``--config`` is one line naming the file and the cause.

A ``run.json`` (``engine.prepare_run_folder`` writes one into every run folder) holds every option of its run and,
under ``given``, the flags its command line (or recipe) gave. Only those are taken from it: every other value was
worked out from them (a stem from the size, an encoder learning rate from the learning rate, a method's defaults), and
is worked out again, so ``--config <run>/run.json --size 128`` is the run's own command line plus ``--size 128``, and
``--config <run>/run.json --save_folder NEW`` the same experiment in a new folder (bit for bit on a CPU:
``tests/config/test_recipe.py``). A run.json written before the record existed replays every value that differs from the
parser's default, derived ones included, and says so in one line.
"""
import argparse
import json
import os
import stat
import sys

from core.flags import UserError
from runtime.run_folder import RUN_IDENTITY

# options in a run.json that are not the experiment's flags: derived from others, or about this process and machine
RUN_ONLY = {'script', 'run_name', 'run_folder', 'world_size', 'rank', 'local_batch_size', 'warmup_from', 'device',
            'resume', 'save_folder', 'config'}
NOT_KEYS = {'help'}          # flags of the parsers that a file cannot set


def config_path(argv):
    """The ``--config`` value on the command line ``argv``, or ``None``; one line for an empty name or a second
    ``--config`` (one file per run: the command line overrides it)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument('--config', action='append', default=None)
    paths = p.parse_known_args(argv)[0].config
    if not paths:
        return None
    if len(paths) > 1:
        raise UserError(f'--config is given {len(paths)} times ({", ".join(paths)}): give one file; flags on the '
                        'command line override it')
    if not paths[0].strip():
        raise UserError('--config needs a file name (a YAML recipe or a run\'s run.json), got an empty one')
    return paths[0]


def recipe_of(argv):
    """``(file, how messages name it)`` of the flags the command line ``argv`` starts from: its ``--config`` file, or
    without one the ``run.json`` beside ``--resume``'s checkpoint (a resumed run continues with the flags it was
    started with; the command line's flags come after them, and the resume rules refuse those that contradict the
    checkpoint); ``(None, None)`` otherwise, also for a checkpoint without a run.json beside it."""
    config = config_path(argv)
    if config:
        return config, f'--config {config}'
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument('--resume', default='')
    resume = p.parse_known_args(argv)[0].resume
    folder = resume if os.path.isdir(resume) else os.path.dirname(resume)
    record = os.path.join(folder, RUN_IDENTITY)
    if resume and os.path.isfile(record):
        return record, f'the run\'s {record}'
    return None, None


def load_yaml(text):
    """The YAML document ``text`` (``yaml.safe_load``), but a key repeated in one mapping is a :class:`UserError`
    naming it and its line (PyYAML keeps the last one silently). Recipes and sweep files are read with it."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == 'tag:yaml.org,2002:merge':       # <<: *anchor (its keys may be overridden)
                    continue
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise UserError(f'the key {key} is repeated (line {key_node.start_mark.line + 1})')
                seen.add(key)
            return super().construct_mapping(node, deep)
    return yaml.load(text, Loader=UniqueKeys)


def _unique_json_object(pairs):
    keys = [k for k, _ in pairs]
    repeated = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if repeated is not None:
        raise UserError(f'the key {repeated} is repeated')
    return dict(pairs)


def read_config(path):
    """``(mapping, given)``: a YAML recipe's mapping (``given`` ``None``), or a run.json's ``config`` and its record of
    the flags given (``given``: a set; ``False`` for a run.json written before the record existed)."""
    if os.path.isdir(path):
        raise UserError(f'--config {path} is a folder: give a YAML recipe or a run\'s run.json')
    if not os.path.exists(path):
        raise UserError(f'--config {path} not found')
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise UserError(f'--config {path} is not a regular file (a pipe or a device): write the recipe to a file, '
                        'which the run\'s run.json then names')
    try:
        with open(path) as f:
            text = f.read()
        if path.endswith('.json'):
            data = json.loads(text, object_pairs_hook=_unique_json_object)
        else:
            data = load_yaml(text)
    except UserError as e:
        raise UserError(f'--config {path}: {e}') from None
    except Exception as e:             # unreadable, not JSON, not YAML
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f'--config {path} cannot be read ({reason})') from None
    from_run = isinstance(data, dict) and isinstance(data.get('config'), dict) and 'run_name' in data
    given = None
    if from_run:
        given = set(data['given']) if isinstance(data.get('given'), list) else False
        data = data['config']
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise UserError(f'--config {path} must hold "flag: value" lines (a mapping), not a {type(data).__name__}')
    if not from_run and 'config' in data:
        raise UserError(f'--config {path} names another recipe (config: {data["config"]}): a recipe cannot include '
                        'one; give one file')
    return data, given


def tokens(action, value, key, path):
    """The command-line tokens of one ``key: value`` for the parser's ``action``."""
    flag = action.option_strings[0]
    if action.nargs == 0:                              # store_true
        if not isinstance(value, bool):
            raise UserError(f'--config {path}: {key} is an on/off flag: true or false, not {value!r}')
        return [flag] if value else []
    if action.nargs == '?' and isinstance(value, bool):   # on/off/auto (--channels_last): true or false
        return [flag, 'on' if value else 'off']
    if isinstance(value, dict) or isinstance(value, bool):
        raise UserError(f'--config {path}: {key} takes a {getattr(action.type, "__name__", "value")}, not '
                        f'{value!r}')
    text = ','.join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return [flag, text]


def config_argv(path, script, parser, field_defaults, flags_of_scripts):
    """The command-line tokens that ``--config path`` stands for in ``script``'s ``parser`` (a fresh one: its
    ``error`` is replaced). ``field_defaults``: every option's default (``options.FIELD_DEFAULTS``);
    ``flags_of_scripts``: ``{script: its flags' destinations}``."""
    data, given = read_config(path)
    from_run = given is not None
    if from_run and data.get('script') not in (None, script):
        raise UserError(f'--config {path} is the run.json of a main_{data["script"]}.py run, not main_{script}.py')
    if not from_run and 'script' in data:           # a recipe names its script
        named = data.pop('script')
        if named != f'main_{script}.py':
            raise UserError(f'--config {path} is a recipe for {named}, not main_{script}.py: run python {named} '
                            f'--config {path}')
    if given is False:
        print(f'note: --config {path} was written before run.json recorded the flags given: every value that differs '
              'from the defaults is replayed as if given, the derived ones included', file=sys.stderr)
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in NOT_KEYS}
    defaults = vars(parser.parse_args([]))
    argv = []
    for key, value in data.items():
        dest = str(key).lstrip('-').replace('-', '_')
        if from_run and (dest in RUN_ONLY or (given is not False and dest not in given)):
            continue                                    # derived, or about the process that ran it
        if dest not in actions:
            if from_run and value == field_defaults.get(dest, value):
                continue                                # another script's option, at its default
            owners = [s for s, dests in flags_of_scripts.items() if dest in dests and dest not in NOT_KEYS]
            raise UserError(f'--config {path}: {key} is a flag of main_{owners[0]}.py, not main_{script}.py' if owners
                            else f'--config {path}: unknown key {key!r} (the keys are flag names, e.g. batch_size)')
        if value is None or (value == defaults.get(dest) and not (given and dest in given)):
            continue                                    # at this script's default: not "given"
        argv += tokens(actions[dest], value, key, path)

    def error(message):
        raise UserError(f'--config {path}: {message}')
    parser.error = error                                # the values' types, named by the file
    parser.parse_args(argv)
    return argv
