#!/usr/bin/env bash
# `make docker-test`: the image as a two-machine cluster. Two containers (hosts c1 and c2) on a
# podman network of their own, sshd in each with a key pair made for this run (never in the
# image), then from c1, as a multi-host user runs it:
#
#   horovodrun -np 2 -H c1:1,c2:1 --gloo python docker/cluster_check.py   # Gloo, ranks over ssh
#   mpirun     -np 2 -H c1,c2        python docker/cluster_check.py        # MPI
#
# each a dense then a PacTrain training that asserts equal weights on both ranks, pruned weights
# exactly 0 and PacTrain's bytes on each container's interface at most 0.2x dense's. Then both
# again with each container's egress shaped to DOCKER_TEST_RATE (100mbit; tc tbf in the
# container's network namespace), asserting PacTrain's step time below dense's.
#
# Everything it starts (containers, network, keys) is removed on exit, failure and interrupt
# included; every job runs under a timeout (DOCKER_TEST_JOB_TIMEOUT seconds, default 900), so a
# hang fails. Logs and each job's JSON: DOCKER_TEST_LOGDIR (default runs/docker-test). Root only.
set -euo pipefail
LOG_TAG=docker-test
# shellcheck source=scripts/docker_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/docker_env.sh"

IMAGE="${IMAGE:-localhost/pactrain_hvd:cpu}"
RATE="${DOCKER_TEST_RATE:-100mbit}"
JOB_TIMEOUT="${DOCKER_TEST_JOB_TIMEOUT:-900}"
STEPS="${DOCKER_TEST_STEPS:-30}"
LOGDIR="${DOCKER_TEST_LOGDIR:-$REPO_ROOT/runs/docker-test}"
PREFIX="pactrain-test-$$"
NETWORK="$PREFIX"
HOSTS=(c1 c2)
LAUNCHER="$PREFIX-c1"
WORKDIR=/opt/pactrain_hvd
# tbf as benchmarks/links/links.py shapes its links: 2 ms of traffic per bucket (at least 32 KiB), 50 ms queue.
TBF=(burst 32kb latency 50ms)

[ "$(id -u)" -eq 0 ] || die "needs root (podman networks, tc in the containers' namespaces)"
KEYS="$(mktemp -d /tmp/pactrain-test-keys.XXXXXX)"
IP_FORWARD_BEFORE="$(cat /proc/sys/net/ipv4/ip_forward)"
JOB_PID=""
started=$SECONDS

