#!/usr/bin/env bash
# One node on sled vs one node on PostgreSQL vs two nodes on one PostgreSQL, same loadgen, same
# machine, same run.
#
#   benches/cluster_compare.sh                     # 64 conversations in flight x 5 turns x 200 B, v1.0
#   ROUNDS=3 benches/cluster_compare.sh            # repeat the three, alternating the order
#   CONVERSATIONS=128 TOTAL=1024 benches/cluster_compare.sh
#   PG_SETTINGS="-c synchronous_commit=off" benches/cluster_compare.sh   # server settings to try
#   DB_DELAY_MS=1 benches/cluster_compare.sh       # the nodes reach the database 1 ms away (each way)
#   PARTITIONS=8 benches/cluster_compare.sh        # tables hash-partitioned by conversation key
#   PREFILL=200000 ROUNDS=6 benches/cluster_compare.sh  # a database in service: that many turns
#                                                  # stored first, then vacuumed and checkpointed
#   EXTRA_SQL="DROP INDEX ..." benches/cluster_compare.sh  # a schema change to try, once the
#                                                  # nodes migrated (as benches/pg_wal.sh)
#
# Builds release (unless COLLOQUY names a binary); starts its own throwaway PostgreSQL (Debian's
# initdb/pg_ctl, as nobody when run as root; durable defaults: fsync and synchronous_commit on;
# autovacuum at its default wake-up, a minute, unless NAPTIME says otherwise: a group's plans
# are index lookups whatever the statistics, so they need not follow the tables' growth; WAL
# segments recycled as in a database that has run a while, benches/pg_recycled_wal.sql)
# and three colloquy nodes (echo agent): one on sled, two on the database. Measures turns/s,
# latency, errors, and CPU per turn of each process from /proc/PID/stat (utime + stime),
# PostgreSQL's split by process kind (client backends, WAL writer, checkpointer, ...).
set -euo pipefail
# The servers started here serve HTTP only (gRPC on, at its default port, would clash).
export COLLOQUY_GRPC_LISTEN="${COLLOQUY_GRPC_LISTEN-}"
cd "$(dirname "$0")/.."

CONVERSATIONS=${CONVERSATIONS:-64}
TURNS=${TURNS:-5}
TEXT=${TEXT:-200}
TOTAL=${TOTAL:-$((CONVERSATIONS * 8))}
ROUNDS=${ROUNDS:-1}
BASE=${BASE_PORT:-18190}
SLED_PORT=$BASE PG_A_PORT=$((BASE + 1)) PG_B_PORT=$((BASE + 2)) DB_PORT=$((BASE + 3))

if [ -z "${COLLOQUY:-}" ]; then
  echo "building release..." >&2
  cargo build --release --bin colloquy >&2
fi
COLLOQUY=$(realpath "${COLLOQUY:-target/release/colloquy}")

source benches/pg.sh

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pg_stop "$WORK"
  rm -rf "$WORK"
}
trap cleanup EXIT

pg_start "$WORK" "$DB_PORT" -c shared_preload_libraries=pg_stat_statements \
  -c pg_stat_statements.track_planning=on -c autovacuum_naptime="${NAPTIME:-1min}" \
  -c min_wal_size=1GB ${PG_SETTINGS:-}
psql() { pg_psql "$DB_PORT" "$@"; }
psql -c "CREATE EXTENSION pg_stat_statements" >/dev/null
psql -f benches/pg_recycled_wal.sql >/dev/null
DB_URL=$(pg_url "$DB_PORT")
if [ -n "${DB_DELAY_MS:-}" ]; then
  # The nodes reach the database through a proxy that delays each read by DB_DELAY_MS.
  PROXY_PORT=$((BASE + 4))
  python3 benches/delay_proxy.py "$PROXY_PORT" 127.0.0.1 "$DB_PORT" "$DB_DELAY_MS" &
  PIDS+=($!)
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PROXY_PORT") 2>/dev/null && break; sleep 0.05; done
  DB_URL=$(pg_url "$PROXY_PORT")
