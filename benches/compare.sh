#!/usr/bin/env bash
# colloquy vs the bare actix-web baseline, same loadgen, same machine, same run.
#
#   benches/compare.sh                # 64 and 1024 conversations x 5 turns x 200 B, v1.0
#   ROUNDS=3 benches/compare.sh       # repeat each pair, alternating, to see the noise
#   LEVELS="64 256" TURNS=5 benches/compare.sh
#
# Builds release; starts the baseline and colloquy (echo agent, default durable settings, a
# fresh temp data folder) on loopback; prints one table with turns/s ratios and latencies.
# Every run is bounded: fixed work, a per-request timeout, and `timeout` around each process.
set -euo pipefail
# The servers started here serve HTTP only (gRPC on, at its default port, would clash).
export COLLOQUY_GRPC_LISTEN="${COLLOQUY_GRPC_LISTEN-}"
cd "$(dirname "$0")/.."

LEVELS=${LEVELS:-"64 1024"}
TURNS=${TURNS:-5}
TEXT=${TEXT:-200}
ROUNDS=${ROUNDS:-1}
# Conversations per run: enough work for a few seconds at each level.
TOTAL_FACTOR=${TOTAL_FACTOR:-8}
BASE_PORT=${BASE_PORT:-18090}
COLL_PORT=${COLL_PORT:-18091}

echo "building release..." >&2
[ -n "${COLLOQUY:-}" ] || cargo build --release --bin colloquy >&2
BASELINE=$(cargo bench --no-run --bench baseline_server --message-format=json 2>/dev/null \
  | jq -r 'select(.executable != null and .target.name == "baseline_server") | .executable' | tail -1)
COLLOQUY=${COLLOQUY:-target/release/colloquy}
[ -x "$BASELINE" ] || { echo "baseline_server binary not found" >&2; exit 1; }

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

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # name port server-pid conversations extra-args...
  local name=$1 port=$2 pid=$3 c=$4; shift 4
  local total=$((c * TOTAL_FACTOR)) before after
  before=$(cpu_ticks "$pid")
  timeout 600 "$COLLOQUY" loadgen --url "http://127.0.0.1:$port/" --conversations "$c" \
    --turns "$TURNS" --total "$total" --text-bytes "$TEXT" --version 1.0 --timeout-secs 60 \
    --json "$@" | tail -1 >"$WORK/last.json" || true
  after=$(cpu_ticks "$pid")
  jq -c --arg name "$name" --argjson ticks $((after - before)) --argjson hz "$(getconf CLK_TCK)" \
    '. + {name: $name, server_cpu_s: ($ticks / $hz)}' "$WORK/last.json"
}

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
echo "nproc=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)" >&2
for round in $(seq 1 "$ROUNDS"); do
  for c in $LEVELS; do
    # Warm both (connections, allocator, page cache), then measure, alternating the order.
    TOTAL_FACTOR=1 run warm "$BASE_PORT" "$BASE_PID" "$c" --no-echo-check >/dev/null
    TOTAL_FACTOR=1 run warm "$COLL_PORT" "$COLL_PID" "$c" >/dev/null
    if [ $((round % 2)) -eq 1 ]; then
      run baseline "$BASE_PORT" "$BASE_PID" "$c" --no-echo-check >>"$RESULTS"
      run colloquy "$COLL_PORT" "$COLL_PID" "$c" >>"$RESULTS"
    else
      run colloquy "$COLL_PORT" "$COLL_PID" "$c" >>"$RESULTS"
      run baseline "$BASE_PORT" "$BASE_PID" "$c" --no-echo-check >>"$RESULTS"
    fi
  done
done
echo "load after=$(cut -d' ' -f1-3 /proc/loadavg)" >&2

RSS_KB=$(awk '/VmRSS/ {print $2}' /proc/"$COLL_PID"/status 2>/dev/null || echo "?")
cp "$RESULTS" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true
python3 - "$RESULTS" "$RSS_KB" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print()
print(f"{'conv':>6} {'server':<9} {'turns/s':>9} {'ratio':>6} {'p50 ms':>8} {'p90':>7} {'p99':>7} {'p999':>7} {'max':>7} {'cpu us/turn':>11} {'ok/sent':>13} errors")
by = {}
for r in rows:
    by.setdefault(r['conversations'], []).append(r)
for c, rs in sorted(by.items()):
    base = [r for r in rs if r['name'] == 'baseline']
    for r in rs:
        # Ratio against the baseline run next to it (same round).
        idx = [x for x in rs if x['name'] == r['name']].index(r)
        b = base[idx] if idx < len(base) else None
        ratio = r['turns_per_s'] / b['turns_per_s'] if b and b['turns_per_s'] else float('nan')
        l = r['latency_ms']
        errs = ",".join(f"{k}={v}" for k, v in r['errors'].items()) or "0"
        print(f"{c:>6} {r['name']:<9} {r['turns_per_s']:>9.0f} {ratio:>6.2f} {l['p50']:>8.2f} {l['p90']:>7.2f} {l['p99']:>7.2f} {l['p999']:>7.2f} {l['max']:>7.1f} {1e6 * r['server_cpu_s'] / max(r['turns_ok'], 1):>11.0f} {str(r['turns_ok'])+'/'+str(r['turns_sent']):>13} {errs}")
print(f"\ncolloquy RSS at the end: {sys.argv[2]} KiB")
EOF
