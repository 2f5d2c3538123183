"""Run PyG's own example scripts unchanged, once as is and once with structconv's layers swapped in.

Give it PyG example scripts (``--example PATH``, or ``--pyg CHECKOUT`` for the suite of the
Planetoid scripts that use layers structconv replaces; PyG's code is not part of this
repository).  For every seed it runs each script twice in fresh subprocesses, PyG first, then
with every name of ``LAYERS`` (``GCNConv``, ``GATConv``, ``SGConv``, ...) on
``torch_geometric.nn`` replaced by structconv's class.  The swap edits no file: a bootstrap seeds
``random``/NumPy/torch, sets the attributes on ``torch_geometric.nn``, sets ``sys.argv`` and runs
the script with ``runpy.run_path(..., run_name="__main__")``; afterwards it reports which class
each swapped name was bound to in the script, as evidence.

The examples load Planetoid from ``<example dir>/../data/Planetoid`` or ``../data/<Name>``, so the
script is copied into ``<tmp>/examples/`` (keeping a sub-folder such as ``compile/``) and the raw
Planetoid files (``ind.cora.x`` ...) found in ``--data`` into both layouts; PyG processes them
itself (once, before the timed runs) and downloads nothing.  Only the data sets whose raw files
are there can run (Cora, here).

Per run it records the *metric*, the last ``Test: 0.8130`` number the script prints, else its
last ``Accuracy: ...`` or ``AUC: ...`` one (the script's own choice: test accuracy at the best
validation epoch for ``gcn.py``, the last epoch's test AUC for ``autoencoder.py``, ...), and the
*time per epoch*, the median time between two optimizer steps after the first ``WARMUP`` (one step per
epoch in these full-batch scripts, the epoch's evaluation included), measured by a global
optimizer hook in the same way for every script and both libraries; ``first_s`` is the time from
the first ``zero_grad`` to the second step (two epochs, with any compilation).  Every run flushes
subnormal numbers to zero (``torch.set_flush_denormal(True)`` before the script starts any
thread, so that all of them inherit it), as an expert sets a CPU up; ``--no-flush`` keeps them
(the records' names then end in ``_unflushed``).  Writes ``<stem>.json`` and ``<stem>.txt`` per
example into ``--out``, and ``summary.{txt,png}`` over every record there::

    python -m benchmarks.pyg_examples --pyg <PyG checkout> --threads 1   # the suite, 5 seeds each
    python -m benchmarks.pyg_examples --example <checkout>/examples/gcn.py --seeds 2
    python -m benchmarks.pyg_examples --summary                           # redraw the summary only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "planetoid"
OUT = ROOT / "docs" / "_static" / "pyg_examples"
LAYERS = ("GCNConv", "GATConv", "SGConv", "TAGConv", "ChebConv", "SAGEConv", "GINConv", "RGCNConv")
PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
MARK = "@@pyg_examples "
BOOTSTRAP = f"""
import json, random, runpy, sys
import numpy, torch
script, seed, names = sys.argv[1], int(sys.argv[2]), [n for n in sys.argv[3].split(",") if n]
swap, threads, flush = sys.argv[4] == "1", int(sys.argv[5]), sys.argv[6] == "1"
torch.set_flush_denormal(flush)  # before any thread starts: every one inherits it
if threads: torch.set_num_threads(threads)
random.seed(seed); numpy.random.seed(seed); torch.manual_seed(seed)
if swap:
    import structconv.nn, torch_geometric.nn, torch_geometric.nn.conv
    for name in names:
        for module in (torch_geometric.nn, torch_geometric.nn.conv):
            setattr(module, name, getattr(structconv.nn, name))
sys.argv, sys.path[0] = [script, *sys.argv[7:]], __import__("os").path.dirname(script)
import time
from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook
steps, first = [], []  # an epoch of these full-batch scripts is one optimizer step
register_optimizer_step_post_hook(lambda *_: steps.append(time.perf_counter()))
zero_grad = Optimizer.zero_grad  # its first call starts the first epoch (outside any compiled code)
def first_zero_grad(self, *args, **kwargs):
    first.append(time.perf_counter()) if not first else None
    return zero_grad(self, *args, **kwargs)
