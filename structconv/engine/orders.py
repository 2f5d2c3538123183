r"""The orders of :math:`y_b = \sum_k A_k^\top x_b \Theta_k`, and the kinds of :math:`\Theta` that pick them.

An :class:`Order` estimates its work (:meth:`Order.cost`, a :class:`~structconv.Cost`) and
runs (:meth:`Order.run`).  A :class:`Kind` of parameter says which order runs each name:
:func:`orders_for` asks the parameter's kind, for every name open to the basis (:func:`names`).
Two families:

* dense bases (:class:`DenseOrder`): one opt_einsum contraction along the kind's explicit path
  for the order (:attr:`Kind.dense_paths`), costed by opt_einsum's ``PathInfo``; the backend may
  run some as plain GEMMs (:meth:`Kind.dense_gemms`);
* every other representation: the triangle run through the basis' hooks
  (:meth:`~structconv.Basis.apply_each`, :meth:`~structconv.Basis.apply_members`,
  :meth:`~structconv.Basis.apply_combined`) and costed by their ``cost_*`` twins, plus the
  orders the basis runs its own way (:meth:`~structconv.Basis.own_orders`, each an
  :class:`~structconv.bases.base.OwnOrder` holding its cost and its run).

This module holds what every kind shares: the orders of a full :math:`\Theta` (:data:`FULL`,
the kind every other one falls back on by forming :math:`\Theta` first), the order that forms
it, a basis' own orders and the dense one.  The kinds that keep :math:`\Theta` in another form,
with the orders that take that form as it is, are in :mod:`structconv.engine.kinds`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

from ..backend import Array, einsum, einsum_path, of, x_theta
from ..backend.checks import check_array
from ..bases.base import Basis, Cost, OwnOrder
from ..bases.dense import DenseBasis

#: The triangle's orders for a full parameter, and for a factorised one.
BASE_ORDERS = ("ax", "xtheta", "atheta")
FACTOR_ORDERS = ("ax", "xtheta", "ax+full", "xtheta+full", "atheta")

Shape = tuple[int, ...]
Path = tuple[tuple[int, ...], ...]
"""An explicit opt_einsum path: the operand positions each step takes."""


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
        y = self.run(basis, image_to_rows(x), prm)
        if bias is not None:
            y = y + bias
        return rows_to_image(y, basis.entry_shapes[1])

    def bind_image(self, basis: Basis, prm: Param) -> Callable[..., Array]:
        """:meth:`run_image` for ``basis`` and parameters shaped like ``prm``: ``run(x, *operands, bias)``.

        What a compiled contraction keeps (:func:`structconv.contraction`), called with the
        parameter's arrays (``prm.operands``'s) and the bias, all positional; an order whose run
        has per-call arithmetic of its own does it here, once.
        """
        return lambda x, *ops: self.run_image(basis, x, prm._replace(operands=ops[:-1]), ops[-1])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


# --- the kinds of parameter -------------------------------------------------------------------
_HELD: dict[type, Kind] = {}
"""The kind of each class of parameter object (:attr:`Kind.held`), filled as kinds are made."""


class Kind:
    r"""A kind of parameter :math:`\Theta`: its operands, shapes, dense form, casts and orders, in one class.

    A new kind is one subclass and its one instance (making it registers it as the reader of
    its :attr:`held` objects, :func:`kind_of`).  The engine calls these attributes and methods
    and keeps no table of kinds: which order runs each name (:meth:`hook_order`,
    :meth:`dense_order`), how the user's object is read (:meth:`read`) and rebuilt
    (:meth:`from_operands`), how :math:`\Theta` is formed in full (:meth:`form_full`).  The
    defaults form :math:`\Theta` first and run the full kind's order (:data:`FULL`), so a kind
    needs its own orders only where it keeps its form.

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
        Whether the triangle's orders keep the factors apart (names :data:`FACTOR_ORDERS`; else
        :data:`BASE_ORDERS`, :math:`\Theta` contracted as one array, formed first where it is not
        one).
    held
        The class of the user's parameter objects of this kind (``None``: a bare array).
    dense_paths
        The explicit opt_einsum path of each order on a dense basis, the operands being ``A``,
        ``x`` and the kind's operands; an order without one forms :math:`\Theta` first.
    kept
        The orders that keep the kind's form through a basis' hooks, by name; any other forms
        :math:`\Theta` first.
    """

    name = ""
    operand_names: tuple[str, ...] = ()
    rank_name: str | None = None
    subscripts = ""
    factored = False
    held: ClassVar[type | None] = None
    dense_paths: ClassVar[Mapping[str, Path]] = {}
    kept: ClassVar[Mapping[str, Order]] = {}

    def __init__(self) -> None:
        self._dense = {b: {n: DenseOrder(n, self, b) for n in self.dense_paths} for b in (False, True)}
        if self.held is not None:
            _HELD[self.held] = self

    # --- the user's object ----------------------------------------------------------------------
    def operands_of(self, theta: Any) -> tuple[Array, ...]:
        """The arrays that hold ``theta``, a parameter of this kind, in the order of :attr:`operand_names`."""
        raise NotImplementedError

    def from_operands(self, operands: tuple[Array, ...], rank: int) -> Any:
        """The user's parameter object held by ``operands`` with ``rank``: the inverse of :meth:`operands_of`."""
        raise NotImplementedError

    def read(self, theta: Any) -> Param:
        """``theta``, a parameter of this kind, as a :class:`Param` (its ``shape`` and ``rank`` read)."""
        k, p, q = theta.shape
        return Param(self, self.operands_of(theta), k, p, q, theta.rank)

    def cast(self, theta: Any, to: Callable[[Array], Array]) -> Any:
        """``theta`` with ``to`` applied to each of its arrays (a dtype's conversion)."""
        return self.from_operands(tuple(to(op) for op in self.operands_of(theta)), theta.rank)

    def compiled_operands(self, theta: Any) -> tuple[Any, ...] | None:
        """The arrays of ``theta`` as a contraction compiled for this kind takes it (``None``: another kind's)."""
        return self.operands_of(theta) if kind_of(theta) is self else None

    def as_theta(self, theta: Any, rank: int) -> Any:
        """What a compiled call took (:meth:`compiled_operands`) as :func:`~structconv.conv` takes it."""
        return theta

    # --- its full form --------------------------------------------------------------------------
    def full_shape(self, shapes: tuple[Shape, ...], rank: int) -> tuple[int, int, int]:
        """``(K, P, Q)`` from the operands' ``shapes`` and the ``rank``."""
        raise NotImplementedError

    def form_full(self, operands: tuple[Array, ...], rank: int) -> Array:
        r""":math:`\Theta` as one ``(K, P, Q)`` array."""
        raise NotImplementedError

    def full_cost(self, K: int, P: int, Q: int, rank: int) -> Cost:
        """The work of :meth:`form_full`."""
        return Cost(2.0 * K * P * Q * rank, float(K * P * Q))

    # --- its orders -----------------------------------------------------------------------------
    def hook_order(self, name: str, own: Mapping[str, OwnOrder]) -> Order:
        r"""The order ``name`` on a basis run through its hooks, whose own orders are ``own``.

        The default is the kind's :attr:`kept` order, else :math:`\Theta` formed first and the
        full kind's order run (``"ax+full"`` the full ``"ax"``).
        """
        found = self.kept.get(name)
        return _FormFull(name, FULL.hook_order(name.removesuffix("+full"), own)) if found is None else found

    def dense_order(self, name: str, batched: bool) -> Order:
        r"""The order ``name`` on a dense basis (``batched``: per instance).

        Along :attr:`dense_paths` where the kind has a path for it; else :math:`\Theta` is formed
        first and the full kind's dense order runs.
        """
        found = self._dense[batched].get(name)
        return _FormFull(name, FULL.dense_order(name.removesuffix("+full"), batched)) if found is None else found

    def dense_gemms(self, name: str, a: Array, x: Array, operands: tuple[Array, ...]) -> Array | None:
        """The dense order ``name`` as the backend's plain GEMMs, or ``None`` (then by einsum, the default)."""
        return None

    def dense_copies(self, name: str, basis: Basis, batch: int, prm: Param) -> Cost:
        """Elements the dense order ``name`` copies beyond its path's (:meth:`dense_gemms`' layouts)."""
        return Cost()

    def __repr__(self) -> str:
        return self.name


