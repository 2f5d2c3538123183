r"""The orders of the contraction :math:`y_b = \sum_k A_k^\top x_b \Theta_k`, each with its cost beside its run.

An :class:`Order` estimates its work (:meth:`Order.cost`, a :class:`~structconv.Cost`) and
runs (:meth:`Order.run`); :func:`orders_for` lists the orders open to a basis and a parameter
kind.  Two families:

* dense bases (:class:`DenseOrder`): one opt_einsum contraction along an explicit path,
  costed by opt_einsum's ``PathInfo``; the backend may run ``"ax"``/``"xtheta"`` as plain GEMMs
  (:meth:`~structconv.backend.interface.Backend.dense_gemms`);
* every other representation: the triangle run through the basis' hooks
  (:meth:`~structconv.Basis.apply_each`, :meth:`~structconv.Basis.apply_members`,
  :meth:`~structconv.Basis.apply_combined`) and costed by their ``cost_*`` twins, plus the
  basis' own orders (:meth:`~structconv.Basis.special_orders`).
"""

from __future__ import annotations

import math
from functools import lru_cache

import opt_einsum

from ..backend import Array, einsum, of, x_theta
from ..bases.base import Basis, Cost
from .operands import Param

#: The triangle's orders for a full parameter, and for a factorised one.
BASE_ORDERS = ("ax", "xtheta", "atheta")
FACTOR_ORDERS = ("ax", "xtheta", "ax+full", "xtheta+full", "atheta")

_FULL_SUBSCRIPTS = {"separable": "hk,hpq->kpq", "lowrank": "kpd,kqd->kpq"}


def _gemm(*dims: int) -> float:
    return 2.0 * float(math.prod(dims))


def _full(prm: Param) -> Param:
    r"""The parameter with :math:`\Theta` formed from its factors."""
    full = einsum(_FULL_SUBSCRIPTS[prm.kind], *prm.operands)
    return Param("full", (full,), prm.K, prm.P, prm.Q, 0)


def _full_cost(prm: Param) -> Cost:
    return Cost(_gemm(prm.K, prm.P, prm.Q, prm.R), float(prm.K * prm.P * prm.Q))


class Order:
    """One way to contract: its name, its estimated cost and its run, side by side."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        """The estimated work of :meth:`run` on ``batch`` instances."""
        raise NotImplementedError

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        """:math:`y` of shape ``(B, N, Q)`` for ``x`` of shape ``(B, M, P)``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


