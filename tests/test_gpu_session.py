"""The prepared GPU session: its dry run on this CPU, its record, its budget, and its choices.

``bash scripts/gpu_session.sh --dry-run`` runs every step a lease runs (environment, the CUDA
tests, the eager and compiled benchmarks, compiled training, the record and its figure) at toy
sizes, so the script cannot rot between leases; the other tests pin what the steps decide.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from structconv.experiments.cifar.session import (
    TABLE1,
    Session,
    choose_run,
    junit_counts,
    missing_rows,
    slug,
)
from structconv.experiments.cifar.throughput import VARIANTS

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("STRUCTCONV_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object], float]:
    if not (DATA / "cifar10-jpeg.tar.gz").is_file():
        pytest.skip(f"needs the CIFAR-10 archive in {DATA}")
    out = tmp_path_factory.mktemp("session")
    tic = time.monotonic()
    done = subprocess.run(
        ["bash", "scripts/gpu_session.sh", "--dry-run"],
        cwd=ROOT, env={**os.environ, "OUT": str(out), "STRUCTCONV_DATA": str(DATA)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    seconds = time.monotonic() - tic
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [p for p in out.glob("*.json") if not p.name.startswith(("bench", "run-"))]
    assert len(records) == 1, sorted(p.name for p in out.iterdir())
    return out, json.loads(records[0].read_text()), seconds


def test_the_dry_run_runs_every_step_within_three_minutes(dry_run: tuple[Path, dict[str, object], float]) -> None:
    out, record, seconds = dry_run
    assert seconds <= 180, f"the dry run took {seconds:.0f} s"
    assert record["dry_run"] is True and record["format"] == "structconv-gpu-session"
    for key in ("commit", "device", "torch", "started", "finished"):
        assert record[key], key
    tests = record["cuda_tests"]
    assert isinstance(tests, dict) and tests["failed"] == 0 and tests["failures"] == []
    assert tests["passed"] + tests["skipped"] > 0  # the suite was collected and ran (here: skipped or on the CPU)
    bench = record["bench"]
    assert isinstance(bench, dict) and bench["status"] == ["ok"]
    assert set(bench["images_per_second"]) == set(VARIANTS)
    assert all(v > 0 for v in bench["images_per_second"].values())
    assert bench["gemm_tflops"] > 0 and bench["sizes"] == "smoke"
    assert set(bench["profile"]) == set(VARIANTS)  # where each step's time goes: its costliest operators
    for rows in bench["profile"].values():
        assert 0 < len(rows) <= 5 and all(ms >= 0 and 0 <= share <= 1 for _, ms, share in rows)
        assert [ms for _, ms, _ in rows] == sorted((ms for _, ms, _ in rows), reverse=True)
    compiled = record["bench_compiled"]
    assert (
        isinstance(compiled, dict)
        and compiled["status"] == ["ok"]
        and set(compiled["images_per_second"]) == {"sa-quadratic"}
    )
    assert "errors" not in record
    (run,) = record["runs"]  # type: ignore[misc]
    assert run["model"] == "resnet18" and run["preset"] == "smoke" and run["status"] == "ok"
    assert run["epochs_done"] == run["epochs_planned"] == 1 and run["complete"] and not run["partial"]
    assert len(run["test_acc"]) == 1 and run["images_per_second"] > 0
    names = {p.name for p in out.iterdir()}
    assert {"session.log", "session.png", "cuda-tests.xml", "bench.json", "bench-compiled.json"} <= names
    assert "run-resnet18-smoke.json" in names
    assert len(names) <= 8  # what the device tool brings back from $OUT


def test_collect_puts_the_record_and_runs_where_the_docs_keep_them(
    dry_run: tuple[Path, dict[str, object], float], tmp_path: Path
) -> None:
    out, record, _ = dry_run
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "gpu_session.sh", tmp_path / "scripts")

    def collect(folder: Path) -> subprocess.CompletedProcess[str]:
        command = ["bash", "scripts/gpu_session.sh", "--collect", str(folder)]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)

    refused = collect(out)  # a dry run's numbers are of toy models: never in the docs
    assert refused.returncode == 2 and "dry run" in refused.stderr
    lease = tmp_path / "lease"
    shutil.copytree(out, lease)
    (name,) = [p.name for p in lease.glob("*.json") if not p.name.startswith(("bench", "run-"))]
    as_lease = {**record, "dry_run": False}
    (lease / name).write_text(json.dumps(as_lease, indent=2))
    done = collect(lease)
    assert done.returncode == 0, done.stderr
    (saved,) = (tmp_path / "docs/_static/gpu/sessions").glob("*.json")
    assert json.loads(saved.read_text()) == as_lease
    assert saved.with_suffix(".png").is_file()
    (run,) = (tmp_path / "docs/_static/gpu/runs").glob("*.json")
    assert run.name.startswith("resnet18-smoke-") and json.loads(run.read_text())["config"]["model"] == "resnet18"
    assert collect(tmp_path / "scripts").returncode == 2  # no record there
    (lease / name).write_text(json.dumps({**as_lease, "error": "no CUDA device"}))
    failed = collect(lease)  # a session that never ran on a GPU
    assert failed.returncode == 2 and "did not run" in failed.stderr


def test_the_docs_show_a_session_record(dry_run: tuple[Path, dict[str, object], float], tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_sessions", ROOT / "docs/_ext/gpu_sessions.py")
    assert spec is not None and spec.loader is not None
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    out, record, _ = dry_run
    (found,) = [p for p in out.glob("*.json") if not p.name.startswith(("bench", "run-"))]
    path = tmp_path / found.name  # laid out as --collect lays it: the figure beside the record, same name
    shutil.copy(found, path)
    shutil.copy(out / "session.png", path.with_suffix(".png"))
    text = "\n".join(ext._lines(path, record))
    bench = record["bench"]
    assert isinstance(bench, dict) and str(record["device"]) in text
    for name, rate in bench["images_per_second"].items():
        assert f"   * - {name}\n     - {rate:,.0f}" in text
    assert "resnet18 / resnet18 torch" in text and "1 of 1 epochs (complete)" in text
    assert "CUDA tests: " in text and ".. figure:: /_static/gpu/sessions/" in text


def test_a_step_past_its_time_is_stopped_with_its_children(tmp_path: Path) -> None:
    session = Session(tmp_path, budget=60.0, dry_run=True, data=tmp_path, commit="abc")
    marker = tmp_path / "grandchild"
    (tmp_path / "grandchild.py").write_text(f"import time\ntime.sleep(5)\nopen({str(marker)!r}, 'w').close()\n")
    (tmp_path / "child.py").write_text(
        f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, {str(tmp_path / 'grandchild.py')!r}])\n"
        "time.sleep(30)\n"
    )
    tic = time.monotonic()
    step = session.run("sleeper", [sys.executable, str(tmp_path / "child.py")], seconds=1.0)
    assert step.status == "timed out" and time.monotonic() - tic < 10
    time.sleep(6)
    assert not marker.exists()  # the grandchild went with its parent
    assert session.run("quick", [sys.executable, "-c", "raise SystemExit(3)"], 10.0).code == 3
    # SIGINT first: a child that reports when interrupted (as pytest writes its XML) gets to do it
    report = tmp_path / "report"
    (tmp_path / "polite.py").write_text(
        f"import time\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    open({str(report)!r}, 'w').close()\n"
    )
    # 8 s: the interpreter must have started and installed its SIGINT handler first (3 s was not
    # always enough on a loaded CI machine).
    assert session.run("polite", [sys.executable, str(tmp_path / "polite.py")], 8.0).status == "timed out"
    assert report.exists()
    log = (tmp_path / "session.log").read_text()
    assert "sleeper: timed out" in log and "quick: failed" in log


def test_a_failing_step_is_recorded_and_the_session_goes_on(tmp_path: Path) -> None:
    session = Session(tmp_path, budget=60.0, dry_run=True, data=tmp_path, commit="abc")
    ran = []
    session.attempt("bench", lambda: json.loads("{truncated"))
    session.attempt("training", lambda: ran.append(1))
    assert ran == [1]
    record = json.loads(session.write().read_text())
    assert record["errors"] == {"bench": "JSONDecodeError: Expecting property name enclosed in double quotes: "
                                          "line 1 column 2 (char 1)"}  # fmt: skip


def test_the_record_is_rewritten_in_place_under_its_final_name(tmp_path: Path) -> None:
    session = Session(tmp_path, budget=60.0, dry_run=True, data=tmp_path, commit="abc")
    first = session.write()
    session.record["device"] = "NVIDIA H100 80GB HBM3"
    second = session.write()
    assert second.name.endswith("-nvidia-h100-80gb-hbm3.json") and not first.exists()
    assert [p.name for p in tmp_path.glob("*.json")] == [second.name]
    assert json.loads(second.read_text())["commit"] == "abc"


def test_junit_counts_pass_fail_skip_and_names_the_failures(tmp_path: Path) -> None:
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_cuda" name="test_a"/>'
        '<testcase classname="tests.test_cuda" name="test_b[x]"><failure message="boom"/></testcase>'
        '<testcase classname="tests.test_cuda" name="test_c"><skipped message="no GPU"/></testcase>'
        '<testcase classname="tests.test_cuda" name="test_d"><error message="setup"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert junit_counts(xml) == {
        "passed": 1,
        "failed": 2,
        "skipped": 1,
        "failures": ["tests.test_cuda::test_b[x]", "tests.test_cuda::test_d"],
    }


def _metrics(path: Path, model: str, preset: str, epochs: int, done: int) -> None:
    history = [{"epoch": e + 1, "test_acc": 0.5} for e in range(done)]
    path.write_text(json.dumps({"config": {"model": model, "preset": preset, "epochs": epochs}, "history": history}))


def test_missing_rows_are_those_of_table_1_without_a_complete_paper_run(tmp_path: Path) -> None:
    _metrics(tmp_path / "a.json", "resnet18", "paper", 300, 300)
    _metrics(tmp_path / "b.json", "sa-quadratic", "paper", 300, 14)  # stopped early: still missing
    _metrics(tmp_path / "c.json", "sa-learned", "fast", 40, 40)  # another preset: still missing
    (tmp_path / "d.json").write_text("not json")
    assert missing_rows(tmp_path) == ["sa-quadratic", "sa-learned", "sa-learned-content"]
    assert missing_rows(tmp_path / "nowhere") == list(TABLE1)


def test_choose_run_trains_resnet18_whole_when_it_fits_else_the_next_missing_row() -> None:
    per_run = 300 * (50_000 + 10_000 / 3)  # seconds at one image per second
    missing = ["resnet18", "sa-quadratic", "sa-learned"]
    rates = {"resnet18": per_run / 400, "sa-quadratic": per_run / 3000}
    assert choose_run(missing, rates, 500.0) == ("resnet18", True, pytest.approx(400.0))
    # ResNet18 does not fit: a partial run of it would add nothing, the next missing row runs partly
    assert choose_run(missing, rates, 300.0) == ("sa-quadratic", False, pytest.approx(3000.0))
    # ResNet18's row done: the next missing one, even where ResNet18 would fit again
    assert choose_run(missing[1:], rates, 500.0) == ("sa-quadratic", False, pytest.approx(3000.0))
    assert choose_run(["sa-learned"], rates, 500.0) == ("sa-learned", False, None)  # no rate measured
    assert choose_run([], rates, 500.0) == ("resnet18", True, pytest.approx(400.0))
    assert choose_run([], {}, 500.0) == ("resnet18", False, None)


def test_slug() -> None:
    assert slug("NVIDIA H200") == "nvidia-h200"
    assert slug("CPU (2 threads)") == "cpu-2-threads"
    assert slug("") == "device"


def _recording(session: Session, statuses: list[str]) -> list[list[str]]:
    """Replace ``session.run`` by one that records each command and answers ``statuses`` in turn."""
    from structconv.experiments.cifar.session import Step

    commands: list[list[str]] = []

    def run(name: str, command: list[str], seconds: float, env: dict[str, str] | None = None) -> Step:
        commands.append(command)
        return Step(statuses[len(commands) - 1], 1.0)

    session.run = run  # type: ignore[method-assign]
    return commands


def test_a_run_that_cannot_finish_is_not_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial run is no result (and the paper preset's first epoch runs at learning rate 0)."""
    from structconv.experiments.cifar import session as module

    monkeypatch.setattr(module, "RUNS", tmp_path / "runs")  # no complete row: every row missing
    session = Session(tmp_path, budget=400.0, dry_run=False, data=tmp_path, commit="abc")
    session.record["bench_compiled"] = {"images_per_second": {"resnet18": 1000.0, "sa-quadratic": 100.0}}
    commands = _recording(session, [])
    module._train(session, "cuda")
    assert commands == []
    (run,) = session.record["runs"]
    assert run["status"] == "not started" and run["model"] == "sa-quadratic" and run["estimate_s"] > 400


def test_compiled_pairs_that_ran_out_of_time_run_again_with_what_is_left(tmp_path: Path) -> None:
    from structconv.experiments.cifar import session as module

    session = Session(tmp_path, budget=400.0, dry_run=False, data=tmp_path, commit="abc")
    session.record["bench_compiled"] = {"status": ["timed out", "ok"], "seconds": 100.0, "images_per_second": {},
                                        "targets": []}  # fmt: skip
    commands = _recording(session, ["ok"])
    module._bench(session, "cuda", True, again=True)
    (command,) = commands
    assert command[command.index("--only") + 1] == "sa-quadratic,sa-quadratic paper-dense" and "--compile" in command
    assert session.record["bench_compiled"]["status"] == ["ok", "ok"]
