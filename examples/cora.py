"""Train a two-layer GCN on Cora with structconv and report its test accuracy.

    python examples/cora.py [path/to/planetoid] [--epochs N] [--seed S]

The data directory defaults to ``../shared/data/planetoid`` (beside the repository).
The default 200 epochs are the paper's; fewer give a quick check at a lower accuracy.
The same experiment for all four models and ten seeds: ``structconv planetoid``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from structconv.data import load_planetoid
from structconv.experiments.planetoid import train

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared/data/planetoid"


def main(argv: list[str] | None = None) -> None:
    """Train and report.

    Parameters
    ----------
    argv
        The command-line arguments (default: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(description="Train a two-layer GCN on Cora.")
    parser.add_argument(
        "data",
        nargs="?",
        type=Path,
        default=DEFAULT_DATA,
        help="directory of the ind.cora.* files",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=200,
        help="training epochs (default 200, the paper's)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    data = load_planetoid(args.data, "cora")
    result = train("gcn", data, seed=args.seed, epochs=args.epochs)
    print(
        f"GCN on Cora: test accuracy {100 * result.test_accuracy:.1f} % "
        f"(best validation epoch {result.best_epoch} of {args.epochs})"
    )


if __name__ == "__main__":
    main()
