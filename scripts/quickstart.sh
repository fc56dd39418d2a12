#!/usr/bin/env bash
# Set up .venv if needed, then run the quick learning-rate sweep on the built-in corpus.
# Extra arguments go to `python -m lmtune.run`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
python -m lmtune.run --space quick "$@"
