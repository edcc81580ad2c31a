"""Flag declarations: what a feature adds to the command line, next to the code that reads it, and the one
error type of bad input (:class:`UserError`).

A :class:`Feature` (CARROT, the memory queue, gradient caching, the kNN monitor, long-tail and coarse labels,
label noise, the learning-rate schedule, AMP/channels-last, device augmentation, few-shot probes) names its
flags with their real defaults and help lines, the scripts that have them, its checks, its part of the run
folder's name and which of its flags may change on ``--resume``. ``config/options.py`` collects the features (as
``methods.py`` collects methods) into the parsers, the validation, the run name and the resume rules; see
docs/DEVELOPING.md, "Adding a flag".

A hook (a feature's ``check`` and ``run_name``, a method's ``build``, ``check`` and ``run_name``) names what it
reads as its parameters: ``options`` calls it through :func:`call_hook`, which passes each option field of that
name (and the context, such as ``script`` or ``given``). A hook that fills fields returns them as a dict.

Each feature is declared in the module whose code reads its flags, e.g.::

    QUEUE = Feature('memory queue (docs/QUEUE.md)', scripts=('supcon',),
                    flags={'--queue_size': dict(type=int, default=0, help='...')},
                    check=_check_queue, run_name=lambda queue_size: f'_queue_{queue_size}' if queue_size else '')
"""
import argparse
import difflib
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

SCRIPTS = ('supcon', 'ce', 'linear')


class UserError(Exception):
    """Bad input from the user: reported as one line on stderr with exit status 2 (``cli.run_cli``)."""
# keys of a flag declaration that are ours, not argparse's
OWN_KEYS = ('scripts', 'infinite_ok', 'absent')


@dataclass(frozen=True)
class Feature:
    """One feature's command-line declaration.

    Attributes:
        name: the ``--help`` group title.
        flags: ``{'--flag': argparse keywords}``: ``default`` is the real default (shown by ``--help``) and
            every flag has a ``help`` line. Three keys of ours: ``scripts`` (a flag only some of the feature's
            scripts have), ``infinite_ok`` (a float flag that accepts ``inf``; every other float must be
            finite) and ``absent`` (the value a script without the flag reads, when it is not the default: a
            default changed for the scripts that have the flag leaves the others' records as they were).
        scripts: the scripts that have the feature.
        check: a hook (:func:`call_hook`) run after parsing: raise :class:`UserError` with one line for a bad
            value or combination. Besides option fields it may take ``script``, ``given`` (the flags'
            destinations given on the command line) and ``method_entry`` (the ``methods.Method`` of
            ``main_supcon.py``, else ``None``). It may return ``{field: value}`` for fields that depend on
            other flags (the schedule's warm-up above batch 256).
        run_name: a hook returning the feature's suffix of the run folder's name (``''`` when off).
        resume_may_change: destinations of its flags that may differ when a run is resumed.
        where_it_ran: destinations of its flags that say where a run ran, not what it learned (a device path, a
            tracker): a finished run recorded with other values is the same run, and a resume may change them
            (``config/resume.py``).
    """
    name: str
    flags: dict[str, dict[str, Any]]
    scripts: tuple[str, ...] = SCRIPTS
    check: Optional[Callable] = None
    run_name: Optional[Callable] = None
    resume_may_change: tuple[str, ...] = field(default_factory=tuple)
    where_it_ran: tuple[str, ...] = field(default_factory=tuple)

    def flags_of(self, script: str) -> dict[str, dict[str, Any]]:
        """``{'--flag': argparse keywords}`` of the flags ``script`` has (our keys removed)."""
        if script not in self.scripts:
            return {}
        return {flag: {k: v for k, v in kw.items() if k not in OWN_KEYS} for flag, kw in self.flags.items()
                if script in kw.get('scripts', self.scripts)}

    def absent(self) -> dict[str, Any]:
        """``{dest: value}`` of the flags whose ``absent`` value differs from their default."""
        return {dest(flag): kw['absent'] for flag, kw in self.flags.items() if 'absent' in kw}


def dest(flag: str) -> str:
    return flag.lstrip('-').replace('-', '_')


def check(condition: Any, message: str) -> None:
    """Raise :class:`UserError` (one line, exit 2) with ``message`` unless ``condition``."""
    if not condition:
        raise UserError(message)


TEMPERATURE_RANGE = (1e-4, 1e4)


