#!/usr/bin/env bash
# colloquy vs the bare actix-web baseline and vs the official Rust A2A SDK, same loadgen, same
# machine, same run.
#
#   benches/compare.sh                # 64 and 1024 conversations x 5 turns x 200 B, v1.0
#   ROUNDS=3 benches/compare.sh       # repeat each set, order reversed every other round, to see the noise
#   LEVELS="64 256" TURNS=5 benches/compare.sh
#   SDK=0 benches/compare.sh          # baseline and colloquy only
#   SDK_ECHO=path benches/compare.sh  # a prebuilt sdk_echo instead of building it (SDK_WORKERS=2)
#
# Builds release; starts on loopback the baseline (what HTTP + JSON alone cost), the SDK peer
# `rust-sdk` (benches/sdk_echo: a2a-server-lf from crates.io with its in-memory task store and an
# echo executor; its own workspace and lock file, built here into target/sdk_echo so the root
# build never compiles it), and colloquy (echo agent, default durable settings, a fresh temp data
# folder); prints one table with turns/s ratios against the baseline, latencies and server CPU
# per turn, then colloquy's turns/s over rust-sdk's per level, each pair from the same round.
# Both answer every turn the same way (the loadgen checks the echo of both); the SDK keeps its
# tasks in memory only, while colloquy writes every turn durably, and that ratio includes it.
# Every run is bounded: fixed work, a per-request timeout, and `timeout` around each process.
set -euo pipefail
# The servers started here serve HTTP only (gRPC on, at its default port, would clash).
export COLLOQUY_GRPC_LISTEN="${COLLOQUY_GRPC_LISTEN-}"
cd "$(dirname "$0")/.."

LEVELS=${LEVELS:-"64 1024"}
TURNS=${TURNS:-5}
TEXT=${TEXT:-200}
ROUNDS=${ROUNDS:-1}
# Conversations per run: TOTAL_FACTOR times the level, and at least MIN_TOTAL (a run at 64 of
# 512 conversations lasted about 0.2 s, too short to tell a server from the machine's noise).
TOTAL_FACTOR=${TOTAL_FACTOR:-8}
MIN_TOTAL=${MIN_TOTAL:-2560}
BASE_PORT=${BASE_PORT:-18090}
COLL_PORT=${COLL_PORT:-18091}
SDK_PORT=${SDK_PORT:-18092}
SDK=${SDK:-1}

echo "building release..." >&2
[ -n "${COLLOQUY:-}" ] || cargo build --release --bin colloquy >&2
BASELINE=$(cargo bench --no-run --bench baseline_server --message-format=json 2>/dev/null \
  | jq -r 'select(.executable != null and .target.name == "baseline_server") | .executable' | tail -1)
COLLOQUY=${COLLOQUY:-target/release/colloquy}
[ -x "$BASELINE" ] || { echo "baseline_server binary not found" >&2; exit 1; }
if [ "$SDK" != 0 ] && [ -z "${SDK_ECHO:-}" ]; then
  # Its own target dir under target/: the crate is its own workspace (separate lock file), and
  # sharing the root's target dir would make the two builds invalidate each other's artifacts.
  CARGO_TARGET_DIR=target/sdk_echo cargo build --release \
    --manifest-path benches/sdk_echo/Cargo.toml >&2
  SDK_ECHO=target/sdk_echo/release/sdk_echo
fi
[ "$SDK" = 0 ] || [ -x "$SDK_ECHO" ] || { echo "sdk_echo binary not found: $SDK_ECHO" >&2; exit 1; }

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

wait_port() { # url
  for _ in $(seq 1 200); do
    curl -s -o /dev/null -X POST -H 'content-type: application/json' -d '{}' "$1" && return 0
    sleep 0.05
  done
  echo "server at $1 did not come up" >&2; return 1
}

"$BASELINE" --listen 127.0.0.1:$BASE_PORT 2>"$WORK/baseline.log" &
BASE_PID=$!
PIDS+=($BASE_PID)
"$COLLOQUY" serve --listen 127.0.0.1:$COLL_PORT --data "$WORK/data" \
  --log-format json 2>"$WORK/colloquy.log" &
COLL_PID=$!
PIDS+=($COLL_PID)
wait_port "http://127.0.0.1:$BASE_PORT/"
wait_port "http://127.0.0.1:$COLL_PORT/"
ORDER="baseline colloquy"
SDK_PID=
if [ "$SDK" != 0 ]; then
  # Two workers, as colloquy runs on the 2-core machine these numbers come from.
  "$SDK_ECHO" --listen 127.0.0.1:$SDK_PORT --workers "${SDK_WORKERS:-2}" 2>"$WORK/sdk.log" &
  SDK_PID=$!
  PIDS+=($SDK_PID)
  wait_port "http://127.0.0.1:$SDK_PORT/"
  ORDER="baseline rust-sdk colloquy"
