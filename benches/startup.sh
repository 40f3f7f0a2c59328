#!/usr/bin/env bash
# Start-up time with 1,000,000 stored conversations vs an empty store.
#
#   benches/startup.sh                      # CONVERSATIONS=1000000 MESSAGES=2 RUNS=5
#   MESSAGES=10 benches/startup.sh          # 5 million turns (5 per conversation)
#
# Fills a data folder through `colloquy::store::Store` directly (benches/fill_store.rs), then
# starts `colloquy serve` RUNS times on it and on an empty folder, alternating, timing from spawn
# to the first 200 of /readyz (a durable write), and then to the first completed turn in an old
# conversation. Polling granularity is about 10 ms.
source "$(dirname "$0")/common.sh"
CONVERSATIONS=${CONVERSATIONS:-1000000}
MESSAGES=${MESSAGES:-2}
RUNS=${RUNS:-5}
PORT=${PORT:-18096}
[ "${SKIP_BUILD:-}" = 1 ] || build
FILL=$(bench_bin fill_store)
WORK=${WORK:-$(mktemp -d)}
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$WORK"; }
trap cleanup EXIT

if [ ! -d "$WORK/big" ]; then
  echo "filling $CONVERSATIONS conversations..." >&2
  T0=$(now_ms)
  timeout 1200 "$FILL" --data "$WORK/big" --conversations "$CONVERSATIONS" --messages "$MESSAGES" --prefix bulk --batch 2000
  echo "fill took $(( $(now_ms) - T0 )) ms; $(du -sh "$WORK/big" | cut -f1) on disk" >&2
fi
mkdir -p "$WORK/empty"
# The empty store is created on first open: open it once so both runs open an existing folder.
"$COLLOQUY" serve --listen 127.0.0.1:$PORT --data "$WORK/empty" 2>/dev/null & PID=$!; wait_ready $PORT; kill $PID; wait $PID 2>/dev/null || true; PID=

start_once() { # data context-id
  local t0 t1 t2
  t0=$(now_ms)
  "$COLLOQUY" serve --listen 127.0.0.1:$PORT --data "$1" 2>>"$WORK/server.log" &
  PID=$!
  wait_ready $PORT 120
  t1=$(now_ms)
  timeout 60 "$COLLOQUY" loadgen --url "http://127.0.0.1:$PORT/" --conversations 1 --turns 1 \
    --context-id "$2" --no-echo-check --json >/dev/null || echo "first turn failed" >&2
  t2=$(now_ms)
  local rss; rss=$(rss_kb $PID)
  kill $PID; wait $PID 2>/dev/null || true; PID=
  echo "$((t1 - t0)) $((t2 - t0)) $rss"
}

# sled alone: open the folder through the Store API (no server), as often.
open_once() { local t0; t0=$(now_ms); "$FILL" --data "$1" --conversations 0 --messages 0 2>/dev/null; echo "$(( $(now_ms) - t0 )) 0 0"; }
declare -a EMPTY BIG OPEN_EMPTY OPEN_BIG
for i in $(seq 1 "$RUNS"); do
  EMPTY+=("$(start_once "$WORK/empty" "fresh-$i")")
  BIG+=("$(start_once "$WORK/big" "bulk-$((CONVERSATIONS - i))")")
  OPEN_EMPTY+=("$(open_once "$WORK/empty")")
  OPEN_BIG+=("$(open_once "$WORK/big")")
done
summary() { # label rows...
  local label=$1; shift
  printf '%s\n' "$@" | sort -n | awk -v l="$label" '{r[NR]=$1; t[NR]=$2; m[NR]=$3} END {
    printf "  %-22s ready ms: min %d median %d max %d | first turn ms: median %d | RSS %d KiB\n",
      l, r[1], r[int((NR+1)/2)], r[NR], t[int((NR+1)/2)], m[int((NR+1)/2)] }'
}
echo
echo "start-up, $RUNS runs each (spawn -> /readyz 200; -> first turn in an old conversation done)"
summary "empty store" "${EMPTY[@]}"
summary "$CONVERSATIONS conversations" "${BIG[@]}"
echo "sled open alone (Store::open_sled + a durable flush, no server), ms:"
summary "empty store" "${OPEN_EMPTY[@]}"
summary "$CONVERSATIONS conversations" "${OPEN_BIG[@]}"
