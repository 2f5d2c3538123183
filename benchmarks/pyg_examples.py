"""Run PyG's own example scripts unchanged, once as is and once with structconv's layers swapped in.

Give it the path of a PyG example (say ``examples/gcn.py`` taken from a PyG checkout; PyG's code
is not part of this repository).  For every seed it runs the script twice in fresh subprocesses,
PyG first, then with ``torch_geometric.nn.GCNConv`` / ``GATConv`` replaced by
``structconv.nn.GCNConv`` / ``GATConv``.  The swap edits no file: a bootstrap seeds
``random``/NumPy/torch, sets the attributes on ``torch_geometric.nn``, sets ``sys.argv`` and runs
the script with ``runpy.run_path(..., run_name="__main__")``; afterwards it reports which class
each swapped name was bound to in the script, as evidence.

The examples load ``Planetoid`` from ``<example dir>/../data/Planetoid``, so the script is copied
into ``<tmp>/examples/`` and the raw Planetoid files (``ind.cora.x`` ...) found in ``--data`` into
``<tmp>/data/Planetoid/<Name>/raw/``; PyG processes them itself (once, before the timed runs) and
downloads nothing.  Only the data sets whose raw files are there can run (Cora, here).

The test accuracy is the last ``Test: 0.8130``-style number the script prints (for gcn.py and
gat.py: the test accuracy at the best validation accuracy); ``s/run`` is the subprocess's wall time
(imports and data loading included) and ``s/epoch`` the median epoch time the script prints, if
any (gcn.py: training step only; gat.py: training + evaluation).  Every run flushes subnormal
numbers to zero (``torch.set_flush_denormal(True)`` before the script starts any thread, so that
all of them inherit it), as an expert sets a CPU up; ``--no-flush`` keeps them (the records'
names then end in ``_unflushed``).  Writes ``<stem>.json`` and ``<stem>.txt`` per example into
``--out`` and prints the table::

    git -C <pyg checkout> show HEAD:examples/gcn.py > /tmp/pyg/gcn.py
    python -m benchmarks.pyg_examples --example /tmp/pyg/gcn.py              # 5 seeds, both layers
    python -m benchmarks.pyg_examples --example /tmp/pyg/gat.py --threads 1  # one torch thread per run
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
LAYERS = ("GCNConv", "GATConv")
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
scope = runpy.run_path(script, run_name="__main__")
bound = {{n: getattr(scope[n], "__module__", "?") for n in names if n in scope}}
from structconv.backend.subnormals import all_threads_flush  # measured after the script: every thread
print({MARK!r} + json.dumps({{"threads": torch.get_num_threads(), "bound": bound, "flushes": all_threads_flush()}}))
"""
TEST = re.compile(r"\btest(?:[ _]?acc(?:uracy)?)?\s*[:=]\s*([0-9]*\.[0-9]+)", re.IGNORECASE)
EPOCH = re.compile(r"time per epoch:\s*([0-9.]+)\s*s", re.IGNORECASE)


