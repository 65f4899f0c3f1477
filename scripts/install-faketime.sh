#!/usr/bin/env bash
# Install libfaketime, which the reliability suite's clock-skew scenario preloads into worker
# processes (LD_PRELOAD + FAKETIME) to run their wall clocks ten minutes ahead or behind.
# Idempotent, so CI can call it on every run. Without it that scenario skips (and fails under
# DIBS_REQUIRE_SERVICES=1); reliability/faults.py also honours DIBS_LIBFAKETIME=/path/libfaketime.so.1.
#
# Debian/Ubuntu: apt-get (as root, or through sudo). Elsewhere: install libfaketime with the system's
# package manager (Fedora: dnf install libfaketime; macOS is not supported: the suite needs Linux).
set -euo pipefail

candidates=(
    /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
    /usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1
    /usr/lib64/faketime/libfaketime.so.1
    /usr/lib/faketime/libfaketime.so.1
    /usr/local/lib/faketime/libfaketime.so.1
)
found() {
    local lib
    for lib in "${DIBS_LIBFAKETIME:-}" "${candidates[@]}"; do
        if [[ -n "$lib" && -f "$lib" ]]; then
            echo "$lib"
            return 0
        fi
    done
    return 1
}

if lib="$(found)"; then
    echo "install-faketime: already installed: $lib"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-faketime: no apt-get here; install libfaketime with your package manager" >&2
    exit 1
fi
sudo=()
if [[ "$(id -u)" != 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install-faketime: need root (or sudo) to run apt-get install faketime" >&2
        exit 1
    fi
    sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends faketime >/dev/null

if ! lib="$(found)"; then
    echo "install-faketime: apt-get installed faketime but libfaketime.so.1 was not found" >&2
    exit 1
fi
echo "install-faketime: installed $lib"
