r"""One GPU lease turned into a record: the CUDA tests, the training throughput, and training.

``bash scripts/gpu_session.sh`` runs this module as the device tool's command; ``--dry-run`` runs
the same steps on a CPU at toy sizes (a test runs it in CI, so the script cannot rot between
leases).  Within a time budget (``--budget`` seconds, 540 by default: a lease's command may run
10 minutes), it

1. records the environment: device, driver, torch, CUDA, Python, the commit;
2. measures the compiled training step (``structconv cifar bench --compile``:
   :class:`~.train.CompiledStep`, CUDA graphs) of the four variants the targets compare, first,
   so that their compilation has its whole share of the lease;
3. runs the CUDA tests (``pytest -m cuda tests/test_cuda.py``) and counts passed, failed and
   skipped tests, with the failures' ids;
4. measures every variant's eager training step; both benchmarks' figures are checked against
   :data:`~.throughput.GOALS`;
5. trains with the time that is left, when a whole run fits it: ResNet18's ``paper`` preset for
   all 300 epochs when the measured rate makes them fit (else the first model of Table 1 whose
   row is missing, if its run fits); a run that cannot finish is not started (it would be no
   result, and the ``paper`` preset's first epoch runs at learning rate 0), unless ``--model``
   names one;
6. gives what is left to the compiled benchmark's pairs that ran out of time, again (the
   compiler's caches on disk, filled by the first try, make the second shorter);
7. writes the record, ``<UTC date and time>-<device>.json``, after every step (a session cut
   short still leaves one), with the raw outputs beside it (the log, the tests' JUnit XML, the
   benchmarks' JSON, each run's metrics and a figure).

Every step runs as a child process with a deadline taken from the budget; one that overruns is
stopped (with its process group: compiler workers included) and recorded as such, and the next
steps go on with what is left.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ...data.atomic import atomic_write

__all__ = ["TABLE1", "Session", "choose_run", "junit_counts", "main", "missing_rows", "slug"]

FORMAT = "structconv-gpu-session"
VERSION = 1
#: The models of the paper's Table 1, in its order: a lease trains the first whose row is missing.
TABLE1 = ("resnet18", "sa-quadratic", "sa-learned", "sa-learned-content")
#: The variants the compiled benchmark measures: those the throughput targets compare.
COMPILED_VARIANTS = ("sa-quadratic", "sa-quadratic paper-dense", "resnet18", "resnet18 torch")
#: Seconds kept at the end of the budget for the record and the figure.
RESERVE = 20.0
#: The most each step may take of a real lease (seconds); the dry run scales them down.  The
#: tests' cap holds the whole CUDA suite (docs/_static/gpu/sessions/*-cuda-tests.log), which
#: is worth more to a lease than the training run it leaves too little time to start.
CAPS = {"tests": 260.0, "bench": 120.0, "bench_compiled": 180.0}
#: A run needs at least this long to be worth starting: data, compilation, CUDA graphs, epochs.
MIN_TRAINING = 120.0
#: Seconds a step past its time has between ``SIGINT`` and ``SIGKILL``.
GRACE = 15.0
ROOT = Path(__file__).resolve().parents[3]
#: Where ``scripts/gpu_session.sh --collect`` files the sessions' runs (their ``metrics.json``).
RUNS = ROOT / "docs" / "_static" / "gpu" / "runs"


def slug(device: str) -> str:
    """A file-name form of a device name: ``"NVIDIA H100 80GB HBM3"`` gives ``"nvidia-h100-80gb-hbm3"``."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"


