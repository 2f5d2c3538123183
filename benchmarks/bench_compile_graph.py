"""A compiled two-layer GCN on Cora: structconv against PyTorch Geometric, both under ``torch.compile``.

The model, loss and optimiser follow PyG's ``examples/compile/gcn.py``: ``GCNConv(1433, 16)``,
ReLU, ``GCNConv(16, 7)``, dropout 0.5 on the input and the hidden layer, Adam (lr 0.01, weight
decay 5e-4 on the first layer only).  Unlike that example, the second layer is also given the
edge weights (the GCN of the paper).  Both libraries start from the same weights (PyG's, seed 0,
loaded into structconv's layers) and draw the same dropout stream.  Two set-ups:

* ``prenorm``: ``normalize=False``, the graph normalised once beforehand by PyG's ``gcn_norm``
  (what ``T.GCNNorm()`` does), so both libraries get the very same ``edge_index`` and ``edge_weight``;
* ``normalize``: the default ``normalize=True``, each layer normalising ``edge_index`` on every call.

For each library and set-up it records, ``repeats`` times:

* the compile time: the wall time of the first training step of ``torch.compile(model,
  dynamic=False, fullgraph=True)`` after ``torch._dynamo.reset()``, in an empty Inductor cache
  (``torch._inductor.utils.fresh_cache``), and apart from it the first evaluation forward (the
  second graph); structconv must compile as one graph, PyG falls back to ``fullgraph=False`` if it cannot;
* the seconds per epoch (one training step + one evaluation forward with the test accuracy, as
  in the example): the median over the epochs after the first ten, the compiled and the eager
  models of both libraries interleaved epoch by epoch in one process (``harness.interleaved_times``);
* the test accuracy after ``epochs`` epochs.

One intra-op thread by default (``--threads``), subnormal numbers flushed to zero for every variant
(:func:`benchmarks.harness.fp_environment`; ``--no-flush`` keeps them, in an ``_unflushed`` record).

    python -m benchmarks.bench_compile_graph                      # 200 epochs, 3 repeats (several minutes)
    python -m benchmarks.bench_compile_graph --epochs 50 --repeats 1 --out /tmp/compile
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from benchmarks.harness import Report, Row, add_flush_option, fp_environment, interleaved_times, median_time, progress
from structconv import nn as snn
from structconv.data import load_planetoid

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid"
SETUPS = {"prenorm": False, "normalize": True}  # set-up -> the layers' ``normalize``
LIBS = ("structconv", "pyg")
GOALS = {"epoch_ratio_max": 1.0, "compile_ratio_max": 1.2}  # structconv / PyG, compiled


class GCN(nn.Module):
    """Dropout, ``conv(P, 16)``, ReLU, dropout, ``conv(16, C)``; ``conv`` is either library's GCNConv."""

    def __init__(self, conv: Callable[..., nn.Module], P: int, C: int, normalize: bool) -> None:
        super().__init__()
        self.conv1, self.conv2 = conv(P, 16, normalize=normalize), conv(16, C, normalize=normalize)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_weight: torch.Tensor | None) -> torch.Tensor:
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index, edge_weight).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        out: torch.Tensor = self.conv2(x, edge_index, edge_weight)
        return out


class Run:
    """One model in training: its optimiser, inputs and dropout stream (kept apart from the others')."""

    def __init__(self, lib: str, data: Any, normalize: bool, compiled: bool, graph: tuple[Any, ...]) -> None:
        import torch_geometric.nn as pyg  # type: ignore[import-untyped]

        torch.manual_seed(0)
        self.eager = GCN(pyg.GCNConv, data.num_features, data.num_classes, normalize)
        if lib == "structconv":  # the same weights: PyG's entries, read by structconv's load_state_dict
            ours = GCN(snn.GCNConv, data.num_features, data.num_classes, normalize)
            ours.load_state_dict(self.eager.state_dict())
            self.eager = ours
        self.lib, self.data, self.graph, self.compiled = lib, data, graph, compiled
        self.fullgraph = compiled
        self.model: Callable[..., torch.Tensor] = self.eager
        groups = [{"params": self.eager.conv1.parameters(), "weight_decay": 5e-4}]
        groups.append({"params": self.eager.conv2.parameters(), "weight_decay": 0.0})
        self.optimizer = torch.optim.Adam(groups, lr=0.01)
        torch.manual_seed(0)  # the dropout stream, the same for every variant
        self.rng = torch.get_rng_state()
        self.test_acc = float("nan")

    def compile(self, fullgraph: bool, backend: str) -> None:
        self.fullgraph = fullgraph
        self.model = torch.compile(self.eager, dynamic=False, fullgraph=fullgraph, backend=backend)

    def train_step(self) -> None:
        torch.set_rng_state(self.rng)
        self.eager.train()
        self.optimizer.zero_grad()
        out = self.model(self.data.x, *self.graph)
        mask = self.data.train_mask
        torch.autograd.backward(F.cross_entropy(out[mask], self.data.y[mask]))
        self.optimizer.step()
        self.rng = torch.get_rng_state()

    @torch.no_grad()
    def evaluate(self) -> None:
        self.eager.eval()
        pred = self.model(self.data.x, *self.graph).argmax(dim=-1)
        mask = self.data.test_mask
        self.test_acc = int((pred[mask] == self.data.y[mask]).sum()) / int(mask.sum())

    def epoch(self) -> None:
        self.train_step()
        self.evaluate()