Optimizer.zero_grad = first_zero_grad
scope = runpy.run_path(script, run_name="__main__")
bound = {{n: getattr(scope[n], "__module__", "?") for n in names if n in scope}}
from structconv.backend.subnormals import all_threads_flush  # measured after the script: every thread
extra = {{"threads": torch.get_num_threads(), "bound": bound, "flushes": all_threads_flush()}}
extra.update(steps=[t - first[0] for t in steps] if first else [])
print({MARK!r} + json.dumps(extra))
"""
#: The metric a script prints: its last ``Test:`` number, else its last ``Accuracy:`` or ``AUC:`` one.
METRICS = (
    re.compile(r"\btest(?:[ _]?acc(?:uracy)?)?\s*[:=]\s*([0-9]*\.[0-9]+)", re.IGNORECASE),
    re.compile(r"\b(?:accuracy|auc)\s*[:=]\s*([0-9]*\.[0-9]+)", re.IGNORECASE),
)
EPOCH = re.compile(r"time per epoch:\s*([0-9.]+)\s*s", re.IGNORECASE)
WARMUP = 10
# PyG's Planetoid examples whose layers structconv replaces, with the arguments of each record
# (``jit/gcn.py`` scripts the model with ``torch.jit.script``, ``tensorboard_logging.py`` traces it
# for ``add_graph``).
SUITE = (
    ("gcn.py", ""),
    ("gat.py", ""),
    ("link_pred.py", ""),
    ("autoencoder.py", ""),
    ("autoencoder.py", "--variational"),
    ("infomax_transductive.py", ""),
    ("sgc.py", ""),
    ("tagcn.py", ""),
    ("tensorboard_logging.py", ""),
    ("compile/gcn.py", ""),
    ("jit/gcn.py", ""),
)


def relative(example: Path) -> Path:
    """``example``'s path below its ``examples`` folder (``compile/gcn.py``), or its name."""
    parts = example.parts
    if "examples" not in parts[:-1]:
        return Path(example.name)
    return Path(*parts[len(parts) - parts[::-1].index("examples") :])


def stem(example: Path, args: list[str]) -> str:
    """The record's name: the example's path below ``examples`` and its flags, ``autoencoder_variational``."""
    words = [*relative(example).with_suffix("").parts, *(a.lstrip("-") for a in args)]
    return re.sub(r"[^A-Za-z0-9_.]+", "_", "_".join(words))


def stage(example: Path, data: Path, tmp: Path) -> Path:
    """Copy ``example`` below ``tmp/examples/`` and the raw Planetoid files where PyG's examples look.

    Both layouts of PyG's examples get the files: ``tmp/data/Planetoid/<Name>/raw`` and
    ``tmp/data/<Name>/<Name>/raw``.  Returns the copied script's path.
    """
    script = tmp / "examples" / relative(example)
    script.parent.mkdir(parents=True)
    shutil.copy(example, script)
    for raw in sorted(data.glob("ind.*.*")):
        name = PLANETOID.get(raw.name.split(".")[1], raw.name.split(".")[1])
        for root in data_roots(script, tmp):
            for folder in (root / "Planetoid" / name / "raw", root / name / name / "raw"):
                folder.mkdir(parents=True, exist_ok=True)
                shutil.copy(raw, folder / raw.name)
    return script


def data_roots(script: Path, tmp: Path) -> list[Path]:
    """Where PyG's examples look for ``data``: ``tmp/data`` (``../data`` of ``examples/``, ``../../data``
    of a sub-folder) and ``data`` beside a script in a sub-folder (``jit/gcn.py``)."""
    return list(dict.fromkeys([tmp / "data", script.parent / "data"]))


def epoch_times(steps: list[float]) -> tuple[float | None, float | None]:
    """The median time between optimizer steps after the first ``WARMUP``, and the time to the second step."""
    gaps = [b - a for a, b in zip(steps[WARMUP:], steps[WARMUP + 1 :], strict=False)]
    return (statistics.median(gaps) if gaps else None), (steps[1] if len(steps) > 1 else None)


