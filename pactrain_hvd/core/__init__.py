"""Framework-free PacTrain core: schedule, masks, packing plan, fingerprints, byte accounting."""

from pactrain_hvd.core.accounting import StepStats, TensorStats, ring_allreduce_bytes
from pactrain_hvd.core.config import PacTrainConfig
from pactrain_hvd.core.errors import (
    ChangedSettingsWarning,
    CheckpointError,
    InexactResumeWarning,
    MaskMismatchError,
    NonFiniteWeightsError,
    SettingsMismatchError,
    WorldSizeChangedWarning,
)
from pactrain_hvd.core.fingerprint import check_fingerprints, describe_mismatches, fingerprint_table, mask_fingerprint
from pactrain_hvd.core.masks import (
    erk_sparsities,
    magnitude_masks,
    not_finite,
    num_to_keep,
    overall_sparsity,
    prunable_predicate,
    select_prunable_names,
    survivor_scales,
    validate_mask,
    validate_masks,
)
from pactrain_hvd.core.plan import should_pack
from pactrain_hvd.core.resume import check_saved_world_size, saved_by_this_rank, while_running
from pactrain_hvd.core.rewind import rewound_cosine
from pactrain_hvd.core.schedule import ConstantSparsity, PolynomialDecay, PolynomialSchedule, short_ramp

__all__ = [
    "ChangedSettingsWarning",
    "CheckpointError",
    "ConstantSparsity",
    "MaskMismatchError",
    "NonFiniteWeightsError",
    "SettingsMismatchError",
    "PacTrainConfig",
    "PolynomialDecay",
    "PolynomialSchedule",
    "StepStats",
    "TensorStats",
    "InexactResumeWarning",
    "WorldSizeChangedWarning",
    "check_fingerprints",
    "check_saved_world_size",
    "saved_by_this_rank",
    "while_running",
    "describe_mismatches",
    "fingerprint_table",
    "erk_sparsities",
    "magnitude_masks",
    "mask_fingerprint",
    "not_finite",
    "num_to_keep",
    "overall_sparsity",
    "prunable_predicate",
    "select_prunable_names",
    "ring_allreduce_bytes",
    "rewound_cosine",
    "short_ramp",
    "should_pack",
    "survivor_scales",
    "validate_mask",
    "validate_masks",
]
