"""Argument checks shared by the basis constructors and the engine.

Every failure names the argument, what it got and what was expected.
"""

from __future__ import annotations

from typing import Any

from . import Array, all_finite, backend_of, device_of, dtype_name, is_floating, of, shape_str


def check_array(a: object, arg: str, ranks: tuple[int, ...], names: tuple[str, ...]) -> str:
    """Check that ``a`` is a non-empty floating array of one of ``ranks``; return its backend.

    ``names`` spells the expected shape, e.g. ``("(K, M, N)", "(B, K, M, N)")``.
    """
    backend = backend_of(a, arg)
    arr: Any = a
    if of(arr).is_sparse(arr):  # reshapes and GEMMs need strided memory; a sparse basis is converted instead
        layout = getattr(arr, "layout", "sparse")
        raise TypeError(f"{arg} must be a dense (strided) array, got layout {layout}; call {arg}.to_dense()")
    expected = " or ".join(names)
    if arr.ndim not in ranks:
        raise ValueError(f"{arg} must have shape {expected}, got shape {shape_str(tuple(arr.shape))}")
    if any(int(s) == 0 for s in arr.shape):
        raise ValueError(f"{arg} has an empty dimension: shape {shape_str(tuple(arr.shape))}, expected {expected}")
    if not is_floating(arr):
        raise TypeError(f"{arg} must hold floating-point numbers, got dtype {dtype_name(arr)}")
    return backend


def check_readable(a: Array, arg: str, what: str) -> None:
    """Raise a ``ValueError`` naming ``arg`` if ``a`` is on the ``meta`` device, where ``what`` cannot read its values.

    A device attribute, never a value read: free on an accelerator.

    Examples
    --------
    >>> import torch
    >>> check_readable(torch.ones(2, device="meta"), "edge_index", "reading a graph")
    Traceback (most recent call last):
    ...
    ValueError: edge_index is on the meta device: reading a graph reads its values, which a meta tensor does not hold
    """
    if device_of(a) == "meta":
        raise ValueError(f"{arg} is on the meta device: {what} reads its values, which a meta tensor does not hold")


def check_finite(a: Array, arg: str) -> None:
    """Raise if ``a`` holds NaN or infinite values (or, on the ``meta`` device, no values at all)."""
    check_readable(a, arg, "the check for NaN and infinity")
    if not all_finite(a):
        raise ValueError(f"{arg} contains non-finite values (NaN or inf)")


def check_same_placement(named: dict[str, Array]) -> None:
    """Raise if the arrays mix backends, dtypes or devices (nothing is converted silently)."""
    items = list(named.items())
    first_name, first = items[0]
    first_backend = backend_of(first, first_name)
    for name, arr in items[1:]:
        backend = backend_of(arr, name)
        if backend != first_backend:
            raise TypeError(
                f"{name} is a {backend} array but {first_name} is a {first_backend} array; do not mix backends"
            )
        if dtype_name(arr) != dtype_name(first):
            raise TypeError(
                f"{name} has dtype {dtype_name(arr)} but {first_name} has dtype {dtype_name(first)}; convert explicitly"
            )
        if device_of(arr) != device_of(first):
            raise ValueError(f"{name} is on device {device_of(arr)} but {first_name} is on {device_of(first)}")


def check_backend(name: str, expected: str, what: str) -> None:
    """Raise a ``TypeError`` if ``what`` lives on backend ``name`` rather than ``expected``.

    Examples
    --------
    >>> check_backend("numpy", "torch", "a torch layer's basis")
    Traceback (most recent call last):
    ...
    TypeError: a torch layer's basis must be a torch one, got a numpy one; build it from torch arrays
    """
    if name != expected:
        raise TypeError(f"{what} must be a {expected} one, got a {name} one; build it from {expected} arrays")
