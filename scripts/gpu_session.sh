#!/usr/bin/env bash
# One GPU lease turned into a recorded result (structconv/experiments/cifar/session.py says what
# it runs: environment, CUDA tests, training throughput, training, one record).
#
#   bash scripts/gpu_session.sh --prepare        here, before a lease: lays out .gpu/ (ignored by
#                                                git) with the CIFAR-10 archive, the wheels the GPU
#                                                image lacks and the commit; the device tool carries it
#   bash scripts/gpu_session.sh [--budget S]     there, as the device tool's command, carry [".gpu"]:
#                                                the session, its record written to $OUT
#   bash scripts/gpu_session.sh --dry-run        here: the same steps on the CPU at toy sizes (CI runs it);
#                                                the record goes to $OUT if set, else a temporary folder
#   bash scripts/gpu_session.sh --collect DIR    here, after a lease: the record and run metrics from
#                                                DIR (the files the device tool fetched) into docs/_static/gpu
#
# Other arguments go to the session (--budget SECONDS, --test-device DEVICE, --skip tests,bench,
# --model MODEL: e.g. a lease spent on ResNet18's 300 epochs alone).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${STRUCTCONV_DATA:-../shared/data}"
ARCHIVE=cifar10-jpeg.tar.gz

python_here() {  # the project's environment where there is one, else the machine's python3
  if [ -x .venv/bin/python ]; then echo .venv/bin/python; else echo python3; fi
}

case "${1:-}" in
  --prepare)
    py=$(python_here)
    mkdir -p .gpu/data .gpu/whl
    cp "$DATA/$ARCHIVE" .gpu/data/
    # The GPU image has torch, numpy, scipy, opt-einsum, pytest, hypothesis, matplotlib and PyG;
    # array-api-compat (pure Python) is the one requirement it lacks: the version installed here.
    version=$("$py" -c "import importlib.metadata as m; print(m.version('array-api-compat'))")
    rm -f .gpu/whl/*.whl
    "$py" -m pip download -q --no-deps --only-binary=:all: -d .gpu/whl "array-api-compat==$version"
    commit=$(git rev-parse HEAD)
    # Untracked files that git does not ignore travel with the tree too: they make it "dirty".
    if [ -n "$(git status --porcelain)" ]; then commit="$commit-dirty"; fi
    echo "$commit" >.gpu/commit
    du -sh .gpu
    echo "prepared .gpu/ for commit $commit: run the device tool with command 'bash scripts/gpu_session.sh'"
    echo "and carry [\".gpu\"], timeout_s 600; then: bash scripts/gpu_session.sh --collect <files_at>"
    ;;
  --collect)
    from="${2:?--collect needs the folder holding the files the device tool fetched}"
    mkdir -p docs/_static/gpu/sessions docs/_static/gpu/runs
    found=0
    for record in "$from"/*-*.json; do
      [ -e "$record" ] || continue
      case "$(basename "$record")" in bench-*|run-*) continue ;; esac
      if grep -q '"dry_run": true' "$record"; then
        echo "$record is a dry run's record (toy sizes on a CPU): not collected" >&2
        continue
      fi
      if grep -q '"error":' "$record"; then
        echo "$record is the record of a session that did not run (see its error): not collected" >&2
        continue
      fi
      stamp=$(basename "$record" .json)
      cp "$record" docs/_static/gpu/sessions/
      [ -f "$from/session.png" ] && cp "$from/session.png" "docs/_static/gpu/sessions/$stamp.png"
      found=1
      for run in "$from"/run-*.json; do
        [ -e "$run" ] || continue
        name=$(basename "$run" .json)
        cp "$run" "docs/_static/gpu/runs/${name#run-}-${stamp%%-[a-z]*}.json"
      done
      echo "collected $stamp into docs/_static/gpu/sessions (runs into docs/_static/gpu/runs)"
    done
    [ "$found" = 1 ] || { echo "no session record in $from" >&2; exit 2; }
    ;;
  --dry-run)
    shift
    py=$(python_here)
    out="${OUT:-$(mktemp -d)}"
    "$py" -m structconv.experiments.cifar.session --dry-run --out "$out" --data "$DATA" "$@"
    echo "dry run: the record and its files are in $out"
    ;;
  *)
    # On the device machine: the carried wheels into /tmp/site, the tree itself on the path.
    if [ ! -d .gpu ]; then
      echo "no .gpu/ here: run 'bash scripts/gpu_session.sh --prepare' first and carry .gpu" >&2
      exit 2
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .gpu/whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    out="${OUT:?OUT is not set: run this through the device tool, or use --dry-run here}"
    python3 -m structconv.experiments.cifar.session --out "$out" --data .gpu/data --commit "$(cat .gpu/commit)" "$@"
    ;;
esac