def check_temperature(flag: str, value: float) -> None:
    """A temperature divides similarities in float32 (float16 under ``--amp fp16``): outside
    ``TEMPERATURE_RANGE`` the quotient overflows or every weight falls on one pair. One line otherwise."""
    low, high = TEMPERATURE_RANGE
    check(low <= value <= high, f'{flag} must be in [{low:g}, {high:g}] (a temperature: similarities / {flag} '
                                f'overflow outside it), got {value}')


def call_hook(hook: Callable, opt, **context):
    """``hook(...)`` with the arguments it names: ``context``'s entries, else the option fields of those names."""
    names = inspect.signature(hook).parameters
    return hook(**{name: context[name] if name in context else getattr(opt, name) for name in names})


# ---------------------------------------------------------------- argument types shared by the declarations
_NUMBER = r'[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?'


def floats(text):
    """Parse '(0.4914, 0.4822, 0.4465)', '0.5,0.5,0.5' or '0.5' into a tuple of 3 floats (never eval)."""
    values = re.findall(_NUMBER, text)
    leftover = re.sub(_NUMBER + r'|[\s,()\[\]]', '', text)
    if leftover or len(values) not in (1, 3):
        raise argparse.ArgumentTypeError(f'expected 1 or 3 numbers such as "(0.5, 0.5, 0.5)", got {text!r}')
    values = tuple(float(v) for v in values)
    return values * 3 if len(values) == 1 else values


def epoch_list(text):
    """Parse '700,800,900' into ``[700, 800, 900]`` (epochs >= 1)."""
    try:
        epochs = [int(x) for x in text.split(',') if x.strip()]
    except ValueError:
        epochs = [0]
    if not all(e >= 1 for e in epochs):
        raise argparse.ArgumentTypeError(f'expected comma-separated epochs >= 1 such as 700,800,900, got {text!r}')
    return epochs


# ---------------------------------------------------------------- the parsers (config/options.py, analyze.py)
class Parser(argparse.ArgumentParser):
    """argparse that takes flags by their full names only (no abbreviations: ``--epoch`` is not ``--epochs``, in a
    recipe or on the command line alike) and reports a bad flag as one line (no usage block) with exit status 2; an
    unknown flag names the nearest ones (:func:`nearest_flags`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault('allow_abbrev', False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        unknown = re.match(r'unrecognized arguments: (.*)', message)
        token = next((t for t in unknown.group(1).split() if t.startswith('-')), None) if unknown else None
        if token is not None:
            flags = [s for a in self._actions for s in a.option_strings if s.startswith('--')]
            message = unknown_flag(token, flags)
        self.exit(2, f'{self.prog}: error: {message}\n')


def nearest_flags(token, flags, n=4):
    """The flags of ``flags`` nearest to the unknown ``token`` (``--lr``): the ones whose word initials it spells
    (``--learning_rate``), the ones it begins (``--lr_decay_rate``) or that begin it (``--temp``), then the closest
    spellings (``difflib``)."""
    name = token.lstrip('-').split('=')[0].replace('-', '_')
    names = [f.lstrip('-') for f in flags]
    found = [f for f in names if len(name) > 1 and ''.join(w[0] for w in f.split('_') if w) == name]
    found += [f for f in names if name and f.startswith(name)]
    found += [f for f in names if len(f) > 2 and name.startswith(f)]          # --temperature: --temp
    found += difflib.get_close_matches(name, names, n=n, cutoff=0.6)
    return ['--' + f for f in dict.fromkeys(found)][:n]


def unknown_flag(token, flags):
    """The one line for an unknown ``token``, naming the nearest of ``flags``."""
    near = nearest_flags(token, flags)
    shown = token.split('=')[0]
    if not near:
        return f'unknown flag {shown} (see --help)'
    options = near[0] if len(near) == 1 else ', '.join(near[:-1]) + ' or ' + near[-1]
    return f'unknown flag {shown} (flags are taken by their full names); did you mean {options}?'


class HelpFormatter(argparse.HelpFormatter):
    """Every help line ends with its default, unless the default is off (``None``, ``False``, ``''``)."""

    def _get_help_string(self, action):
        text = action.help or ''
        off = action.default is None or action.default is False or action.default in ('', argparse.SUPPRESS)
        if not off and '(default' not in text:
            text += ' (default: %(default)s)'
        return text
