#!/usr/bin/env bash
# Ready after a crash at full load: how long a server takes to answer /readyz on a data folder
# it last saw killed with SIGKILL while 64 conversations were in flight.
#
#   benches/crash_open.sh FOLDER                 # a data folder to start from (left untouched)
#   SECS=30 OPENS=5 benches/crash_open.sh FOLDER
#
# FOLDER is a stored data folder, such as the one `KEEP=1 WORK=DIR benches/soak.sh` leaves in
# DIR/data. A copy of it is served under load for SECS seconds (64 in flight, 5 turns x 200 B),
# then killed with SIGKILL mid-load; that crashed folder is set aside, and each of OPENS opens
# starts `serve` on a fresh copy of it and times it to /readyz (the log not yet checkpointed is
# replayed every time, as after the crash itself). Prints the turns before the kill, the size of
# the log folder (segments and the spare) and each open's time and RSS. Needs twice FOLDER's
# size free on its disk.
[ $# -eq 1 ] && [ -d "$1" ] || { echo "usage: $0 DATA_FOLDER" >&2; exit 2; }
SOURCE=$(realpath "$1") # before common.sh moves to the repository's root
source "$(dirname "$0")/common.sh"
SECS=${SECS:-30} OPENS=${OPENS:-5} PORT=${PORT:-18470}
WORK=$(mktemp -d -p "$(dirname "$SOURCE")")
PID=""
cleanup() {
  [ -z "$PID" ] || kill -9 "$PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

cp -a "$SOURCE" "$WORK/crashed"
"$COLLOQUY" serve --listen 127.0.0.1:$PORT --data "$WORK/crashed" 2>"$WORK/server.log" &
PID=$!
wait_ready $PORT 60
"$COLLOQUY" loadgen --url "http://127.0.0.1:$PORT/" --conversations 64 --turns 5 \
  --total 100000000 --text-bytes 200 --version 1.0 --timeout-secs 10 --json \
  >"$WORK/load.out" 2>&1 &
LOAD=$!
sleep "$SECS"
turns=$(metric $PORT 'colloquy_tasks_total{state="completed"}' || true)
kill -9 "$PID"
wait "$PID" 2>/dev/null || true
PID=""
kill "$LOAD" 2>/dev/null || true
wait "$LOAD" 2>/dev/null || true
log_bytes=$(du -sb "$WORK/crashed/wal" 2>/dev/null | cut -f1 || echo "?")
echo "killed after ${SECS}s of load (${turns:-?} turns completed by this server); log folder ${log_bytes} bytes"

echo "| open | ready ms | RSS MB |"
echo "|---:|---:|---:|"
for open in $(seq 1 "$OPENS"); do
  rm -rf "$WORK/open"
  cp -a "$WORK/crashed" "$WORK/open"
  sync
  started=$(now_ms)
  "$COLLOQUY" serve --listen 127.0.0.1:$PORT --data "$WORK/open" 2>>"$WORK/server.log" &
  PID=$!
  wait_ready $PORT 120
  ready=$(( $(now_ms) - started ))
  echo "| $open | $ready | $(( $(rss_kb "$PID") / 1024 )) |"
  kill -TERM "$PID"
  wait "$PID" 2>/dev/null || true
  PID=""
done
