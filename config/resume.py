"""What a resume may change, and a run's configuration as plain values: the rules that ``--resume``, a run folder's
run.json and a sweep's finished cells are checked by (docs/USAGE.md, "Run folders, resume")."""
from config.options import FEATURES

# Where a run ran, not what it learned: its paths, its recipe file, its device (run.json records the one --device auto
# resolved to), the process's share of a torchrun batch and the data workers a machine's cores allow, and what each
# feature declares (``Feature.where_it_ran``: the speed path --augment, --amp and --channels_last, whose auto values
# depend on the device; the trackers). A finished run recorded with other values of these is still the same run (a
# sweep's finished stage is held to every other flag, --epochs included).
WHERE_IT_RAN = {'config', 'save_folder', 'resume', 'run_folder', 'data_folder', 'num_workers', 'world_size', 'rank',
                'local_batch_size', 'device', *(name for feature in FEATURES for name in feature.where_it_ran)}
# What may differ when a run is resumed: besides where it runs, flags that do not change what is learned (a longer
# --epochs is how a run is extended), the features' own (``Feature.resume_may_change``: e.g. --amp, --channels_last
# and --chunk_size change precision, memory layout and memory use, not the experiment), and fields that describe
# this process rather than the experiment.
RESUME_MAY_CHANGE = {*WHERE_IT_RAN, 'epochs', 'print_freq', 'save_freq', 'trial', 'script', 'run_name',
                     *(name for feature in FEATURES for name in feature.resume_may_change)}


def resume_conflicts(saved_config, config, holder='the checkpoint', may_change=RESUME_MAY_CHANGE):
    """``['--flag: the checkpoint has A, now B', ...]`` for the flags outside ``may_change`` where the
    checkpoint's (``holder``'s) configuration and this command line's (``config``: :func:`config_dict`) differ (keys
    missing on either side are skipped)."""
    return [f'--{key}: {holder} has {saved_config[key]!r}, now {config[key]!r}'
            for key in sorted(set(config) & set(saved_config) - set(may_change)) if saved_config[key] != config[key]]


def config_dict(opt):
    """The options as a plain dict of str/int/float/bool/list (safe for ``weights_only`` loading); the record of the
    flags given is run.json's (``engine.run.run_identity``), not an option."""
    out = {}
    for key, value in vars(opt).items():
        if key == 'given_flags':
            continue
        if isinstance(value, tuple):
            value = list(value)
        if isinstance(value, (str, int, float, bool, list)) or value is None:
            out[key] = value
        else:
            out[key] = str(value)
    return out
