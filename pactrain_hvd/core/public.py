"""What every frontend exports under its own name (``pt.CheckpointError`` in torch and TF alike): the errors
a user catches and the schedule objects a user passes."""

from pactrain_hvd.core.errors import (
    ChangedSettingsWarning,
    CheckpointError,
    InexactResumeWarning,
    MaskMismatchError,
    NonFiniteWeightsError,
    SettingsMismatchError,
)
from pactrain_hvd.core.schedule import ConstantSparsity, PolynomialDecay, short_ramp

__all__ = ["ChangedSettingsWarning", "CheckpointError", "ConstantSparsity", "InexactResumeWarning", "MaskMismatchError",
           "NonFiniteWeightsError", "PolynomialDecay", "SettingsMismatchError", "short_ramp"]
