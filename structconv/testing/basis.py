r"""Conformance of a basis: every order the engine offers for it equals the dense reference.

:func:`check_basis` runs :func:`structconv.conv` on the basis in each order that
:func:`structconv.explain` lists (and ``"auto"``), compares each result with
:func:`~structconv.engine.reference.dense_reference` on the basis' dense form, checks the
gradients with respect to :math:`x` and :math:`\Theta` through every order (``torch.autograd.gradcheck``,
for torch bases in float64), and that the basis is the same value afterwards: a basis is
immutable, so applying it may fill its explicit caches but must not change, replace, add or
remove anything else it holds.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backend import Array, device_of, find, load
from ..bases.base import Basis
from ..bases.factor import Theta
from ..bases.sparse import Derived
from ..engine.contract import conv, explain
from ..engine.reference import dense_reference
from ._values import as_float64, assert_near, dtype_name, max_difference, tolerances
from .meaning import basis_diagnosis

_DEPTH = 4  # how deep a basis' attributes are followed (composite bases nest their parts)
_PLAIN = (type(None), bool, int, float, complex, str, bytes, type, types.ModuleType)


def random_operands(basis: Basis, *, channels: tuple[int, int] = (3, 2), seed: int = 0) -> tuple[Array, Array]:
    r"""A random input ``x`` ``(B, M, P)`` and parameter :math:`\Theta` ``(K, P, Q)`` for ``basis``.

    Drawn from a standard normal, on the basis' backend, device and dtype; ``B`` is the basis'
    batch (per-instance bases) or 2, ``(P, Q)`` are ``channels``.

    Parameters
    ----------
    basis
        The basis the operands are for: its ``M`` and ``K`` give their sizes, its ``batch`` the
        batch ``B`` (2 for a basis shared by the whole batch), and its ``backend``, ``device`` and
        ``dtype`` where the arrays are placed.
    channels
        ``(P, Q)``: the input channels of ``x`` and the output channels of :math:`\Theta`.
    seed
        Seed of ``numpy.random.default_rng``: the values are drawn in float64 by NumPy (``x``
        first, then :math:`\Theta`) and only then moved to the basis' backend and cast to its
        dtype, so one seed gives the same values on every backend, up to that cast.

    Returns
    -------
    tuple of (Array, Array)
        ``(x, theta)``: ``x`` of shape ``(B, M, P)`` and a full ``theta`` of shape ``(K, P, Q)``,
        arrays of the basis' backend on its device, in its dtype.
    """
    rng = np.random.default_rng(seed)
    P, Q = channels
    backend = load(basis.backend)

    def placed(a: np.ndarray) -> Array:
        return backend.move(backend.from_numpy(a), device=basis.device, dtype=basis.dtype)

    return placed(rng.normal(size=(basis.batch or 2, basis.M, P))), placed(rng.normal(size=(basis.K, P, Q)))


# --- the value a basis holds --------------------------------------------------------------------
def _attributes(obj: object) -> dict[str, Any]:
    """``obj``'s own state (``__slots__`` and ``__dict__``), leaving out ``functools.cached_property`` values."""
    names: list[str] = []
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    state = {n: getattr(obj, n) for n in names if n not in ("__dict__", "__weakref__") and hasattr(obj, n)}
    cached = {n for k in type(obj).__mro__ for n, v in vars(k).items() if isinstance(v, functools.cached_property)}
    state.update({k: v for k, v in getattr(obj, "__dict__", {}).items() if k not in cached})
    return state


