#!/usr/bin/env bash
# The main job: set up, then verify the framework's identities (`structconv check`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
structconv check "$@"
