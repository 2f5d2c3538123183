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


def _planetoid(args: argparse.Namespace) -> int:
    from .data import load_planetoid
    from .experiments.planetoid import MODELS, summarize, train

    models = MODELS if args.model == "all" else tuple(args.model.split(","))
    unknown = set(models) - set(MODELS)
    if unknown:
        print(
            f"structconv planetoid: --model got {sorted(unknown)}; expected 'all' or some of {MODELS}", file=sys.stderr
        )
        return 2
    try:
        data = load_planetoid(args.data, args.name)
    except (FileNotFoundError, ValueError) as err:
        print(f"structconv planetoid: {err}", file=sys.stderr)
        return 2
    print(f"{data!r}; {args.seeds} seeds per model; test accuracy at the best validation epoch", flush=True)
    results = [train(m, data, seed, args.epochs) for m in models for seed in range(args.seeds)]
    print(summarize(results))
    return 0


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
    planetoid = sub.add_parser("planetoid", help="train GCN, ChebNet, TAGConv and GAT on a Planetoid split (Cora)")
    planetoid.add_argument("--data", default="../shared/data/planetoid", help="folder holding ind.<name>.* files")
    planetoid.add_argument("--name", default="cora", help="dataset name (default cora)")
    planetoid.add_argument("--model", default="all", help="all, or comma-separated of gcn,cheb,tag,gat")
    planetoid.add_argument("--seeds", type=int, default=10, help="runs per model (default 10)")
    planetoid.add_argument("--epochs", type=int, default=None, help="override the paper's epoch count")
    planetoid.set_defaults(func=_planetoid)
    from .experiments.cifar.cli import add_parser as add_cifar

    add_cifar(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "cifar":
        from .experiments.cifar.cli import run

        return run(args)
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
