"""What a resume may change, and a run's configuration as plain values: the rules that ``--resume``, a run folder's
run.json and a sweep's finished cells are checked by (docs/USAGE.md, "Run folders, resume")."""
from config.options import FEATURES

# What may differ when a run is resumed: flags that do not change what is learned (a longer --epochs is how a
# run is extended), the features' own (``Feature.resume_may_change``: e.g. --amp, --channels_last and
# --chunk_size change precision, memory layout and memory use, not the experiment), and fields that describe
# this process rather than the experiment.
RESUME_MAY_CHANGE = {'config', 'epochs', 'print_freq', 'save_freq', 'num_workers', 'device', 'data_folder',
                     'save_folder', 'resume', 'trial', 'script', 'run_folder', 'run_name', 'world_size', 'rank',
                     'local_batch_size', *(name for feature in FEATURES for name in feature.resume_may_change)}


def resume_conflicts(saved_config, config, holder='the checkpoint'):
    """``['--flag: the checkpoint has A, now B', ...]`` for the experiment-defining flags where the
    checkpoint's (``holder``'s) configuration and this command line's (``config``: :func:`config_dict`) differ (keys
    missing on either side are skipped)."""
    return [f'--{key}: {holder} has {saved_config[key]!r}, now {config[key]!r}'
            for key in sorted(set(config) & set(saved_config) - RESUME_MAY_CHANGE) if saved_config[key] != config[key]]


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
