"""The documentation speaks of the project only: its users, its code, its results. No section named after a tracker's
issue number, and nothing about how the work on it is organised or how machines are lent to it."""
import pathlib
import re

from helpers import ROOT

DOCS = [*pathlib.Path(ROOT).glob('*.md'), *pathlib.Path(ROOT, 'docs').glob('*.md'),
        *pathlib.Path(ROOT, 'scripts').glob('*.sh'), *pathlib.Path(ROOT, 'configs').glob('*.yaml'),
        *pathlib.Path(ROOT, 'sweeps').glob('*.yaml'), pathlib.Path(ROOT, 'requirements.txt')]
# what must not come back (case-insensitive); SupContrast's own GitHub issues ("issues #6") are the project's sources
FORBIDDEN = [r'\bissues? \d', r'\bissues? "', r'\(issues?\b', r'\blent\b', r'\bsessions?\b', r'device (tool|time)',
             r'can_start_another', r'drawn for a machine', r'\bration(ed|ing)?\b']


def offending(text):
    return [(pattern, m.group(0)) for pattern in FORBIDDEN for m in re.finditer(pattern, text, flags=re.I)]


def test_the_docs_speak_of_the_project_only():
    found = {str(p.relative_to(ROOT)): hits for p in DOCS if (hits := offending(p.read_text()))}
    assert not found, found


def test_power_the_check_finds_what_it_forbids():
    for text in ('## Issue 41: torchrun', 'measured in issue 50', 'when a GPU is lent', 'in the next session',
                 'the device tool said', '(issue "the field")'):
        assert offending(text), text
    assert not offending('SupContrast issues #6, #103, #136 asked for one stage')