def stage(example: Path, data: Path, tmp: Path) -> Path:
    """Copy ``example`` to ``tmp/examples/`` and the raw Planetoid files to ``tmp/data/Planetoid/<Name>/raw``.

    Returns the copied script's path.
    """
    script = tmp / "examples" / example.name
    script.parent.mkdir(parents=True)
    shutil.copy(example, script)
    for raw in sorted(data.glob("ind.*.*")):
        name = PLANETOID.get(raw.name.split(".")[1], raw.name.split(".")[1])
        (tmp / "data" / "Planetoid" / name / "raw").mkdir(parents=True, exist_ok=True)
        shutil.copy(raw, tmp / "data" / "Planetoid" / name / "raw" / raw.name)
    return script


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
        ``seed``, ``ok``, ``seconds`` (wall time of the subprocess), ``test_acc`` (last test
        accuracy printed, or None), ``epoch_s`` (the median epoch time it printed, or None),
        ``bound`` (the module of each name in ``layers`` in the script's globals), ``threads``,
        and ``error`` (the output's tail) when the run failed.
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
    accs, epochs = TEST.findall(out.split(MARK)[0]), EPOCH.findall(out)
    record: dict[str, Any] = {"seed": seed, "ok": rc == 0 and bool(extra), "seconds": seconds}
    record["test_acc"] = float(accs[-1]) if accs else None
    record["epoch_s"] = float(epochs[-1]) if epochs else None
    record.update(extra[-1] if extra else {"bound": {}, "threads": None})
    if not record["ok"]:
        record["error"] = (out[-2000:] + err[-6000:]).strip()
    return record


def swapped_in(runs: list[dict[str, Any]]) -> list[str]:
    """The names that were bound to a structconv class in the script, in every run that worked."""
    ok = [r["bound"] for r in runs if r["ok"]]
    return sorted(n for n in ok[0] if all(b.get(n, "").startswith("structconv.") for b in ok)) if ok else []


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and standard deviation (in accuracy points) and mean seconds of the runs that worked."""
    accs = [100 * r["test_acc"] for r in runs if r["ok"] and r["test_acc"] is not None]
    secs = [r["seconds"] for r in runs if r["ok"]]
    epochs = [r["epoch_s"] for r in runs if r["ok"] and r["epoch_s"] is not None]
    return {
        "n": len(accs),
        "failed": len(runs) - len(secs),
        "acc_mean": statistics.fmean(accs) if accs else None,
        "acc_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
        "seconds_mean": statistics.fmean(secs) if secs else None,
        "epoch_s_median": statistics.median(epochs) if epochs else None,
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


def table(name: str, record: dict[str, Any]) -> str:
    """A short text table of one example's record."""
    env, pyg, ours = record["environment"], record["pyg"], record["structconv"]

    def acc(s: dict[str, Any]) -> str:
        return "failed" if s["acc_mean"] is None else f"{s['acc_mean']:.2f} ± {s['acc_std']:.2f}"

    def secs(s: dict[str, Any], key: str) -> str:
        return "-" if s[key] is None else f"{s[key]:.3f}"

    diff = "-" if record["diff_points"] is None else f"{record['diff_points']:+.2f}"
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
        f"{'run':<11} {'test acc (%)':>14} {'failed':>6} {'s/run':>7} {'s/epoch':>8}",
    ]
    for label, s in (("PyG", pyg), ("structconv", ours)):
        row = f"{label:<11} {acc(s):>14} {s['failed']:>6}"
        lines.append(f"{row} {secs(s, 'seconds_mean'):>7} {secs(s, 'epoch_s_median'):>8}")
    lines.append(f"difference (structconv - PyG): {diff} points; within 1 point: {record['within_1pt']}")
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
        for name in datasets:  # process the raw files once, outside the timed runs
            code = "import sys; from torch_geometric.datasets import Planetoid; Planetoid(sys.argv[1], sys.argv[2])"
            subprocess.run([sys.executable, "-c", code, str(Path(tmp) / "data" / "Planetoid"), name], check=True)
        runs: dict[str, list[dict[str, Any]]] = {"pyg": [], "structconv": []}
        for seed in range(seeds):
            for key in runs:
                runs[key].append(run_once(script, seed, layers, key == "structconv", args, timeout, threads, flush))
                r = runs[key][-1]
                print(f"{example.name} seed {seed} {key:<10} acc {r['test_acc']} {r['seconds']:.1f}s {r['bound']}")
                if not r["ok"]:
                    print(r["error"], file=sys.stderr)
    pyg, ours = summarize(runs["pyg"]), summarize(runs["structconv"])
    both = pyg["acc_mean"] is not None and ours["acc_mean"] is not None
    diff = ours["acc_mean"] - pyg["acc_mean"] if both else None
    return {
        "example": example.name,
        "seeds": seeds,
        "layers": layers,
        "example_args": args,
        "datasets": datasets,
        "environment": environment(threads, measured_flush([r for v in runs.values() for r in v])),
        "pyg": pyg,
        "structconv": ours,
        "diff_points": diff,
        "within_1pt": diff is not None and abs(diff) <= 1.0,
        "swapped_in_script": swapped_in(runs["structconv"]),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--example", type=Path, nargs="+", required=True, help="path(s) of PyG example scripts")
    parser.add_argument("--seeds", type=int, default=5, help="runs per variant (seeds 0..N-1)")
    parser.add_argument("--layers", default=",".join(LAYERS), help="comma-separated class names to swap")
    parser.add_argument("--data", type=Path, default=DATA, help="directory of raw Planetoid files (ind.cora.x ...)")
    parser.add_argument("--example-args", default="", help="extra flags for the example, e.g. '--epochs 100'")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per run (default: torch's own)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per run")
    parser.add_argument("--out", type=Path, default=OUT, help="directory for <stem>.json and <stem>.txt")
    parser.add_argument("--no-flush", action="store_true", help="keep subnormal numbers ('_unflushed' records)")
    opts = parser.parse_args(argv)
    layers = [name for name in opts.layers.split(",") if name]
    opts.out.mkdir(parents=True, exist_ok=True)
    for example in opts.example:
        args = shlex.split(opts.example_args)
        flush = not opts.no_flush
        record = benchmark(example.resolve(), opts.seeds, layers, opts.data, args, opts.timeout, opts.threads, flush)
        text = table(example.name, record)
        stem = example.stem + ("" if flush else "_unflushed")
        (opts.out / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
        (opts.out / f"{stem}.txt").write_text(text + "\n")
        print(text)


if __name__ == "__main__":
    main()
