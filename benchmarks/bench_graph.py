"""Graph layers against PyTorch Geometric on Cora, with the same weights.

For GCNConv, TAGConv (K=3), ChebConv (K=3) and GATConv (8 heads of 8), it times forward +
backward on Cora (2,708 nodes, 1,433 features, 10,556 edges) in one run:

* ``pyg``: the PyG layer given ``edge_index`` (it normalises the graph on every call);
* ``ours``: the structconv layer given ``edge_index`` (builds its basis on every call);
* ``ours-prebuilt`` / ``pyg-cached``: the basis built once and passed in, against PyG's own
  ``cached=True`` where the layer has it (GCN), else the same PyG call;

then a 200-epoch two-layer GCN training run (the paper's set-up) with each library, and a
scaling part on random graphs with 100k nodes: the four layers against PyG on 1M edges (32
channels in, 32 out; GAT as 8 heads of 4; forward + backward, interleaved, medians), and the
time and peak memory of one GCNConv forward + backward from 125k to 1M edges.

    python -m benchmarks.bench_graph                 # all (a few minutes)
    python -m benchmarks.bench_graph --skip-scaling  # Cora only
    python -m benchmarks.bench_graph --only GAT --repeats 5  # GAT on Cora and at 1M edges, nothing else

Every variant runs with subnormal numbers flushed to zero on every CPU thread
(:func:`benchmarks.harness.fp_environment`, and in the scaling part's fresh processes);
``--no-flush`` keeps them (``_unflushed`` record).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F  # noqa: N812

from benchmarks.harness import (
    Report,
    Row,
    add_flush_option,
    current_environment,
    fp_environment,
    interleaved_times,
    progress,
)
from structconv import gcn_basis
from structconv.data import load_planetoid
from structconv.experiments.planetoid import SparseInput
from structconv.nn import ChebConv, GATConv, GCNConv, TAGConv
from structconv.structures.graph import PolynomialBasis, as_edges, gcn_normalize, scaled_laplacian

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid"


def copy_weights(ours: Any, ref: Any, kind: str) -> None:
    """Give our layer the PyG layer's parameters."""
    with torch.no_grad():
        if kind == "gcn":
            ours.weight.copy_(ref.lin.weight.T[None])
        elif kind in ("tag", "cheb"):
            ours.weight.copy_(torch.stack([lin.weight.T for lin in ref.lins]))
        else:
            ours.weight.copy_(ref.lin.weight.T)
            ours.att_src.copy_(ref.att_src[0])
            ours.att_dst.copy_(ref.att_dst[0])
        ours.bias.copy_(ref.bias)


def layers(P: int, Q: int = 16, head: int = 8, only: str = "") -> dict[str, tuple[Any, Any, Any]]:
    """Each layer ``P -> Q`` channels (GAT: 8 heads of ``head``): ours, PyG's, PyG's cached (or None).

    ``only``: the layers whose name starts with it (all for ``""``).
    """
    import torch_geometric.nn as pyg

    made = {
        "GCNConv": (GCNConv(P, Q), pyg.GCNConv(P, Q), pyg.GCNConv(P, Q, cached=True)),
        "TAGConv(K=3)": (TAGConv(P, Q, K=3), pyg.TAGConv(P, Q, K=3), None),
        "ChebConv(K=3)": (ChebConv(P, Q, K=3), pyg.ChebConv(P, Q, K=3), None),
        f"GATConv(8x{head})": (GATConv(P, head, heads=8), pyg.GATConv(P, head, heads=8), None),
    }
    return {name: trio for name, trio in made.items() if name.startswith(only)}


def prebuilt(name: str, x: torch.Tensor, edge_index: torch.Tensor) -> Any:
    if name == "GCNConv":
        return gcn_basis(edge_index, int(x.shape[0]), like=x)
    edges = as_edges(edge_index, int(x.shape[0]), like=x)
    if name.startswith("TAG"):
        return PolynomialBasis(gcn_normalize(edges, add_self_loops=False).to_basis(), range(4), "powers")
    if name.startswith("Cheb"):
        return PolynomialBasis(scaled_laplacian(edges)[0].to_basis(), range(3), "chebyshev")
    return None


