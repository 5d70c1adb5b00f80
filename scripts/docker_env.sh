# Sourced by scripts/docker_*.sh: the container engine, its configuration, logging.
# shellcheck shell=bash

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# podman (with its build, buildah's code) is what these scripts drive; docker users build with
# `docker build` directly (docker/README.md).
ENGINE=podman
# This repository's settings for podman and its builds, unless the caller brings their own.
export CONTAINERS_CONF="${CONTAINERS_CONF:-$REPO_ROOT/docker/podman/containers.conf}"
# Debian packages: the engine, its OCI runtime, its network stack (netavark drives iptables) and
# debootstrap for the registry-free base image.
ENGINE_PACKAGES=(podman runc netavark iptables debootstrap)

log() { printf '\033[1m[%s]\033[0m %s\n' "${LOG_TAG:-docker}" "$*" >&2; }
die() { printf '%s: %s\n' "${LOG_TAG:-docker}" "$*" >&2; exit 1; }

# Install the engine with apt where it is missing (root only); fail with the command otherwise.
ensure_engine() {
  local missing=() pkg
  for pkg in "${ENGINE_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    command -v "$ENGINE" >/dev/null && return  # someone else's install: use it as it is
    die "$ENGINE is not installed: apt-get install ${ENGINE_PACKAGES[*]} (as root)"
  fi
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