def snapshot(basis: Basis) -> dict[str, Any]:
    """Everything ``basis`` holds, by attribute path: arrays as ``(identity, dtype, shape, values)``.

    Explicit caches (:class:`~structconv.bases.sparse.Derived`) and ``functools.cached_property``
    values are left out: filling them is what applying a basis may do.

    Parameters
    ----------
    basis
        The basis to record.  Its own state (``__slots__`` and ``__dict__``) is followed into
        the objects it holds and theirs, four levels of objects in all, the basis the first
        (composite bases nest their parts), and into every item of the tuples, lists and dicts
        met on the way (which do not count as a level).

    Returns
    -------
    dict of str to tuple
        One entry per attribute path (``"basis"``, ``"basis.geometry"``, ``"basis.geometry.grid[0]"``, ...),
        the first item of each saying what it is:

        * ``("array", id, dtype name, shape, values)`` for an array of any backend, its values a
          float64 NumPy copy (later writes into the array do not reach it);
        * ``("value", repr)`` for ``None``, numbers, strings, bytes, types, modules, and the
          dtypes, devices and scalars of torch and NumPy;
        * ``("cache", id)`` for an explicit cache (:class:`~structconv.bases.sparse.Derived`),
          whose contents are not recorded;
        * ``(type name, length)`` for a tuple, list or dict, its items under ``path[key]``;
        * ``("object", type name, id)`` for an object followed into its attributes, under
          ``path.name``, and ``("object", id)`` for one not followed (the depth reached, or a
          callable without state of its own);
        * ``("cycle", id)`` for an object already on the path to it.

    Examples
    --------
    >>> from structconv import grid_basis
    >>> from structconv.testing import snapshot
    >>> snapshot(grid_basis((5, 4), 3))["basis"][0]
    'object'
    """
    found: dict[str, Any] = {}

    def visit(obj: Any, path: str, depth: int, seen: frozenset[int]) -> None:
        backend = find(obj)
        if backend is not None:
            found[path] = ("array", id(obj), dtype_name(obj.dtype), tuple(obj.shape), as_float64(obj))
        elif id(obj) in seen:
            found[path] = ("cycle", id(obj))
        elif isinstance(obj, _PLAIN) or type(obj).__module__ in ("torch", "numpy"):  # dtypes, devices, scalars
            found[path] = ("value", repr(obj))
        elif isinstance(obj, Derived):
            found[path] = ("cache", id(obj))
        elif isinstance(obj, tuple | list | dict):
            items = obj.items() if isinstance(obj, dict) else enumerate(obj)
            found[path] = (type(obj).__name__, len(obj))
            for key, value in items:
                visit(value, f"{path}[{key!r}]", depth, seen | {id(obj)})
        elif depth >= _DEPTH or (callable(obj) and not _attributes(obj)):
            found[path] = ("object", id(obj))
        else:
            found[path] = ("object", type(obj).__name__, id(obj))
            for name, value in sorted(_attributes(obj).items()):
                visit(value, f"{path}.{name}", depth + 1, seen | {id(obj)})

    visit(basis, "basis", 0, frozenset())
    return found


def assert_unchanged(before: dict[str, Any], after: dict[str, Any], *, what: str = "basis") -> None:
    """Raise an ``AssertionError`` naming the first attribute path where two :func:`snapshot` differ.

    Parameters
    ----------
    before, after
        Two :func:`snapshot` of the same basis, before and after what may not change it.
    what
        What the snapshots are of, named in the message when attribute paths were added or
        removed (the other messages name the path, which starts with ``basis``).

    Raises
    ------
    AssertionError
        When ``after`` has attribute paths that ``before`` lacks or the reverse (all of them
        named); else at the first path, in the order of ``before``, where an array was replaced
        by another object, changed its dtype or shape, or changed its values (``NaN`` equals
        ``NaN``; the message gives the largest change), or where any other entry differs (a
        value, a length, an object's identity, an array become something else).

    Examples
    --------
    >>> from structconv import grid_basis
    >>> from structconv.testing import assert_unchanged, snapshot
    >>> basis = grid_basis((5, 4), 3)
    >>> assert_unchanged(snapshot(basis), snapshot(basis))
    """
    added, removed = sorted(set(after) - set(before)), sorted(set(before) - set(after))
    if added or removed:
        raise AssertionError(f"{what} changed its state: added {added}, removed {removed}")
    for path, old in before.items():
        new = after[path]
        if old[0] == "array" and new[0] == "array":
            if old[1] != new[1]:
                raise AssertionError(f"{path}: the array object was replaced")
            if old[2:4] != new[2:4]:
                raise AssertionError(f"{path}: dtype/shape changed from {old[2:4]} to {new[2:4]}")
            if not np.array_equal(old[4], new[4], equal_nan=True):
                raise AssertionError(
                    f"{path}: the array's values changed (max |change| = {max_difference(new[4], old[4]):.3g})"
                )
        elif old != new:
            raise AssertionError(f"{path}: {old!r} became {new!r}")


