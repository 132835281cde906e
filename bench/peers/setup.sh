#!/usr/bin/env bash
# Installs what bench/peers/run.py compares against: Debian's nats-server and redis-server,
# and their Python clients (nats-py, redis-py). Run once: bash bench/peers/setup.sh
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi
$SUDO apt-get update
$SUDO apt-get install -y nats-server redis-server
# The Debian redis-server package starts a system instance; the benchmark starts its own on a
# free loopback port and never touches the system one.
python -m pip install "nats-py>=2.7" "redis>=5"
echo "peers ready: $(command -v nats-server) $(command -v redis-server)"
