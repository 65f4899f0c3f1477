#!/usr/bin/env bash
# Install redis-server and redis-cli, which the Redis topology tests and benchmarks start themselves:
# a 3-master Redis Cluster (redis-cli --cluster create) and a Sentinel set (redis-server --sentinel),
# on free loopback ports (tests/redis_topologies.py). The shared Redis of DIBS_TEST_REDIS_URL is not
# enough for those. Idempotent, so CI can call it on every run. Without them those tests skip (and
# fail under DIBS_REQUIRE_SERVICES=1).
#
# Debian/Ubuntu: apt-get (as root, or through sudo). The package may start its own service on port
# 6379; the tests start their servers on free ports of their own and never touch it.
# Elsewhere: install Redis 7 with the system's package manager (redis-server and redis-cli on PATH).
set -euo pipefail

if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    echo "install-redis-server: already installed: $(redis-server --version | cut -d' ' -f1-3)"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-redis-server: no apt-get here; install redis-server and redis-cli with your package manager" >&2
    exit 1
fi
sudo=()
if [[ "$(id -u)" != 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install-redis-server: need root (or sudo) to run apt-get install redis-server" >&2
        exit 1
    fi
    sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "install-redis-server: apt-get installed redis-server but redis-server or redis-cli is not on PATH" >&2
    exit 1
fi
echo "install-redis-server: installed $(redis-server --version | cut -d' ' -f1-3)"
