# Shared by scripts/demo and scripts/test: find or bootstrap uv, then sync .venv from uv.lock.
# Sourced, not run. Needs only python3 (3.11+) on PATH; everything else comes from PyPI.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if command -v uv >/dev/null 2>&1; then
  UV="$(command -v uv)"
else
  UV="$ROOT/.cache/bootstrap/bin/uv"
  if [ ! -x "$UV" ]; then
    echo "scripts: installing uv into .cache/bootstrap (one time)" >&2
    python3 -m venv "$ROOT/.cache/bootstrap"
    "$ROOT/.cache/bootstrap/bin/pip" install --quiet --disable-pip-version-check uv
  fi
fi
export UV_PYTHON_PREFERENCE="${UV_PYTHON_PREFERENCE:-system}"