def junit_counts(path: Path) -> dict[str, Any]:
    """Passed, failed (failures and errors), skipped and the failing tests' ids of a JUnit XML report."""
    root = ET.parse(path).getroot()
    cases = root.iter("testcase")
    counts: dict[str, Any] = {"passed": 0, "failed": 0, "skipped": 0, "failures": []}
    for case in cases:
        if not case.get("name"):  # what an interrupted run leaves for the test it stopped in
            continue
        outcome = {child.tag for child in case}
        ident = f"{case.get('classname', '')}::{case.get('name', '')}"
        if outcome & {"failure", "error"}:
            counts["failed"] += 1
            counts["failures"].append(ident)
        elif "skipped" in outcome:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def missing_rows(runs: Path) -> list[str]:
    """The models of :data:`TABLE1` with no complete ``paper`` run among the metrics files in ``runs``."""
    done = set()
    for path in sorted(runs.glob("*.json")):
        try:
            meta = json.loads(path.read_text())
            config, history = meta["config"], meta["history"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if config.get("preset") == "paper" and history and history[-1]["epoch"] >= config["epochs"]:
            done.add(config["model"])
    return [m for m in TABLE1 if m not in done]


def choose_run(
    missing: Sequence[str], images_per_second: dict[str, float], seconds: float, epochs: int = 300
) -> tuple[str, bool, float | None]:
    """Which model to train in ``seconds``, whether its ``epochs`` fit, and the estimated seconds they take.

    ResNet18, when its row is missing and its whole run fits the measured rate (training images
    and a test pass each epoch, the test pass at a third of a training image's cost); otherwise
    the first missing row of Table 1 after ResNet18's, whose run the session starts only if it fits
    too (a partial run is no result).  With no other row missing, ResNet18.
    """

    def estimate(model: str) -> float | None:
        rate = images_per_second.get(model)
        return epochs * (50_000 + 10_000 / 3) / rate if rate else None

    whole = estimate("resnet18")
    if "resnet18" in missing and whole is not None and whole <= seconds:
        return "resnet18", True, whole
    model = next((m for m in missing if m != "resnet18"), "resnet18")
    full = estimate(model)
    return model, full is not None and full <= seconds, full


@dataclass
class Step:
    """How one child process ended: ``status`` is ``"ok"``, ``"failed"`` (with ``code``) or ``"timed out"``."""

    status: str
    seconds: float
    code: int | None = None


class Session:
    """The state of one session: its deadline, output folder, log and record."""

    def __init__(self, out: Path, budget: float, dry_run: bool, data: Path, commit: str) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + budget
        self.out, self.dry_run, self.data = out, dry_run, data
        self.work = Path(tempfile.mkdtemp(prefix="structconv-session-"))
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_path = out / "session.log"
        self.python = sys.executable
        started = datetime.now(UTC)
        self.record: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "commit": commit,
            "started": started.isoformat(timespec="seconds"),
            "dry_run": dry_run,
            "budget_s": budget,
        }
        self.stamp = started.strftime("%Y-%m-%dT%H%MZ")
        self.record_path: Path | None = None

    def left(self) -> float:
        """Seconds of the budget left, less what the record needs."""
        return self.deadline - time.monotonic() - RESERVE

    def say(self, text: str) -> None:
        """A line to the terminal (the device tool returns its tail) and to the log."""
        print(text, flush=True)
        with self.log_path.open("a") as log:
            log.write(text + "\n")

    def run(self, name: str, command: list[str], seconds: float, env: dict[str, str] | None = None) -> Step:
        """Run ``command`` with its output in the log; stop it and its children within ``seconds``.

        A step past its time gets ``SIGINT`` first (pytest then writes its report of the tests
        done so far) and :data:`GRACE` seconds to end, then ``SIGKILL``, with every process of its
        group (the compiler's workers too).
        """
        self.say(f"== {name}: {' '.join(command)} (at most {seconds:.0f} s)")
        grace = min(GRACE, seconds / 3)
        tic = time.monotonic()
        with self.log_path.open("a") as log:
            child = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                start_new_session=True, cwd=ROOT, preexec_fn=_interruptible,
            )  # fmt: skip
            try:
                code: int | None = child.wait(timeout=max(seconds - grace, 0.1))
            except subprocess.TimeoutExpired:
                _signal_group(child.pid, signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=grace)
                code = None
            _signal_group(child.pid, signal.SIGKILL)  # whatever it left behind
            child.wait()
        seconds_taken = time.monotonic() - tic
        step = (
            Step("timed out", seconds_taken)
            if code is None
            else Step("ok" if code == 0 else "failed", seconds_taken, code)
        )
        self.say(f"== {name}: {step.status} after {step.seconds:.0f} s" + (f" (exit {step.code})" if step.code else ""))
        return step

    def write(self) -> Path:
        """Write the record (atomically) under its final name; called after every step."""
        self.record["elapsed_s"] = round(time.monotonic() - self.start, 1)
        path = self.out / f"{self.stamp}-{slug(self.record.get('device', 'device'))}.json"
        with atomic_write(path, "w") as f:
            f.write(json.dumps(self.record, indent=2) + "\n")
        if self.record_path is not None and self.record_path != path:
            self.record_path.unlink(missing_ok=True)
        self.record_path = path
        return path

    def attempt(self, name: str, step: Callable[[], object]) -> None:
        """Run one step of the session; an error in it is recorded and the session goes on."""
        try:
            step()
        except Exception as err:  # the next steps and the record matter more than this one
            self.record.setdefault("errors", {})[name] = f"{type(err).__name__}: {err}"
            self.say(f"{name}: {type(err).__name__}: {err}")
        self.write()


