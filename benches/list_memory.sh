#!/usr/bin/env bash
# Peak resident memory under concurrent ListTasks (pageSize 100, historyLength 100,
# includeArtifacts) over a store of large tasks, for each response budget.
#
#   benches/list_memory.sh      # TASKS=120 TEXT=50000 CONCURRENT=16 BUDGETS="1073741824 default"
#   SKIP_BUILD=1 BIN=/path/to/colloquy BUDGETS=default benches/list_memory.sh   # another build
#
# Fills a store through the echo agent (TASKS turns of TEXT bytes: each task holds its reply, which
# quotes this turn's and the previous turn's text, as an artifact and the question and the reply
# as history, about 5 x TEXT bytes), then for each budget (`limits.response_bytes`; 1 GiB =
# unbounded, as before the budget; `default` = not set) restarts the server on it and
# sends CONCURRENT ListTasks at once. Peak = the server's VmHWM after them; base = VmRSS before.
source "$(dirname "$0")/common.sh"
COLLOQUY=${BIN:-$COLLOQUY}  # BIN=path: a prebuilt binary
TASKS=${TASKS:-120}
TEXT=${TEXT:-50000}
CONCURRENT=${CONCURRENT:-16}
BUDGETS=${BUDGETS:-"1073741824 default"}
PORT=${PORT:-18097}
[ "${SKIP_BUILD:-}" = 1 ] || cargo build --release --bin colloquy >&2
WORK=$(mktemp -d)
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

serve() { # response-budget ("default": not set, as a binary without the key needs)
  local budget=()
  [ "$1" = default ] || budget=(env "COLLOQUY_LIMITS__RESPONSE_BYTES=$1")
  "${budget[@]}" "$COLLOQUY" serve --listen 127.0.0.1:$PORT \
    --data "$WORK/data" 2>>"$WORK/server.log" &
  PID=$!
  wait_ready $PORT
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=; }

serve default
"$COLLOQUY" loadgen --url "http://127.0.0.1:$PORT/" --conversations 4 --turns $((TASKS / 4)) \
  --total 4 --text-bytes "$TEXT" --json | tail -1 | jq -c '{fill_turns_ok: .turns_ok, error_total}' >&2
stop

BODY='{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"pageSize":100,"historyLength":100,"includeArtifacts":true}}'
for budget in $BUDGETS; do
  serve "$budget"
  BASE=$(rss_kb $PID)
  started=$(now_ms)
  clients=()
  for i in $(seq "$CONCURRENT"); do
    curl -s -H 'A2A-Version: 1.0' -H 'Content-Type: application/json' -d "$BODY" \
      -o "$WORK/page$i.json" "http://127.0.0.1:$PORT/" &
    clients+=($!)
  done
  wait "${clients[@]}"
  elapsed=$(( $(now_ms) - started ))
  PEAK=$(awk '/VmHWM/ {print $2}' "/proc/$PID/status")
  TASKS_PER_PAGE=$(jq '.result.tasks | length' "$WORK/page1.json")
  PAGE_BYTES=$(stat -c %s "$WORK/page1.json")
  stop
  jq -nc --arg budget "$budget" --argjson base_kb "$BASE" --argjson peak_kb "$PEAK" \
    --argjson tasks "$TASKS_PER_PAGE" --argjson page_bytes "$PAGE_BYTES" --argjson ms "$elapsed" \
    --argjson concurrent "$CONCURRENT" \
    '{response_bytes: $budget, concurrent: $concurrent, tasks_per_page: $tasks, page_bytes: $page_bytes, rss_before_mb: ($base_kb / 1024 | floor), peak_rss_mb: ($peak_kb / 1024 | floor), wall_ms: $ms}'
done
