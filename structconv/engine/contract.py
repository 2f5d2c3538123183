r"""The one contraction engine: :math:`y_b = \sum_k A_k^\top x_b \Theta_k`.

Three orders compute the same result (the triangle of Andreoli's Fig. 1):

``"ax"``
    A·x first: :math:`R_{bknp} = \sum_m A_{kmn} x_{bmp}`, then one GEMM over :math:`(k, p)`.
``"xtheta"``
    x·Θ first: :math:`S_{bkmq} = \sum_p x_{bmp}\Theta_{kpq}` (one GEMM), then
    :math:`\sum_k A_k^\top S_{bk}`.
``"atheta"``
    A·Θ first: :math:`\Phi = \sum_k A_k\otimes\Theta_k` of shape ``(M, N, P, Q)``, then
    :math:`y_{bnq} = \sum_{m,p} x_{bmp}\Phi_{mnpq}` (small structures only).

With a factorised parameter (:class:`~structconv.Separable`, :class:`~structconv.LowRank`),
``"ax"`` and ``"xtheta"`` keep the factors and ``"ax+full"`` / ``"xtheta+full"`` form the full
:math:`\Theta` first.

Dense bases are contracted by opt_einsum along the explicit path of each order (its
``PathInfo`` supplies the cost); other representations run through their hooks and report
their own (nnz-based) costs.  Each order's cost and run stand together in
:mod:`structconv.engine.orders`.  ``order="auto"`` picks the order of least estimated cost
(:class:`~structconv.engine.plan.Candidate`); plans are kept in :data:`PLANS`, keyed by shapes
and the basis' plan key, so repeated calls do not re-plan.
"""

from __future__ import annotations

from ..backend import Array, load
from ..backend.cache import BoundedCache
from ..backend.checks import check_memory
from ..bases.base import Basis
from ..bases.dense import DenseBasis
from ..bases.factor import Theta
from .operands import Param, autocast, placed, prepare
from .orders import DenseOrder, Order, orders_for
from .plan import MEMORY_WEIGHT, SPARSE_FLOP_WEIGHT, Candidate, Plan

PLANS: BoundedCache[tuple[Plan, Order]] = BoundedCache(size=2048)
"""The plans made so far and the order each runs (call ``PLANS.clear()`` after changing a weight)."""


def _plan(basis: Basis, x: Array, prm: Param, order: str) -> tuple[Plan, Order]:
    if not isinstance(order, str):
        raise TypeError(f"order must be a string such as 'auto' or 'ax', got {type(order).__name__}: {order!r}")
    B = int(x.shape[0])
    traced = load(basis.backend).traced()  # x may be a shape (a compiled contraction plans before it runs)
    key = (basis.plan_key(), B, prm.kind.name, prm.P, prm.Q, prm.R, order, traced)
    return PLANS.find(key) or PLANS.put(key, _new_plan(basis, B, prm, order, traced))


def _new_plan(basis: Basis, B: int, prm: Param, order: str, traced: bool) -> tuple[Plan, Order]:
    dense = isinstance(basis, DenseBasis)
    orders = orders_for(prm.kind, basis, dense)
    if traced:  # torch.compile: the orders that read the basis on the host cannot be traced
        if order in basis.host_orders:
            raise ValueError(
                f"order={order!r} reads the {basis.representation} basis' entries on the host, which torch.compile "
                "cannot trace; pass order='auto' or another order"
            )
        orders = tuple(o for o in orders if o.name not in basis.host_orders)
    valid = tuple(o.name for o in orders)
    if order != "auto" and order not in valid:
        raise ValueError(
            f"order={order!r} is not valid for a {prm.kind} parameter and a {basis.representation} basis "
            f"on {basis.backend}; expected one of {('auto',) + valid}"
        )
    sizes = {"B": B, "K": basis.K, "M": basis.M, "N": basis.N, "P": prm.P, "Q": prm.Q}
    if prm.kind.rank_name is not None:
        sizes[prm.kind.rank_name] = prm.R
    candidates = []
    for o in orders:
        cost = o.cost(basis, B, prm)
        candidates.append(Candidate(o.name, cost.flops, cost.memory, cost.irregular))
    # The first cheapest, as min(key=) would pick it (which torch.compile cannot trace without a break).
    scores = [c.score for c in candidates]
    chosen = order if order != "auto" else candidates[scores.index(min(scores))].order
    equation = orders[0].equation if isinstance(orders[0], DenseOrder) else ""
    made = basis.cost_build()
    built = made.flops or made.memory or made.irregular
    build = Candidate("build", made.flops, made.memory, made.irregular) if built else None
    plan = Plan(basis.representation, sizes, prm.kind.name, tuple(candidates), chosen, order, equation, build)
    return plan, orders[valid.index(chosen)]


