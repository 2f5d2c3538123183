"""The backend layer: the only place that tells NumPy arrays from torch tensors.

Dense code elsewhere asks :func:`namespace` for the array API namespace of its input
(``array_api_compat``, as SciPy and scikit-learn do) and writes each operation once.  What the
standard lacks is a method of the array's :class:`~structconv.backend.interface.Backend`,
returned by :func:`of`.  Torch is detected through ``sys.modules``, so the NumPy path never
imports it.

The functions below this module's registry are short spellings of ``of(a).method(...)`` kept
for readability at call sites.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import numpy as np
import opt_einsum

from .cache import BoundedCache
from .interface import Array, Backend

REGISTRY: dict[str, tuple[str, str]] = {
    "numpy": ("numpy", "structconv.backend.numpy"),
    "torch": ("torch", "structconv.backend.torch"),
}
"""Backend name → (the array library's module name, the module implementing it)."""

_LOADED: dict[str, Backend] = {}
_OWNER: dict[type, Backend] = {}
"""Array type → the backend owning it, as :func:`find` found it: ownership is by type (``owns`` is an
``isinstance`` test), and one dictionary lookup is what a compiled layer's trace reads per array."""


def load(name: str) -> Backend:
    """The backend called ``name`` in :data:`REGISTRY`, its module imported on the first call.

    Torch layers load theirs when :mod:`structconv.nn` is imported, since ``torch.compile``
    cannot trace the import a first call inside a compiled forward would make.

    Parameters
    ----------
    name
        A key of :data:`REGISTRY`.
    """
    found = _LOADED.get(name)
    if found is None:
        found = _LOADED[name] = importlib.import_module(REGISTRY[name][1]).BACKEND
    return found


def find(a: object) -> Backend | None:
    """The backend owning ``a``, or ``None``; a library not yet imported owns nothing.

    Parameters
    ----------
    a
        Anything.
    """
    found = _OWNER.get(type(a))
    if found is not None:
        return found
    if isinstance(a, np.ndarray):
        found = load("numpy")
    loaded = (load(name) for name, (library, _) in REGISTRY.items() if name != "numpy" and library in sys.modules)
    found = found or next((backend for backend in loaded if backend.owns(a)), None)
    if found is not None:
        _OWNER[type(a)] = found
    return found


def of(a: object, arg: str = "array") -> Backend:
    """The backend owning ``a``; a ``TypeError`` naming ``arg`` if none does.

    Parameters
    ----------
    a
        The argument as given.
    arg
        Its name, as the message shows it.
    """
    backend = find(a)
    if backend is None:
        raise TypeError(f"{arg} must be a numpy.ndarray or a torch.Tensor, got {type(a).__name__}")
    return backend


def namespace(*arrays: Array) -> Any:
    """The array API namespace of ``arrays`` (``array_api_compat``'s numpy or torch wrapper).

    Parameters
    ----------
    *arrays
        Arrays of one backend; the first decides.
    """
    return of(arrays[0]).namespace()


def native(a: Array) -> Any:
    """The array library itself (``numpy`` or ``torch``) of ``a``.

    Parameters
    ----------
    a
        An array of a supported backend.
    """
    return of(a).native()


def backend_of(a: object, arg: str) -> str:
    """Name the backend of ``a`` or raise a ``TypeError`` naming the argument.

    Parameters
    ----------
    a, arg
        As for :func:`of`.
    """
    return of(a, arg).name


def device_of(a: Array) -> str:
    """The device of ``a`` as a string (always ``"cpu"`` for NumPy).

    Parameters
    ----------
    a
        An array of a supported backend.
    """
    return of(a).device(a)


def dtype_name(a: Array) -> str:
    """A backend-neutral dtype name such as ``"float64"``.

    Parameters
    ----------
    a
        An array of a supported backend.
    """
    return of(a).dtype_name(a)


def is_floating(a: Array) -> bool:
    """Whether ``a`` holds real floating-point numbers.

    Parameters
    ----------
    a
        An array of a supported backend.
    """
    return of(a).is_floating(a)


def is_integer_array(a: object) -> bool:
    """Whether ``a`` is an array of integers (not booleans).

    Parameters
    ----------
    a
        Anything (``False`` for what is not an array).
    """
    backend = find(a)
    return backend is not None and backend.is_integer(a)


def all_finite(a: Array) -> bool:
    """Whether every entry of ``a`` is finite.

    Parameters
    ----------
    a
        An array of a supported backend.
    """
    return of(a).all_finite(a)


def to_numpy(a: Array) -> np.ndarray:
    """A NumPy copy of ``a`` (detached from autograd).

    Parameters
    ----------
    a
        An array of a supported backend.
    """
    return of(a).to_numpy(a)


def as_index(a: Any, like: Array) -> Array:
    """Integer indices as int64 on the backend (and device) of ``like``.

    Parameters
    ----------
    a
        Integers: an array of any backend, or what ``numpy.asarray`` reads.
    like
        An array of the backend and device wanted.
    """
    return of(like).asarray(a, like, "int64")


def zeros(shape: tuple[int, ...], like: Array) -> Array:
    """Zeros of ``shape`` with the backend, dtype and device of ``like``.

    Parameters
    ----------
    shape
        The shape.
    like
        An array of the backend, dtype and device wanted.
    """
    return of(like).zeros(shape, like)


def concatenate(arrays: list[Array], axis: int) -> Array:
    """Concatenate along ``axis`` on whichever backend the arrays live.

    Parameters
    ----------
    arrays
        At least one array, all of one backend.
    axis
        The axis joined along.
    """
    return namespace(arrays[0]).concat(arrays, axis=axis)


def x_theta(x: Array, theta: Array) -> Array:
    r""":math:`S_{bkmq} = \sum_p x_{bmp}\Theta_{kpq}` as one GEMM ``(B·M, P) @ (P, K·Q)``, returned as a view.

    Parameters
    ----------
    x
        ``(B, M, P)``.
    theta
        :math:`\Theta`, ``(K, P, Q)``.

    Returns
    -------
    Array
        ``(B, K, M, Q)``, a view of the GEMM's output.
    """
    return of(theta).x_theta(x, theta)


def sparse_matrix(rows: Array, cols: Array, values: Array, shape: tuple[int, int]) -> Any:
    """A sparse matrix ``S`` (``S @ dense``) from coordinates; repeated coordinates add up.

    Parameters
    ----------
    rows, cols
        int64 ``(nnz,)`` coordinates.
    values
        ``(nnz,)`` entries, whose backend builds the matrix.
    shape
        ``(rows, columns)``.
    """
    return of(values).sparse_matrix(rows, cols, values, shape)


def autocast_dtype(a: Array) -> Any:
    """The dtype autocast runs matrix products in on ``a``'s device, or ``None`` outside autocast.

    Parameters
    ----------
    a
        Anything (``None`` for what is not an array).
    """
    backend = find(a)  # before the argument checks: anything else is not autocast's business
    return None if backend is None else backend.autocast_dtype(a)


def autocast_to(a: Array, dtype: Any) -> Array:
    """``a`` in ``dtype`` if it is a floating tensor autocast would convert (float64 is left alone).

    Parameters
    ----------
    a
        An array of a supported backend.
    dtype
        The autocast dtype (:func:`autocast_dtype`), or ``None`` for no conversion.
    """
    return of(a).autocast_to(a, dtype)


def shape_str(shape: tuple[int, ...]) -> str:
    """Format a shape the way error messages show it: ``(2, 3)``.

    Parameters
    ----------
    shape
        Sizes (Python, NumPy or torch integers).
    """
    return str(tuple(int(s) for s in shape))


_EXPRESSIONS: BoundedCache[Any] = BoundedCache(size=1024)


def _expression(eq: str, shapes: tuple[tuple[int, ...], ...], path: tuple[tuple[int, ...], ...] | None) -> Any:
    key = (eq, shapes, path)
    found = _EXPRESSIONS.find(key)
    if found is None:
        optimize: Any = "optimal" if path is None else list(path)
        found = _EXPRESSIONS.put(key, opt_einsum.contract_expression(eq, *shapes, optimize=optimize))
    return found


def einsum(eq: str, *operands: Array, path: tuple[tuple[int, ...], ...] | None = None) -> Array:
    """Evaluate ``eq`` with opt_einsum, planning once per (equation, shapes, path).

    Inside autocast the operands are first converted to the autocast dtype: opt_einsum
    contracts through ``tensordot``, which autocast does not cover.  Two operands leave no order
    to plan and run as the backend's own einsum; under ``torch.compile`` so does each pair of
    opt_einsum's order (opt_einsum's thread-local sharing state breaks the graph).

    Parameters
    ----------
    eq
        The einsum equation, e.g. ``"kmn,bmp->bknp"``.
    *operands
        Arrays of one backend.
    path
        A contraction path (pairs of operand positions), or ``None`` for opt_einsum's optimal one.
    """
    backend = of(operands[0])
    dtype = backend.autocast_dtype(operands[0])
    if dtype is not None:
        operands = tuple(backend.autocast_to(op, dtype) for op in operands)
    if len(operands) == 2 and backend.name != "numpy":
        return backend.einsum(eq, *operands)
    shapes = tuple(tuple(int(s) for s in op.shape) for op in operands)
    if not backend.traced():  # eagerly, the expression opt_einsum planned (its tensordots)
        return _expression(eq, shapes, path)(*operands)
    # Compiled: pairwise in opt_einsum's order, each pair through the backend's einsum, which
    # torch.compile traces (opt_einsum's thread-local state and lazy imports break its graph).
    remaining = list(operands)
    for positions, pair in einsum_path(eq, shapes, path)[0]:
        taken = [remaining.pop(i) for i in positions]
        remaining.append(backend.einsum(pair, *taken))
    return remaining[0]


_PATHS: BoundedCache[tuple[tuple[tuple[tuple[int, ...], str], ...], float, float]] = BoundedCache(size=1024)


def einsum_path(
    eq: str, shapes: tuple[tuple[int, ...], ...], path: tuple[tuple[int, ...], ...] | None
) -> tuple[tuple[tuple[tuple[int, ...], str], ...], float, float]:
    """opt_einsum's plan of ``eq`` for operands of ``shapes``: its steps, flops and intermediate entries.

    Each step is the operand positions it takes (popped in order) and its pairwise equation.  A
    pure function of its arguments, cached by value; the torch backend marks it constant for
    ``torch.compile``, which then calls it as Python instead of tracing opt_einsum.

    Parameters
    ----------
    eq
        The einsum equation.
    shapes
        The operands' shapes.
    path
        A contraction path (pairs of operand positions), or ``None`` for opt_einsum's optimal one.
    """
    key = (eq, shapes, path)
    return _PATHS.find(key) or _PATHS.put(key, _planned(eq, shapes, path))


def _planned(
    eq: str, shapes: tuple[tuple[int, ...], ...], path: tuple[tuple[int, ...], ...] | None
) -> tuple[tuple[tuple[tuple[int, ...], str], ...], float, float]:
    optimize: Any = "optimal" if path is None else [tuple(p) for p in path]
    _, info = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=optimize)
    steps = tuple((tuple(step[0]), str(step[2])) for step in info.contraction_list)
    return steps, float(info.opt_cost), float(sum(info.size_list))


__all__ = [
    "REGISTRY",
    "Array",
    "Backend",
    "all_finite",
    "as_index",
    "autocast_dtype",
    "autocast_to",
    "backend_of",
    "concatenate",
    "device_of",
    "dtype_name",
    "einsum",
    "find",
    "is_floating",
    "is_integer_array",
    "namespace",
    "native",
    "of",
    "shape_str",
    "sparse_matrix",
    "to_numpy",
    "x_theta",
    "zeros",
]
