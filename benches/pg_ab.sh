#!/usr/bin/env bash
# Two builds against each other on PostgreSQL, alternating, each run on a fresh database: turns/s,
# p99, and CPU per turn of PostgreSQL's processes and of the nodes (/proc/PID/stat), with the
# statements a turn (pg_stat_statements), the groups of turn starts a turn (the nodes'
# colloquy_store_groups_total) and the nodes' voluntary context switches a turn. Quicker than
# benches/cluster_compare.sh (no sled node, one binary per run), for A/B of a change to the
# PostgreSQL path.
#
#   benches/pg_ab.sh OLD_BINARY NEW_BINARY          # 1 node, 3 rounds
#   NODES=2 ROUNDS=5 benches/pg_ab.sh OLD NEW        # 2 nodes on the one database
#   TOTAL=4096 CONVERSATIONS=64 benches/pg_ab.sh OLD NEW
#   NAPTIME=1s benches/pg_ab.sh OLD NEW              # autovacuum every second (default: 1min)
#
# Builds nothing. Starts its own PostgreSQL per run (Debian's initdb/pg_ctl, as nobody when
# run as root; durable defaults; autovacuum at its default and WAL segments recycled, as
# cluster_compare.sh). Keep the machine otherwise idle: a compile beside it (its disk writes
# slow every fsync) stalls runs.
set -euo pipefail
# The servers started here serve HTTP only (gRPC on, at its default port, would clash).
export COLLOQUY_GRPC_LISTEN="${COLLOQUY_GRPC_LISTEN-}"
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 OLD_BINARY NEW_BINARY" >&2; exit 2; }
BINARIES=("$(realpath "$1")" "$(realpath "$2")")
NODES=${NODES:-1} ROUNDS=${ROUNDS:-3} CONVERSATIONS=${CONVERSATIONS:-64}
TOTAL=${TOTAL:-2048} PORT=${PORT:-18399}
source benches/pg.sh
source benches/ab.sh

ticks() { # the summed utime + stime of the PIDs given (comma or space separated)
  for pid in ${1//,/ }; do awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null; done |
    awk '{s += $1} END {print s + 0}'
}

switches() { # the voluntary context switches of every thread of the PIDs given
  for pid in $1; do cat /proc/"$pid"/task/*/status 2>/dev/null; done |
    awk '/^voluntary_ctxt_switches/ {s += $2} END {print s + 0}'
}

start_groups() { # the groups of turn starts the nodes on ports PORT-1 .. PORT-NODES committed
  for i in $(seq 1 "$NODES"); do
    curl -sf "http://127.0.0.1:$((PORT - i))/metrics" |
      awk '/^colloquy_store_groups_total\{step="start"\}/ {print $2}'
  done | awk '{s += $1} END {print s + 0}'
}

# A run's nodes and database, stopped however the run ends (it runs in a subshell of its
# pipeline: a failed step, such as a node that cannot bind its port, would leave them running).
stop_run() {
  for pid in $nodes; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pg_stop "$work"
  rm -rf "$work"
}

one_run() { # which label -> one result line
  local bin=${BINARIES[$1]} label=$2 urls="" i
  work=$(mktemp -d) nodes=""
  trap stop_run EXIT
  pg_start "$work" "$PORT" -c autovacuum_naptime="${NAPTIME:-1min}" -c min_wal_size=1GB \
    -c shared_preload_libraries=pg_stat_statements
  psql() { pg_psql "$PORT" "$@"; }
  psql -c "CREATE EXTENSION pg_stat_statements" >/dev/null
  psql -f benches/pg_recycled_wal.sql >/dev/null
  for i in $(seq 1 "$NODES"); do
    COLLOQUY_STORE__URL=$(pg_url "$PORT") "$bin" serve \
      --listen "127.0.0.1:$((PORT - i))" --data "$work/node$i" --log-format json 2>"$work/node$i.log" &
    nodes="$nodes $!"
    urls="$urls,http://127.0.0.1:$((PORT - i))/"
  done
  urls=${urls#,}
  for i in $(seq 1 "$NODES"); do
    for _ in $(seq 1 200); do curl -sf -o /dev/null "http://127.0.0.1:$((PORT - i))/readyz" && break; sleep 0.05; done
  done
  # Warm: connections, plans, the tables' first statistics.
  "$bin" loadgen --url "$urls" --conversations "$CONVERSATIONS" --turns 5 --total 1024 \
    --text-bytes 200 --version 1.0 --json >/dev/null
  local pg0 n0 s0 g0 pg1 n1 s1 g1
  psql -c "SELECT pg_stat_statements_reset()" >/dev/null
  pg0=$(pg_cpu_ticks "$work") n0=$(ticks "$nodes") s0=$(switches "$nodes") g0=$(start_groups)
  "$bin" loadgen --url "$urls" --conversations "$CONVERSATIONS" --turns 5 --total "$TOTAL" \
    --text-bytes 200 --version 1.0 --json >"$work/loadgen.out"
  pg1=$(pg_cpu_ticks "$work") n1=$(ticks "$nodes") s1=$(switches "$nodes") g1=$(start_groups)
  local statements
  statements=$(psql -c "SELECT round(sum(calls)::numeric / $((TOTAL * 5)), 2) FROM pg_stat_statements \
    WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT IN ('BEGIN', 'COMMIT') AND query NOT LIKE 'SET %'")
  tail -1 "$work/loadgen.out" | jq -c --arg build "$label" --argjson hz "$(getconf CLK_TCK)" \
    --argjson pg "$((pg1 - pg0))" --argjson nodes "$((n1 - n0))" --arg statements "$statements" \
    --argjson switches "$((s1 - s0))" --argjson groups "$((g1 - g0))" \
    '{label: $build, turns_per_s, p99: .latency_ms.p99, errors: (.errors | add // 0),
      pg_us: (1e6 * $pg / $hz / .turns_ok), node_us: (1e6 * $nodes / $hz / .turns_ok),
      statements: $statements, groups: ($groups / .turns_ok), switches: ($switches / .turns_ok)}'
}

echo "nodes=$NODES rounds=$ROUNDS load=$(cut -d' ' -f1-3 /proc/loadavg)" >&2
RESULTS=$(mktemp)
ab_rounds
printf '%-4s %9s %8s %7s %16s %12s %20s %14s %16s\n' build turns/s "p99 ms" errors "PostgreSQL us" "node us" \
  "statements a turn" "groups a turn" "switches a turn"
jq -r '[.label, (.turns_per_s | floor), .p99, .errors, (.pg_us | floor), (.node_us | floor), .statements,
    (.groups * 1000 | round / 1000), (.switches * 100 | round / 100)] | @tsv' "$RESULTS" |
  sort -s -k1,1r |
  awk -F'\t' '{printf "%-4s %9s %8s %7s %16s %12s %20s %14s %16s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9}'
rm -f "$RESULTS"
