r"""The kinds of :math:`\Theta` held in another form than one array, each with the orders that keep its form.

Each kind is one :class:`~structconv.engine.orders.Kind` subclass: how the user's object is read
and rebuilt, its full form and shape, its dense paths, and which order runs each name.  Where a
kind has no order of its own for a name, it forms :math:`\Theta` and runs the full kind's
(:data:`~structconv.engine.orders.FULL`).

* :data:`SEPARABLE` (:class:`~structconv.Separable`): ``"ax"`` and ``"xtheta"`` mix the
  :math:`H` channel maps through the hooks;
* :data:`LOWRANK` (:class:`~structconv.LowRank`): ``"ax"`` and ``"xtheta"`` run
  :math:`D`-wide heads through the hooks, and a basis' own order that takes the two factors
  (:attr:`~structconv.bases.base.OwnOrder.run_factored`) gets them;
* :data:`CONV_WEIGHT` (:class:`~structconv.ConvWeight`): a basis' own order that takes the
  weight as stored (:attr:`~structconv.bases.base.OwnOrder.run_image`) gets it; every other
  order forms :math:`\Theta` (a view for one group);
* :data:`AGGREGATION` (:class:`~structconv.Aggregation`): ``"ax"`` and ``"xtheta"`` scale and
  sum the members through the hooks, no channel map formed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ..backend import Array, einsum, of
from ..bases.base import Basis, Cost, OwnOrder
from ..bases.conv_weight import ConvWeight, conv_weight_full
from ..bases.factor import Aggregation, LowRank, Separable, aggregation_full
from .orders import Kind, Order, Param, Path, Shape, _gemm, _Own, image_to_rows, kind_of, rows_to_image

#: The dense paths of a factorised parameter's orders: the operands are (A, x, F1, F2).
_FORM_FIRST: Mapping[str, Path] = {
    "ax+full": ((2, 3), (0, 1), (0, 1)),
    "xtheta+full": ((2, 3), (1, 2), (0, 1)),
    "atheta": ((2, 3), (0, 2), (0, 1)),
}


# --- separable: Θ_k = Σ_h c_hk C_h ---------------------------------------------------------------
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


class _Separable(Kind):
    """:class:`~structconv.Separable`: the factors kept through the hooks for ``"ax"`` and ``"xtheta"``."""

    name, operand_names, rank_name = "separable", ("theta.basis_coef", "theta.channel"), "H"
    subscripts, factored = "hk,hpq", True
    held: ClassVar[type | None] = Separable
    dense_paths: ClassVar[Mapping[str, Path]] = {
        "ax": ((0, 1), (0, 2), (0, 1)),
        "xtheta": ((1, 3), (1, 2), (0, 1)),
        **_FORM_FIRST,
    }
    kept: ClassVar[Mapping[str, Order]] = {"ax": _SeparableAx("ax"), "xtheta": _SeparableXTheta("xtheta")}

    def operands_of(self, theta: Any) -> tuple[Array, ...]:
        return theta.basis_coef, theta.channel

    def from_operands(self, operands: tuple[Array, ...], rank: int) -> Any:
        return Separable(*operands)

    def full_shape(self, shapes: tuple[Shape, ...], rank: int) -> tuple[int, int, int]:
        (_, K), (_, P, Q) = shapes[0], shapes[1]
        return K, P, Q

    def form_full(self, operands: tuple[Array, ...], rank: int) -> Array:
        return einsum("hk,hpq->kpq", *operands)


# --- low rank: Θ_k = V_k O_kᵀ ------------------------------------------------------------------------
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


class _Factored(_Own):
    r"""An own order that keeps :math:`\Theta_k = V_k O_k^\top` as its two factors."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        assert self.own.cost_factored is not None  # chosen only when the order has both
        return self.own.cost_factored(basis, batch, prm.P, prm.Q, prm.R)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        assert self.own.run_factored is not None
        return self.own.run_factored(basis, x, *prm.operands)


class _LowRank(Kind):
    """:class:`~structconv.LowRank`: the factors kept by a basis' own factored run, else through the hooks."""

    name, operand_names, rank_name = "lowrank", ("theta.value", "theta.out"), "D"
    subscripts, factored = "kpd,kqd", True
    held: ClassVar[type | None] = LowRank
    dense_paths: ClassVar[Mapping[str, Path]] = {
        "ax": ((0, 1), (0, 2), (0, 1)),
        "xtheta": ((1, 2), (0, 2), (0, 1)),
        **_FORM_FIRST,
    }
    kept: ClassVar[Mapping[str, Order]] = {"ax": _LowRankAx("ax"), "xtheta": _LowRankXTheta("xtheta")}

    def operands_of(self, theta: Any) -> tuple[Array, ...]:
        return theta.value, theta.out

    def from_operands(self, operands: tuple[Array, ...], rank: int) -> Any:
        return LowRank(*operands)

    def full_shape(self, shapes: tuple[Shape, ...], rank: int) -> tuple[int, int, int]:
        (K, P, _), Q = shapes[0], shapes[1][1]
        return K, P, Q

    def form_full(self, operands: tuple[Array, ...], rank: int) -> Array:
        return einsum("kpd,kqd->kpq", *operands)

    def hook_order(self, name: str, own: Mapping[str, OwnOrder]) -> Order:
        found = own.get(name)
        if found is not None and found.run_factored is not None:
            return _Factored(name, found)
        return super().hook_order(name, own)

    def dense_gemms(self, name: str, a: Array, x: Array, operands: tuple[Array, ...]) -> Array | None:
        return of(a).dense_gemms_lowrank(a, x, *operands) if name == "xtheta" else None