def run_once(
    script: Path,
    seed: int,
    layers: list[str],
    swap: bool,
    args: list[str],
    timeout: float,
    threads: int = 0,
    flush: bool = True,
) -> dict[str, Any]:
    """Run ``script`` in a subprocess (with ``layers`` swapped if ``swap``) and parse what it prints.

    ``threads`` > 0 sets torch's (and OpenMP's) thread count in the subprocess; 0 keeps torch's default.
    ``flush`` flushes subnormal numbers to zero on every thread of the subprocess.

    Returns
    -------
    dict
        ``seed``, ``ok``, ``seconds`` (wall time of the subprocess), ``metric`` (the last test
        metric printed, or None), ``epoch_s`` (median time between optimizer steps after the
        first ``WARMUP``), ``first_s`` (first ``zero_grad`` to the second step), ``script_epoch_s``
        (the median epoch time the script printed, if any), ``bound`` (the module of each name in
        ``layers`` in the script's globals), ``threads``, and ``error`` (the output's tail) when
        the run failed.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.update({"OMP_NUM_THREADS": str(threads)} if threads else {})
    cmd = [sys.executable, "-c", BOOTSTRAP, str(script), str(seed), ",".join(layers), str(int(swap)), str(threads)]
    cmd += [str(int(flush)), *args]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=script.parent, env=env, capture_output=True, text=True, timeout=timeout)
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err, rc = f"timed out after {timeout} s", -1
    seconds = time.perf_counter() - start
    extra = [json.loads(line[len(MARK) :]) for line in out.splitlines() if line.startswith(MARK)]
    printed = out.split(MARK)[0]
    metrics = next((found for found in (m.findall(printed) for m in METRICS) if found), [])
    epochs = EPOCH.findall(out)
    record: dict[str, Any] = {"seed": seed, "ok": rc == 0 and bool(extra), "seconds": seconds}
    record["metric"] = float(metrics[-1]) if metrics else None
    record["script_epoch_s"] = float(epochs[-1]) if epochs else None
    record.update(extra[-1] if extra else {"bound": {}, "threads": None})
    record["epoch_s"], record["first_s"] = epoch_times(record.pop("steps", []))
    if not record["ok"]:
        record["error"] = (out[-2000:] + err[-6000:]).strip()
    return record


def swapped_in(runs: list[dict[str, Any]]) -> list[str]:
    """The names that were bound to a structconv class in the script, in every run that worked."""
    ok = [r["bound"] for r in runs if r["ok"]]
    return sorted(n for n in ok[0] if all(b.get(n, "").startswith("structconv.") for b in ok)) if ok else []


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and standard deviation of the metric (in points) and median times of the runs that worked."""
    done = [r for r in runs if r["ok"]]
    metrics = [100 * r["metric"] for r in done if r["metric"] is not None]

    def median(key: str) -> float | None:
        values = [r[key] for r in done if r.get(key) is not None]
        return statistics.median(values) if values else None

    return {
        "n": len(metrics),
        "failed": len(runs) - len(done),
        "metric_mean": statistics.fmean(metrics) if metrics else None,
        "metric_std": statistics.stdev(metrics) if len(metrics) > 1 else 0.0,
        "seconds_mean": statistics.fmean(r["seconds"] for r in done) if done else None,
        "epoch_s_median": median("epoch_s"),
        "first_s_median": median("first_s"),
    }


def paired(pyg: list[dict[str, Any]], ours: list[dict[str, Any]]) -> dict[str, Any]:
    """Per seed where both ran: structconv's metric minus PyG's (points) and their time-per-epoch ratio."""
    both = [(a, b) for a, b in zip(pyg, ours, strict=True) if a["ok"] and b["ok"]]
    diffs = [100 * (b["metric"] - a["metric"]) for a, b in both if None not in (a["metric"], b["metric"])]
    ratios = [b["epoch_s"] / a["epoch_s"] for a, b in both if a["epoch_s"] and b["epoch_s"]]
    firsts = [b["first_s"] / a["first_s"] for a, b in both if a["first_s"] and b["first_s"]]
    return {
        "diff_points": diffs,
        "max_abs_diff_points": max(map(abs, diffs)) if diffs else None,
        "epoch_ratios": ratios,
        "epoch_ratio_median": statistics.median(ratios) if ratios else None,
        "first_ratio_median": statistics.median(firsts) if firsts else None,
    }


def measured_flush(runs: list[dict[str, Any]]) -> bool | None:
    """Whether every run that worked flushed subnormals on every thread (measured in it): ``None`` if mixed."""
    seen = {r.get("flushes") for r in runs if r["ok"]}
    return seen.pop() if len(seen) == 1 else None


