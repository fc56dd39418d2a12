#!/usr/bin/env bash
# Run lmtune on the oldest or newest torch and dependencies pyproject.toml admits (or a torch of your choice), in a
# virtualenv of its own, and append the outcome to benchmarks/results.jsonl (scripts/compat_check.py says how).
#   bash scripts/compat_check.sh oldest | newest | 2.11.0 [--work DIR] [--no-record]
# Needs Python >= 3.11 and the package index: PyPI's torch is a CUDA build, several GB to download.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python3}" scripts/compat_check.py "$@"
