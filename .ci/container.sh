#!/usr/bin/env bash
# The container, built and run: a Debian bookworm base made here with mmdebstrap (no registry is
# needed), the Dockerfile's runtime stage built on it with podman around a release binary built
# on this host (`--target prebuilt`: the `build` stage needs a Rust toolchain image), then checks
# against the running container:
#   1. it runs as its non-root user; the agent card and /healthz answer; the image's HEALTHCHECK
#      passes; it runs with a read-only root filesystem (as deploy/kubernetes does);
#   2. a two-turn conversation keeps its history;
#   3. the data survives stopping it and starting a new container on the same volume;
#   4. `podman stop` (SIGTERM) lets a running turn finish and the container exits by itself
#      within the grace, and that turn is stored;
#   5. under --memory 256m it sees the limit and serves a short load, the process peaking below
#      three quarters of it.
# Needs root (CI runs it so). Everything it makes (podman storage, containers, images, volumes)
# lives in a temporary folder and is removed at exit. Any failed check exits non-zero.
#
#   bash .ci/container.sh                           # builds the release binary first
#   COLLOQUY_BINARY=target/release/colloquy bash .ci/container.sh   # or takes this one
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$PWD"

started=$SECONDS
step_started=$SECONDS
say() { echo "container: [$((SECONDS - started))s] $*"; }
step() {
    say "$* (previous step: $((SECONDS - step_started))s)"
    step_started=$SECONDS
}
fail() {
    echo "container: FAILED: $*" >&2
    exit 1
}

# --- Tools ---------------------------------------------------------------------------------------
need=()
for tool in podman runc mmdebstrap curl python3; do
    command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