fi
POSTMASTER=$(head -1 "$WORK/db/data/postmaster.pid")

serve() { # name port [store url]
  COLLOQUY_STORE__URL=${3:-} COLLOQUY_STORE__PARTITIONS=${PARTITIONS:-0} "$COLLOQUY" serve --listen "127.0.0.1:$2" --data "$WORK/$1" \
    --log-format json 2>"$WORK/$1.log" &
  PIDS+=($!)
}
serve sled "$SLED_PORT"; SLED_PID=$!
serve pg-a "$PG_A_PORT" "$DB_URL"; PG_A_PID=$!
serve pg-b "$PG_B_PORT" "$DB_URL"; PG_B_PID=$!
for port in "$SLED_PORT" "$PG_A_PORT" "$PG_B_PORT"; do
  for _ in $(seq 1 400); do
    curl -sf -o /dev/null "http://127.0.0.1:$port/readyz" && break
    sleep 0.05
  done
  curl -sf -o /dev/null "http://127.0.0.1:$port/readyz" || { echo "node on $port not ready" >&2; exit 1; }
done

[ -z "${EXTRA_SQL:-}" ] || psql -c "$EXTRA_SQL" >/dev/null

ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# Every PostgreSQL process as "kind ticks": the postmaster and its children, by process title.
pg_ticks() {
  echo "postmaster $(ticks "$POSTMASTER")"
  for stat in /proc/[0-9]*/stat; do
    pid=${stat#/proc/}; pid=${pid%/stat}
    [ "$(awk '{print $4}' "$stat" 2>/dev/null)" = "$POSTMASTER" ] || continue
    title=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | sed 's/^postgres: //')
    case "$title" in
      *127.0.0.1*|*"[local]"*) kind=client_backends ;;
      *) kind=$(echo "$title" | awk '{print $1 "_" $2}' | tr -d ' ') ;;
    esac
    echo "$kind $(ticks "$pid")"
  done
}
pg_snapshot() { pg_ticks | awk '{t[$1] += $2} END {for (k in t) printf "%s=%d ", k, t[k]}'; }
# The checkpoints begun so far: a page's first change after a checkpoint writes the whole page
# to the WAL.
checkpoints() { psql -c "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"; }
# The WAL a run wrote (records, bytes, of them full-page images) and the checkpoints it began,
# as JSON: from the WAL itself between the run's positions.
wal_of_run() { # start-position end-position checkpoints-before
  pg_wal_between "$WORK" "$1" "$2" | awk -v c=$(($(checkpoints) - $3)) '$1 == "Total" {
      printf "{\"records\": %d, \"bytes\": %d, \"fpi_bytes\": %d, \"checkpoints\": %d}", $2, $5, $4, c }'
}

