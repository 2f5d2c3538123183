"""benchmarks/bench_compile_graph.py at toy size: 3 epochs, 1 repeat, Dynamo with the eager backend.

The eager backend keeps the check fast (no Inductor C++ build) while still tracing both
libraries' models with ``fullgraph=True``; the record's fields are what is checked, not the timings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import bench_compile_graph as bcg
from benchmarks.harness import forget_environment
from structconv.backend.subnormals import set_subnormal_flush, thread_flushes

pytestmark = pytest.mark.skipif(not (bcg.DATA / "ind.cora.x").exists(), reason="Cora's Planetoid files are absent")


def test_toy_run_writes_a_complete_record(tmp_path: Path) -> None:
    args = ["--epochs", "3", "--repeats", "1", "--backend", "eager", "--out", str(tmp_path)]
    threads, flushing = torch.get_num_threads(), thread_flushes()
    try:
        assert bcg.main(args) == 0
    finally:  # main sets both for the process: give the other tests theirs back
        torch.set_num_threads(threads)
        set_subnormal_flush(flushing)
        forget_environment()
        torch._dynamo.reset()
    record = json.loads((tmp_path / "compile_graph_cpu.json").read_text())
    first, second = (tmp_path / "compile_graph_cpu.txt").read_text().splitlines()[:2]
    assert first.startswith("subnormals flushed for every variant") and second.startswith("set-up    variant")
    assert max(map(len, (tmp_path / "compile_graph_cpu.txt").read_text().splitlines()[1:])) <= 88  # the docs' box
    assert (tmp_path / "compile_graph_cpu.png").stat().st_size > 0
    summary = record["summary"]
    assert summary["threads"] == record["environment"]["threads"] == 1
    assert summary["flush_denormal"] is True and summary["epochs"] == 3 and summary["repeats"] == 1
    env = record["environment"]  # every timed call (compiles and epochs, both libraries) ran flushed
    assert env["flush_denormal"] is True and env["changed_by"] == []
    assert env["timed_calls"]["unflushed"] == 0 and env["timed_calls"]["flushed"] > 0
    assert set(summary["goals"]) == {"epoch (worst set-up)", "compile (worst set-up)"}
    assert all(isinstance(goal["met"], bool) for goal in summary["goals"].values())
    rows = {row["case"]: row for row in record["rows"]}
    assert set(rows) == {f"{kind} {setup}" for kind in ("epoch", "compile") for setup in bcg.SETUPS}
    for setup in bcg.SETUPS:
        epoch, compiled = rows[f"epoch {setup}"], rows[f"compile {setup}"]
        assert set(epoch["times"]) == {"structconv", "pyg", "structconv-eager", "pyg-eager"}
        assert all(t > 0 for t in epoch["times"].values())
        accs = epoch["extra"]["test_acc"]
        assert all(0.0 <= a[0] <= 1.0 for a in accs.values())
        assert accs["structconv-eager"] == accs["pyg-eager"]  # same weights, same dropout stream
        assert set(compiled["times"]) == {"structconv", "pyg"} and all(t > 0 for t in compiled["times"].values())
        assert compiled["extra"]["fullgraph"]["structconv"] is True  # one graph, or main raises
        assert compiled["extra"]["graphs"]["structconv"] == 2  # the training graph and the eval graph
        assert summary["ratios"][f"epoch {setup}"] == pytest.approx(
            epoch["times"]["structconv"] / epoch["times"]["pyg"]
        )
