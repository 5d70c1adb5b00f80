#!/usr/bin/env bash
# One idempotent install for pactrain_hvd on Debian + Python 3.11 (root):
# system packages, the .venv, the frameworks, and Horovod built from source
# into a wheel cached outside the repo. Safe to re-run; a warm re-run takes
# well under two minutes. Versions can be overridden from the environment.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-$REPO_ROOT/.venv}"
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TF_VERSION="${TF_VERSION:-2.21.0}"
TF_KERAS_SPEC="${TF_KERAS_SPEC:-tf-keras~=${TF_VERSION%.*}.0}"

# True when dotted version $1 >= $2.
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

# TF < 2.18 is built against the numpy 1 ABI; 2.18 and later take numpy 2.
# tfmot (bring your own mask from prune_low_magnitude; tf-keras 2 only): 0.8.0 pins absl-py<2,
# which TF 2.16 accepts; 0.8.1 (absl-py 2, plus scipy and mock for nothing we use) runs on 2.21.
if version_ge "$TF_VERSION" 2.18; then
  NUMPY_SPEC="${NUMPY_SPEC:-numpy>=2}"
  TFMOT_VERSION="${TFMOT_VERSION:-0.8.1}"
else
  NUMPY_SPEC="${NUMPY_SPEC:-numpy<2}"
  TFMOT_VERSION="${TFMOT_VERSION:-0.8.0}"
fi
CACHE_DIR="${PACTRAIN_CACHE:-$HOME/.cache/pactrain_hvd}"
APT_PACKAGES=(openmpi-bin libopenmpi-dev build-essential cmake git iproute2 iptables dataset-fashion-mnist)

log() { printf '\033[1m[install]\033[0m %s\n' "$*"; }

install_system_packages() {
  local missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "system packages present"
    return
  fi
  log "apt-get install ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

create_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
  fi
}

pip_install() { "$VENV/bin/pip" install -q --disable-pip-version-check "$@"; }

install_frameworks() {
  local requirements=("torch==$TORCH_VERSION" "tensorflow-cpu==$TF_VERSION" "$TF_KERAS_SPEC" "$NUMPY_SPEC"
                      "tensorflow-model-optimization==$TFMOT_VERSION" mpi4py cloudpickle psutil pyyaml packaging)
  local stamp="$VENV/.pactrain-frameworks"
  if [ "$(cat "$stamp" 2>/dev/null)" = "${requirements[*]}" ] && "$VENV/bin/python" -c "import torch, tensorflow" 2>/dev/null; then
    log "frameworks present: ${requirements[*]:0:3}"
    return
  fi
  log "frameworks: ${requirements[*]:0:3}"
  pip_install "${requirements[@]}"
  echo "${requirements[*]}" > "$stamp"
}

# After Horovod: the package's own horovod requirement is then already met.
install_package() {
  pip_install -e "$REPO_ROOT[dev]"
}

# Replace fixed string $2 by $3 in file $1; stop the install if $2 is not there.
patch_file() {
  local file="$1" old="$2" new="$3"
  grep -qF -- "$old" "$file" || { echo "install: Horovod patch failed: '$old' not in $file" >&2; exit 1; }
  OLD="$old" NEW="$new" "$VENV/bin/python" - "$file" <<'PY'
import os, sys
path = sys.argv[1]
text = open(path).read()
open(path, "w").write(text.replace(os.environ["OLD"], os.environ["NEW"]))
PY
  log "patched ${file#"$HOROVOD_SRC"/}: $old -> $new"
}

