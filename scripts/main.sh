#!/usr/bin/env bash
# The main job: set up, verify the framework's identities, then run the CIFAR-10 study's CPU demo
# (three reduced models on a subset: training, figures and a results table in runs/cifar-demo/).
# The data directory is $STRUCTCONV_DATA, else ../shared/data; extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh cifar  # the main job needs the package and the study's extras only
. .venv/bin/activate
structconv check
structconv cifar demo --data "${STRUCTCONV_DATA:-../shared/data}" "$@"
