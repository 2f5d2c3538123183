"""Every benchmark times every variant in one floating-point environment: subnormals flushed, or not.

On a CPU a softmax's subnormal tails slow every later product about tenfold unless the threads
flush them to zero.  structconv's own softmax flushes them; a peer would run unflushed unless the
benchmark sets ``torch.set_flush_denormal(True)`` for it too, which an expert user of the peer
does first.  torch has no getter for the setting, so these tests measure it: the smallest
float32 subnormal times 2 is 0 on a thread that flushes, and on every thread of torch's CPU
operations when a product large enough to be split across all of them comes out 0.

Checked here: that the measurement sees the setting; that torch's own call leaves the worker
threads as they were (which is why the harness sets every thread); that
:func:`benchmarks.harness.interleaved_times` and :func:`~benchmarks.harness.median_time` run
every variant under one setting even when a variant flips it; and that every CPU benchmark,
run at a tiny size, records and states that every variant was timed flushed (or, with
``--no-flush``, unflushed).  bench_positional_scaling and bench_compile_graph are smoke-tested
in their own files with the same checks.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import harness
from structconv.backend.subnormals import all_threads_flush, set_subnormal_flush, thread_flushes
from structconv.experiments.cifar.presets import config_for
from structconv.experiments.cifar.throughput import measure

Seen = dict[str, set[tuple[bool, bool | None]]]  # variant -> (this thread flushes, every thread flushes) seen
CORA = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid" / "ind.cora.x"


def _can_flush() -> bool:
    return bool(torch.set_flush_denormal(thread_flushes()))  # the same setting again: torch says if it has one


needs_flush = pytest.mark.skipif(not _can_flush(), reason="this CPU cannot flush subnormals")
needs_cora = pytest.mark.skipif(not CORA.exists(), reason="Cora's Planetoid files are absent")


@pytest.fixture(autouse=True)
def _restored() -> Iterator[None]:
    """Each test leaves the process's threads and floating-point setting as it found them."""
    threads, before = torch.get_num_threads(), thread_flushes()
    yield
    torch.set_num_threads(threads)
    set_subnormal_flush(before)
    harness.forget_environment()


# --- measuring the setting ------------------------------------------------------------------------
@needs_flush
def test_the_setting_is_seen_on_the_calling_thread_and_on_every_thread() -> None:
    set_subnormal_flush(True)
    assert thread_flushes() and all_threads_flush() is True
    assert float((torch.tensor([1e-40], dtype=torch.float32) * 1).item()) == 0.0
    set_subnormal_flush(False)
    assert not thread_flushes() and all_threads_flush() is False
    assert float((torch.tensor([1e-40], dtype=torch.float32) * 1).item()) != 0.0


@needs_flush
@pytest.mark.skipif("OpenMP" not in torch.__config__.parallel_info(), reason="torch's threads are not OpenMP's")
def test_torch_alone_sets_the_calling_thread_only_so_the_harness_sets_every_thread() -> None:
    torch.set_num_threads(2)
    set_subnormal_flush(False)  # and the worker threads now exist
    torch.set_flush_denormal(True)
    assert thread_flushes() and all_threads_flush() is None  # half of every product unflushed
    set_subnormal_flush(True)
    assert all_threads_flush() is True


# --- the harness holds one setting for every variant ----------------------------------------------
def _recording(seen: Seen, name: str, flip: bool | None = None) -> Callable[[], None]:
    """A variant that records the setting it runs under (this thread, every thread), then maybe sets another."""

    def run() -> None:
        seen.setdefault(name, set()).add((thread_flushes(), all_threads_flush()))
        if flip is not None:
            torch.set_flush_denormal(flip)  # a peer's code changing it, as torch lets it: this thread only

    return run


@needs_flush
@pytest.mark.parametrize("flush", [True, False])
def test_every_variant_runs_under_the_set_environment_when_one_flips_it(flush: bool) -> None:
    torch.set_num_threads(2)
    env = harness.fp_environment(flush)
    assert (env.flush, env.supported, env.measured) == (flush, True, flush)
    torch.set_flush_denormal(not flush)  # a peer's set-up between the setting and the timing
    seen: Seen = {}
    variants = {"structconv": _recording(seen, "structconv"), "peer": _recording(seen, "peer", flip=not flush)}
    variants["other"] = _recording(seen, "other")
    with pytest.warns(RuntimeWarning, match="'peer' changed torch.set_flush_denormal"):
        times = harness.interleaved_times(variants, repeats=3, warmup=1)
    assert set(times) == set(variants)
    assert seen == {name: {(flush, flush)} for name in variants}
    calls = harness.Report("x").environment()
    assert calls["timed_calls"] == {"flushed": 12 if flush else 0, "unflushed": 0 if flush else 12}
    assert calls["changed_by"] == ["peer"]


@needs_flush
def test_median_time_holds_it_too_and_an_explicit_setting_wins() -> None:
    torch.set_num_threads(2)
    harness.fp_environment(True)
    seen: Seen = {}
    with pytest.warns(RuntimeWarning, match="changed torch.set_flush_denormal"):
        harness.median_time(_recording(seen, "flipper", flip=False), repeats=3, warmup=1)
    assert seen == {"flipper": {(True, True)}}
    seen.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing changes it here
        harness.interleaved_times({"a": _recording(seen, "a"), "b": _recording(seen, "b")}, repeats=2, flush=False)
    assert seen == {"a": {(False, False)}, "b": {(False, False)}}


