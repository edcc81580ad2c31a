"""tests/conftest.py's groups: under pytest-xdist's ``--dist loadgroup`` a test with an ``xdist_group`` mark carries
``@<group>`` in its id on the worker, which is what the scheduler sends to one worker (a shared run trained once,
one SLURM cluster). Under pytest 9.2 the id no longer changes (pytest-dev/pytest-xdist#1386) and the groups are spread
over the workers without a word: this test says so instead (requirements.txt keeps pytest below 9.2)."""
import os

import pytest


@pytest.mark.skipif('PYTEST_XDIST_WORKER' not in os.environ, reason='a pytest-xdist worker only')
def test_the_xdist_groups_hold(request):
    if not getattr(request.config.option, 'loadgroup', False):
        pytest.skip('not --dist loadgroup')
    grouped = [item for item in request.session.items if item.get_closest_marker('xdist_group')]
    lost = [item.nodeid for item in grouped if '@' not in item.nodeid]
    import _pytest
    assert not lost, (f'pytest-xdist does not group the xdist_group tests under pytest {_pytest.__version__} '
                      f'({len(lost)} of {len(grouped)}, e.g. {lost[0]}): pip install -r requirements.txt (pytest<9.2)')