def environment(threads: int, flush: bool | None = True) -> dict[str, Any]:
    """The machine and library versions the runs used, their torch thread count and subnormal setting (measured)."""
    return {
        "machine": f"{platform.platform()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_geometric": version("torch_geometric"),
        "threads": threads or torch.get_num_threads(),
        "flush_denormal": flush,
    }


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(name: str, record: dict[str, Any]) -> str:
    """A short text table of one example's record."""
    env, pair = record["environment"], record["paired"]
    lines = [
        f"{name}: {record['seeds']} seeds; structconv classes the script ran with: "
        f"{', '.join(record['swapped_in_script']) or 'NONE (nothing swapped)'}; "
        f"data: {', '.join(record['datasets'])} (the raw files available)",
        f"machine: {env['machine']}; torch {env['torch']}, torch_geometric {env['torch_geometric']}, "
        f"torch threads: {env['threads']}; subnormals "
        + {True: "flushed in every run", False: "unflushed in every run"}.get(
            env.get("flush_denormal"), "flushed in some runs only"
        )
        + " (measured)",
        f"{'run':<11} {'metric (%)':>15} {'failed':>6} {'s/run':>7} {'s/epoch':>8} {'first 2 s':>9}",
    ]
    for label, key in (("PyG", "pyg"), ("structconv", "structconv")):
        s = record[key]
        metric = "-" if s["metric_mean"] is None else f"{s['metric_mean']:.2f} ± {s['metric_std']:.2f}"
        lines.append(
            f"{label:<11} {metric:>15} {s['failed']:>6} {_num(s['seconds_mean'], '.2f'):>7} "
            f"{_num(s['epoch_s_median'], '.4f'):>8} {_num(s['first_s_median'], '.2f'):>9}"
        )
    diffs = ", ".join(f"{d:+.2f}" for d in pair["diff_points"]) or "-"
    lines.append(
        f"structconv - PyG per seed (points): {diffs}; largest |difference|: {_num(pair['max_abs_diff_points'], '.2f')}"
    )
    lines.append(
        f"time per epoch, structconv / PyG (median of the seeds' ratios): {_num(pair['epoch_ratio_median'], '.3f')}; "
        f"first two epochs: {_num(pair['first_ratio_median'], '.3f')}"
    )
    for key in ("pyg", "structconv"):
        errors = {r["error"].strip().splitlines()[-1] for r in record["runs"][key] if not r["ok"]}
        lines += [f"{key} failed: {e}" for e in sorted(errors)]
    return "\n".join(lines)


def benchmark(
    example: Path,
    seeds: int,
    layers: list[str],
    data: Path,
    args: list[str],
    timeout: float,
    threads: int = 0,
    flush: bool = True,
) -> dict[str, Any]:
    """Run ``example`` ``seeds`` times as is and with the swap, interleaved; return the record."""
    with tempfile.TemporaryDirectory(prefix="pyg_examples_") as tmp:
        script = stage(example, data, Path(tmp))
        datasets = sorted(p.name for p in (Path(tmp) / "data" / "Planetoid").glob("*"))
        for data_root in data_roots(script, Path(tmp)):  # process the raw files once, outside the timed runs
            for root, name in ((r, n) for n in datasets for r in (data_root / "Planetoid", data_root / n)):
                code = "import sys; from torch_geometric.datasets import Planetoid; Planetoid(*sys.argv[1:])"
                subprocess.run([sys.executable, "-c", code, str(root), name], check=True)
        runs: dict[str, list[dict[str, Any]]] = {"pyg": [], "structconv": []}
        for seed in range(seeds):
            for key in runs:
                runs[key].append(run_once(script, seed, layers, key == "structconv", args, timeout, threads, flush))
                r = runs[key][-1]
                print(
                    f"{relative(example)} {' '.join(args)} seed {seed} {key:<10} metric {r['metric']} "
                    f"{_num(r['epoch_s'], '.4f')} s/epoch {r['seconds']:.1f} s {r['bound']}",
                    flush=True,
                )
                if not r["ok"]:
                    print(r["error"], file=sys.stderr)
    return {
        "example": str(relative(example)),
        "seeds": seeds,
        "layers": layers,
        "example_args": args,
        "datasets": datasets,
        "environment": environment(threads, measured_flush([r for v in runs.values() for r in v])),
        "pyg": summarize(runs["pyg"]),
        "structconv": summarize(runs["structconv"]),
        "paired": paired(runs["pyg"], runs["structconv"]),
        "swapped_in_script": swapped_in(runs["structconv"]),
        "runs": runs,
    }


