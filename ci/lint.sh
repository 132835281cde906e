#!/usr/bin/env bash
# The lint step: a few seconds, run by ci/test.sh before the tests (and by `pre-commit run --all-files`).
# Configuration: [tool.ruff], [tool.mypy] and [tool.cython-lint] in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check src tests bench
python -m ruff format --check src tests bench   # the formatter owns the whole tree
python -m mypy                      # the packages listed in [tool.mypy] files
cython-lint src/danube/_core
