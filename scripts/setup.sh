#!/usr/bin/env bash
# Create .venv and install structconv with its test, docs and bench extras. Idempotent.
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
pip install -q "$TORCH_SPEC" 2>&1 | grep -v "is ignored: it is neither" || true
pip install -q -e '.[test,docs,bench,cifar]' 2>&1 | grep -v "is ignored: it is neither" || true
python -c "import torch, structconv; print('structconv', structconv.__version__, '| torch', torch.__version__)"
