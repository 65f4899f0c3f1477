#!/usr/bin/env bash
# Install PgBouncer (Debian package "pgbouncer", 1.18 on Debian 12), the connection pooler the
# PostgreSQL store is tested behind in both pool modes with stock settings (tests/postgres_servers.py:
# tests/test_pgbouncer.py, tests/test_pooled_processes.py, tests/contract/test_pooled_contract.py).
# Only the binary is used: the tests start their own PgBouncer processes on free loopback ports (a
# service the package may start on localhost:6432 is left as it is). Idempotent, so CI can call it on
# every run. Without it those tests skip (and fail under DIBS_REQUIRE_SERVICES=1); DIBS_PGBOUNCER=/path/to/pgbouncer
# points the tests at another binary.
#
# Debian/Ubuntu: apt-get (as root, or through sudo). Elsewhere: install PgBouncer with the system's
# package manager and set DIBS_PGBOUNCER.
set -euo pipefail

found() {
    local bin
    for bin in "${DIBS_PGBOUNCER:-}" "$(command -v pgbouncer 2>/dev/null || true)" /usr/sbin/pgbouncer; do
        if [[ -n "$bin" && -x "$bin" ]]; then
            echo "$bin"
            return 0
        fi
    done
    return 1
}

if bin="$(found)"; then
    echo "install-pgbouncer: already installed: $bin"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-pgbouncer: no apt-get here; install PgBouncer with your package manager and set DIBS_PGBOUNCER" >&2
    exit 1
fi
sudo=()
if [[ "$(id -u)" != 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install-pgbouncer: need root (or sudo) to run apt-get install pgbouncer" >&2
        exit 1
    fi
    sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null
if ! bin="$(found)"; then
    echo "install-pgbouncer: apt-get installed pgbouncer but no pgbouncer binary was found" >&2
    exit 1
fi
echo "install-pgbouncer: installed $bin"