def timed(fn: Callable[[], None]) -> float:
    """Seconds of one call of ``fn``, under the floating-point setting every variant runs under."""
    return median_time(fn, repeats=1, warmup=0)


def first_epoch(run: Run, backend: str) -> dict[str, Any]:
    """The first training step (compiling the training graph) and evaluation (the eval graph), timed."""
    from torch._dynamo.utils import compilation_time_metrics, counters
    from torch._inductor.utils import fresh_cache

    note = ""
    if not run.compiled:
        return {"first_step_s": timed(run.train_step), "first_eval_s": timed(run.evaluate)}
    for fullgraph in (True, False):
        torch._dynamo.reset()
        graphs = counters["stats"]["unique_graphs"]
        compilation_time_metrics.clear()
        run.compile(fullgraph, backend)
        try:
            with fresh_cache():
                step, evaluation = timed(run.train_step), timed(run.evaluate)
        except torch._dynamo.exc.Unsupported as error:  # a graph break under fullgraph=True
            if run.lib == "structconv" or not fullgraph:
                raise
            note = f"fullgraph=True failed: {str(error).splitlines()[0]}"
            continue
        graphs = counters["stats"]["unique_graphs"] - graphs
        tracing = sum(compilation_time_metrics.get("bytecode_tracing", []))  # Dynamo's share, both graphs
        result = {"compile_s": step, "eval_compile_s": evaluation, "fullgraph": fullgraph, "graphs": graphs}
        result["dynamo_tracing_s"] = tracing
        return result | ({} if fullgraph else {"note": note})
    raise AssertionError("unreachable")


