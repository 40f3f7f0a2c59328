#!/usr/bin/env bash
# Resident memory per idle live conversation, and memory after idle eviction.
#
#   benches/memory.sh            # 100,000 conversations (N=... to change)
#
# 1. colloquy with a large idle timeout: warm up (1,000 conversations), RSS "before"; then N
#    conversations of one turn each, all left live and idle; RSS "after";
#    per conversation = (after - before) / N.
# 2. colloquy with a short idle timeout (IDLE secs): the same load, then wait for the actors to be
#    evicted and read RSS again (the floor is the RSS after the warm-up had been evicted).
source "$(dirname "$0")/common.sh"
N=${N:-100000}
C=${C:-256}
IDLE=${IDLE:-15}
PORT=${PORT:-18095}
[ "${SKIP_BUILD:-}" = 1 ] || build
WORK=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

serve() { # data idle-secs
  "$COLLOQUY" serve --listen 127.0.0.1:$PORT --data "$1" --idle-timeout-secs "$2" 2>>"$WORK/server.log" &
  PID=$!
  wait_ready $PORT
}
load() { # conversations-in-total
  timeout 900 "$COLLOQUY" loadgen --url "http://127.0.0.1:$PORT/" --conversations "$C" --turns 1 \
    --total "$1" --text-bytes 200 --json | tail -1
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=; }

PHASES=${PHASES:-"live evict"}
START=0; AFTER=0; WINDOWS=0; WINDOW_BYTES=; RESIDENT=; PER=0
if [[ " $PHASES " == *" live "* ]]; then
echo "== live idle conversations (idle timeout 3600 s)" >&2
serve "$WORK/d1" 3600
load 1000 >/dev/null
sleep 2
START=$(rss_kb $PID)
R=$(load "$N"); echo "$R" | jq -c '{turns_ok, turns_per_s, error_total}' >&2
sleep 3
WINDOWS=$(rss_kb $PID)
WINDOW_BYTES=$(metric $PORT colloquy_history_cache_bytes)
# Idle: the history windows the actors kept are dropped contexts.history_cache_secs (10) after
# their turn, and jemalloc hands freed pages back within its 10 s decay.
sleep "${SETTLE:-20}"
AFTER=$(rss_kb $PID)
RESIDENT=$(metric $PORT colloquy_contexts_resident)
stop
PER=$(( (AFTER - START) * 1024 / N ))
fi

echo "== idle eviction (idle timeout $IDLE s)" >&2
serve "$WORK/d2" "$IDLE"
load 1000 >/dev/null
sleep $((IDLE + 8))
FLOOR=$(rss_kb $PID)
R2=$(load "$N"); echo "$R2" | jq -c '{turns_ok, turns_per_s, error_total}' >&2
PEAK=$(rss_kb $PID)
PEAK_RES=$(metric $PORT colloquy_contexts_resident)
sleep $((IDLE + 10))
EVICTED=$(rss_kb $PID)
EVICTED_RES=$(metric $PORT colloquy_contexts_resident)
# Diagnostic: is what stays resident freed heap that glibc keeps (returned by malloc_trim)?
TRIMMED=n/a
if command -v gdb >/dev/null; then
  gdb -p "$PID" -batch -ex 'call (int) malloc_trim(0)' >/dev/null 2>&1 || true
  sleep 1
  TRIMMED=$(rss_kb $PID)
fi
stop

cat <<T

memory, N=$N idle conversations (one turn each), $C in flight while creating them
  live:    RSS before ${START} KiB, 3 s after the load ${WINDOWS} KiB (history windows kept:
           ${WINDOW_BYTES:-?} bytes), idle ${SETTLE:-20} s later ${AFTER} KiB, resident actors ${RESIDENT:-?}
           per idle conversation: ${PER} bytes (target <= 4096)
  evicted: floor ${FLOOR} KiB, right after load ${PEAK} KiB (resident ${PEAK_RES:-?}),
           $((IDLE + 10)) s later ${EVICTED} KiB (resident ${EVICTED_RES:-?});
           after malloc_trim(0) (via gdb, diagnostic only): ${TRIMMED} KiB
T
echo "{\"n\":$N,\"rss_before_kb\":$START,\"rss_windows_kb\":$WINDOWS,\"rss_after_kb\":$AFTER,\"bytes_per_conversation\":$PER,\"floor_kb\":$FLOOR,\"peak_kb\":$PEAK,\"evicted_kb\":$EVICTED}"