# --- a full parameter, through the hooks ------------------------------------------------------
class _FullOrder(Order):
    """A triangle order for a full :math:`\\Theta`; a basis may run (and cost) it its own way first."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        own = basis.cost_order(self.name, batch, prm.P, prm.Q)
        return own if own is not None else self.hooks_cost(basis, batch, prm)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        (theta,) = prm.operands
        own = basis.run_order(self.name, x, theta)
        return own if own is not None else self.hooks_run(basis, x, theta)

    def hooks_cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        """The cost when the hooks run it."""
        return basis.cost_combined(batch, prm.P, prm.Q)

    def hooks_run(self, basis: Basis, x: Array, theta: Array) -> Array:
        """The run through the hooks (A·Θ first: :meth:`~structconv.Basis.apply_combined`)."""
        return basis.apply_combined(x, theta)


class _FullAx(_FullOrder):
    """A·x first: :math:`R = A^\\top x` (:meth:`~structconv.Basis.apply_each`), then one GEMM over :math:`(k, p)`."""

    __slots__ = ()

    def hooks_cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        B, K, N, P, Q = batch, basis.K, basis.N, prm.P, prm.Q
        return basis.cost_each(B, P) + Cost(_gemm(B, N, K, P, Q), float(B * K * N * P + B * N * Q))

    def hooks_run(self, basis: Basis, x: Array, theta: Array) -> Array:
        return einsum("bknp,kpq->bnq", basis.apply_each(x), theta)


class _FullXTheta(_FullOrder):
    """x·Θ first: :math:`S_k = x\\Theta_k` (one GEMM), then :math:`\\sum_k A_k^\\top S_k` (the members' hook)."""

    __slots__ = ()

    def hooks_cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        B, K, M, P, Q = batch, basis.K, basis.M, prm.P, prm.Q
        return Cost(_gemm(B, M, P, K, Q), 2.0 * B * K * M * Q) + basis.cost_members(B, Q, True)

    def hooks_run(self, basis: Basis, x: Array, theta: Array) -> Array:
        return basis.apply_members(x_theta(x, theta), reduce=True)


# --- a factorised parameter, through the hooks ------------------------------------------------
class _FormFull(Order):
    """Form :math:`\\Theta` from its factors, then run the full order ``inner``."""

    __slots__ = ("inner",)

    def __init__(self, name: str, inner: Order) -> None:
        super().__init__(name)
        self.inner = inner

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        full = Param("full", (), prm.K, prm.P, prm.Q, 0)
        return self.inner.cost(basis, batch, full) + _full_cost(prm)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        return self.inner.run(basis, x, _full(prm))


class _SeparableAx(Order):
    """Apply the members, mix them into :math:`H` channel maps by :math:`c`, then one GEMM per map."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        B, K, N, P, Q, R = batch, basis.K, basis.N, prm.P, prm.Q, prm.R
        mix = Cost(_gemm(B, K, N, P, R) + _gemm(B, N, R, P, Q), float(B * R * N * P + B * N * Q))
        return basis.cost_each(B, P) + mix

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        coef, channel = prm.operands
        return einsum("bhnp,hpq->bnq", einsum("hk,bknp->bhnp", coef, basis.apply_each(x)), channel)


class _SeparableXTheta(Order):
    """:math:`H` channel maps of ``x``, mixed into :math:`K` slices by :math:`c`, then the members summed."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        B, K, M, P, Q, R = batch, basis.K, basis.M, prm.P, prm.Q, prm.R
        mix = Cost(_gemm(B, M, P, R, Q) + _gemm(B, M, R, K, Q), float(B * M * R * Q + B * K * M * Q))
        return mix + basis.cost_members(B, Q, True)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        coef, channel = prm.operands
        mixed = einsum("hk,bhmq->bkmq", coef, einsum("bmp,hpq->bhmq", x, channel))
        return basis.apply_members(mixed, reduce=True)


class _LowRankAx(Order):
    """Apply the members, then :math:`V_k` and :math:`O_k^\\top` per member (heads of width :math:`D`)."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        B, K, N, P, Q, R = batch, basis.K, basis.N, prm.P, prm.Q, prm.R
        heads = Cost(_gemm(B, K, N, P, R) + _gemm(B, N, K, R, Q), float(B * K * N * R + B * N * Q))
        return basis.cost_each(B, P) + heads

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        value, out = prm.operands
        return einsum("bknd,kqd->bnq", einsum("bknp,kpd->bknd", basis.apply_each(x), value), out)


class _LowRankXTheta(Order):
    """Values :math:`x V_k` first, each member on its own head, then :math:`O_k^\\top` per head."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        B, K, M, N, P, Q, R = batch, basis.K, basis.M, basis.N, prm.P, prm.Q, prm.R
        heads = Cost(_gemm(B, M, P, K, R) + _gemm(B, N, K, R, Q), float(B * M * K * R + B * N * Q))
        return heads + basis.cost_members(B, R, False)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        value, out = prm.operands
        heads = basis.apply_members(einsum("bmp,kpd->bkmd", x, value), reduce=False)
        return einsum("bknd,kqd->bnq", heads, out)


# --- a basis' own orders ------------------------------------------------------------------------
class _Special(_FullOrder):
    """An order a representation offers beyond the triangle (:meth:`~structconv.Basis.special_orders`)."""

    __slots__ = ()


class _Factored(Order):
    r"""A basis' own order that keeps :math:`\Theta_k = V_k O_k^\top` as its two factors."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        return basis.cost_factored(self.name, batch, prm.P, prm.Q, prm.R)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        return basis.run_factored(self.name, x, *prm.operands)


_FULL_ORDERS: dict[str, Order] = {"ax": _FullAx("ax"), "xtheta": _FullXTheta("xtheta"), "atheta": _FullOrder("atheta")}
_HOOK_ORDERS: dict[str, dict[str, Order]] = {
    "full": _FULL_ORDERS,
    "separable": {"ax": _SeparableAx("ax"), "xtheta": _SeparableXTheta("xtheta")},
    "lowrank": {"ax": _LowRankAx("ax"), "xtheta": _LowRankXTheta("xtheta")},
}
for _kind in ("separable", "lowrank"):
    for _name in ("ax", "xtheta", "atheta"):
        _key = _name if _name == "atheta" else f"{_name}+full"
        _HOOK_ORDERS[_kind][_key] = _FormFull(_key, _FULL_ORDERS[_name])


def _hook_order(kind: str, name: str, basis: Basis) -> Order:
    if kind == "lowrank" and name in basis.factor_orders():
        return _Factored(name)
    found = _HOOK_ORDERS[kind].get(name)
    if found is not None:
        return found
    special = _Special(name)
    return special if kind == "full" else _FormFull(name, special)


# --- dense bases: one opt_einsum contraction --------------------------------------------------
#: Explicit opt_einsum paths: operands are (A, x, Θ) or (A, x, F1, F2).
DENSE_PATHS: dict[str, dict[str, tuple[tuple[int, ...], ...]]] = {
    "full": {"ax": ((0, 1), (0, 1)), "xtheta": ((1, 2), (0, 1)), "atheta": ((0, 2), (0, 1))},
    "separable": {
        "ax": ((0, 1), (0, 2), (0, 1)),
        "xtheta": ((1, 3), (1, 2), (0, 1)),
        "ax+full": ((2, 3), (0, 1), (0, 1)),
        "xtheta+full": ((2, 3), (1, 2), (0, 1)),
        "atheta": ((2, 3), (0, 2), (0, 1)),
    },
    "lowrank": {
        "ax": ((0, 1), (0, 2), (0, 1)),
        "xtheta": ((1, 2), (0, 2), (0, 1)),
        "ax+full": ((2, 3), (0, 1), (0, 1)),
        "xtheta+full": ((2, 3), (1, 2), (0, 1)),
        "atheta": ((2, 3), (0, 2), (0, 1)),
    },
}
_PARAM_SUBSCRIPTS = {"full": "kpq", "separable": "hk,hpq", "lowrank": "kpd,kqd"}


def dense_equation(batched: bool, kind: str) -> str:
    """The einsum equation of a dense basis (``batched``: per instance) and a ``kind`` of parameter."""
    return f"{'bkmn' if batched else 'kmn'},bmp,{_PARAM_SUBSCRIPTS[kind]}->bnq"


@lru_cache(maxsize=4096)
def _path_cost(eq: str, shapes: tuple[tuple[int, ...], ...], path: tuple[tuple[int, ...], ...]) -> Cost:
    _, info = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=[tuple(p) for p in path])
    return Cost(float(info.opt_cost), float(sum(info.size_list)))


class DenseOrder(Order):
    """An order for a dense basis: opt_einsum along the order's explicit path, costed by its ``PathInfo``."""

    __slots__ = ("equation", "kind", "path")

    def __init__(self, name: str, kind: str, batched: bool) -> None:
        super().__init__(name)
        self.kind = kind
        self.equation = dense_equation(batched, kind)
        self.path = DENSE_PATHS[kind][name]

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        shapes = (basis.shape, (batch, basis.M, prm.P)) + tuple(tuple(int(s) for s in op.shape) for op in prm.operands)
        return _path_cost(self.equation, shapes, self.path)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        a = basis.to_dense()
        y = None
        if self.kind == "full":
            y = of(a).dense_gemms(self.name, a, x, prm.operands[0])
        elif self.kind == "lowrank" and self.name == "xtheta":
            y = of(a).dense_gemms_lowrank(a, x, *prm.operands)
        return einsum(self.equation, a, x, *prm.operands, path=self.path) if y is None else y


_DENSE_ORDERS = {
    (kind, batched): {name: DenseOrder(name, kind, batched) for name in DENSE_PATHS[kind]}
    for kind in DENSE_PATHS
    for batched in (False, True)
}


def names(kind: str, basis: Basis) -> tuple[str, ...]:
    """The orders open to ``basis`` with a ``kind`` of parameter, in the order :func:`explain` lists them."""
    return (BASE_ORDERS if kind == "full" else FACTOR_ORDERS) + basis.special_orders()


def orders_for(kind: str, basis: Basis, dense: bool) -> tuple[Order, ...]:
    """The :class:`Order` objects of :func:`names`; ``dense`` selects the opt_einsum family."""
    if dense:
        table = _DENSE_ORDERS[kind, basis.batch is not None]
        return tuple(table[name] for name in names(kind, basis))
    return tuple(_hook_order(kind, name, basis) for name in names(kind, basis))


__all__ = [
    "BASE_ORDERS",
    "DENSE_PATHS",
    "FACTOR_ORDERS",
    "DenseOrder",
    "Order",
    "dense_equation",
    "names",
    "orders_for",
]
