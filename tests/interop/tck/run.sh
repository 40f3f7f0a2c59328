#!/usr/bin/env bash
# Runs an installed official A2A TCK (a2aproject/a2a-tck) against colloquy and prints each
# suite's pytest summary, its failures and (1.0 line) the requirements by outcome.
#
#   A2A_TCK=DIR tests/interop/tck/run.sh           # the 1.0 line: must and should, JSON-RPC, HTTP+JSON and gRPC
#   A2A_TCK_V03=DIR tests/interop/tck/run.sh       # the 0.3 line: mandatory and capabilities, JSON-RPC and REST
#
# DIR is a checkout of the TCK with its dependencies installed in DIR/.venv (docs/testing.md says
# how, and which commits were run); set A2A_TCK_PYTHON / A2A_TCK_V03_PYTHON for another Python.
# Both may be set. Nothing is fetched from the network: the TCK's own tests reach only the
# server this script starts (and their own webhook receiver, on loopback).
#
# Other settings:
#   COLLOQUY=BINARY                  # default: target/release/colloquy, built if missing
#   TRANSPORTS_10="jsonrpc http_json grpc" LEVELS_10="must should"
#   TRANSPORTS_03="jsonrpc rest"     CATEGORIES_03="mandatory capabilities"
#   CARD_VERSIONS_10=1.0             # the card's versions on the 1.0 line (default: 1.0)
#   CARD_VERSIONS_03=                # ... on the 0.3 line (default: empty, both, as colloquy serves it)
#   LOGS=DIR                         # each suite's full output (default: target/tck)
#
# The server runs the scenario agent beside this script (tests/interop/tck/scenario_agent.py),
# which answers each TCK scenario as the TCK's feature files describe, keyed by messageId
# prefix. The 0.3 line assumes a SUT whose other tasks wait for input; the agent does that there.
#
# The card: the 1.0 line checks it against the 1.0 schema, which allows no field of v0.3's, and
# a card that speaks both versions (colloquy's default, as the official Python SDK's when it has a
# v0.3 interface) must carry v0.3's `url`, `protocolVersion`, ...; so the 1.0 line runs against a
# server whose card speaks 1.0 alone (`card.versions = "1.0"`), the 0.3 line against the default.
#
# gRPC (1.0 line only): when TRANSPORTS_10 names grpc, the 1.0 server also serves the gRPC binding
# (--grpc-listen) on a second free loopback port; the TCK finds it in the card's supportedInterfaces
# (the GRPC entry, "127.0.0.1:PORT") and dials it. Otherwise grpc_listen is empty: no gRPC.
set -euo pipefail
cd "$(dirname "$0")/../../.."
HERE=tests/interop/tck

[ -n "${A2A_TCK:-}${A2A_TCK_V03:-}" ] || {
  echo "set A2A_TCK (the TCK's 1.0 line) and/or A2A_TCK_V03 (its 0.3 line): see docs/testing.md" >&2
  exit 2
}
if [ -z "${COLLOQUY:-}" ]; then
  [ -x target/release/colloquy ] || cargo build --release --bin colloquy >&2
