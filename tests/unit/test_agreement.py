"""Settings every rank must share, non-finite weights at a mask update, numbers of every type, resumed settings."""

import warnings

import numpy as np
import pytest

from pactrain_hvd.core import (
    ChangedSettingsWarning,
    CheckpointError,
    MaskMismatchError,
    NonFiniteWeightsError,
    PacTrainConfig,
    SettingsMismatchError,
    check_fingerprints,
    fingerprint_table,
    magnitude_masks,
    mask_fingerprint,
)
from pactrain_hvd.core.agreement import WIRE_FORMAT, check_settings, horovod_settings, settings_rows
from pactrain_hvd.core.resume import check_saved_settings, checkpoint_settings


def tables(*per_rank, names=("w",), step=0, not_finite=((),) * 2):
    return np.concatenate([fingerprint_table({name: 8 for name in names}, {}, step, None, settings, broken)
                           for settings, broken in zip(per_rank, not_finite)])


def raised(error, per_rank, **kwargs):
    with pytest.raises(error) as info:
        check_fingerprints(["w"], tables(*per_rank, **kwargs), len(per_rank), "torch", "checkpoint hint", per_rank[0])
    return str(info.value)


def test_total_steps_that_differ_by_one_batch_name_every_resolved_step_and_the_cause():
    settings = [PacTrainConfig.from_arguments(total_steps=n, frequency=5).shared_settings() for n in (110, 109)]
    message = raised(SettingsMismatchError, settings)
    assert "total_steps (rank 0: 110, rank 1: 109)" in message
    assert "begin_step (rank 0: 11, rank 1: 10)" in message and "end_step (rank 0: 66, rank 1: 65)" in message
    assert "frequency" not in message.split(".")[0]  # the same on both ranks: not listed
    assert "DistributedSampler" in message and "checkpoint hint" not in message


def test_each_rank_parses_the_same_bytes_into_the_same_error():
    settings = [PacTrainConfig.from_arguments(frequency=f).shared_settings() for f in (5, 10)]
    gathered = tables(*settings)
    messages = []
    for own in settings:  # each rank names the keys from its own settings
        with pytest.raises(SettingsMismatchError) as info:
            check_fingerprints(["w"], gathered, 2, "torch", "hint", own)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "frequency (rank 0: 5, rank 1: 10)" in messages[0]


def test_text_float_and_hashed_settings_show_each_rank_value():
    mine = {**PacTrainConfig().shared_settings(), "packed_values": "ternary",
            **horovod_settings("Average", type("MyOwnCompressor", (), {}), None, 1, 1.0)}
    theirs = {**mine, "packed_values": "fp16", "sparsity": 0.95, "compression": "fp16", "groups": 2}
    message = raised(SettingsMismatchError, [mine, theirs])
    assert "sparsity (rank 0: 0.9, rank 1: 0.95)" in message
    assert "packed_values (rank 0: 'ternary', rank 1: 'fp16')" in message
    assert "groups (rank 0: None, rank 1: 2)" in message
    assert "compression (rank 0: <value with hash" in message and "rank 1: 'fp16')" in message
    assert "pass the same sparsity, packed_values, compression and groups on every rank" in message


def test_ranks_of_different_versions_are_told_to_install_one():
    """A rank of a version without the wire format (bit-field ternary codes) against one with it."""
    settings = PacTrainConfig().shared_settings()
    older = {name: value for name, value in settings.items() if name != "wire_format"}
    message = raised(SettingsMismatchError, [settings, older])
    assert f"wire_format (rank 0: {WIRE_FORMAT}, rank 1: not set)" in message
    assert "install the same pactrain_hvd version on every rank" in message and "pass the same" not in message
    message = raised(SettingsMismatchError, [older, settings])  # as the older rank reads it
    assert "a setting this rank does not know" in message and "install the same pactrain_hvd version" in message


def test_settings_mismatch_is_a_mask_mismatch_for_code_that_catches_those():
    assert issubclass(SettingsMismatchError, MaskMismatchError)


def test_equal_settings_pass_and_rows_have_a_fixed_shape():
    settings = PacTrainConfig().shared_settings()
    check_settings(settings, [settings_rows(settings)] * 3)
    assert settings_rows(settings).shape == (len(settings), 3)


def test_a_rank_with_a_setting_the_others_lack_is_named():
    with pytest.raises(SettingsMismatchError, match=r"verify_every \(rank 0: 100, rank 1: not set\)"):
        check_settings({"verify_every": 100}, [settings_rows({"verify_every": 100}), settings_rows({})])


def test_non_finite_weights_on_one_rank_raise_on_every_rank_before_masks_are_compared():
    settings = PacTrainConfig().shared_settings()
    message = raised(NonFiniteWeightsError, [settings, settings], not_finite=((), ("w",)))
    assert "'w' (ranks [1])" in message and "No mask was changed" in message
    message = raised(NonFiniteWeightsError, [settings, settings], not_finite=(("w",), ("w",)))
    assert "'w'." in message  # every rank: no rank list


