"""Argument checks shared by the basis constructors and the engine.

Every failure names the argument, what it got and what was expected.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import Array, all_finite, backend_of, device_of, dtype_name, is_floating, namespace, of, shape_str


def check_array(a: object, arg: str, ranks: tuple[int, ...], names: tuple[str, ...]) -> str:
    """Check that ``a`` is a non-empty, dense, floating array of one of ``ranks``; return its backend's name.

    Parameters
    ----------
    a
        The argument as given.
    arg
        Its name, as the messages show it.
    ranks
        The numbers of dimensions accepted.
    names
        The expected shapes spelt out, one per rank, e.g. ``("(K, M, N)", "(B, K, M, N)")``.

    Raises
    ------
    TypeError
        If ``a`` is not an array, is sparse, or does not hold floating-point numbers.
    ValueError
        If it has another rank or an empty dimension.
    """
    backend = of(a, arg)
    arr: Any = a
    if backend.is_sparse(arr):  # reshapes and GEMMs need strided memory; a sparse basis is converted instead
        layout = getattr(arr, "layout", "sparse")
        raise TypeError(f"{arg} must be a dense (strided) array, got layout {layout}; call {arg}.to_dense()")
    expected = " or ".join(names)
    if arr.ndim not in ranks:
        raise ValueError(f"{arg} must have shape {expected}, got shape {shape_str(tuple(arr.shape))}")
    if any(int(s) == 0 for s in arr.shape):
        raise ValueError(f"{arg} has an empty dimension: shape {shape_str(tuple(arr.shape))}, expected {expected}")
    if not is_floating(arr):
        raise TypeError(f"{arg} must hold floating-point numbers, got dtype {dtype_name(arr)}")
    return backend.name


def positive_int(value: object, name: str, *, where: str | None = None) -> int:
    r"""``value`` as an ``int`` if it is a positive integer; else a ``ValueError`` naming ``name``.

    The one rule for counts and sizes (channels, heads, nodes): a Python or NumPy integer
    :math:`\ge 1`.  A ``bool`` is refused although Python counts it as an integer (``True``
    channels is a slip, not a size), and so is a float, even an integral one (``2.0``).

    Parameters
    ----------
    value
        The argument as given.
    name
        The argument's name, as the message shows it (``"in_channels"``).
    where
        What the argument was given to (a layer's name, ``"GCNConv"``), put in front of the
        message; ``None`` for no prefix.

    Returns
    -------
    int
        ``value`` as a Python ``int``.

    Raises
    ------
    ValueError
        If ``value`` is not an integer (a ``bool`` included) or is below 1.

    Examples
    --------
    >>> positive_int(3, "heads")
    3
    >>> positive_int(True, "out_channels", where="GCNConv")
    Traceback (most recent call last):
    ...
    ValueError: GCNConv: out_channels must be a positive integer, got True
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        prefix = "" if where is None else f"{where}: "
        raise ValueError(f"{prefix}{name} must be a positive integer, got {value!r}")
    return int(value)


def real_number(value: object, name: str, *, positive: bool, where: str) -> float:
    """``value`` as a finite ``float``, positive (or at least zero); else an error naming ``name`` after ``where``."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{where}: {name} must be a real number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise ValueError(f"{where}: {name} must be finite and {'positive' if positive else '>= 0'}, got {value!r}")
    return number


def flag(value: object, name: str, *, where: str | None = None) -> bool:
    """``value`` if it is a ``bool`` (an option that is on or off, never a number or a string)."""
    if not isinstance(value, bool):
        prefix = "" if where is None else f"{where}: "
        raise TypeError(f"{prefix}{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def check_readable(a: Array, arg: str, what: str) -> None:
    """Raise a ``ValueError`` naming ``arg`` if ``a`` is on the ``meta`` device, where ``what`` cannot read its values.

    A device attribute, never a value read: free on an accelerator.

    Parameters
    ----------
    a
        An array.
    arg
        Its name, as the message shows it.
    what
        What would read its values, as the message says it.

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
    """Raise a ``ValueError`` if ``a`` holds NaN or infinite values (or, on the ``meta`` device, no values at all).

    Parameters
    ----------
    a
        An array (read back: a host synchronisation on an accelerator).
    arg
        Its name, as the message shows it.
    """
    check_readable(a, arg, "the check for NaN and infinity")
    backend = of(a)
    if backend.traced():
        backend.check_all(namespace(a).isfinite(backend.detach(a)), f"{arg} contains non-finite values (NaN or inf)")
    elif not all_finite(a):
        raise ValueError(f"{arg} contains non-finite values (NaN or inf)")


def check_index_range(index: Array, size: int, arg: str, size_name: str | None = None) -> None:
    """Raise a ``ValueError`` naming ``arg`` unless every entry of ``index`` lies in ``[0, size)``.

    Eagerly the message quotes the range found (two host reads); under ``torch.compile`` the
    check is an assertion inside the graph (:meth:`~structconv.backend.interface.Backend.check_all`).

    Parameters
    ----------
    index
        Integers, of any backend.
    size
        The number of valid positions.
    arg
        Its name, as the message shows it.
    size_name
        The argument that gave ``size``, shown beside it (``[0, num_relations=3)``).
    """
    if not int(index.shape[0]) or device_of(index) == "meta":  # nothing to read (a meta layout test)
        return
    backend = of(index)
    expected = f"{arg} must lie in [0, {size if size_name is None else f'{size_name}={size}'})"
    if backend.traced():
        backend.check_all((index >= 0) & (index < size), expected)
        return
    lo, hi = int(index.min()), int(index.max())
    if lo < 0 or hi >= size:
        raise ValueError(f"{expected}, got values in [{lo}, {hi}]")


_CAPACITY: dict[str, float] = {}  # bytes per device, asked once: torch.compile traces a lookup, not a system call


def check_memory(need: float, like: Array, what: str, *, share: float = 1.0, advice: str = "") -> None:
    """Refuse ``what``, ``need`` bytes, beyond ``share`` of the memory of ``like``'s device, before any is allocated.

    The one guard of the package: the engine's orders, attention scores, the tables of a grid and
    a layer's parameters all ask it.  The memory is the backend's
    :meth:`~structconv.backend.interface.Backend.memory_capacity` (a ceiling, not what is free).

    Parameters
    ----------
    need
        The bytes asked for.
    like
        An array on the device that would hold them (a ``meta`` array allocates nothing: no check).
    what
        What would be allocated, naming the argument that asks for it, as the message says it.
    share
        The part of the device's memory allowed (a grid's host tables: half of it).
    advice
        What to do instead, added to the message.
    """
    device = device_of(like)
    if device == "meta":
        return
    capacity = _CAPACITY.get(device)
    if capacity is None:
        capacity = _CAPACITY[device] = of(like).memory_capacity(like)
    if need > share * capacity:
        part = "" if share == 1.0 else f"{share:g} of "
        raise ValueError(
            f"{what} would take {need / 2**30:.3g} GiB on {device}, more than {part}its {capacity / 2**30:.3g} GiB"
            + (f"; {advice}" if advice else "")
        )


def check_same_placement(named: dict[str, Array]) -> None:
    """Raise if the arrays mix backends, dtypes or devices (nothing is converted silently).

    Parameters
    ----------
    named
        The arrays by argument name; the first is the reference the messages compare with.
    """
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

    Parameters
    ----------
    name
        The backend found (``"numpy"``).
    expected
        The backend wanted.
    what
        What was checked, as the message names it.

    Examples
    --------
    >>> check_backend("numpy", "torch", "a torch layer's basis")
    Traceback (most recent call last):
    ...
    TypeError: a torch layer's basis must be a torch one, got a numpy one; build it from torch arrays
    """
    if name != expected:
        raise TypeError(f"{what} must be a {expected} one, got a {name} one; build it from {expected} arrays")