# --- the check ----------------------------------------------------------------------------------
def _factors(theta: Theta) -> tuple[tuple[Array, ...], Callable[..., Theta]]:
    """The arrays ``theta`` is made of, and how to make it again from them.

    A factorised parameter (:class:`~structconv.Separable`, :class:`~structconv.LowRank`, any
    other dataclass holding arrays) is its array fields; a full one is itself.
    """
    if dataclasses.is_dataclass(theta) and not isinstance(theta, type):
        names = [f.name for f in dataclasses.fields(theta) if find(getattr(theta, f.name)) is not None]

        def rebuild(*arrays: Array) -> Theta:
            made: Theta = dataclasses.replace(theta, **dict(zip(names, arrays, strict=True)))
            return made

        return tuple(getattr(theta, n) for n in names), rebuild
    return (theta,), lambda full: full


def _worst_jacobian_entry(run: Callable[..., Any], leaves: tuple[Any, ...]) -> float:
    """The largest difference between the Jacobian autograd gives and central differences (step 1e-6)."""
    import torch

    y = run(*leaves).reshape(-1)
    rows = [torch.autograd.grad(y[o], leaves, retain_graph=True, allow_unused=True) for o in range(y.numel())]
    worst = 0.0
    for i, leaf in enumerate(leaves):
        flat = leaf.detach().reshape(-1)
        for j in range(flat.numel()):
            step = torch.zeros_like(flat)
            step[j] = 1e-6
            moved = [t.detach() for t in leaves]
            hi = run(*moved[:i], (flat + step).reshape(leaf.shape), *moved[i + 1 :]).reshape(-1)
            lo = run(*moved[:i], (flat - step).reshape(leaf.shape), *moved[i + 1 :]).reshape(-1)
            column = [0.0 if row[i] is None else float(row[i].reshape(-1)[j]) for row in rows]
            worst = max(worst, max_difference(np.asarray(column), as_float64((hi - lo) / 2e-6)))
    return worst