run() { # name urls node-pids...
  local name=$1 urls=$2; shift 2
  local before=() after=() pg_before pg_after wal_start wal_checkpoints wal lg_ticks
  for pid in "$@"; do before+=("$(ticks "$pid")"); done
  pg_before=$(pg_snapshot)
  wal_start=$(pg_wal_position "$DB_PORT") wal_checkpoints=$(checkpoints)
  psql -c "SELECT pg_stat_statements_reset()" >/dev/null
  timeout 600 "$COLLOQUY" loadgen --url "$urls" --conversations "$CONVERSATIONS" --turns "$TURNS" \
    --total "$TOTAL" --text-bytes "$TEXT" --version 1.0 --timeout-secs 60 --json \
    >"$WORK/last.out" &
  local lg=$! loadgen=""
  # The loadgen is timeout's child: sample its CPU until it exits.
  while kill -0 "$lg" 2>/dev/null; do
    [ -n "$loadgen" ] || loadgen=$(pgrep -P "$lg" || true)
    [ -n "$loadgen" ] && lg_ticks=$(ticks "$loadgen")
    sleep 0.1
  done
  wait "$lg" || true
  # Statements by the database's own time (parse/plan + execute), per run.
  psql -F ' | ' -c "SELECT calls, round(total_plan_time::numeric, 1), round(total_exec_time::numeric, 1), \
      left(regexp_replace(query, '\s+', ' ', 'g'), 80) FROM pg_stat_statements \
      ORDER BY total_plan_time + total_exec_time DESC LIMIT 10" >"$WORK/statements.$name" || true
  pg_after=$(pg_snapshot)
  wal=$(wal_of_run "$wal_start" "$(pg_wal_position "$DB_PORT")" "$wal_checkpoints")
  local node_ticks=0 i=0
  for pid in "$@"; do node_ticks=$((node_ticks + $(ticks "$pid") - before[i])); i=$((i + 1)); done
  tail -1 "$WORK/last.out" | jq -c --arg name "$name" --argjson nodes "$node_ticks" \
    --argjson loadgen "${lg_ticks:-0}" --arg pgb "$pg_before" --arg pga "$pg_after" \
    --argjson hz "$(getconf CLK_TCK)" --argjson round "${ROUND:-0}" --argjson wal "${wal:-null}" \
    --rawfile statements "$WORK/statements.$name" \
    '. + {name: $name, round: $round, hz: $hz, node_ticks: $nodes, loadgen_ticks: $loadgen, pg_before: $pgb, pg_after: $pga, wal: $wal, statements: $statements}'
}

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
echo "nproc=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg) postgres=$("$PG_BIN/postgres" --version)" >&2
SLED_URL="http://127.0.0.1:$SLED_PORT/"
A_URL="http://127.0.0.1:$PG_A_PORT/"
B_URL="http://127.0.0.1:$PG_B_PORT/"
if [ "${PREFILL:-0}" -gt 0 ]; then
  # The database as a service's would be: large, its dead rows vacuumed, its pages checkpointed.
  # The two nodes store PREFILL turns first (each turn as measured: CONVERSATIONS in flight).
  echo "prefill: $PREFILL turns..." >&2
  TOTAL_SAVED=$TOTAL; TOTAL=$((PREFILL / TURNS))
  run prefill "http://127.0.0.1:$PG_A_PORT/,http://127.0.0.1:$PG_B_PORT/" "$PG_A_PID" "$PG_B_PID" |
    jq -r '"prefill: \(.turns_ok) turns at \(.turns_per_s | floor) turns/s"' >&2
  TOTAL=$TOTAL_SAVED
  psql -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
  psql -c "SELECT 'prefill: ' || pg_size_pretty(pg_database_size('postgres'))" >&2
fi
# Warm every node (connections, pools, allocator, page cache).
TOTAL_SAVED=$TOTAL; TOTAL=$CONVERSATIONS
run warm "$SLED_URL" "$SLED_PID" >/dev/null
run warm "$A_URL,$B_URL" "$PG_A_PID" "$PG_B_PID" >/dev/null
TOTAL=$TOTAL_SAVED
for ROUND in $(seq 1 "$ROUNDS"); do
  configs=("sled" "pg_one" "pg_two")
  [ $((ROUND % 2)) -eq 0 ] && configs=("pg_two" "pg_one" "sled")
  for config in "${configs[@]}"; do
    case $config in
      sled) run "1 node, sled" "$SLED_URL" "$SLED_PID" >>"$RESULTS" ;;
      pg_one) run "1 node, PostgreSQL" "$A_URL" "$PG_A_PID" >>"$RESULTS" ;;
      pg_two) run "2 nodes, PostgreSQL" "$A_URL,$B_URL" "$PG_A_PID" "$PG_B_PID" >>"$RESULTS" ;;
    esac
  done
done
echo "load after=$(cut -d' ' -f1-3 /proc/loadavg)" >&2
cp "$RESULTS" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true