def _check_memory(plan: Plan, x: Array) -> None:
    """Refuse a requested order whose intermediates cannot fit on ``x``'s device, before allocating any.

    ``auto`` never needs this (it picks the cheapest order); a forced order can ask for a dense
    :math:`(K, M, N)` basis that the answer does not need.
    """
    size = x.dtype.itemsize
    best = sorted(plan.candidates, key=lambda c: c.memory)[0]  # sorted(key=) traces; min(key=) does not
    check_memory(
        plan.candidate(plan.chosen).memory * size,
        x,
        f"order={plan.chosen!r}'s intermediates",
        advice=f"order {best.order!r} needs {best.memory * size / 2**30:.3g} GiB (or pass order='auto')",
    )


def explain(a: Basis | Array, x: Array, theta: Theta, order: str = "auto") -> Plan:
    """Report the cost of every order for these operands and the one :func:`conv` would run.

    Parameters
    ----------
    a, x, theta, order
        As :func:`conv`'s.

    Returns
    -------
    Plan
        Every candidate order with its estimated cost, and the chosen one; ``print(plan)``
        shows the table.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import explain
    >>> plan = explain(np.ones((9, 64, 64)), np.ones((8, 64, 3)), np.ones((9, 3, 16)))
    >>> plan.chosen in ("ax", "xtheta", "atheta")
    True
    """
    basis, x3, prm, _ = prepare(a, x, theta)
    return _plan(basis, x3, prm, order)[0]


def conv(a: Basis | Array, x: Array, theta: Theta, order: str = "auto") -> Array:
    r"""Compute :math:`y_b = \sum_k A_k^\top x_b \Theta_k` (Andreoli, Prop. 2, batched).

    Parameters
    ----------
    a
        The basis: a :class:`~structconv.Basis`, or a dense array of shape ``(K, M, N)`` or
        ``(B, K, M, N)``.
    x
        Input of shape ``(B, M, P)`` or ``(M, P)``.
    theta
        Parameter of shape ``(K, P, Q)``, or a :class:`~structconv.Separable` /
        :class:`~structconv.LowRank` factorisation of it.
    order
        ``"auto"`` (least estimated cost), ``"ax"``, ``"xtheta"``, ``"atheta"``, and for
        factorised parameters also ``"ax+full"`` and ``"xtheta+full"``.  See
        :func:`explain`.

    Returns
    -------
    Array
        ``y`` of shape ``(B, N, Q)`` (or ``(N, Q)`` for 2-D ``x``), on the backend of ``x``.

    Raises
    ------
    ValueError, TypeError
        On mismatched shapes, ranks, backends, dtypes or devices, empty dimensions or an
        unknown ``order``; the message names the argument.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import conv
    >>> rng = np.random.default_rng(0)
    >>> A, x, theta = rng.random((4, 5, 6)), rng.random((2, 5, 3)), rng.random((4, 3, 7))
    >>> y = conv(A, x, theta)
    >>> bool(np.allclose(y, np.einsum("kmn,bmp,kpq->bnq", A, x, theta)))
    True
    """
    a, x, theta = autocast(placed(a, x), x, theta)  # placed first: autocast reads the basis' dtype
    basis, x3, prm, squeeze = prepare(a, x, theta)
    plan, run = _plan(basis, x3, prm, order)
    if order != "auto":
        _check_memory(plan, x3)
    y = run.run(basis, x3, prm)
    return y[0] if squeeze else y


__all__ = ["MEMORY_WEIGHT", "PLANS", "SPARSE_FLOP_WEIGHT", "Candidate", "Plan", "conv", "explain"]
