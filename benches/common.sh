# Shared helpers of the bench scripts (sourced).
set -euo pipefail
# The servers started here serve HTTP only (gRPC on, at its default port, would clash).
export COLLOQUY_GRPC_LISTEN="${COLLOQUY_GRPC_LISTEN-}"
cd "$(dirname "$0")/.."
COLLOQUY=${COLLOQUY:-target/release/colloquy}
build() {
  echo "building release..." >&2
  cargo build --release --bin colloquy >&2
  cargo bench --no-run --bench fill_store --bench baseline_server >&2 2>/dev/null || cargo bench --no-run --bench fill_store --bench baseline_server >&2
}
bench_bin() { # name
  cargo bench --no-run --bench "$1" --message-format=json 2>/dev/null \
    | jq -r --arg n "$1" 'select(.executable != null and .target.name == $n) | .executable' | tail -1
}
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
metric() { # port name
  curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {print $2}' | tail -1
}
wait_ready() { # port [seconds]
  local deadline=$(( $(date +%s) + ${2:-30} ))
  until curl -sf -o /dev/null "http://127.0.0.1:$1/readyz"; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "server on $1 not ready" >&2; return 1; }
    sleep 0.01
  done
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