python3 - "$RESULTS" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def kinds(text):
    return {k: int(v) for k, v in (p.split("=") for p in text.split())}
def pg_delta(r):
    before, after = kinds(r["pg_before"]), kinds(r["pg_after"])
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}
sled = [r["turns_per_s"] for r in rows if r["name"] == "1 node, sled"]
base = sum(sled) / len(sled) if sled else float("nan")
# The machine is shared and its speed drifts over a long run (sled's own node too): each run is
# also compared with the sled run of its own round, three runs apart at most.
round_sled = {r["round"]: r["turns_per_s"] for r in rows if r["name"] == "1 node, sled"}
def x_round(r):
    return r["turns_per_s"] / round_sled.get(r["round"], float("nan"))
print()
print(f"{'setup':<20} {'turns/s':>8} {'x sled':>6} {'x round':>7} {'p50 ms':>7} {'p99 ms':>7} {'max':>7} "
      f"{'ok/sent':>11} {'errors':>6}  {'CPU us/turn: nodes':>18} {'postgres':>8} {'loadgen':>7} {'total':>6}")
for r in rows:
    hz, ok = r["hz"], max(r["turns_ok"], 1)
    us = lambda ticks: 1e6 * ticks / hz / ok
    pg = sum(pg_delta(r).values())
    l = r["latency_ms"]
    errors = sum(r["errors"].values())
    total = r["node_ticks"] + pg + r["loadgen_ticks"]
    print(f"{r['name']:<20} {r['turns_per_s']:>8.0f} {r['turns_per_s'] / base:>6.2f} {x_round(r):>7.2f} {l['p50']:>7.2f} "
          f"{l['p99']:>7.2f} {l['max']:>7.1f} {str(r['turns_ok']) + '/' + str(r['turns_sent']):>11} "
          f"{errors:>6}  {us(r['node_ticks']):>18.0f} {us(pg):>8.0f} {us(r['loadgen_ticks']):>7.0f} {us(total):>6.0f}")
    if r["errors"]:
        print(f"{'':<20} errors: {r['errors']}")
for name in ("1 node, PostgreSQL", "2 nodes, PostgreSQL"):
    ratios = [x_round(r) for r in rows if r["name"] == name]
    if ratios:
        print(f"{name}: x its round's sled, mean {sum(ratios) / len(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} runs)")
print("\nPostgreSQL CPU by process kind, us per turn:")
for r in rows:
    if "PostgreSQL" not in r["name"]:
        continue
    d = {k: v for k, v in sorted(pg_delta(r).items(), key=lambda kv: -kv[1]) if v > 0}
    ok = max(r["turns_ok"], 1)
    print(f"  {r['name']:<20} " + ", ".join(f"{k} {1e6 * v / r['hz'] / ok:.0f}" for k, v in d.items()))
print("\nWAL per turn (pg_waldump; full-page images follow each checkpoint), checkpoints begun in the run:")
for r in rows:
    if "PostgreSQL" not in r["name"] or not r.get("wal"):
        continue
    d, ok = r["wal"], max(r["turns_ok"], 1)
    print(f"  {r['name']:<20} {d['bytes'] / ok:>7.0f} B, {d['records'] / ok:>5.1f} records, "
          f"{d['fpi_bytes'] / ok:>5.0f} B of full pages, {d['checkpoints']} checkpoints")
last = [r for r in rows if r["name"] == "2 nodes, PostgreSQL"][-1:]
for r in last:
    ok = max(r["turns_ok"], 1)
    print(f"\nStatements of the last '{r['name']}' run (pg_stat_statements; calls, plan and execution time per turn):")
    for line in r["statements"].splitlines():
        calls, plan, execute, query = line.split(" | ", 3)
        print(f"  {int(calls) / ok:>5.2f} {1000 * float(plan) / ok:>6.1f} {1000 * float(execute) / ok:>7.1f} us  {query}")
EOF