def _interruptible() -> None:
    """In a step's process before it starts: ``SIGINT`` at its default and unblocked.

    A child inherits an ignored or blocked ``SIGINT`` from its parent (a test runner, a
    compiler's pool), and a Python started with it ignored never raises ``KeyboardInterrupt``:
    the step would then be killed without writing its report.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group has ended
        os.killpg(pid, sig)


def environment(commit: str) -> dict[str, Any]:
    """Device, driver, torch, CUDA and Python of this machine."""
    import torch

    from .train import device_label

    cuda = torch.cuda.is_available()
    env: dict[str, Any] = {
        "device": device_label("cuda" if cuda else "cpu"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.machine(),
        "commit": commit,
    }
    if cuda:
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {
            "multiprocessors": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}",
        }
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            line = subprocess.run(
                [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=True,
            ).stdout.strip().splitlines()[0]  # fmt: skip
            env["driver"] = line.split(",")[1].strip()
            env["nvidia_smi"] = line
        except (subprocess.SubprocessError, IndexError, OSError) as err:
            env["nvidia_smi"] = f"unavailable: {err}"
    return env


def _tests(s: Session, test_device: str) -> None:
    xml = s.out / "cuda-tests.xml"
    seconds = min(CAPS["tests"] * (0.6 if s.dry_run else 1.0), s.left() * (0.4 if s.dry_run else 0.5))
    command = [s.python, "-m", "pytest", "-m", "cuda", "tests/test_cuda.py", "-q", "-p", "no:cacheprovider",
               f"--junitxml={xml}", "-o", "addopts=-ra"]  # fmt: skip
    step = s.run("CUDA tests", command, seconds, {"STRUCTCONV_TEST_DEVICE": test_device})
    result: dict[str, Any] = {"device": test_device, "status": step.status, "seconds": round(step.seconds, 1)}
    if xml.is_file():
        result.update(junit_counts(xml))
    s.record["cuda_tests"] = result
    s.say(
        f"CUDA tests: {result.get('passed', 0)} passed, {result.get('failed', 0)} failed, "
        f"{result.get('skipped', 0)} skipped ({step.status})"
    )


def _groups(s: Session, compiled: bool) -> list[tuple[str, ...]]:
    """The benchmark's children: every variant in one (eager), or one per compared pair (compiled)."""
    if s.dry_run:
        return [("sa-quadratic",)] if compiled else [()]  # compiling more: minutes here
    return [COMPILED_VARIANTS[:2], COMPILED_VARIANTS[2:]] if compiled else [()]


def _bench(s: Session, device: str, compiled: bool, again: bool = False) -> None:
    """``structconv cifar bench``: every variant eagerly, or the compared pairs compiled, one child each.

    Each pair of the compiled benchmark (a model and the peer its target compares it with) is its
    own child process, so that a pair whose compilation outlasts its share loses only itself.
    ``again``: only the compiled pairs that ran out of time, with all the time that is left.
    """
    key = "bench_compiled" if compiled else "bench"
    if s.dry_run:
        common = ["--batch", "4", "--steps", "1", "--rounds", "1", "--sizes", "smoke", "--profile", "5"]
    else:
        common = ["--batch", "100", "--steps", "10" if compiled else "5", "--rounds", "3", "--profile", "12"]
    groups = _groups(s, compiled)
    entry: dict[str, Any] = {"status": [], "seconds": 0.0, "images_per_second": {}, "targets": []}
    entry = s.record.get(key, entry) if again else entry
    chosen = [i for i, status in enumerate(entry["status"]) if status == "timed out"] if again else range(len(groups))
    share = s.left() - 10.0 if again else min(CAPS[key] * (0.5 if s.dry_run else 1.0), s.left() * 0.5)
    for n, i in enumerate(chosen):
        only = groups[i]
        out = s.work / f"{key}-{i}"
        command = [s.python, "-m", "structconv", "cifar", "bench", "--device", device, "--out", str(out), *common]
        command += ["--only", ",".join(only)] if only else []
        command += ["--compile"] if compiled else []
        name = f"benchmark ({'compiled' if compiled else 'eager'}{', ' + ', '.join(only) if only else ''})"
        step = s.run(name + (", again" if again else ""), command, share / (len(chosen) - n))
        share -= step.seconds
        if again:
            entry["status"][i] = step.status
        else:
            entry["status"].append(step.status)
        entry["seconds"] = round(entry["seconds"] + step.seconds, 1)
        found = sorted(out.glob("cifar_throughput_*.json"))
        if found:
            _merge(entry, found[0], s.out / f"{key.replace('_', '-')}{'-' + str(i) if len(groups) > 1 else ''}.json")
            for t in entry["targets"][-2:]:
                s.say(f"{t['name']}: {t['value']:,.2f} against {t['goal']:,.2f}: {'met' if t['met'] else 'missed'}")
    s.record[key] = entry


