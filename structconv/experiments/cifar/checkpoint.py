"""Training checkpoints: written atomically, read without running code, checked against the run.

A checkpoint is a plain dictionary of tensors, numbers, strings, lists and dictionaries, so
``torch.load(..., weights_only=True)`` reads it: a file from elsewhere can hold no code to run.
It is first written to a temporary file in the same directory, flushed to disk and then renamed
over the previous one (``os.replace`` is atomic on POSIX), so a process killed at any moment
leaves either the previous checkpoint or the new one, never a partial file.

No size stated in a checkpoint is trusted.  Its zip records must lie within the file as stored
(``torch.save`` never compresses them) before ``torch.load`` allocates for them; its ``config``
may ask for no model size beyond :data:`MAX_MODEL_SIZES` and no more than :data:`MAX_TOKENS` tokens
(building an attention model builds its relative-position tables on the host, even on ``meta``), and
the model it describes is built on
the ``meta`` device (shapes only, no memory) and must have exactly the parameters the checkpoint
holds, all before any model is built for real.
"""

from __future__ import annotations

import inspect
import zipfile
from pathlib import Path
from typing import Any

import torch

from ...data.atomic import atomic_write
from .models import SelfAttentionNet, build_model
from .presets import TrainConfig

__all__ = [
    "FORMAT",
    "MAX_MODEL_SIZES",
    "MAX_TOKENS",
    "VERSION",
    "CheckpointError",
    "load_checkpoint",
    "save_checkpoint",
]

FORMAT = "structconv-cifar-checkpoint"
VERSION = 1
#: Settings that may differ between a checkpoint and the run resuming it (they do not change the trajectory).
RESUMABLE_CHANGES = frozenset({"preset"})
#: The largest value of each size option of a model a checkpoint's config may ask for: ten times the
#: paper's models (width 400, depth 6, 9 heads, feed-forward 512; ResNet width 64) and more, far below
#: sizes whose parameters could not be held in memory.  Combinations are bounded by the parameters the
#: checkpoint holds.
MAX_MODEL_SIZES = {
    "width": 4096,
    "depth": 64,
    "heads": 64,
    "ffn": 16384,
    "head_dim": 4096,
    "key_dim": 4096,
    "positional_dim": 16384,
    "classes": 1000,
    "channels": 16,
    "image": 256,
    "block": 16,
}
#: The most tokens, ``(image // block) ** 2``, a checkpoint's config may ask for: sixteen times the paper's 256
#: (32x32 images in 2x2 blocks).  Building an attention model builds its relative-position tables with NumPy,
#: ``40 * tokens**2`` bytes (0.7 GB here), even on the ``meta`` device.
MAX_TOKENS = 4096
_REQUIRED = ("epoch", "history", "config", "model")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used for this run (wrong format, version, model or settings)."""


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (with the format and version added) to ``path`` atomically."""
    path = Path(path)
    payload = {"format": FORMAT, "version": VERSION, **state}
    with atomic_write(path, sync=True) as f:
        torch.save(payload, f)


def load_checkpoint(path: Path, expect: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; check its format, version, contents and run settings.

    ``expect`` is the run's configuration (``TrainConfig.as_dict()``); every key must match the
    checkpoint's, except those that only say how far and how fast to run (see
    :data:`RESUMABLE_CHANGES`).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    CheckpointError
        If the file is not a readable structconv checkpoint, is of another version, lacks
        ``epoch``, ``history``, ``config`` or ``model`` or holds a malformed one, asks for a model
        beyond :data:`MAX_MODEL_SIZES` or other than its parameters, or was written for another
        model or other settings (the message names the file and the field).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    _check_records(path)
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
    _check_contents(path, state)
    if expect is not None:
        saved = state["config"]
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


