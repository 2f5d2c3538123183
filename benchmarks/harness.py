"""A small benchmark harness: medians of repeated runs, ratios to a peer, JSON + table output.

Timings on shared machines are noisy, so every figure is a median over ``repeats`` runs and
every claim is a ratio to a peer measured in the same run.

Every variant runs in one floating-point environment.  On a CPU, subnormal numbers (a softmax's
tails) slow every later product that reads them about tenfold unless the threads flush them to
zero, which is the first thing an expert sets there; so a benchmark sets it once with
:func:`fp_environment` (flushed by default, ``--no-flush`` for the figures without it), and
:func:`interleaved_times` and :func:`median_time` hold it before every timed call: a variant
that changes it (a peer's set-up code) is named in a warning and cannot time another variant
under a different setting.  :meth:`Report.environment` records the setting, whether the CPU
supports it, and under which setting every timed call ran.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from structconv.backend.subnormals import all_threads_flush, set_subnormal_flush, thread_flushes


def sync(device: str) -> None:
    """Wait for queued GPU work so that wall-clock time covers it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# The floating-point environment
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FloatEnvironment:
    """The floating-point environment a benchmark runs every variant in (see :func:`fp_environment`).

    ``flush`` is what was asked, ``supported`` whether the CPU can flush (``torch.set_flush_denormal``'s
    answer) and ``measured`` what every thread did just after (``None``: some threads only).
    """

    flush: bool
    supported: bool
    measured: bool | None

    @property
    def label(self) -> str:
        """``"flushed"``, ``"unflushed"`` or ``"partly flushed"`` (some threads): what every thread did when set."""
        return {True: "flushed", False: "unflushed", None: "partly flushed"}[self.measured]

    @property
    def suffix(self) -> str:
        """Appended to a record's name: ``""`` flushed, else ``"_unflushed"`` or ``"_partly_flushed"``."""
        return "" if self.measured else "_" + self.label.replace(" ", "_")

    def sentence(self, label: str | None = None) -> str:
        """The line a table states it in, e.g. ``subnormals flushed for every variant (...)``.

        ``label`` is what the timed calls ran under (:func:`timed_label`), else :attr:`label`.
        """
        label = label or self.label
        if label == "mixed":
            return f"subnormals flushed in {_LEDGER['flushed']} timed calls and not in {_LEDGER['unflushed']}"
        if label == "partly flushed":
            return "subnormals flushed on some threads only (the CPU's threads could not all be set)"
        said = f"subnormals {label} for every variant (set_flush_denormal({self.flush}) asked on every thread)"
        if self.flush and not self.supported:
            said += "; this CPU cannot flush them (torch.set_flush_denormal returned False)"
        return said


_ENVIRONMENT: list[FloatEnvironment] = []  # the one fp_environment set last in this process
_LEDGER: dict[str, Any] = {"flushed": 0, "unflushed": 0, "changed_by": []}


def fp_environment(flush: bool = True) -> FloatEnvironment:
    """Set the floating-point environment every variant of this process's benchmark runs in.

    ``torch.set_flush_denormal(flush)`` on the calling thread and on every thread of torch's
    CPU operations (:func:`structconv.backend.subnormals.set_subnormal_flush`: torch alone
    sets only the calling thread), then measured.  :func:`interleaved_times` and
    :func:`median_time` hold it from here on, and the counts of timed calls under each setting
    (:meth:`Report.environment`) start again.

    Parameters
    ----------
    flush : bool
        Flush subnormal numbers to zero (the default, as an expert sets a CPU up) or keep them
        (``--no-flush``: the figures a user gets without it).

    Returns
    -------
    FloatEnvironment
        What was set, whether the CPU supports it, and what every thread does now.
    """
    supported = set_subnormal_flush(flush)
    env = FloatEnvironment(flush, supported, all_threads_flush())
    _ENVIRONMENT[:] = [env]
    _LEDGER.update(flushed=0, unflushed=0, changed_by=[])
    return env


def forget_environment() -> None:
    """Forget what :func:`fp_environment` set (for tests): timing holds the calling thread's setting again."""
    _ENVIRONMENT.clear()
    _LEDGER.update(flushed=0, unflushed=0, changed_by=[])


def current_environment() -> FloatEnvironment:
    """The environment :func:`fp_environment` set, or, if it was not called, the one measured now."""
    if _ENVIRONMENT:
        return _ENVIRONMENT[0]
    here = thread_flushes()
    return FloatEnvironment(here, bool(torch.set_flush_denormal(here)), all_threads_flush())


def timed_label() -> str:
    """What the timed calls since :func:`fp_environment` ran under: ``"flushed"``, ``"unflushed"`` or ``"mixed"``.

    From the counts of timed calls, each counted under what every thread did when the setting
    was last set (at a hold's start, and after a variant changed the calling thread's setting:
    a variant that changes only the workers' goes unseen); with none timed yet, the
    environment's own :attr:`FloatEnvironment.label`.
    """
    flushed, unflushed = _LEDGER["flushed"], _LEDGER["unflushed"]
    if flushed and unflushed:
        return "mixed"
    if flushed or unflushed:
        return "flushed" if flushed else "unflushed"
    return current_environment().label