def kind_of(theta: Any) -> Kind:
    """The kind of the parameter object ``theta``: the one that holds its class, else :data:`FULL` (an array)."""
    for held, kind in _HELD.items():
        if isinstance(theta, held):
            return kind
    return FULL


class Param(NamedTuple):
    r"""A parameter :math:`\Theta` of shape ``(K, P, Q)`` as the arrays that hold it.

    ``kind`` says what the ``operands`` are (:class:`Kind`): :data:`FULL` (``(theta,)``),
    :data:`~structconv.engine.kinds.SEPARABLE` (``(basis_coef, channel)``, ``R = H``),
    :data:`~structconv.engine.kinds.LOWRANK` (``(value, out)``, ``R = D``) or
    :data:`~structconv.engine.kinds.CONV_WEIGHT` (``(weight,)``, ``R = G`` groups); ``R`` is 0
    for a full one.
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


class _FormFull(Order):
    """Form :math:`\\Theta` from its operands, then run the full order ``inner``."""

    __slots__ = ("inner",)

    def __init__(self, name: str, inner: Order) -> None:
        super().__init__(name)
        self.inner = inner

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        full = Param(FULL, (Shaped((prm.K, prm.P, prm.Q)),), prm.K, prm.P, prm.Q, 0)
        return self.inner.cost(basis, batch, full) + prm.full_cost()

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        return self.inner.run(basis, x, prm.full())


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


# --- dense bases: one opt_einsum contraction --------------------------------------------------
def dense_equation(batched: bool, kind: Kind) -> str:
    """The einsum equation of a dense basis (``batched``: per instance) and a ``kind`` of parameter."""
    return f"{'bkmn' if batched else 'kmn'},bmp,{kind.subscripts}->bnq"


class DenseOrder(Order):
    """An order for a dense basis: opt_einsum along the kind's explicit path, costed by its ``PathInfo``."""

    __slots__ = ("equation", "kind", "path")

    def __init__(self, name: str, kind: Kind, batched: bool) -> None:
        super().__init__(name)
        self.kind = kind
        self.equation = dense_equation(batched, kind)
        self.path = kind.dense_paths[name]

    def cost(self, basis: Basis, batch: int, prm: Param) -> Cost:
        shapes = (basis.shape, (batch, basis.M, prm.P)) + tuple(tuple(int(s) for s in op.shape) for op in prm.operands)
        _, flops, memory = einsum_path(self.equation, shapes, self.path)
        return Cost(flops, memory) + self.kind.dense_copies(self.name, basis, batch, prm)

    def run(self, basis: Basis, x: Array, prm: Param) -> Array:
        a = basis.to_dense()
        y = self.kind.dense_gemms(self.name, a, x, prm.operands)
        return einsum(self.equation, a, x, *prm.operands, path=self.path) if y is None else y


