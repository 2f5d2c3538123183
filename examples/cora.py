"""Train a two-layer GCN on Cora with structconv and report its test accuracy.

    python examples/cora.py [path/to/planetoid]   # default ../shared/data/planetoid

The same experiment for all four models and ten seeds: ``structconv planetoid``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from structconv.data import load_planetoid
from structconv.experiments.planetoid import train


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared/data/planetoid"
    data = load_planetoid(root, "cora")
    result = train("gcn", data, seed=0)
    print(f"GCN on Cora: test accuracy {100 * result.test_accuracy:.1f} % (best validation epoch {result.best_epoch})")


if __name__ == "__main__":
    main()