def test_without_a_set_environment_the_callers_setting_at_entry_is_held_on_every_thread() -> None:
    torch.set_num_threads(2)
    state = thread_flushes()
    seen: Seen = {}
    harness.interleaved_times({"a": _recording(seen, "a"), "b": _recording(seen, "b")}, repeats=2, warmup=0)
    assert seen == {"a": {(state, state)}, "b": {(state, state)}}


def test_the_records_name_and_sentence_say_which_environment() -> None:
    flushed = harness.FloatEnvironment(True, True, True)
    assert (flushed.label, flushed.suffix) == ("flushed", "")
    assert flushed.sentence().startswith("subnormals flushed for every variant")
    kept = harness.FloatEnvironment(False, True, False)
    assert (kept.label, kept.suffix) == ("unflushed", "_unflushed")
    assert kept.sentence().startswith("subnormals unflushed for every variant")
    cannot = harness.FloatEnvironment(True, False, False)
    assert cannot.suffix == "_unflushed" and "this CPU cannot flush them" in cannot.sentence()
    assert harness.FloatEnvironment(True, True, None).label == "partly flushed"


# --- every CPU benchmark at a tiny size -----------------------------------------------------------
def _bench_cifar(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    from benchmarks import bench_cifar

    sizes = {name: config_for("smoke", name).model_options for name in ("sa-quadratic", "resnet18")}
    small = functools.partial(measure, sa_options=sizes["sa-quadratic"], resnet_options=sizes["resnet18"])
    monkeypatch.setattr(bench_cifar, "measure", small)
    return bench_cifar.main(argv)


#: module, its arguments at a tiny size, the record's name, and what it needs
SMOKE: dict[str, tuple[list[str], str, list[pytest.MarkDecorator]]] = {
    "bench_positional": (
        ["--sides", "4", "--batch", "1", "--repeats", "1", "--encodings", "quadratic", "--skip", "flex", "natten"]
        + ["--no-dropout", "--no-memory"],
        "positional_cpu",
        [],
    ),
    "bench_attention": (["--scale", "0.01", "--repeats", "1", "--only", "T=256"], "attention_cpu", []),
    "bench_grid": (["--batch", "1", "--repeats", "1", "--only", "16x16x128 k3"], "grid_cpu", []),
    "bench_orders": (["--configs", "2", "--repeats", "1"], "orders_cpu", []),
    "bench_overhead": (["--repeats", "1", "--calls", "1"], "overhead_cpu", [needs_cora]),
    "bench_graph": (["--only", "GCN", "--skip-scaling", "--repeats", "1"], "graph_cpu_gcn", [needs_cora]),
    "bench_cifar": (["--batch", "2", "--rounds", "1"], "cifar_cpu", []),
    "bench_gaussian_forms": (["--sides", "4", "--width", "8", "--repeats", "1"], "gaussian_forms_cpu", []),
}


def _run(module: str, argv: list[str], out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    argv = [*argv, "--out", str(out)]
    if module == "bench_cifar":
        status = _bench_cifar(argv, monkeypatch)
    else:
        status = importlib.import_module(f"benchmarks.{module}").main(argv)
    assert status in (0, None)


@needs_flush
@pytest.mark.parametrize(
    "module", [pytest.param(m, marks=SMOKE[m][2]) for m in SMOKE], ids=list(SMOKE)
)  # fmt: skip
def test_a_benchmark_times_every_variant_flushed_and_says_so(
    module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, name, _ = SMOKE[module]
    _run(module, argv, tmp_path, monkeypatch)
    record = json.loads((tmp_path / f"{name}.json").read_text())
    env = record["environment"]
    assert env["flush_denormal"] is True and env["flush_denormal_supported"] is True
    assert env["subnormals"] == "flushed" and env["changed_by"] == []
    if module == "bench_cifar":  # timed by structconv.experiments.cifar.throughput.measure, which holds it itself
        assert record["summary"]["flush_denormal"] is True
    else:  # every timed call, warm-ups included, ran flushed
        assert env["timed_calls"]["unflushed"] == 0 and env["timed_calls"]["flushed"] > 0
    text = (tmp_path / f"{name}.txt").read_text()
    assert text.startswith("subnormals flushed for every variant")


@needs_flush
def test_no_flush_times_every_variant_unflushed_in_a_record_named_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, name, _ = SMOKE["bench_grid"]
    _run("bench_grid", [*argv, "--no-flush"], tmp_path, monkeypatch)
    assert not (tmp_path / f"{name}.json").exists()
    env = json.loads((tmp_path / f"{name}_unflushed.json").read_text())["environment"]
    assert env["flush_denormal"] is False and env["subnormals"] == "unflushed"
    assert env["timed_calls"]["flushed"] == 0 and env["timed_calls"]["unflushed"] > 0
    assert (tmp_path / f"{name}_unflushed.txt").read_text().startswith("subnormals unflushed for every variant")
