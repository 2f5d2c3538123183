"""Per-call overhead of the layers against their peers, where a call is short: batch 1, Cora size.

A layer that compiles its contraction once (:func:`structconv.contraction`) should cost what its
peer costs per call.  In one run, interleaved, medians of ``--repeats`` rounds of ``--calls``
calls each:

* ``GridConv2d`` against ``torch.nn.Conv2d`` at batch 1 on the layer shapes of a CIFAR ResNet
  (3 -> 16 at 32x32, 16 -> 16 at 32x32, 32 -> 32 at 16x16, 64 -> 64 at 8x8; 3x3, padding 1),
  forward under ``torch.no_grad()`` and forward + backward.  Goal: <= 1.05x.
* ``GCNConv`` against PyG's ``GCNConv`` (``cached=False``: both normalise the graph on every
  call) on Cora (2,708 nodes, 1,433 features -> 16, 10,556 edges), forward + backward.
  Goal: <= 1.0x.
* ``conv()`` against a compiled ``contraction()`` of the same operands (a 16x16 grid, 16 -> 16
  channels, batch 1): what planning once saves per call.

One torch thread by default (``--threads``): the question is the cost around the kernels, and
a single thread keeps the kernels' own time steady on a shared machine.  Every variant runs with
subnormal numbers flushed to zero (:func:`benchmarks.harness.fp_environment`); ``--no-flush``
keeps them (``_unflushed`` record).

    python -m benchmarks.bench_overhead                 # about two minutes on 2 cores
    python -m benchmarks.bench_overhead --repeats 5     # a quick look

Writes ``benchmarks/results/overhead_cpu.{json,txt,png}``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import Report, Row, add_flush_option, fp_environment, interleaved_times, progress, publish
from structconv import contraction, conv, grid_basis
from structconv.data import load_planetoid
from structconv.nn import GCNConv, GridConv2d

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid"
OUT = Path(__file__).resolve().parent / "results"
GRID_SHAPES = [(3, 16, 32), (16, 16, 32), (32, 32, 16), (64, 64, 8)]
GOALS = {"grid": 1.05, "gcn": 1.0}


def _calls(fn: Callable[[], Any], calls: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(calls):
            fn()

    return run


def _forward_backward(layer: torch.nn.Module, *args: Any) -> Callable[[], None]:
    def step() -> None:
        layer(*args).sum().backward()

    return step


def _no_grad(layer: torch.nn.Module, *args: Any) -> Callable[[], None]:
    def call() -> None:
        with torch.no_grad():
            layer(*args)

    return call


def grid_rows(repeats: int, calls: int) -> list[Row]:
    rows = []
    for i, (p, q, size) in enumerate(GRID_SHAPES):
        progress(i + 1, len(GRID_SHAPES), f"GridConv2d {p}->{q} at {size}x{size}")
        torch.manual_seed(0)
        peer = torch.nn.Conv2d(p, q, 3, padding=1)
        ours = GridConv2d(p, q, 3, padding=1)
        ours.load_state_dict(peer.state_dict())
        x = torch.randn(1, p, size, size)
        torch.testing.assert_close(ours(x), peer(x))
        for mode, make in (("forward", _no_grad), ("forward+backward", _forward_backward)):
            variants = {"torch": _calls(make(peer, x), calls), "structconv": _calls(make(ours, x), calls)}
            times = interleaved_times(variants, repeats=repeats)
            params = {"layer": "GridConv2d", "in": p, "out": q, "grid": size, "batch": 1, "mode": mode}
            rows.append(Row(f"grid {p}->{q} {size}x{size} {mode}", params, {k: v / calls for k, v in times.items()},
                            "torch"))  # fmt: skip
    return rows


def gcn_rows(repeats: int, calls: int, data: Path) -> list[Row]:
    from torch_geometric.nn import GCNConv as PyGGCNConv

    progress(1, 1, "GCNConv on Cora")
    cora = load_planetoid(data, "cora")
    x, edge_index = cora.x, cora.edge_index
    torch.manual_seed(0)
    peer = PyGGCNConv(x.shape[1], 16)
    ours = GCNConv(x.shape[1], 16)
    ours.load_state_dict(peer.state_dict())
    torch.testing.assert_close(ours(x, edge_index), peer(x, edge_index), atol=1e-5, rtol=1e-4)
    variants = {
        "pyg": _calls(_forward_backward(peer, x, edge_index), calls),
        "structconv": _calls(_forward_backward(ours, x, edge_index), calls),
    }
    times = interleaved_times(variants, repeats=repeats)
    params = {"layer": "GCNConv", "nodes": int(x.shape[0]), "features": int(x.shape[1]), "out": 16,
              "edges": int(edge_index.shape[1]), "mode": "forward+backward"}  # fmt: skip
    return [Row("GCNConv Cora forward+backward", params, {k: v / calls for k, v in times.items()}, "pyg")]


def engine_rows(repeats: int, calls: int) -> list[Row]:
    progress(1, 1, "conv() against a compiled contraction()")
    A = grid_basis((16, 16), 3, padding=1)
    x, theta = torch.randn(1, 256, 16), torch.randn(9, 16, 16)
    compiled = contraction(A, x, theta)
    torch.testing.assert_close(compiled(x, theta), conv(A, x, theta))
    with torch.no_grad():
        variants = {
            "conv": _calls(lambda: conv(A, x, theta), calls),
            "contraction": _calls(lambda: compiled(x, theta), calls),
        }
        times = interleaved_times(variants, repeats=repeats)
    params = {"grid": 16, "in": 16, "out": 16, "batch": 1, "order": compiled.order}
    return [Row("conv vs contraction 16x16, 16->16", params, {k: v / calls for k, v in times.items()}, "conv")]


def table(rows: list[Row]) -> str:
    lines = [f"{'case':<44} {'peer us':>9} {'ours us':>9} {'ratio':>7} {'goal':>6}"]
    for r in rows:
        ours = "contraction" if r.peer == "conv" else "structconv"
        goal = GOALS.get("gcn" if r.peer == "pyg" else "grid") if r.peer != "conv" else None
        lines.append(
            f"{r.case:<44} {r.times[r.peer] * 1e6:>9.1f} {r.times[ours] * 1e6:>9.1f} {r.ratio(ours):>6.3f}x "
            f"{'' if goal is None else f'{goal:.2f}x':>6}"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layer_rows = [r for r in rows if r.peer != "conv"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [r.case.replace(" forward+backward", "\nfwd+bwd").replace(" forward", "\nfwd") for r in layer_rows]
    ratios = [r.ratio("structconv") for r in layer_rows]
    goals = [GOALS["gcn" if r.peer == "pyg" else "grid"] for r in layer_rows]
    colors = ["tab:green" if v <= g else "tab:red" for v, g in zip(ratios, goals, strict=True)]
    ax.bar(range(len(ratios)), ratios, color=colors)
    for i, g in enumerate(goals):
        ax.hlines(g, i - 0.4, i + 0.4, colors="black", linestyles="dashed")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(ratios)), names, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("time per call / peer's (lower is better)")
    ax.set_title("Per-call time against torch.nn.Conv2d (batch 1) and PyG GCNConv (Cora); dashes: goals")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21, help="interleaved rounds (medians are reported)")
    parser.add_argument("--calls", type=int, default=20, help="calls per round for the short cases")
    parser.add_argument("--data", type=Path, default=DATA, help="the Planetoid directory (Cora)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: per-call costs, least noise)")
    add_flush_option(parser)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.calls < 1 or args.threads < 1:
        parser.error("--repeats, --calls and --threads must be positive")
    torch.set_num_threads(args.threads)
    fp = fp_environment(not args.no_flush)
    rows = grid_rows(args.repeats, args.calls) + gcn_rows(args.repeats, max(1, args.calls // 10), args.data)
    rows += engine_rows(args.repeats, args.calls)
    report = Report(f"overhead_cpu{fp.suffix}", rows)
    report.summary = {
        "worst_grid_ratio": max(r.ratio("structconv") for r in rows if r.peer == "torch"),
        "gcn_ratio": next(r.ratio("structconv") for r in rows if r.peer == "pyg"),
        "goals": GOALS,
    }
    publish(report, args.out, table(rows), plot)


if __name__ == "__main__":
    main()
