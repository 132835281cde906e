#!/usr/bin/env bash
# Installs what bench/peers compares danube with: Debian's nats-server and redis-server (only
# those missing), and their Python clients (the project's bench-peers extra: nats-py, redis-py
# with hiredis). Run once from the repository root: bash bench/peers/setup.sh
# The default test suite needs none of it.
set -euo pipefail
cd "$(dirname "$0")/../.."

missing=()
command -v nats-server >/dev/null || missing+=(nats-server)
command -v redis-server >/dev/null || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null; then SUDO="sudo"; else
            echo "bench/peers/setup.sh: ${missing[*]} missing, and installing needs root (no sudo here):" >&2
            echo "  apt-get install -y ${missing[*]}   (as root), then run this again" >&2
            exit 1
        fi
    fi
    if ! command -v apt-get >/dev/null; then
        echo "bench/peers/setup.sh: ${missing[*]} missing and this system has no apt-get;" >&2
        echo "  install them with its package manager (the benches need the binaries on PATH)" >&2
        exit 1
    fi
    if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${missing[@]}"; }; then
        echo "bench/peers/setup.sh: apt-get could not install ${missing[*]} (see above)" >&2
        exit 1
    fi
    # Debian's redis-server package may start a system instance; the benchmarks start their own on
    # a free loopback port and never touch it.
fi
# The extra's requirements as pyproject.toml lists them, without reinstalling the project itself.
requirements=$(python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["bench-peers"]))')
mapfile -t requirements <<<"$requirements"
python -m pip install -q "${requirements[@]}" || {
    echo "bench/peers/setup.sh: pip could not install the bench-peers extra (nats-py, redis[hiredis])" >&2
    exit 1
}
echo "peers ready: $(command -v nats-server) ($(nats-server --version)), $(command -v redis-server) ($(redis-server --version | cut -d' ' -f3))"
