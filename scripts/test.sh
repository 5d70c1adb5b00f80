#!/usr/bin/env bash
# The whole test suite: unit tests, then multi-rank tests under horovodrun (Gloo) and mpirun (MPI).
# A failure on any rank fails the run.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONDONTWRITEBYTECODE=1
PYTEST=(-p no:cacheprovider -q -x --color=no)
failed=()
passed=0

# TEST_SUITES picks suites by key (default: all), e.g. TEST_SUITES="unit torch tensorflow".
SUITES=" ${TEST_SUITES:-lint unit docs torch tensorflow horovod-scripts ddp resume faults elastic bench mpi} "

# pytest exits 5 when a selection holds no test: that is a gap, said loudly, not a failure.
run() {
  local key="$1" label="$2"; shift 2
  [[ "$SUITES" == *" $key "* ]] || return 0
  echo "=== $label: $*"
  timeout --kill-after=30 "${PACTRAIN_TEST_TIMEOUT:-1200}" "$@"
  local rc=$?
  if [ $rc -eq 5 ]; then
    echo "=== $label: no tests collected"
  elif [ $rc -ne 0 ]; then
    echo "=== $label: FAILED (exit $rc)"
    failed+=("$label")
  else
    passed=$((passed + 1))
  fi
}

run lint lint "$VENV/bin/ruff" check .
run unit unit "$PY" -m pytest "${PYTEST[@]}" tests/unit
run docs "docs (links, API coverage, sphinx-build -W, snippets x2)" "$PY" -m pytest "${PYTEST[@]}" -rs tests/docs
# TF log level 3 for PyTorch ranks: horovodrun's build check imports TensorFlow, whose start-up logs three
# harmless "Unable to register cuFFT/cuDNN/cuBLAS factory" errors even at level 2.
run torch "torch x2 (gloo)" env HOROVOD_DYNAMIC_PROCESS_SETS=1 TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/horovodrun" -np 2 -H localhost:2 --gloo \
  "$PY" -m pytest "${PYTEST[@]}" tests/parallel/torch
run tensorflow "tensorflow x2 (gloo)" "$VENV/bin/horovodrun" -np 2 -H localhost:2 --gloo \
  "$PY" -m pytest "${PYTEST[@]}" tests/parallel/tensorflow
run tensorflow "tensorflow tf-keras 2 x2 (gloo)" env TF_USE_LEGACY_KERAS=1 "$VENV/bin/horovodrun" -np 2 -H localhost:2 --gloo \
  "$PY" -m pytest "${PYTEST[@]}" tests/parallel/tensorflow
run horovod-scripts "Horovod-style scripts x2 (horovodrun; Keras 3, tf-keras 2)" "$PY" -m pytest "${PYTEST[@]}" tests/horovod_scripts
run ddp "torch DDP comm hook x2 (gloo, torch.multiprocessing)" env TF_CPP_MIN_LOG_LEVEL=3 "$PY" -m pytest "${PYTEST[@]}" tests/ddp
run resume "resume after kill (horovodrun)" "$PY" -m pytest "${PYTEST[@]}" tests/integration
run faults "faults: a mistake on one rank (horovodrun)" "$PY" -m pytest "${PYTEST[@]}" tests/faults
run elastic "elastic (horovodrun)" "$PY" -m pytest "${PYTEST[@]}" tests/elastic
run bench "benchmark --quick (network namespaces)" "$PY" -m pytest "${PYTEST[@]}" tests/bench
run mpi "mpi x2 (mpirun)" mpirun --allow-run-as-root --oversubscribe -np 2 \
  -x PATH -x PYTHONUNBUFFERED -x TF_CPP_MIN_LOG_LEVEL \
  "$PY" -m pytest "${PYTEST[@]}" tests/mpi

echo "suites: $passed passed, ${#failed[@]} failed"
if [ ${#failed[@]} -ne 0 ]; then
  printf 'FAILED suites: %s\n' "${failed[*]}"
  exit 1
fi
