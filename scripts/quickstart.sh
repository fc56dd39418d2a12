#!/usr/bin/env bash
# Set up .venv if needed, run the edge search quick_edge on the built-in corpus, then write its
# edge-of-stability report. Extra arguments go to `python -m lmtune.run`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" runtime
name="quick_edge-$(date +%Y%m%d-%H%M%S)"
python -m lmtune.run --space quick_edge --name "$name" "$@"
python -m lmtune.analyze "results/$name"