fi
COLLOQUY=$(realpath "${COLLOQUY:-target/release/colloquy}")
LOGS=$(mkdir -p "${LOGS:-target/tck}" && realpath "${LOGS:-target/tck}")
WORK=$(mktemp -d)
SERVER=""
cleanup() {
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# serve DEFAULT VERSIONS [grpc]: a fresh server on a free port, its agent's unmatched messages
# DEFAULT ("complete" or "input-required"), its card's versions VERSIONS (empty: both), with the
# gRPC binding on another free port if asked (else none); sets PORT, GRPC_PORT (empty without
# gRPC) and SERVER.
serve() {
  [ -n "$SERVER" ] && { kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; }
  PORT=$(free_port)
  GRPC_PORT=""
  local grpc_listen=""
  if [ "${3:-}" = grpc ]; then
    GRPC_PORT=$(free_port)
    while [ "$GRPC_PORT" = "$PORT" ]; do GRPC_PORT=$(free_port); done
    grpc_listen="127.0.0.1:$GRPC_PORT"
  fi
  local versions=""
  [ -n "$2" ] && versions="versions = \"$2\""
  cat >"$WORK/colloquy.toml" <<EOF
[agent]
kind = "exec"
command = ["python3", "$(realpath "$HERE/scenario_agent.py")"]
env = ["TCK_DEFAULT"]

[card]
$versions

# The TCK's webhook receiver listens on loopback.
[push]
allow_private_networks = true
EOF
  rm -rf "$WORK/data"
  # --grpc-listen as a flag (as --listen): it beats a COLLOQUY_GRPC_LISTEN in the environment;
  # empty serves no gRPC (so never the default 127.0.0.1:8081).
  TCK_DEFAULT=$1 "$COLLOQUY" serve --config "$WORK/colloquy.toml" --listen "127.0.0.1:$PORT" \
    --grpc-listen "$grpc_listen" --data "$WORK/data" 2>"$LOGS/server.log" &
  SERVER=$!
  for _ in $(seq 1 200); do
    curl -sf -o /dev/null "http://127.0.0.1:$PORT/readyz" && return
    sleep 0.05
  done
  echo "colloquy did not become ready (see $LOGS/server.log)" >&2
  exit 1
}

summary() { grep -E '^=* ?[0-9]+ (passed|failed|error).* in [0-9.]+s' "$1" | tail -1 || echo "(no summary: see $1)"; }

if [ -n "${A2A_TCK_V03:-}" ]; then
  python=${A2A_TCK_V03_PYTHON:-$A2A_TCK_V03/.venv/bin/python}
  serve input-required "${CARD_VERSIONS_03:-}"
  for transport in ${TRANSPORTS_03:-jsonrpc rest}; do
    for category in ${CATEGORIES_03:-mandatory capabilities}; do
      log="$LOGS/v03-$category-$transport.txt"
      (cd "$A2A_TCK_V03" && "$python" run_tck.py --sut-url "http://127.0.0.1:$PORT" \
        --category "$category" --transports "$transport" >"$log" 2>&1) || true
      echo "0.3 $category $transport: $(summary "$log")"
      grep -E '^FAILED ' "$log" | sed 's/^/    /' || true
    done
  done
fi

if [ -n "${A2A_TCK:-}" ]; then
  python=${A2A_TCK_PYTHON:-$A2A_TCK/.venv/bin/python}
  transports_10=${TRANSPORTS_10:-jsonrpc http_json grpc}
  case " $transports_10 " in
    *" grpc "*) serve complete "${CARD_VERSIONS_10-1.0}" grpc ;;
    *) serve complete "${CARD_VERSIONS_10-1.0}" ;;
  esac
  for transport in $transports_10; do
    for level in ${LEVELS_10:-must should}; do
      log="$LOGS/v10-$level-$transport.txt"
      (cd "$A2A_TCK" && "$python" run_tck.py --sut-host "http://127.0.0.1:$PORT" \
        --transport "$transport" --level "$level" >"$log" 2>&1) || true
      requirements=""
      if [ -f "$A2A_TCK/reports/compatibility.json" ]; then
        cp "$A2A_TCK/reports/compatibility.json" "$LOGS/v10-$level-$transport.json"
        requirements=$(python3 - "$LOGS/v10-$level-$transport.json" "$transport" <<'PY'
import collections, json, sys
report, transport = json.load(open(sys.argv[1])), sys.argv[2]
outcomes = collections.Counter()
for requirement in report.get("per_requirement", {}).values():
    outcome = requirement["transports"].get(transport)
    if outcome is None and "agent_card" in requirement["transports"]:
        # A card requirement's per-test outcome is its last test's: its status counts them all.
        outcome = requirement.get("status") or requirement["transports"]["agent_card"]
    if outcome:
        outcomes[outcome] += 1
print(" | requirements " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
PY
)
      fi
      echo "1.0 $level $transport: $(summary "$log")$requirements"
      grep -E '^FAILED ' "$log" | sed 's/^/    /' || true
    done
  done
fi
