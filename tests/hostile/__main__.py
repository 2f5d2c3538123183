"""``python -m tests.hostile``: draw every case, run them in workers, write the results.

By default the results go to ``docs/_static/robustness/`` (what ``docs/robustness.rst``
includes); ``--out`` writes them elsewhere.  The exit status is 0 unless ``--check`` is given and
the verdict fails (a ``silent``, ``crash``, ``security`` or unallowed ``raw`` case).
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
import time
from pathlib import Path
from typing import Any

from . import report
from .runner import CASE_SECONDS, MEMORY_LIMIT, ROOT, run_cases
from .spec import Case, draw

MODULES = (
    "cases_conv",
    "cases_grid",
    "cases_graph",
    "cases_sparse",
    "cases_attention",
    "cases_nn",
    "cases_data",
    "cases_cli",
)


def generate(scale: float = 1.0, only: set[str] | None = None) -> list[Case]:
    """Every case, in a fixed order: the drawn parameters of each entry point of each module."""
    cases = []
    for name in MODULES:
        module = importlib.import_module(f"{__package__}.{name}")
        for entry, (strategy, count) in module.ENTRIES.items():
            if only and entry not in only:
                continue
            for i, params in enumerate(draw(strategy, max(1, round(count * scale)))):
                cases.append(Case(f"{entry}-{i:04d}", entry, name, params))
    return cases


def _inline(cases: list[Case]) -> list[dict[str, Any]]:
    """Run the cases in this process, without limits (for debugging a case module)."""
    import os
    import tempfile

    from .worker import run_case

    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="structconv-hostile-") as sandbox:
        os.makedirs(os.path.join(sandbox, "work"))
        os.chdir(sandbox)
        tempfile.tempdir = os.path.join(sandbox, "work")  # as a worker's TMPDIR: emptied after each case
        try:
            return [run_case(c, sandbox) for c in cases]
        finally:
            os.chdir(here)
            tempfile.tempdir = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.hostile", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "_static" / "robustness"), help="output folder")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default: 2)")
    parser.add_argument("--scale", type=float, default=1.0, help="scale every entry point's case count")
    parser.add_argument("--only", default="", help="comma-separated entry points to run (default: all)")
    parser.add_argument("--timeout", type=float, default=CASE_SECONDS, help="seconds per case")
    parser.add_argument("--memory", type=float, default=MEMORY_LIMIT / 2**30, help="GiB of address space per worker")
    parser.add_argument("--inline", action="store_true", help="run in this process, without limits (debugging)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the verdict fails")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    only = {s.strip() for s in args.only.split(",") if s.strip()} or None
    cases = generate(args.scale, only)
    drawn = time.perf_counter() - start
    print(f"{len(cases)} cases drawn in {drawn:.1f} s; running on {args.workers} workers", file=sys.stderr)

    def progress(done: int, total: int) -> None:
        if not args.quiet and (done % 200 == 0 or done == total):
            print(f"  {done}/{total} ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)

    if args.inline:
        records = _inline(cases)
    else:
        records = run_cases(cases, args.workers, int(args.memory * 2**30), args.timeout, progress)
    wall = time.perf_counter() - start
    meta = {
        "command": "python -m tests.hostile" + (f" --scale {args.scale}" if args.scale != 1.0 else ""),
        "cases": len(records),
        "workers": args.workers,
        "wall_seconds": round(wall),
        "python": platform.python_version(),
    }
    summary = report.write(Path(args.out), records, meta)
    print(report.text_table(summary["counts"]))
    v = summary["verdict"]
    print(
        f"{len(records)} cases in {wall:.0f} s; verdict: {'passed' if v['passed'] else 'FAILED'} "
        f"(silent {len(v['silent'])}, crash {len(v['crash'])}, security {len(v['security'])}, "
        f"raw not allowed {len(v['raw_not_allowed'])}); results in {args.out}"
    )
    return 1 if args.check and not v["passed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