command -v strip >/dev/null 2>&1 || need+=(binutils)
# mmdebstrap's eatmydata hook runs dpkg-architecture (dpkg-dev, only recommended by mmdebstrap).
command -v dpkg-architecture >/dev/null 2>&1 || need+=(dpkg-dev)
if [ ${#need[@]} -gt 0 ]; then
    step "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

work="$(mktemp -d /tmp/colloquy-container.XXXXXX)"
# Its own podman storage: nothing of the machine's images is used or touched.
podman=(podman --root "$work/storage" --runroot "$work/run" --storage-driver vfs
    --runtime runc --cgroup-manager cgroupfs --events-backend file)
# crun refuses this machine's hybrid cgroups; the default limits exceed its hard limits.
run_flags=(--network host --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 --log-driver k8s-file)
# Without systemd, podman logs errors about healthcheck timers on every run and stop (the
# HEALTHCHECK itself is run below with `podman healthcheck run`): shown only when a command fails.
quietly() {
    "$@" 2>"$work/stderr" || { cat "$work/stderr" >&2; return 1; }
}
tag="colloquy-ci:$$"
volume="colloquy-ci-data-$$"
containers=()
debootstrap_pid=""
cleanup() {
    status=$?
    set +e
    [ -n "$debootstrap_pid" ] && kill "$debootstrap_pid" 2>/dev/null && wait "$debootstrap_pid"
    for container in "${containers[@]}"; do
        if [ "$status" -ne 0 ]; then
            echo "--- logs of $container (last 30 lines)" >&2
            "${podman[@]}" logs "$container" 2>&1 | tail -30 >&2
        fi
        "${podman[@]}" rm -f -t 0 "$container" >/dev/null 2>&1
    done
    "${podman[@]}" volume rm -f "$volume" >/dev/null 2>&1
    "${podman[@]}" rmi -f "$tag" debian:bookworm-slim >/dev/null 2>&1
    rm -rf "$work"
    say "cleaned up; $([ "$status" -eq 0 ] && echo "all checks passed" || echo "FAILED ($status)")"
    exit "$status"
}
trap cleanup EXIT
trap "exit 143" TERM INT

# --- A Debian bookworm base, made locally (in the background, while the binary builds) ----------
# minbase with what debian:bookworm-slim leaves out (documentation, man pages, translations) left
# out too; merged /usr as in the official images (dpkg under eatmydata: no fsync while unpacking).
# The runtime stage adds no packages: TLS roots are compiled into the binary, and the
# HEALTHCHECK is `colloquy healthcheck`.
step "making a Debian bookworm root filesystem with mmdebstrap (in the background)"
mmdebstrap --variant=minbase --mode=root --format=tar --quiet \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --hook-dir=/usr/share/mmdebstrap/hooks/eatmydata \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    bookworm "$work/bookworm.tar" >"$work/mmdebstrap.log" 2>&1 &
debootstrap_pid=$!

# --- The release binary ----------------------------------------------------------------------------
mkdir "$work/context"
if [ -n "${COLLOQUY_BINARY:-}" ]; then
    step "taking the binary $COLLOQUY_BINARY"
    binary="$COLLOQUY_BINARY"
else
    step "building the release binary (cargo build --release --locked --bin colloquy)"
    cargo build --release --locked --bin colloquy
    binary="${CARGO_TARGET_DIR:-$repo/target}/release/colloquy"
fi
# As the Dockerfile's build stage does (CARGO_PROFILE_RELEASE_STRIP=debuginfo): no line tables.
strip --strip-debug -o "$work/context/colloquy" "$binary"
chmod 0755 "$work/context/colloquy"
say "binary: $(du -m "$binary" | cut -f1) MB, $(du -m "$work/context/colloquy" | cut -f1) MB without debug info"

step "waiting for mmdebstrap"
if ! wait "$debootstrap_pid"; then
    debootstrap_pid=""
    cat "$work/mmdebstrap.log" >&2
    fail "mmdebstrap"
fi
debootstrap_pid=""
"${podman[@]}" import -q "$work/bookworm.tar" debian:bookworm-slim >/dev/null
rm -f "$work/bookworm.tar"

# --- The image -----------------------------------------------------------------------------------
step "building the runtime stage (podman build --target prebuilt)"
# Docker format: OCI images have no HEALTHCHECK. No layer per instruction: with vfs each is a
# whole copy of the file system.
"${podman[@]}" build --pull=never --layers=false --format docker --target prebuilt -f "$repo/Dockerfile" \
    -t "$tag" "$work/context" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; fail "podman build"; }
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$tag")
base_size=$("${podman[@]}" image inspect --format '{{.Size}}' debian:bookworm-slim)
mb() { awk -v bytes="$1" 'BEGIN { printf "%.1f MB", bytes / 1e6 }'; }
say "image $tag: $(mb "$size") ($(mb "$base_size") of it the Debian base)"

# --- Checks --------------------------------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
# The image serves gRPC on 0.0.0.0:8081; on the host's network it gets a free port of its own.
grpc_port=$(free_port)
url="http://127.0.0.1:$port/"
token="ci-token-$$"
"${podman[@]}" volume create "$volume" >/dev/null

# Starts a container named $1 on the volume with the extra flags that follow, and waits for it.
start() {
    local name=$1
    shift
    containers+=("$name")
    quietly "${podman[@]}" run -d --name "$name" "${run_flags[@]}" -v "$volume:/data" \
        -e COLLOQUY_LISTEN="127.0.0.1:$port" -e COLLOQUY_GRPC_LISTEN="127.0.0.1:$grpc_port" \
        -e COLLOQUY_TOKENS="ci:$token" "$@" "$tag" >/dev/null ||
        fail "podman run $name"
    for _ in $(seq 1 150); do
        curl -fsS -o /dev/null "${url}healthz" 2>/dev/null && return 0
        [ "$("${podman[@]}" inspect --format '{{.State.Running}}' "$name")" = true ] ||
            fail "$name exited at start"
        sleep 0.2
    done
    fail "$name: /healthz did not answer within 30 s"
}

# Sends one message (v1.0 SendMessage) into context $1 and prints the reply's text.
send() {
    local context=$1 text=$2 response
    response=$(curl -fsS -H "Authorization: Bearer $token" -H 'A2A-Version: 1.0' \
        -H 'Content-Type: application/json' --max-time 60 "$url" -d "$(python3 -c '
import json, sys, uuid
print(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
    "messageId": str(uuid.uuid4()), "role": "ROLE_USER", "contextId": sys.argv[1],
    "parts": [{"text": sys.argv[2]}]}}}))' "$context" "$text")") || fail "sending $text: curl $?"
    python3 -c '
