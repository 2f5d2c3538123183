"""A GPU session's record as a figure: training throughput against the targets, and the run's accuracy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import new_figure, save

__all__ = ["session_figure"]


def session_figure(record: dict[str, Any], path: Path) -> Path:
    """Draw a session record (:mod:`~structconv.experiments.cifar.session`) as a PNG.

    Left: every measured variant's training images per second, eager and compiled, with the
    images-per-second targets as vertical lines.  Right: the test accuracy of each run against its
    epoch, labelled with the epochs done of those planned (a partial run is marked so).

    Parameters
    ----------
    record
        The session record (its ``bench``, ``bench_compiled`` and ``runs`` entries, where present).
    path
        The PNG to write.

    Returns
    -------
    Path
        ``path``.
    """
    fig = new_figure(11.0, 4.2)
    speed, curve = fig.subplots(1, 2, width_ratios=(3, 2))
    keys = ("bench", "bench_compiled")
    measured = [(key, record[key]) for key in keys if record.get(key, {}).get("images_per_second")]
    names = list(dict.fromkeys(n for _, entry in measured for n in entry["images_per_second"]))
    height = 0.8 / max(len(measured), 1)
    for i, (key, entry) in enumerate(measured):
        ips = entry["images_per_second"]
        rows = [j for j, n in enumerate(names) if n in ips]
        speed.barh(
            [j + i * height for j in rows], [ips[names[j]] for j in rows], height=height,
            label="compiled" if key == "bench_compiled" else "eager",
        )  # fmt: skip
    goals = {t["name"]: t["goal"] for _, entry in measured for t in entry.get("targets", [])}
    for name, goal in goals.items():
        if name.endswith("images/s"):
            speed.axvline(goal, color="0.4", linestyle=":", linewidth=1)
            speed.annotate(f"target {name}", (goal, len(names) - 0.5), rotation=90, fontsize=7, va="top", ha="right")
    speed.set_yticks([j + height * (len(measured) - 1) / 2 for j in range(len(names))], names)
    speed.invert_yaxis()
    speed.set_xlabel("training images per second")
    batch = next((entry.get("batch") for _, entry in measured), None)
    speed.set_title(f"{record.get('device', '?')}, batch {batch}" if batch else "no throughput measured")
    if measured:
        speed.legend(loc="lower right", fontsize=8)
    runs = [r for r in record.get("runs", []) if r.get("test_acc")]
    for run in runs:
        acc = [100 * a for a in run["test_acc"]]
        state = "partial" if run.get("partial") else "complete"
        label = f"{run['model']} {run['preset']}: {run['epochs_done']}/{run['epochs_planned']} epochs ({state})"
        curve.plot(range(1, len(acc) + 1), acc, marker="o" if len(acc) < 30 else None, label=label)
    curve.set_xlabel("epoch")
    curve.set_ylabel("test accuracy (%)")
    curve.set_title("training in the session" if runs else "no training epoch finished")
    if runs:
        curve.legend(fontsize=8)
    kind = "dry run of a GPU session (toy sizes on a CPU)" if record.get("dry_run") else "GPU session"
    fig.suptitle(f"{kind} {record.get('started', '')} (commit {str(record.get('commit', '?'))[:10]})")
    return save(fig, path)
