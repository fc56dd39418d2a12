#!/usr/bin/env bash
# Set up .venv if needed, lint, type-check lmtune/ (mypy, pyproject.toml's [tool.mypy]), and run the tests.
#   bash scripts/test.sh            the per-push tier: what CI runs on every push (.ci/run), under 15 minutes on 2 cores
#   bash scripts/test.sh --release  the release tier too: installs, the autoscaler rehearsal, the GPU check's
#                                   environments, the docs' commands at their full tiny budget, the test-size truths
# Both run on two workers (pytest-xdist; tests/conftest.py says which files run one after another, and each tier's
# time limit per test). docs/contributing.md says when a change must run the release tier. Extra arguments go to
# pytest, e.g. -m "not slow" (the inner loop) or -n 0 (one process).
set -euo pipefail
tier=()
if [ "${1:-}" = "--release" ]; then
    tier=(--release)
    shift
fi
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" dev
ruff check lmtune tests
python -m mypy lmtune
python -m pytest -q -n 2 --durations=10 "${tier[@]}" "$@"
