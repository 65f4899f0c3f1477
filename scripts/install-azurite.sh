#!/usr/bin/env bash
# Install Azurite (Microsoft's official Azure Storage emulator) into the project, for the Azure
# store's tests: .cache/azurite/node_modules/.bin/azurite-blob. Project-local, never global, so it
# needs no root and leaves the machine's Node alone; idempotent, so CI can call it on every run.
#
# Needs Node.js >= 18 and npm. The version is pinned so that CI does not change emulators under the
# tests' feet; choose another with AZURITE_VERSION (an exact version, or a prefix such as "3").
# tests/azurite.py looks for the binary here, or wherever DIBS_AZURITE_BIN points.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="$root/.cache/azurite"
version="${AZURITE_VERSION:-3.35.0}"
bin="$prefix/node_modules/.bin/azurite-blob"

if ! command -v npm >/dev/null 2>&1; then
    echo "install-azurite: npm not found; install Node.js >= 18 (e.g. apt-get install nodejs npm)" >&2
    exit 1
fi

# Already there (and matching the requested version prefix, e.g. "3" matches "3.35.0")? Done.
if [[ -x "$bin" ]] && installed="$("$bin" --version 2>/dev/null)" && [[ "$installed" == "$version"* ]]; then
    echo "install-azurite: already installed: $bin ($installed)"
    exit 0
fi

mkdir -p "$prefix"
# A package.json of our own makes npm treat this folder as the project root instead of walking up
# to some parent folder's package.json.
if [[ ! -f "$prefix/package.json" ]]; then
    printf '{\n  "name": "dibs-azurite",\n  "private": true,\n  "description": "Azurite for the dibs test suite (scripts/install-azurite.sh)"\n}\n' \
        >"$prefix/package.json"
fi
npm install --no-audit --no-fund --no-save --loglevel=error --prefix "$prefix" "azurite@$version"

if ! "$bin" --version >/dev/null 2>&1; then
    echo "install-azurite: npm finished but $bin does not run" >&2
    exit 1
fi
echo "install-azurite: installed $bin ($("$bin" --version))"
