"""A small benchmark harness: medians of repeated runs, ratios to a peer, JSON + table output.

Timings on shared machines are noisy, so every figure is a median over ``repeats`` runs and
every claim is a ratio to a peer measured in the same run.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def sync(device: str) -> None:
    """Wait for queued GPU work so that wall-clock time covers it."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def median_time(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1, device: str = "cpu") -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_times(
    variants: dict[str, Callable[[], Any]], repeats: int = 21, warmup: int = 3, device: str = "cpu"
) -> dict[str, float]:
    """Median seconds of each variant, timed round-robin so that drifts in machine load hit all alike.

    The order of the variants is reversed every other round: whichever runs second would
    otherwise always find the caches the first one left.
    """
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    forward = list(variants.items())
    for round_ in range(repeats):
        for name, fn in forward if round_ % 2 == 0 else forward[::-1]:
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            samples[name].append(time.perf_counter() - start)
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
        env: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
        try:
            import torch

            env["torch"] = torch.__version__
            env["threads"] = torch.get_num_threads()
            env["cuda"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        except ImportError:  # pragma: no cover - torch is a dependency
            pass
        return env

    def write(self, directory: Path, table: str) -> tuple[Path, Path]:
        """Write ``<name>.json`` (machine-readable) and ``<name>.txt`` (the table)."""
        directory.mkdir(parents=True, exist_ok=True)
        js, txt = directory / f"{self.name}.json", directory / f"{self.name}.txt"
        payload = {"name": self.name, "environment": self.environment(), "summary": self.summary}
        payload["rows"] = [asdict(r) for r in self.rows]
        js.write_text(json.dumps(payload, indent=2))
        txt.write_text(table + "\n")
        return js, txt


def publish(report: Report, directory: Path, table: str, plot: Callable[[list[Row], Path], None]) -> None:
    """Write the report's JSON, table and PNG into ``directory`` and print the table."""
    js, txt = report.write(directory, table)
    png = directory / f"{report.name}.png"
    plot(report.rows, png)
    print(table)
    print(f"wrote {js}, {txt} and {png}")


def progress(i: int, total: int, label: str) -> None:
    """A one-line progress indicator on stderr."""
    print(f"\r[{i}/{total}] {label:<60}", end="" if i < total else "\n", file=sys.stderr, flush=True)
