#!/usr/bin/env bash
# Installs everything the tests need (project + test extras, compiled core) and runs the whole suite.
# Extra arguments go to pytest, e.g. `bash ci/test.sh -m slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -e '.[test]'
# The web console's browser test (tests/e2e/test_gateway_console.py) drives Debian's chromium headless.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null \
        || echo "ci/test.sh: chromium could not be installed: the console's browser test will skip" >&2
fi
# Lint first (seconds): ruff, ruff format on the packages it owns, mypy, cython-lint (ci/lint.sh).
bash ci/lint.sh
# In-place build too, so src/ imports find the compiled modules whatever the install mode.
python setup.py --quiet build_ext --inplace
python -m pytest "$@"
# The pure-Python twins on their own, as aiokafka tests itself without its extensions: the unit
# suite again with the compiled core switched off (danube._native loads danube._pure.*; the suite
# checks it did), and the integration tests that run a broker or a client in this process, which
# drive the codec and the WAL end to end.
DANUBE_NO_EXTENSIONS=1 python -m pytest -q tests/unit tests/integration/client tests/integration/server \
    tests/integration/routing/repartition tests/integration/storage/test_s3_tiered_reader.py