def test_weights_that_differ_get_the_broadcast_hint_not_the_checkpoint_hint():
    a, b = np.zeros(8, dtype=bool), np.zeros(8, dtype=bool)
    a[:2], b[-2:] = True, True
    gathered = np.concatenate([fingerprint_table({"w": 8}, {"w": mask_fingerprint(m)}, 3, {"w": total})
                               for m, total in ((a, 1.5), (b, -0.25))])
    with pytest.raises(MaskMismatchError) as info:
        check_fingerprints(["w"], gathered, 2, "torch", "checkpoint hint")
    assert "hvd.broadcast_parameters" in str(info.value) and "checkpoint hint" not in str(info.value)


@pytest.mark.parametrize("ranking", ["layer", "erk", "global"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_never_become_masks(ranking, bad):
    weights = {"a": np.arange(1.0, 65.0).reshape(8, 8), "b": np.arange(1.0, 33.0).reshape(4, 8)}
    weights["b"][1, 2] = bad
    with pytest.raises(NonFiniteWeightsError, match="'b'|b"):
        magnitude_masks(weights, 0.9, ranking=ranking)


def test_global_ranking_keeps_a_layer_alive_with_a_survivor_never_a_pruned_coordinate():
    previous = {"big": np.ones((16, 16), dtype=bool), "small": np.zeros((4, 4), dtype=bool)}
    previous["small"][0, 0] = True  # its one survivor is the smallest weight of all
    weights = {"big": np.full((16, 16), 10.0), "small": np.full((4, 4), 100.0)}
    weights["small"][0, 0] = 0.001
    masks = magnitude_masks(weights, 0.9, previous, ranking="global")
    assert masks["small"].sum() == 1 and masks["small"][0, 0]


@pytest.mark.parametrize("value", [np.float32(0.9), np.float64(0.9), np.array(0.9, dtype=np.float32)])
def test_numpy_scalars_and_0d_arrays_are_numbers(value):
    config = PacTrainConfig.from_arguments(sparsity=value, total_steps=np.int64(100), begin_step=np.int32(0),
                                           frequency=np.array(5), verify_every=np.int64(10))
    assert config.sparsity == 0.9 and type(config.sparsity) is float
    assert (config.total_steps, config.begin_step, config.end_step, config.frequency) == (100, 0, 60, 5)
    assert type(config.verify_every) is int


@pytest.mark.parametrize("value", [np.bool_(True), np.array([0.9]), "0.9"])
def test_non_numbers_are_still_refused(value):
    with pytest.raises(TypeError, match="sparsity must be a number"):
        PacTrainConfig.from_arguments(sparsity=value)


def test_a_checkpoint_saved_with_other_settings_is_refused_before_anything_changes():
    saved = checkpoint_settings(PacTrainConfig.from_arguments(sparsity=0.8, total_steps=100), "fp16")
    config = PacTrainConfig.from_arguments(sparsity=0.9, total_steps=100)
    with pytest.raises(CheckpointError, match=r"sparsity 0\.8 -> 0\.9, packed_values 'fp16' -> 'inherit'.*"
                                              r"resume_changed_settings=True"):
        check_saved_settings(saved, checkpoint_settings(config, "inherit"), 70, config)
    check_saved_settings(saved, saved, 70, PacTrainConfig.from_arguments(sparsity=0.8, total_steps=100))
    check_saved_settings(None, checkpoint_settings(config, "inherit"), 70, config)  # before settings were saved
    with pytest.raises(CheckpointError, match=r"sparsity 0\.8 -> 0\.9"):
        check_saved_settings({"sparsity": 0.8}, checkpoint_settings(config, "inherit"), 70, config)


def test_resuming_other_settings_when_asked_warns_what_will_happen():
    saved = checkpoint_settings(PacTrainConfig.from_arguments(sparsity=0.8, total_steps=100), "inherit")
    config = PacTrainConfig.from_arguments(sparsity=0.9, total_steps=200, resume_changed_settings=True)
    with pytest.warns(ChangedSettingsWarning, match=r"step 30 carry over.*prunes further from them at step 30"):
        check_saved_settings(saved, checkpoint_settings(config, "inherit"), 30, config)
    with pytest.warns(ChangedSettingsWarning, match=r"no schedule update remains after step 150.*masks stay as saved"):
        check_saved_settings(saved, checkpoint_settings(config, "inherit"), 150, config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_saved_settings(saved, saved, 150, config)  # nothing changed: nothing said


def test_another_ranks_per_rank_state_is_not_loaded_and_a_resume_says_it_is_inexact():
    import pytest

    from pactrain_hvd.core import InexactResumeWarning
    from pactrain_hvd.core.resume import saved_by_this_rank

    assert saved_by_this_rank(1, lambda: 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not saved_by_this_rank(0, lambda: 1, holds_state=False)  # a fresh run's start-up broadcast: quiet
    with pytest.warns(InexactResumeWarning, match="holds rank 0's quantization error memory, not rank 1's"):
        assert not saved_by_this_rank(0, lambda: 1)
