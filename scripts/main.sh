#!/usr/bin/env bash
# The main job: set up, then `structconv tour`: the framework's identities; GCN, ChebNet and GAT on
# Cora against their papers; convolution = attention on a CIFAR-10 image; the CIFAR-10 pipeline
# demo. The summary table ends the output and is written to runs/tour/summary.md.
# The data directory is $STRUCTCONV_DATA, else ../shared/data; extra arguments go to the tour.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh cifar  # the main job needs the package and the study's extras only
. .venv/bin/activate
structconv tour --data "${STRUCTCONV_DATA:-../shared/data}" "$@"
