"""config/resume.py: what a resume may change and what "where it ran" holds, from the features' own declarations."""
from config.resume import RESUME_MAY_CHANGE, WHERE_IT_RAN, resume_conflicts


def test_where_it_ran_is_the_core_set_and_what_each_feature_declares():
    """The set the rules held when they named every flag by hand: the speed path (--augment, --amp, --channels_last:
    their auto values depend on the device) and the trackers now come from their features' ``where_it_ran``."""
    assert WHERE_IT_RAN == {'config', 'save_folder', 'resume', 'run_folder', 'data_folder', 'num_workers',
                            'world_size', 'rank', 'local_batch_size', 'device', 'augment', 'amp', 'channels_last',
                            'tracker', 'tracker_project', 'tracker_uri', 'tracker_group', 'tracker_tags'}
    assert WHERE_IT_RAN < RESUME_MAY_CHANGE and {'epochs', 'chunk_size', 'warmup_from'} < RESUME_MAY_CHANGE


def test_a_conflict_names_the_flag_and_skips_where_it_ran():
    saved = {'amp': 'bf16', 'tracker': 'wandb', 'temp': 0.1, 'epochs': 10}
    now = {'amp': 'none', 'tracker': 'mlflow', 'temp': 0.2, 'epochs': 20}
    assert resume_conflicts(saved, now) == ["--temp: the checkpoint has 0.1, now 0.2"]
    assert resume_conflicts(saved, now, holder='the finished run', may_change=WHERE_IT_RAN) == [
        "--epochs: the finished run has 10, now 20", "--temp: the finished run has 0.1, now 0.2"]