def measure(
    setup: str, data: Any, epochs: int, repeat: int, backend: str
) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """One repeat of one set-up: per-epoch medians of the four variants, and each one's first epoch."""
    from torch_geometric.nn.conv.gcn_conv import gcn_norm  # type: ignore[import-untyped]

    normalize = SETUPS[setup]
    if normalize:
        graph: tuple[Any, ...] = (data.edge_index, None)
    else:
        graph = gcn_norm(data.edge_index, None, int(data.x.shape[0]), add_self_loops=True)
    order = LIBS if repeat % 2 == 0 else LIBS[::-1]  # who compiles first alternates between repeats
    runs = {f"{lib}{tag}": Run(lib, data, normalize, not tag, graph) for tag in ("", "-eager") for lib in order}
    first = {name: first_epoch(run, backend) for name, run in runs.items()}
    warmup = min(9, max(1, (epochs - 1) // 2))  # epochs 2..10 (with the other library's recompile after reset)
    times = interleaved_times({k: r.epoch for k, r in runs.items()}, repeats=epochs - 1 - warmup, warmup=warmup)
    for name, run in runs.items():
        first[name]["test_acc"] = run.test_acc
    return times, first


def summarise(setup: str, samples: list[tuple[dict[str, float], dict[str, dict[str, Any]]]], epochs: int) -> list[Row]:
    """Medians over the repeats: a per-epoch row (peer: compiled PyG) and a compile-time row."""
    names = list(samples[0][0])
    med = {n: statistics.median(t[n] for t, _ in samples) for n in names}
    accs = {n: [f[n]["test_acc"] for _, f in samples] for n in names}
    epoch_row = Row(f"epoch {setup}", {"normalize": SETUPS[setup], "epochs": epochs}, med, "pyg", {"test_acc": accs})
    compile_times = {lib: statistics.median(f[lib]["compile_s"] for _, f in samples) for lib in LIBS}
    extra: dict[str, Any] = {
        "eval_compile_s": {lib: statistics.median(f[lib]["eval_compile_s"] for _, f in samples) for lib in LIBS},
        "dynamo_tracing_s": {lib: statistics.median(f[lib]["dynamo_tracing_s"] for _, f in samples) for lib in LIBS},
        "compile_s_all": {lib: [f[lib]["compile_s"] for _, f in samples] for lib in LIBS},
        "eager_first_step_s": {
            lib: statistics.median(f[f"{lib}-eager"]["first_step_s"] for _, f in samples) for lib in LIBS
        },
        "fullgraph": {lib: samples[-1][1][lib]["fullgraph"] for lib in LIBS},
        "graphs": {lib: samples[-1][1][lib]["graphs"] for lib in LIBS},
    }
    notes = {lib: samples[-1][1][lib]["note"] for lib in LIBS if "note" in samples[-1][1][lib]}
    if notes:
        extra["notes"] = notes
    return [epoch_row, Row(f"compile {setup}", {"normalize": SETUPS[setup]}, compile_times, "pyg", extra)]


def table(rows: list[Row], summary: dict[str, Any]) -> str:
    """One line per set-up and variant: the epoch, its ratio to compiled PyG, and the compiled ones' compile."""
    head = f"{'set-up':<10}{'variant':<17}{'ms/epoch':>9}{'ratio':>7}{'test acc':>9}"
    lines = [head + f"{'compile s':>10}{'ratio':>7}{'eval s':>7}{'Dynamo s':>9}"]
    for epoch, compiled in zip(rows[::2], rows[1::2], strict=True):
        setup = epoch.case.removeprefix("epoch ")
        for k, v in epoch.times.items():
            acc = statistics.median(epoch.extra["test_acc"][k])
            line = f"{setup:<10}{k:<17}{1e3 * v:9.2f}{epoch.ratio(k):6.2f}x{acc:9.3f}"
            if k in compiled.times:
                evals, tracing = compiled.extra["eval_compile_s"][k], compiled.extra["dynamo_tracing_s"][k]
                line += f"{compiled.times[k]:10.2f}{compiled.ratio(k):6.2f}x{evals:7.2f}{tracing:9.2f}"
            lines.append(line)
    lines.append("compile: the first training step; eval: the first evaluation (its own graph);")
    lines.append(f"Dynamo: its tracing of both; one graph each: {rows[1].extra['fullgraph']}")
    for name, goal in summary["goals"].items():
        lines.append(f"goal {name}: {goal['ratio']:.2f}x <= {goal['max']:.2f}x {'met' if goal['met'] else 'MISSED'}")
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, kind, scale, label in ((axes[0], "epoch", 1e3, "ms per epoch"), (axes[1], "compile", 1.0, "compile s")):
        chosen = [r for r in rows if r.case.startswith(kind)]
        names = list(chosen[0].times)
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(chosen))]
            ax.bar(xs, [scale * r.times[name] for r in chosen], width, label=name)
        ax.set_xticks(range(len(chosen)), [r.case.split()[1] for r in chosen])
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    axes[0].set_title("per epoch (median, interleaved)")
    axes[1].set_title("first training step, compiling")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--epochs", type=int, default=200, help="training epochs per repeat (at least 3)")
    parser.add_argument("--repeats", type=int, default=3, help="compile + train runs per set-up (medians over them)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend (eager: a quick check)")
    parser.add_argument("--out", type=Path, default=Path("docs/_static/compile"))
    add_flush_option(parser)
    args = parser.parse_args(argv)
    if args.epochs < 3 or args.repeats < 1:
        parser.error("need --epochs >= 3 and --repeats >= 1")
    torch.set_num_threads(args.threads)
    fp = fp_environment(not args.no_flush)
    data = load_planetoid(args.data, "cora")
    torch.compile(lambda t: t.sin() + 1, dynamic=False, backend=args.backend)(
        torch.ones(3)
    )  # pay Inductor's one-off start-up here
    report = Report(f"compile_graph_cpu{fp.suffix}")
    steps = [(setup, r) for setup in SETUPS for r in range(args.repeats)]
    samples: dict[str, list[Any]] = {setup: [] for setup in SETUPS}
    for i, (setup, r) in enumerate(steps, start=1):
        progress(i, len(steps), f"{setup} repeat {r + 1}")
        samples[setup].append(measure(setup, data, args.epochs, r, args.backend))
    for setup in SETUPS:
        report.rows += summarise(setup, samples[setup], args.epochs)
    epoch_ratio = max(r.ratio("structconv") for r in report.rows if r.case.startswith("epoch"))
    compile_ratio = max(r.ratio("structconv") for r in report.rows if r.case.startswith("compile"))
    report.summary = {
        "threads": args.threads,
        "flush_denormal": fp.measured,
        "epochs": args.epochs,
        "repeats": args.repeats,
        "compile": f"torch.compile(model, dynamic=False, fullgraph=True, backend={args.backend!r}), "
        "fresh Inductor cache, after torch._dynamo.reset()",
        "ratios": {r.case: r.ratio("structconv") for r in report.rows},
        "eager_ratios": {
            r.case: r.times["structconv-eager"] / r.times["pyg-eager"] for r in report.rows if "pyg-eager" in r.times
        },
        "goals": {
            "epoch (worst set-up)": {"ratio": epoch_ratio, "max": GOALS["epoch_ratio_max"]},
            "compile (worst set-up)": {"ratio": compile_ratio, "max": GOALS["compile_ratio_max"]},
        },
    }
    for goal in report.summary["goals"].values():
        goal["met"] = goal["ratio"] <= goal["max"]
    text = table(report.rows, report.summary)
    js, txt = report.write(args.out, text)
    png = args.out / f"{report.name}.png"
    plot(report.rows, png)
    print(report.text(text))
    print(f"wrote {js}, {txt} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
