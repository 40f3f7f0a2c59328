#!/usr/bin/env bash
# A turn in a conversation with 100,000 stored messages vs one with 10.
#
#   benches/history.sh           # MESSAGES=100000 TURNS=300 ROUNDS=2
#
# Builds both conversations through `colloquy::store::Store` (benches/fill_store.rs), starts
# colloquy (default history limit 20), then sends TURNS sequential turns into each (one in
# flight), alternating, and compares the latencies loadgen reports.
source "$(dirname "$0")/common.sh"
MESSAGES=${MESSAGES:-100000}
TURNS=${TURNS:-300}
ROUNDS=${ROUNDS:-2}
PORT=${PORT:-18097}
[ "${SKIP_BUILD:-}" = 1 ] || build
FILL=$(bench_bin fill_store)
WORK=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

timeout 600 "$FILL" --data "$WORK/d" --conversations 1 --messages 10 --prefix short --batch 2000
timeout 600 "$FILL" --data "$WORK/d" --conversations 1 --messages "$MESSAGES" --prefix long --batch 2000
"$COLLOQUY" serve --listen 127.0.0.1:$PORT --data "$WORK/d" 2>"$WORK/server.log" &
PID=$!
wait_ready $PORT
run() { # context-id label
  timeout 600 "$COLLOQUY" loadgen --url "http://127.0.0.1:$PORT/" --context-id "$1" \
    --turns "$TURNS" --json | tail -1 | jq -c --arg l "$2" '{label: $l, turns_ok, turns_per_s, latency_ms, error_total}'
}
RES="$WORK/res.jsonl"
for r in $(seq 1 "$ROUNDS"); do
  run short-0 "10 messages" >>"$RES"
  run long-0 "$MESSAGES messages" >>"$RES"
done
echo
echo "history: $TURNS sequential turns per run (latency ms)"
jq -r '"  \(.label): turns/s \(.turns_per_s | floor)  p50 \(.latency_ms.p50)  p90 \(.latency_ms.p90)  p99 \(.latency_ms.p99)  max \(.latency_ms.max)  errors \(.error_total)"' "$RES"
