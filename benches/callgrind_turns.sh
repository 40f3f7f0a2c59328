#!/usr/bin/env bash
# Instructions per turn, counted by callgrind (noise-free: the same binary and load give the
# same count whatever else the machine does).
#
#   benches/callgrind_turns.sh [BINARY]        # default target/release/colloquy
#   C=64 TURNS=5 TOTAL=256 benches/callgrind_turns.sh
#   PG=1 benches/callgrind_turns.sh BINARY     # a node on a throwaway PostgreSQL
#   BASELINE=1 benches/callgrind_turns.sh PATH # the bare actix-web handler (benches/baseline_server.rs,
#                                              # `cargo bench --no-run --bench baseline_server` prints PATH)
#
# Runs `colloquy serve` under callgrind on a fresh data folder, warms up with one turn per
# conversation, zeroes the counters, runs TOTAL conversations x TURNS turns with the load
# generator (outside callgrind), stops the server and prints instructions per turn, in all and
# for the heaviest functions (inclusive; TOP=N of them). With
# VALGRIND_OPTS=--separate-threads=yes callgrind writes a file a thread: the count is their sum,
# followed by each thread's share and, for each thread with 5% or more, its heaviest functions.
#
# Checkpoints (the memtable moving into sled: each second once it holds 8 MiB, as at full speed)
# are left out by default (CHECKPOINT_MS=3600000): whether one lands in the measured window makes
# the count vary. CHECKPOINT_MS=1000 puts them back in, all of them: the 5,120 turns of
# TOTAL=1024 write more than 8 MiB into the memtable (one checkpoint during the load, of about
# 50,000 writes, half the run's), and the count goes on after the load until the next checkpoint
# has moved the rest (at most `store.checkpoint_max_wait_ms`, a minute, later; the idle server
# costs little meanwhile: its actors and kept windows expire), so that every measured turn's
# writes reach sled once.
# (Until 2026-12-06 the count stopped with the load, leaving the second half's checkpoint out.)
#
# PG=1 runs the node on a throwaway PostgreSQL instead (Debian's initdb/pg_ctl, as nobody when
# run as root; durable defaults): the count is then the node's instructions only.
set -euo pipefail
# The servers started here serve HTTP only (gRPC on, at its default port, would clash).
export COLLOQUY_GRPC_LISTEN="${COLLOQUY_GRPC_LISTEN-}"
cd "$(dirname "$0")/.."
BIN=${1:-target/release/colloquy}
C=${C:-64}; TURNS=${TURNS:-5}; TOTAL=${TOTAL:-256}; PORT=${PORT:-18131}
# The load generator: `colloquy loadgen` of BINARY, or of LOADGEN (the baseline has none).
if [ -n "${BASELINE:-}" ]; then LOADGEN=${LOADGEN:-target/release/colloquy}; else LOADGEN=${LOADGEN:-$BIN}; fi
WORK=$(mktemp -d); echo "work: $WORK" >&2
source benches/pg.sh
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; pg_stop "$WORK"; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
if [ -n "${PG:-}" ]; then
  DB_PORT=$((PORT + 1))
  pg_start "$WORK" "$DB_PORT" -c min_wal_size=1GB
  COLLOQUY_STORE__URL=$(pg_url "$DB_PORT")
  export COLLOQUY_STORE__URL
fi
# (The longest wait between checkpoints may not be below the interval: the server refuses it.)
EVERY_MS=${CHECKPOINT_MS:-3600000}
COLLOQUY_STORE__CHECKPOINT_INTERVAL_MS=$EVERY_MS \
  COLLOQUY_STORE__CHECKPOINT_MAX_WAIT_MS=$((EVERY_MS > 60000 ? EVERY_MS : 60000)) \
  valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" --instr-atstart=no \
  "$BIN" serve --listen 127.0.0.1:$PORT --data "$WORK/d" 2>"$WORK/vg.log" &
