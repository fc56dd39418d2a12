# Sourced by scripts/test.sh and scripts/quickstart.sh (not run directly): make sure the repo's
# .venv exists with lmtune installed (editable, with the dev tools), then activate it.
#
# torch==2.13.0 is installed FIRST and on its own: where a local CPU wheel is offered (PIP_FIND_LINKS)
# pip takes it, and `pip install -e .` then finds torch already satisfied instead of pulling the
# multi-GB CUDA build. Re-installs only when pyproject.toml changes. PYTHON=... picks the interpreter.

_lmtune_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$_lmtune_root"

if [ ! -x .venv/bin/python ]; then
    _lmtune_python="${PYTHON:-python3}"
    if ! "$_lmtune_python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "error: lmtune needs Python >= 3.11; '$_lmtune_python' is $("$_lmtune_python" --version 2>&1)." \
             "Set PYTHON=/path/to/python3.11 and retry" >&2
        exit 2
    fi
    echo "setup: creating .venv with $("$_lmtune_python" --version 2>&1)"
    "$_lmtune_python" -m venv .venv
fi

_lmtune_stamp=.venv/.lmtune-installed
_lmtune_want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$_lmtune_stamp" 2>/dev/null || true)" != "$_lmtune_want" ]; then
    echo "setup: installing torch==2.13.0, then lmtune[dev] into .venv"
    _lmtune_pip=(.venv/bin/python -m pip --no-input --disable-pip-version-check install --progress-bar off)
    "${_lmtune_pip[@]}" "torch==2.13.0"
    "${_lmtune_pip[@]}" -e ".[dev]"
    echo "$_lmtune_want" > "$_lmtune_stamp"
fi

# shellcheck disable=SC1091
source .venv/bin/activate
