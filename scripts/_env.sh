# Shared by scripts/demo, scripts/test and scripts/matrix: find or bootstrap uv; the scripts then
# sync .venv from uv.lock (or, for the matrix, install into environments of their own).
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
# Installs compile bytecode (.pyc) as pip does by default and uv does not. Without it, where
# PYTHONDONTWRITEBYTECODE=1 is set (common in container images) no .pyc is ever written, and every
# process compiles Prefect, Airflow and their dependencies from source again: importing prefect,
# airflow.sdk and dibs took 3.4 s instead of 1.8 s on 2 cores, 15 to 27 s instead of 6 to 8 s on a
# busy machine, paid by every test subprocess. Compiling adds about 9 s to the first sync (a fresh
# .venv with every extra: 9.5 s instead of 1 s on 2 cores, uv's cache warm) and nothing to later
# ones that install nothing. UV_COMPILE_BYTECODE=0 turns it off.
export UV_COMPILE_BYTECODE="${UV_COMPILE_BYTECODE:-1}"
# That compiles what uv installs from wheels, but not this checkout: uv sync installs the project
# editable (its modules read in place from src/, airflow_provider/, prefect_integration/), and
# nothing compiles those. Under PYTHONDONTWRITEBYTECODE=1 no process ever writes their .pyc, so each
# one compiled dibs (and the provider, prefect_dibs) from source when it imported them: a fresh
# process's first reservation on PostgreSQL after `import prefect` took 0.33-0.55 s instead of
# 0.22-0.24 s on 2 cores (issue 30). The scripts that sync call this right after.
compile_checkout() {
  if [[ "$UV_COMPILE_BYTECODE" != "0" ]]; then
    "$ROOT/.venv/bin/python" -m compileall -q -j 0 "$ROOT/src" "$ROOT/airflow_provider" "$ROOT/prefect_integration" >/dev/null
  fi
}
