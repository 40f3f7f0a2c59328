#!/usr/bin/env bash
# A steady load on one server, round after round: do costs stay flat as the data grows?
#
#   benches/soak.sh                        # 6 rounds x 30 s, 64 in flight, 5 turns x 200 B
#   ROUNDS=60 SECS=30 benches/soak.sh      # the 30-minute soak
#
# Stops early, saying so, when the disk holding the data folder has less than MIN_FREE_GB
# (default 5) free. After the rounds it compares the rounds of the first 5 minutes with those of
# the last 5 (or the first and last round, in a shorter soak): turns/s and the rounds' mean p99.
# Every round starts new conversations throughout. Per round it prints turns/s, p99, the
# server's RSS, the data folder's size and the bytes written to the device so far, each per
# turn. Then it stops the server cleanly, restarts it twice on the same folder (time to /readyz),
# and prints where the bytes went by record type (benches/store_bytes.rs).
#
# MEMORY_LIMIT_MB=768 runs the server in a cgroup of its own with that memory limit, as a
# container would (needs root and a writable /sys/fs/cgroup, v1 or v2); the server reads the limit
# at start and sizes its budgets from it. Each round then also prints the cgroup's memory use, and
# the soak stops if the kernel killed the server for memory.
source "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-6}; SECS=${SECS:-30}; C=${C:-64}; TURNS=${TURNS:-5}; TEXT=${TEXT:-200}
PORT=${PORT:-18161}
[ "${SKIP_BUILD:-}" = 1 ] || { build; cargo bench --no-run --bench store_bytes >&2; }
STORE_BYTES=$(bench_bin store_bytes)
WORK=${WORK:-$(mktemp -d)}; mkdir -p "$WORK"
PID=
CGROUP=
if [ -n "${MEMORY_LIMIT_MB:-}" ]; then
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    CGROUP=/sys/fs/cgroup/colloquy-soak-$$; LIMIT_FILE=memory.max; USAGE_FILE=memory.current
  else
    CGROUP=/sys/fs/cgroup/memory/colloquy-soak-$$; LIMIT_FILE=memory.limit_in_bytes
    USAGE_FILE=memory.usage_in_bytes
  fi
  mkdir "$CGROUP"
  echo $(( MEMORY_LIMIT_MB * 1048576 )) > "$CGROUP/$LIMIT_FILE"
fi
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$WORK"
  [ -z "$CGROUP" ] || rmdir "$CGROUP" 2>/dev/null || true
}
trap cleanup EXIT
start() {
  # The server joins the cgroup (if any) before it starts, so it finds the limit.
  sh -c '[ -z "$1" ] || echo $$ > "$1/cgroup.procs" || exit 1; shift; exec "$@"' _ "$CGROUP" \
    "$COLLOQUY" serve --listen 127.0.0.1:$PORT --data "$WORK/data" 2>>"$WORK/server.log" &
  PID=$!
}
start
wait_ready $PORT 60
total=0
ROWS=$WORK/rounds.tsv; : > "$ROWS"
# The share of a round's time in which some task on the machine waited for I/O (the kernel's
# pressure stall information, machine-wide): a dip in turns/s with it high is the disk's, or a
# neighbour's, rather than the server's doing. "-" where the kernel has no PSI.
io_stall_us() { awk -F'total=' '/^some/ {print $2}' /proc/pressure/io 2>/dev/null || true; }
echo "| round | turns | turns/s | p50 ms | p99 ms | RSS MB | cgroup MB | on disk MB | disk B/turn | device writes B/turn | I/O stall % |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for round in $(seq 1 "$ROUNDS"); do
  free_kb=$(df -Pk "$WORK" | awk 'NR == 2 {print $4}')
  if [ "$free_kb" -lt $(( ${MIN_FREE_GB:-5} * 1048576 )) ]; then
    echo "stopped before round $round: $((free_kb / 1048576)) GB left on the disk"; break
  fi
  stall0=$(io_stall_us) began=$(now_ms)
  R=$("$COLLOQUY" loadgen --url "http://127.0.0.1:$PORT/" --conversations "$C" --turns "$TURNS" \
      --text-bytes "$TEXT" --duration "$SECS" --timeout-secs 60 --json | tail -1) || R=
  if ! kill -0 "$PID" 2>/dev/null; then
    echo "the server died in round $round:" \
      "$(grep -h oom_kill "$CGROUP/memory.events" "$CGROUP/memory.oom_control" 2>/dev/null | tr '\n' ' ')"
    PID=; exit 1
  fi
  [ -n "$R" ] || { echo "the load generator failed in round $round"; exit 1; }
  stall=-
  stall1=$(io_stall_us)
  [ -z "$stall0" ] || [ -z "$stall1" ] ||
    stall=$(( (stall1 - stall0) / (10 * ($(now_ms) - began + 1)) ))
  cgroup=-
  [ -z "$CGROUP" ] || cgroup=$(( $(cat "$CGROUP/$USAGE_FILE") / 1048576 ))
  ok=$(echo "$R" | jq .turns_ok)
  total=$((total + ok))
  disk=$(du -sb "$WORK/data" | cut -f1)
  written=$(awk '/^write_bytes/ {print $2}' /proc/$PID/io)
  echo "$R" | jq -r --argjson round "$round" --argjson total "$total" --argjson rss "$(rss_kb $PID)" \
    --argjson disk "$disk" --argjson written "$written" --arg cgroup "$cgroup" --arg stall "$stall" \
    '"| \($round) | \(.turns_ok) | \(.turns_per_s | floor) | \(.latency_ms.p50) | \(.latency_ms.p99) | \($rss / 1024 | floor) | \($cgroup) | \($disk / 1048576 | floor) | \($disk / $total | floor) | \($written / $total | floor) | \($stall) |"'
  echo "$R" | jq -r '"\(.turns_per_s) \(.latency_ms.p99)"' >> "$ROWS"
done
awk -v secs="$SECS" '{ tps[NR] = $1; p99[NR] = $2 } END {
  if (NR == 0) exit
  n = int(300 / secs); if (n < 1) n = 1; if (n > NR / 2) n = 1
  for (i = 1; i <= n; i++) { a += tps[i]; ap += p99[i]; b += tps[NR - n + i]; bp += p99[NR - n + i] }
  printf "first %d rounds: %.0f turns/s, mean p99 %.1f ms; last %d: %.0f turns/s (%.0f%%), mean p99 %.1f ms (%.2fx)\n",
    n, a / n, ap / n, n, b / n, 100 * b / a, bp / n, bp / ap }' "$ROWS"
kill -TERM "$PID"; wait "$PID" || true; PID=
echo
# The first open after a run is the one that pays for it: sled replays the log written since its
# last snapshot, and it writes snapshots only when it opens a folder. So restart before anything
# else opens the folder (store_bytes would), then once more.
for restart in first second; do
  started=$(now_ms)
  start
  wait_ready $PORT 600
  echo "restart ($restart open after the run): ready after $(( $(now_ms) - started )) ms; RSS $(( $(rss_kb $PID) / 1024 )) MB"
  kill -TERM "$PID"; wait "$PID" || true; PID=
done
echo
echo "after $total turns, stopped cleanly:"
"$STORE_BYTES" "$WORK/data" "$total"