# --- the full kind ----------------------------------------------------------------------------
class _Full(Kind):
    r""":math:`\Theta` as one ``(K, P, Q)`` array: the triangle through the hooks, or the basis' own run of an order."""

    name, operand_names, subscripts = "full", ("theta",), "kpq"
    dense_paths: ClassVar[Mapping[str, Path]] = {
        "ax": ((0, 1), (0, 1)),
        "xtheta": ((1, 2), (0, 1)),
        "atheta": ((0, 2), (0, 1)),
    }
    hooks: ClassVar[Mapping[str, Order]] = {
        "ax": _FullAx("ax"),
        "xtheta": _FullXTheta("xtheta"),
        "atheta": _FullOrder("atheta"),
    }
    """The triangle through the basis' hooks."""

    def operands_of(self, theta: Any) -> tuple[Array, ...]:
        return (theta,)

    def from_operands(self, operands: tuple[Array, ...], rank: int) -> Any:
        return operands[0]

    def read(self, theta: Any) -> Param:
        check_array(theta, "theta", (3,), ("(K, P, Q)",))
        k, p, q = (int(s) for s in theta.shape)
        return Param(self, (theta,), k, p, q, 0)

    def cast(self, theta: Any, to: Callable[[Array], Array]) -> Any:
        return to(theta)

    def full_shape(self, shapes: tuple[Shape, ...], rank: int) -> tuple[int, int, int]:
        K, P, Q = shapes[0]
        return K, P, Q

    def form_full(self, operands: tuple[Array, ...], rank: int) -> Array:
        return operands[0]

    def full_cost(self, K: int, P: int, Q: int, rank: int) -> Cost:
        return Cost(0.0, 0.0)

    def hook_order(self, name: str, own: Mapping[str, OwnOrder]) -> Order:
        """The basis' own run of ``name``, else the hooks'."""
        found = own.get(name)
        return self.hooks[name] if found is None else _Own(name, found)

    def dense_order(self, name: str, batched: bool) -> Order:
        return self._dense[batched][name]

    def dense_gemms(self, name: str, a: Array, x: Array, operands: tuple[Array, ...]) -> Array | None:
        return of(a).dense_gemms(name, a, x, operands[0])

    def dense_copies(self, name: str, basis: Basis, batch: int, prm: Param) -> Cost:
        """What the GEMMs of a per-instance basis copy (:func:`structconv.backend.torch._instance_gemms`).

        x·Θ first reads each instance as an ``(M K, N)`` matrix: a copy of the basis unless it is
        stored so (:attr:`~structconv.DenseBasis.instance_rows`).  A·x first permutes its
        :math:`K`-fold intermediate ``(B, K, N, P)`` before the product with Θ (``docs/internals.rst``).
        """
        if basis.batch is None or name not in ("ax", "xtheta"):
            return Cost()
        if name == "ax":
            return Cost(0.0, float(batch * basis.K * basis.N * prm.P))
        rows = isinstance(basis, DenseBasis) and basis.instance_rows
        return Cost(0.0, 0.0 if rows else float(batch * basis.K * basis.M * basis.N))


