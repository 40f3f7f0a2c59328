#!/usr/bin/env bash
# What a turn writes to PostgreSQL's WAL, by record kind, and the database's CPU a turn: one node
# on a throwaway database, RUNS runs of TOTAL conversations x 5 turns x 200 B (64 in flight, v1.0),
# `pg_waldump --stats=record` between the WAL positions before and after each run.
#
#   benches/pg_wal.sh BINARY                      # 3 runs of 2,048 conversations
#   RUNS=2 TOTAL=512 benches/pg_wal.sh BINARY
#   EXTRA_SQL="DROP INDEX ..." benches/pg_wal.sh BINARY   # a schema change to try, once migrated
#
# Builds nothing. Debian's PostgreSQL binaries (benches/pg.sh), durable defaults, WAL segments
# recycled as in benches/cluster_compare.sh. Keep the machine otherwise idle.
set -euo pipefail
export COLLOQUY_GRPC_LISTEN="${COLLOQUY_GRPC_LISTEN-}"
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: $0 BINARY" >&2; exit 2; }
COLLOQUY=$(realpath "$1")
RUNS=${RUNS:-3} TOTAL=${TOTAL:-2048} PORT=${PORT:-18293} NODE_PORT=$((${PORT:-18293} + 1))
source benches/pg.sh

WORK=$(mktemp -d)
NODE=""
cleanup() {
  [ -n "$NODE" ] && kill "$NODE" 2>/dev/null
  wait 2>/dev/null || true
  pg_stop "$WORK"
  rm -rf "$WORK"
}
trap cleanup EXIT

pg_start "$WORK" "$PORT" -c min_wal_size=1GB
pg_psql "$PORT" -f benches/pg_recycled_wal.sql >/dev/null
COLLOQUY_STORE__URL=$(pg_url "$PORT") "$COLLOQUY" serve --listen "127.0.0.1:$NODE_PORT" \
  --data "$WORK/node" 2>"$WORK/node.log" &
NODE=$!
for _ in $(seq 1 200); do
  curl -sf -o /dev/null "http://127.0.0.1:$NODE_PORT/readyz" && break
  sleep 0.05
done
[ -n "${EXTRA_SQL:-}" ] && pg_psql "$PORT" -c "$EXTRA_SQL"

POSTMASTER=$(head -1 "$WORK/db/data/postmaster.pid")
pg_ticks() { # the database's processes' utime + stime
  for pid in "$POSTMASTER" $(pgrep -P "$POSTMASTER"); do
    awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null
  done | awk '{s += $1} END {print s + 0}'
}
turns=$((TOTAL * 5))
for run in $(seq 1 "$RUNS"); do
  start=$(pg_wal_position "$PORT") ticks=$(pg_ticks)
  "$COLLOQUY" loadgen --url "http://127.0.0.1:$NODE_PORT/" --conversations 64 --turns 5 \
    --total "$TOTAL" --text-bytes 200 --version 1.0 --json >"$WORK/run.json"
  end=$(pg_wal_position "$PORT")
  tail -1 "$WORK/run.json" | jq -r --argjson us "$((($(pg_ticks) - ticks) * 1000000 / $(getconf CLK_TCK) / turns))" \
    '"run '"$run"': \(.turns_ok) turns at \(.turns_per_s | floor) turns/s, PostgreSQL \($us) µs a turn"'
  # Records and bytes a turn by kind, the most frequent first.
  pg_wal_between "$WORK" "$start" "$end" |
    awk -v turns="$turns" '{ printf "  %-24s %6.2f records %6.0f B a turn\n", $1, $2 / turns, $5 / turns }' |
    sort -k2 -n -r | head -"${TOP:-12}"
done
