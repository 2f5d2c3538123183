"""GIN and GraphSAGE with the basis built on every call, against PyG's layers, forward and backward.

``python -m benchmarks.bench_own_layers`` times, one thread, subnormals flushed, interleaved
medians, a training step's forward and backward of

* ``GINConv`` (its network a two-layer MLP) and ``SAGEConv`` (mean, root weight) against
  ``torch_geometric.nn``'s layers holding the same parameters, on a random graph of 10,000
  nodes and 100,000 edges with 64 channels, and on Cora (``../shared/data``) when it is there;
* the basis alone (``graph_basis`` from the ``edge_index``), the share of a call spent on
  building it.

It writes ``docs/_static/own_layers/own_layers.{json,txt,png}`` and the table alone,
``own_layers_table.txt`` (``--out`` elsewhere).  The
target is a ratio of at most 1.0 to PyG for both layers at 100,000 edges.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import Report, Row, add_flush_option, fp_environment, interleaved_times, progress
from structconv import graph_basis
from structconv import nn as snn
from structconv.data import load_planetoid
from structconv.nn.pyg_state import pyg_state_dict

OUT = Path("docs/_static/own_layers")
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid"


def _mlp(p: int, q: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(p, q), torch.nn.ReLU(), torch.nn.Linear(q, q))


def pairs(p: int, q: int) -> dict[str, tuple[Any, Any, Any]]:
    """Each layer: (ours, PyG's with our parameters, the members of its basis)."""
    import torch_geometric.nn as pyg

    torch.manual_seed(0)
    gin = snn.GINConv(_mlp(p, q), train_eps=True)
    peer_gin = pyg.GINConv(_mlp(p, q), train_eps=True)
    peer_gin.load_state_dict(gin.state_dict())
    sage = snn.SAGEConv(p, q)
    peer_sage = pyg.SAGEConv(p, q)
    peer_sage.load_state_dict(pyg_state_dict(sage))
    return {"GIN": (gin, peer_gin, "gin"), "SAGE": (sage, peer_sage, ("mean", "identity"))}


def step(layer: Any, x: torch.Tensor, edge_index: torch.Tensor) -> None:
    """Forward and backward, as a training step runs a layer."""
    layer.zero_grad(set_to_none=True)
    layer(x, edge_index).sum().backward()


def measure(case: str, x: torch.Tensor, edge_index: torch.Tensor, repeats: int) -> list[Row]:
    """One row per layer: ours and PyG's step, and the basis built alone."""
    rows = []
    for name, (ours, peer, kind) in pairs(int(x.shape[1]), 64).items():
        with torch.no_grad():
            torch.testing.assert_close(ours(x, edge_index), peer(x, edge_index), rtol=1e-4, atol=1e-4)
        times = interleaved_times(
            {
                "structconv": lambda ours=ours: step(ours, x, edge_index),
                "pyg": lambda peer=peer: step(peer, x, edge_index),
                "basis": lambda kind=kind: graph_basis(edge_index, kind, num_nodes=int(x.shape[0]), like=x),
            },
            repeats=repeats,
        )
        share = times["basis"] / times["structconv"]
        params = {"nodes": int(x.shape[0]), "edges": int(edge_index.shape[1]), "channels": int(x.shape[1])}
        rows.append(Row(f"{name} {case}", params, times, "pyg", {"basis_share": share}))
    return rows


def table(rows: list[Row]) -> str:
    """The records' table, within the docs' 88 columns."""
    lines = [f"{'case':<16} {'structconv':>11} {'PyG':>10} {'ratio':>6} {'basis alone':>12} {'share':>6}"]
    for r in rows:
        t = r.times
        lines.append(
            f"{r.case:<16} {1e3 * t['structconv']:8.2f} ms {1e3 * t['pyg']:7.2f} ms {r.ratio('structconv'):5.2f}x "
            f"{1e3 * t['basis']:9.2f} ms {100 * r.extra['basis_share']:5.0f}%"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    names = [r.case for r in rows]
    ax.barh(names, [r.ratio("structconv") for r in rows], color="tab:blue", label="structconv / PyG")
    ax.barh(names, [r.times["basis"] / r.times["pyg"] for r in rows], color="tab:orange", label="of it: the basis")
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xlabel("time of a forward and backward step, relative to PyG's (one thread)")
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--edges", type=int, default=100_000)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=OUT)
    add_flush_option(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    fp = fp_environment(not args.no_flush)
    report = Report("own_layers" + fp.suffix)
    g = torch.Generator().manual_seed(0)
    cases: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    edge_index = torch.randint(0, args.nodes, (2, args.edges), generator=g)
    cases.append((f"{args.edges // 1000}k edges", torch.randn(args.nodes, 64, generator=g), edge_index))
    if args.data.exists():
        cora = load_planetoid(args.data, "cora")
        cases.append(("Cora", cora.x[:, :64].contiguous(), cora.edge_index))
    for i, (case, x, edges) in enumerate(cases, 1):
        progress(i, len(cases), case)
        report.rows += measure(case, x, edges, args.repeats)
    report.summary = {r.case: round(r.ratio("structconv"), 3) for r in report.rows}
    text = table(report.rows)
    js, txt = report.write(args.out, text)
    (args.out / f"{report.name}_table.txt").write_text(text + "\n")  # the table alone, for the docs
    plot(report.rows, args.out / f"{report.name}.png")
    print(report.text(text))
    print(f"wrote {js}, {txt}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