FULL = _Full()
r"""The full kind: :math:`\Theta` as one array (a bare ``(K, P, Q)`` array, or the shape of one)."""


# --- the orders open to a basis ---------------------------------------------------------------
def names(kind: Kind, basis: Basis) -> tuple[str, ...]:
    """The orders open to ``basis`` with a ``kind`` of parameter, in the order :func:`explain` lists them."""
    beyond = tuple(name for name in basis.own_orders() if name not in BASE_ORDERS)
    return (FACTOR_ORDERS if kind.factored else BASE_ORDERS) + beyond


def orders_for(kind: Kind, basis: Basis, dense: bool) -> tuple[Order, ...]:
    """The :class:`Order` objects of :func:`names`, as ``kind`` picks them; ``dense`` selects the opt_einsum family."""
    if dense:
        batched = basis.batch is not None
        return tuple(kind.dense_order(name, batched) for name in names(kind, basis))
    own = basis.own_orders()
    return tuple(kind.hook_order(name, own) for name in names(kind, basis))


__all__ = [
    "BASE_ORDERS",
    "FACTOR_ORDERS",
    "FULL",
    "DenseOrder",
    "Kind",
    "Order",
    "Param",
    "Shaped",
    "dense_equation",
    "image_to_rows",
    "kind_of",
    "names",
    "orders_for",
    "rows_to_image",
]
