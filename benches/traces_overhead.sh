#!/usr/bin/env bash
# What traces cost: the same server and load with traces off, and on (every turn sampled,
# exported over OTLP/HTTP to a collector that takes everything: benches/otlp_sink.py),
# alternating, ROUNDS times. Turns/s from the load generator; the server's CPU per turn from
# /proc/PID/stat (user + system), the collector's apart.
#
#   ROUNDS=3 benches/traces_overhead.sh      # C=64 TURNS=5 TOTAL=4096
source "$(dirname "$0")/common.sh"
C=${C:-64}; TURNS=${TURNS:-5}; TOTAL=${TOTAL:-4096}; ROUNDS=${ROUNDS:-3}
PORT=${PORT:-18099}; SINK_PORT=${SINK_PORT:-18100}
[ "${SKIP_BUILD:-}" = 1 ] || build
WORK=$(mktemp -d)
PID=; SINK=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null
  [ -n "$SINK" ] && kill "$SINK" 2>/dev/null
  wait 2>/dev/null; rm -rf "$WORK"
}
trap cleanup EXIT
python3 benches/otlp_sink.py "$SINK_PORT" &
SINK=$!
HZ=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # label, then env assignments for the server
  local label=$1; shift
  rm -rf "$WORK/d"
  env "$@" "$COLLOQUY" serve --listen 127.0.0.1:$PORT --data "$WORK/d" 2>/dev/null &
  PID=$!
  wait_ready $PORT
  "$COLLOQUY" loadgen --url "http://127.0.0.1:$PORT/" --conversations "$C" --turns 1 --total "$C" --json >/dev/null
  local before sink_before r after sink_after ok
  before=$(cpu $PID); sink_before=$(cpu $SINK)
  r=$("$COLLOQUY" loadgen --url "http://127.0.0.1:$PORT/" --conversations "$C" --turns "$TURNS" --total "$TOTAL" --json | tail -1)
  after=$(cpu $PID); sink_after=$(cpu $SINK)
  kill $PID; wait $PID 2>/dev/null || true; PID=
  ok=$(echo "$r" | jq .turns_ok)
  printf '%-4s turns/s %7.0f  p99 %6.1f ms  server CPU %4.0f us/turn  collector %4.0f us/turn\n' \
    "$label" "$(echo "$r" | jq .turns_per_s)" "$(echo "$r" | jq .latency_ms.p99)" \
    "$(echo "1000000 * ($after - $before) / $HZ / $ok" | bc -l)" \
    "$(echo "1000000 * ($sink_after - $sink_before) / $HZ / $ok" | bc -l)"
}
for round in $(seq "$ROUNDS"); do
  run off OTEL_SDK_DISABLED=false
  run on COLLOQUY_TELEMETRY__OTLP_ENDPOINT="http://127.0.0.1:$SINK_PORT" OTEL_TRACES_SAMPLER=always_on
done
