"""Configuration: the options the three scripts run with.

- ``options.py``: the three parsers (core flags, the methods' and the features' flags), validation, run names;
  ``parse_option`` is the one way to make options;
- ``recipe.py``: ``--config FILE`` (a YAML recipe or a run's run.json as flags);
- ``encoder_options.py``: the encoder's flags and what main_linear.py takes from its stage-1 checkpoint;
- ``resume.py``: what a resume may change, and a run's configuration as plain values;
- ``cli.py``: the command line's run-time side (one-line errors, interrupts);
- ``flag_table.py``: docs/USAGE.md's flag table from the parsers (``python config/flag_table.py``).
"""