def summary(out: Path) -> str:
    """One line per record in ``out`` (metric difference, time ratio, failures); draws ``summary.png``."""
    records = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if "paired" in p.read_text()}
    head = (
        f"{'script':<24} {'seeds':>5} {'max |diff| pts':>14} {'s/epoch ratio':>13} {'first 2 ratio':>13} {'failed':>11}"
    )
    lines = [head]
    for name, rec in records.items():
        pair, failed = rec["paired"], f"{rec['pyg']['failed']} / {rec['structconv']['failed']}"
        lines.append(
            f"{name:<24} {rec['seeds']:>5} {_num(pair['max_abs_diff_points'], '.2f'):>14} "
            f"{_num(pair['epoch_ratio_median'], '.3f'):>13} {_num(pair['first_ratio_median'], '.3f'):>13} {failed:>11}"
        )
    lines.append("failed: runs of PyG / of structconv; ratios: structconv / PyG, median over seeds")
    text = "\n".join(lines)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(records)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.45 * len(names) + 1.6), sharey=True)
    for row, name in enumerate(names):
        pair, rec = records[name]["paired"], records[name]
        left.plot(pair["diff_points"], [row] * len(pair["diff_points"]), "o", color="C0", alpha=0.7)
        right.plot(pair["epoch_ratios"], [row] * len(pair["epoch_ratios"]), "o", color="C1", alpha=0.7)
        failed = [who for who in ("pyg", "structconv") if rec[who]["failed"]]
        if failed:  # say so where the points would be
            note = f"{' and '.join('PyG' if w == 'pyg' else w for w in failed)} failed"
            right.annotate(note, (1.0, row), ha="center", va="center", color="C3", fontsize=9)
    left.set(yticks=range(len(names)), yticklabels=names, xlabel="metric, structconv − PyG (points), per seed")
    right.set(xlabel="time per epoch, structconv / PyG, per seed (log scale)", xscale="log")
    left.axvline(0, color="grey", lw=0.8)
    right.axvline(1.0, color="grey", lw=0.8)
    right.axvline(1.1, color="C3", lw=0.8, ls="--")
    left.invert_yaxis()
    fig.suptitle("PyG's example scripts on Cora, as is and with structconv's layers swapped in (same seeds)")
    fig.tight_layout()
    fig.savefig(out / "summary.png", dpi=110)
    plt.close(fig)
    (out / "summary.txt").write_text(text + "\n")
    return text


def suite(checkout: Path, tmp: Path) -> list[tuple[Path, list[str]]]:
    """The scripts of ``SUITE`` read from a PyG checkout (a work tree, or a bare git directory)."""
    found = []
    for name, args in SUITE:
        path = checkout / "examples" / name
        if not path.is_file():  # a bare repository: read the file at HEAD
            path = tmp / "examples" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            git = ["git", f"--git-dir={checkout}", "show", f"HEAD:examples/{name}"]
            path.write_text(subprocess.run(git, check=True, capture_output=True, text=True).stdout)
        found.append((path, shlex.split(args)))
    return found


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--example", type=Path, nargs="+", default=[], help="path(s) of PyG example scripts")
    parser.add_argument("--pyg", type=Path, help="a PyG checkout: run every script of SUITE from its examples/")
    parser.add_argument("--summary", action="store_true", help="only rewrite summary.{txt,png} from the records")
    parser.add_argument("--seeds", type=int, default=5, help="runs per variant (seeds 0..N-1)")
    parser.add_argument("--layers", default=",".join(LAYERS), help="comma-separated class names to swap")
    parser.add_argument("--data", type=Path, default=DATA, help="directory of raw Planetoid files (ind.cora.x ...)")
    parser.add_argument("--example-args", default="", help="extra flags for --example scripts, e.g. '--epochs 100'")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per run (default: torch's own)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per run")
    parser.add_argument("--out", type=Path, default=OUT, help="directory for <stem>.json and <stem>.txt")
    parser.add_argument("--no-flush", action="store_true", help="keep subnormal numbers ('_unflushed' records)")
    opts = parser.parse_args(argv)
    if not (opts.example or opts.pyg or opts.summary):
        parser.error("give --example PATH..., --pyg CHECKOUT or --summary")
    layers = [name for name in opts.layers.split(",") if name]
    opts.out.mkdir(parents=True, exist_ok=True)
    flush = not opts.no_flush
    with tempfile.TemporaryDirectory(prefix="pyg_suite_") as tmp:
        jobs = [(e.resolve(), shlex.split(opts.example_args)) for e in opts.example]
        jobs += suite(opts.pyg.resolve(), Path(tmp)) if opts.pyg else []
        for example, args in jobs:
            record = benchmark(example, opts.seeds, layers, opts.data, args, opts.timeout, opts.threads, flush)
            name = stem(example, args) + ("" if flush else "_unflushed")
            text = table(name, record)
            (opts.out / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
            (opts.out / f"{name}.txt").write_text(text + "\n")
            print(text, flush=True)
    print(summary(opts.out))


if __name__ == "__main__":
    main()
