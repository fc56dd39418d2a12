#!/usr/bin/env bash
# Set up .venv if needed, lint, type-check lmtune/ (mypy, pyproject.toml's [tool.mypy]), and run every test (the
# slow end-to-end ones included).
# This is exactly what CI runs (.ci/run), on two workers (pytest-xdist; tests/conftest.py says which files run
# one after another). Extra arguments go to pytest, e.g. -m "not slow" or -n 0 (one process).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" dev
ruff check lmtune tests
python -m mypy lmtune
python -m pytest -q -n 2 --durations=10 "$@"