def _merge(entry: dict[str, Any], found: Path, keep: Path) -> None:
    """Add one benchmark's JSON (``structconv cifar bench --out``) to the record's ``entry``; keep a copy."""
    from .throughput import Throughput, targets

    shutil.copyfile(found, keep)
    raw = json.loads(found.read_text())
    raw["gemm_shape"] = tuple(raw["gemm_shape"]) if raw.get("gemm_shape") else None
    result = Throughput(**raw)
    entry["images_per_second"].update({k: round(v, 1) for k, v in result.images_per_second.items()})
    entry.setdefault("flops_per_image", {}).update(result.flops_per_image)
    entry.setdefault("utilisation", {}).update({k: round(v, 4) for k, v in result.utilisation.items()})
    if result.gemm_source == "sa-quadratic" or "gemm_tflops" not in entry:  # the yardstick of the targets
        entry.update(gemm_tflops=result.gemm_tflops, gemm=result.yardstick())
    entry.update(batch=result.batch, precision=result.precision, sizes=result.sizes)
    entry.setdefault("profile", {}).update(result.profile)  # where each step's time goes
    entry["targets"] += [{"name": t.name, "value": t.value, "goal": t.goal, "met": t.met} for t in targets(result)]


def _train(s: Session, device: str, chosen: str | None = None) -> None:
    from .presets import config_for

    seconds = s.left()
    if seconds < (20.0 if s.dry_run else MIN_TRAINING):
        s.record["runs"] = []
        s.say(f"training: not started, {seconds:.0f} s left")
        return
    rates: dict[str, float] = {}
    for key in ("bench", "bench_compiled"):  # the faster of the two measurements of each model
        for name, value in s.record.get(key, {}).get("images_per_second", {}).items():
            rates[name] = max(rates.get(name, 0.0), value)
    preset = "smoke" if s.dry_run else "paper"
    missing = missing_rows(RUNS)
    epochs = config_for(preset, "resnet18").epochs
    model, fits, estimate = choose_run(missing, rates, seconds - 30.0, epochs)
    if s.dry_run:  # the rates are of toy models; the choice is the GPU's most likely one
        model, fits, estimate = "resnet18", True, None
    if chosen is not None:
        model, fits, estimate = chosen, False, None
    elif not fits:  # a run that cannot finish is no result; the time goes to the benchmark instead
        why = f"would take about {estimate / 60:.0f} min at the measured rate" if estimate else "have no measured rate"
        s.say(f"training: not started; all {epochs} epochs of {model} {why}")
        s.record["runs"] = [
            {"model": model, "preset": preset, "status": "not started", "missing_rows": missing,
             "estimate_s": None if estimate is None else round(estimate, 1)}
        ]  # fmt: skip
        return
    s.say(
        f"training {model} ({preset}): "
        + (f"all {epochs} epochs fit" if fits else "a partial run")
        + (f"; all {epochs} would take about {estimate / 60:.0f} min at the measured rate" if estimate else "")
    )
    runs = s.work / "runs"
    limit = max(seconds - 45.0, 10.0)  # data, start-up and the last epoch's end within the budget
    command = [
        s.python, "-m", "structconv", "cifar", "train", "--model", model, "--preset", preset,
        "--device", device, "--compile", "--no-progress", "--restart", "--time-limit", f"{limit:.0f}",
        "--out", str(runs), "--data", str(s.data),
    ]  # fmt: skip
    step = s.run("training", command, seconds)
    run: dict[str, Any] = {
        "model": model, "preset": preset, "status": step.status, "seconds": round(step.seconds, 1),
        "estimate_s": None if estimate is None else round(estimate, 1), "missing_rows": missing,
    }  # fmt: skip
    metrics = runs / f"{model}-{preset}" / "metrics.json"
    if metrics.is_file():
        meta = json.loads(metrics.read_text())
        history, planned = meta["history"], meta["config"]["epochs"]
        done = history[-1]["epoch"] if history else 0
        shutil.copyfile(metrics, s.out / f"run-{model}-{preset}.json")
        rates_seen = [row["train_images_per_second"] for row in history[1:]] or [
            row["train_images_per_second"] for row in history
        ]
        run.update(
            epochs_done=done,
            epochs_planned=planned,
            complete=done >= planned,
            partial=done < planned,
            test_acc=[row["test_acc"] for row in history],
            images_per_second=statistics.median(rates_seen) if rates_seen else None,
        )
        last = f", test accuracy {history[-1]['test_acc']:.4f}" if history else ""
        s.say(f"training: {done} of {planned} epochs{last}")
    s.record["runs"] = [run]