def fwd_bwd(layer: Any, x: torch.Tensor, graph: Any) -> Any:
    def run() -> None:
        layer(x, graph).sum().backward()
        layer.zero_grad(set_to_none=True)

    return run


def cora_layers(x: torch.Tensor, edge_index: torch.Tensor, repeats: int, only: str = "") -> list[Row]:
    rows = []
    items = list(layers(int(x.shape[1]), only=only).items())
    for i, (name, (ours, ref, ref_cached)) in enumerate(items, start=1):
        progress(i, len(items), name)
        kind = name[:3].lower() if not name.startswith("Cheb") else "cheb"
        copy_weights(ours, ref, kind)
        ours.eval()
        ref.eval()
        with torch.no_grad():
            err = float((ours(x, edge_index) - ref(x, edge_index)).abs().max())
        variants: dict[str, Any] = {"pyg": fwd_bwd(ref, x, edge_index), "ours": fwd_bwd(ours, x, edge_index)}
        basis = prebuilt(name, x, edge_index)
        if basis is not None:
            variants["ours-prebuilt"] = fwd_bwd(ours, x, basis)
        if ref_cached is not None:
            ref_cached.load_state_dict(ref.state_dict())
            variants["pyg-cached"] = fwd_bwd(ref_cached, x, edge_index)
        times = interleaved_times(variants, repeats=repeats, warmup=3)
        rows.append(
            Row(name, {"N": int(x.shape[0]), "E": int(edge_index.shape[1])}, times, "pyg", {"max_abs_diff": err})
        )
    return rows


def train_gcn(make: Any, x: torch.Tensor, graph: Any, y: torch.Tensor, mask: torch.Tensor, epochs: int) -> float:
    """The paper's two-layer GCN loop; input dropout on the non-zero features only, for both libraries."""
    torch.manual_seed(0)
    conv1, conv2 = make(int(x.shape[1]), 16), make(16, int(y.max()) + 1)
    params = list(conv1.parameters()) + list(conv2.parameters())
    opt = torch.optim.Adam(params, lr=0.01, weight_decay=5e-4)
    features = SparseInput(x)
    start = time.perf_counter()
    for _ in range(epochs):
        opt.zero_grad()
        h = F.dropout(F.relu(conv1(features.dropout(0.5, True), graph)), 0.5)
        loss = F.cross_entropy(conv2(h, graph)[mask], y[mask])
        loss.backward()
        opt.step()
    return time.perf_counter() - start


def training(x: torch.Tensor, edge_index: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, repeats: int) -> Row:
    import torch_geometric.nn as pyg

    basis = gcn_basis(edge_index, int(x.shape[0]), like=x)
    variants = {
        "pyg": lambda: train_gcn(pyg.GCNConv, x, edge_index, y, mask, 200),
        "ours": lambda: train_gcn(GCNConv, x, edge_index, y, mask, 200),
        "ours-prebuilt": lambda: train_gcn(GCNConv, x, basis, y, mask, 200),
        "pyg-cached": lambda: train_gcn(lambda p, q: pyg.GCNConv(p, q, cached=True), x, edge_index, y, mask, 200),
    }
    inner: dict[str, list[float]] = {k: [] for k in variants}  # each run's own time of its 200 epochs
    runs = {k: lambda k=k, v=v: inner[k].append(v()) for k, v in variants.items()}
    interleaved_times(runs, repeats=repeats, warmup=0)  # for the one floating-point setting and the interleaving
    times = {k: statistics.median(ts) for k, ts in inner.items()}
    return Row("GCN 200 epochs", {"epochs": 200}, times, "pyg")


_SCALING_CHILD = """
import sys, time, statistics, torch

torch.set_flush_denormal(sys.argv[3] == "1")  # before any thread starts: all of them inherit it
from structconv.nn import GCNConv


def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024


N, E = int(sys.argv[1]), int(sys.argv[2])
g = torch.Generator().manual_seed(E)
edge_index = torch.randint(0, N, (2, E), generator=g)
x = torch.randn(N, 32, generator=g)
layer = GCNConv(32, 32)
times, peaks = [], []
for _ in range(4):
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current size
        f.write("5")
    start = time.perf_counter()
    layer(x, edge_index).sum().backward()
    times.append(time.perf_counter() - start)
    peaks.append(status("VmHWM") - before)
print(statistics.median(times[1:]), max(peaks[1:]))
"""


