"""Errors PacTrain raises instead of training on with inconsistent state."""


class MaskMismatchError(RuntimeError):
    """Ranks disagree on a pruning mask; all-reducing packed values would mix unrelated coordinates."""


class CheckpointError(ValueError):
    """A PacTrain checkpoint does not fit the model or optimizer it is loaded into."""


class WorldSizeChangedWarning(UserWarning):
    """A checkpoint saved under one world size is loaded under another (legitimate, e.g. Horovod elastic)."""


class SettingsMismatchError(MaskMismatchError):
    """Ranks disagree on a setting that decides masks or collectives (schedule, plan, value encoding, ...)."""


class NonFiniteWeightsError(FloatingPointError):
    """Weights hold NaN or inf at a mask update: magnitudes cannot rank them, so no mask is computed."""


class ChangedSettingsWarning(UserWarning):
    """A checkpoint saved under other PacTrain settings is resumed, as asked (``resume_changed_settings=True``)."""


class InexactResumeWarning(UserWarning):
    """A checkpoint lacks this rank's own state (quantized values' error memory): the run
    resumes without it, close to but not bit for bit the uninterrupted run."""
