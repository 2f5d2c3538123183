"""The ``structconv`` console entry point: ``check``, ``planetoid``, ``tour`` and ``cifar``.

The top of the layering: this module imports the experiments, nothing imports it.  The
argument-parsing conventions every subcommand shares (:class:`ArgumentParser`, the number types,
the exit statuses) live in :mod:`structconv.experiments.cli_common`, below the experiments that
use them.  Usage errors exit with status 2, runtime failures with 1.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from collections.abc import Sequence

from . import __version__
from .experiments.cli_common import (
    EXIT_RUNTIME,
    EXIT_USAGE,
    ArgumentParser,
    did_you_mean,
    nonnegative_int,
    positive_int,
)

__all__ = ["build_parser", "main"]

PLANETOID_NAMES = ("cora", "citeseer", "pubmed")  # structconv.data.planetoid.NAMES, without importing torch
PLANETOID_MODELS = ("gcn", "cheb", "tag", "gat")  # structconv.experiments.planetoid.MODELS (tested)


# --- subcommands ----------------------------------------------------------------------------------
def _check(args: argparse.Namespace) -> int:
    from .theory.selfcheck import format_results, run_checks

    backends = tuple(args.backends.split(","))
    unknown = sorted(set(backends) - {"numpy", "torch"})
    if unknown:
        hint = did_you_mean(unknown[0], ("numpy", "torch")) or "expected numpy and/or torch"
        print(f"structconv check: --backends got {unknown}; {hint}", file=sys.stderr)
        return EXIT_USAGE
    start = time.perf_counter()
    print(
        f"structconv check: {args.cases} random cases per identity, seed {args.seed}, backends {', '.join(backends)}",
        flush=True,
    )
    results = run_checks(seed=args.seed, cases=args.cases, backends=backends)
    print(format_results(results))
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0 if all(r.passed for r in results) else EXIT_RUNTIME


def _planetoid(args: argparse.Namespace) -> int:
    models = PLANETOID_MODELS if args.model == "all" else tuple(m.strip() for m in args.model.split(","))
    expected = f"expected 'all' or comma-separated names of {', '.join(PLANETOID_MODELS)}"
    if not any(models):
        print(f"structconv planetoid: --model: no model in {args.model!r}; {expected}", file=sys.stderr)
        return EXIT_USAGE
    for model in models:  # checked before torch is imported: a typo fails at once
        if model and model not in PLANETOID_MODELS:
            hint = did_you_mean(model, PLANETOID_MODELS) or expected
            print(f"structconv planetoid: --model: unknown model {model!r}; {hint}", file=sys.stderr)
            return EXIT_USAGE
    if "" in models:  # "gcn,,gat" or "gcn,": a name left out, not silently skipped
        place = models.index("") + 1
        print(f"structconv planetoid: --model: entry {place} of {args.model!r} is empty; {expected}", file=sys.stderr)
        return EXIT_USAGE
    from .data import load_planetoid
    from .experiments.planetoid import summarize, train

    try:
        data = load_planetoid(args.data, args.name)
    except FileNotFoundError as err:
        print(f"structconv planetoid: {err}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, pickle.UnpicklingError) as err:  # a malformed, refused or implausibly sized file
        print(f"structconv planetoid: {err}", file=sys.stderr)
        return EXIT_RUNTIME
    print(f"{data!r}; {args.seeds} seeds per model; test accuracy at the best validation epoch", flush=True)
    results = [train(m, data, seed, args.epochs) for m in models for seed in range(args.seeds)]
    print(summarize(results))
    return 0


def _tour(args: argparse.Namespace) -> int:
    from .experiments.tour import run_tour

    try:
        return run_tour(args)
    except FileNotFoundError as err:  # a data directory or archive that is not there
        print(f"structconv tour: {err}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, pickle.UnpicklingError) as err:  # a malformed or refused data file
        print(f"structconv tour: {err}", file=sys.stderr)
        return EXIT_RUNTIME


def build_parser() -> ArgumentParser:
    """The argument parser of ``structconv`` and all its subcommands."""
    parser = ArgumentParser(prog="structconv", description="Convolution on any structure: y = sum_k A_k^T x Theta_k")
    parser.add_argument("--version", action="version", version=f"structconv {__version__}", help="print the version")
    sub = parser.add_subparsers(dest="command", required=True, title="commands")
    check = sub.add_parser(
        "check",
        help="verify the framework's identities on random cases",
        description="Verify the framework's identities (conv = einsum, composition, ...) on random cases.",
    )
    check.add_argument("--seed", type=nonnegative_int, default=0, help="random seed")
    check.add_argument("--cases", type=positive_int, default=12, help="random cases per identity")
    check.add_argument("--backends", default="numpy,torch", help="comma-separated: numpy, torch or both")
    check.set_defaults(func=_check)
    planetoid = sub.add_parser(
        "planetoid",
        help="train GCN, ChebNet, TAGConv and GAT on a Planetoid split (Cora)",
        description="Train GCN, ChebNet, TAGConv and GAT on a Planetoid split; report mean test accuracy.",
    )
    planetoid.add_argument("--data", default="../shared/data/planetoid", help="folder holding the ind.<name>.* files")
    planetoid.add_argument("--name", type=str.lower, choices=PLANETOID_NAMES, default="cora", help="dataset name")
    planetoid.add_argument("--model", default="all", help=f"all, or comma-separated of {','.join(PLANETOID_MODELS)}")
    planetoid.add_argument("--seeds", type=positive_int, default=10, help="runs per model (seeds 0, 1, ...)")
    planetoid.add_argument(
        "--epochs", type=positive_int, default=None, help="epochs per run (default: the paper's for each model)"
    )
    planetoid.set_defaults(func=_planetoid)
    from .experiments.tour import DESCRIPTION
    from .experiments.tour import add_arguments as add_tour

    tour = sub.add_parser(
        "tour", help="the library at work on real data, with a summary table", description=DESCRIPTION
    )
    add_tour(tour)
    tour.set_defaults(func=_tour)
    from .experiments.cifar.cli import add_parser as add_cifar

    add_cifar(sub)
    sub.metavar = "{" + ",".join(sub.choices) + "}"  # named so in "the following arguments are required"
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (0 success, 1 runtime failure, 2 usage error)."""
    args = build_parser().parse_args(argv)
    if args.command == "cifar":
        from .experiments.cifar.cli import run

        return run(args)
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
