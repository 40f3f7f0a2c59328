#!/usr/bin/env bash
# Creates the two a2a-sdk venvs used by the interop kit. Idempotent; needs python3 (>=3.10) + PyPI.
#   INTEROP_VENVS (default <repo>/target/interop)  ->  $INTEROP_VENVS/sdk03, $INTEROP_VENVS/sdk1
#   PYTHON (default python3)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="${INTEROP_VENVS:-$HERE/../../target/interop}"
PY="${PYTHON:-python3}"
mkdir -p "$VENVS"

make_venv() {  # name requirements-file expected-a2a-version [more modules to import]
  local dir="$VENVS/$1" req="$HERE/$2" want="$3" more="${4:-}"
  local stamp="$dir/.requirements.sha256"
  local sum; sum="$(sha256sum "$req" | cut -d' ' -f1)"
  if [ -x "$dir/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ] \
     && "$dir/bin/python" -c "import a2a, uvicorn, starlette, sse_starlette$more" 2>/dev/null; then
    echo "interop: $dir up to date"
    return
  fi
  echo "interop: creating $dir from $2"
  [ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  local got; got="$("$dir/bin/python" -c 'from importlib.metadata import version; print(version("a2a-sdk"))')"
  if [ "$got" != "$want" ]; then echo "interop: $dir has a2a-sdk $got, wanted $want" >&2; exit 1; fi
  echo "$sum" > "$stamp"
  echo "interop: $dir ready (a2a-sdk $got)"
}

make_venv sdk03 requirements-03.txt 0.3.26
make_venv sdk1  requirements-1.txt  1.3.0 ", grpc"
