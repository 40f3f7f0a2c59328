#!/usr/bin/env bash
# Where colloquy's CPU goes per turn, by thread family, from /proc/PID/task/*/stat (no sampling):
# in all, in user space and in the kernel (its system calls: the store's writes and syncs, the
# sockets, the wake-ups between threads).
#
#   benches/cpu_by_thread.sh       # C=64 TURNS=5 TOTAL=1024
#
# Threads that exit during the run (sled spawns and retires I/O threads) only show in the total.
source "$(dirname "$0")/common.sh"
C=${C:-64}; TURNS=${TURNS:-5}; TOTAL=${TOTAL:-1024}; PORT=${PORT:-18098}
[ "${SKIP_BUILD:-}" = 1 ] || build
WORK=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
"$COLLOQUY" serve --listen 127.0.0.1:$PORT --data "$WORK/d" 2>/dev/null &
PID=$!
wait_ready $PORT
HZ=$(getconf CLK_TCK)
snap() {
  for t in /proc/$PID/task/*; do
    printf '%s %s\n' "$(tr ' |' '__' <"$t/comm" | sed 's/[-_][0-9]*$//')" "$(awk '{print $14, $15}' "$t/stat")"
  done | awk '{u[$1] += $2; s[$1] += $3} END {for (k in u) print k, u[k], s[k]}' | sort
  echo "TOTAL $(awk '{print $14, $15}' /proc/$PID/stat)"
}
"$COLLOQUY" loadgen --url "http://127.0.0.1:$PORT/" --conversations "$C" --turns 1 --total "$C" --json >/dev/null
snap >"$WORK/before"
R=$("$COLLOQUY" loadgen --url "http://127.0.0.1:$PORT/" --conversations "$C" --turns "$TURNS" --total "$TOTAL" --json | tail -1)
snap >"$WORK/after"
OK=$(echo "$R" | jq .turns_ok)
echo "$R" | jq -c '{turns_ok, turns_per_s, latency_ms}'
echo "threads alive: $(ls /proc/$PID/task | wc -l)"
printf '  %-20s %8s %8s %8s   (us/turn)\n' thread all user kernel
join -a 2 -e 0 -o 0,1.2,1.3,2.2,2.3 "$WORK/before" "$WORK/after" \
  | awk -v hz="$HZ" -v ok="$OK" '{u = $4 - $2; k = $5 - $3; f = 1e6 / hz / ok
      printf "  %-20s %8.0f %8.0f %8.0f\n", $1, (u + k) * f, u * f, k * f}'
