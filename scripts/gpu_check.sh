#!/usr/bin/env bash
# Measure what lmtune does on this machine's GPU and write one JSON file to attach to a bug report: the
# environment, the CUDA checks, bench of the default 17M model against the naive loop, --concurrency 1,2,4,
# --fuse 1,2,4,7 and (where Ray is installed) a shortened lr_grid sweep, within 14 minutes. Without a GPU it says
# which steps need one and smoke-tests the rest on a tiny model on the CPU (what CI runs).
#   bash scripts/gpu_check.sh [--out FILE]            sets up .venv (scripts/setup.sh) first
#   bash scripts/gpu_check.sh --system [--out FILE]   the machine's own python3 and torch, nothing installed: a GPU
#                                                      box as it comes (the steps whose packages it lacks are skipped)
set -euo pipefail
if [ "${1:-}" = "--system" ]; then
    shift
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m lmtune.gpu_check "$@"
fi
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" runtime
python -m lmtune.gpu_check "$@"
