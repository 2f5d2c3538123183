"""The engine's operands: checked, placed alike, and the parameter read as its factors."""

from __future__ import annotations

import math
from typing import NamedTuple

from ..backend import Array, autocast_dtype, autocast_to, device_of, dtype_name, einsum, of, shape_str
from ..backend.checks import check_array, check_same_placement
from ..bases.base import Basis, Cost
from ..bases.conv_weight import ConvWeight, conv_weight_full
from ..bases.convert import as_basis
from ..bases.factor import LowRank, Separable, Theta

Shape = tuple[int, ...]


class Kind:
    r"""A kind of parameter :math:`\Theta`: what the engine needs to know of its operands, in one class.

    A new kind is one subclass (and its orders in :mod:`structconv.engine.orders`); the engine
    reads these attributes and methods instead of keeping a table per property.

    Attributes
    ----------
    name
        As plans and messages show it.
    operand_names
        The operands' argument names, as error messages show them.
    rank_name
        The rank's letter among a plan's sizes (``None``: a full :math:`\Theta` has no rank).
    subscripts
        The operands' einsum subscripts beside ``k``, ``p``, ``q`` (a dense basis' equation).
    factored
        Whether the triangle's orders keep the factors apart (else :math:`\Theta` is contracted
        as one array, formed first where it is not one).
    """

    name = ""
    operand_names: tuple[str, ...] = ()
    rank_name: str | None = None
    subscripts = ""
    factored = False

    def full_shape(self, shapes: tuple[Shape, ...], rank: int) -> tuple[int, int, int]:
        """``(K, P, Q)`` from the operands' ``shapes`` and the ``rank``."""
        raise NotImplementedError

    def form_full(self, operands: tuple[Array, ...], rank: int) -> Array:
        r""":math:`\Theta` as one ``(K, P, Q)`` array."""
        raise NotImplementedError

    def full_cost(self, K: int, P: int, Q: int, rank: int) -> Cost:
        """The work of :meth:`form_full`."""
        return Cost(2.0 * K * P * Q * rank, float(K * P * Q))

    def __repr__(self) -> str:
        return self.name


class _Full(Kind):
    name, operand_names, subscripts = "full", ("theta",), "kpq"

    def full_shape(self, shapes: tuple[Shape, ...], rank: int) -> tuple[int, int, int]:
        K, P, Q = shapes[0]
        return K, P, Q

    def form_full(self, operands: tuple[Array, ...], rank: int) -> Array:
        return operands[0]

    def full_cost(self, K: int, P: int, Q: int, rank: int) -> Cost:
        return Cost(0.0, 0.0)


class _Separable(Kind):
    name, operand_names, rank_name = "separable", ("theta.basis_coef", "theta.channel"), "H"
    subscripts, factored = "hk,hpq", True

    def full_shape(self, shapes: tuple[Shape, ...], rank: int) -> tuple[int, int, int]:
        (_, K), (_, P, Q) = shapes[0], shapes[1]
        return K, P, Q

    def form_full(self, operands: tuple[Array, ...], rank: int) -> Array:
        return einsum("hk,hpq->kpq", *operands)


class _LowRank(Kind):
    name, operand_names, rank_name = "lowrank", ("theta.value", "theta.out"), "D"
    subscripts, factored = "kpd,kqd", True

    def full_shape(self, shapes: tuple[Shape, ...], rank: int) -> tuple[int, int, int]:
        (K, P, _), Q = shapes[0], shapes[1][1]
        return K, P, Q

    def form_full(self, operands: tuple[Array, ...], rank: int) -> Array:
        return einsum("kpd,kqd->kpq", *operands)


class _ConvWeight(Kind):
    name, operand_names, rank_name, subscripts = "convweight", ("theta.weight",), "G", "kpq"

    def full_shape(self, shapes: tuple[Shape, ...], rank: int) -> tuple[int, int, int]:
        w = shapes[0]  # (Q, P/G, *kernel)
        return math.prod(w[2:]), w[1] * rank, w[0]

    def form_full(self, operands: tuple[Array, ...], rank: int) -> Array:
        return conv_weight_full(operands[0], rank)

    def full_cost(self, K: int, P: int, Q: int, rank: int) -> Cost:
        # A view for one group; the block-diagonal zeros written for several.
        return Cost(0.0, 0.0) if rank == 1 else Cost(2.0 * K * P * Q, float(K * P * Q))


FULL, SEPARABLE, LOWRANK, CONV_WEIGHT = _Full(), _Separable(), _LowRank(), _ConvWeight()
"""The kinds of :math:`\\Theta` that :func:`~structconv.conv` takes."""


class Param(NamedTuple):
    r"""A parameter :math:`\Theta` of shape ``(K, P, Q)`` as the arrays that hold it.

    ``kind`` says what the ``operands`` are (:class:`Kind`): :data:`FULL` (``(theta,)``),
    :data:`SEPARABLE` (``(basis_coef, channel)``, ``R = H``), :data:`LOWRANK` (``(value, out)``,
    ``R = D``) or :data:`CONV_WEIGHT` (``(weight,)``, ``R = G`` groups); ``R`` is 0 for a full one.
    """

    kind: Kind
    operands: tuple[Array, ...]
    K: int
    P: int
    Q: int
    R: int

    def full(self) -> Param:
        r"""The parameter with :math:`\Theta` formed in one array."""
        return Param(FULL, (self.kind.form_full(self.operands, self.R),), self.K, self.P, self.Q, 0)

    def full_cost(self) -> Cost:
        """The work of :meth:`full`."""
        return self.kind.full_cost(self.K, self.P, self.Q, self.R)


