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
[ $# -eq 1 ] || { echo "usage: $0 BINARY" >&2; exit 2; }
COLLOQUY=$(realpath "$1")
source "$(dirname "$0")/common.sh"
source benches/pg.sh
RUNS=${RUNS:-3} TOTAL=${TOTAL:-2048} PORT=${PORT:-18293}
NODE_PORT=$((PORT + 1))

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
wait_ready "$NODE_PORT"
[ -n "${EXTRA_SQL:-}" ] && pg_psql "$PORT" -c "$EXTRA_SQL"

turns=$((TOTAL * 5))
for run in $(seq 1 "$RUNS"); do
  start=$(pg_wal_position "$PORT") ticks=$(pg_cpu_ticks "$WORK")
  "$COLLOQUY" loadgen --url "http://127.0.0.1:$NODE_PORT/" --conversations 64 --turns 5 \
    --total "$TOTAL" --text-bytes 200 --version 1.0 --json >"$WORK/run.json"
  end=$(pg_wal_position "$PORT")
  tail -1 "$WORK/run.json" | jq -r --argjson us "$((($(pg_cpu_ticks "$WORK") - ticks) * 1000000 / $(getconf CLK_TCK) / turns))" \
    '"run '"$run"': \(.turns_ok) turns at \(.turns_per_s | floor) turns/s, PostgreSQL \($us) µs a turn"'
  # Records and bytes a turn by kind, the most frequent first.
  pg_wal_between "$WORK" "$start" "$end" |
    awk -v turns="$turns" '{ printf "  %-24s %6.2f records %6.0f B a turn\n", $1, $2 / turns, $5 / turns }' |
    sort -k2 -n -r | head -"${TOP:-12}"
done
