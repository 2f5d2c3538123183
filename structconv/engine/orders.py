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
  orders the basis runs its own way (:meth:`~structconv.Basis.own_orders`, each an
  :class:`~structconv.bases.base.OwnOrder` holding its cost and its run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from ..backend import Array, einsum, einsum_path, of, x_theta
from ..bases.base import Basis, Cost, OwnOrder
from .operands import CONV_WEIGHT, FULL, LOWRANK, SEPARABLE, Kind, Param, Shaped

#: The triangle's orders for a full parameter, and for a factorised one.
BASE_ORDERS = ("ax", "xtheta", "atheta")
FACTOR_ORDERS = ("ax", "xtheta", "ax+full", "xtheta+full", "atheta")


def _gemm(*dims: int) -> float:
    return 2.0 * float(math.prod(dims))


def rows_to_image(x: Array, shape: tuple[int, ...]) -> Array:
    """``(B, M, P)`` -> ``(B, P, *shape)`` (the ``"channels_first"`` layout, :attr:`~structconv.Basis.entry_shapes`)."""
    xp = of(x).namespace()
    return xp.reshape(xp.permute_dims(x, (0, 2, 1)), (int(x.shape[0]), int(x.shape[2]), *shape))


def image_to_rows(y: Array) -> Array:
    """``(B, Q, *shape)`` -> ``(B, N, Q)``: the inverse of :func:`rows_to_image`."""
    xp = of(y).namespace()
    return xp.permute_dims(xp.reshape(y, (int(y.shape[0]), int(y.shape[1]), -1)), (0, 2, 1))


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

    def run_image(self, basis: Basis, x: Array, prm: Param, bias: Array | None) -> Array:
        """:meth:`run` on the ``"channels_first"`` layout (``(B, P, *in)`` to ``(B, Q, *out)``), plus ``bias``."""
        out_shape = basis.entry_shapes[1]
        B, P = int(x.shape[0]), int(x.shape[1])
        xp = of(x).namespace()
        y = self.run(basis, xp.permute_dims(xp.reshape(x, (B, P, -1)), (0, 2, 1)), prm)
        if bias is not None:
            y = y + bias
        return xp.reshape(xp.permute_dims(y, (0, 2, 1)), (B, int(y.shape[2]), *out_shape))

    def bind_image(self, basis: Basis, prm: Param) -> Callable[[Array, Param, Array | None], Array]:
        """:meth:`run_image` for ``basis`` and parameters shaped like ``prm``: ``run(x, prm, bias)``.

        What a compiled contraction keeps (:func:`structconv.contraction`); an order whose run
        has per-call arithmetic of its own does it here, once.
        """
        return lambda x, p, bias: self.run_image(basis, x, p, bias)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


# --- a full parameter, through the hooks ------------------------------------------------------
class _FullOrder(Order):
    """A triangle order for a full :math:`\\Theta` through the hooks (``"atheta"``: the combined hook)."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        return basis.cost_combined(batch, prm.P, prm.Q)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        return basis.apply_combined(x, prm.operands[0])


class _FullAx(_FullOrder):
    """A·x first: :math:`R = A^\\top x` (:meth:`~structconv.Basis.apply_each`), then one GEMM over :math:`(k, p)`."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        B, K, N, P, Q = batch, basis.K, basis.N, prm.P, prm.Q
        return basis.cost_each(B, P) + Cost(_gemm(B, N, K, P, Q), float(B * K * N * P + B * N * Q))

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        return einsum("bknp,kpq->bnq", basis.apply_each(x), prm.operands[0])


class _FullXTheta(_FullOrder):
    """x·Θ first: :math:`S_k = x\\Theta_k` (one GEMM), then :math:`\\sum_k A_k^\\top S_k` (the members' hook)."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        B, K, M, P, Q = batch, basis.K, basis.M, prm.P, prm.Q
        return Cost(_gemm(B, M, P, K, Q), 2.0 * B * K * M * Q) + basis.cost_members(B, Q, reduce=True)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        return basis.apply_members(x_theta(x, prm.operands[0]), reduce=True)


# --- a factorised parameter, through the hooks ------------------------------------------------
class _FormFull(Order):
    """Form :math:`\\Theta` from its factors, then run the full order ``inner``."""

    __slots__ = ("inner",)

    def __init__(self, name: str, inner: Order) -> None:
        super().__init__(name)
        self.inner = inner

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        full = Param(FULL, (Shaped((prm.K, prm.P, prm.Q)),), prm.K, prm.P, prm.Q, 0)
        return self.inner.cost(basis, batch, full) + prm.full_cost()

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        return self.inner.run(basis, x, prm.full())


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
        return mix + basis.cost_members(B, Q, reduce=True)

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
        return heads + basis.cost_members(B, R, reduce=False)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        value, out = prm.operands
        heads = basis.apply_members(einsum("bmp,kpd->bkmd", x, value), reduce=False)
        return einsum("bknd,kqd->bnq", heads, out)


# --- a basis' own orders ------------------------------------------------------------------------
class _Own(Order):
    """An order the basis runs its own way (:meth:`~structconv.Basis.own_orders`), for a full :math:`\\Theta`."""

    __slots__ = ("own",)

    def __init__(self, name: str, own: OwnOrder) -> None:
        super().__init__(name)
        self.own = own

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        return self.own.cost(basis, batch, prm.P, prm.Q)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        return self.own.run(basis, x, prm.operands[0])


class _Factored(_Own):
    r"""An own order that keeps :math:`\Theta_k = V_k O_k^\top` as its two factors."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        assert self.own.cost_factored is not None  # chosen only when the order has both
        return self.own.cost_factored(basis, batch, prm.P, prm.Q, prm.R)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        assert self.own.run_factored is not None
        return self.own.run_factored(basis, x, *prm.operands)


class _OwnImage(_Own):
    r"""An own order that takes a :class:`~structconv.ConvWeight` as stored, on the entries' own layout."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        full = self.own.cost(basis, batch, prm.P, prm.Q)  # G blocks: 1/G of the full map's products
        return Cost(full.flops / prm.R, full.memory, full.irregular / prm.R)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        return image_to_rows(self.run_image(basis, rows_to_image(x, basis.entry_shapes[0]), prm, None))

    def run_image(self, basis: Basis, x: Array, prm: Param, bias: Array | None) -> Array:
        assert self.own.run_image is not None  # chosen only when the order has it
        return self.own.run_image(basis, x, prm.operands[0], prm.R, bias)

    def bind_image(self, basis: Basis, prm: Param) -> Callable[[Array, Param, Array | None], Array]:
        if self.own.bind_image is None:
            return super().bind_image(basis, prm)
        run = self.own.bind_image(basis, prm.R)
        return lambda x, p, bias: run(x, p.operands[0], bias)


_FULL_ORDERS: dict[str, Order] = {"ax": _FullAx("ax"), "xtheta": _FullXTheta("xtheta"), "atheta": _FullOrder("atheta")}
_HOOK_ORDERS: dict[Kind, dict[str, Order]] = {
    FULL: _FULL_ORDERS,
    SEPARABLE: {"ax": _SeparableAx("ax"), "xtheta": _SeparableXTheta("xtheta")},
    LOWRANK: {"ax": _LowRankAx("ax"), "xtheta": _LowRankXTheta("xtheta")},
}
#: The factorised orders that form :math:`\Theta` first, and the full order each then runs.
_FORM_FULL = {"ax+full": "ax", "xtheta+full": "xtheta", "atheta": "atheta"}
for _kind in (SEPARABLE, LOWRANK):
    for _key, _name in _FORM_FULL.items():
        _HOOK_ORDERS[_kind][_key] = _FormFull(_key, _FULL_ORDERS[_name])


def _full_order(name: str, own: Mapping[str, OwnOrder]) -> Order:
    """The order ``name`` for a full :math:`\\Theta`: the basis' own run of it, else the hooks'."""
    found = own.get(name)
    return _FULL_ORDERS[name] if found is None else _Own(name, found)


def _hook_order(kind: Kind, name: str, own: Mapping[str, OwnOrder]) -> Order:
    if kind is FULL:
        return _full_order(name, own)
    found = own.get(name)
    if kind is CONV_WEIGHT:  # the weight as stored where the order takes it, else Θ formed first
        if found is not None and found.run_image is not None:
            return _OwnImage(name, found)
        return _FormFull(name, _full_order(name, own))
    if kind is LOWRANK and found is not None and found.run_factored is not None:
        return _Factored(name, found)
    if name in ("ax", "xtheta"):  # the factors kept, through the hooks
        return _HOOK_ORDERS[kind][name]
    # Θ formed first, then a full order: the shared one, or one holding the basis' own run.
    inner = _FORM_FULL.get(name, name)
    return _FormFull(name, _full_order(inner, own)) if inner in own else _HOOK_ORDERS[kind][name]


# --- dense bases: one opt_einsum contraction --------------------------------------------------
#: Explicit opt_einsum paths: operands are (A, x, Θ) or (A, x, F1, F2).
DENSE_PATHS: dict[Kind, dict[str, tuple[tuple[int, ...], ...]]] = {
    FULL: {"ax": ((0, 1), (0, 1)), "xtheta": ((1, 2), (0, 1)), "atheta": ((0, 2), (0, 1))},
    SEPARABLE: {
        "ax": ((0, 1), (0, 2), (0, 1)),
        "xtheta": ((1, 3), (1, 2), (0, 1)),
        "ax+full": ((2, 3), (0, 1), (0, 1)),
        "xtheta+full": ((2, 3), (1, 2), (0, 1)),
        "atheta": ((2, 3), (0, 2), (0, 1)),
    },
    LOWRANK: {
        "ax": ((0, 1), (0, 2), (0, 1)),
        "xtheta": ((1, 2), (0, 2), (0, 1)),
        "ax+full": ((2, 3), (0, 1), (0, 1)),
        "xtheta+full": ((2, 3), (1, 2), (0, 1)),
        "atheta": ((2, 3), (0, 2), (0, 1)),
    },
}


def dense_equation(batched: bool, kind: Kind) -> str:
    """The einsum equation of a dense basis (``batched``: per instance) and a ``kind`` of parameter."""
    return f"{'bkmn' if batched else 'kmn'},bmp,{kind.subscripts}->bnq"


def _path_cost(eq: str, shapes: tuple[tuple[int, ...], ...], path: tuple[tuple[int, ...], ...]) -> Cost:
    _, flops, memory = einsum_path(eq, shapes, path)
    return Cost(flops, memory)


class DenseOrder(Order):
    """An order for a dense basis: opt_einsum along the order's explicit path, costed by its ``PathInfo``."""

    __slots__ = ("equation", "kind", "path")

    def __init__(self, name: str, kind: Kind, batched: bool) -> None:
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
        if self.kind is FULL:
            y = of(a).dense_gemms(self.name, a, x, prm.operands[0])
        elif self.kind is LOWRANK and self.name == "xtheta":
            y = of(a).dense_gemms_lowrank(a, x, *prm.operands)
        return einsum(self.equation, a, x, *prm.operands, path=self.path) if y is None else y


_DENSE_ORDERS = {
    (kind, batched): {name: DenseOrder(name, kind, batched) for name in DENSE_PATHS[kind]}
    for kind in DENSE_PATHS
    for batched in (False, True)
}


def names(kind: Kind, basis: Basis) -> tuple[str, ...]:
    """The orders open to ``basis`` with a ``kind`` of parameter, in the order :func:`explain` lists them."""
    beyond = tuple(name for name in basis.own_orders() if name not in BASE_ORDERS)
    return (FACTOR_ORDERS if kind.factored else BASE_ORDERS) + beyond


def orders_for(kind: Kind, basis: Basis, dense: bool) -> tuple[Order, ...]:
    """The :class:`Order` objects of :func:`names`; ``dense`` selects the opt_einsum family."""
    if dense:
        if kind is CONV_WEIGHT:  # Θ formed first (a view for one group), then the full einsum
            full = _DENSE_ORDERS[FULL, basis.batch is not None]
            return tuple(_FormFull(name, full[name]) for name in names(kind, basis))
        table = _DENSE_ORDERS[kind, basis.batch is not None]
        return tuple(table[name] for name in names(kind, basis))
    own = basis.own_orders()
    return tuple(_hook_order(kind, name, own) for name in names(kind, basis))


__all__ = [
    "BASE_ORDERS",
    "DENSE_PATHS",
    "FACTOR_ORDERS",
    "DenseOrder",
    "Order",
    "dense_equation",
    "image_to_rows",
    "names",
    "orders_for",
    "rows_to_image",
]
