"""Training checkpoints: written atomically, read without running code, checked against the run.

A checkpoint is a plain dictionary of tensors, numbers, strings, lists and dictionaries, so
``torch.load(..., weights_only=True)`` reads it: a file from elsewhere can hold no code to run.
It is first written to a temporary file in the same directory, flushed to disk and then renamed
over the previous one (``os.replace`` is atomic on POSIX), so a process killed at any moment
leaves either the previous checkpoint or the new one, never a partial file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...data.atomic import atomic_write

__all__ = ["FORMAT", "VERSION", "CheckpointError", "load_checkpoint", "save_checkpoint"]

FORMAT = "structconv-cifar-checkpoint"
VERSION = 1
#: Settings that may differ between a checkpoint and the run resuming it (they do not change the trajectory).
RESUMABLE_CHANGES = frozenset({"preset"})


class CheckpointError(ValueError):
    """A checkpoint that cannot be used for this run (wrong format, version, model or settings)."""


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (with the format and version added) to ``path`` atomically."""
    path = Path(path)
    payload = {"format": FORMAT, "version": VERSION, **state}
    with atomic_write(path, sync=True) as f:
        torch.save(payload, f)


def load_checkpoint(path: Path, expect: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; check its format, version and run settings.

    ``expect`` is the run's configuration (``TrainConfig.as_dict()``); every key must match the
    checkpoint's, except those that only say how far and how fast to run (see
    :data:`RESUMABLE_CHANGES`).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    CheckpointError
        If the file is not a readable structconv checkpoint, is of another version, or was
        written for another model or other settings (the message lists the differences).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated or foreign files
        raise CheckpointError(
            f"{path}: not a readable checkpoint (truncated, corrupt, or not weights-only): {err}"
        ) from err
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a structconv CIFAR checkpoint (format {FORMAT!r} expected)")
    if state.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {state.get('version')!r} is not supported (this structconv writes {VERSION})"
        )
    if expect is not None:
        saved = state.get("config", {})
        if saved.get("model") != expect.get("model"):
            raise CheckpointError(
                f"{path}: checkpoint is of model {saved.get('model')!r}, but this run trains {expect.get('model')!r}"
            )
        diff = {
            k: (saved.get(k), expect.get(k))
            for k in sorted(set(saved) | set(expect))
            if k not in RESUMABLE_CHANGES and saved.get(k) != expect.get(k)
        }
        if diff:
            listed = "; ".join(f"{k}: checkpoint {a!r}, run {b!r}" for k, (a, b) in diff.items())
            raise CheckpointError(f"{path}: checkpoint was written with other settings ({listed}); use another --out")
    return state
