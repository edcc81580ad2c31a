"""flag_table.py: docs/USAGE.md's flag table is the three parsers' (every flag, the scripts that have it, its default
per script, its help line), and a stale table fails the suite naming the command that refreshes it."""
from config import flag_table
from helpers import run_script


def test_the_usage_flag_table_is_the_parsers():
    with open(flag_table.USAGE) as f:
        table = flag_table.current(f.read())
    assert table is not None, 'docs/USAGE.md lost its flag table markers'
    assert table == flag_table.markdown(), \
        f'docs/USAGE.md\'s flag table is stale (a flag, default or help line changed): run {flag_table.COMMAND}'


def test_every_flag_of_every_script_is_in_it_with_its_default():
    from config.options import build_parser
    rows = {flag: entry for group in flag_table.rows().values() for flag, entry in group.items()}
    for script in ('supcon', 'ce', 'linear'):
        for action in build_parser(script)._actions:
            if action.option_strings and action.dest != 'help':
                assert script in rows[action.option_strings[0]]['scripts']
    assert rows['--epochs']['defaults'] == {'supcon': '1000', 'ce': '500', 'linear': '100'}
    assert rows['--kcl_k']['defaults'] == {'supcon': '6'}                # a method's flag: its default when chosen
    assert '| `--epochs` | all | 1000 / 500 / 100 |' in flag_table.markdown()


def test_check_names_the_command_when_the_file_is_stale(tmp_path):
    """Power: a stale copy of USAGE.md (one help line changed) fails --check, naming the command; writing fixes it."""
    with open(flag_table.USAGE) as f:
        text = f.read()
    stale = tmp_path / 'USAGE.md'
    stale.write_text(text.replace('| id for recording multiple runs |', '| an old help line |'))
    check = run_script('config/flag_table.py', '--check', '--file', stale, check=False)
    assert check.returncode == 1 and 'run python config/flag_table.py' in check.stderr
    run_script('config/flag_table.py', '--file', stale)
    assert stale.read_text() == text