def _gradcheck(basis: Basis, x: Array, theta: Theta, order: str, fast: bool) -> None:
    """``torch.autograd.gradcheck`` of :math:`x` and the arrays of :math:`\\Theta` through ``order``."""
    import torch
    from torch.autograd.gradcheck import GradcheckError

    parts, rebuild = _factors(theta)
    leaves = tuple(t.detach().clone().requires_grad_() for t in (x, *parts))

    def run(xx: torch.Tensor, *ts: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = conv(basis, xx, rebuild(*ts), order=order)
        return y

    try:
        torch.autograd.gradcheck(run, leaves, fast_mode=fast)
    except GradcheckError as error:
        # gradcheck prints whole Jacobians; the largest difference between them says how far off.
        worst = _worst_jacobian_entry(run, leaves)
        names = ["x", *("theta" if len(parts) == 1 else f"theta factor {k}" for k in range(len(parts)))]
        raise AssertionError(
            f"order {order!r}: gradcheck of ({', '.join(names)}) failed: max |analytical - numerical| "
            f"Jacobian entry = {worst:.3g} ({str(error).splitlines()[0]})"
        ) from None


def check_basis(
    basis: Basis,
    *,
    reference: Array | None = None,
    x: Array | None = None,
    theta: Theta | None = None,
    dense: Array | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    gradients: bool = True,
    fast: bool = False,
    seed: int = 0,
) -> list[str]:
    r"""Check that ``basis`` means ``reference``, and that every order of :func:`structconv.conv` computes it.

    First use: with ``reference``, a dense ``(K, M, N)`` statement of what the basis should be,
    written apart from it (a dense function of the graph or grid: an adjacency, its mean over
    each output's inputs, an identity member, a kernel's taps), the basis' dense form must equal
    it member by member; a difference is told as the mistake it looks like (a member transposed,
    of another position, scaled, normalised over the other axis, moved: :mod:`.meaning`).
    Without one the basis is held to its own dense form only, which a basis that means the
    wrong thing passes.

    For each order :func:`structconv.explain` lists for these operands (``Plan.candidates``), and
    ``"auto"``, ``conv(basis, x, theta, order=order)`` must be an array of ``x``'s type, device
    and dtype, of shape ``(B, N, Q)`` (``(N, Q)`` for a 2-D ``x``) equal to
    :math:`y_b = \sum_k A_k^\top x_b \Theta_k` computed by
    :func:`~structconv.engine.reference.dense_reference` in float64 from ``reference``, else
    ``dense``, else the basis' :meth:`~structconv.Basis.to_dense`.  For a torch basis in float64 with
    ``gradients``, ``torch.autograd.gradcheck`` of :math:`x` and :math:`\Theta` (its factors, for
    a :class:`~structconv.Separable` or :class:`~structconv.LowRank` one) must pass through every
    order.  Afterwards the basis must hold what it held before (:func:`snapshot`): the same
    arrays, unchanged, and no other state.

    Parameters
    ----------
    basis
        The basis under test.
    reference
        What the basis should be: ``(K, M, N)`` (or ``(B, K, M, N)``), any backend or NumPy,
        entry ``[k, m, n]`` carrying input ``m`` to output ``n`` in member ``k``.
    x, theta
        The operands; drawn by :func:`random_operands` (``seed``) on the basis' backend, device
        and dtype when not given.
    dense
        The basis' own dense form, if known without :meth:`~structconv.Basis.to_dense` (a basis
        too large to form twice): the orders are held to it, and nothing is said of meaning.
    rtol, atol
        Tolerances of :math:`|y - y_{\mathrm{ref}}| \le \mathrm{atol} + \mathrm{rtol}\,|y_{\mathrm{ref}}|`;
        by default from the dtype of ``x`` (float64: ``1e-10`` and ``1e-10``).
    gradients
        Whether to run ``gradcheck`` (torch and float64 only).
    fast
        ``gradcheck``'s fast mode: random projections of the Jacobians instead of every entry,
        for operands too large to differentiate entry by entry.
    seed
        Seed of the random operands.

    Returns
    -------
    list of str
        The orders checked, ``"auto"`` last.

    Raises
    ------
    AssertionError
        Naming how the basis differs from ``reference``, or the order and the largest
        difference, the gradcheck that failed, or the attribute of the basis that changed.

    Examples
    --------
    A mean over each node's in-neighbours, checked against the adjacency divided by in-degree;
    normalised by out-degree, the same pattern is told apart:

    >>> import torch
    >>> from structconv import SparseBasis
    >>> from structconv.testing import check_basis
    >>> A = torch.tensor([[0, 1, 1], [0, 0, 1], [1, 0, 0]], dtype=torch.float64)
    >>> mean = A / A.sum(0)  # column n averages the inputs of node n
    >>> check_basis(SparseBasis.from_dense(mean[None]), reference=mean[None])
    ['ax', 'xtheta', 'atheta', 'auto']
    >>> out_mean = A / A.sum(1, keepdim=True)  # row m averages the outputs of node m
    >>> wrong = SparseBasis.from_dense(out_mean[None])
    >>> check_basis(wrong, reference=mean[None])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: the basis does not mean the reference: ... instead of in-degree
    """
    if not isinstance(basis, Basis):
        raise TypeError(
            f"check_basis: basis must be a structconv Basis, got {type(basis).__name__}; a dense (K, M, N) array is "
            "a reference (check_basis(built, reference=array)), or wrap it: structconv.as_basis(array)"
        )
    before = snapshot(basis)
    if reference is not None:
        near = tolerances(basis.dtype, rtol, atol)
        found = basis_diagnosis(as_float64(basis.to_dense()), as_float64(reference), rtol=near[0], atol=near[1])
        if found:
            raise AssertionError("the basis does not mean the reference: " + "; ".join(found))
        dense = reference
    if x is None or theta is None:
        drawn_x, drawn_theta = random_operands(basis, seed=seed)
        x = drawn_x if x is None else x
        theta = drawn_theta if theta is None else theta
    rtol, atol = tolerances(x.dtype, rtol, atol)
    parts, rebuild = _factors(theta)
    expected = dense_reference(
        as_float64(basis.to_dense() if dense is None else dense), as_float64(x), rebuild(*map(as_float64, parts))
    )
    orders = [c.order for c in explain(basis, x, theta).candidates] + ["auto"]
    for order in orders:
        y = conv(basis, x, theta, order=order)
        got, want = (type(y), device_of(y), dtype_name(y.dtype)), (type(x), device_of(x), dtype_name(x.dtype))
        if got != want:
            raise AssertionError(f"order {order!r}: returned a {got} for x, a {want}")
        assert_near(y, expected, rtol=rtol, atol=atol, what=f"order {order!r} against dense_reference")
    if gradients and basis.backend == "torch" and dtype_name(basis.dtype) == "float64":
        for order in orders:
            _gradcheck(basis, x, theta, order, fast)
    assert_unchanged(before, snapshot(basis))
    return orders


__all__ = ["assert_unchanged", "check_basis", "random_operands", "snapshot"]
