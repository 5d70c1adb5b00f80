#!/usr/bin/env bash
# The registry-free base of the CPU image: Debian bookworm minbase with Python 3.11 (venv and
# headers), made with debootstrap from this machine's apt mirror and imported into podman.
# It stands in for python:3.11-slim-bookworm where no image registry can be reached:
#
#   bash scripts/docker_base.sh            # prints the image name; idempotent
#   podman build --build-arg BASE_IMAGE="$(bash scripts/docker_base.sh)" -f docker/cpu/Dockerfile .
#
# The image is labelled with a key of what made it (mirror, suite, packages); a re-run with the
# same key only prints the name. DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR and BASE_NAME override
# the defaults; --force rebuilds. Root only (debootstrap). Log lines go to stderr.
set -euo pipefail

SUITE=bookworm
PACKAGES=ca-certificates,python3,python3-venv,python3-dev
BASE_NAME="${BASE_NAME:-localhost/pactrain-hvd-base:$SUITE}"
LOG_TAG=docker-base
# shellcheck source=scripts/docker_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/docker_env.sh"
ensure_engine

# The first URI of this machine's apt sources that serves $1 (deb822 .sources or one-line lists).
apt_mirror_for() {
  local suite="$1" file
  for file in /etc/apt/sources.list.d/*.sources; do
    [ -f "$file" ] || continue
    awk -v suite="$suite" '
      /^[[:space:]]*$/ { if (uri != "" && found) { print uri; exit } uri = ""; found = 0; next }
      tolower($1) == "uris:" { uri = $2 }
      tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) found = 1 }
      END { if (uri != "" && found) print uri }' "$file" | head -n1
  done | head -n1 | grep . && return
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | awk -v suite="$suite" '$1 == "deb" { for (i = 2; i < NF; i++) if ($(i+1) == suite && $i !~ /^\[/) { print $i; exit } }' \
    | head -n1 | grep .
}

MIRROR="${DEBIAN_MIRROR:-$(apt_mirror_for "$SUITE" || echo http://deb.debian.org/debian)}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-$(apt_mirror_for "$SUITE-security" || echo http://deb.debian.org/debian-security)}"
# Raise RECIPE when what this script puts in the image changes.
RECIPE=1
KEY="$(printf '%s\n' "$RECIPE" "$SUITE" "$PACKAGES" "$MIRROR" "$SECURITY_MIRROR" | sha256sum | cut -c1-16)"

if [ "${1:-}" != "--force" ] \
   && [ "$("$ENGINE" image inspect --format '{{ index .Labels "pactrain.base.key" }}' "$BASE_NAME" 2>/dev/null)" = "$KEY" ]; then
  log "$BASE_NAME is up to date (key $KEY)"
  echo "$BASE_NAME"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap is not installed: apt-get install debootstrap"

ROOTFS="$(mktemp -d /var/tmp/pactrain-base.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT

started=$SECONDS
log "debootstrap --variant=minbase $SUITE from $MIRROR"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
  || { tail -n 30 "$ROOTFS.log" >&2; rm -f "$ROOTFS.log"; exit 1; }
rm -f "$ROOTFS.log"

# The image's apt sources: the mirror it was made from, with updates and security as in Debian's images.
rm -f "$ROOTFS/etc/apt/sources.list"
cat >"$ROOTFS/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
# What a container engine provides at run time, and what only made the root file system.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
  "$ROOTFS"/var/log/* "$ROOTFS/etc/hostname" "$ROOTFS/etc/resolv.conf"
: >"$ROOTFS/etc/machine-id"

log "podman import -> $BASE_NAME"
tar -C "$ROOTFS" --numeric-owner -c . \
  | "$ENGINE" import --quiet \
      --change 'ENV LANG=C.UTF-8' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["bash"]' \
      --change "LABEL pactrain.base.key=$KEY" \
      --change "LABEL pactrain.base.source=debootstrap-$SUITE-minbase" \
      - "$BASE_NAME" >/dev/null
log "made $BASE_NAME in $((SECONDS - started)) s"
echo "$BASE_NAME"
