#!/usr/bin/env bash
# Self-test of the kit: each SDK client against each SDK's own reference server, both modes,
# plus cross-version pairs. Ports: SELFTEST_PORT03 (default 9103), SELFTEST_PORT1 (default 9101).
set -uo pipefail
# The servers started here serve HTTP only (gRPC on, at its default port, would clash).
export COLLOQUY_GRPC_LISTEN="${COLLOQUY_GRPC_LISTEN-}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="${INTEROP_VENVS:-$HERE/../../target/interop}"
P03="${SELFTEST_PORT03:-9103}"; P1="${SELFTEST_PORT1:-9101}"
"$HERE/setup.sh"
"$VENVS/sdk03/bin/python" "$HERE/sdk_server03.py" --port "$P03" & S03=$!
"$VENVS/sdk1/bin/python" "$HERE/sdk_server1.py" --port "$P1" --advertise-v03 & S1=$!
trap 'kill $S03 $S1 2>/dev/null' EXIT
for p in "$P03" "$P1"; do
  for _ in $(seq 50); do curl -sf "http://127.0.0.1:$p/.well-known/agent-card.json" >/dev/null && break; sleep 0.2; done
done
fail=0
run() { echo "== $*"; "$@" --expect-prefix sdk-echo: | tail -1; [ "${PIPESTATUS[0]}" = 0 ] || fail=1; }
for mode in blocking streaming; do
  run "$VENVS/sdk03/bin/python" "$HERE/client03.py" --url "http://127.0.0.1:$P03" --mode $mode
  run "$VENVS/sdk1/bin/python"  "$HERE/client1.py"  --url "http://127.0.0.1:$P1"  --mode $mode
  run "$VENVS/sdk03/bin/python" "$HERE/client03.py" --url "http://127.0.0.1:$P1"  --mode $mode
  run "$VENVS/sdk1/bin/python"  "$HERE/client1.py"  --url "http://127.0.0.1:$P03" --mode $mode
done
[ $fail = 0 ] && echo "SELFTEST OK" || { echo "SELFTEST FAILED"; exit 1; }
