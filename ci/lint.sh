#!/usr/bin/env bash
# The lint step: a few seconds, run by ci/test.sh before the tests (and by `pre-commit run --all-files`).
# Configuration: [tool.ruff], [tool.mypy] and [tool.cython-lint] in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check src tests bench
# The formatter owns these so far; add a package here once it is formatted (`ruff format <dir>`).
python -m ruff format --check src/danube/client src/danube/errors.py src/danube/status_codes.py tests/unit/client \
    src/danube/broker/dispatch src/danube/broker/contracts.py src/danube/broker/delivery.py \
    src/danube/gateway
python -m mypy                      # the packages listed in [tool.mypy] files
cython-lint src/danube/_core
