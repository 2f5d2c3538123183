"""Operands as a case asks for them: backend, dtype, memory layout, device; and the dense references.

Values are drawn in float64 NumPy and then cast and laid out; the reference is computed from the
operands as the call receives them (read back in float64), so a cast or a layout that changes a
value changes the reference too, and only the package's arithmetic is under test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

FLOATS = ("float64", "float32", "float16", "bfloat16")
NON_FLOATS = ("int64", "int32", "uint8", "bool", "complex128", "complex64")
LAYOUTS = ("contiguous", "fortran", "strided", "transposed", "negative", "broadcast", "readonly", "grad")
"""Memory layouts of an operand: all hold the same kind of values, none is an invalid input."""


def torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype: torch.dtype = getattr(torch, name)
    return dtype


def values_as(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` (float64) as values of ``dtype``: rounded for integers, signs for bool, a phase for complex."""
    if dtype == "bool":
        return values > 0
    if dtype.startswith(("int", "uint")):
        return np.round(np.abs(values) * 3 if dtype.startswith("u") else values * 3)
    if dtype.startswith("complex"):
        return values + 0.5j * np.flip(values)
    return values


def make(values: np.ndarray, backend: str, dtype: str, layout: str = "contiguous", device: str = "cpu") -> Any:
    """An operand holding ``values`` (float64, cast to ``dtype``) with the given layout, backend and device.

    NumPy has no bfloat16: a NumPy bfloat16 operand is float32 holding bfloat16-rounded values.
    Layouts that NumPy or torch lack fall back to the nearest one (torch has no negative strides,
    NumPy no ``requires_grad``).
    """
    data = values_as(np.asarray(values, dtype=np.float64), dtype)
    if backend == "numpy":
        if dtype == "bfloat16":
            import torch

            return _np_layout(torch.from_numpy(data).to(torch.bfloat16).float().numpy(), layout)
        return _np_layout(data.astype(dtype), layout)
    import torch

    base = torch.from_numpy(np.ascontiguousarray(data)).to(torch_dtype(dtype))
    if layout == "broadcast" and base.ndim >= 1 and base.shape[0] > 1:
        base = base[:1].expand(base.shape)
    out = _torch_layout(base, layout)
    if device != "cpu":
        out = out.to(device)
    if layout == "grad" and out.is_floating_point():
        out = out.detach().requires_grad_(True)
    return out


def _np_layout(a: np.ndarray, layout: str) -> np.ndarray:
    if layout == "broadcast" and a.ndim >= 1 and a.shape[0] > 1:
        return np.broadcast_to(a[:1], a.shape)
    if layout == "fortran":
        return np.asfortranarray(a)
    if layout == "strided" and a.ndim >= 1:
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
        wide[..., ::2] = a
        return wide[..., ::2]
    if layout == "transposed" and a.ndim >= 2:
        return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    if layout == "negative" and a.ndim >= 1:
        return np.flip(np.ascontiguousarray(np.flip(a, 0)), 0)
    if layout == "readonly":
        a = a.copy()
        a.flags.writeable = False
    return a


def _torch_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    import torch

    if layout in ("fortran", "transposed", "negative") and t.ndim >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "strided" and t.ndim >= 1:
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
        wide[..., ::2] = t
        return wide[..., ::2]
    return t


def read(a: Any) -> np.ndarray:
    """An operand's values as float64 NumPy (what the reference computes with)."""
    if hasattr(a, "detach"):
        return a.detach().to("cpu").double().numpy()
    return np.asarray(a, dtype=np.float64)


def conv_reference(A: np.ndarray, x: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    r"""``(y, bound, terms)``: :math:`\sum_k A_k^\top x_b \Theta_k` summed over the non-zero entries of ``A``.

    Summing over the stored entries only (not ``0 * NaN``) gives the answer a sparse basis gives
    when ``x`` holds NaN; ``bound`` is the same sum of absolute values, ``terms`` the length of
    each sum.  ``x`` is ``(B, M, P)`` or ``(M, P)``; ``A`` is ``(K, M, N)`` or ``(B, K, M, N)``.
    """
    squeeze = x.ndim == 2
    x3 = x[None] if squeeze else x
    terms = A.shape[-3] * A.shape[-2] * theta.shape[1]
    if np.isfinite(x3).all() and np.isfinite(theta).all():
        eq = "bkmn,bmp,kpq->bnq" if A.ndim == 4 else "kmn,bmp,kpq->bnq"
        y, bound = np.einsum(eq, A, x3, theta), np.einsum(eq, np.abs(A), np.abs(x3), np.abs(theta))
        return (y[0], bound[0], terms) if squeeze else (y, bound, terms)
    A4 = A if A.ndim == 4 else np.broadcast_to(A[None], (x3.shape[0], *A.shape))
    with np.errstate(all="ignore"):
        S = np.einsum("bmp,kpq->bkmq", x3, theta)
        absS = np.einsum("bmp,kpq->bkmq", np.abs(x3), np.abs(theta))
        nz = A4 != 0
        y = np.zeros((x3.shape[0], A.shape[-1], theta.shape[2]))
        bound = np.zeros_like(y)
        for b, k, m in zip(*np.nonzero(nz.any(-1)), strict=True):
            keep = nz[b, k, m][:, None]
            y[b] += np.where(keep, A4[b, k, m][:, None] * S[b, k, m][None, :], 0.0)
            bound[b] += np.where(keep, np.abs(A4[b, k, m])[:, None] * absS[b, k, m][None, :], 0.0)
    return (y[0], bound[0], terms) if squeeze else (y, bound, terms)