def _figure(s: Session) -> None:
    try:
        from .figures.session import session_figure

        session_figure(s.record, s.out / "session.png")
    except Exception as err:  # a figure must never cost the record
        s.say(f"figure: not drawn ({type(err).__name__}: {err})")


def _commit(given: str | None) -> str:
    if given:
        return given
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=ROOT, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run a session (see the module docstring); the exit status is 1 if a CUDA test failed, else 0."""
    p = argparse.ArgumentParser(prog="gpu_session", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--out", required=True, type=Path, help="where the record and raw outputs go ($OUT)")
    p.add_argument("--budget", type=float, default=None, help="seconds for the whole session (540; dry run 170)")
    p.add_argument("--dry-run", action="store_true", help="the same steps on a CPU at toy sizes")
    p.add_argument("--data", type=Path, default=None, help="the CIFAR-10 archive's folder")
    p.add_argument("--commit", default=None, help="the commit the tree is (default: git rev-parse HEAD)")
    p.add_argument(
        "--test-device", default=None, help="STRUCTCONV_TEST_DEVICE for the CUDA tests (default: cuda; dry run: cpu)"
    )
    p.add_argument(
        "--skip",
        default="",
        help="comma-separated steps to leave out: tests, bench (e.g. both, to spend a lease on training)",
    )
    p.add_argument("--model", default=None, choices=TABLE1, help="the model to train (default: chosen, see above)")
    args = p.parse_args(argv)
    skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    if skip - {"tests", "bench"}:
        p.error(f"--skip: unknown steps {sorted(skip - {'tests', 'bench'})}; expected tests, bench")
    budget = args.budget if args.budget is not None else (170.0 if args.dry_run else 540.0)
    data = args.data or Path(os.environ.get("STRUCTCONV_DATA", ROOT.parent / "shared" / "data"))
    s = Session(args.out, budget, args.dry_run, data.resolve(), _commit(args.commit))
    env = environment(s.record["commit"])
    s.record.update(env)
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and "gpu" not in env:
        s.say("no CUDA device here: on a CPU, run the session with --dry-run")
        s.record["error"] = "no CUDA device"
        s.write()
        return 2
    s.say(f"session {s.stamp} on {env['device']} (torch {env['torch']}, CUDA {env['cuda']}), budget {budget:.0f} s")
    s.write()
    enough = 30.0 if args.dry_run else 90.0
    if "bench" not in skip:  # the compiled pairs first: compiling is the step most likely to run out of time
        s.attempt("bench_compiled", functools.partial(_bench, s, device, True))
    if "tests" not in skip:
        s.attempt("cuda_tests", lambda: _tests(s, args.test_device or device))
    if "bench" not in skip and s.left() > enough:
        s.attempt("bench", functools.partial(_bench, s, device, False))
    s.attempt("training", lambda: _train(s, device, args.model))
    if "bench" not in skip and s.left() > enough:
        s.attempt("bench_compiled", functools.partial(_bench, s, device, True, again=True))
    s.record["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    _figure(s)
    path = s.write()
    s.say(f"record: {path}")
    shutil.rmtree(s.work, ignore_errors=True)
    return 1 if s.record.get("cuda_tests", {}).get("failed") else 0


if __name__ == "__main__":
    raise SystemExit(main())
