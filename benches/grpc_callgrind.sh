#!/usr/bin/env bash
# Instructions per turn on the gRPC binding against JSON-RPC v1.0, counted by callgrind (the
# same binary and load give the same count whatever else the machine does).
#
#   benches/grpc_callgrind.sh [BINARY]          # default target/release/colloquy
#   N=300 ROUNDS=2 benches/grpc_callgrind.sh
#
# Each run starts `colloquy serve` under callgrind on a fresh data folder, drives N two-turn
# conversations one at a time with benches/grpc_turns.py (outside callgrind), stops the server
# and reads the whole process's instruction count. A run with no conversations gives what
# starting and stopping cost; each mode's count less that, over 2N turns, is printed per turn.
# Needs the interop venv with a2a-sdk[grpc] (tests/interop/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/colloquy}
N=${N:-300}; ROUNDS=${ROUNDS:-2}
PYTHON=${PYTHON:-target/interop/sdk1/bin/python}
[ -x "$BIN" ] || cargo build --release --bin colloquy >&2
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# run MODE COUNT: the server's instruction count for COUNT conversations over MODE.
run() {
  local work http grpc pid
  work=$(mktemp -d); http=$(free_port); grpc=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$BIN" serve \
    --listen "127.0.0.1:$http" --grpc-listen "127.0.0.1:$grpc" --data "$work/d" \
    --log-format json 2>"$work/log" &
  pid=$!
  for _ in $(seq 1 600); do
    curl -sf -o /dev/null "http://127.0.0.1:$http/readyz" && break
    sleep 0.2
  done
  "$PYTHON" benches/grpc_turns.py "$1" "$http" "$grpc" "$2" >&2
  kill -TERM "$pid"; wait "$pid" || true
  sed -n 's/^summary: //p' "$work/cg.out"
  rm -rf "$work"
}

base=$(run jsonrpc 0)
echo "start and stop: $base instructions"
for round in $(seq 1 "$ROUNDS"); do
  for mode in grpc jsonrpc; do
    total=$(run "$mode" "$N")
    echo "round $round $mode: $(( (total - base) / (2 * N) )) instructions a turn ($total in all)"
  done
done
