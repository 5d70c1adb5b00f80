"""The step model now lives in the library (``pactrain_hvd.planner.step_model``); the benchmarks import it from here."""

from pactrain_hvd.planner.step_model import (  # noqa: F401
    ALLGATHER,
    ALLREDUCE,
    BENCH_CYCLE_TIME_S,
    HOROVOD_DEFAULT_FUSION_BYTES,
    BackgroundLoop,
    HorovodConfig,
    Link,
    Stage,
    StepPlan,
    StepPrediction,
    Submitted,
    Transfer,
    collective_s,
    expected_step,
    fuse,
    negotiation_s,
    predict_step,
    ring_allgather_s,
    ring_allreduce_s,
)
