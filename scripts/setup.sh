#!/usr/bin/env bash
# Create .venv and install structconv with the extras named in $1 (default: all of them:
# test, docs, bench, cifar). Idempotent; a later call with more extras adds them.
# torch is installed first at an exact CPU version (TORCH_SPEC overrides it), so that the
# package's lower-bounded requirement (torch>=2.1) is already met and pip fetches no CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
# pip's output without one harmless notice; a failing install stops the script with pip's message.
# --no-compile: pip would byte-compile every module of torch (two thirds of its install time);
# Python compiles what is imported on first use instead.
quiet_pip() {
  local out
  if ! out=$(pip install -q --no-compile "$@" 2>&1); then
    printf '%s\n' "$out" >&2
    return 1
  fi
  printf '%s\n' "$out" | grep -v -e "is ignored: it is neither" -e '^$' || true
}
quiet_pip "$TORCH_SPEC"
EXTRAS="${1:-test,docs,bench,cifar}"
quiet_pip -e ".[${EXTRAS}]"
python -c "import torch, structconv; print('structconv', structconv.__version__, '| torch', torch.__version__)"
