#!/usr/bin/env bash
# Everything CI checks: set-up, lint, format, types, tests (with doctests), docs with warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# One command per line: under `set -e` a failure on the left of `&&` would not stop the script.
echo "== ruff"
ruff check structconv tests benchmarks examples
ruff format --check structconv tests benchmarks examples
echo "== mypy"
mypy
echo "== docs"
sphinx-build -W -q -b html docs docs/_build/html
sphinx-build -W -q -b doctest docs docs/_build/doctest
echo "== pytest"; python -m pytest -q -p no:cacheprovider