def layers_at_scale(repeats: int, N: int = 100_000, E: int = 1_000_000, only: str = "") -> list[Row]:
    """Each layer against PyG on a random graph (``N`` nodes, ``E`` edges, 32 -> 32 channels)."""
    g = torch.Generator().manual_seed(E)
    edge_index = torch.randint(0, N, (2, E), generator=g)
    x = torch.randn(N, 32, generator=g)
    rows = []
    items = list(layers(32, 32, head=4, only=only).items())
    for i, (name, (ours, ref, _)) in enumerate(items, start=1):
        progress(i, len(items), f"{name} N={N} E={E}")
        kind = name[:3].lower() if not name.startswith("Cheb") else "cheb"
        copy_weights(ours, ref, kind)
        with torch.no_grad():
            err = float((ours(x, edge_index) - ref(x, edge_index)).abs().max())
        variants = {"pyg": fwd_bwd(ref, x, edge_index), "ours": fwd_bwd(ours, x, edge_index)}
        times = interleaved_times(variants, repeats=repeats, warmup=1)
        rows.append(Row(f"{name} E={E // 1000}k", {"N": N, "E": E}, times, "pyg", {"max_abs_diff": err}))
    return rows


def scaling() -> list[Row]:
    """GCNConv forward + backward on random graphs with 100k nodes: time and peak memory against edges.

    Each size runs in a fresh process; its peak resident memory is reset before each call
    (``/proc/self/clear_refs``), so the figure is the memory one call adds at its peak.
    """
    rows = []
    N = 100_000
    sizes = (125_000, 250_000, 500_000, 1_000_000)
    flush = "1" if current_environment().measured else "0"  # the children run in this process's setting
    for i, E in enumerate(sizes, start=1):
        progress(i, len(sizes), f"random graph N={N} E={E}")
        out = subprocess.run(
            [sys.executable, "-c", _SCALING_CHILD, str(N), str(E), flush], capture_output=True, text=True, check=True
        ).stdout.split()
        seconds, peak_mb = float(out[0]), float(out[1])
        extra = {"peak_mb_added": peak_mb, "us_per_edge": 1e6 * seconds / E, "kb_per_edge": 1024 * peak_mb / E}
        rows.append(Row(f"GCNConv N=100k E={E}", {"N": N, "E": E}, {"ours": seconds}, "ours", extra))
    return rows


def table(rows: list[Row]) -> str:
    lines = []
    for r in rows:
        cells = "  ".join(f"{k} {1e3 * v:8.2f} ms ({r.ratio(k):.2f}x)" for k, v in r.times.items())
        extra = "  ".join(f"{k}={v:.3g}" for k, v in r.extra.items())
        lines.append(f"{r.case:<24} {cells}  {extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--train-repeats", type=int, default=3)
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument(
        "--only", default="", help="run only the layers whose name starts with this (e.g. GAT), on Cora and at 1M edges"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    add_flush_option(parser)
    args = parser.parse_args(argv)
    fp = fp_environment(not args.no_flush)
    torch.set_grad_enabled(True)
    cora = load_planetoid(args.data, "cora")
    name = f"graph_cpu_{args.only.lower()}" if args.only else "graph_cpu"  # a part beside the whole
    report = Report(name + fp.suffix)
    report.rows += cora_layers(cora.x, cora.edge_index, args.repeats, args.only)
    if not args.only:  # the GCN training and GCN scaling runs belong to the whole benchmark
        report.rows.append(training(cora.x, cora.edge_index, cora.y, cora.train_mask, args.train_repeats))
    if not args.skip_scaling:
        report.rows += layers_at_scale(args.repeats, only=args.only)
    if not args.skip_scaling and not args.only:
        report.rows += scaling()
    text = table(report.rows)
    js, txt = report.write(args.out, text)
    print(report.text(text))
    print(f"wrote {js} and {txt}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
