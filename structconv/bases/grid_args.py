"""Arguments of grid bases: sizes, strides and offsets as integer tuples, boundaries, placements.

Shared by the representation (:mod:`structconv.bases.grid`), its builders and the grid layers, so
that every one of them refuses a bad size with the same message, naming the argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ..backend import Array, Backend, find, of

Size = int | Sequence[int]

BOUNDARIES = ("zero", "periodic")

_INT64_MAX = 2**63 - 1  # offsets, strides and sizes are laid out as int64


def _ints(value: Size, d: int | None, arg: str, minimum: int) -> tuple[int, ...]:
    """``value`` as a tuple of ``d`` integers ``>= minimum`` and within int64 (an int is repeated)."""
    vector = getattr(value, "ndim", None) == 1  # a 1-D array of any backend
    if isinstance(value, bool) or not (isinstance(value, int | np.integer | Sequence) or vector):
        raise TypeError(f"{arg} must be an int or a sequence of ints, got {type(value).__name__}")
    if isinstance(value, int | np.integer):
        items = [value] * (d or 1)
    else:
        items = cast(Any, value).tolist() if vector else list(value)
    if d is not None and len(items) != d:
        hint = ""
        if arg == "padding" and d == 1 and len(items) == 2:  # (before, after) of one dimension, written bare
            hint = f"; for {tuple(items)!r} as (before, after) of the one dimension write ({tuple(items)!r},)"
        raise ValueError(f"{arg} must have {d} entries (one per grid dimension), got {len(items)}: {value!r}{hint}")
    if not items:
        raise ValueError(f"{arg} must have at least one entry")
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise TypeError(f"{arg} must hold integers, got {v!r}")
        if v < minimum:
            what = {1: "positive", 0: "non-negative"}.get(minimum, f"at least {minimum}")
            raise ValueError(f"{arg} must be {what}, got {value!r}")
        if v > _INT64_MAX:
            raise ValueError(f"{arg} must be at most 2**63 - 1 (a 64-bit integer), got {value!r}")
        out.append(int(v))
    return tuple(out)


def _grid(grid: Size) -> tuple[int, ...]:
    return _ints(grid, None, "grid", 1)


def _check_boundary(boundary: str) -> None:
    if boundary not in BOUNDARIES:
        raise ValueError(f"boundary must be one of {BOUNDARIES}, got {boundary!r}")


_DEFAULT = of(np.empty(0))  # the backend of a basis built without ``like`` (NumPy, float64)


def _placement(like: Array | None) -> tuple[Backend, Any, str]:
    """The backend, dtype and device a basis built with ``like`` takes."""
    if like is None:
        return _DEFAULT, np.dtype(np.float64), "cpu"
    backend = find(like)
    if backend is None:
        raise TypeError(f"like must be a numpy.ndarray or a torch.Tensor (or None), got {type(like).__name__}")
    if not backend.is_floating(like):
        raise TypeError(f"like must hold floating-point numbers (a basis is floating), got dtype {like.dtype}")
    return backend, like.dtype, backend.device(like)
