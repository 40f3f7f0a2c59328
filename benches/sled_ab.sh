#!/usr/bin/env bash
# Two builds (or two settings) against each other on one node with the embedded store,
# alternating, each run on a fresh data folder: turns/s, p99, the server's CPU per turn
# (/proc/PID/stat), bytes it wrote to the device per turn (/proc/PID/io) and the folder's size
# per turn after a clean stop (coarse: sled grows its file a segment at a time).
#
#   benches/sled_ab.sh OLD_BINARY NEW_BINARY                  # 3 rounds
#   ROUNDS=4 TOTAL=4096 benches/sled_ab.sh OLD NEW
#   NEW_ENV="COLLOQUY_STORE__COMPRESSION_LEVEL=1" benches/sled_ab.sh BIN BIN   # a setting
#
# Builds nothing. A run warms up with 512 turns, then measures 64 conversations x 5 turns x
# 200 B, TOTAL conversations (v1.0). Keep the machine otherwise idle.
set -euo pipefail
# The servers started here serve HTTP only (gRPC on, at its default port, would clash).
export COLLOQUY_GRPC_LISTEN="${COLLOQUY_GRPC_LISTEN-}"
[ $# -eq 2 ] || { echo "usage: $0 OLD_BINARY NEW_BINARY" >&2; exit 2; }
BINARIES=("$(realpath "$1")" "$(realpath "$2")")
ENVS=("${OLD_ENV:-}" "${NEW_ENV:-}")
ROUNDS=${ROUNDS:-3} TOTAL=${TOTAL:-4096} PORT=${PORT:-18450}
URL="http://127.0.0.1:$PORT/"
source "$(dirname "$0")/ab.sh"

load() { # binary conversations -> the load generator's summary line
  "$1" loadgen --url "$URL" --conversations 64 --turns 5 --total "$2" --text-bytes 200 \
    --version 1.0 --json | tail -1
}

# A run's server, stopped however the run ends (it runs in a subshell of its pipeline).
stop_run() {
  kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}

one_run() { # which label -> one result line
  local bin=${BINARIES[$1]} label=$2
  work=$(mktemp -d) pid=""
  trap stop_run EXIT
  # shellcheck disable=SC2086 # the settings are words of `env`
  env ${ENVS[$1]} "$bin" serve --listen "127.0.0.1:$PORT" --data "$work/data" 2>"$work/log" &
  pid=$!
  for _ in $(seq 1 200); do curl -sf -o /dev/null "${URL}readyz" && break; sleep 0.05; done
  load "$bin" 512 >/dev/null
  local cpu0 io0 summary cpu1 io1 folder
  cpu0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  io0=$(awk '/^write_bytes/ {print $2}' "/proc/$pid/io")
  summary=$(load "$bin" "$TOTAL")
  cpu1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  io1=$(awk '/^write_bytes/ {print $2}' "/proc/$pid/io")
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  folder=$(du -sb "$work/data" | cut -f1)
  echo "$summary" | jq -c --arg build "$label" --argjson hz "$(getconf CLK_TCK)" \
    --argjson cpu "$((cpu1 - cpu0))" --argjson written "$((io1 - io0))" --argjson folder "$folder" \
    --argjson warm 2560 \
    '{label: $build, turns_per_s, p99: .latency_ms.p99, errors: (.errors | add // 0),
      cpu_us: (1e6 * $cpu / $hz / .turns_ok), written: ($written / .turns_ok),
      folder: ($folder / (.turns_ok + $warm))}'
}

echo "rounds=$ROUNDS load=$(cut -d' ' -f1-3 /proc/loadavg)" >&2
RESULTS=$(mktemp)
ab_rounds
printf '%-4s %9s %8s %7s %12s %16s %16s\n' build turns/s "p99 ms" errors "CPU us/turn" \
  "written B/turn" "folder B/turn"
jq -r '[.label, (.turns_per_s | floor), .p99, .errors, (.cpu_us | floor), (.written | floor),
        (.folder | floor)] | @tsv' "$RESULTS" | sort -s -k1,1r |
  awk -F'\t' '{printf "%-4s %9s %8s %7s %12s %16s %16s\n", $1, $2, $3, $4, $5, $6, $7}'
rm -f "$RESULTS"
