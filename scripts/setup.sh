# Sourced by scripts/quickstart.sh, scripts/test.sh and scripts/gpu_check.sh (not run directly): make sure the repo's
# .venv exists with lmtune installed (editable), then activate it. `source setup.sh runtime` installs lmtune and
# what it runs with (the main job); `source setup.sh dev` (the default) adds the test tools (pytest, ruff, moto, uv,
# wandb). A venv set up for dev serves runtime too.
#
# torch is installed FIRST and on its own ($TORCH, default torch==2.13.0): where a local CPU wheel is offered
# (PIP_FIND_LINKS) pip takes it, and `pip install -e .` then finds torch already satisfied (pyproject.toml admits any
# torch from 2.6 on) instead of pulling a multi-GB CUDA build. Re-installs only when pyproject.toml changes.
# PYTHON=... picks the interpreter.

_lmtune_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$_lmtune_root"
_lmtune_set="${1:-dev}"
case "$_lmtune_set" in
    runtime) _lmtune_target="." ;;
    dev) _lmtune_target=".[dev]" ;;
    *) echo "error: setup.sh installs 'runtime' or 'dev', not '$_lmtune_set'" >&2; exit 2 ;;
esac

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

_lmtune_want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
_lmtune_current() {  # whether the stamp of this set (or of dev, which holds runtime's too) is this pyproject's
    [ "$(cat ".venv/.lmtune-installed-$1" 2>/dev/null || true)" = "$_lmtune_want" ]
}
if ! _lmtune_current "$_lmtune_set" && ! _lmtune_current dev; then
    _lmtune_torch="${TORCH:-torch==2.13.0}"
    echo "setup: installing $_lmtune_torch, then lmtune ($_lmtune_set) into .venv"
    _lmtune_pip=(.venv/bin/python -m pip --no-input --disable-pip-version-check install --progress-bar off)
    "${_lmtune_pip[@]}" "$_lmtune_torch"
    "${_lmtune_pip[@]}" -e "$_lmtune_target"
    echo "$_lmtune_want" > ".venv/.lmtune-installed-$_lmtune_set"
fi

# shellcheck disable=SC1091
source .venv/bin/activate