# --- a convolution's weight, as torch stores it ------------------------------------------------------
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

    def bind_image(self, basis: Basis, prm: Param) -> Callable[..., Array]:
        if self.own.bind_image is None:
            return super().bind_image(basis, prm)
        # run(x, weight, bias): the protocol's run(x, *operands, bias) for the one operand, unwrapped
        # (a compiled graph guards on every closure it reads through).
        return self.own.bind_image(basis, prm.R, tuple(int(s) for s in prm.operands[0].shape))


class _ConvWeight(Kind):
    """:class:`~structconv.ConvWeight`: the weight as stored where a basis' own order takes it, else Θ formed first.

    A contraction compiled for it also takes the bare weight.
    """

    name, operand_names, rank_name, subscripts = "convweight", ("theta.weight",), "G", "kpq"
    held: ClassVar[type | None] = ConvWeight

    def operands_of(self, theta: Any) -> tuple[Array, ...]:
        return (theta.weight,)

    def from_operands(self, operands: tuple[Array, ...], rank: int) -> Any:
        return ConvWeight(operands[0], rank)

    def compiled_operands(self, theta: Any) -> tuple[Any, ...] | None:
        if isinstance(theta, ConvWeight):
            return (theta.weight,)
        return (theta,) if kind_of(theta).held is None else None  # a bare weight, not another kind's object

    def as_theta(self, theta: Any, rank: int) -> Any:
        return theta if isinstance(theta, ConvWeight) else ConvWeight(theta, rank)

    def full_shape(self, shapes: tuple[Shape, ...], rank: int) -> tuple[int, int, int]:
        w = shapes[0]  # (Q, P/G, *kernel)
        return math.prod(w[2:]), w[1] * rank, w[0]

    def form_full(self, operands: tuple[Array, ...], rank: int) -> Array:
        return conv_weight_full(operands[0], rank)

    def full_cost(self, K: int, P: int, Q: int, rank: int) -> Cost:
        # A view for one group; the block-diagonal zeros written for several.
        return Cost(0.0, 0.0) if rank == 1 else Cost(2.0 * K * P * Q, float(K * P * Q))

    def hook_order(self, name: str, own: Mapping[str, OwnOrder]) -> Order:
        found = own.get(name)
        if found is not None and found.run_image is not None:
            return _OwnImage(name, found)
        return super().hook_order(name, own)


# --- members summed with a scalar each: Θ_k = c_k I ------------------------------------------------------
class _AggregationAx(Order):
    """Apply the members, then sum them with their scalars: no channel map."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        B, K, N, P = batch, basis.K, basis.N, prm.P
        return basis.cost_each(B, P) + Cost(2.0 * B * K * N * P, float(B * K * N * P + B * N * P))

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        return einsum("k,bknp->bnp", prm.operands[0], basis.apply_each(x))


class _AggregationXTheta(Order):
    """Scale ``x`` once per member, then the members' hook sums :math:`A_k^\top (c_k x)`."""

    __slots__ = ()

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        # The K scaled copies are written, then laid out member-major for the product: twice K M P.
        B, K, M, P = batch, basis.K, basis.M, prm.P
        return Cost(float(B * K * M * P), 2.0 * B * K * M * P) + basis.cost_members(B, P, reduce=True)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        return basis.apply_members(einsum("k,bmp->bkmp", prm.operands[0], x), reduce=True)


class _Aggregation(Kind):
    """:class:`~structconv.Aggregation`: the scalars kept through the hooks for ``"ax"`` and ``"xtheta"``.

    The rank is :math:`P`, what rebuilds the parameter from its one operand.
    """

    name, operand_names = "aggregation", ("theta.coef",)
    held: ClassVar[type | None] = Aggregation
    kept: ClassVar[Mapping[str, Order]] = {"ax": _AggregationAx("ax"), "xtheta": _AggregationXTheta("xtheta")}

    def operands_of(self, theta: Any) -> tuple[Array, ...]:
        return (theta.coef,)

    def from_operands(self, operands: tuple[Array, ...], rank: int) -> Any:
        return Aggregation(operands[0], rank)

    def full_shape(self, shapes: tuple[Shape, ...], rank: int) -> tuple[int, int, int]:
        return shapes[0][0], rank, rank

    def form_full(self, operands: tuple[Array, ...], rank: int) -> Array:
        return aggregation_full(operands[0], rank)

    def full_cost(self, K: int, P: int, Q: int, rank: int) -> Cost:
        return Cost(float(K * P * Q), float(K * P * Q))


SEPARABLE, LOWRANK, CONV_WEIGHT, AGGREGATION = _Separable(), _LowRank(), _ConvWeight(), _Aggregation()
"""The kinds of :math:`\\Theta` held in another form than one array, that :func:`~structconv.conv` takes."""


__all__ = ["AGGREGATION", "CONV_WEIGHT", "LOWRANK", "SEPARABLE"]