def _check_records(path: Path) -> None:
    """Refuse a zip whose records state sizes the file does not hold, before ``torch.load`` allocates them."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise CheckpointError(
            f"{path}: not a readable checkpoint (truncated, corrupt, or not written by torch.save): {err}"
        ) from err
    for record in records:
        stored = record.compress_type == zipfile.ZIP_STORED and record.file_size == record.compress_size
        if not stored or record.header_offset + record.compress_size > size:
            raise CheckpointError(
                f"{path}: record {record.filename} states {record.file_size:,} bytes, but the {size:,}-byte file "
                "does not hold them as stored (torch.save writes every record uncompressed); refused before reading"
            )


def _check_contents(path: Path, state: dict[str, Any]) -> None:
    """The fields a run reads: the finished epochs, one history row each, a valid config, its model's parameters."""
    missing = [key for key in _REQUIRED if key not in state]
    if missing:
        raise CheckpointError(f"{path}: the checkpoint has no {', '.join(map(repr, missing))}; expected {_REQUIRED}")
    epoch, history = state["epoch"], state["history"]
    if type(epoch) is not int or epoch < 0:
        raise CheckpointError(f"{path}: 'epoch' is {epoch!r:.60}; expected the number of finished epochs (an int >= 0)")
    if not isinstance(history, list) or len(history) != epoch:
        what = f"a list of {len(history)} rows" if isinstance(history, list) else type(history).__name__
        raise CheckpointError(f"{path}: 'history' is {what}; expected a list of one row per finished epoch ({epoch})")
    for number, row in enumerate(history, start=1):
        if not isinstance(row, dict) or not all(isinstance(k, str) for k in row) or row.get("epoch") != number:
            raise CheckpointError(
                f"{path}: 'history' row {number} is {row!r:.80}; expected a dict of metrics with 'epoch': {number}"
            )
    config = _config(path, state["config"])
    state["model"] = _check_model(path, config, state["model"])


def _config(path: Path, saved: object) -> TrainConfig:
    if not isinstance(saved, dict) or not isinstance(saved.get("model_options", {}), dict):
        raise CheckpointError(f"{path}: 'config' is {saved!r:.80}; expected a dict of training settings")
    options = saved.get("model_options", {})
    for key, largest in MAX_MODEL_SIZES.items():
        value = options.get(key)
        if value is not None and (type(value) is not int or not 1 <= value <= largest):
            raise CheckpointError(
                f"{path}: config model_options {key}={value!r:.40} is implausible; expected an integer from 1 to "
                f"{largest:,} (refused before building the model)"
            )
    _check_tokens(path, options)
    try:
        return TrainConfig.from_dict(dict(saved))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: 'config' is not a valid training configuration: {err}") from err


def _check_tokens(path: Path, options: dict[str, Any]) -> None:
    """Refuse a token grid whose relative-position tables the host would build before the model is checked."""
    defaults = inspect.signature(SelfAttentionNet).parameters
    image = options.get("image", defaults["image"].default)
    block = options.get("block", defaults["block"].default)
    tokens = (image // block) ** 2
    if tokens > MAX_TOKENS:
        raise CheckpointError(
            f"{path}: config model_options image={image} and block={block} make {tokens:,} tokens, more than "
            f"{MAX_TOKENS:,} (the paper's models have 256); the model's relative-position tables alone would take "
            f"{40 * tokens**2 / 2**30:.3g} GiB (refused before building the model)"
        )


def _check_model(path: Path, config: TrainConfig, model: object) -> dict[str, torch.Tensor]:
    """The checkpoint's parameters against those of the model its config asks for, built on ``meta``.

    Returns them as the checkpoint holds them, once their names and shapes are the model's.
    """
    if not isinstance(model, dict) or not all(isinstance(v, torch.Tensor) for v in model.values()):
        raise CheckpointError(f"{path}: 'model' is not a dict of tensors (a model's state_dict)")
    try:
        with torch.device("meta"):  # shapes without memory: the config's sizes are not trusted yet
            built = build_model(config.model, **config.model_options)
    except (TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{path}: config model_options do not build model {config.model!r}: {err}") from err
    wanted = {k: tuple(v.shape) for k, v in built.state_dict().items()}
    held = {k: tuple(v.shape) for k, v in model.items()}
    if wanted != held:
        missing = sorted(set(wanted) - set(held))
        unexpected = sorted(set(held) - set(wanted))
        changed = sorted(k for k in set(wanted) & set(held) if wanted[k] != held[k])
        details = "; ".join(
            f"{what}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
            for what, keys in (("missing", missing), ("unexpected", unexpected), ("other shapes", changed))
            if keys
        )
        raise CheckpointError(
            f"{path}: 'model' does not hold the parameters of the {config.model!r} its config describes ({details})"
        )
    return model