class Shaped(NamedTuple):
    """An operand known by its shape alone: what a cost reads of an array, for planning before any value exists."""

    shape: tuple[int, ...]


def as_param(theta: Theta) -> Param:
    """Read ``theta`` (an array, :class:`Separable` or :class:`LowRank`) as a :class:`Param`."""
    if isinstance(theta, Separable):
        k, p, q = theta.shape
        return Param(SEPARABLE, (theta.basis_coef, theta.channel), k, p, q, theta.rank)
    if isinstance(theta, LowRank):
        k, p, q = theta.shape
        return Param(LOWRANK, (theta.value, theta.out), k, p, q, theta.rank)
    if isinstance(theta, ConvWeight):
        k, p, q = theta.shape
        return Param(CONV_WEIGHT, (theta.weight,), k, p, q, theta.groups)
    check_array(theta, "theta", (3,), ("(K, P, Q)",))
    k, p, q = (int(s) for s in theta.shape)
    return Param(FULL, (theta,), k, p, q, 0)


def autocast(a: Basis | Array, x: Array, theta: Theta) -> tuple[Basis | Array, Array, Theta]:
    """Inside ``torch.autocast``, every floating operand in the autocast dtype, as ``torch.matmul`` would.

    Autocast leaves layers' outputs in the low dtype and their parameters in float32; the
    engine's dtype check would refuse that mix, so the operands are converted here, once, and
    the contraction runs in the autocast dtype (float64 is left alone, as autocast does).
    """
    dtype = autocast_dtype(x)
    if dtype is None:
        return a, x, theta
    if isinstance(theta, LowRank):
        theta = LowRank(autocast_to(theta.value, dtype), autocast_to(theta.out, dtype))
    elif isinstance(theta, Separable):
        theta = Separable(autocast_to(theta.basis_coef, dtype), autocast_to(theta.channel, dtype))
    elif isinstance(theta, ConvWeight):
        theta = ConvWeight(autocast_to(theta.weight, dtype), theta.groups)
    else:
        theta = autocast_to(theta, dtype)
    if not isinstance(a, Basis):
        a = autocast_to(a, dtype)
    elif a.dtype.is_floating_point and a.dtype.itemsize == 4 and a.dtype != dtype:
        a = a.to(dtype=dtype)
    return a, autocast_to(x, dtype), theta


def placed(a: Basis | Array, x: Array) -> Basis | Array:
    """The basis as applied to ``x`` (:meth:`~structconv.Basis.placed_like`); arrays are returned as they are."""
    return a.placed_like(x) if isinstance(a, Basis) else a


def prepare(a: Basis | Array, x: Array, theta: Theta) -> tuple[Basis, Array, Param, bool]:
    """Check the operands against each other.

    Returns the basis, ``x`` as ``(B, M, P)``, the parameter, and whether ``x`` was 2-D.
    """
    basis = as_basis(placed(a, x))
    check_array(x, "x", (2, 3), ("(B, M, P)", "(M, P)"))
    param = as_param(theta)
    placement = {"x": x}
    placement.update(zip(param.kind.operand_names, param.operands, strict=True))
    check_same_placement(placement)
    x_backend = of(x, "x").name
    if basis.backend != x_backend:
        raise TypeError(f"the basis is a {basis.backend} basis but x is a {x_backend} array; do not mix backends")
    if dtype_name(x) != str(basis.dtype).removeprefix("torch."):
        raise TypeError(f"the basis has dtype {basis.dtype} but x has dtype {dtype_name(x)}; convert explicitly")
    if basis.device != device_of(x):
        raise ValueError(f"the basis is on device {basis.device} but x is on {device_of(x)}")
    squeeze = x.ndim == 2
    if squeeze:
        x = x[None]
    B, M, P = (int(s) for s in x.shape)
    if M != basis.M:
        raise ValueError(
            f"x has shape {shape_str(tuple(x.shape[1:] if squeeze else x.shape))} but the basis has "
            f"M={basis.M} input entries; expected x of shape (B, {basis.M}, P) or ({basis.M}, P)"
        )
    if basis.batch is not None and basis.batch != B:
        raise ValueError(f"the basis is per-instance with batch {basis.batch} but x has batch {B}; they must agree")
    if param.K != basis.K:
        raise ValueError(
            f"theta has K={param.K} members (shape {shape_str((param.K, param.P, param.Q))}) "
            f"but the basis has K={basis.K}"
        )
    if param.P != P:
        raise ValueError(
            f"theta has P={param.P} input channels but x has {P}; expected theta of shape ({basis.K}, {P}, Q)"
        )
    return basis, x, param, squeeze


__all__ = [
    "CONV_WEIGHT",
    "FULL",
    "LOWRANK",
    "SEPARABLE",
    "Kind",
    "Param",
    "Shaped",
    "as_param",
    "autocast",
    "placed",
    "prepare",
]
