#!/usr/bin/env bash
# Streams through the server: time to first chunk and chunks delivered per second.
#
#   benches/streams.sh           # CONVS="64 1000" TURNS=3 TEXT=40 CHUNK=8 DELAY=5
#
# Starts colloquy with the echo agent streaming its reply in CHUNK-character chunks DELAY ms
# apart (~10 chunks for a 60-byte reply), then for each C in CONVS runs
# `colloquy loadgen --stream --conversations C --turns TURNS --text-bytes TEXT` (C streams open at
# once, C conversations in all) and prints one table row per run, then the bytes one streamed turn
# of TEXT bytes puts on the wire (a JSON-RPC v1.0 `SendStreamingMessage` read whole with curl: the
# HTTP body, SSE framing and event ids included). Loopback only; every step is bounded by
# `timeout`.
source "$(dirname "$0")/common.sh"
CONVS=${CONVS:-"64 1000"}
TURNS=${TURNS:-3}
TEXT=${TEXT:-40}
CHUNK=${CHUNK:-8}
DELAY=${DELAY:-5}
PORT=${PORT:-18098}
# One socket per stream on each side (server and loadgen share this limit): raise the soft limit.
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 8192 ]; then
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
fi
MAX_CONVS=$(tr ' ' '\n' <<<"$CONVS" | sort -n | tail -1)
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $(( 2 * MAX_CONVS + 256 )) ]; then
  echo "ulimit -n is $(ulimit -n): too low for $MAX_CONVS streams" >&2
  exit 1
fi
if [ "${SKIP_BUILD:-}" != 1 ]; then
  echo "building release..." >&2
  cargo build --release --bin colloquy >&2
fi
WORK=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

# limits.running_turns defaults to 10,000: above the largest run, so no turn is refused.
"$COLLOQUY" serve --listen 127.0.0.1:$PORT --data "$WORK/d" \
  --echo-chunk-chars "$CHUNK" --echo-delay-ms "$DELAY" 2>"$WORK/server.log" &
PID=$!
wait_ready $PORT
RES="$WORK/res.jsonl"
for c in $CONVS; do
  load_before=$(cut -d' ' -f1 /proc/loadavg)
  timeout 300 "$COLLOQUY" loadgen --url "http://127.0.0.1:$PORT/" --stream \
    --conversations "$c" --turns "$TURNS" --text-bytes "$TEXT" --timeout-secs 120 --json \
    | tail -1 | jq -c --arg l "$load_before" --arg a "$(cut -d' ' -f1 /proc/loadavg)" \
      '. + {load: "\($l) -> \($a)"}' >>"$RES" || true
done
echo
echo "streams: echo chunks of $CHUNK chars, $DELAY ms apart; $TURNS turns x $TEXT B per conversation"
echo "| streams | turns ok/sent | turns/s | first chunk p50 ms | p90 | p99 | max | turn p50 ms | p99 | chunks | chunks/s | errors | load avg (1 min) |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
jq -r '"| \(.conversations) | \(.turns_ok)/\(.turns_sent) | \(.turns_per_s | floor) | \(.ttfc_ms.p50) | \(.ttfc_ms.p90) | \(.ttfc_ms.p99) | \(.ttfc_ms.max) | \(.latency_ms.p50) | \(.latency_ms.p99) | \(.chunks) | \(.chunks_per_s | floor) | \(.error_total) \(.errors | tostring) | \(.load) |"' "$RES"
message=$(head -c "$TEXT" /dev/zero | tr '\0' x)
body='{"jsonrpc":"2.0","id":1,"method":"SendStreamingMessage","params":{"message":{"messageId":"m-bytes","role":"ROLE_USER","parts":[{"text":"'"$message"'"}]}}}'
streamed=$(timeout 60 curl -sN "http://127.0.0.1:$PORT/" -H 'A2A-Version: 1.0' \
  -H 'content-type: application/json' -d "$body")
echo
echo "one streamed turn of $TEXT B: $(printf %s "$streamed" | wc -c) bytes of body, \
$(grep -c '^data:' <<<"$streamed") events, $(grep '^id:' <<<"$streamed" | wc -c) bytes of id lines"
