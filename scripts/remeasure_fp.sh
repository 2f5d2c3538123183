#!/usr/bin/env bash
# Re-measure every CPU speed record with subnormals flushed for every variant (issue 34).
#
# Each step runs one benchmark at the sizes that produced the record it replaces (read from the
# records' params/summary/header and the docs' commands) and writes into the same place; every
# benchmark now flushes subnormals on every thread for every variant by default and says so in
# its record and table.  The two headline cases (positional attention at 16x16, the CIFAR CPU
# step) are also measured with --no-flush into separately named records (*_unflushed.*), so
# the docs can show both.  Run it on a quiet machine: the timings are the point.
#
#   scripts/remeasure_fp.sh --list            # the steps, their commands and estimated durations
#   scripts/remeasure_fp.sh                   # every step, in order (about 1 h 10 min on 2 quiet cores)
#   scripts/remeasure_fp.sh positional cifar  # only these steps
#
# THREADS (default 2, the thread count of today's 2-core records; bench_overhead and
# bench_compile_graph set their own single thread) and PYTHON (default: python, in .venv when
# present) can be set in the environment.  PYG_CHECKOUT names a PyG checkout (a work tree or a
# bare git directory) whose examples/ the pyg_examples step runs; without it that step is skipped.  The NATTEN column of the positional records needs
# the scratch venv /tmp/natten_venv (see benchmarks/bench_positional.py); without it the column
# reads "not installed".
#
# Estimates are for a quiet 2-core machine like the one of today's records: from the records' own
# durations where they have one (positional 17.7 min, scaling 15.2 min, both measured with the
# dense peers unflushed: flushed they run faster), else from tiny runs of each command scaled to
# the full size (the tiny runs were taken on a shared, loaded machine; see the issue's report).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" && -f .venv/bin/activate ]]; then
    # shellcheck disable=SC1091
    . .venv/bin/activate
fi
PY="${PYTHON:-python}"
export OMP_NUM_THREADS="${THREADS:-2}" MKL_NUM_THREADS="${THREADS:-2}"
SCRATCH="$(mktemp -d -t remeasure_fp.XXXXXX)"
trap 'rm -rf "$SCRATCH"' EXIT
CIFAR_VARIANTS="sa-quadratic,sa-quadratic paper-dense,resnet18,resnet18 torch"

STEPS=(positional positional-16-unflushed scaling cifar cifar-unflushed overhead compile pyg-examples
       attention grid graph orders)
declare -A ESTIMATE=(
    [positional]="15 min (record: 17.7 min with the dense peers unflushed)"
    [positional-16-unflushed]="3 min"
    [scaling]="14 min (record: 15.2 min)"
    [cifar]="2.5 min"
    [cifar-unflushed]="3 min"
    [overhead]="1.5 min"
    [compile]="6 min"
    [pyg-examples]="50 min (record: 11 scripts, 5 seeds, both libraries)"
    [attention]="2 min"
    [grid]="10 min"
    [graph]="5 min"
    [orders]="1.5 min"
)
declare -A WHAT=(
    [positional]="docs/_static/positional/positional_cpu.{json,txt,png} (docs/attention.rst's table)"
    [positional-16-unflushed]="docs/_static/positional/positional_cpu_16x16_unflushed.{json,txt,png}"
    [scaling]="docs/_static/positional/scaling_cpu.{json,txt,png}"
    [cifar]="docs/_static/cifar/throughput_cpu_b16.{json,txt} (docs/cifar.rst, docs/internals.rst)"
    [cifar-unflushed]="docs/_static/cifar/throughput_cpu_b16_unflushed.{json,txt}"
    [overhead]="docs/_static/overhead/overhead_cpu.{json,txt,png} (docs/engine.rst)"
    [compile]="docs/_static/compile/compile_graph_cpu.{json,txt,png} (docs/graph.rst; flushed before too)"
    [pyg-examples]="docs/_static/pyg_examples/*.{json,txt}, summary.{txt,png} (docs/graph.rst)"
    [attention]="benchmarks/results/attention_cpu.*"
    [grid]="benchmarks/results/grid_cpu.*"
    [graph]="benchmarks/results/graph_cpu.*"
    [orders]="benchmarks/results/orders_cpu.* (docs/engine.rst's command)"
)