fi

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # name port server-pid conversations extra-args...
  local name=$1 port=$2 pid=$3 c=$4; shift 4
  local total=$((c * TOTAL_FACTOR)) before after
  [ "$total" -ge "$MIN_TOTAL" ] || total=$MIN_TOTAL
  before=$(cpu_ticks "$pid")
  timeout 600 "$COLLOQUY" loadgen --url "http://127.0.0.1:$port/" --conversations "$c" \
    --turns "$TURNS" --total "$total" --text-bytes "$TEXT" --version 1.0 --timeout-secs 60 \
    --json "$@" | tail -1 >"$WORK/last.json" || true
  after=$(cpu_ticks "$pid")
  jq -c --arg name "$name" --argjson ticks $((after - before)) --argjson hz "$(getconf CLK_TCK)" \
    '. + {name: $name, server_cpu_s: ($ticks / $hz)}' "$WORK/last.json"
}

# One server by name. The baseline skips the echo check: it has no history to quote.
measure() { # name conversations
  case $1 in
    baseline) run baseline "$BASE_PORT" "$BASE_PID" "$2" --no-echo-check ;;
    rust-sdk) run rust-sdk "$SDK_PORT" "$SDK_PID" "$2" ;;
    colloquy) run colloquy "$COLL_PORT" "$COLL_PID" "$2" ;;
  esac
}

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
echo "nproc=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)" >&2
for round in $(seq 1 "$ROUNDS"); do
  for c in $LEVELS; do
    # Warm each (connections, allocator, page cache), then measure, the order reversed every
    # other round so no server always runs first (or right after another's load).
    order=$ORDER
    [ $((round % 2)) -eq 1 ] || order=$(echo "$ORDER" | tr ' ' '\n' | tac | tr '\n' ' ')
    for name in $order; do TOTAL_FACTOR=1 MIN_TOTAL=0 measure "$name" "$c" >/dev/null; done
    for name in $order; do measure "$name" "$c" >>"$RESULTS"; done
  done
done
echo "load after=$(cut -d' ' -f1-3 /proc/loadavg)" >&2

RSS_KB=$(awk '/VmRSS/ {print $2}' /proc/"$COLL_PID"/status 2>/dev/null || echo "?")
SDK_RSS_KB=$( [ -n "$SDK_PID" ] && awk '/VmRSS/ {print $2}' /proc/"$SDK_PID"/status 2>/dev/null || echo "?")
cp "$RESULTS" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true
python3 - "$RESULTS" "$RSS_KB" "$SDK_RSS_KB" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print()
print(f"{'conv':>6} {'server':<9} {'turns/s':>9} {'ratio':>6} {'p50 ms':>8} {'p90':>7} {'p99':>7} {'p999':>7} {'max':>7} {'cpu us/turn':>11} {'ok/sent':>13} errors")
by = {}
for r in rows:
    by.setdefault(r['conversations'], []).append(r)
def runs_of(rs, name):
    """One server's runs at one level, in round order."""
    return [r for r in rs if r['name'] == name]
for c, rs in sorted(by.items()):
    base = runs_of(rs, 'baseline')
    for r in rs:
        # Ratio against the baseline run next to it (same round).
        idx = runs_of(rs, r['name']).index(r)
        b = base[idx] if idx < len(base) else None
        ratio = r['turns_per_s'] / b['turns_per_s'] if b and b['turns_per_s'] else float('nan')
        l = r['latency_ms']
        errs = ",".join(f"{k}={v}" for k, v in r['errors'].items()) or "0"
        print(f"{c:>6} {r['name']:<9} {r['turns_per_s']:>9.0f} {ratio:>6.2f} {l['p50']:>8.2f} {l['p90']:>7.2f} {l['p99']:>7.2f} {l['p999']:>7.2f} {l['max']:>7.1f} {1e6 * r['server_cpu_s'] / max(r['turns_ok'], 1):>11.0f} {str(r['turns_ok'])+'/'+str(r['turns_sent']):>13} {errs}")
# colloquy's turns/s over the SDK peer's, each pair from the same round; the median when several.
lines = []
for c, rs in sorted(by.items()):
    pairs = zip(runs_of(rs, 'colloquy'), runs_of(rs, 'rust-sdk'))
    ratios = [a['turns_per_s'] / b['turns_per_s'] for a, b in pairs if b['turns_per_s']]
    if ratios:
        line = f"{c:>6} colloquy / rust-sdk: {statistics.median(ratios):.2f}x"
        if len(ratios) > 1:
            line += " (by round: " + " ".join(f"{x:.2f}x" for x in ratios) + ")"
        lines.append(line)
if lines:
    print("\n" + "\n".join(lines))
print(f"\ncolloquy RSS at the end: {sys.argv[2]} KiB")
if sys.argv[3] != "?":
    print(f"rust-sdk RSS at the end: {sys.argv[3]} KiB (every task in its in-memory store)")
EOF
