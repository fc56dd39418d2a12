#!/usr/bin/env bash
# Set up .venv if needed, lint, and run every test (the slow end-to-end ones included).
# This is exactly what CI runs (.ci/run). Extra arguments go to pytest, e.g. -m "not slow".
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" dev
ruff check lmtune tests
python -m pytest -q --durations=10 "$@"
