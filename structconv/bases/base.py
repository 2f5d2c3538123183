r"""The :class:`Basis` value: :math:`K` weighted graphs from :math:`M` inputs to :math:`N` outputs.

A basis :math:`\mathbf{A}` has shape :math:`(K, M, N)`, or :math:`(B, K, M, N)` when it depends
on each instance of a batch (attention).  It is an immutable value with one of several
representations (dense, sparse, concatenated, composed, and structured ones added by other
modules).  None of them becomes a dense tensor unless :meth:`Basis.to_dense` is called.

A representation plugs into the engine (:func:`structconv.conv`) through three hooks, each
paired with a cost estimate (the whole interface is the table in :class:`Basis`):

* :meth:`Basis.apply_each` computes :math:`R_{bknc} = \sum_m A_{kmn} x_{bmc}`,
* :meth:`Basis.apply_members` computes :math:`\sum_m A_{kmn} S_{bkmc}`, summed over :math:`k`
  or not,
* :meth:`Basis.apply_combined` contracts :math:`x` with :math:`\Phi = \mathbf{A}\circ\Theta`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..backend import Array, device_of, einsum, of, shape_str


@dataclass(frozen=True)
class Cost:
    """An estimate of the work of one step; costs add up (``a + b``).

    The engine weighs the three counts (:data:`structconv.engine.plan.SPARSE_FLOP_WEIGHT`,
    :data:`structconv.engine.plan.MEMORY_WEIGHT`).

    Parameters
    ----------
    flops
        Floating-point operations done by dense kernels (GEMM, einsum).
    memory
        Elements written to intermediates.
    irregular
        Floating-point operations done by sparse or gather kernels, which run several times
        slower per operation.
    """

    flops: float = 0.0
    memory: float = 0.0
    irregular: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.memory + other.memory, self.irregular + other.irregular)


@dataclass(frozen=True, slots=True)
class OwnOrder:
    r"""One order a representation runs its own way: its cost and its run, side by side.

    Each field is a function of the basis (its first argument), not a bound method, so that one
    value serves every basis of a class and a plan holds no basis.

    Attributes
    ----------
    cost
        ``cost(basis, batch, p, q) -> Cost``: the estimated work of ``run``.
    run
        ``run(basis, x, theta) -> Array``: :math:`y` ``(B, N, Q)`` for ``x`` ``(B, M, P)`` and a
        full ``theta`` ``(K, P, Q)``.
    cost_factored
        ``cost_factored(basis, batch, p, q, rank) -> Cost``, or ``None``.
    run_factored
        ``run_factored(basis, x, value, out) -> Array`` for :math:`\Theta_k = V_k O_k^\top`
        (``value`` ``(K, P, D)``, ``out`` ``(K, Q, D)``) kept as its two factors, or ``None``:
        the order then sees a :class:`~structconv.LowRank` parameter formed in full.
    run_image
        ``run_image(basis, x, weight, groups, bias) -> Array``, or ``None``: the order on the
        entries' own layout (:attr:`Basis.entry_shapes`), ``x`` ``(B, P, *in_shape)`` to ``y``
        ``(B, Q, *out_shape)``, for a :class:`~structconv.ConvWeight` parameter taken as it is
        stored and an optional ``(Q,)`` bias added by the same call.  A compiled contraction in
        the ``"channels_first"`` layout (:func:`structconv.contraction`) calls it with no
        reshaping; elsewhere the engine frames ``x`` and ``y`` around it.
    bind_image
        ``bind_image(basis, groups, weight_shape) -> run(x, weight, bias)``, or ``None``:
        ``run_image`` with the basis, ``groups`` and the weight's shape bound once, its per-call
        arithmetic done now.  A compiled
        contraction keeps the result and calls it on every run.
    """

    cost: Callable[..., Cost]
    run: Callable[..., Array]
    cost_factored: Callable[..., Cost] | None = None
    run_factored: Callable[..., Array] | None = None
    run_image: Callable[..., Array] | None = None
    bind_image: Callable[..., Callable[..., Array]] | None = None


#: The default of :meth:`Basis.own_orders`: none.
NO_ORDERS: Mapping[str, OwnOrder] = {}


def _member_list(members: Sequence[int]) -> list[int]:
    """``members`` as a list, refused if empty: what every :meth:`Basis.select` checks first."""
    index = list(members)
    if not index:
        raise ValueError("members must name at least one basis member")
    return index


class Basis(ABC):
    r"""Abstract basis of shape ``(K, M, N)`` or ``(B, K, M, N)``.

    Subclasses set the representation; all share the value semantics below: operations return
    new bases and never modify the arrays they hold (which callers must treat as read-only).

    The whole interface, stated here once (callers within the package; "abstract" hooks must
    be implemented, the others have the default shown):

    ===================================  ===========================================  ====================
    hook                                 called by                                    default
    ===================================  ===========================================  ====================
    ``shape``                            everything (``K``, ``M``, ``N``, ``batch``)  abstract
    ``backend``, ``dtype``, ``device``   ``engine.operands.prepare`` (placement       abstract
                                         checks), composite bases, ``repr``
    ``to_dense``                         ``energy``, ``apply_combined``, theory,      abstract
                                         attention layers
    ``transpose``, ``select``, ``to``    users (``.T``, ``[k]``), composite bases,    abstract
                                         ``engine.operands.autocast`` (``to``),
                                         ``nn.StructConv``
    ``placed_like``                      ``engine.operands.placed``: a basis          itself
                                         without arrays takes ``x``'s placement
    ``plan_key``                         ``engine.contract``: the plan cache key      ``(type, shape)``
    ``energy``                           ``nn.StructConv`` (fan-in)                   from ``to_dense``
    ``apply_each``                       ``engine.orders``: ``"ax"`` (every kind)     abstract
    ``cost_each``                        its cost                                     abstract
    ``apply_members``                    ``engine.orders``: ``"xtheta"``              abstract
    ``cost_members``                     its cost                                     abstract
    ``apply_combined``                   ``engine.orders``: ``"atheta"``              dense :math:`\Phi`
    ``cost_combined``                    its cost                                     dense count
    ``own_orders``                       ``engine.orders``: orders the basis runs     empty
                                         its own way (:class:`OwnOrder`: cost and
                                         run; for a :class:`~structconv.LowRank`
                                         kept factored, ``cost_factored`` and
                                         ``run_factored``); a triangle name replaces
                                         that order for a full :math:`\Theta`, any
                                         other is listed after the triangle
    ===================================  ===========================================  ====================
    """

    __slots__ = ()

    #: Short name of the representation, shown by :func:`structconv.explain`.
    representation: str = "abstract"

    # --- shape and placement -----------------------------------------------------------
    @property
    @abstractmethod
    def shape(self) -> tuple[int, ...]:
        """``(K, M, N)``, or ``(B, K, M, N)`` for a per-instance basis."""

    @property
    @abstractmethod
    def backend(self) -> str:
        """``"numpy"`` or ``"torch"``."""

    @property
    @abstractmethod
    def dtype(self) -> Any:
        """The dtype of the basis weights."""

    @property
    @abstractmethod
    def device(self) -> str:
        """The device of the basis weights (``"cpu"`` for NumPy)."""

    @property
    def K(self) -> int:
        """Number of basis members."""
        return self.shape[-3]

    @property
    def M(self) -> int:
        """Number of input entries."""
        return self.shape[-2]

    @property
    def N(self) -> int:
        """Number of output entries."""
        return self.shape[-1]

    @property
    def batch(self) -> int | None:
        """Batch size of a per-instance basis, ``None`` when shared by the whole batch."""
        return self.shape[0] if len(self.shape) == 4 else None

    # --- value operations ---------------------------------------------------------------
    @abstractmethod
    def to_dense(self) -> Array:
        """Materialise the basis as a dense array of shape :attr:`shape`."""

    @abstractmethod
    def transpose(self) -> Basis:
        r"""The basis with input and output entries swapped: :math:`(\mathbf{A}_k^\top)_k`."""

    @property
    def T(self) -> Basis:
        """Alias of :meth:`transpose`."""
        return self.transpose()

    @abstractmethod
    def select(self, members: Sequence[int]) -> Basis:
        """Restrict the basis to the given members, in the given order (``basis[members]`` checks them first).

        Parameters
        ----------
        members
            Member indices in ``[0, K)``, at least one; a member may repeat.
        """

    @abstractmethod
    def to(self, device: Any = None, dtype: Any = None) -> Basis:
        """Move the basis to another device and/or dtype, as ``torch.Tensor.to`` moves a tensor.

        Parameters
        ----------
        device
            The device (torch only; a NumPy basis lives on the CPU), or ``None`` to keep it.
        dtype
            The floating dtype of the weights, or ``None`` to keep it.
        """

    def __getitem__(self, index: int | slice | Sequence[int]) -> Basis:
        if isinstance(index, int):
            members: Sequence[int] = [index]
        elif isinstance(index, slice):
            members = range(self.K)[index]
        else:
            members = list(index)
        for k in members:
            if not -self.K <= int(k) < self.K:
                raise IndexError(f"basis member {k} is out of range for K={self.K}")
        return self.select([int(k) % self.K for k in members])

    def energy(self) -> float:
        r"""Mean over outputs of :math:`\sum_{k,m} A_{kmn}^2` (and over the batch, if any).

        For a shift basis this is the number of in-grid offsets, i.e. the fan-in of a grid
        convolution per input channel; :class:`structconv.nn.StructConv` scales its
        initialisation with it.
        """
        dense = self.to_dense()
        total = float((dense * dense).sum())
        return total / (self.N * (self.batch or 1))

    def placed_like(self, x: Array) -> Basis:
        """The basis to apply to ``x``: itself, or, for a basis that holds no arrays, one placed like ``x``.

        Parameters
        ----------
        x
            The input the basis is about to be applied to.
        """
        return self

    def plan_key(self) -> tuple[Any, ...]:
        """What, besides shapes, the engine's cost model depends on (a hashable tuple)."""
        return (type(self).__name__, self.shape)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(shape={shape_str(self.shape)}, backend={self.backend}, "
            f"dtype={self.dtype}, device={self.device})"
        )

    # --- engine hooks -------------------------------------------------------------------
    @abstractmethod
    def apply_each(self, x: Array) -> Array:
        r"""Apply every member to ``x``: :math:`R_{bknc} = \sum_m A_{(b)kmn} x_{bmc}`.

        Parameters
        ----------
        x
            ``(B, M, C)``.

        Returns
        -------
        Array
            ``(B, K, N, C)``: :math:`A_k^\top x_b` for every member.
        """

    @abstractmethod
    def apply_members(self, s: Array, *, reduce: bool) -> Array:
        r"""Apply member :math:`k` to slice :math:`k` of ``s``: :math:`A_k^\top s_{bk}`.

        Parameters
        ----------
        s
            ``(B, K, M, C)``, one slice per member.
        reduce
            Sum over the members (the engine's x·Θ-first order) or keep them apart.

        Returns
        -------
        Array
            :math:`\sum_k A_k^\top s_{bk}` of shape ``(B, N, C)`` when ``reduce`` is true,
            otherwise the ``(B, K, N, C)`` stack of :math:`A_k^\top s_{bk}`.
        """

    def apply_combined(self, x: Array, theta: Array) -> Array:
        r"""Contract ``x`` with :math:`\Phi = \sum_k A_k \otimes \Theta_k` (the "A·Θ first" side).

        The default materialises the dense basis; representations override it when they can
        do better.

        Parameters
        ----------
        x
            ``(B, M, P)``.
        theta
            :math:`\Theta`, ``(K, P, Q)``.

        Returns
        -------
        Array
            :math:`y_{bnq} = \sum_{m,p} x_{bmp}\Phi_{mnpq}`, ``(B, N, Q)``.
        """
        dense = self.to_dense()
        if self.batch is None:
            phi = einsum("kmn,kpq->mnpq", dense, theta)
            return einsum("bmp,mnpq->bnq", x, phi)
        phi = einsum("bkmn,kpq->bmnpq", dense, theta)
        return einsum("bmp,bmnpq->bnq", x, phi)

    @abstractmethod
    def cost_each(self, batch: int, channels: int) -> Cost:
        """Cost of :meth:`apply_each` on ``batch`` instances of ``channels`` channels.

        Parameters
        ----------
        batch
            :math:`B`, the instances of ``x``.
        channels
            :math:`C`, the channels of ``x``.
        """

    @abstractmethod
    def cost_members(self, batch: int, channels: int, *, reduce: bool) -> Cost:
        """Cost of :meth:`apply_members`.

        Parameters
        ----------
        batch, channels
            :math:`B` and :math:`C` of ``s``.
        reduce
            As for :meth:`apply_members`.
        """

    # --- whole orders (optional) ---------------------------------------------------------
    @property
    def entry_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The input and output entries laid out as arrays, ``(in_shape, out_shape)``: ``((M,), (N,))`` here.

        A grid basis gives its grids; the ``"channels_first"`` layout of
        :func:`structconv.contraction` reads ``x`` as ``(B, P, *in_shape)``.
        """
        return (self.M,), (self.N,)

    #: The orders that read the basis' entries on the host (distinct index pairs, a materialised
    #: product, found with NumPy or SciPy): a plan made under ``torch.compile`` leaves them out.
    host_orders: frozenset[str] = frozenset()

    def own_orders(self) -> Mapping[str, OwnOrder]:
        r"""The orders this representation runs its own way, by name (:class:`OwnOrder`).

        A name of the triangle (``"ax"``, ``"xtheta"``, ``"atheta"``) replaces how that order
        runs on a full :math:`\Theta`; any other name (e.g. ``"native"``) is an order beyond the
        triangle, listed after it.  The mapping may depend only on what :meth:`plan_key`
        returns: a plan, and the orders it holds, serve every basis of the same key.
        """
        return NO_ORDERS

    def cost_build(self) -> Cost:
        """The work of deriving what the hooks multiply by from the entries as stored (none here).

        A basis built on every call (a graph layer's, from its ``edge_index``) pays it on every
        call, and a backward pass about as much again for the transpose; a basis kept pays it
        once.  :func:`~structconv.explain` shows it beside the orders.
        """
        return Cost()

    def cost_combined(self, batch: int, p: int, q: int) -> Cost:
        """Cost of :meth:`apply_combined` (here the dense fallback's).

        Parameters
        ----------
        batch
            :math:`B`, the instances of ``x``.
        p, q
            :math:`P` and :math:`Q`, the channels of ``x`` and ``y``.
        """
        b = self.batch or 1
        k, m, n = self.K, self.M, self.N
        return Cost(
            2.0 * b * k * m * n * p * q + 2.0 * batch * m * n * p * q,
            float(b * k * m * n + b * m * n * p * q + batch * n * q),
        )


class _PlacedByArray(Basis):
    """A basis whose backend, dtype and device are those of one array it holds (:meth:`_placed`)."""

    __slots__ = ()

    @abstractmethod
    def _placed(self) -> Array:
        """The array the basis is placed like."""

    @property
    def backend(self) -> str:
        return of(self._placed()).name

    @property
    def dtype(self) -> Any:
        return self._placed().dtype

    @property
    def device(self) -> str:
        return device_of(self._placed())