PID=$!
# The baseline has no /readyz (any answer means it listens) and no history for the echo check.
READY=(-sf "http://127.0.0.1:$PORT/readyz"); CHECK=()
[ -z "${BASELINE:-}" ] || { READY=(-s "http://127.0.0.1:$PORT/"); CHECK=(--no-echo-check); }
for _ in $(seq 1 600); do
  curl "${READY[@]}" -o /dev/null && break
  sleep 0.1
done
"$LOADGEN" loadgen --url "http://127.0.0.1:$PORT/" --conversations "$C" --turns 1 --total "$C" \
  --timeout-secs 120 "${CHECK[@]}" --json >/dev/null
callgrind_control --instr=on "$PID" >/dev/null 2>&1
R=$("$LOADGEN" loadgen --url "http://127.0.0.1:$PORT/" --conversations "$C" --turns "$TURNS" \
  --total "$TOTAL" --timeout-secs 300 "${CHECK[@]}" --json | tail -1)
if [ -n "${CHECKPOINT_MS:-}" ] && [ -z "${BASELINE:-}" ] && [ -z "${PG:-}" ]; then
  checkpoints() { curl -sf "http://127.0.0.1:$PORT/metrics" | awk '/^colloquy_store_checkpoint_seconds_count/ {print $2}'; }
  # Each look at /metrics is made with the count paused (rendering it is no turn's cost), and
  # the first only once the minute is past, so that the count is not paused mid-checkpoint.
  callgrind_control --instr=off "$PID" >/dev/null 2>&1
  AFTER_LOAD=$(checkpoints)
  callgrind_control --instr=on "$PID" >/dev/null 2>&1
  sleep 70
  for _ in $(seq 1 12); do
    callgrind_control --instr=off "$PID" >/dev/null 2>&1
    [ "$(checkpoints)" != "$AFTER_LOAD" ] && break
    callgrind_control --instr=on "$PID" >/dev/null 2>&1
    sleep 10
  done
  callgrind_control --instr=off "$PID" >/dev/null 2>&1
  [ "$(checkpoints)" != "$AFTER_LOAD" ] || echo "warning: no checkpoint after the load" >&2
fi
callgrind_control --instr=off "$PID" >/dev/null 2>&1
kill -TERM "$PID"
wait "$PID" || true
OK=$(echo "$R" | jq .turns_ok)
# Summed over the files: one, or one a thread under VALGRIND_OPTS=--separate-threads=yes.
# (awk stops reading early: the annotator's broken pipe is not a failure.)
total_ir() {
  callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}' || true
}
# The heaviest functions of a file, inclusive, per turn.
heaviest() {
  callgrind_annotate --inclusive=yes "$1" 2>/dev/null \
    | awk -v ok="$OK" '/^ *[0-9,]+ .*\(/ { n = $1; gsub(",", "", n); $1 = ""; printf "%10d /turn %s\n", n / ok, substr($0, 1, 150) }' \
    | head -"$2" || true
}
TOTAL_IR=0; BY_THREAD=""
for out in "$WORK"/cg.out*; do
  IR=$(total_ir "$out")
  if [[ "$IR" =~ ^[0-9]+$ ]]; then
    TOTAL_IR=$((TOTAL_IR + IR))
    BY_THREAD+="$IR $out"$'\n'
  fi
done
echo "turns: $OK  instructions: $TOTAL_IR  per turn: $((TOTAL_IR / OK))"
if compgen -G "$WORK/cg.out-*" >/dev/null; then
  # A file a thread: each thread's share, and the heaviest functions of those with 5% or more.
  # (callgrind numbers threads as they start: the heaviest are the HTTP worker, the arbiter,
  # the store thread and, with checkpoints, the checkpoint thread; the tables tell which.)
  printf '%s' "$BY_THREAD" | sort -rn | while read -r IR out; do
    [ $((IR * 20)) -ge "$TOTAL_IR" ] || continue
    echo "thread ${out##*cg.out-}: $((IR / OK)) a turn ($((IR * 100 / TOTAL_IR))%)"
    heaviest "$out" "${TOP:-20}"
  done
else
  heaviest "$WORK/cg.out" "${TOP:-40}"
fi
