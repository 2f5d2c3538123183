"""The ``structconv`` console entry point."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence


def _check(args: argparse.Namespace) -> int:
    from .selfcheck import format_results, run_checks

    backends = tuple(args.backends.split(","))
    unknown = set(backends) - {"numpy", "torch"}
    if unknown:
        print(f"structconv check: --backends got {sorted(unknown)}; expected numpy and/or torch", file=sys.stderr)
        return 2
    start = time.perf_counter()
    print(
        f"structconv check: {args.cases} random cases per identity, seed {args.seed}, backends {', '.join(backends)}",
        flush=True,
    )
    results = run_checks(seed=args.seed, cases=args.cases, backends=backends)
    print(format_results(results))
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0 if all(r.passed for r in results) else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``structconv``."""
    parser = argparse.ArgumentParser(
        prog="structconv", description="Convolution on any structure: y = sum_k A_k^T x Theta_k"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="verify the framework's identities on random cases")
    check.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    check.add_argument("--cases", type=int, default=12, help="random cases per identity (default 12)")
    check.add_argument("--backends", default="numpy,torch", help="comma-separated: numpy,torch (default both)")
    check.set_defaults(func=_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = build_parser().parse_args(argv)
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
