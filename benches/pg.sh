# A throwaway PostgreSQL for the bench scripts (sourced): Debian's initdb/pg_ctl, run as nobody
# when the script runs as root (PostgreSQL refuses root), durable defaults (fsync and
# synchronous_commit on), listening on 127.0.0.1 only.
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
PG_AS=()
[ "$(id -u)" = 0 ] && PG_AS=(runuser -u nobody --)

pg_start() { # work-folder port [server settings, e.g. -c name=value ...]: the data goes in WORK/db
  local work=$1 port=$2
  shift 2
  [ -x "$PG_BIN/initdb" ] || { echo "no PostgreSQL binaries (set PG_BIN)" >&2; return 1; }
  chmod 755 "$work"
  mkdir "$work/db"
  [ ${#PG_AS[@]} -gt 0 ] && chown nobody "$work/db"
  "${PG_AS[@]}" "$PG_BIN/initdb" -D "$work/db/data" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
  "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$work/db/data" -l "$work/db/log" -w -t 60 \
    -o "-p $port -k $work/db -c listen_addresses=127.0.0.1 -c max_connections=200 $*" start >/dev/null
}

pg_stop() { # work-folder
  [ -f "$1/db/data/postmaster.pid" ] || return 0
  "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$1/db/data" -m fast -w stop >/dev/null 2>&1 || true
}

pg_url() { # port
  echo "postgres://postgres@127.0.0.1:$1/postgres"
}

pg_psql() { # port [psql arguments]: unaligned, tuples only, as the scripts parse it
  local port=$1
  shift
  "$PG_BIN/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qAtX "$@"
}

pg_cpu_ticks() { # work-folder: the summed utime + stime of the database's processes now (the
  # postmaster and its children: backends, and autovacuum workers started since the last call)
  local postmaster
  postmaster=$(head -1 "$1/db/data/postmaster.pid")
  for pid in "$postmaster" $(pgrep -P "$postmaster"); do
    awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null
  done | awk '{s += $1} END {print s + 0}'
}

pg_wal_position() { # port: the WAL's insert position now
  pg_psql "$1" -c "SELECT pg_current_wal_insert_lsn()"
}

pg_wal_between() { # work-folder start end: the WAL written between two positions, by record
  # kind, one "kind records record-bytes full-page-image-bytes bytes" line each, "Total" among
  # them (pg_waldump --stats=record; exact, where pg_stat_wal trails by up to 10 s a backend).
  # pg_waldump exits 1 when the end is where the WAL's last record ends, after its figures.
  { "${PG_AS[@]}" "$PG_BIN/pg_waldump" -p "$1/db/data/pg_wal" -s "$2" -e "$3" --stats=record 2>/dev/null || true; } |
    awk '{ gsub(/[(\[][^)\]]*[)\]]/, "") } $2 ~ /^[0-9]+$/ { print $1, $2, $3, $4, $5 }'
}