class _Hold:
    """Holds one setting across timed calls: restores it before a call if anything changed it, counts the calls."""

    def __init__(self, flush: bool | None) -> None:
        chosen = _ENVIRONMENT[0].measured if _ENVIRONMENT else None
        self.flush = flush if flush is not None else (chosen if chosen is not None else thread_flushes())
        self._set()  # every thread, once: the state at entry may be the main thread's alone
        self.flush = thread_flushes()  # a CPU that cannot flush keeps them whatever was asked

    def _set(self) -> None:
        """Set the held setting on every thread and measure it there (a product per thread: once per set)."""
        set_subnormal_flush(self.flush)
        self.every = all_threads_flush()  # None (some threads only) counts as unflushed

    def before(self) -> None:
        """Just before a timed call: the setting is the held one, counted under what every thread does."""
        if thread_flushes() != self.flush:
            self._set()
        _LEDGER["flushed" if self.every else "unflushed"] += 1

    def after(self, name: str) -> None:
        """Just after ``name``'s call: if it changed the setting, say so and put it back."""
        if thread_flushes() != self.flush:
            self._set()
            if name not in _LEDGER["changed_by"]:
                _LEDGER["changed_by"].append(name)
                warnings.warn(
                    f"{name!r} changed torch.set_flush_denormal; set back to {self.flush} before every timed call",
                    RuntimeWarning,
                    stacklevel=3,
                )


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def median_time(
    fn: Callable[[], Any], repeats: int = 5, warmup: int = 1, device: str = "cpu", flush: bool | None = None
) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs.

    Every run is under one floating-point setting: ``flush``, else the one :func:`fp_environment`
    set, else the calling thread's at entry (held as :func:`interleaved_times` holds it).
    """
    hold = _Hold(flush)
    for _ in range(warmup):
        hold.before()
        fn()
        hold.after("the timed function")
    sync(device)
    times = []
    for _ in range(repeats):
        hold.before()
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
        hold.after("the timed function")
    return statistics.median(times)


def interleaved_times(
    variants: dict[str, Callable[[], Any]],
    repeats: int = 21,
    warmup: int = 3,
    device: str = "cpu",
    flush: bool | None = None,
) -> dict[str, float]:
    """Median seconds of each variant, timed round-robin so that drifts in machine load hit all alike.

    The order of the variants is reversed every other round: whichever runs second would
    otherwise always find the caches the first one left.  Every call, warm-ups included, runs
    under one floating-point setting (``flush``, else the one :func:`fp_environment` set, else
    the calling thread's at entry): it is checked before each call and set back after a call
    that changed it, with a warning naming that variant.
    """
    hold = _Hold(flush)
    for name, fn in variants.items():
        for _ in range(warmup):
            hold.before()
            fn()
            hold.after(name)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    forward = list(variants.items())
    for round_ in range(repeats):
        for name, fn in forward if round_ % 2 == 0 else forward[::-1]:
            sync(device)
            hold.before()
            start = time.perf_counter()
            fn()
            sync(device)
            samples[name].append(time.perf_counter() - start)
            hold.after(name)
    return {name: statistics.median(ts) for name, ts in samples.items()}


@dataclass
class Row:
    """One measured case: the median time of each variant, and the peer they are compared to."""

    case: str
    params: dict[str, Any]
    times: dict[str, float]
    peer: str
    extra: dict[str, Any] = field(default_factory=dict)

    def ratio(self, variant: str) -> float:
        """Time of ``variant`` divided by the peer's time."""
        return self.times[variant] / self.times[self.peer]


@dataclass
class Report:
    """A benchmark's rows plus the environment they were measured in."""

    name: str
    rows: list[Row] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def environment(self) -> dict[str, Any]:
        """Python, platform, torch, threads, the GPU, and the floating-point environment.

        ``flush_denormal`` is what every thread does now (``None``: some threads only),
        ``flush_denormal_supported`` whether the CPU can flush, ``subnormals`` the label
        (``"flushed"`` or ``"unflushed"``), ``timed_calls`` how many timed calls (warm-ups
        included) ran under each setting since :func:`fp_environment`, and ``changed_by`` the
        variants that changed it (each time set back before the next call).
        """
        env: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
        env["torch"] = torch.__version__
        env["threads"] = torch.get_num_threads()
        env["cuda"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        fp = current_environment()
        env |= {"flush_denormal": all_threads_flush(), "flush_denormal_supported": fp.supported}
        env |= {"subnormals": timed_label(), "timed_calls": {k: _LEDGER[k] for k in ("flushed", "unflushed")}}
        env["changed_by"] = list(_LEDGER["changed_by"])
        return env

    def text(self, table: str) -> str:
        """The table as printed and written: the floating-point environment's sentence first."""
        return f"{current_environment().sentence(timed_label())}\n{table}"

    def write(self, directory: Path, table: str) -> tuple[Path, Path]:
        """Write ``<name>.json`` (machine-readable) and ``<name>.txt`` (:meth:`text` of the table)."""
        directory.mkdir(parents=True, exist_ok=True)
        js, txt = directory / f"{self.name}.json", directory / f"{self.name}.txt"
        payload = {"name": self.name, "environment": self.environment(), "summary": self.summary}
        payload["rows"] = [asdict(r) for r in self.rows]
        js.write_text(json.dumps(payload, indent=2))
        txt.write_text(self.text(table) + "\n")
        return js, txt


def publish(report: Report, directory: Path, table: str, plot: Callable[[list[Row], Path], None]) -> None:
    """Write the report's JSON, table and PNG into ``directory`` and print the table."""
    js, txt = report.write(directory, table)
    png = directory / f"{report.name}.png"
    plot(report.rows, png)
    print(report.text(table))
    print(f"wrote {js}, {txt} and {png}")


def add_flush_option(parser: Any) -> None:
    """``--no-flush`` on a benchmark's command line (see :func:`fp_environment`)."""
    parser.add_argument(
        "--no-flush",
        action="store_true",
        help="keep subnormal numbers for every variant (default: flushed to zero on every thread, as an expert "
        "sets a CPU up); the record is labelled and named 'unflushed'",
    )


def progress(i: int, total: int, label: str) -> None:
    """A one-line progress indicator on stderr."""
    print(f"\r[{i}/{total}] {label:<60}", end="" if i < total else "\n", file=sys.stderr, flush=True)