# The command of a step, one argument per line (printed by --list, run by run_step).
command_of() {
    case "$1" in
        positional) printf '%s\n' "$PY" -m benchmarks.bench_positional --repeats 3 --out docs/_static/positional ;;
        positional-16-unflushed)
            printf '%s\n' "$PY" -m benchmarks.bench_positional --sides 16 --encodings quadratic --repeats 3 \
                --no-flush --name positional_cpu_16x16 --out docs/_static/positional ;;
        scaling)
            printf '%s\n' "$PY" -m benchmarks.bench_positional_scaling --repeats 3 --no-progress \
                --out docs/_static/positional/scaling_cpu ;;
        cifar)
            printf '%s\n' "$PY" -m structconv cifar bench --device cpu --batch 16 --steps 2 --rounds 3 \
                --only "$CIFAR_VARIANTS" --out "$SCRATCH/cifar" ;;
        cifar-unflushed)
            printf '%s\n' "$PY" -m structconv cifar bench --device cpu --batch 16 --steps 2 --rounds 3 \
                --only "$CIFAR_VARIANTS" --no-flush --out "$SCRATCH/cifar" ;;
        overhead) printf '%s\n' "$PY" -m benchmarks.bench_overhead --out docs/_static/overhead ;;
        compile) printf '%s\n' "$PY" -m benchmarks.bench_compile_graph --out docs/_static/compile ;;
        pyg-examples)
            printf '%s\n' "$PY" -m benchmarks.pyg_examples --pyg "${PYG_CHECKOUT:-<PYG_CHECKOUT>}" \
                --threads 1 --out docs/_static/pyg_examples ;;
        attention) printf '%s\n' "$PY" -m benchmarks.bench_attention --out benchmarks/results ;;
        grid) printf '%s\n' "$PY" -m benchmarks.bench_grid --out benchmarks/results ;;
        graph) printf '%s\n' "$PY" -m benchmarks.bench_graph --out benchmarks/results ;;
        orders) printf '%s\n' "$PY" -m benchmarks.bench_orders --configs 150 --seed 1 --out benchmarks/results ;;
        *) echo "unknown step: $1 (one of: ${STEPS[*]})" >&2; return 2 ;;
    esac
}

# Copy what `structconv cifar bench --out` wrote under the name of the docs' record.
keep_cifar() {
    local from="$SCRATCH/cifar/cifar_throughput_cpu$1" to="docs/_static/cifar/throughput_cpu_b16$1"
    cp "$from.json" "$to.json"
    cp "$from.txt" "$to.txt"
    echo "wrote $to.json and $to.txt"
}

run_step() {
    local step="$1" args start
    if [[ "$step" == pyg-examples && -z "${PYG_CHECKOUT:-}" ]]; then
        echo "== $step: skipped (set PYG_CHECKOUT to a PyG checkout, a work tree or a bare git directory)"
        return 0
    fi
    mapfile -t args < <(command_of "$step")
    echo "== $step (estimate ${ESTIMATE[$step]}): $(printf '%q ' "${args[@]}")"
    start=$SECONDS
    "${args[@]}"
    case "$step" in
        cifar) keep_cifar "" ;;
        cifar-unflushed) keep_cifar "_unflushed" ;;
    esac
    echo "== $step done in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
}

if [[ "${1:-}" == "--list" ]]; then
    for step in "${STEPS[@]}"; do
        mapfile -t args < <(command_of "$step")
        printf '%-24s %s\n%-24s -> %s\n%-24s    %s\n' "$step" "${ESTIMATE[$step]}" "" "${WHAT[$step]}" "" \
            "$(printf '%q ' "${args[@]}")"
    done
    exit 0
fi
chosen=("$@")
if (( ${#chosen[@]} == 0 )); then
    chosen=("${STEPS[@]}")
fi
for step in "${chosen[@]}"; do
    command_of "$step" > /dev/null  # an unknown name stops before anything runs
done
if ! compgen -G "/tmp/natten_venv/lib/python3*/site-packages/natten" > /dev/null; then
    echo "note: /tmp/natten_venv has no natten: the positional records' NATTEN column will say why" >&2
fi
echo "threads: $OMP_NUM_THREADS; python: $("$PY" -c 'import sys; print(sys.executable)')"
for step in "${chosen[@]}"; do
    run_step "$step"
done
