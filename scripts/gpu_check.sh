#!/usr/bin/env bash
# Measure what lmtune does on this machine's GPU and write one JSON file to attach to a bug report: the
# CUDA tests, diagnose, bench (default and low-resource configs, --concurrency 1,2,4, --fuse 1,2,4,7)
# and a shortened lr_grid sweep. Without a GPU it says which steps need one and smoke-tests the rest on a
# tiny model on the CPU (what CI runs). Extra arguments go to python -m lmtune.gpu_check, e.g. --out FILE.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
python -m lmtune.gpu_check "$@"