import json, sys
response = json.loads(sys.argv[1])
task = response.get("result", {}).get("task")
if task is None or task["status"]["state"] != "TASK_STATE_COMPLETED":
    sys.exit("not a completed task: " + sys.argv[1])
print("".join(p.get("text", "") for a in task.get("artifacts", []) for p in a["parts"]))' "$response" ||
        fail "reply to $text"
}

# The reply $1 must contain $2.
expect() {
    case "$1" in
        *"$2"*) say "  ok: ${3:-reply holds $2}" ;;
        *) fail "${3:-reply}: expected $2 in: $1" ;;
    esac
}

step "1. the container serves as its non-root user"
start colloquy-ci-a-$$ --read-only --read-only-tmpfs=false
a=colloquy-ci-a-$$
card=$(curl -fsS "${url}.well-known/agent-card.json") || fail "agent card"
expect "$card" '"name"' "the agent card answers"
expect "$card" "\"protocolBinding\":\"GRPC\",\"protocolVersion\":\"1.0\",\"url\":\"127.0.0.1:$grpc_port\"" \
    "the card lists the gRPC binding"
python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 5).close()' \
    "$grpc_port" || fail "the gRPC port does not accept connections"
say "  ok: the gRPC port accepts connections"
expect "$(curl -fsS "${url}healthz")" '"ok"' "/healthz answers"
expect "$(curl -fsS "${url}readyz")" '"ready"' "/readyz answers"
"${podman[@]}" healthcheck run "$a" >/dev/null || fail "the image's HEALTHCHECK fails"
say "  ok: the image's HEALTHCHECK (colloquy healthcheck) passes"
uid=$("${podman[@]}" exec "$a" id -u)
pid1_uid=$("${podman[@]}" exec "$a" sh -c 'grep ^Uid: /proc/1/status' | awk '{print $2}')
user=$("${podman[@]}" exec "$a" id -un)
[ "$uid" != 0 ] && [ "$pid1_uid" = "$uid" ] || fail "runs as uid $uid (process 1: $pid1_uid)"
if "${podman[@]}" exec "$a" sh -c 'touch /probe' 2>/dev/null; then
    fail "the root filesystem is writable"
fi
say "  ok: process 1 runs as $user (uid $uid), with a read-only root filesystem"

step "2. a two-turn conversation keeps its history"
context="ci-conversation-$$"
first="the first turn $RANDOM"
second="the second turn $RANDOM"
reply=$(send "$context" "$first")
expect "$reply" "(turn 1)"
reply=$(send "$context" "$second")
expect "$reply" "turn 2; previously: \"$first\""

step "3. the data survives a new container on the same volume"
quietly "${podman[@]}" stop -t 20 "$a" >/dev/null
# Echo slowly from here on: 60 ms before each 2-character chunk, a turn of about 3 s; running
# turns get 10 s at SIGTERM, podman stop 12 (the README's advice: the grace and two seconds).
start colloquy-ci-b-$$ -e COLLOQUY_AGENT__ECHO__CHUNK_CHARS=2 -e COLLOQUY_AGENT__ECHO__DELAY_MS=60 \
    -e COLLOQUY_SHUTDOWN__GRACE_SECS=10
b=colloquy-ci-b-$$
third="the third turn $RANDOM"
reply=$(send "$context" "$third")
expect "$reply" "turn 3; previously: \"$second\""