# Horovod 0.28.1 is older than the frameworks it is built against here. Each patch is guarded by
# the versions known to need it and must apply, or the build stops (docs/installation.md: "Supported versions").
patch_horovod_source() {
  HOROVOD_SRC="$1"
  case "$HOROVOD_VERSION" in 0.28.*) ;; *) return ;; esac
  # torch >= 2.1 headers need C++17 ("'optional' in namespace 'std' does not name a template type").
  local f
  for f in "$HOROVOD_SRC/CMakeLists.txt" "$HOROVOD_SRC/horovod/torch/CMakeLists.txt"; do
    patch_file "$f" 'set(CMAKE_CXX_STANDARD 14)' 'set(CMAKE_CXX_STANDARD 17)'
  done
  local xla="$HOROVOD_SRC/horovod/tensorflow/xla_mpi_ops.cc"
  local tf_cmake="$HOROVOD_SRC/horovod/tensorflow/CMakeLists.txt"
  if version_ge "$TF_VERSION" 2.19; then
    # TF 2.19 moved XLA's builder header and dropped xla::StatusOr for absl::StatusOr
    # (upstream: horovod PRs #4302, #4063, both unmerged).
    patch_file "$xla" 'tensorflow/compiler/xla/client/xla_builder.h' 'tensorflow/compiler/xla/hlo/builder/xla_builder.h'
    patch_file "$xla" '::xla::StatusOr<' '::absl::StatusOr<'
  fi
  if version_ge "$TF_VERSION" 2.21; then
    # TF 2.21's XLA headers include highwayhash and farmhash, which the wheel ships under
    # include/external/ but off the include path that tf.sysconfig reports (no upstream fix yet).
    patch_file "$tf_cmake" 'include_directories(SYSTEM ${Tensorflow_INCLUDE_DIRS})' \
      'include_directories(SYSTEM ${Tensorflow_INCLUDE_DIRS} ${Tensorflow_INCLUDE_DIRS}/external/highwayhash ${Tensorflow_INCLUDE_DIRS}/external/farmhash_archive/src)'
  fi
}

horovod_wheel_dir() {
  local py
  py="$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')"
  echo "$CACHE_DIR/horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-tf$TF_VERSION-$py"
}

build_horovod_wheel() {
  local wheel_dir="$1" work
  work="$(mktemp -d)"
  log "building Horovod $HOROVOD_VERSION from source (slow: ~10-20 min on 2 cores)"
  "$VENV/bin/pip" download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
  tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
  patch_horovod_source "$work/horovod-$HOROVOD_VERSION"
  mkdir -p "$wheel_dir.partial"
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_CPU_OPERATIONS="${HOROVOD_CPU_OPERATIONS:-gloo}" \
  MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}" \
    "$VENV/bin/pip" wheel --no-build-isolation --no-deps -w "$wheel_dir.partial" "$work/horovod-$HOROVOD_VERSION"
  rm -rf "$wheel_dir" && mv "$wheel_dir.partial" "$wheel_dir"   # publish atomically
  rm -rf "$work"
}

install_horovod() {
  local wheel_dir
  wheel_dir="$(horovod_wheel_dir)"
  if "$VENV/bin/python" -c "import horovod, sys; sys.exit(horovod.__version__ != '$HOROVOD_VERSION')" 2>/dev/null \
     && check_build quiet; then
    log "horovod $HOROVOD_VERSION already installed"
    return
  fi
  if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    build_horovod_wheel "$wheel_dir"
  else
    log "reusing cached wheel in $wheel_dir"
  fi
  pip_install --force-reinstall --no-deps "$wheel_dir"/horovod-*.whl
}

# `horovodrun --check-build` must list every piece we rely on with [X].
check_build() {
  local report missing=()
  report="$("$VENV/bin/horovodrun" --check-build 2>&1)" || true
  for part in PyTorch TensorFlow Gloo MPI; do
    grep -qE "\[X\] $part\b" <<<"$report" || missing+=("$part")
  done
  if [ ${#missing[@]} -ne 0 ]; then
    [ "${1:-}" = quiet ] && return 1
    echo "$report" >&2
    echo "install: horovodrun --check-build is missing: ${missing[*]}" >&2
    exit 1
  fi
  [ "${1:-}" = quiet ] || log "horovodrun --check-build lists PyTorch, TensorFlow, Gloo, MPI"
}

install_system_packages
create_venv
install_frameworks
install_horovod
install_package
check_build
touch "$VENV/.pactrain-installed"
log "done: $VENV"
