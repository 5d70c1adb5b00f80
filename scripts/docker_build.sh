#!/usr/bin/env bash
# `make docker`: build an image of docker/<FLAVOR>/Dockerfile with podman, as root.
#
#   bash scripts/docker_build.sh                                   # localhost/pactrain_hvd:cpu
#   BASE_IMAGE=python:3.11-slim-bookworm bash scripts/docker_build.sh   # from a registry instead
#   FLAVOR=gpu bash scripts/docker_build.sh                        # localhost/pactrain_hvd:gpu (CUDA base)
#
# - Base: BASE_IMAGE if set; else, for the CPU image, Debian bookworm made with debootstrap from
#   this machine's apt mirror (scripts/docker_base.sh), so no image registry is needed; else the
#   Dockerfile's default.
# - The host's pip configuration (its config files and the local paths they name: find-links and
#   file:// indexes, constraints, the CA bundle) is bind-mounted read-only into the build's RUN
#   steps at the same paths, so pip resolves there as it does here (e.g. torch's CPU wheel from a
#   local wheel directory). Nothing of it is copied into the image; podman leaves the empty mount
#   points (an empty /etc/pip.conf, empty directories).
# - The Dockerfile's cache mount (pip downloads and the Horovod wheel) persists between builds in
#   podman's build cache, so a rebuild after a code change takes a minute or two.
# - TORCH_VERSION, TF_VERSION, HOROVOD_VERSION, SSH_PORT from the environment become build arguments.
# - IMAGE names the result; DOCKER_BUILD_TIMEOUT (seconds, default 5400) bounds the build.
set -euo pipefail
LOG_TAG=docker-build
# shellcheck source=scripts/docker_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/docker_env.sh"

FLAVOR="${FLAVOR:-cpu}"
IMAGE="${IMAGE:-localhost/pactrain_hvd:$FLAVOR}"
DOCKERFILE="$REPO_ROOT/docker/$FLAVOR/Dockerfile"
[ -f "$DOCKERFILE" ] || die "FLAVOR=$FLAVOR: no $DOCKERFILE"

# The host's pip configuration as podman volume arguments, one per line ("src:dst:ro").
host_pip_volumes() {
  python3 - "$HOME" <<'EOF'
import configparser, os, sys
from pathlib import Path

home = Path(sys.argv[1])
# pip's configuration files, global then user (https://pip.pypa.io/en/stable/topics/configuration/);
# the image builds as root, so a user file goes to /root.
candidates = [Path(d) / "pip" / "pip.conf" for d in os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")]
candidates += [Path("/etc/pip.conf"), home / ".pip" / "pip.conf", home / ".config" / "pip" / "pip.conf"]
if os.environ.get("PIP_CONFIG_FILE"):
    candidates.append(Path(os.environ["PIP_CONFIG_FILE"]))
PATH_KEYS = {"find-links", "index-url", "extra-index-url", "constraint", "requirement", "cert", "client-cert"}
volumes = {}
for config in candidates:
    if not config.is_file():
        continue
    inside = Path("/root") / config.relative_to(home) if config.is_relative_to(home) else config
    volumes[config.resolve()] = inside
    parser = configparser.RawConfigParser()
    parser.read(config)
    for section in parser.sections():
        for key, value in parser.items(section):
            if key.replace("_", "-") not in PATH_KEYS:
                continue
            for token in value.split():
                path = Path(token.removeprefix("file://")) if token.startswith(("file://", "/")) else None
                if path is None or not path.exists():
                    continue
                # A "simple" index links to its files beside it (../../files/...): hand in its parent.
                path = path.parent if path.name == "simple" else path
                volumes[path.resolve()] = path
for source, target in sorted(volumes.items()):
    print(f"{source}:{target}:ro")
EOF
}

ensure_engine
if [ -z "${BASE_IMAGE:-}" ] && [ "$FLAVOR" = cpu ]; then
  BASE_IMAGE="$(bash "$REPO_ROOT/scripts/docker_base.sh")"
fi

args=(--network host --layers -f "$DOCKERFILE" --ignorefile "$DOCKERFILE.dockerignore" -t "$IMAGE")
[ -n "${BASE_IMAGE:-}" ] && args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
for name in TORCH_VERSION TF_VERSION HOROVOD_VERSION SSH_PORT; do
  [ -n "${!name:-}" ] && args+=(--build-arg "$name=${!name}")
done
while IFS= read -r volume; do
  args+=(-v "$volume")
  log "hands in read-only: ${volume%%:*}"
done < <(host_pip_volumes)

log "$ENGINE build ${args[*]} $REPO_ROOT"
started=$SECONDS
timeout --kill-after=60 "${DOCKER_BUILD_TIMEOUT:-5400}" "$ENGINE" build "${args[@]}" "$REPO_ROOT"
log "built $IMAGE in $((SECONDS - started)) s ($("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE" \
  | awk '{printf "%.2f GB", $1 / 1e9}'))"
