"""Fig. 2 of Cordonnier et al. (2020): test accuracy against epoch, one curve per run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import new_figure, save

__all__ = ["plot_accuracy"]


def _read_metrics(run: Path) -> dict[str, Any]:
    path = Path(run) / "metrics.json"
    if not path.is_file():
        raise ValueError(f"run directory {run} has no metrics.json")
    try:
        metrics = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    ok = isinstance(metrics, dict) and isinstance(metrics.get("config"), dict) and "model" in metrics["config"]
    if not ok or not isinstance(metrics.get("history"), list):
        raise ValueError(f"{path}: not the metrics of a training run (needs config.model and history)")
    return dict(metrics)


def plot_accuracy(runs: Sequence[Path], path: Path, title: str | None = None) -> Path:
    """Test accuracy (%) against epoch for each run, as in Fig. 2 of Cordonnier et al. (2020).

    Parameters
    ----------
    runs
        Run directories, each holding the ``metrics.json`` written by
        :func:`~structconv.experiments.cifar.train.train`.
    path
        The PNG to write (parent directories are created).
    title
        The axes' title, if any.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ValueError
        If ``runs`` is empty, or a run has no (readable) ``metrics.json``; the message names it.
    """
    runs = [Path(r) for r in runs]
    if not runs:
        raise ValueError("plot_accuracy: no runs given")
    curves = []
    for run in runs:
        metrics = _read_metrics(run)
        config = metrics["config"]
        label = str(config["model"]) + (f" ({config['preset']})" if config.get("preset") else "")
        epochs = [int(row["epoch"]) for row in metrics["history"]]
        accuracy = [100.0 * float(row["test_acc"]) for row in metrics["history"]]
        curves.append((run, label, epochs, accuracy))
    labels = [c[1] for c in curves]
    from matplotlib.ticker import MaxNLocator

    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    for run, label, epochs, accuracy in curves:
        name = f"{label} [{run.name}]" if labels.count(label) > 1 else label
        ax.plot(epochs, accuracy, marker="o" if len(epochs) <= 30 else None, markersize=3, label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    if title:
        ax.set_title(title, fontsize=12)
    return save(fig, path)
