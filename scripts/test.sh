#!/usr/bin/env bash
# Set up .venv if needed, lint, and run every test (the slow end-to-end ones included).
# This is exactly what CI runs (.ci/run). Extra arguments go to pytest, e.g. -m "not slow".
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
ruff check lmtune tests
# Two workers (pytest-xdist; LMTUNE_TEST_WORKERS=N for another count, 0 for none): each file's tests run in one
# worker, and every test of the session's quick sweep in one (tests/conftest.py), so each sweep trains once.
python -m pytest -q --durations=10 -n "${LMTUNE_TEST_WORKERS:-2}" --dist loadgroup "$@"
