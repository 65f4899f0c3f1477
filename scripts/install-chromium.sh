#!/usr/bin/env bash
# Install Chromium, the real browser the end-to-end Airflow test (tests/airflow/test_deployment.py)
# opens the Reservations page in, headless, through Playwright (which drives it with
# executable_path=/usr/bin/chromium: Playwright's own browser downloads are not used).
# Idempotent, so CI can call it on every run. Without it the page check skips (and fails under
# DIBS_REQUIRE_SERVICES=1); DIBS_CHROMIUM=/path/to/chromium points the test at another binary.
#
# Debian/Ubuntu: apt-get (as root, or through sudo). Elsewhere: install Chromium with the system's
# package manager and set DIBS_CHROMIUM.
set -euo pipefail

found() {
    local bin
    for bin in "${DIBS_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
        if [[ -n "$bin" && -x "$bin" ]]; then
            echo "$bin"
            return 0
        fi
    done
    return 1
}

if bin="$(found)"; then
    echo "install-chromium: already installed: $bin"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: no apt-get here; install Chromium with your package manager and set DIBS_CHROMIUM" >&2
    exit 1
fi
sudo=()
if [[ "$(id -u)" != 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install-chromium: need root (or sudo) to run apt-get install chromium" >&2
        exit 1
    fi
    sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null

if ! bin="$(found)"; then
    echo "install-chromium: apt-get installed chromium but no chromium binary was found" >&2
    exit 1
fi
echo "install-chromium: installed $bin"