cleanup() {
  local rc=$? host
  trap - EXIT INT TERM
  [ -z "$JOB_PID" ] || kill "$JOB_PID" 2>/dev/null || true
  for host in "${HOSTS[@]}"; do
    "$ENGINE" rm -f -t 0 "$PREFIX-$host" >/dev/null 2>&1 || true
  done
  "$ENGINE" network rm -f "$NETWORK" >/dev/null 2>&1 || true
  rm -rf "$KEYS"
  # netavark turns on IPv4 forwarding for a bridge network; put the host's setting back.
  if [ "$(cat /proc/sys/net/ipv4/ip_forward)" != "$IP_FORWARD_BEFORE" ]; then
    echo "$IP_FORWARD_BEFORE" >/proc/sys/net/ipv4/ip_forward
  fi
  if [ $rc -eq 0 ]; then
    log "passed in $((SECONDS - started)) s; removed containers, network and keys"
  else
    log "FAILED (exit $rc) after $((SECONDS - started)) s; removed containers, network and keys; logs in $LOGDIR"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ensure_engine
"$ENGINE" image exists "$IMAGE" || die "no image $IMAGE: run make docker first"
mkdir -p "$LOGDIR"

# The image ships no SSH keys: host keys are made by each container's entrypoint, client keys are this run's.
baked="$("$ENGINE" run --rm --network none --entrypoint sh "$IMAGE" -c \
  'ls /etc/ssh/ssh_host_*key* /root/.ssh/* 2>/dev/null' || true)"
[ -z "$baked" ] || die "the image holds SSH keys: $baked"

log "cluster: ${HOSTS[*]} on network $NETWORK, image $IMAGE"
ssh-keygen -q -t ed25519 -N '' -C "$PREFIX" -f "$KEYS/id_ed25519"
cp "$KEYS/id_ed25519.pub" "$KEYS/authorized_keys"
chmod 700 "$KEYS" && chmod 600 "$KEYS"/*
# --internal: the cluster talks to itself only (no NAT, no route out); DNS off: /etc/hosts below.
"$ENGINE" network create --internal --disable-dns "$NETWORK" >/dev/null
for host in "${HOSTS[@]}"; do
  # The entrypoint makes the container's own host keys, then sshd stays in the foreground.
  "$ENGINE" run -d --name "$PREFIX-$host" --hostname "$host" --network "$NETWORK" \
    -v "$KEYS:/root/.ssh:ro" "$IMAGE" /usr/sbin/sshd -D -e >/dev/null
done
hosts_lines=""
for host in "${HOSTS[@]}"; do
  address="$("$ENGINE" inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$PREFIX-$host")"
  [ -n "$address" ] || die "$PREFIX-$host has no address on $NETWORK"
  hosts_lines+="$address $host"$'\n'
done
for host in "${HOSTS[@]}"; do
  printf '%s' "$hosts_lines" | "$ENGINE" exec -i "$PREFIX-$host" sh -c 'cat >>/etc/hosts'
done
log "addresses: $(printf '%s' "$hosts_lines" | tr '\n' ' ')"

# sshd is up when the launcher reaches every host (itself included) with the run's key.
for host in "${HOSTS[@]}"; do
  for attempt in $(seq 30); do
    "$ENGINE" exec "$LAUNCHER" ssh -o BatchMode=yes -o ConnectTimeout=5 "$host" true 2>/dev/null && break
    [ "$attempt" -eq 30 ] && die "ssh from c1 to $host failed for 30 s"
    sleep 1
  done
done
host_keys="$(for host in "${HOSTS[@]}"; do
  "$ENGINE" exec "$PREFIX-$host" ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub | cut -d' ' -f2
done | sort -u | wc -l)"
[ "$host_keys" -eq ${#HOSTS[@]} ] || die "the containers share an SSH host key"
log "ssh from c1 reaches ${HOSTS[*]}; each container has its own host key"

# One job from the launcher, under a timeout inside (a clean failure) and one outside (podman itself).
run_job() {
  local label="$1" job_started=$SECONDS rc=0; shift
  log "$label: $*"
  # In the background and waited for: a signal to this script then stops it at once (bash runs a
  # trap only between commands, and wait is interruptible), and the cleanup takes the job down.
  timeout --kill-after=30 "$((JOB_TIMEOUT + 60))" \
    "$ENGINE" exec -w "$WORKDIR" "$LAUNCHER" timeout --kill-after=30 "$JOB_TIMEOUT" "$@" \
    --steps "$STEPS" --result-json "/tmp/$label.json" >"$LOGDIR/$label.log" 2>&1 &
  JOB_PID=$!
  wait "$JOB_PID" || rc=$?
  JOB_PID=""
  grep -h 'cluster_check' "$LOGDIR/$label.log" | sed 's/^\[[0-9]*\]<stdout>://' >&2 || true
  if [ $rc -ne 0 ]; then
    tail -n 40 "$LOGDIR/$label.log" >&2
    die "$label failed (exit $rc$([ $rc -eq 124 ] && echo ': timed out')); log: $LOGDIR/$label.log"
  fi
  "$ENGINE" cp "$LAUNCHER:/tmp/$label.json" "$LOGDIR/$label.json"
  for host in "${HOSTS[@]}"; do  # one rank on each machine, not two on one
    grep -q "\"host\": \"$host\"" "$LOGDIR/$label.json" || die "$label: no rank ran on $host"
  done
  log "$label: passed in $((SECONDS - job_started)) s"
}

CHECK=(python docker/cluster_check.py)
GLOO=(horovodrun -np 2 -H c1:1,c2:1 --gloo --start-timeout 120)
MPI=(mpirun -np 2 -H c1,c2 --bind-to none --map-by slot -wdir "$WORKDIR"
     -x PATH -x PYTHONUNBUFFERED -x TF_CPP_MIN_LOG_LEVEL)

run_job gloo "${GLOO[@]}" "${CHECK[@]}"
run_job mpi "${MPI[@]}" "${CHECK[@]}"

for host in "${HOSTS[@]}"; do
  pid="$("$ENGINE" inspect --format '{{.State.Pid}}' "$PREFIX-$host")"
  nsenter -t "$pid" -n tc qdisc replace dev eth0 root tbf rate "$RATE" "${TBF[@]}"
done
log "egress of each container shaped: tbf rate $RATE ${TBF[*]} on eth0"

run_job "gloo-$RATE" "${GLOO[@]}" "${CHECK[@]}" --expect-faster
run_job "mpi-$RATE" "${MPI[@]}" "${CHECK[@]}" --expect-faster

for host in "${HOSTS[@]}"; do
  pid="$("$ENGINE" inspect --format '{{.State.Pid}}' "$PREFIX-$host")"
  log "$host: $(nsenter -t "$pid" -n tc -s qdisc show dev eth0 | tr -s ' \n' ' ')"
done