step "4. SIGTERM lets a running turn finish, and the container exits within the grace"
fourth="the fourth turn $RANDOM, interrupted by podman stop"
send "$context" "$fourth" >"$work/fourth" 2>"$work/fourth.err" &
sender=$!
sleep 1
kill -0 "$sender" 2>/dev/null || fail "the fourth turn ended before SIGTERM: make the echo slower"
stop_started=$(date +%s.%N)
quietly "${podman[@]}" stop -t 12 "$b" >/dev/null
stop_took=$(python3 -c "import time; print(f'{time.time() - $stop_started:.1f}')")
wait "$sender" || fail "the turn running at SIGTERM: $(cat "$work/fourth.err")"
expect "$(cat "$work/fourth")" "turn 4; previously: \"$third\"" "the turn running at SIGTERM completed"
exit_code=$("${podman[@]}" inspect --format '{{.State.ExitCode}}' "$b")
[ "$exit_code" = 0 ] || fail "exit status $exit_code after SIGTERM (137: killed at the end of the grace)"
"${podman[@]}" logs "$b" 2>&1 | grep -q 'the store is flushed' || fail "no 'store is flushed' in the log"
say "  ok: stopped in ${stop_took}s (podman stop -t 12) with status 0, store flushed"

step "5. under --memory 256m it serves a short load"
start colloquy-ci-m-$$ --memory 256m --memory-swap 256m
m=colloquy-ci-m-$$
reply=$(send "$context" "the fifth turn")
expect "$reply" "turn 5; previously: \"$fourth\"" "the turn finished during shutdown is stored"
limit=$("${podman[@]}" exec "$m" sh -c \
    'cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes')
[ "$limit" = 268435456 ] || fail "the container's memory limit reads $limit"
say "  ok: the container's cgroup limit reads $limit bytes"
load_started=$SECONDS
COLLOQUY_LOADGEN_TOKEN="$token" "$binary" loadgen --url "$url" --conversations 32 --turns 5 \
    --duration 20 --json >"$work/load.json" || fail "loadgen: $(cat "$work/load.json")"
python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
ok, sent, errors = r["turns_ok"], r["turns_sent"], r["error_total"]
rate, p99 = r["turns_per_s"], r["latency_ms"]["p99"]
print(f"container: [{sys.argv[2]}s]   loadgen: {ok} turns ok of {sent}, {rate:.0f} turns/s, "
      f"p99 {p99:.1f} ms, errors {errors}")
sys.exit(0 if ok > 0 and errors == 0 else 1)' \
    "$work/load.json" "$((SECONDS - started))" || fail "loadgen errors"
state=$("${podman[@]}" inspect --format '{{.State.Running}} {{.State.OOMKilled}}' "$m")
[ "$state" = "true false" ] || fail "after the load: running, OOM-killed = $state"
peak=$("${podman[@]}" exec "$m" sh -c \
    'cat /sys/fs/cgroup/memory.peak 2>/dev/null || cat /sys/fs/cgroup/memory/memory.max_usage_in_bytes')
curl -fsS -o /dev/null "${url}healthz" || fail "/healthz after the load"
# The cgroup's peak counts the page cache the kernel reclaims at will; the process's own peak
# (VmHWM) is what an OOM kill follows. Its budgets take about half the limit: three quarters is
# the line (past it, a busier machine than this one's would kill it).
hwm_kb=$("${podman[@]}" exec "$m" sh -c 'grep ^VmHWM: /proc/1/status' | awk '{print $2}')
[ "$hwm_kb" -le $((192 * 1024)) ] || fail "the process peaked at $((hwm_kb / 1024)) MiB of 256 (over 192)"
say "  ok: $((SECONDS - load_started))s of load, still serving, not OOM-killed; peak $((hwm_kb / 1024)) MiB resident, the cgroup's $((peak / 1048576)) MiB with the page cache, of 256"
quietly "${podman[@]}" stop -t 20 "$m" >/dev/null

step "done: image $(mb "$size"); total $((SECONDS - started))s"
