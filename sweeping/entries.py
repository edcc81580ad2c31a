"""A sweep file's entries as command lines and folder names: the one-line error of a bad entry (:class:`SweepError`),
a label as a folder name, a flag mapping as a script's command-line tokens (checked by the script's own parser).
Below ``plan.py`` and ``tuning/spec.py``, which both read entries."""
import re

from config.recipe import tokens
from core.flags import UserError, nearest_flags

SCRIPTS = {'main_supcon.py': 'supcon', 'main_ce.py': 'ce', 'main_linear.py': 'linear'}


class SweepError(UserError):
    """Bad input in a sweep file: one line naming the file and the entry."""


def folder_part(text):
    """A label as a folder name: no slash, no space."""
    return re.sub(r'[/\s]+', '_', str(text)).replace('..', '_')


def axes_folder(chosen):
    """The folder level of a combination of the grid's values (``['setting=plain']``; none without a grid)."""
    return [','.join(f'{folder_part(k)}={folder_part(v)}' for k, v in chosen.items())] if chosen else []


def mapping(value, where):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SweepError(f'{where} must be a mapping (key: value), not a {type(value).__name__}: {value!r}')
    return value


def parser_of(script):
    """``script``'s parser (a file name), built once per process (``config.options.parser_of``)."""
    from config.options import parser_of
    return parser_of(SCRIPTS[script])


def argv_of(script, flags, where, only_known=()):
    """The command-line tokens of ``flags`` for ``script``'s parser. A key the parser does not have is one line
    naming it and the nearest flags, except the keys of ``only_known`` (``base:``'s), which a script without them
    leaves out."""
    actions = {a.dest: a for a in parser_of(script)._actions if a.option_strings and a.dest != 'help'}
    argv = []
    for key, value in flags.items():
        dest = str(key).replace('-', '_')
        if dest not in actions:
            if key in only_known:
                continue
            near = nearest_flags(dest, list(actions))
            raise SweepError(f'{where}: {key} is not a flag of {script}' + (
                f' (did you mean {", ".join(n.lstrip("-") for n in near)}?)' if near else ''))
        if dest in ('save_folder', 'resume', 'ckpt'):
            raise SweepError(f'{where}: {key} is set by the sweep (each cell has its own folder)')
        if value is None:
            continue
        try:
            argv += tokens(actions[dest], value, key, where.split(':')[0])
        except UserError as e:
            raise SweepError(f'{where}: {str(e).split(": ", 1)[-1]}') from None
    return argv


def with_placeholders(script, argv, names):
    """``argv`` (``script``'s tokens) with the value of each flag of ``names`` (``{flag: placeholder}``) replaced by
    its placeholder, added where ``argv`` leaves the flag at its default: the command of a run whose values a study
    has still to choose (``sweep.py --dry-run``)."""
    actions = {a.dest: a for a in parser_of(script)._actions if a.option_strings and a.dest != 'help'}
    out = list(argv)
    for key, placeholder in names.items():
        action = actions.get(str(key).replace('-', '_'))
        if action is None:
            continue
        at = next((i for i, t in enumerate(out) if t in action.option_strings), None)
        if at is None:
            out += [action.option_strings[0], placeholder]
        elif action.nargs == 0:         # an on/off flag given as present: its place holds the choice
            out[at] = f'{action.option_strings[0]}={placeholder}'
        else:
            out[at + 1] = placeholder
    return out
