"""The host benchmark's exact measures, held in CI: a step's operators and Python calls, and one compilation.

``benchmarks/bench_host.py`` records them with times beside (``docs/_static/host``); the counts
are exact, so the targets on them are laws here; the times stay in the benchmark.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks import bench_host


@pytest.fixture(scope="module")
def counts() -> dict[str, dict[str, int]]:
    return bench_host.counts()  # the subnormal setting changes no count: the process's is left as it is


@pytest.mark.parametrize("model", list(bench_host.PAIRS))
def test_a_training_step_dispatches_and_calls_no_more_than_its_targets(
    counts: dict[str, dict[str, int]], model: str
) -> None:
    measured = bench_host.ratios(counts)[model]
    held = bench_host.verdicts({model: measured})[model]
    assert held, f"no count target for {model}"
    missed = {k: round(measured[k], 3) for k, ok in held.items() if not ok}
    assert not missed, f"{model} / {bench_host.PAIRS[model]}: {missed} against {bench_host.TARGETS[model]}"


@pytest.mark.parametrize("name", ["sa-quadratic", "resnet18"])
def test_an_evaluation_pass_of_another_batch_recompiles_nothing(name: str) -> None:
    """The compiled step, an eager evaluation of other batch sizes, the step again: one graph (dropout on)."""
    torch._dynamo.reset()
    options = {"dropout": 0.1, "attention_dropout": 0.1} if name.startswith("sa") else {}
    model = bench_host.build(name, "smoke", options)
    result = bench_host.compiled(name, model=model, backend="eager")
    assert result["entries"] == 1, result
