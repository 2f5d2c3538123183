"""benchmarks/pyg_examples.py swaps structconv's layers into an unchanged script and parses its output.

The "example" here is a tiny synthetic script written to ``tmp_path`` (no PyG code is kept in
this repository): it imports ``GCNConv`` the way PyG's examples do, checks its arguments, seed and data
directory (``../data/Planetoid`` as PyG's examples expect) and prints fake accuracy lines.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import pyg_examples as pe

LAYERS = ["GCNConv", "GATConv"]
SCRIPT = """
import os.path as osp, random, sys
import torch
from torch_geometric.nn import GCNConv
assert osp.isdir(osp.join(osp.dirname(osp.realpath(__file__)), "..", "data", "Planetoid", "Cora", "raw"))
assert sys.argv[1:] == ["--flag"] and torch.initial_seed() == 3 and random.random() == random.Random(3).random()
print("layer:", type(GCNConv(3, 4)).__module__)
print("Epoch: 001, Loss: 1.0000, Train: 0.5000, Val: 0.4000, Test: 0.1000")
print("Epoch: 002, Loss: 0.9000, Train: 0.6000, Val: 0.5000, Test: 0.8123")
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(14):  # one optimizer step an epoch, as PyG's full-batch scripts
    optimizer.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
print("Median time per epoch: 0.0042s")
"""


def test_swap_run_and_parse(tmp_path: Path) -> None:
    example, data = tmp_path / "fake.py", tmp_path / "raw"
    example.write_text(SCRIPT)
    data.mkdir()
    (data / "ind.cora.x").write_bytes(b"")
    script = pe.stage(example, data, tmp_path / "tree")
    assert script == tmp_path / "tree" / "examples" / "fake.py"
    assert (tmp_path / "tree" / "data" / "Planetoid" / "Cora" / "raw" / "ind.cora.x").is_file()
    assert (tmp_path / "tree" / "data" / "Cora" / "Cora" / "raw" / "ind.cora.x").is_file()
    (tmp_path / "examples" / "jit").mkdir(parents=True)
    sub = tmp_path / "examples" / "jit" / "fake.py"  # PyG's jit/ scripts read data/ beside them
    sub.write_text(SCRIPT)
    assert pe.stage(sub, data, tmp_path / "t2") == tmp_path / "t2" / "examples" / "jit" / "fake.py"
    assert (tmp_path / "t2" / "examples" / "jit" / "data" / "Planetoid" / "Cora" / "raw" / "ind.cora.x").is_file()
    assert (tmp_path / "t2" / "data" / "Planetoid" / "Cora" / "raw" / "ind.cora.x").is_file()

    with ThreadPoolExecutor(2) as pool:  # both subprocesses at once: their time is mostly imports
        jobs = {swap: pool.submit(pe.run_once, script, 3, LAYERS, swap, ["--flag"], 120, 1) for swap in (False, True)}
    runs = {swap: job.result() for swap, job in jobs.items()}
    for swap, run in runs.items():
        assert run["ok"], run.get("error")
        assert run["metric"] == 0.8123 and run["script_epoch_s"] == 0.0042 and run["threads"] >= 1
        assert 0 < run["epoch_s"] < run["first_s"] + 1 and run["first_s"] > 0
        assert run["bound"] == {"GCNConv": "structconv.nn.gcn" if swap else "torch_geometric.nn.conv.gcn_conv"}
    assert pe.swapped_in([runs[True]]) == ["GCNConv"] and pe.swapped_in([runs[False]]) == []

    summary = pe.summarize([runs[True], {**runs[True], "metric": 0.8323}])
    assert summary["n"] == 2 and summary["failed"] == 0
    assert abs(summary["metric_mean"] - 82.23) < 1e-9
    pair = pe.paired([runs[False], runs[False]], [runs[True], {**runs[True], "metric": 0.8023}])
    assert [round(d, 9) for d in pair["diff_points"]] == [0.0, -1.0] and abs(pair["max_abs_diff_points"] - 1) < 1e-9
    assert pair["epoch_ratios"][0] == runs[True]["epoch_s"] / runs[False]["epoch_s"]


def test_the_metric_is_the_last_test_number_else_accuracy_or_auc(tmp_path: Path) -> None:
    lines = {
        "print('Epoch: 1, Test: 0.70')\nprint('Test: 0.88')\nprint('Val AUC: 0.91, Train Accuracy: 0.99')": 0.88,
        "print('Epoch: 001, AUC: 0.8000, AP: 0.8100')\nprint('Epoch: 002, AUC: 0.9067, AP: 0.9100')": 0.9067,
        "print('Accuracy: 0.8250')": 0.825,
        "print('Loss: 0.5')": None,
    }
    for i, (code, metric) in enumerate(lines.items()):
        script = tmp_path / f"m{i}.py"
        script.write_text(code + "\n")
        assert pe.run_once(script, 0, [], False, [], 120, threads=1)["metric"] == metric, code


def test_names_and_epoch_times() -> None:
    assert pe.relative(Path("/x/examples/compile/gcn.py")) == Path("compile/gcn.py")
    assert pe.relative(Path("/tmp/gcn.py")) == Path("gcn.py")
    assert pe.stem(Path("/x/examples/autoencoder.py"), ["--variational"]) == "autoencoder_variational"
    assert pe.stem(Path("/x/examples/compile/gcn.py"), []) == "compile_gcn"
    steps = [1.0, 3.0, *(3.0 + 0.5 * i for i in range(1, 20))]
    assert pe.epoch_times(steps) == (0.5, 3.0)
    assert pe.epoch_times([2.0]) == (None, None)


def test_failure_is_reported(tmp_path: Path) -> None:
    example = tmp_path / "examples" / "broken.py"
    example.parent.mkdir()
    example.write_text("print('Test: 0.5', flush=True)\nraise ValueError('boom')\n")
    run = pe.run_once(example, 0, [], False, [], 120, threads=1)
    assert not run["ok"] and run["metric"] == 0.5
    assert "ValueError: boom" in run["error"] and "Traceback" in run["error"]
    assert pe.summarize([run])["n"] == 0
