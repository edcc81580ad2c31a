"""runtime/run_folder.py: run names fitted to a file name (the rest of a run folder's life, its lock, its writability
and what an interrupt says, runs through the real scripts in tests/engine/test_engine.py)."""


def test_fit_name_keeps_names_within_the_file_system_limit():
    from runtime.run_folder import fit_name
    assert fit_name('short') == 'short'
    long_a, long_b = 'a' * 300, 'a' * 299 + 'b'
    assert len(fit_name(long_a).encode()) == 255 and fit_name(long_a) == fit_name('a' * 300)
    assert fit_name(long_a) != fit_name(long_b) and fit_name(long_a).startswith('a' * 200)
    assert len(fit_name('é' * 200).encode()) <= 255         # never half a character


