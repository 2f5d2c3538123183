"""benchmarks/bench_positional_scaling.py runs end to end on tiny grids and writes what it promises.

Width 16 keeps every call short.  Flex (tens of seconds of compiling per grid) and NATTEN (found only in some
environments) are skipped by ``--skip``, and a memory budget of 0.15 GB lets the dense peers run
at 8x8 while skipping some of them at 36x36 by their estimate: both paths of a peer are covered.
Every variant is timed with subnormals flushed (tests/test_bench_environment.py has the harness's
checks), and the record and the table say so.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks import bench_positional_scaling as bs
from benchmarks.harness import forget_environment
from structconv.backend.subnormals import set_subnormal_flush, thread_flushes

SIDES, WIDTH, HEADS = (8, 36), 16, 9


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prefix = tmp_path_factory.mktemp("scaling") / "scaling"
    argv = ["--sides", *map(str, SIDES), "--width", str(WIDTH), "--heads", str(HEADS), "--repeats", "1"]
    argv += ["--skip", "flex", "natten", "--memory-budget-gb", "0.15", "--out", str(prefix), "--no-progress"]
    before = thread_flushes()
    try:
        assert bs.main(argv) == 0
    finally:  # main sets the process's floating-point environment: give the other tests theirs back
        set_subnormal_flush(before)
        forget_environment()
    return prefix


def test_every_variant_mode_and_side_is_measured_or_skipped_with_a_reason(written: Path) -> None:
    payload = json.loads(written.with_suffix(".json").read_text())
    rows = {(r["variant"], r["mode"], r["side"]): r for r in payload["rows"]}
    assert set(rows) == {(v, m, s) for v in bs.VARIANTS for m in bs.MODES for s in SIDES}
    for key, r in rows.items():
        assert r["tokens"] == r["side"] ** 2
        if r["skipped"]:
            assert r["median_s"] is None and r["times"] == [], key
            continue
        assert r["median_s"] > 0 and len(r["times"]) == 1 and all(t > 0 for t in r["times"]), key
        assert r["ratio_to_conv"] > 0 and r["peak_mb"] is not None and r["peak_mb"] >= 0, key
    for side in SIDES:
        for mode in bs.MODES:
            assert rows["structconv", mode, side]["order"], (mode, side)
            assert rows[bs.CONV, mode, side]["ratio_to_conv"] == 1.0
    assert rows["flex", "inference", 8]["skipped"] == "skipped (--skip)"
    assert rows["paper dense", "inference", 8]["skipped"] is None  # fits: run, and checked against structconv
    assert rows["paper dense", "inference", 8]["error_vs_structconv"] < 1e-4
    assert "needs" in rows["sdpa", "training", 36]["skipped"]  # estimated above the budget: not run


def test_header_builds_derived_and_figure(written: Path) -> None:
    payload = json.loads(written.with_suffix(".json").read_text())
    header = payload["header"]
    assert {"torch", "threads", "date", "command"} <= set(header)
    if header["flush_denormal_supported"]:  # every variant timed flushed, warm-ups included, and said so
        assert header["flush_denormal"] is True and header["subnormals"] == "flushed" and header["changed_by"] == []
        assert header["timed_calls"]["unflushed"] == 0 and header["timed_calls"]["flushed"] > 0
        assert written.with_suffix(".txt").read_text().startswith("subnormals flushed for every variant")
    assert header["width"] == WIDTH and header["heads"] == HEADS
    assert "--out" in header["command"]
    assert [b["side"] for b in payload["builds"]] == list(SIDES)
    assert all(b["seconds"] > 0 for b in payload["builds"])
    assert payload["derived"]["done_when"]["side"] == max(SIDES)
    assert written.with_suffix(".png").stat().st_size > 0
    assert "done when" in written.with_suffix(".txt").read_text()


def test_a_dense_peer_is_skipped_by_its_estimate_before_it_runs() -> None:
    settings = bs.Settings(
        width=400, heads=9, repeats=1, memory_budget_gb=6.0, time_budget_s=60.0, skip=[], peers={}, unavailable={},
        in_process_peak=True,
    )  # fmt: skip
    reason, need = bs.why_not("paper dense", 128, "inference", settings, bs.History())
    assert reason is not None and "needs" in reason and need > 6.0
    assert bs.why_not("paper dense", 32, "inference", settings, bs.History())[0] is None
    slow = bs.History(last={("sdpa", "inference"): (32 * 32, 1.0)})  # 1 s at 32x32 is ~16 s at 64x64
    assert bs.why_not("sdpa", 64, "inference", settings, slow)[0] is None
    strict = dataclasses.replace(settings, time_budget_s=10.0)
    assert "extrapolated" in str(bs.why_not("sdpa", 64, "inference", strict, slow)[0])


def test_peak_in_a_subprocess_where_the_peak_cannot_be_reset() -> None:
    child = ["--peak-child", "structconv", "training", "8", "--width", str(WIDTH), "--heads", str(HEADS)]
    peak = bs.peak_in_subprocess(child)
    assert peak is not None and peak >= 0
