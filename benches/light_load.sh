#!/usr/bin/env bash
# What a turn writes to the device under light load: one request at a time, about RATE turns a
# second into 8 conversations for SECS, on a fresh data folder; each binary in turn, ROUNDS times.
#
#   benches/light_load.sh BINARY [BINARY...]
#   RATE=20 SECS=15 ROUNDS=2 benches/light_load.sh target/release/colloquy /tmp/colloquy-old
#
# Prints turns/s, bytes the device wrote a turn (the log's syncs, sled's checkpoints, and what
# the file system adds to them; the device's count is machine-wide, so keep the machine quiet)
# and the checkpoints run. Under load a checkpoint moves thousands of turns; here one
# a second moves a few dozen, yet rewrites every sled page they touch and syncs sled twice.
source "$(dirname "$0")/common.sh"
[ $# -gt 0 ] || { echo "usage: $0 BINARY [BINARY...]" >&2; exit 2; }
RATE=${RATE:-20}; SECS=${SECS:-15}; ROUNDS=${ROUNDS:-1}; PORT=${PORT:-18741}
WORK=$(mktemp -d)
PID=
trap '[ -z "$PID" ] || kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
TEXT=$(head -c 150 /dev/zero | tr '\0' 'x')
send() { # turn number
  curl -s -o /dev/null -H 'A2A-Version: 1.0' -H 'Content-Type: application/json' \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"SendMessage\",\"params\":{\"message\":{\"role\":\"ROLE_USER\",\"messageId\":\"m$1\",\"contextId\":\"light-$(($1 % 8))\",\"parts\":[{\"text\":\"$TEXT $1\"}]}}}" \
    "http://127.0.0.1:$PORT/"
}
# What the device wrote, machine-wide (/proc/PID/io counts pages the server dirtied, not the
# file-system's own writes a sync adds, such as the file's size and block map).
SOURCE=$(df --output=source "$WORK" | tail -1)
DEVICE=${DEVICE:-$(lsblk -no PKNAME "$SOURCE" 2>/dev/null | head -1)}
DEVICE=${DEVICE:-$(basename "$SOURCE")}
device_writes() { awk '{printf "%.0f\n", $7 * 512}' "/sys/block/$DEVICE/stat"; }
PAUSE=$(awk -v r="$RATE" 'BEGIN { print 1 / r }')
TURNS=$((RATE * SECS))
for round in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    rm -rf "$WORK/d"
    "$bin" serve --listen "127.0.0.1:$PORT" --data "$WORK/d" 2>"$WORK/log" & PID=$!
    wait_ready "$PORT"
    send 0; sleep 2; sync  # what others left unwritten is not counted
    before=$(device_writes) started=$(now_ms)
    for i in $(seq "$TURNS"); do send "$i"; sleep "$PAUSE"; done
    elapsed=$(( $(now_ms) - started ))
    written=$(( $(device_writes) - before ))
    checkpoints=$(metric "$PORT" colloquy_store_checkpoint_seconds_count)
    kill "$PID"; wait "$PID" || true; PID=
    awk -v r="$round" -v b="$bin" -v t="$TURNS" -v ms="$elapsed" -v w="$written" -v c="${checkpoints:-0}" \
      'BEGIN { printf "round %d %s: %.1f turns/s, %d B written to the device a turn, %d checkpoints\n", r, b, t * 1000 / ms, w / t, c }'
  done
done
