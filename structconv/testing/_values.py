r"""What every check of the kit shares: values as float64, closeness with a message, tolerances per dtype.

A check reports the largest difference it found and what was allowed there, so that a failure
says how far off a result is and not only that it is.  An element passes when
:math:`|a - b| \le \mathrm{atol} + \mathrm{rtol}\,|b|` (or :math:`a = b`, infinities included);
a ``NaN`` on either side fails.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: ``(rtol, atol)`` by dtype name, where a check is not given its own: a few hundred units of
#: rounding of each dtype, enough for a contraction run in another order than the reference's.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-10, 1e-10),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}


def dtype_name(dtype: Any) -> str:
    """``"float64"`` for ``numpy.float64``, ``np.dtype("float64")`` or ``torch.float64``."""
    return str(dtype).removeprefix("torch.")


def tolerances(dtype: Any, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """``(rtol, atol)``: those given, the others from :data:`TOLERANCES` (float64's for an unknown dtype)."""
    default = TOLERANCES.get(dtype_name(dtype), TOLERANCES["float64"])
    return (default[0] if rtol is None else rtol, default[1] if atol is None else atol)


def as_float64(a: Any) -> np.ndarray:
    """``a`` (array, tensor, number) as a float64 NumPy copy, detached from autograd."""
    if isinstance(a, torch.Tensor):
        # Through torch first: NumPy has no bfloat16, and sparse or CUDA tensors do not convert.
        dense = a.to_dense() if a.layout != torch.strided else a
        return np.array(dense.detach().to("cpu", torch.float64).numpy(), copy=True)
    # A copy always: a snapshot must not see later writes into the array it was taken from.
    return np.array(a, dtype=np.float64, copy=True)


def max_difference(actual: Any, expected: Any) -> float:
    """The largest :math:`|a - b|` (``nan`` when either holds a ``NaN``; 0 for empty arrays)."""
    a, b = as_float64(actual), as_float64(expected)
    if a.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        diff = np.where(a == b, 0.0, np.abs(a - b))
    return float(diff.max())


def assert_near(actual: Any, expected: Any, *, rtol: float, atol: float, what: str) -> None:
    """Raise an ``AssertionError`` naming ``what`` unless ``actual`` is within tolerance of ``expected``.

    Shapes must agree; the message gives the largest difference and the allowance there.
    """
    a, b = as_float64(actual), as_float64(expected)
    if a.shape != b.shape:
        raise AssertionError(f"{what}: shape {a.shape} differs from the expected {b.shape}")
    if a.size == 0:
        return
    with np.errstate(invalid="ignore"):
        diff = np.where(a == b, 0.0, np.abs(a - b))
        allowed = atol + rtol * np.abs(b)
        bad = ~(diff <= allowed)
    if bad.any():
        worst = int(np.argmax(np.where(np.isnan(diff), np.inf, diff)))
        where = tuple(int(i) for i in np.unravel_index(worst, a.shape))
        raise AssertionError(
            f"{what}: max |difference| = {float(diff.flat[worst]):.3g} at index {where} "
            f"(got {a.flat[worst]:.6g}, expected {b.flat[worst]:.6g}; allowed {atol:.3g} + {rtol:.3g}·|expected|), "
            f"{int(bad.sum())} of {a.size} entries outside"
        )


__all__ = ["TOLERANCES", "as_float64", "assert_near", "dtype_name", "max_difference", "tolerances"]
